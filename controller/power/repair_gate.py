"""The ladder's resets and reboots wait until the power budget holds their GPUs' default limits.

A reset or a reboot returns GPUs to their default power limit (`core.power.repairs` says why that is
a raise, and for how long the power period counts it). This module owns the two pieces of the shell
around that rule:

- `RepairGate`, the `CommandOutlet` the ladder sends through when a power loop runs: a reset or a
  reboot is handed to the power loop's `RepairHold` instead of its node's stream (the ladder counts
  it as handed over then); every other command, and every command while the loop does not run (this
  replica does not lead, or there is no `[power]`), goes straight on;
- `RepairHold`, kept by the power loop: the repairs it counts, each one's send held until a period
  found room for it (`PowerLoop._step` asks `due`), and what settles them (`settle`, from the outbox
  statuses the loop reads with the quarantines).

A repair that finds no room within `wait_s` leaves regardless, logged as an error: the ladder must
not wait forever on a budget that cannot hold a node at its default limits (a node budget below
them, say), and a BMC power limit is the tool for that node.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Mapping
from typing import Protocol

import structlog

from rasd.controller.core import agent_messages as msgs
from rasd.controller.core.power import repairs as power_repairs
from rasd.controller.core.remediation import actions
from rasd.controller.remediation import outlet as outlet_mod

log = structlog.get_logger("rasd.controller.power")

Send = Callable[[], bool]
"""Puts a held command on its node's stream now; False when the node has none (the ladder re-sends
it when the node reconnects)."""


class Holder(Protocol):
    """Where the gate hands the repairs it holds (the power loop)."""

    @property
    def running(self) -> bool:
        """Whether the power loop runs on this replica (and so counts held repairs)."""
        ...

    def hold_repair(self, action: actions.Action, send: Send) -> bool:
        """Count the action's GPUs at their default limits and send it once there is room for them.

        Returns False when the action leaves limits alone (the gate sends it itself).
        """
        ...


class RepairGate:
    """A `CommandOutlet` around the ladder's: resets and reboots go out only once the budget holds them."""

    def __init__(self, inner: outlet_mod.CommandOutlet) -> None:
        """Wrap the ladder's outlet; `attach` the power loop once it is built."""
        self._inner = inner
        self._holder: Holder | None = None

    def attach(self, holder: Holder) -> None:
        """Hand resets and reboots to holder (the power loop) from now on."""
        self._holder = holder

    def send(self, action: actions.Action, *, deadline_unix_ns: int | None = None) -> bool:
        """`CommandOutlet.send`; a reset or a reboot waits in the power loop while it runs."""
        holder = self._holder
        if holder is not None and holder.running and action.kind in power_repairs.REPAIR_KINDS:

            def send() -> bool:
                return self._inner.send(action, deadline_unix_ns=deadline_unix_ns)

            if holder.hold_repair(action, send):
                return True
        return self._inner.send(action, deadline_unix_ns=deadline_unix_ns)

    async def validate(self, node_id: str, run: msgs.ValidationRun, *, timeout_s: float) -> msgs.AgentResult:
        """`CommandOutlet.validate` of the wrapped outlet."""
        return await self._inner.validate(node_id, run, timeout_s=timeout_s)

    async def reachable(self, node_id: str) -> bool:
        """`CommandOutlet.reachable` of the wrapped outlet."""
        return await self._inner.reachable(node_id)


@dataclasses.dataclass
class RepairHold:
    """The repairs the power loop counts at their GPUs' default limits, and the sends it holds."""

    wait_s: float
    """How long a repair waits for room before it leaves regardless, s."""
    repairs: dict[str, power_repairs.Repair] = dataclasses.field(default_factory=dict)
    """Command id -> the repair."""
    sends: dict[str, Send] = dataclasses.field(default_factory=dict)
    """Command id -> how to send it, for the repairs still held."""

    def add(self, repair: power_repairs.Repair, send: Send) -> None:
        """Hold a repair; one handed over again (the ladder re-sends on reconnect) keeps its place."""
        known = self.repairs.get(repair.command_id)
        if known is not None and known.sent:
            send()  # it left already: this is the ladder's re-send, and it goes on at once
            return
        self.repairs.setdefault(repair.command_id, repair)
        self.sends[repair.command_id] = send

    def nodes_sent(self) -> set[str]:
        """Nodes with a repair that left: their outbox statuses settle it."""
        return {r.node_id for r in self.repairs.values() if r.sent}

    def counted(self) -> tuple[frozenset[str], frozenset[str]]:
        """(the GPUs this period counts at their maximum, the command ids of the repairs counted)."""
        return power_repairs.counted(self.repairs.values()), frozenset(self.repairs)

    def settle(
        self, statuses: Mapping[str, str], boot_ids: Mapping[str, str], quarantined_nodes: Collection[str]
    ) -> None:
        """Stop counting the repairs whose outcome is known (`core.power.repairs.settle`)."""
        kept = power_repairs.settle(
            self.repairs.values(), statuses=statuses, boot_ids=boot_ids, quarantined_nodes=quarantined_nodes
        )
        self.repairs = {r.command_id: r for r in kept}

    def release(self, counted_ids: Collection[str], *, over_budget: bool, now_s: float) -> None:
        """Send the held repairs a period found room for, and those that waited too long (logged)."""
        ready, late = power_repairs.due(
            self.repairs.values(), counted_ids, over_budget=over_budget, now_s=now_s, wait_s=self.wait_s
        )
        for command_id in late:
            repair = self.repairs[command_id]
            log.error("power_repair_sent_without_room", command_id=command_id, kind=repair.kind, node=repair.node_id,
                      waited_s=round(now_s - repair.handed_at_s, 3))  # fmt: skip
        for command_id in (*ready, *late):
            self._send(command_id)

    def release_all(self, reason: str) -> None:
        """Send every held repair now (the loop stops, or has no GPUs to count them against)."""
        held = [c for c, r in self.repairs.items() if not r.sent]
        if held:
            log.warning("power_repairs_released", repairs=len(held), reason=reason)
        for command_id in held:
            self._send(command_id)
        self.repairs = {c: r for c, r in self.repairs.items() if r.sent}

    def _send(self, command_id: str) -> None:
        self.repairs[command_id] = dataclasses.replace(self.repairs[command_id], sent=True)
        send = self.sends.pop(command_id)
        if not send():
            log.info("power_repair_node_unreachable", command_id=command_id)
