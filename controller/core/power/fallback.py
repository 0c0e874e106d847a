"""The out-of-band fallback: a node power limit through the BMC for a node whose agent is away.

This module owns when the controller asks a node's BMC (Redfish PowerLimit) for a node power limit,
when it lifts it, and how a confirmed limit counts in the two-phase apply state:

- a node unreachable for `bmc_fallback_after_s` whose caps must come down (the caps that may be in
  force there sum to more than its targets) gets a limit at the sum of its targets, once, while no
  request to its BMC is in flight;
- once the BMC confirms it (a read-back at or under the limit), the node's GPUs count at their
  targets (which sum to the limit) as read-backs dated when the BMC confirmed it: the limit caps
  the node's total draw, and budgets stop at the node level; the decreases sent to the GPUs stay
  pending (the agent may still hold a higher cap);
- when the agent is back, the limit is lifted only once the caps it holds are known and within the
  limit (no command to its GPUs unanswered): lifted at once, the node ran at its old caps, over its
  budget, until its decreases landed.

Pure: no I/O, no logging, no clock reads; `now_s` comes in, requests go out as data.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping, Sequence

import numpy as np

from rasd.controller.core.power import apply as power_apply
from rasd.controller.core.power import commands
from rasd.controller.core.power import inputs as period_inputs
from rasd.controller.core.power import policy as power_policy


@dataclasses.dataclass(frozen=True)
class FallbackState:
    """What the fallback remembers between periods (in memory)."""

    unreachable_since_s: Mapping[str, float] = dataclasses.field(default_factory=dict)
    """Node -> when the period first saw it without a stream."""
    limits_w: Mapping[str, int] = dataclasses.field(default_factory=dict)
    """Node -> the limit its BMC confirmed (in force until lifted)."""
    confirmed: Mapping[str, tuple[float, Mapping[str, int]]] = dataclasses.field(default_factory=dict)
    """Node -> (when the BMC confirmed its limit, the GPU targets that limit covers)."""
    in_flight: frozenset[str] = frozenset()
    """Nodes whose BMC has a request not answered yet."""


def confirmed(result: period_inputs.NodeLimitResult) -> bool:
    """Whether a BMC's answer puts the asked limit in force (read back at or under it)."""
    return (
        not result.failed
        and result.limit_w is not None
        and result.read_back_w is not None
        and (result.read_back_w <= result.limit_w)
    )


def fold_results(state: FallbackState, results: Sequence[period_inputs.NodeLimitResult]) -> FallbackState:
    """Fold the BMCs' answers into the state: confirmed limits count, lifted ones are forgotten."""
    if not results:
        return state
    limits, confirmations = dict(state.limits_w), dict(state.confirmed)
    in_flight = set(state.in_flight)
    for result in results:
        in_flight.discard(result.node_id)
        if result.failed:
            continue  # an unreachable BMC: the node keeps counting at its last known caps
        if result.limit_w is None:
            limits.pop(result.node_id, None)
            confirmations.pop(result.node_id, None)
        elif confirmed(result):
            limits[result.node_id] = result.limit_w
            confirmations[result.node_id] = (result.at_s, dict(result.targets_w))
    return dataclasses.replace(state, limits_w=limits, confirmed=confirmations, in_flight=frozenset(in_flight))


def count_confirmed_limits(
    apply: power_apply.ApplyState,
    state: FallbackState,
    sessions: Collection[str],
    policy: power_policy.PowerPolicy,
) -> power_apply.ApplyState:
    """A node whose BMC confirmed a limit counts at that limit while its agent is away.

    The node's GPUs are recorded at their targets (which sum to at most the limit) as read-backs at
    the time the BMC confirmed it. The agent's own read-backs, once it is back, are newer and
    replace them.
    """
    readbacks = []
    for node_id, (at_s, targets) in state.confirmed.items():
        if node_id in sessions:
            continue
        for gpu_uuid, target in targets.items():
            # Not what the GPU enforces: its agent may still hold a higher cap, and the decrease
            # it was sent has not landed. It stays pending (`requests` lifts the limit only once
            # the agent, back, has confirmed caps within it).
            readbacks.append(power_apply.CapReadback(gpu_uuid, float(target), at_s, settles_commands=False))
    return power_apply.record(apply, readbacks=readbacks, policy=policy) if readbacks else apply


def requests(
    state: FallbackState,
    apply: power_apply.ApplyState,
    targets_w: np.ndarray,
    *,
    sessions: Collection[str],
    bmc_nodes: Collection[str],
    after_s: float,
    now_s: float,
) -> tuple[FallbackState, tuple[commands.SetNodeLimit, ...]]:
    """The node limits to ask BMCs for (or lift) this period, after the period's plan (`apply`)."""
    if not bmc_nodes and not state.limits_w:
        return state, ()
    bound = power_apply.may_be_in_force_w(apply)
    by_node: dict[str, list[int]] = {}
    for i, g in enumerate(apply.gpus):
        by_node.setdefault(g.node_id, []).append(i)
    unreachable = dict(state.unreachable_since_s)
    in_flight = set(state.in_flight)
    out: list[commands.SetNodeLimit] = []
    for node_id, idx in by_node.items():
        if node_id in sessions:
            unreachable.pop(node_id, None)
            limit_w = state.limits_w.get(node_id)
            if limit_w is not None and node_id not in in_flight:
                settled = bool((apply.pending_seq[idx] == power_apply.NO_COMMAND).all())
                if settled and bound[idx].sum() <= limit_w:
                    in_flight.add(node_id)
                    out.append(commands.SetNodeLimit(node_id, None, {}))
            continue
        since = unreachable.setdefault(node_id, now_s)
        if now_s - since < after_s or node_id in in_flight:
            continue
        want = int(sum(int(targets_w[i]) for i in idx))
        if bound[idx].sum() <= want or state.limits_w.get(node_id) == want or node_id not in bmc_nodes:
            continue
        in_flight.add(node_id)
        out.append(commands.SetNodeLimit(node_id, want, {apply.gpus[i].gpu_uuid: int(targets_w[i]) for i in idx}))
    new = dataclasses.replace(state, unreachable_since_s=unreachable, in_flight=frozenset(in_flight))
    return new, tuple(out)
