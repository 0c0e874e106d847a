"""Repairs that return GPUs to their default power limit, as the power period counts them. Pure.

A GPU reset restores the GPU's default power limit, and a node's reboot the default limit of every
GPU of the node: a raise that no cap command makes, and that no read-back announces before it has
happened. The agent puts the controller's caps back as soon as it can (`agent.power_actions.
PowerActions.restore_power_caps`), but between the repair and that restore the limits in force can
exceed a budget the allocator had handed out to the last watt (DESIGN.md §2, invariant 1). So a
repair is treated like any other raise: it lands only into watts the budget holds for it.

From the moment the ladder hands a reset or a reboot over (`controller.power.repair_gate`), its GPUs
are `counted` at their maximum (`inputs.PeriodInputs.repairing_gpus`; the period forgets them every
period, `apply.forget_gpus`, and keeps their maximum in the allocation, so the other GPUs come down
first). The repair leaves once a period that counted it found every budget holding (`due`), or,
should that never happen, after a wait (then the loop says so). It stops being counted once its
outcome is known (`settle`):

    | repair      | counted until                                                              |
    |-------------|----------------------------------------------------------------------------|
    | reset_gpu   | its command is final (the agent answers after putting the cap back)        |
    | reboot_node | its command is final and did not succeed (no reboot happened); or the node |
    |             | came back under a new boot id (the period forgets the node itself then);   |
    |             | or the node is no longer quarantined (validated after its reboot)          |

and then one more command lifetime (`apply.forget_gpus`'s tail: a read-back taken before the
outcome may predate the limit the repair left).

Example: a cluster budget of 2,400 W, three GPUs confirmed at 800 W; the ladder hands over a reset
of GPU c. The next period counts c at 1,000 W (over budget: 2,600 W), lowers a and b to 700 W and
holds the reset; once their read-backs confirm 700 W a period finds the budget holding, and the reset
leaves. The agent answers after putting c back at 800 W; the repair is settled, and c counts at
1,000 W for one more command lifetime, then at what it reads back.

No I/O, no logging, no clock reads: `now_s` comes in.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Iterable, Mapping

RESET_GPU = "reset_gpu"
REBOOT_NODE = "reboot_node"
REPAIR_KINDS = frozenset({RESET_GPU, REBOOT_NODE})
"""The ladder's agent commands that return GPUs to their default power limit."""

FINAL_STATUSES = frozenset({"succeeded", "failed", "timed_out", "refused", "not_supported", "dry_run", "cancelled"})
"""Outbox statuses of a command that will not run (any more); the store's `FINAL_STATUSES`."""


@dataclasses.dataclass(frozen=True)
class Repair:
    """A reset or a reboot the power period counts at its GPUs' default limits."""

    command_id: str
    kind: str
    """`RESET_GPU` or `REBOOT_NODE`."""
    node_id: str
    gpu_uuids: frozenset[str]
    """The GPUs it returns to their default limit: the reset GPU, or every GPU of the rebooted node."""
    boot_id: str
    """The node's boot id when the repair was handed over ("" when unknown)."""
    handed_at_s: float
    """When the ladder handed it over, controller time (s)."""
    sent: bool = False
    """It has left for its node (a period found room for it, or it waited too long)."""


def repair_for(
    kind: str,
    *,
    command_id: str,
    node_id: str,
    gpu_uuid: str,
    node_gpus: Collection[str],
    boot_id: str,
    now_s: float,
) -> Repair | None:
    """The repair to count for one of the ladder's agent commands; None when it leaves limits alone.

    Args:
        kind: The command's action kind ("reset_gpu", "reboot_node", ...).
        command_id: Its id.
        node_id: Its node.
        gpu_uuid: Its GPU ("" for node actions).
        node_gpus: The node's GPUs (a reboot returns all of them to their defaults).
        boot_id: The node's boot id now ("" when unknown).
        now_s: Controller time, s.

    Returns:
        The repair, or None.
    """
    if kind == RESET_GPU and gpu_uuid:
        gpus = frozenset({gpu_uuid})
    elif kind == REBOOT_NODE and node_gpus:
        gpus = frozenset(node_gpus)
    else:
        return None
    return Repair(command_id, kind, node_id, gpus, boot_id, now_s)


def counted(repairs: Iterable[Repair]) -> frozenset[str]:
    """The GPUs the period counts at their maximum for these repairs."""
    return frozenset(g for r in repairs for g in r.gpu_uuids)


def due(
    repairs: Iterable[Repair], counted_ids: Collection[str], *, over_budget: bool, now_s: float, wait_s: float
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Which held repairs leave now: (room was made for them, they waited too long without it).

    Args:
        repairs: The repairs known.
        counted_ids: The command ids of the repairs the period just run counted.
        over_budget: Whether that period found a budget exceeded by what may be in force.
        now_s: Controller time, s.
        wait_s: How long a repair waits for room before it leaves regardless.

    Returns:
        (command ids with room, command ids sent without it).
    """
    ready: list[str] = []
    late: list[str] = []
    for r in repairs:
        if r.sent:
            continue
        if r.command_id in counted_ids and not over_budget:
            ready.append(r.command_id)
        elif now_s - r.handed_at_s >= wait_s:
            late.append(r.command_id)
    return tuple(ready), tuple(late)


def settle(
    repairs: Iterable[Repair],
    *,
    statuses: Mapping[str, str],
    boot_ids: Mapping[str, str],
    quarantined_nodes: Collection[str],
) -> tuple[Repair, ...]:
    """The repairs still counted, given what is known of their outcomes (the table in the module doc).

    Args:
        repairs: The repairs known.
        statuses: Command id -> its outbox status, for the sent repairs (a missing id: no row to wait on).
        boot_ids: Node -> its boot id now.
        quarantined_nodes: Nodes quarantined now.

    Returns:
        The repairs still counted.
    """
    out = []
    for r in repairs:
        if not r.sent:
            out.append(r)
            continue
        status = statuses.get(r.command_id)
        if status is None:
            continue
        final = status in FINAL_STATUSES
        if r.kind == RESET_GPU:
            if not final:
                out.append(r)
            continue
        rebooted = boot_ids.get(r.node_id, r.boot_id) != r.boot_id
        if final and (status != "succeeded" or rebooted or r.node_id not in quarantined_nodes):
            continue
        if not final and rebooted:
            continue
        out.append(r)
    return tuple(out)
