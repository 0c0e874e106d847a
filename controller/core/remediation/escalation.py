"""The repair ladder: per-node repair tickets that climb from the cheapest fix to RMA, on evidence.

Ladder (`Rung`), cheapest and smallest blast radius first::

    RESTART_PROCESS → RESET_GPU → REBOOT_NODE → POWER_CYCLE_BMC (optional hook) → RMA

A ticket starts at the rung its evidence requires (``classify``'s recommended action), so rungs that
cannot work are skipped: a row-remap failure starts at RMA; a GPU that fell off the bus (Xid 79)
starts at REBOOT_NODE and never gets a reset, because a ticket's rung never goes down; Xid 154
"Node Reboot Required" starts at REBOOT_NODE. A ticket climbs one rung when its action fails,
times out, is refused or unsupported, when post-repair validation fails, or when the fault comes
back on the same target within ``recurrence_window_s`` after the repair (also within correlation's
dedupe window: once a repair has run, ``handle_event`` tells ``correlate`` so with `repaired_at`, and
the fault's return is a recurrence, never a duplicate of the fault it repaired). Every rung has an attempt
budget per target (GPU for restart/reset, node for reboot/power-cycle) over
``attempt_budget_window_s``; an exhausted rung is skipped, so a ticket reaches RMA in at most five
steps and the same fault cannot loop, ever.

Holding and release (DESIGN invariant 5): a reset quarantines only its GPU (the node's other GPUs
stay schedulable); a reboot or power-cycle quarantines the node. After a repair, the ticket holds
its quarantines and runs validation (``RunValidation``); it releases them only on a pass. A
process restart does not touch the GPU, so it is only watched (unless ``validate_after_restart``).
A GPU whose remapped rows are within spare capacity never gets a ticket: classification says
"none" or "reset to apply the remap" and the GPU returns to service after validation.

Counters and Xids (issue #37): a memory error seen first in a counter (the DBE count, a pending
row remap) waits ``counter_hold_s`` for the Xid that names it; ``correlate`` makes them one incident
either way, and the Xid, the more specific evidence, decides: Xid 94 (contained) restarts the
application and does not reset the GPU at once. The reset that applies its row remap (and a
pending remap's or page retirement's, ``reset_when_idle``) waits in DRAINING, the GPU in service,
until the service sees it idle (`gpu_idle`): no work is stopped for a remap. A repair reset the
agent refuses because compute processes run stops them (restart_process's kill) and resets again
before any reboot.
One quarantine of a target can stand for several holders (two tickets of the node, or an
operator's ``rasctl quarantine``, ``RemediationState.operator_holds``): a release lifts it only
when the last of them lets go, and a forced release takes it from all.

A node whose reboot or power-cycle is in flight gets no GPU-disruptive action (restart, reset):
a new GPU fault on it is folded into the rebooting ticket (its post-reboot validation covers every
GPU) or, when no such ticket remains, waits (WAITING) until the node command reports back.

Ticket state machine (`TicketState`); "—" is "no ticket":

=================  ==============================================  =================  ==========================
from               on                                              to                 actions
=================  ==============================================  =================  ==========================
—                  fault, required rung restart..power-cycle       ACTING             [Quarantine*] + repair
—                  memory error seen first in a counter (DBE,      WAITING (hold)     — (``counter_hold_s``)
                   pending remap) that an Xid would name
—                  fault, node busy with another node command      WAITING (or fold)  —
—                  fault, required RMA                             RMA_PENDING        Quarantine + OpenRma + Notify
—                  fault, SDC accusation ("validate")              VALIDATING         QuarantineGpu + RunValidation
—                  SDC accusation of a GPU under its watch         RMA_PENDING        QuarantineGpu + OpenRma
—                  ``start_sweep`` on an idle node                 VALIDATING         QuarantineNode(planned) +
                                                                                      RunValidation(quick)
—                  fault, quarantine node/port, or severe          AWAITING_OPERATOR  Quarantine* + Notify
                   contact_support/investigate
—                  fault, mild investigate/contact_support         —                  Notify
WAITING            node command reported back (or expired)         ACTING             repair (budgets re-checked)
WAITING (hold)     the Xid that names the error (NAMED)            ACTING / DRAINING  the Xid's repair
WAITING (hold)     hold over, no Xid (tick)                        ACTING / DRAINING  the counter's repair
—, WAITING         a reset owed ``reset_when_idle`` is due         DRAINING           — (GPU stays in service)
DRAINING           `gpu_idle` (the service saw the GPU idle)       ACTING (reset)     QuarantineGpu + ResetGpu
ACTING (drained    reset REFUSED (work started on it meanwhile)    DRAINING           Release(gpu)
reset)
—, WAITING, ...     repair listed in ``drain_before`` starts        ACTING (drain)     [Quarantine*] + DrainNode
ACTING (drain)     drain SUCCEEDED                                 ACTING             the repair
ACTING (drain)     drain not finished, ``drain_on_timeout``         AWAITING_OPERATOR  Notify (pods left, PDB's
                   "operator"                                                         words)
ACTING (drain)     drain not finished, "escalate"                  ACTING             Notify + the repair
ACTING             result SUCCEEDED (or DRY_RUN)                   VALIDATING         RunValidation
ACTING             restart SUCCEEDED, ``reset_when_idle`` (Xid 94)  DRAINING           —
ACTING             restart SUCCEEDED, no validate_after_restart    WATCHING           —
ACTING             reset REFUSED (compute processes run), first    ACTING (reset)     RestartProcess (stop them)
ACTING             those processes stopped                         ACTING (reset)     ResetGpu (again)
ACTING             result FAILED/TIMED_OUT/REFUSED/NOT_SUPPORTED   ACTING (rung+1)    next repair, or RMA
                   (the stop of the processes, or the reset again)
ACTING             fault needing a higher rung                     ACTING (higher)    that repair (supersedes)
ACTING             fault needing the same or a lower rung          ACTING             — (absorbed)
VALIDATING         verdict pass / software_drift                   WATCHING           Release per hold
VALIDATING         DRY_RUN (nothing validated)                     AWAITING_OPERATOR  Notify (sweep: Release, closed)
VALIDATING         verdict suspect, or run failed/timed out,       VALIDATING         RunValidation (again)
                   within ``validation_retries``
VALIDATING         verdict fail (or retries spent), repair         ACTING (rung+1)    next repair, or RMA
VALIDATING         accusation: ``sdc.judge_accusation`` says       VALIDATING         RunValidation (accusation
                   rerun (2 of 3 not yet decided) / hot retest                        suite / hot retest suite)
VALIDATING         accusation: reproducible                        RMA_PENDING        OpenRma + Notify
VALIDATING         accusation: cleared (first run passes, or a     WATCHING           Release; GPU watched for
                   one-off that passes the hot retest)                                ``sdc_watch_s``
VALIDATING         sweep: pass                                     — (closed)         Release(node)
VALIDATING         sweep: fail/suspect                             VALIDATING         QuarantineGpu + Release(node)
                                                                   (accusation)       when one GPU failed; rerun
VALIDATING         verdict fail, operator release                  AWAITING_OPERATOR  Notify
VALIDATING         fault on the target                             ACTING (rung+1)    next repair, or RMA
WATCHING           fault on the target within the window           ACTING (rung+1)    next repair, or RMA
DRAINING           fault on the target                             ACTING (rung+1)    a reset that stops work
WATCHING           window over (tick)                              — (closed)         —
AWAITING_OPERATOR  operator release                                VALIDATING         RunValidation
AWAITING_OPERATOR  operator force release                          — (closed)         Release(forced) per hold
AWAITING_OPERATOR  fault needing RMA                               RMA_PENDING        OpenRma + Notify
RMA_PENDING        (node held for an earlier reboot)               RMA_PENDING        RunValidation of the other
                                                                                      GPUs → Release(node) on pass
RMA_PENDING        operator release (part replaced)                VALIDATING         RunValidation
any                operator close                                  — (closed)         —
=================  ==============================================  =================  ==========================

"Climb" picks the next rung above the current one that exists (power-cycle only when
``bmc_power_cycle_enabled``; restart/reset only for GPU faults) and has budget left; with none
left it is RMA. Results for commands the ticket no longer waits for (superseded, folded, replayed)
are answered "stale" and change nothing.

How the service drives it (everything here is pure; the service owns I/O and the clock):

1. event → `handle_event` (classify → correlate → `decide`); persist the new correlation and node
   states and the decision's actions (the outbox) in one transaction;
2. undispatched outbox → ``blast_radius.admit`` → dispatch what is admitted and record it with
   `mark_dispatched` (timeouts count from dispatch; held-back commands never time out);
3. result → `on_result`; for each of the decision's ``closed_command_ids`` cancel it in the outbox
   if still undispatched and call ``blast_radius.complete``;
4. periodically → `tick` for nodes with tickets (timeouts, watch windows, waiting tickets);
5. operator → `operator_release` (validate, or force), `operator_close`, ``blast_radius.pause`` /
   ``resume``.

Effects are `rasd.controller.core.remediation.actions` values whose command ids derive from ticket id + step,
so replaying a decision from the same stored state yields the same ids. ``now`` is float Unix
seconds. State is per node (`RemediationState`); a store serialises it with ``to_dict``.

Pure: no I/O, no logging, no clock reads.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from collections.abc import Iterable, Mapping
from typing import Any

from rasd.common import vocabulary, xid_catalog
from rasd.controller.core.remediation import actions, classify, correlate, policy, sdc
from rasd.controller.core.remediation import events as health

RecommendedAction = classify.RecommendedAction

_MAX_HISTORY = 64


class Rung(enum.IntEnum):
    """The repair ladder, cheapest first."""

    RESTART_PROCESS = 1
    RESET_GPU = 2
    REBOOT_NODE = 3
    POWER_CYCLE_BMC = 4
    RMA = 5

    @property
    def word(self) -> str:
        """The lower-case name ("reset_gpu"), as in policy keys and action kinds."""
        return self.name.lower()


class TicketState(enum.StrEnum):
    """Where a repair ticket is (transition table in the module docstring)."""

    WAITING = "waiting"
    """A repair is due but waits: for the node's reboot or power-cycle in flight, or (``hold_until``) for
    the kernel log's Xid that names a memory error a counter reported first."""
    ACTING = "acting"
    """A repair command is out; waiting for its result."""
    VALIDATING = "validating"
    """Held out of service while a validation run decides."""
    WATCHING = "watching"
    """Back in service; the same fault within the recurrence window climbs the ladder."""
    DRAINING = "draining"
    """In service with a reset owed that must not stop work (``reset_when_idle``: a pending row remap):
    it starts when the service sees the GPU idle (`gpu_idle`); a fault of the target climbs as from
    WATCHING."""
    AWAITING_OPERATOR = "awaiting_operator"
    """Isolated; a person decides (investigate, contact support, IB flap storm)."""
    RMA_PENDING = "rma_pending"
    """An RMA ticket is open, pending operator approval; the part stays quarantined."""


class Purpose(enum.StrEnum):
    """Why the ticket exists, which decides what a failed validation means."""

    REPAIR = "repair"
    ACCUSATION = "accusation"
    ISOLATION = "isolation"
    SWEEP = "sweep"
    """A rolling SDC sweep of an idle node: a failure turns it into an accusation."""


Outcome = vocabulary.ActionOutcome
"""How a command ended (rasd.api.v1.ActionOutcome)."""


@dataclasses.dataclass(frozen=True)
class ActionResult:
    """What came back for a command (from the agent, an executor, or a timeout)."""

    command_id: str
    outcome: Outcome
    message: str = ""
    validation_verdict: str = ""
    """For RunValidation: "pass", "fail", "suspect" or "software_drift"."""
    failed_gpu_uuids: tuple[str, ...] = ()
    """For RunValidation: the GPUs whose checks failed."""


@dataclasses.dataclass(frozen=True)
class Pending:
    """The one command a ticket is waiting for."""

    command_id: str
    kind: str
    """The action kind ("reset_gpu", "run_validation", ...): selects its timeout."""
    issued_at: float
    dispatched_at: float | None = None
    """When the executor sent it; timeouts count from here (a command held by the budget never times out)."""


@dataclasses.dataclass(frozen=True)
class Ticket:
    """One repair in progress for one target: a GPU, or the node when ``gpu_uuid`` is ""."""

    ticket_id: str
    """``<incident id>@<occurrence>``: deterministic, so command ids are too."""
    node_id: str
    gpu_uuid: str
    fault_key: str
    purpose: Purpose
    state: TicketState
    opened_at: float
    updated_at: float
    rung: Rung | None = None
    """The rung last started (None before any repair: accusations and isolations)."""
    floor: Rung | None = None
    """The lowest rung the evidence allows; climbing never goes below it."""
    waiting_rung: Rung | None = None
    """For WAITING: the rung to start when the node is free."""
    step: int = 0
    """The next action's step number (part of its command id)."""
    incident_ids: tuple[str, ...] = ()
    pending: Pending | None = None
    held: tuple[str, ...] = ()
    """Quarantines this ticket holds: "node", "gpu:<uuid>", "port:<device/port>"."""
    ib_port: str = ""
    watch_until: float | None = None
    folded_gpu_uuids: tuple[str, ...] = ()
    """Other GPUs of the node whose faults folded into this (node-level) ticket."""
    validation_runs: int = 0
    """Validation runs in the current VALIDATING phase."""
    history: tuple[str, ...] = ()
    """Evidence for RMA and ``rasctl node``: one line per fault, action and result (bounded)."""
    sdc_verdicts: tuple[str, ...] = ()
    """An accusation's validation verdicts in order, hot-retest ones prefixed (``sdc.judge_accusation``)."""
    reason: str = ""
    """The reason of the last decision that touched it."""
    hold_until: float | None = None
    """For WAITING: a memory error seen first in a counter waits until then for the Xid that names it
    (``classify.COUNTER_FAULTS_NAMED_BY_XID``); the Xid's classification then decides the repair."""
    reset_when_idle: bool = False
    """The reset this ticket owes applies a pending remap and waits for the GPU to drain (DRAINING) rather
    than stop its work (``Classification.reset_when_idle``); any climb ends that patience."""
    processes_stopped: bool = False
    """The current reset was refused while compute processes ran on the GPU and they were stopped for
    it (restart_process's kill, `_stop_processes`): the reset is tried once more, and a second refusal
    climbs."""
    repaired_at: float | None = None
    """When its last repair command succeeded, while nothing newer was started: from then on a fault
    of its target is evidence that the repair did not hold, never a duplicate of the incident before
    it (`repaired_at`, ``correlate``'s ``repaired_at``). None while a repair is due or running."""

    def covers_gpu(self, gpu_uuid: str) -> bool:
        """True when a fault on ``gpu_uuid`` belongs to this ticket."""
        return self.gpu_uuid == gpu_uuid or (bool(gpu_uuid) and gpu_uuid in self.folded_gpu_uuids)


@dataclasses.dataclass(frozen=True)
class Attempt:
    """One repair attempt, for the per-rung budgets."""

    target: str
    """The GPU uuid (restart, reset) or "node" (reboot, power cycle)."""
    rung: Rung
    at: float


@dataclasses.dataclass(frozen=True)
class RemediationState:
    """One node's repair tickets and attempt ledger."""

    node_id: str
    tickets: tuple[Ticket, ...] = ()
    attempts: tuple[Attempt, ...] = ()
    node_command_id: str = ""
    """The node's reboot or power-cycle in flight; no GPU-disruptive action while it is set."""
    node_command_at: float | None = None
    """When that command was issued (or dispatched); it expires after its timeout."""
    sdc_watch: tuple[tuple[str, float], ...] = ()
    """(GPU uuid, until): cleared accused GPUs under watch; a second accusation quarantines at once."""
    closed_tickets: tuple[tuple[str, float], ...] = ()
    """(ticket id, closed at) for the attempt-budget window: a ticket opened again for the same incident
    occurrence (e.g. after a forced release) gets a new id, so its command ids never repeat an old one's."""
    operator_holds: tuple[str, ...] = ()
    """Quarantines an operator set by hand (``rasctl quarantine``), as ``Ticket.held`` names them; only
    ``rasctl release`` lifts them, never a ticket's release of the same target."""

    def ticket(self, ticket_id: str) -> Ticket | None:
        """The ticket with this id, or None."""
        for t in self.tickets:
            if t.ticket_id == ticket_id:
                return t
        return None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-friendly dict; `from_dict` reverses it."""
        return {
            "node_id": self.node_id,
            "tickets": [_ticket_to_dict(t) for t in self.tickets],
            "attempts": [{"target": a.target, "rung": a.rung.name, "at": a.at} for a in self.attempts],
            "node_command_id": self.node_command_id,
            "node_command_at": self.node_command_at,
            "sdc_watch": dict(self.sdc_watch),
            "closed_tickets": dict(self.closed_tickets),
            "operator_holds": list(self.operator_holds),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RemediationState:
        """Rebuild from `to_dict` output."""
        return cls(
            node_id=data["node_id"],
            tickets=tuple(_ticket_from_dict(t) for t in data["tickets"]),
            attempts=tuple(Attempt(a["target"], Rung[a["rung"]], a["at"]) for a in data["attempts"]),
            node_command_id=data.get("node_command_id", ""),
            node_command_at=data.get("node_command_at"),
            sdc_watch=tuple(sorted((str(g), float(u)) for g, u in data.get("sdc_watch", {}).items())),
            closed_tickets=tuple(sorted((str(t), float(at)) for t, at in data.get("closed_tickets", {}).items())),
            operator_holds=tuple(str(h) for h in data.get("operator_holds", ())),
        )


_TICKET_FIELDS = tuple(f.name for f in dataclasses.fields(Ticket))
_TICKET_FIELD_SET = frozenset(_TICKET_FIELDS)
_AS_DICT = "_as_dict"
"""Where a Ticket keeps its `_ticket_to_dict` once made (in its __dict__; not a field)."""


def _evolve(ticket: Ticket, **changes: Any) -> Ticket:
    """``dataclasses.replace`` for a Ticket, without its per-call field introspection and __init__.

    The ladder updates tickets more than once per event, and replace was a visible share of a burst's CPU. Ticket has
    no __post_init__, so copying the fields and setting the changed ones is what replace does.
    """
    unknown = changes.keys() - _TICKET_FIELD_SET
    if unknown:
        raise TypeError(f"Ticket has no field(s) {sorted(unknown)}")
    new = object.__new__(Ticket)
    fields = new.__dict__
    fields.update(ticket.__dict__)
    fields.pop(_AS_DICT, None)  # the copy's dict is made afresh
    fields.update(changes)
    return new


def _ticket_to_dict(t: Ticket) -> dict[str, Any]:
    """The ticket as a JSON-friendly dict, made once per ticket value (tickets are immutable).

    A node's state is written whole whenever one of its tickets changes, and the core shares unchanged
    tickets between states, so most tickets in a write were serialised before. Callers must not
    mutate the result.
    """
    cached = t.__dict__.get(_AS_DICT)
    if cached is None:
        cached = t.__dict__[_AS_DICT] = _ticket_as_dict(t)
    return cached


def _ticket_as_dict(t: Ticket) -> dict[str, Any]:
    # Shallow (not dataclasses.asdict): fields are scalars, tuples of str and one Pending.
    out = {name: getattr(t, name) for name in _TICKET_FIELDS}
    pending = t.pending
    out["pending"] = (
        None
        if pending is None
        else {
            "command_id": pending.command_id,
            "kind": pending.kind,
            "issued_at": pending.issued_at,
            "dispatched_at": pending.dispatched_at,
        }
    )
    for name in ("rung", "floor", "waiting_rung"):
        value = getattr(t, name)
        out[name] = None if value is None else value.name
    out["purpose"] = t.purpose.value
    out["state"] = t.state.value
    for name in ("incident_ids", "held", "folded_gpu_uuids", "history", "sdc_verdicts"):
        out[name] = list(getattr(t, name))
    return out


def _ticket_from_dict(data: Mapping[str, Any]) -> Ticket:
    fields = dict(data)
    for name in ("rung", "floor", "waiting_rung"):
        fields[name] = None if fields.get(name) is None else Rung[fields[name]]
    fields["purpose"] = Purpose(fields["purpose"])
    fields["state"] = TicketState(fields["state"])
    for name in ("incident_ids", "held", "folded_gpu_uuids", "history", "sdc_verdicts"):
        fields[name] = tuple(fields.get(name, ()))
    pending = fields.get("pending")
    fields["pending"] = None if pending is None else Pending(**pending)
    return Ticket(**fields)


@dataclasses.dataclass(frozen=True)
class Decision:
    """The new state, the effects to carry out, and why (one sentence)."""

    state: RemediationState
    actions: tuple[actions.Action, ...]
    reason: str
    closed_command_ids: tuple[str, ...] = ()
    """Commands the node stopped waiting for in this decision: answered, timed out, superseded or
    folded into a reboot. The service cancels any of them still undispatched in the outbox and
    calls ``blast_radius.complete`` for each (a no-op for those not counted there)."""


_REQUIRED_RUNG = {
    RecommendedAction.RESTART_PROCESS: Rung.RESTART_PROCESS,
    RecommendedAction.RESET_GPU: Rung.RESET_GPU,
    RecommendedAction.REBOOT_NODE: Rung.REBOOT_NODE,
    RecommendedAction.RMA: Rung.RMA,
}

_NODE_RUNGS = (Rung.REBOOT_NODE, Rung.POWER_CYCLE_BMC)


def required_rung(action: RecommendedAction) -> Rung | None:
    """The ladder rung a recommended action starts at, or None when it is not a ladder action."""
    return _REQUIRED_RUNG.get(action)


class _Work:
    """A mutable scratch copy of one node's state for the length of one pure call."""

    def __init__(self, state: RemediationState, now_s: float, pol: policy.EscalationPolicy) -> None:
        self.node_id = state.node_id
        self.now_s = now_s
        self.pol = pol
        self.tickets: dict[str, Ticket] = {t.ticket_id: t for t in state.tickets}
        self.attempts = [a for a in state.attempts if now_s - a.at <= pol.attempt_budget_window_s]
        self.node_command_id = state.node_command_id
        self.node_command_at = state.node_command_at
        self.sdc_watch = {gpu: until for gpu, until in state.sdc_watch if until > now_s}
        self.closed = {tid: at for tid, at in state.closed_tickets if now_s - at <= pol.attempt_budget_window_s}
        self.operator_holds = list(state.operator_holds)
        self.opened_before = frozenset(self.tickets)
        self.actions: list[actions.Action] = []
        self.awaited_before = _awaited(state.tickets, state.node_command_id)

    def freeze(self) -> RemediationState:
        closed = dict(self.closed)
        closed.update((tid, self.now_s) for tid in self.opened_before if tid not in self.tickets)
        return RemediationState(
            node_id=self.node_id,
            tickets=tuple(self.tickets.values()),
            attempts=tuple(self.attempts),
            node_command_id=self.node_command_id,
            node_command_at=self.node_command_at,
            sdc_watch=tuple(sorted(self.sdc_watch.items())),
            closed_tickets=tuple(sorted(closed.items())),
            operator_holds=tuple(self.operator_holds),
        )

    def unused_ticket_id(self, base: str) -> str:
        """`base`, or `base+N` when a ticket of that id was closed within the window (or in this call)."""
        used = self.closed.keys() | (self.opened_before - self.tickets.keys())
        tid, n = base, 1
        while tid in used:
            n += 1
            tid = f"{base}+{n}"
        return tid

    def decision(self, reason: str) -> Decision:
        state = self.freeze()
        still = _awaited(state.tickets, state.node_command_id)
        closed = tuple(c for c in self.awaited_before if c not in still)
        return Decision(state, tuple(self.actions), reason, closed)

    # -- tickets ---------------------------------------------------------------------------------

    def update(self, ticket_id: str, **changes: Any) -> Ticket:
        ticket = _evolve(self.tickets[ticket_id], updated_at=self.now_s, **changes)
        self.tickets[ticket_id] = ticket
        return ticket

    def note(self, ticket_id: str, line: str) -> None:
        t = self.tickets[ticket_id]
        history = (*t.history, f"{self.now_s:.0f} {line}")[-_MAX_HISTORY:]
        self.update(ticket_id, history=history, reason=line)

    def emit(self, ticket_id: str, cls: type[actions.Action], reason: str, **fields: Any) -> actions.Action:
        t = self.tickets[ticket_id]
        action = cls(ticket_id=t.ticket_id, step=t.step, node_id=self.node_id, reason=reason, **fields)
        self.update(ticket_id, step=t.step + 1)
        self.actions.append(action)
        return action

    def find_for(self, gpu_uuid: str) -> Ticket | None:
        for t in self.tickets.values():
            if t.covers_gpu(gpu_uuid):
                return t
        return None

    def node_owner(self) -> Ticket | None:
        """The ticket whose node command is in flight, while it still waits for it."""
        if not self.node_command_id:
            return None
        for t in self.tickets.values():
            if t.pending is not None and t.pending.command_id == self.node_command_id:
                return t
        return None

    def holders(self, hold: str, *, besides: str) -> list[str]:
        """Who else holds ``hold`` ("node", "gpu:<uuid>", "port:<port>"): ticket ids, and "operator"."""
        out = [t.ticket_id for t in self.tickets.values() if t.ticket_id != besides and hold in t.held]
        if hold in self.operator_holds:
            out.append("operator")
        return out

    def drop_hold(self, hold: str, *, besides: str) -> None:
        """Take ``hold`` from every other ticket and from the operator's holds (a forced release)."""
        for t in list(self.tickets.values()):
            if t.ticket_id != besides and hold in t.held:
                self.update(t.ticket_id, held=tuple(h for h in t.held if h != hold))
                self.note(t.ticket_id, f"{_hold_word(hold)} released by force with ticket {besides}")
        if hold in self.operator_holds:
            self.operator_holds.remove(hold)

    def held_elsewhere(self, ticket_id: str) -> tuple[str, ...]:
        """GPUs that other tickets keep quarantined (left out of node-wide validation)."""
        out = []
        for t in self.tickets.values():
            if t.ticket_id != ticket_id:
                out.extend(h.removeprefix("gpu:") for h in t.held if h.startswith("gpu:"))
        return tuple(sorted(set(out)))

    # -- budgets ---------------------------------------------------------------------------------

    def used(self, target: str, rung: Rung) -> int:
        return sum(1 for a in self.attempts if a.target == target and a.rung is rung)

    def choose_rung(self, gpu_uuid: str, start: Rung) -> tuple[Rung, list[str]]:
        """The first rung at or above ``start`` that exists here and has budget; RMA otherwise."""
        skipped: list[str] = []
        rung = start
        while rung < Rung.RMA:
            if rung < Rung.REBOOT_NODE and not gpu_uuid:
                skipped.append(f"{rung.word} (no GPU)")
            elif rung is Rung.POWER_CYCLE_BMC and not self.pol.bmc_power_cycle_enabled:
                pass  # the optional rung is simply absent
            elif self.used(_target(gpu_uuid, rung), rung) >= self.pol.max_attempts(rung.word):
                skipped.append(f"{rung.word} (budget {self.pol.max_attempts(rung.word)} spent)")
            else:
                return rung, skipped
            rung = Rung(rung + 1)
        return Rung.RMA, skipped


def _awaited(tickets: Iterable[Ticket], node_command_id: str) -> tuple[str, ...]:
    """Command ids the node is waiting for, in a stable order."""
    ids = [t.pending.command_id for t in tickets if t.pending is not None]
    if node_command_id and node_command_id not in ids:
        ids.append(node_command_id)
    return tuple(ids)


def _target(gpu_uuid: str, rung: Rung) -> str:
    return "node" if rung in _NODE_RUNGS or not gpu_uuid else gpu_uuid


def _ticket_id(incident: correlate.Incident) -> str:
    return f"{incident.incident_id}@{incident.occurrences}"


def _summary(skipped: Iterable[str]) -> str:
    items = list(skipped)
    return f" (skipped {', '.join(items)})" if items else ""


# ------------------------------------------------------------------------------------------------
# Starting rungs


def _begin(w: _Work, tid: str, start: Rung, why: str, *, drained: bool = False) -> str:
    """Start the first usable rung at or above ``start`` on ticket ``tid``. Returns the reason.

    While another ticket's reboot or power-cycle is in flight, nothing below RMA starts: the
    ticket folds into that node-level ticket (its post-reboot validation covers every GPU) or,
    when no ticket waits for that command any more, waits (WAITING) for it to report back.
    A reset owed ``reset_when_idle`` waits for the GPU to drain (DRAINING) unless ``drained``
    (`gpu_idle` saw it idle).
    """
    if start < Rung.RMA and w.node_command_id:
        owner = w.node_owner()
        if owner is None or owner.ticket_id != tid:
            if owner is not None and owner.state is TicketState.ACTING:
                return _fold_into(w, tid, owner.ticket_id, why)
            w.update(tid, state=TicketState.WAITING, waiting_rung=start, pending=None)
            w.note(tid, f"{why}; {start.word} waits for the node's command {w.node_command_id} in flight")
            return w.tickets[tid].reason
    rung, skipped = w.choose_rung(w.tickets[tid].gpu_uuid, start)
    if rung is Rung.RESET_GPU and w.tickets[tid].reset_when_idle and not drained:
        return _drain(w, tid, f"{why}{_summary(skipped)}")
    return _start_rung(w, tid, rung, f"{why}{_summary(skipped)}")


def _drain(w: _Work, tid: str, why: str) -> str:
    """Owe the ticket's GPU a reset that waits for it to have no work (DRAINING): no command, no hold."""
    w.update(tid, state=TicketState.DRAINING, waiting_rung=None, hold_until=None, pending=None, watch_until=None)
    line = f"{why}: the reset waits for {w.tickets[tid].gpu_uuid} to drain (no work is stopped for it)"
    w.note(tid, line)
    return line


def _start_rung(w: _Work, tid: str, rung: Rung, why: str) -> str:
    """Start ``rung`` on ticket ``tid`` now (the caller checked the node is free). Returns the reason.

    A repair listed in ``drain_before`` starts with its quarantine and a `DrainNode`; the repair
    itself is emitted when the drain succeeds (`_on_drain`).
    """
    t = w.tickets[tid]
    if rung is Rung.RMA:
        return _open_rma(w, tid, why)
    gpu = t.gpu_uuid
    held = list(t.held)
    reason = f"{why}: {rung.word}"
    drain = rung.word in w.pol.drain_before
    if rung is Rung.RESTART_PROCESS:
        cmd = w.emit(tid, actions.RestartProcess, reason, gpu_uuid=gpu, grace_s=w.pol.restart_grace_s)
    elif rung is Rung.RESET_GPU:
        if f"gpu:{gpu}" not in held and "node" not in held:
            w.emit(tid, actions.QuarantineGpu, reason, gpu_uuid=gpu)
            held.append(f"gpu:{gpu}")
        cmd = _drain_node(w, tid, rung, reason) if drain else w.emit(tid, actions.ResetGpu, reason, gpu_uuid=gpu)
    else:
        _absorb_node_tickets(w, tid)
        held = list(w.tickets[tid].held)
        if "node" not in held:
            w.emit(tid, actions.QuarantineNode, reason)
            held.append("node")
        cls = actions.RebootNode if rung is Rung.REBOOT_NODE else actions.PowerCycleBmc
        cmd = _drain_node(w, tid, rung, reason) if drain else w.emit(tid, cls, reason)
        w.node_command_id = cmd.command_id
        w.node_command_at = w.now_s
    w.attempts.append(Attempt(_target(gpu, rung), rung, w.now_s))
    w.update(
        tid,
        state=TicketState.ACTING,
        rung=rung,
        waiting_rung=None,
        pending=Pending(cmd.command_id, cmd.kind, w.now_s),
        held=tuple(held),
        watch_until=None,
        validation_runs=0,
        repaired_at=None,
        processes_stopped=False,
    )
    used = w.used(_target(gpu, rung), rung)
    w.note(tid, f"{reason}{' after a drain' if drain else ''} (attempt {used} of {w.pol.max_attempts(rung.word)})")
    return w.tickets[tid].reason


def _drain_node(w: _Work, tid: str, rung: Rung, reason: str) -> actions.Action:
    """Emit the drain that precedes ``rung``'s repair (policy ``drain_before``)."""
    return w.emit(
        tid, actions.DrainNode, reason, pods=w.pol.drain_pods, deadline_s=w.pol.drain_deadline_s,
        repair_kind=rung.word, gpu_uuid=w.tickets[tid].gpu_uuid,
    )  # fmt: skip


def _emit_repair(w: _Work, tid: str, reason: str) -> str:
    """Emit the repair of the ticket's current rung, now that its drain is over; it becomes the pending command."""
    t = w.tickets[tid]
    if t.rung is Rung.RESET_GPU:
        cmd = w.emit(tid, actions.ResetGpu, reason, gpu_uuid=t.gpu_uuid)
    else:
        cmd = w.emit(tid, actions.RebootNode if t.rung is Rung.REBOOT_NODE else actions.PowerCycleBmc, reason)
        w.node_command_id = cmd.command_id
        w.node_command_at = w.now_s
    w.update(tid, pending=Pending(cmd.command_id, cmd.kind, w.now_s))
    w.note(tid, reason)
    return reason


def _on_drain(w: _Work, tid: str, result: ActionResult, detail: str) -> str:
    """The drain before a repair answered: the repair now, or (not drained) the policy's ``drain_on_timeout``.

    "operator": the ticket waits for a person (AWAITING_OPERATOR, its holds kept) with an error
    notice that carries the adapter's words (the pods left and the disruption budget's message);
    "escalate": the repair goes ahead anyway, with a warning notice.
    """
    t = w.tickets[tid]
    repair = t.rung.word if t.rung is not None else "repair"
    if result.outcome in (Outcome.SUCCEEDED, Outcome.DRY_RUN):
        return _emit_repair(w, tid, f"drain_node succeeded{detail}: {repair}")
    why = f"drain before {repair} {result.outcome.name.lower()}{detail}"
    if w.pol.drain_on_timeout == "escalate":
        summary = f"{t.node_id}: {why}; {repair} goes ahead without it (drain_on_timeout=escalate)"
        w.emit(tid, actions.Notify, summary, severity="warning", summary=summary)
        return _emit_repair(w, tid, summary)
    summary = f"{t.node_id}: {why}; {repair} not started, an operator decides (drain_on_timeout=operator)"
    w.emit(tid, actions.Notify, summary, severity="error", summary=summary)
    w.update(tid, state=TicketState.AWAITING_OPERATOR, pending=None)
    w.note(tid, summary)
    return summary


def _absorb_node_tickets(w: _Work, tid: str) -> None:
    """Before a node-level action: fold the node's other active GPU tickets into ``tid``.

    Their pending commands are abandoned (a reboot supersedes them) and their GPU holds move
    here, so the post-reboot validation and release cover them.
    """
    for other in list(w.tickets.values()):
        if other.ticket_id == tid or other.state not in (
            TicketState.ACTING,
            TicketState.VALIDATING,
            TicketState.WAITING,
            TicketState.DRAINING,  # a reboot applies the remap it waits for
        ):
            continue
        _fold_into(w, other.ticket_id, tid, "the node is about to reboot")


def _fold_into(w: _Work, tid: str, owner_id: str, why: str) -> str:
    t = w.tickets.pop(tid)
    owner = w.tickets[owner_id]
    folded = list(owner.folded_gpu_uuids)
    for gpu in (t.gpu_uuid, *t.folded_gpu_uuids):
        if gpu and gpu != owner.gpu_uuid and gpu not in folded:
            folded.append(gpu)
    held = list(owner.held)
    for h in t.held:
        if h not in held:
            held.append(h)
    w.update(
        owner_id,
        folded_gpu_uuids=tuple(folded),
        held=tuple(held),
        incident_ids=(*owner.incident_ids, *t.incident_ids),
    )
    line = f"{why}; {t.gpu_uuid or 'node'} fault folded into {owner_id}, whose node-level repair covers it"
    w.note(owner_id, line)
    return line


def _open_rma(w: _Work, tid: str, why: str) -> str:
    t = w.tickets[tid]
    held = list(t.held)
    target = t.gpu_uuid or "node"
    reason = f"{why}: RMA for {target}"
    if t.gpu_uuid:
        if f"gpu:{t.gpu_uuid}" not in held:
            w.emit(tid, actions.QuarantineGpu, reason, gpu_uuid=t.gpu_uuid)
            held.append(f"gpu:{t.gpu_uuid}")
    elif "node" not in held:
        w.emit(tid, actions.QuarantineNode, reason)
        held.append("node")
    w.note(tid, reason)
    evidence = w.tickets[tid].history
    w.emit(tid, actions.OpenRma, reason, gpu_uuid=t.gpu_uuid, evidence=evidence)
    w.emit(tid, actions.Notify, reason, severity="error", summary=f"{w.node_id}/{target}: {reason}")
    w.update(
        tid,
        state=TicketState.RMA_PENDING,
        rung=Rung.RMA,
        waiting_rung=None,
        pending=None,
        held=tuple(held),
        watch_until=None,
        validation_runs=0,
        repaired_at=None,
    )
    if t.gpu_uuid and "node" in held and not w.node_command_id:
        _validate_rest_of_node(w, tid)
    return reason


def _validate_rest_of_node(w: _Work, tid: str) -> None:
    """Graceful degradation after an RMA decision on a node held for a reboot.

    Validate the node's other GPUs and give the node back on a pass, keeping only the bad GPU
    out. Runs once (``validation_runs``); a failure leaves the node held for the operator.
    """
    t = w.tickets[tid]
    exclude = tuple(sorted({t.gpu_uuid, *w.held_elsewhere(tid)}))
    run = w.emit(
        tid,
        actions.RunValidation,
        f"RMA for {t.gpu_uuid}: validate the node's other GPUs before releasing the node",
        suite=w.pol.post_repair_suite,
        exclude_gpu_uuids=exclude,
        seed=actions.seed_for(tid, t.step),
    )
    w.update(tid, pending=Pending(run.command_id, run.kind, w.now_s), validation_runs=t.validation_runs + 1)


def _climb(w: _Work, tid: str, why: str, at_least: Rung | None = None) -> str:
    w.update(tid, reset_when_idle=False)  # the gentle way did not hold: a reset now stops what runs
    t = w.tickets[tid]
    start = Rung(t.rung + 1) if t.rung is not None and t.rung < Rung.RMA else (t.rung or Rung.RESTART_PROCESS)
    for bound in (t.floor, at_least):
        if bound is not None and bound > start:
            start = bound
    return _begin(w, tid, start, why)


def _start_validation(w: _Work, tid: str, suite: str, why: str) -> str:
    t = w.tickets[tid]
    if "node" in t.held or not t.gpu_uuid:
        gpus: tuple[str, ...] = ()
        exclude = w.held_elsewhere(tid)
    else:
        gpus = (t.gpu_uuid,)
        exclude = ()
    run = w.emit(
        tid,
        actions.RunValidation,
        f"{why}: validate with suite {suite}",
        suite=suite,
        gpu_uuids=gpus,
        exclude_gpu_uuids=exclude,
        seed=actions.seed_for(tid, w.tickets[tid].step),
    )
    w.update(
        tid,
        state=TicketState.VALIDATING,
        pending=Pending(run.command_id, run.kind, w.now_s),
        validation_runs=t.validation_runs + 1,
    )
    w.note(tid, f"{why}: validating with suite {suite} before release")
    return w.tickets[tid].reason


def _release_holds(w: _Work, tid: str, why: str, *, keep: Iterable[str] = (), forced: bool = False) -> str:
    """Give up ticket ``tid``'s holds except ``keep``; release each one nothing else on the node holds.

    A target another ticket or an operator also holds stays quarantined: one quarantine record and
    one cordon stand for all of them, and the first release would otherwise lift it for all (a
    GPU's reboot passing validation returned a node whose optics were still flapping to service).
    The last holder's release lifts it. ``forced`` (an operator's ``--force``) lifts the target now
    and takes it from every holder.

    Returns:
        What stays quarantined for another holder, as a clause for the decision's reason
        (``"; node stays quarantined, held by <ticket>"``), or "".
    """
    t = w.tickets[tid]
    kept = set(keep)
    remaining = []
    stays = []
    for hold in t.held:
        if hold in kept:
            remaining.append(hold)
            continue
        others = w.holders(hold, besides=tid)
        if others and not forced:
            stays.append(f"; {_hold_word(hold)} stays quarantined, held by {', '.join(others)}")
            continue
        if forced:
            w.drop_hold(hold, besides=tid)
        if hold == "node":
            w.emit(tid, actions.Release, why, forced=forced)
        elif hold.startswith("gpu:"):
            w.emit(tid, actions.Release, why, gpu_uuid=hold.removeprefix("gpu:"), forced=forced)
        elif hold.startswith("port:"):
            w.emit(tid, actions.Release, why, ib_port=hold.removeprefix("port:"), forced=forced)
    w.update(tid, held=tuple(remaining))
    return "".join(stays)


def _hold_word(hold: str) -> str:
    """The GPU or port a hold names, or "node"."""
    return hold.split(":", 1)[1] if ":" in hold else hold


def _wake_waiting(w: _Work) -> list[str]:
    """Once the node has no command in flight: start WAITING tickets, validate RMA'd nodes."""
    reasons = []
    for t in list(w.tickets.values()):
        if w.node_command_id:
            break
        if t.ticket_id not in w.tickets:
            continue  # folded into a reboot started earlier in this loop
        if t.state is TicketState.WAITING and t.waiting_rung is not None:
            if t.hold_until is not None:
                if w.now_s < t.hold_until:
                    continue
                w.update(t.ticket_id, hold_until=None)
                why = f"no Xid named the {t.fault_key} error within {w.pol.counter_hold_s:g}s"
                reasons.append(_begin(w, t.ticket_id, t.waiting_rung, why))
                continue
            reasons.append(_begin(w, t.ticket_id, t.waiting_rung, "the node is free again"))
        elif (
            t.state is TicketState.RMA_PENDING
            and t.gpu_uuid
            and "node" in t.held
            and t.pending is None
            and t.validation_runs == 0
        ):
            _validate_rest_of_node(w, t.ticket_id)
            reasons.append(f"the node is free again: validating the GPUs other than {t.gpu_uuid}")
    return reasons


# ------------------------------------------------------------------------------------------------
# Public API


def decide(
    state: RemediationState,
    incident: correlate.Incident,
    *,
    now_s: float,
    policy: policy.EscalationPolicy,
) -> Decision:
    """Advance the node's repair tickets for one new (or recurring) incident. Pure.

    Call it when ``Correlation.needs_decision`` (outcomes NEW, RECURRENCE, UPGRADE); duplicates
    and secondaries are already folded into their incident.

    Worked examples (default policy: budgets restart 2, reset 2, reboot 2, no BMC hook; window 6 h):

    - No ticket; Xid 13 on GPU-1 → ACTING restart_process: ``(RestartProcess(GPU-1),)``, reason
      "Xid 13 (...): NVIDIA bucket RESTART_APP → restart_process: restart_process (attempt 1 of 2)".
    - Ticket WATCHING after that restart succeeded; Xid 13 on GPU-1 again 10 min later → ACTING
      reset_gpu: ``(QuarantineGpu(GPU-1), ResetGpu(GPU-1))``, "xid:13 recurred within 21600s after
      restart_process: reset_gpu (attempt 1 of 2)".
    - No ticket; ROW_REMAP_FAILURE on GPU-2 → RMA_PENDING: ``(QuarantineGpu(GPU-2), OpenRma(GPU-2),
      Notify)``; the node's other GPUs stay schedulable.
    - No ticket; Xid 79 on GPU-3 → ACTING reboot_node: ``(QuarantineNode, RebootNode)``; the rung
      never goes below reboot, so no ResetGpu is ever emitted for it.
    - Ticket ACTING reboot for GPU-3; Xid 13 on GPU-4 → no actions: GPU-4 folds into the reboot
      ticket, whose post-reboot validation checks every GPU.

    Args:
        state: the node's tickets and attempt ledger.
        incident: the incident from ``correlate`` (its classification says what is required).
        now_s: current time, Unix seconds.
        policy: the ladder settings.

    Returns:
        The decision: new state, actions (possibly none) and a one-sentence reason.
    """
    w = _Work(state, now_s, policy)
    if incident.node_id != state.node_id:
        return w.decision(f"incident {incident.incident_id} belongs to {incident.node_id}, not {state.node_id}")
    cls = incident.classification
    required = required_rung(cls.action)
    t = w.find_for(incident.gpu_uuid)
    if t is not None and t.state is TicketState.WATCHING and required is None:
        # Not a ladder fault (accusation, isolation, investigate): the watch ends, a new ticket starts.
        w.tickets.pop(t.ticket_id)
        t = None
    if t is None:
        return w.decision(_new_ticket(w, incident, required))

    tid = t.ticket_id
    w.update(tid, incident_ids=(*t.incident_ids, incident.incident_id)[-_MAX_HISTORY:])
    w.note(tid, f"fault {cls.fault_key}: {cls.reason}")
    if t.state in (TicketState.AWAITING_OPERATOR, TicketState.RMA_PENDING):
        return w.decision(_on_held_ticket(w, t, incident, required))
    if t.state is TicketState.WAITING:
        return w.decision(_on_waiting_ticket(w, t, incident, required))
    if t.state is TicketState.ACTING:
        return w.decision(_on_acting_ticket(w, t, incident, required))
    if t.state is TicketState.DRAINING and required is None:
        return w.decision(f"{cls.fault_key} recorded on ticket {tid}, whose reset waits for the GPU to drain")
    return w.decision(_on_repaired_ticket(w, t, incident, required))


def _on_held_ticket(w: _Work, t: Ticket, incident: correlate.Incident, required: Rung | None) -> str:
    """A fault on a ticket that waits for an operator or an RMA: recorded; an RMA-class fault opens the RMA."""
    cls = incident.classification
    if required is Rung.RMA and t.state is TicketState.AWAITING_OPERATOR:
        return _open_rma(w, t.ticket_id, f"{cls.reason}")
    return (
        f"{cls.fault_key} on {incident.gpu_uuid or 'the node'} is recorded on ticket {t.ticket_id}, "
        f"which is already {t.state.value}"
    )


def _on_waiting_ticket(w: _Work, t: Ticket, incident: correlate.Incident, required: Rung | None) -> str:
    """A fault on a ticket that waits: the Xid naming its counter's error decides; else it raises the rung.

    A ticket held for the Xid (``hold_until``) whose own incident comes back named (``correlate``'s
    NAMED: the same incident id, the Xid's classification) starts the repair the Xid asks for now,
    whether stronger or weaker than the counter's. Any other fault raises the rung the ticket will
    start at (a reboot in flight, or the hold, ends first).
    """
    cls = incident.classification
    if t.hold_until is not None and required is not None and incident.incident_id in t.incident_ids:
        w.update(
            t.ticket_id,
            hold_until=None,
            fault_key=cls.fault_key,
            floor=required,
            waiting_rung=required,
            reset_when_idle=cls.reset_when_idle,
        )
        return _begin(w, t.ticket_id, required, f"{cls.reason} (it names the counter's error)")
    if required is not None and (t.waiting_rung is None or required > t.waiting_rung):
        w.update(t.ticket_id, waiting_rung=required)
    fault_key = incident.classification.fault_key
    return f"{fault_key} recorded on ticket {t.ticket_id}, which waits for the node's reboot to finish"


def _on_acting_ticket(w: _Work, t: Ticket, incident: correlate.Incident, required: Rung | None) -> str:
    """A fault while a repair is in flight: a higher rung supersedes it, else it is absorbed."""
    cls = incident.classification
    folded_here = incident.gpu_uuid != t.gpu_uuid
    if required is not None and t.rung is not None and required > t.rung and not folded_here:
        return _begin(w, t.ticket_id, required, f"{cls.reason}; supersedes {t.rung.word}")
    if required is Rung.RMA and folded_here:
        return _split_folded(w, t.ticket_id, incident, required)
    pending = t.pending.kind if t.pending else "a repair"
    return f"{cls.fault_key} absorbed into ticket {t.ticket_id}: {pending} is already in flight"


def _on_repaired_ticket(w: _Work, t: Ticket, incident: correlate.Incident, required: Rung | None) -> str:
    """A fault on a VALIDATING or WATCHING ticket: the repair did not hold, so the ladder climbs."""
    cls = incident.classification
    tid = t.ticket_id
    folded_here = incident.gpu_uuid != t.gpu_uuid
    if folded_here and (required is not None or t.state is TicketState.WATCHING):
        # A GPU the node-level repair covered faults on its own afterwards: it gets its own ticket.
        # Also during the node's validation: the run may have checked that GPU before it faulted
        # (an Xid 79 in a long suite), and its pass released the node with the GPU in it, while
        # the fault's repeats were folded into the open incident as duplicates.
        return _split_folded(w, tid, incident, required)
    if folded_here:
        return (
            f"{cls.fault_key} on folded GPU {incident.gpu_uuid} is recorded on ticket {tid}, "
            "whose running validation covers it"
        )
    if t.rung is None and required is None:
        return f"{cls.fault_key} recorded on ticket {tid}, which is {t.state.value}"
    phase = "during validation" if t.state is TicketState.VALIDATING else f"within {w.pol.recurrence_window_s:g}s"
    after = t.rung.word if t.rung is not None else "release"
    why = f"{cls.fault_key} recurred {phase} after {after}"
    if t.rung is None:
        w.update(tid, reset_when_idle=cls.reset_when_idle)
        return _begin(w, tid, required or Rung.RESTART_PROCESS, why)
    return _climb(w, tid, why, at_least=required)


def _split_folded(w: _Work, owner_id: str, incident: correlate.Incident, required: Rung | None) -> str:
    """Detach a folded GPU from a node-level ticket and give its fault a ticket of its own."""
    owner = w.tickets[owner_id]
    w.update(owner_id, folded_gpu_uuids=tuple(g for g in owner.folded_gpu_uuids if g != incident.gpu_uuid))
    return _new_ticket(w, incident, required)


def _new_ticket(w: _Work, incident: correlate.Incident, required: Rung | None) -> str:
    cls = incident.classification
    tid = w.unused_ticket_id(_ticket_id(incident))
    purpose = Purpose.REPAIR
    if cls.action is RecommendedAction.VALIDATE:
        purpose = Purpose.ACCUSATION
    elif required is None:
        purpose = Purpose.ISOLATION
    if cls.action is RecommendedAction.NONE:
        return f"nothing to do: {cls.reason}"
    mild = cls.severity < classify.Severity.ERROR
    if mild and cls.action in (RecommendedAction.CONTACT_SUPPORT, RecommendedAction.INVESTIGATE):
        note = actions.Notify(
            ticket_id=tid,
            step=0,
            node_id=w.node_id,
            reason=cls.reason,
            severity="warning",
            summary=f"{w.node_id}/{incident.gpu_uuid or 'node'}: {cls.reason}",
        )
        w.actions.append(note)
        return f"{cls.reason}; a person is told, the component stays in service"
    w.tickets[tid] = Ticket(
        ticket_id=tid,
        node_id=w.node_id,
        gpu_uuid=incident.gpu_uuid,
        fault_key=cls.fault_key,
        purpose=purpose,
        state=TicketState.ACTING,
        opened_at=w.now_s,
        updated_at=w.now_s,
        floor=required,
        incident_ids=(incident.incident_id,),
        ib_port=incident.ib_port,
        reset_when_idle=cls.reset_when_idle,
    )
    w.note(tid, f"fault {cls.fault_key}: {cls.reason}")
    if required is not None and cls.fault_key in classify.COUNTER_FAULTS_NAMED_BY_XID:
        return _hold_for_xid(w, tid, required, cls)
    if required is not None:
        return _begin(w, tid, required, cls.reason)
    if purpose is Purpose.ACCUSATION:
        until = sdc.watched_until(w.sdc_watch, incident.gpu_uuid, now_s=w.now_s)
        if until is not None:
            w.sdc_watch.pop(incident.gpu_uuid, None)
            return _open_rma(w, tid, f"{cls.reason}: a second accusation while watched (until {until:.0f})")
        owner = w.node_owner()
        if owner is not None and owner.state is TicketState.ACTING:
            return _fold_into(w, tid, owner.ticket_id, cls.reason)
        w.emit(tid, actions.QuarantineGpu, cls.reason, gpu_uuid=incident.gpu_uuid)
        w.update(tid, held=(f"gpu:{incident.gpu_uuid}",))
        return _start_validation(w, tid, w.pol.accusation_suite, cls.reason)
    # Isolation: quarantine the smallest thing that contains the fault and ask a person.
    held: tuple[str, ...]
    if cls.action is RecommendedAction.QUARANTINE_PORT and incident.ib_port:
        w.emit(tid, actions.QuarantinePort, cls.reason, ib_port=incident.ib_port)
        held = (f"port:{incident.ib_port}",)
    elif incident.gpu_uuid and cls.action is not RecommendedAction.QUARANTINE_NODE:
        w.emit(tid, actions.QuarantineGpu, cls.reason, gpu_uuid=incident.gpu_uuid)
        held = (f"gpu:{incident.gpu_uuid}",)
    else:
        w.emit(tid, actions.QuarantineNode, cls.reason)
        held = ("node",)
    w.emit(
        tid,
        actions.Notify,
        cls.reason,
        severity="error",
        summary=f"{w.node_id}/{incident.gpu_uuid or incident.ib_port or 'node'}: {cls.reason}",
    )
    w.update(tid, state=TicketState.AWAITING_OPERATOR, held=held)
    w.note(tid, f"{cls.reason}: isolated, waiting for an operator")
    return w.tickets[tid].reason


_REPAIRED_STATES = frozenset({TicketState.VALIDATING, TicketState.WATCHING})
"""Ticket states after a repair ran: a fault of the target now is evidence against the repair."""


def repaired_at(state: RemediationState, gpu_uuid: str) -> float | None:
    """When the repair of the ticket covering ``gpu_uuid`` ("": the node's) finished, or None. Pure.

    Set while the ticket validates or watches the repair it ran, None while a repair is due or
    running (a repeat then folds into its incident as part of the same burst). ``handle_event``
    passes it to ``correlate``: an incident of that target opened before it is no longer joined by
    a new event, so a fault back 120 s after its restart climbs the ladder instead of being taken
    for a duplicate of the fault the restart repaired.
    """
    for t in state.tickets:
        if t.repaired_at is not None and t.state in _REPAIRED_STATES and t.covers_gpu(gpu_uuid):
            return t.repaired_at
    return None


def _hold_for_xid(w: _Work, tid: str, required: Rung, cls: classify.Classification) -> str:
    """A memory error a counter saw first: wait ``counter_hold_s`` for the Xid that names it (WAITING)."""
    hold_s = w.pol.counter_hold_s
    w.update(tid, state=TicketState.WAITING, waiting_rung=required, hold_until=w.now_s + hold_s)
    line = f"{cls.reason}; waits up to {hold_s:g}s for the Xid that names the error before {required.word}"
    w.note(tid, line)
    return line


def gpu_idle(state: RemediationState, gpu_uuid: str, *, now_s: float, policy: policy.EscalationPolicy) -> Decision:
    """The service sees ``gpu_uuid`` idle: the reset that waits for it to drain starts now. Pure.

    Example: ticket DRAINING after Xid 94's restart (its row remap pending); the GPU's draw falls under
    the idle share of its limit → ACTING reset_gpu: ``(QuarantineGpu(GPU-1), ResetGpu(GPU-1))``; the
    validation and release follow as after any reset. The agent still refuses the reset if a compute
    process runs after all: the GPU is then given back and waits again (`_busy_reset`), never stopped.
    With the reset budget spent a person is told (AWAITING_OPERATOR): a reboot is no way to apply a
    remap on a GPU that works.
    """
    w = _Work(state, now_s, policy)
    t = next((x for x in w.tickets.values() if x.state is TicketState.DRAINING and x.gpu_uuid == gpu_uuid), None)
    if t is None:
        return w.decision(f"no reset waits for {gpu_uuid} to drain on {state.node_id}")
    tid = t.ticket_id
    budget = policy.max_attempts(Rung.RESET_GPU.word)
    if w.used(gpu_uuid, Rung.RESET_GPU) >= budget:
        line = f"{gpu_uuid} drained, but its reset budget ({budget}) is spent: the pending remap needs a person"
        w.emit(tid, actions.Notify, line, severity="warning", summary=f"{w.node_id}/{gpu_uuid}: {line}")
        w.update(tid, state=TicketState.AWAITING_OPERATOR, reset_when_idle=False)
        w.note(tid, line)
        return w.decision(line)
    return w.decision(_begin(w, tid, Rung.RESET_GPU, f"{gpu_uuid} is idle", drained=True))


def draining_gpus(state: RemediationState) -> tuple[str, ...]:
    """The GPUs of the node whose reset waits for them to drain (for the service's idle check). Pure."""
    return tuple(t.gpu_uuid for t in state.tickets if t.state is TicketState.DRAINING and t.gpu_uuid)


@dataclasses.dataclass(frozen=True)
class EventDecision:
    """What one health event did: its correlation (new correlation state inside) and the decision."""

    correlation: correlate.Correlation
    decision: Decision


def handle_event(
    correlation_state: correlate.CorrelationState,
    state: RemediationState,
    event: health.HealthEvent,
    *,
    now_s: float,
    catalog: xid_catalog.XidCatalog,
    policy: policy.RemediationPolicy,
    nvlink5_rules: tuple[xid_catalog.Nvlink5Rule, ...] | None = None,
) -> EventDecision:
    """Classify, correlate and decide one event: the whole pure pipeline for the service. Pure.

    Example: Xid 45 two seconds after an Xid 48 on the same GPU → correlation SECONDARY and a
    decision with no actions whose reason says it folded into the Xid 48 incident.

    Args:
        correlation_state: open incidents (fleet-wide or for the event's NVLink domain).
        state: the event's node's tickets (``state.node_id == event.node_id``).
        event: the observation, with ``nvlink_domain`` filled in from inventory when known.
        now_s: current time, Unix seconds.
        catalog: NVIDIA's XID catalog.
        policy: all remediation settings.
        nvlink5_rules: NVIDIA's Xid 144-150 decode sheet (optional; see ``classify``).

    Returns:
        The correlation (carrying the new correlation state) and the decision.
    """
    corr = correlate.correlate(
        correlation_state,
        event,
        now_s=now_s,
        catalog=catalog,
        policy=policy,
        nvlink5_rules=nvlink5_rules,
        repaired_at=repaired_at(state, event.gpu_uuid),
    )
    if corr.needs_decision and corr.incident is not None:
        decision = decide(state, corr.incident, now_s=now_s, policy=policy.escalation)
    else:
        decision = Decision(state, (), corr.reason)
    return EventDecision(corr, decision)


def on_result(
    state: RemediationState,
    result: ActionResult,
    *,
    now_s: float,
    policy: policy.EscalationPolicy,
) -> Decision:
    """Advance the ticket waiting for ``result.command_id``. Pure.

    Worked examples:

    - Ticket ACTING reset_gpu on GPU-1; result FAILED → ACTING reboot_node:
      ``(QuarantineNode, RebootNode)``, reason "reset_gpu failed: reboot_node (attempt 1 of 2)".
    - Ticket ACTING reboot_node; result SUCCEEDED → VALIDATING: ``(RunValidation("post-repair",
      all GPUs),)``.
    - Ticket VALIDATING; verdict "pass" → WATCHING: ``(Release(node),)``.
    - A result for a command no ticket waits for (superseded, replayed) → no change, "stale".

    Args:
        state: the node's tickets.
        result: the command's outcome (and verdict, for validations).
        now_s: current time, Unix seconds.
        policy: the ladder settings.

    Returns:
        The decision.
    """
    w = _Work(state, now_s, policy)
    finished = result.outcome is not Outcome.UNSPECIFIED
    if finished and result.command_id and result.command_id == w.node_command_id:
        w.node_command_id = ""
        w.node_command_at = None
    reason = _apply_result(w, result)
    woken = _wake_waiting(w)
    if woken:
        then = woken[0] if len(woken) == 1 else f"{len(woken)} waiting tickets start"
        reason = f"{reason}; then {then}"
    return w.decision(reason)


def _apply_result(w: _Work, result: ActionResult) -> str:
    t = next(
        (x for x in w.tickets.values() if x.pending is not None and x.pending.command_id == result.command_id),
        None,
    )
    if t is None:
        return f"result {result.outcome.name} for command {result.command_id} is stale: no ticket waits for it"
    if result.outcome is Outcome.UNSPECIFIED:
        return f"result for command {result.command_id} has no outcome; ticket {t.ticket_id} keeps waiting"
    tid = t.ticket_id
    kind = t.pending.kind if t.pending else "?"
    detail = f": {result.message}" if result.message else ""
    if kind == "run_validation":
        return _apply_validation(w, tid, result, detail)
    w.note(tid, f"{kind} {result.outcome.name.lower()}{detail}")
    if kind == actions.DrainNode.kind:
        return _on_drain(w, tid, result, detail)
    if t.rung is Rung.RESET_GPU and kind in (Rung.RESET_GPU.word, Rung.RESTART_PROCESS.word):
        busy = _busy_reset(w, tid, kind, result, detail)
        if busy:
            return busy
    if result.outcome in (Outcome.SUCCEEDED, Outcome.DRY_RUN):
        w.update(tid, pending=None, repaired_at=w.now_s)
        dry = " (dry run)" if result.outcome is Outcome.DRY_RUN else ""
        if t.rung is Rung.RESTART_PROCESS and t.reset_when_idle:
            return _drain(w, tid, f"restart_process succeeded{dry}; a reset still owes the GPU its row remap")
        if t.rung is Rung.RESET_GPU:
            w.update(tid, reset_when_idle=False)
        if t.rung is Rung.RESTART_PROCESS and not w.pol.validate_after_restart:
            w.update(tid, state=TicketState.WATCHING, watch_until=w.now_s + w.pol.recurrence_window_s)
            window = w.pol.recurrence_window_s
            line = f"restart_process succeeded{dry}; the GPU was not touched, watching for {window:g}s"
            w.note(tid, line)
            return line
        return _start_validation(w, tid, w.pol.post_repair_suite, f"{kind} succeeded{dry}")
    return _climb(w, tid, f"{kind} {result.outcome.name.lower()}{detail}")


def _busy_reset(w: _Work, tid: str, kind: str, result: ActionResult, detail: str) -> str:
    """A reset refused because compute processes run: stop them, then reset again. Returns the reason, or "".

    The agent refuses a reset while a compute process runs on the GPU (REFUSED is its only refusal
    of one). That says nothing against the reset: the ladder stops the processes (restart_process's
    kill, SIGTERM then SIGKILL after ``restart_grace_s``) and tries the reset once more; only if
    the processes do not stop, or the reset is refused or fails again, does it climb to a reboot.
    Both commands count against their rung's budget like any other; a spent budget climbs at once.
    "" when the result is not one of these steps (the caller goes on as for any result).
    """
    t = w.tickets[tid]
    gpu = t.gpu_uuid
    if kind == Rung.RESET_GPU.word:
        if result.outcome is not Outcome.REFUSED or t.processes_stopped:
            return ""
        if t.reset_when_idle:
            # A reset that waited for the drain: work started on the GPU meanwhile. It is not stopped
            # for a remap; the GPU goes back to service and the reset waits for the next drain.
            why = f"reset_gpu refused{detail}: the GPU is busy again"
            stays = _release_holds(w, tid, f"{why}; back to service until it drains", keep=("node",))
            return _drain(w, tid, f"{why}{stays}")
        spent = w.used(gpu, Rung.RESTART_PROCESS) >= w.pol.max_attempts(Rung.RESTART_PROCESS.word)
        if spent:
            why = f"reset_gpu refused{detail}; restart_process budget spent, so its processes cannot be stopped"
            return _climb(w, tid, why)
        why = f"reset_gpu refused{detail}: stop the GPU's processes, then reset again"
        cmd = w.emit(tid, actions.RestartProcess, why, gpu_uuid=gpu, grace_s=w.pol.restart_grace_s)
        w.attempts.append(Attempt(gpu, Rung.RESTART_PROCESS, w.now_s))
        w.update(tid, pending=Pending(cmd.command_id, cmd.kind, w.now_s), processes_stopped=True)
        w.note(tid, why)
        return why
    # The processes were stopped for the reset (a restart_process answer while the rung is the reset).
    if result.outcome not in (Outcome.SUCCEEDED, Outcome.DRY_RUN):
        return _climb(
            w, tid, f"the GPU's processes could not be stopped for its reset ({result.outcome.name.lower()}{detail})"
        )
    if w.used(gpu, Rung.RESET_GPU) >= w.pol.max_attempts(Rung.RESET_GPU.word):
        return _climb(w, tid, "processes stopped, but the reset_gpu budget is spent")
    why = f"processes stopped{detail}: reset again"
    cmd = w.emit(tid, actions.ResetGpu, why, gpu_uuid=gpu)
    w.attempts.append(Attempt(gpu, Rung.RESET_GPU, w.now_s))
    w.update(tid, pending=Pending(cmd.command_id, cmd.kind, w.now_s))
    used = w.used(gpu, Rung.RESET_GPU)
    w.note(tid, f"{why} (attempt {used} of {w.pol.max_attempts(Rung.RESET_GPU.word)})")
    return w.tickets[tid].reason


def _apply_validation(w: _Work, tid: str, result: ActionResult, detail: str) -> str:
    t = w.tickets[tid]
    verdict = result.validation_verdict
    w.update(tid, pending=None)
    if result.outcome is Outcome.DRY_RUN:
        return _validation_not_run(w, tid)
    if t.state is TicketState.RMA_PENDING:
        # The validation of the node's other GPUs after an RMA decision.
        if result.outcome is Outcome.SUCCEEDED and verdict in ("pass", "software_drift"):
            keep = [f"gpu:{t.gpu_uuid}"]
            stays = _release_holds(w, tid, "the node's other GPUs passed validation", keep=keep)
            w.update(tid, folded_gpu_uuids=())
            line = f"other GPUs passed validation: node released, {t.gpu_uuid} stays quarantined for RMA{stays}"
            w.note(tid, line)
            return line
        w.emit(
            tid,
            actions.Notify,
            "node validation failed after the RMA decision",
            severity="error",
            summary=f"{w.node_id}: the node's other GPUs failed validation; the node stays quarantined",
        )
        line = f"node validation {verdict or result.outcome.name.lower()}{detail}: the node stays quarantined"
        w.note(tid, line)
        return line

    if t.purpose is Purpose.ACCUSATION:
        return _judge_accused(w, tid, result, verdict, detail)
    if t.purpose is Purpose.SWEEP:
        return _sweep_result(w, tid, result, verdict, detail)
    finished = result.outcome is Outcome.SUCCEEDED
    if finished and verdict in ("pass", "software_drift"):
        why = "validation passed" if verdict == "pass" else "validation found software drift, not a GPU fault"
        stays = _release_holds(w, tid, why)
        if verdict == "software_drift":
            w.emit(
                tid,
                actions.Notify,
                why,
                severity="warning",
                summary=f"{w.node_id}: golden or software drift; check the validation goldens",
            )
        w.update(tid, state=TicketState.WATCHING, watch_until=w.now_s + w.pol.recurrence_window_s)
        line = f"{why}: released, watching for {w.pol.recurrence_window_s:g}s{stays}"
        w.note(tid, line)
        return line
    unfinished = not finished or verdict not in ("fail",)
    if unfinished and t.validation_runs <= w.pol.validation_retries:
        what = f"verdict {verdict}" if finished else f"validation {result.outcome.name.lower()}{detail}"
        suite = w.pol.accusation_suite if verdict == "suspect" else w.pol.post_repair_suite
        return _start_validation(w, tid, suite, f"{what}; retest")
    what = f"validation {verdict or result.outcome.name.lower()}{detail}"
    w.note(tid, what)
    if t.purpose is Purpose.ISOLATION:
        w.emit(tid, actions.Notify, what, severity="error", summary=f"{w.node_id}: {what}; still isolated")
        w.update(tid, state=TicketState.AWAITING_OPERATOR)
        return f"{what}: the component stays isolated for the operator"
    return _climb(w, tid, what)


def _accusation_rules(pol: policy.EscalationPolicy) -> sdc.AccusationRules:
    return sdc.AccusationRules(pol.sdc_confirm_runs, pol.sdc_confirm_fails, pol.validation_retries)


def _run_word(result: ActionResult, verdict: str) -> str:
    """One run's verdict as ``sdc`` counts it: a run that did not finish is an "error"."""
    finished = result.outcome is Outcome.SUCCEEDED
    return verdict if finished and verdict in sdc.VERDICTS else "error"


def _validation_not_run(w: _Work, tid: str) -> str:
    """A validation answered DRY_RUN: nothing was checked, so nothing it holds goes back on its word.

    An agent with destructive actions disabled (its default) answers every run DRY_RUN. Taken as a
    pass, a real quarantine (the Kubernetes or Slurm adapter) was lifted from a GPU nobody had
    validated (DESIGN invariant 5). The holds stay and a person is told; ``rasctl release --force``
    or a real run lets them go. A sweep's node was healthy when it was taken: it is simply let go.
    """
    t = w.tickets[tid]
    what = "validation not run: the agent answered dry-run (destructive actions disabled)"
    if t.purpose is Purpose.SWEEP:
        stays = _release_holds(w, tid, f"sweep {what}")
        w.tickets.pop(tid)
        return f"sweep of {w.node_id}: {what}; node released, ticket {tid} closed{stays}"
    target = t.gpu_uuid or "node"
    w.emit(tid, actions.Notify, what, severity="warning", summary=f"{w.node_id}/{target}: {what}; still held")
    w.update(tid, state=TicketState.AWAITING_OPERATOR)
    line = f"{what}: {target} stays quarantined for an operator"
    w.note(tid, line)
    return line


def _judge_accused(w: _Work, tid: str, result: ActionResult, verdict: str, detail: str) -> str:
    """An accused GPU's run came back: confirm (2 of 3), hot-retest a one-off, clear with a watch."""
    t = w.tickets[tid]
    rules = _accusation_rules(w.pol)
    word = _run_word(result, verdict)
    before, _ = sdc.judge_accusation(t.sdc_verdicts, rules)
    mark = f"{sdc.HOT_PREFIX}{word}" if before is sdc.AccusationStep.HOT_RETEST else word
    verdicts = (*t.sdc_verdicts, mark)
    w.update(tid, sdc_verdicts=verdicts)
    step, why = sdc.judge_accusation(verdicts, rules)
    what = f"validation {mark}{detail if word == 'error' else ''}: {why}"
    return _accusation_step(w, tid, step, what)


def _accusation_step(w: _Work, tid: str, step: sdc.AccusationStep, what: str) -> str:
    t = w.tickets[tid]
    target = t.gpu_uuid or "node"
    if step is sdc.AccusationStep.RERUN:
        return _start_validation(w, tid, w.pol.accusation_suite, what)
    if step is sdc.AccusationStep.HOT_RETEST:
        return _start_validation(w, tid, w.pol.sdc_hot_retest_suite, what)
    if step is sdc.AccusationStep.REPRODUCIBLE:
        w.sdc_watch.pop(t.gpu_uuid, None)
        return _open_rma(w, tid, what)
    if step is sdc.AccusationStep.OPERATOR:
        w.emit(tid, actions.Notify, what, severity="error", summary=f"{w.node_id}/{target}: {what}; still held")
        w.update(tid, state=TicketState.AWAITING_OPERATOR)
        w.note(tid, f"{what}: held for an operator")
        return w.tickets[tid].reason
    stays = _release_holds(w, tid, what)
    if step is sdc.AccusationStep.DRIFT:
        w.emit(
            tid,
            actions.Notify,
            what,
            severity="warning",
            summary=f"{w.node_id}: golden or software drift; check the validation goldens",
        )
        line = f"{what}: released{stays}"
    else:
        until = w.now_s + w.pol.sdc_watch_s
        if t.gpu_uuid:
            w.sdc_watch[t.gpu_uuid] = until
        line = f"{what}: released, {target} watched until {until:.0f}{stays}"
    w.update(tid, state=TicketState.WATCHING, watch_until=w.now_s + w.pol.recurrence_window_s)
    w.note(tid, line)
    return line


def _sweep_result(w: _Work, tid: str, result: ActionResult, verdict: str, detail: str) -> str:
    """A sweep's run came back: pass closes it; a failure becomes an accusation of what failed."""
    t = w.tickets[tid]
    word = _run_word(result, verdict)
    if word in ("pass", "software_drift"):
        stays = _release_holds(w, tid, f"sweep validation {word}")
        if word == "software_drift":
            w.emit(
                tid,
                actions.Notify,
                "sweep found software drift",
                severity="warning",
                summary=f"{w.node_id}: golden or software drift; check the validation goldens",
            )
        w.tickets.pop(tid)
        return f"sweep of {w.node_id} {word}: node released, ticket {tid} closed{stays}"
    if word == "error":
        if t.validation_runs <= w.pol.validation_retries:
            suite = t.fault_key.removeprefix("sdc_sweep:") or "quick"
            return _start_validation(w, tid, suite, f"sweep run error{detail}")
        line = f"sweep validation did not finish{detail}: the node is held for an operator"
        w.emit(tid, actions.Notify, line, severity="error", summary=f"{w.node_id}: {line}")
        w.update(tid, state=TicketState.AWAITING_OPERATOR)
        w.note(tid, line)
        return line
    failed = tuple(result.failed_gpu_uuids)
    why = f"sweep validation {word}" + (f" on {', '.join(failed)}" if failed else "")
    if len(failed) == 1:
        gpu = failed[0]
        w.emit(tid, actions.QuarantineGpu, why, gpu_uuid=gpu)
        w.update(tid, held=(*t.held, f"gpu:{gpu}"), gpu_uuid=gpu)
        why += _release_holds(w, tid, f"{why}: only {gpu} stays out", keep=[f"gpu:{gpu}"])
    w.update(tid, purpose=Purpose.ACCUSATION, sdc_verdicts=(word,))
    w.note(tid, f"{why}: treated as an SDC accusation")
    gpu = w.tickets[tid].gpu_uuid
    until = sdc.watched_until(w.sdc_watch, gpu, now_s=w.now_s) if gpu else None
    if until is not None:
        w.sdc_watch.pop(gpu, None)
        return _open_rma(w, tid, f"{why}: a second SDC signal while watched (until {until:.0f})")
    step, judged = sdc.judge_accusation((word,), _accusation_rules(w.pol))
    return _accusation_step(w, tid, step, f"{why}: {judged}")


def start_sweep(
    state: RemediationState,
    *,
    sweep_id: str,
    suite: str,
    seed: int,
    now_s: float,
    policy: policy.EscalationPolicy,
) -> Decision:
    """Start a rolling SDC sweep of an idle node: hold it (planned) and run ``suite``. Pure.

    Refused (no actions) when the node has any ticket or a node command in flight: a sweep only
    takes a node nothing else wants. Example: an idle node → ``(QuarantineNode(planned=True),
    RunValidation("quick", seed))``; a pass → ``(Release(node),)`` and the ticket closes; a fail on
    one GPU → that GPU quarantined, the node released, and the accusation ladder (2 of 3) runs.
    """
    w = _Work(state, now_s, policy)
    if w.tickets or w.node_command_id:
        return w.decision(f"{state.node_id} has tickets or a command in flight: no sweep now")
    # A second sweep in the same seed epoch (sweeps more often than seeds rotate) gets its own id:
    # with the first's, its commands repeated the first's ids, which the outbox took as done.
    tid = w.unused_ticket_id(f"{sweep_id}@1")
    w.tickets[tid] = Ticket(
        ticket_id=tid,
        node_id=w.node_id,
        gpu_uuid="",
        fault_key=f"sdc_sweep:{suite}",
        purpose=Purpose.SWEEP,
        state=TicketState.VALIDATING,
        opened_at=now_s,
        updated_at=now_s,
    )
    reason = f"rolling SDC sweep of an idle node with suite {suite}"
    w.emit(tid, actions.QuarantineNode, reason, planned=True)
    run = w.emit(tid, actions.RunValidation, reason, suite=suite, seed=seed)
    w.update(tid, held=("node",), pending=Pending(run.command_id, run.kind, now_s), validation_runs=1)
    w.note(tid, f"{reason} (seed {seed})")
    return w.decision(w.tickets[tid].reason)


def mark_dispatched(state: RemediationState, command_id: str, *, now_s: float) -> RemediationState:
    """Record that an executor sent ``command_id``; its timeout counts from ``now``. Pure.

    A command the disruption budget holds back is not dispatched, so it never times out.
    """
    tickets = tuple(
        dataclasses.replace(t, pending=dataclasses.replace(t.pending, dispatched_at=now_s))
        if t.pending is not None and t.pending.command_id == command_id and t.pending.dispatched_at is None
        else t
        for t in state.tickets
    )
    node_at = now_s if command_id and command_id == state.node_command_id else state.node_command_at
    return dataclasses.replace(state, tickets=tickets, node_command_at=node_at)


def tick(state: RemediationState, *, now_s: float, policy: policy.EscalationPolicy) -> Decision:
    """Time passes: time out commands, close finished watches, expire the budget ledger. Pure.

    Example: ticket ACTING reboot_node dispatched at t=0, ``reboot_node_timeout_s`` 1800; tick at
    t=1801 → as if the reboot TIMED_OUT: the ladder climbs (BMC hook, else RMA).

    Args:
        state: the node's tickets.
        now_s: current time, Unix seconds.
        policy: the ladder settings.

    Returns:
        The decision (often no actions).
    """
    w = _Work(state, now_s, policy)
    reasons: list[str] = []
    for t in list(w.tickets.values()):
        if t.ticket_id not in w.tickets:
            continue
        p = t.pending
        if p is not None and _wait_ran_out(p, now_s, policy):
            if p.command_id == w.node_command_id:
                w.node_command_id = ""
                w.node_command_at = None
            timeout = ActionResult(p.command_id, Outcome.TIMED_OUT, f"no result within {policy.timeout_s(p.kind):g}s")
            reasons.append(_apply_result(w, timeout))
        elif t.state is TicketState.WATCHING and t.watch_until is not None and now_s >= t.watch_until:
            w.tickets.pop(t.ticket_id)
            reasons.append(f"ticket {t.ticket_id} closed: no recurrence within the watch window")
    since = w.node_command_at
    orphaned = bool(w.node_command_id) and w.node_owner() is None
    if orphaned and _node_command_expired(since, now_s, policy):
        reasons.append(f"node command {w.node_command_id} is no longer awaited and expired")
        w.node_command_id = ""
        w.node_command_at = None
    reasons.extend(_wake_waiting(w))
    if not reasons:
        return w.decision("nothing due")
    if len(reasons) == 1:
        return w.decision(reasons[0])
    return w.decision(f"{len(reasons)} tickets changed: {reasons[0]}; and more")


def tick_due_at(state: RemediationState, *, policy: policy.EscalationPolicy) -> float:
    """The earliest time at which `tick` may change the node's state or act (Unix seconds). Pure.

    ``-math.inf`` when it may at any time (a waiting ticket and no node command in flight);
    ``math.inf`` when nothing in it is driven by time. Before the returned time, `tick` returns the
    state unchanged and no action. It is a bound, not a promise: at that time tick may still find
    nothing to do (an owned node command's expiry is counted, as if orphaned).

    Lets the service look at only the nodes due rather than tick every node with a ticket at every
    tick: at 2,000 such nodes that look took 25-35 ms of the event loop every 2 s, in a burst.

    Example: a reset dispatched at t=0 with ``reset_gpu_timeout_s`` 600 → 600.0; the same ticket
    still held by the budget (not dispatched) → ``math.inf``.
    """
    due = math.inf
    wakes = False
    for t in state.tickets:
        p = t.pending
        if p is not None:  # `_wait_ran_out`
            due = min(due, _wait_ends_at(p, policy))
        if t.state is TicketState.WATCHING and t.watch_until is not None:
            due = min(due, t.watch_until)
        if t.state is TicketState.WAITING and t.waiting_rung is not None:  # `_wake_waiting`
            if t.hold_until is not None and not state.node_command_id:
                due = min(due, t.hold_until)
            elif t.hold_until is None:
                wakes = True
        elif t.state is TicketState.RMA_PENDING and t.gpu_uuid and "node" in t.held:
            wakes = wakes or (t.pending is None and t.validation_runs == 0)
    if wakes and not state.node_command_id:
        return -math.inf
    if state.node_command_id:  # `_node_command_expired`
        due = min(due, _node_command_ends_at(state.node_command_at, policy))
    # What `_Work` forgets once it is older than its window.
    window_s = policy.attempt_budget_window_s
    for attempt in state.attempts:
        due = min(due, attempt.at + window_s)
    for _ticket_id, closed_at in state.closed_tickets:
        due = min(due, closed_at + window_s)
    for _gpu_uuid, until in state.sdc_watch:
        due = min(due, until)
    return due


def awaited_until(state: RemediationState | None, *, now_s: float, policy: policy.EscalationPolicy) -> dict[str, float]:
    """The commands the node's ladder still waits for at now, each with when its wait runs out. Pure.

    Unix seconds, ``math.inf`` for one held back by the budget (its wait has not started). A
    command not among them is one `tick` would time out (or one no ticket waits for): sending it
    again, on a reconnect, would run it after the rung the ladder climbs to. One sent again gets
    what is left of its wait as its deadline, so the agent does not start it after the ladder has
    given up on it.

    Example: a reset dispatched at t=0 with ``reset_gpu_timeout_s`` 600 is awaited until t=600: at
    t=599 the result is {reset: 600.0}, at t=600 it is {}.
    """
    if state is None:
        return {}
    until: dict[str, float] = {}
    # The same tests as `tick`'s, so that what is sent again is exactly what a tick now would keep.
    for t in state.tickets:
        p = t.pending
        if p is not None and not _wait_ran_out(p, now_s, policy):
            until[p.command_id] = _wait_ends_at(p, policy)
    since = state.node_command_at
    orphaned = bool(state.node_command_id) and _Work(state, now_s, policy).node_owner() is None
    if orphaned and not _node_command_expired(since, now_s, policy):  # an orphaned reboot still runs its course
        until[state.node_command_id] = _node_command_ends_at(since, policy)
    return until


def _wait_ends_at(pending: Pending, policy: policy.EscalationPolicy) -> float:
    """When the ladder's wait for a command ends (its timeout from its dispatch); inf while the budget holds it."""
    return math.inf if pending.dispatched_at is None else pending.dispatched_at + policy.timeout_s(pending.kind)


def _node_command_ends_at(since: float | None, policy: policy.EscalationPolicy) -> float:
    """When a node command has had its reboot's time to finish; inf when its start is not known."""
    return math.inf if since is None else since + policy.reboot_node_timeout_s


def _wait_ran_out(pending: Pending, now_s: float, policy: policy.EscalationPolicy) -> bool:
    """Whether a dispatched command's timeout has passed (one held back by the budget has not started waiting)."""
    return pending.dispatched_at is not None and now_s - pending.dispatched_at >= policy.timeout_s(pending.kind)


def _node_command_expired(since: float | None, now_s: float, policy: policy.EscalationPolicy) -> bool:
    """Whether a node command no ticket waits for any more has had its reboot's time to finish."""
    return since is not None and now_s - since >= policy.reboot_node_timeout_s


def operator_holds(state: RemediationState, hold: str, *, held: bool) -> RemediationState:
    """The node's state with an operator's hold ("node", "gpu:<uuid>") set (``rasctl quarantine``) or lifted. Pure.

    While set, no ticket's release lifts that quarantine (`_release_holds`); ``rasctl release`` lifts it.
    """
    holds = [h for h in state.operator_holds if h != hold]
    if held:
        holds.append(hold)
    return dataclasses.replace(state, operator_holds=tuple(holds))


def operator_release(
    state: RemediationState,
    ticket_id: str,
    *,
    now_s: float,
    policy: policy.EscalationPolicy,
    force: bool = False,
    hold: str = "",
) -> Decision:
    """An operator asks to return a ticket's quarantined parts to service. Pure.

    Without ``force`` the parts are validated first and released only on a pass (DESIGN
    invariant 5). With ``force`` they are released at once with ``forced=True`` (the service
    audits who asked) and the ticket closes.

    Example: ticket AWAITING_OPERATOR holding "node" after an IB flap storm; release →
    VALIDATING: ``(RunValidation("post-repair"),)``; verdict pass → ``(Release(node),)``.

    hold: the target the operator named ("node", "gpu:<uuid>"); their own hold on it, if they set
    one, is lifted now, so that the ticket's release is the last. With ``force``, only that target
    is released (every hold when ""), and the ticket closes once it holds nothing else.
    """
    w = _Work(state, now_s, policy)
    t = w.tickets.get(ticket_id)
    if t is None:
        return w.decision(f"no ticket {ticket_id} on {state.node_id}")
    if force:
        # Only what the operator named: the node's release must not return a GPU waiting for its
        # RMA, nor one GPU's release the rest of a rebooting node.
        keep = [h for h in t.held if hold and h != hold]
        _release_holds(w, ticket_id, "operator forced release", keep=keep, forced=True)
        if keep:
            line = f"operator force-released {_hold_word(hold)} without validation; the ticket keeps {', '.join(keep)}"
            w.note(ticket_id, line)
            return w.decision(line)
        w.tickets.pop(ticket_id)
        return w.decision(f"operator force-released ticket {ticket_id} without validation")
    if t.state in (TicketState.ACTING, TicketState.WAITING):
        return w.decision(f"ticket {ticket_id} is {t.state.value}: release after the repair, or force it")
    if t.state is TicketState.WATCHING or not t.held:
        return w.decision(f"ticket {ticket_id} holds nothing to release")
    if hold in w.operator_holds:
        w.operator_holds.remove(hold)
    w.update(ticket_id, validation_runs=0)
    if t.state is TicketState.RMA_PENDING:
        # The part was replaced: treat like a repair that needs proving.
        w.update(ticket_id, purpose=Purpose.REPAIR)
    return w.decision(_start_validation(w, ticket_id, policy.post_repair_suite, "operator asked for release"))


def operator_close(state: RemediationState, ticket_id: str, *, now_s: float) -> Decision:
    """An operator closes a ticket (e.g. the RMA was handled); its holds stay as they are. Pure."""
    tickets = tuple(t for t in state.tickets if t.ticket_id != ticket_id)
    if len(tickets) == len(state.tickets):
        return Decision(state, (), f"no ticket {ticket_id} on {state.node_id}")
    closed = tuple(sorted({**dict(state.closed_tickets), ticket_id: now_s}.items()))
    return Decision(
        dataclasses.replace(state, tickets=tickets, closed_tickets=closed), (), f"operator closed ticket {ticket_id}"
    )
