"""The ladder's side of the straggler watch's actions (issue #40 item 3): audit rows and ladder events.

`rasd.controller.core.straggler_actions` decides; `rasd.controller.stragglers` (the watch, in the ingest)
hands its effects here, in order:

- every effect is an audit row (actor ``straggler-watch``), committed like an operator's;
- "validate" and "quarantine" enter the ladder as a health event of kind STRAGGLER (attribute
  ``rung``), as an accusation does (`operator.OperatorCommands.accuse`), so classification, the
  disruption budget, the audit trail and the ladder's command ids apply: "validate" holds the GPU
  and runs the accusation suite (a pass releases it), "quarantine" isolates it for a person and
  the scheduler replaces it; "restart" (the job stalled, `core.stall`) restarts the suspect rank's
  processes through the ladder's restart_process rung (a second stall on that GPU climbs to a reset).
  One restart restarts the job, so a "restart" within ``RESTART_HOLD_S`` of the last one carried out
  here is recorded, not handed on: with several replicas each names the stall of the GPUs it holds;
- "stall" asks the lost-node watch for a check at once (`on_stall`, `LostNodeWatch.check_stalled`);
- "raise_cap" (decided within the headroom the power loop published, `PowerLoop.power_room`) becomes
  a floor of the power loop (`floors`, `PowerLoop.set_floor`): the next period's allocation serves it
  within every budget's headroom and the two-phase apply carries it (decreases first, confirmed);
  the audit row says "applied as a floor of N W". "clear", "validate" and "quarantine" remove the
  floor (a held or quarantined GPU is ineligible anyway); a floor nobody removes expires
  (`core.power.floors.TTL_S`). Without a power loop here a raise_cap is only recorded.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol

import structlog

from rasd.controller.core import straggler_actions
from rasd.controller.core.remediation import events as health
from rasd.controller.remediation import decider as decider_mod
from rasd.controller.remediation import ledger as ledger_mod
from rasd.controller.remediation import state as state_mod
from rasd.controller.store import remediation as rstore
from rasd.controller.store import repo

log = structlog.get_logger("rasd.controller")

ACTOR = "straggler-watch"
RESTART_HOLD_S = 120.0
"""A job stall's restart within this long of the last one is the same stall seen by another replica
(each judges the GPUs it holds), or a stall of the job that restart is restarting: recorded only. Under
the restart grace and a job's restart (reschedule, load the checkpoint: minutes), and far under the
time a restarted job needs to build a new rhythm (10 steps) and stall again."""
_LADDER_RUNGS = frozenset({"validate", "quarantine", "restart"})
_ENDS_FLOOR = frozenset({"clear", "validate", "quarantine"})


class Floors(Protocol):
    """The power loop's floors registry (`power.loop.PowerLoop`)."""

    def set_floor(self, gpu_uuid: str, node_id: str, floor_w: float, reason: str) -> object:
        """Serve gpu_uuid at least floor_w from the next period on, within the budgets' headroom."""
        ...

    def clear_floor(self, gpu_uuid: str, why: str) -> bool:
        """Remove gpu_uuid's floor; False when it had none."""
        ...


class StragglerActions:
    """Carries out the watch's effects one after another, in the order given (see the module docstring)."""

    def __init__(self, state: state_mod.LadderState, ledger: ledger_mod.Ledger, decider: decider_mod.Decider) -> None:
        """Share the ladder's state, ledger and decider."""
        self._state = state
        self._ledger = ledger
        self._decider = decider
        self._queue: asyncio.Queue[straggler_actions.Effect] = asyncio.Queue()
        self._worker: asyncio.Task[None] | None = None
        self.failures = 0
        """Effects whose commit or decision raised (each logged)."""
        self.floors: Floors | None = None
        """Where a raise_cap becomes a floor (the power loop, where one runs here); None: recorded only."""
        self.on_stall: Callable[[], Awaitable[object]] | None = None
        """Called when a "stall" is carried out (the lost-node watch's `check_stalled`): a dead host hangs
        the job it runs, so the leader looks for silent nodes at once."""
        self._restarted: tuple[int, str] | None = None
        """The last job restart handed to the ladder: when (controller clock, ns) and for which GPU."""

    def take(self, effects: Sequence[straggler_actions.Effect]) -> None:
        """Queue effects; the worker carries them out in order (call from the event loop)."""
        for effect in effects:
            self._queue.put_nowait(effect)
        if effects and (self._worker is None or self._worker.done()):
            self._worker = asyncio.get_running_loop().create_task(self._run(), name="rasd-straggler-actions")

    async def drain(self) -> None:
        """Wait until every queued effect was carried out."""
        while self._worker is not None and not self._worker.done():
            await asyncio.wait({self._worker})

    async def stop(self) -> None:
        """Cancel what is still queued."""
        if self._worker is not None:
            self._worker.cancel()
            await asyncio.gather(self._worker, return_exceptions=True)

    async def _run(self) -> None:
        while not self._queue.empty():
            effect = self._queue.get_nowait()
            try:
                await self.carry_out(effect)
            except Exception:  # one effect that fails must not stop the next: logged and counted
                self.failures += 1
                log.exception("straggler_action_failed", kind=effect.kind, node=effect.node_id, gpu=effect.gpu_uuid)

    async def carry_out(self, effect: straggler_actions.Effect) -> None:
        """One effect: its audit row; a raise_cap's floor; for a ladder rung, the STRAGGLER event the ladder decides."""
        now_ns = self._state.clock()
        floors = self.floors
        if floors is not None and effect.kind in _ENDS_FLOOR:
            floors.clear_floor(effect.gpu_uuid, f"straggler {effect.kind}: {effect.reason}")
        outcome = _outcome(effect, floors is not None)
        held = effect.kind == "restart" and self._restart_held(now_ns)
        if held:
            assert self._restarted is not None
            outcome = f"recorded: the job's restart through {self._restarted[1]} is under way"
        elif effect.kind == "restart":
            self._restarted = (now_ns, effect.gpu_uuid)
        row = ledger_mod.audit_record(
            now_ns, ACTOR, f"straggler_{effect.kind}", effect.node_id, effect.gpu_uuid, effect.reason, outcome
        )
        await self._ledger.commit(rstore.Commit(now_unix_ns=now_ns, audit=[row]))
        if effect.kind == "stall" and self.on_stall is not None:
            try:
                await self.on_stall()
            except Exception:  # the store is down: the lost-node watch's own checks name the node later
                log.exception("stall_lost_node_check_failed", node=effect.node_id)
        if effect.kind == "raise_cap" and floors is not None and effect.to_w is not None:
            floors.set_floor(effect.gpu_uuid, effect.node_id, effect.to_w, effect.reason)
        if effect.kind not in _LADDER_RUNGS or held:
            return
        event = repo.controller_event(
            effect.node_id,
            int(health.EventKind.STRAGGLER),
            int(health.Severity.ERROR),
            now_unix_ns=now_ns,
            message=effect.reason,
            source="straggler",
            gpu_uuid=effect.gpu_uuid,
            attributes={"rung": effect.kind},
        )
        await self._decider.on_events(effect.node_id, [event], self._state.streams.node_labels.get(effect.node_id, {}))

    def _restart_held(self, now_ns: int) -> bool:
        """Whether a job restart was handed to the ladder within `RESTART_HOLD_S` (see the module docstring)."""
        return self._restarted is not None and now_ns - self._restarted[0] < RESTART_HOLD_S * 1e9


def _outcome(effect: straggler_actions.Effect, has_floors: bool) -> str:
    """The audit row's outcome for an effect."""
    if effect.kind in _LADDER_RUNGS:
        return "handed to the ladder"
    if effect.kind == "raise_cap" and effect.to_w is not None:
        return f"applied as a floor of {effect.to_w:.0f} W" if has_floors else "recorded: no power loop runs here"
    return "recorded"
