"""The remediation service: runs the pure repair core on stored events and carries out its actions.

Edges only; every decision is made by `rasd.controller.core` (classify → correlate → escalate →
blast radius). This module owns the I/O around it:

1. **Events**: a node's new health events, each converted to the core's `HealthEvent`, are run
   through `escalation.handle_event`. Calls that arrive while a pass runs are decided together in
   the next one (group commit, at most ``MAX_GROUP_EVENTS`` calls). The changed ladder states,
   correlation documents and incidents and the decisions' actions (the outbox) are committed in one
   transaction before anything is sent. Events that arrive in order from their stream
   (`on_arrivals`) are stored in that transaction too, checked to be new there, and acked once it
   is done; the others (`on_events`) were stored by the ingest first.
2. **Dispatch**: undispatched actions go through `blast_radius.admit`; admitted ones are marked
   dispatched (durably) and then carried out: repairs and validations as id-keyed commands on the
   node's agent stream; quarantines, releases, RMA tickets, notifications and BMC power cycles by
   controller-side executors (adapters). An adapter is called once the commit that records its
   action dispatched is done, outside the decision lock (it waits on a scheduler's API or a BMC),
   at once across nodes and in turn within one; a repair of the same ticket waits until its
   quarantine's adapter has returned, and the adapters' outcomes come back as results, committed
   together. Actions without an adapter, or with one that waits on nothing (record only), are
   carried out in their round. Deferred ones wait for the next pass.
3. **Results** come back by command id and go through `escalation.on_result`; the same commit
   pattern applies. A periodic `tick` handles timeouts and watch windows.

A controller killed at any point restarts from the store: `pending` commands are re-admitted,
`dispatched` ones are re-sent with the same id (the agent answers a repeat from its journal and
never runs it twice), and finished ones are never sent again.

All of it runs on one asyncio lock: decisions are serialised, as the pure core assumes.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import contextvars
import dataclasses
import functools
import math
import time
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping, Sequence
from typing import Any, NamedTuple

import structlog

from rasd.api.v1 import commands_pb2 as commands_pb
from rasd.common import xid_catalog
from rasd.controller.core.remediation import actions, blast_radius, correlate, escalation, sdc
from rasd.controller.core.remediation import events as health
from rasd.controller.core.remediation import policy as policy_mod
from rasd.controller.ingest import service as ingest_mod
from rasd.controller.remediation import sdc_ledger as sdc_service
from rasd.controller.store import remediation as rstore
from rasd.controller.store import repo
from rasd.controller.store import writer as store_writer

log = structlog.get_logger("rasd.controller")

DECISION_LATENCIES_KEPT = 100_000
"""Decision latencies `RemediationStats` keeps (the latest): the simulator's report and the benchmark read them."""
MAX_GROUP_EVENTS = 512
"""Upper bound on the stored events decided together in one transaction."""
TICK_CHUNK_NODES = 200
"""Nodes ticked per hold of the decision lock (a few milliseconds), so a tick never stalls events for long."""
STORE_RETRY_S = 1.0
"""Pause before deciding a group again after the store was unavailable."""
MAX_DISPATCH_ROUNDS = 8
"""Dispatch rounds in a row: a controller-side result can admit follow-ups; bounded, never a loop."""
MAX_WAITING_CHECKED = 256
"""Waiting actions checked against the budget for a decision's own admission (`_admit_with_decision`)."""
MAX_PIPELINED_PASSES = 8
"""Passes decided in one hold of the decision lock while something else waits for it (a result, a
tick, an operator): it waits for no more. While nothing waits, the decider keeps the lock and its
pipeline full: ending a hold drains the pipeline (the last commit, then a dispatch round alone),
and in a 2,000 events/s burst the events that arrived meanwhile waited 40-60 ms more for it."""
PIPELINE_DEPTH = 2
"""Decided passes not yet committed, with a writer process: one commits while the next is decided."""
PIPELINE_GATHER_S = {"sqlite": 0.002, "postgresql": 0.01}
"""How long the decider waits for the pass ahead to commit before deciding what arrived meanwhile, by backend.

Deciding sooner makes smaller passes and more commits, each with its fixed cost; later leaves the
writer idle and the events waiting. Measured in bench/remediation_ab.py (2,000 events/s burst,
commits in a writer process, 10 ms against 2 ms): SQLite, whose commit is small now (~5 ms a
pass, the hand-off included), p99 ratio 2 ms / 10 ms median 0.74 and 0.77 in two runs of 4 rounds,
lower in 6 of 8, p50 ~40 % lower; PostgreSQL (its server on the same two cores, each commit
several round trips) 1.38, higher in 3 of 3, so it keeps 10 ms. Earlier, with commits of
~20 ms, SQLite at 2 ms gave p99 286 ms against 137-146 ms at 8-15 ms."""
AGENT_KINDS = frozenset({"restart_process", "reset_gpu", "reboot_node", "run_validation"})
LONG_ADAPTER_KINDS = frozenset({"power_cycle_bmc"})
"""Controller-side actions whose adapter takes minutes (a BMC power cycle is polled until the node is
back): their own threads (`LONG_ADAPTER_THREADS`), so that they never hold up a quarantine's."""
ADAPTER_THREADS = 16
"""Adapter calls in flight at once (quarantines and releases through the scheduler's API, RMA hooks):
a storm dispatches hundreds a second, each a few round trips to the API server."""
LONG_ADAPTER_THREADS = 32
"""BMC power cycles in flight at once; node-level, so the disruption budget bounds them first."""
_OUTCOME_STATUS = {
    commands_pb.ACTION_OUTCOME_SUCCEEDED: "succeeded",
    commands_pb.ACTION_OUTCOME_FAILED: "failed",
    commands_pb.ACTION_OUTCOME_REFUSED: "refused",
    commands_pb.ACTION_OUTCOME_NOT_SUPPORTED: "not_supported",
    commands_pb.ACTION_OUTCOME_TIMED_OUT: "timed_out",
    commands_pb.ACTION_OUTCOME_DRY_RUN: "dry_run",
}
_STATUS_OUTCOME = {status: commands_pb.ActionOutcome.Name(outcome) for outcome, status in _OUTCOME_STATUS.items()}
# Attributes the agent puts on events, mapped onto the core's typed signal fields.
_FLOAT_SIGNALS = {
    "ecc_sbe_rate_per_s": "ecc_sbe_rate_per_s",
    "nvlink_errors_per_s": "nvlink_crc_rate_per_s",
    "pcie_replays_per_s": "pcie_replay_rate_per_s",
}
_INT_SIGNALS = ("recovery_action", "remapped_rows_uncorrectable", "remapped_rows_correctable", "retired_pages")


def health_event(event: repo.StoredEvent, *, nvlink_domain: str = "") -> health.HealthEvent:
    """The core's view of a stored event; numeric signals come from the agent's attributes."""
    attributes = dict(event.attributes)
    signals: dict[str, Any] = {}
    # Membership first: most events carry none of these, and a suppress() block per key is not free.
    for key, field in _FLOAT_SIGNALS.items():
        if key in attributes:
            with contextlib.suppress(ValueError):
                signals[field] = float(attributes[key])
    for key in _INT_SIGNALS:
        if key in attributes:
            with contextlib.suppress(ValueError):
                signals[key] = int(attributes[key])
    if "retired_pages_pending" in attributes:
        signals["retired_pages_pending"] = attributes["retired_pages_pending"].lower() == "true"
    return health.HealthEvent(
        node_id=event.node_id,
        kind=health.EventKind(event.kind),
        observed_at=event.observed_unix_ns / 1e9,
        gpu_uuid=event.gpu_uuid,
        xid=event.xid,
        severity=health.Severity(event.severity),
        message=event.message,
        source=event.source,
        attributes=attributes,
        seq=event.seq,
        nvlink_domain=nvlink_domain,
        **signals,
    )


@dataclasses.dataclass
class RemediationStats:
    """What the service did (for metrics, the simulator's report and tests)."""

    events: int = 0
    decisions: int = 0
    actions_by_kind: dict[str, int] = dataclasses.field(default_factory=dict)
    decision_latency_s: collections.deque[float] = dataclasses.field(
        default_factory=lambda: collections.deque(maxlen=DECISION_LATENCIES_KEPT)
    )
    """Event stored → each action it led to handed to its executor, per such action (`_note_handed_over`);
    the latest `DECISION_LATENCIES_KEPT` (the controller runs for months; Prometheus has
    ``rasd_time_to_first_action_seconds``, once per event)."""
    decision_latency_kinds: collections.deque[str] = dataclasses.field(
        default_factory=lambda: collections.deque(maxlen=DECISION_LATENCIES_KEPT)
    )
    """The action kind of each entry of decision_latency_s, at the same position: a repair that follows a
    quarantine leaves after two commits, the quarantine's and the dispatch round's."""
    commit_s: collections.deque[float] = dataclasses.field(
        default_factory=lambda: collections.deque(maxlen=DECISION_LATENCIES_KEPT)
    )
    """How long each remediation transaction took the store (`RemediationService._store_commit`), the latest
    `DECISION_LATENCIES_KEPT`: the store's share of the decision latencies (Prometheus has
    ``rasd_remediation_commit_seconds``)."""
    max_disrupted_nodes: int = 0
    passes: int = 0
    """Decision passes committed."""
    passes_overlapped: int = 0
    """Of those, passes decided while a pass ahead of them was still committing (`_run_pipeline`)."""


class _Call(NamedTuple):
    """One `on_events` or `on_arrivals` call waiting to be decided."""

    node_id: str
    events: list[repo.StoredEvent]
    labels: dict[str, str]
    future: asyncio.Future[None]
    append: repo.ExpectedAppend | None = None
    """Set for `on_arrivals`: the events are not stored yet, and are stored by the pass that decides them."""
    stored: Callable[[], None] | None = None
    """`on_arrivals`' callback: called once the pass that stored the events committed, before its commands leave."""


@dataclasses.dataclass
class _Pass:
    """A decided group: what its commit writes, what follows it, and how to undo it if it never commits."""

    group: list[_Call]
    """The calls it decides (none for a dispatch round)."""
    change: rstore.Commit
    states: dict[str, escalation.RemediationState]
    new_actions: list[actions.Action]
    dispatched: dict[str, actions.Action]
    """The new agent commands admitted with the decision (`_admit_with_decision`)."""
    states_before: dict[str, escalation.RemediationState | None]
    correlation_before: correlate.CorrelationState
    budget_before: blast_radius.BudgetState
    budget_stored_before: blast_radius.BudgetState | None
    detect_s: list[float] = dataclasses.field(default_factory=list)
    new_incidents: list[correlate.Incident] = dataclasses.field(default_factory=list)
    decisions: int = 0
    admitted: list[actions.Action] = dataclasses.field(default_factory=list)
    """A dispatch round's admitted waiting actions (`_stage_dispatch`)."""
    answers: list[_Call] = dataclasses.field(default_factory=list)
    """Calls answered once it commits: a dispatch round answers those whose actions it dispatched."""
    rounds: int = 0
    """Dispatch rounds in a row up to this one (a result can admit follow-ups; bounded)."""
    overlapped: bool = False
    """Decided while a pass ahead of it was committing."""
    commit: asyncio.Future[list[str]] = dataclasses.field(init=False)

    @property
    def leaves_waiting(self) -> bool:
        """Some of its actions wait for admission: their dispatch must follow its commit."""
        return any(a.command_id not in self.dispatched for a in self.new_actions)

    def answers_dispatched(self) -> list[_Call]:
        """The calls it answers whose decisions an earlier pass committed (a dispatch round's)."""
        own = {id(call.future) for call in self.group}
        return [call for call in self.answers if id(call.future) not in own]

    def answers_waiting(self) -> list[_Call]:
        """The calls it decides: answered when their actions are dispatched."""
        own = {id(call.future) for call in self.group}
        return [call for call in self.answers if id(call.future) in own]


@dataclasses.dataclass(slots=True)
class _EventClock:
    """When an event that led to commands was stored, and whether one of them has left yet."""

    stored_s: float
    acted: bool = False


class _DecisionLock:
    """The decision lock (an `asyncio.Lock`) that also counts who waits for it.

    The decider asks `waiting` to end a hold only when something else wants the lock.
    """

    def __init__(self) -> None:
        self._lock = asyncio.Lock()
        self.waiting = 0

    async def __aenter__(self) -> None:
        self.waiting += 1
        try:
            await self._lock.acquire()
        finally:
            self.waiting -= 1

    async def __aexit__(self, *exc_info: object) -> None:
        self._lock.release()

    def locked(self) -> bool:
        """Whether someone holds it."""
        return self._lock.locked()


class _CommitChain:
    """The commits of one pipeline run, in order on the store thread; after one fails, the rest are refused.

    Each pass was decided on the passes before it: one committed after a failed one would make
    durable a decision whose grounds never were.
    """

    def __init__(self, commit: Callable[[rstore.Commit], list[str]]) -> None:
        self._commit = commit
        self.broken = False

    def __call__(self, change: rstore.Commit) -> list[str]:
        if self.broken:
            raise _NotRun("an earlier commit of this pipeline failed")
        try:
            return self._commit(change)
        except BaseException:
            self.broken = True
            raise


class _NotRun(RuntimeError):
    """A pipelined commit refused unrun, behind one that failed."""


class TermEnded(RuntimeError):
    """This replica's term as leader ended before these events were decided.

    Stored already, the next leader decides them from the store (the events its watermark has not
    covered), on the state the terms before it committed; arriving ones (`on_arrivals`) may not be
    stored, and their caller stores them.
    """


class _StoreStalled(Exception):
    """The store was unavailable for a pass; its groups wait in the inbox to be tried again."""

    def __init__(self, *, events: int) -> None:
        super().__init__(f"{events} events wait for the store")
        self.events = events


class RemediationService:
    """Drives the repair ladder for the whole fleet (runs on the leader replica: rasd.controller.replication.leader)."""

    def __init__(
        self,
        store: repo.Store,
        ingest: ingest_mod.Ingest,
        *,
        policy: policy_mod.RemediationPolicy | None = None,
        executors: Mapping[str, Callable[[actions.Action], Any]] | None = None,
        clock: Callable[[], int] = time.time_ns,
        tick_interval_s: float = 2.0,
    ) -> None:
        """Bind to the store and the ingest; call `start()` inside the event loop."""
        self.store = rstore.RemediationStore(store.engine)
        self.ingest = ingest
        self.policy = policy or policy_mod.RemediationPolicy()
        self.catalog = xid_catalog.load_catalog()
        self._executors = dict(executors or {})
        # Threads start when first needed: a controller whose adapter only records never starts one.
        self._adapter_threads = concurrent.futures.ThreadPoolExecutor(ADAPTER_THREADS, "rasd-adapter")
        self._long_adapter_threads = concurrent.futures.ThreadPoolExecutor(LONG_ADAPTER_THREADS, "rasd-adapter-long")
        self._running: dict[str, actions.Action] = {}
        """Controller-side actions whose adapter was called, until their outcome is committed."""
        self._running_tasks: set[asyncio.Task[None]] = set()
        self._adapter_of_ticket: dict[str, str] = {}
        """Ticket id → the command id of its controller-side action whose adapter runs now."""
        self._held: dict[str, list[actions.Action]] = {}
        """Command id of a running adapter → the agent commands of its ticket that wait for it to return."""
        self._held_by: dict[str, str] = {}
        """Agent command id → the command id it waits for (`_held`)."""
        self._node_adapters: dict[str, tuple[asyncio.Lock, list[int]]] = {}
        """Node → the lock its adapter calls take in turn, and how many wait for it (the entry goes at 0)."""
        self._adapter_results: list[tuple[str, commands_pb.ActionResult]] = []
        """Adapters' outcomes not yet committed (`_drain_adapter_results` commits them together)."""
        self._results_drain: asyncio.Task[None] | None = None
        self._clock = clock
        self._tick_interval_s = tick_interval_s
        self._lock = _DecisionLock()
        self.node_states: dict[str, escalation.RemediationState] = {}
        self.correlation = correlate.CorrelationState()
        self.budget = blast_radius.BudgetState()
        self._fleet: blast_radius.FleetView | None = None
        self._fleet_version = -1
        """The ingest's labels version the fleet view was built from."""
        self._quarantine_gauge_stale = False
        self._last_incident_s: dict[str, float] = {}
        """Node → when its latest incident opened (``rasd_time_between_incidents_seconds``); from the store at start."""
        self._tick_due: dict[str, tuple[escalation.RemediationState, policy_mod.EscalationPolicy, float]] = {}
        """Node → (its state, the ladder policy, `escalation.tick_due_at` of them), for `_nodes_due`."""
        self._budget_stored: blast_radius.BudgetState | None = None
        """The budget as the store holds it (None: never written); only a changed budget is written."""
        self.stats = RemediationStats()
        self._deferred: dict[str, actions.Action] = {}
        self._event_times: dict[str, _EventClock] = {}
        """Command id → when the event that led to it was stored, until the command leaves (`_note_handed_over`)."""
        self._ticker: asyncio.Task[None] | None = None
        self._background: set[asyncio.Task[None]] = set()
        # Operator-started commands (validation runs) go to a node's stream through these. One replica:
        # this replica's streams. Several: the server points them at the relay, so a node whose stream
        # another replica holds is reached too (its command and result travel through the store).
        self.command_sender: Callable[..., Awaitable[commands_pb.ActionResult]] = ingest.send_command
        self.node_reachable: Callable[[str], Awaitable[bool]] = self._local_stream
        self._kinds: dict[str, str] = {}
        self._unanswered: dict[str, actions.Action] = {}
        self._inbox: list[_Call] = []
        self._decider: asyncio.Task[None] | None = None
        self._term_ended = False
        """`stop` ran and `start` has not since: nothing is decided (`TermEnded`)."""
        self.sdc = sdc_service.SdcLedger(self.policy.sdc)
        self._sweeper: asyncio.Task[None] | None = None
        """Agent commands dispatched and not yet answered, re-sent when their node reconnects."""
        self._results_owed: list[tuple[str, commands_pb.ActionResult]] = []
        """Results that arrived while the store was unavailable, applied by the next tick."""
        self.decision_hook: Callable[[Sequence[actions.Action], int], None] | None = None
        """Called with the actions each commit newly put in the outbox and the commit's time (recording)."""
        self.accusation_hook: Callable[..., None] | None = None
        """Called with (node_id, gpu_uuid, reason=, accuser=, at_unix_ns=) of each SDC accusation (recording)."""
        self.send_hook: Callable[[actions.Action], bool] | None = None
        """Where dispatched agent commands go instead of this replica's streams (rasd.controller.replication.relay)."""
        self._pipeline_depth = 1
        """Decided passes in flight at once (`use_writer`): with commits in this process, 1."""
        self._gather_s = PIPELINE_GATHER_S.get(self.store.engine.dialect.name, max(PIPELINE_GATHER_S.values()))
        """`PIPELINE_GATHER_S` for this store's backend."""

    @property
    def adapters_busy(self) -> int:
        """Adapter calls whose outcome is not committed yet, plus the repairs that wait for one (`_hold`)."""
        return len(self._running) + len(self._held_by)

    @property
    def quiet(self) -> bool:
        """Nothing waits for a decision now: no event waits, no pass, result, tick or operator action holds the lock.

        `gc_policy.QuietCollector` collects only then, so that no decision waits for a collection.
        """
        return not self._inbox and not self._lock.locked()

    def use_writer(self, writer: store_writer.CommitProcess) -> None:
        """Commit in writer's process, and decide the next pass while one commits (`_run_pipeline`).

        With commits in this process, deciding while committing only makes the two take turns at
        the GIL (measured slower than one pass at a time), so the pipeline is one pass deep.
        """
        self.store.writer = writer
        self._pipeline_depth = PIPELINE_DEPTH

    # -- lifecycle -------------------------------------------------------------------------------------
    async def start(self) -> None:
        """Load durable state, resume the outbox, start the tick loop (again at each leader term)."""
        self._term_ended = False
        for transient in (
            self._deferred,
            self._unanswered,
            self._kinds,
            self._event_times,
            self._tick_due,
            self._running,
            self._adapter_of_ticket,
            self._held,
            self._held_by,
        ):
            transient.clear()  # a new term starts from the store alone
        if self.store.writer is not None:
            await asyncio.to_thread(self.store.writer.start)  # before the first decision waits for it
        else:
            await self.ingest.run_in_store(self.store.warm_up)  # the writer process warms itself
        node_docs = await self.ingest.run_in_store(self.store.load_node_states)
        self.node_states = {n: escalation.RemediationState.from_dict(d) for n, d in node_docs.items()}
        # The budget's fleet is every node the store knows, not only those back on a stream yet:
        # right after a restart, the replayed backlog's demand was weighed against the few nodes
        # that had reconnected ("10 of 5 nodes"), and the circuit breaker tripped on its own count.
        for node in await self.ingest.run_in_store(self.ingest.store.list_nodes):
            if node.node_id not in self.ingest.node_labels:
                self.ingest.remember_remote_node(node.node_id, node.labels, tuple(g.record.uuid for g in node.gpus))
        corr_docs = await self.ingest.run_in_store(self.store.load_docs, CORRELATION_PREFIX)
        incident_data = await self.ingest.run_in_store(self.store.incident_data, correlation_incident_ids(corr_docs))
        budget = await self.ingest.run_in_store(self.store.load_doc, "budget")
        latest = await self.ingest.run_in_store(self.store.latest_incident_opened)
        self._last_incident_s = {node_id: opened_ns / 1e9 for node_id, opened_ns in latest.items()}
        self.correlation = correlation_from_docs(corr_docs, incident_data)
        stored = blast_radius.BudgetState.from_dict(budget) if budget else blast_radius.BudgetState()
        # The breaker's demand is in documents of its own. A budget document from before holds it
        # too (its "demand"): merged in, and with nothing counted as stored, the next commit writes
        # it all out as demand documents and rewrites the budget document without it.
        demand_docs = await self.ingest.run_in_store(self.store.load_docs, BUDGET_DEMAND_PREFIX)
        self.budget = stored.with_demand(demand_docs.values())
        self._budget_stored = self.budget if (budget or demand_docs) and not stored.demand else None
        # The GPUs automation holds are the store's quarantine rows, not part of the budget document.
        held = await self.ingest.run_in_store(self.store.quarantines)
        self.budget = self.budget.with_quarantined_gpus(
            (
                (q["node_id"], q["gpu_uuid"])
                for q in held
                if q["gpu_uuid"] and not q["port"] and q["source"] == "automation"
            ),
            self._fleet_view(),
        )
        unfinished = await self.ingest.run_in_store(lambda: self.store.commands(statuses=("pending", "dispatched")))
        for record in unfinished:
            action = actions.from_dict(record.payload)
            if record.status == "pending":
                self._deferred[record.command_id] = action
        resend = [r for r in unfinished if r.status == "dispatched" and r.kind in AGENT_KINDS]
        # Controller-side actions that were dispatched but whose outcome never got committed: carry
        # them out again now. Their executors are idempotent (a repeated quarantine is a no-op that
        # says so), so "at least once" here is "exactly once" in effect.
        redo = [
            actions.from_dict(r.payload) for r in unfinished if r.status == "dispatched" and r.kind not in AGENT_KINDS
        ]
        self.sdc.load(
            await self.ingest.run_in_store(self.store.load_docs, sdc_service.GPU_PREFIX),
            await self.ingest.run_in_store(self.store.load_docs, sdc_service.SWEEP_PREFIX),
        )
        self._ticker = asyncio.create_task(self._tick_forever(), name="rasd-remediation-tick")
        if self.policy.sdc.sweep_enabled:
            self._sweeper = asyncio.create_task(self._sweep_forever(), name="rasd-sdc-sweep")
        self._export_budget()
        await self._export_quarantines()
        # A repair whose quarantine's outcome was never committed waits for it to be carried out
        # again, as it waited the first time: never sent before its node leaves scheduling.
        blockers: dict[str, actions.Action] = {}
        for record in unfinished:
            if record.status == "dispatched" and record.kind not in AGENT_KINDS:
                by_adapter = actions.from_dict(record.payload)
                if self._leaves_after_commit(by_adapter):  # its adapter is called after the commit: outcome unknown
                    blockers[record.ticket_id] = by_adapter
        for record in resend:
            action = actions.from_dict(record.payload)
            blocker = blockers.get(record.ticket_id)
            if blocker is not None and blocker.node_id == action.node_id and blocker.step < action.step:
                self._hold(action, blocker.command_id)
            else:
                self._unanswered[record.command_id] = action
        async with self._lock:
            for action in redo:
                self._deferred[action.command_id] = action  # re-admitted and carried out again
            await self._dispatch_locked()
        # Events stored before a crash but never run through the ladder: run them now, in order.
        backlog = await self.ingest.run_in_store(self.store.unprocessed_events)
        for node_id, (labels, events) in backlog.items():
            log.info("remediation_replaying_events", node=node_id, events=len(events))
            await self.on_events(node_id, events, labels)
        log.info(
            "remediation_started",
            nodes_with_state=len(self.node_states),
            pending=len(self._deferred),
            dispatched_unanswered=len(resend),
            controller_side_redone=len(redo),
            nodes_replayed=len(backlog),
        )

    async def stop(self) -> None:
        """Stop the tick loop and stop waiting for long adapters (state is already durable).

        An adapter's thread runs on; its outcome is not recorded by this term. The next term carries
        the action out again (`start`): adapters are idempotent (a repeated quarantine is a no-op
        that says so; the BMC journal never cycles a node twice for one ticket).
        """
        for task in (self._ticker, self._sweeper, self._results_drain, *self._running_tasks):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        # Events waiting for the decider, or put back by a pass the store could not take, were to be
        # decided on this term's state; a later term of this replica decided them again on its own
        # (after another leader had decided them) and moved the watermark back. Its passes in flight
        # are answered; a commit already handed to the store ends there, under this term's fence.
        self._term_ended = True
        if self._decider is not None:
            self._decider.cancel()
            await asyncio.gather(self._decider, return_exceptions=True)
            self._decider = None
        stale, self._inbox = self._inbox, []
        _answer(stale, TermEnded(f"this replica's term ended before {len(stale)} event groups were decided"))

    async def node_connected(self, node_id: str) -> None:
        """Re-send this node's dispatched, unanswered commands (same ids: the agent never runs one twice).

        A command can be lost with a stream (or with a controller that died after dispatching it);
        the agent answers a repeat from its journal.
        """
        awaited = escalation.awaited_until(
            self.node_states.get(node_id), now_s=self._clock() / 1e9, policy=self.policy.escalation
        )
        for action in [a for a in self._unanswered.values() if a.node_id == node_id]:
            until = awaited.get(action.command_id)
            if until is None:
                # Its wait ran out while the node was away (or this replica was down): the tick
                # closes it and climbs. Sent now, it would run after the rung above it.
                continue
            if self._send(action, deadline_unix_ns=None if math.isinf(until) else int(until * 1e9)):
                self._note_handed_over(action)  # counted once: only a command never sent before is still timed

    # -- inbound ---------------------------------------------------------------------------------------
    async def on_events(self, node_id: str, events: Sequence[repo.StoredEvent], labels: Mapping[str, str]) -> None:
        """Run newly stored events through the core, commit, dispatch; returns once they are decided.

        Calls from many streams are grouped: whatever is waiting when the decider is free is decided
        together and committed in one transaction (group commit), so a burst costs one correlation
        snapshot and one commit per group instead of per event.
        """
        if not events:
            return
        await self._decide_call(node_id, events, labels)

    async def on_arrivals(
        self,
        node_id: str,
        events: Sequence[repo.StoredEvent],
        labels: Mapping[str, str],
        append: repo.ExpectedAppend,
        stored: Callable[[], None] | None = None,
    ) -> None:
        """`on_events` for events not stored yet: the transaction of the pass that decides them stores them.

        In a burst, storing the events and then committing the decision on them were two
        transactions, each waiting for the disk, one after the other: here both are durable at
        once (`rstore.Commit.event_appends`). The pass decides them as new, so their transaction
        checks that they are (append: what the caller expects storing them to do) and is refused
        otherwise. stored is called as soon as that transaction committed, before any command it
        dispatched leaves (the caller acks the events there, as it did before their decision).

        Raises:
            repo.EventsNotAsExpected: storing them would not have done what append says (a resend,
                a spool the node has left): nothing of the pass was written, and the caller stores
                them on their own (`Ingest.store_events`), which sorts out which of them are new.
            TermEnded: this term ended first; whether they were stored is not known (store them).
            Exception: the core failed on them; nothing of them was written.
        """
        await self._decide_call(node_id, events, labels, append, stored)

    async def _decide_call(
        self,
        node_id: str,
        events: Sequence[repo.StoredEvent],
        labels: Mapping[str, str],
        append: repo.ExpectedAppend | None = None,
        stored: Callable[[], None] | None = None,
    ) -> None:
        if self._term_ended:
            # A decider started now would decide on the ended term's state, and commit after its
            # stop. Stored events wait for the next term's replay; arriving ones are stored apart.
            raise TermEnded(f"this replica's term ended: {len(events)} events of {node_id} not decided")
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._inbox.append(_Call(node_id, list(events), dict(labels), future, append, stored))
        if self._decider is None or self._decider.done():
            self._decider = asyncio.create_task(self._decide_waiting(), name="rasd-remediation-decider")
        await future

    async def _decide_waiting(self) -> None:
        while self._inbox:
            try:
                async with self._lock:
                    await self._run_pipeline()
            except _StoreStalled as stalled:
                # The events are stored and acked already, so their decision is owed: the groups went
                # back first in line (`_run_pipeline`), to be tried again. Their callers wait (their
                # streams stop reading, so the agents spool) rather than fail, which would leave the
                # events undecided until restart.
                log.warning("remediation_store_unavailable", events=stalled.events, error=str(stalled.__cause__))
                await asyncio.sleep(STORE_RETRY_S)
            except Exception:  # a bug: the passes' callers heard of it (`_run_pipeline`); go on with the rest
                log.exception("remediation_pipeline_failed")

    async def _run_pipeline(self) -> None:
        """Decide waiting groups, each pass while the one before it commits, until something else wants the lock.

        A pass is decided on the state the passes before it leave, before their commits are done
        (`_decide_pass` applies it in memory at once), and its commit queues behind theirs on the
        store thread. Nothing is sent and no caller hears back before a pass's own commit is done
        (`_finish_pass`). If one fails, the chain refuses the commits queued behind it unrun, every
        pass from it on is undone in memory, newest first, and their groups go back to the inbox.

        A pass that leaves actions waiting for admission (a quarantine goes before its node's
        repair) is followed, once its commit is done, by a dispatch round (`_stage_dispatch`, whose
        adapters so act on durable decisions only). When events wait, the round shares the next
        pass's transaction (`_merged`): one commit, not two, per pass in a burst. Callers return once
        their decisions are durable and their commands dispatched.
        """
        inflight: list[_Pass] = []
        try:
            await self._pipeline(inflight)
        except _StoreStalled:
            raise
        except asyncio.CancelledError:  # the term ended (`stop`): no caller waits for ever
            for unfinished in inflight:
                _answer(unfinished.answers, TermEnded("this replica's term ended while the decision was committed"))
            raise
        except Exception as exc:
            for unfinished in inflight:
                _answer(unfinished.answers, exc)
            raise

    async def _pipeline(self, inflight: list[_Pass]) -> None:
        chain = _CommitChain(self._store_commit)
        carried: _Pass | None = None  # a dispatch round staged, to commit with the next pass
        passes = 0
        while True:
            deciding = sum(1 for p in inflight if p.group)  # dispatch rounds in flight do not hold it up
            wanted = self._lock.waiting > 0  # a result, a tick or an operator waits for the lock
            open_for_more = (passes < MAX_PIPELINED_PASSES or not wanted) and deciding < self._pipeline_depth
            if open_for_more and self._inbox:
                group, self._inbox = self._inbox[:MAX_GROUP_EVENTS], self._inbox[MAX_GROUP_EVENTS:]
                passes += 1
                # Actions a pass ahead left waiting are not on the waiting list until it commits.
                waiting_ahead = [a for p in inflight for a in p.new_actions if a.command_id not in p.dispatched]
                decided = self._decide_or_fail(group, waiting_ahead)
                if decided is not None:
                    decided.answers = list(group)
                    decided.overlapped = bool(inflight)
                if carried is not None:
                    decided = carried if decided is None else _merged(carried, decided)
                    carried = None
                if decided is not None:
                    self._submit(chain, decided, inflight)
                continue
            if carried is not None:  # no pass to share a transaction with
                self._submit(chain, carried, inflight)
                carried = None
                continue
            if not inflight:
                return
            head = inflight[0]
            if not head.commit.done():
                # While the head commits, what arrives meanwhile is decided as the next pass.
                await asyncio.wait([head.commit], timeout=self._gather_s if open_for_more else None)
                continue
            try:
                fresh = head.commit.result()
            except BaseException as exc:
                await self._abandon(inflight, exc)
                return
            inflight.pop(0)
            self._finish_pass(head, set(fresh), inflight)
            _answer(head.answers_dispatched())
            waiting = head.answers_waiting()
            if not (head.leaves_waiting and head.rounds < MAX_DISPATCH_ROUNDS and self._deferred):
                _answer(waiting)
                continue
            try:
                # Not what a pass still committing cancels: it waits only until that commit is done.
                dispatch = await self._stage_dispatch(closing={c for p in inflight for c in _cancelled_ids(p.change)})
            except Exception as exc:  # a bug: nothing of the round is committed; the next tick tries again
                log.exception("remediation_dispatch_failed")
                _answer(waiting, exc)
                continue
            dispatch.answers, dispatch.rounds = waiting, head.rounds + 1
            if dispatch.admitted or dispatch.change.docs:
                carried = dispatch
            else:
                _answer(waiting)

    def _submit(self, chain: _CommitChain, staged: _Pass, inflight: list[_Pass]) -> None:
        """Queue a staged pass's commit behind those in flight."""
        staged.commit = asyncio.ensure_future(self.ingest.run_in_store(chain, staged.change))
        inflight.append(staged)

    async def _abandon(self, inflight: list[_Pass], exc: BaseException) -> None:
        """The head pass's commit failed: undo it and every pass staged on it; their groups wait again."""
        for later in inflight[1:]:
            with contextlib.suppress(BaseException):
                await later.commit  # refused by the chain, unrun: nothing of it is durable
        for undone in reversed(inflight):
            self._undo_pass(undone)
        self._export_budget()
        head = inflight[0]
        later_groups = [call for p in inflight[1:] for call in p.group]
        # The callers a dispatch round was to answer have their decisions durable; their actions
        # wait for the next round (the next pass or tick).
        for undone in inflight:
            _answer(undone.answers_dispatched())
        if isinstance(exc, repo.STORE_UNAVAILABLE):
            self._inbox[:0] = [*head.group, *later_groups]
            if head.group:
                raise _StoreStalled(events=sum(len(call.events) for call in self._inbox)) from exc
            log.warning("remediation_dispatch_deferred", error=str(exc))
            return
        if isinstance(exc, repo.EventsNotAsExpected):
            # Arriving events that were not new after all: their callers store them on their own,
            # and hand on what is new; the rest of the head's group is decided again.
            self._inbox[:0] = [call for call in head.group if call.append is None] + later_groups
            _answer([call for call in head.group if call.append is not None], exc)
            return
        # Anything else (a fenced replica's refusal, a bug): the head's callers hear of it, and
        # the passes behind it, never run, are decided again.
        self._inbox[:0] = later_groups
        _answer(head.group, exc)

    def _decide_or_fail(self, group: list[_Call], waiting_ahead: Sequence[actions.Action]) -> _Pass | None:
        """`_decide_pass`, or None when the core failed on the group: its callers hear of it."""
        budget = self.budget
        try:
            return self._decide_pass(group, waiting_ahead)
        except Exception as exc:  # the callers' streams see it; nothing of the group was applied
            self.budget = budget
            _answer(group, exc)
            return None

    def _decide_pass(self, group: list[_Call], waiting_ahead: Sequence[actions.Action]) -> _Pass:
        """Decide a group and stage its commit; its state is applied in memory now, undone if the commit fails.

        waiting_ahead: the actions passes still committing left waiting (`_admit_with_decision`).
        """
        now_ns = self._clock()
        now = now_ns / 1e9
        corr = self.correlation
        budget_before = self.budget
        states: dict[str, escalation.RemediationState] = {}
        new_actions: list[actions.Action] = []
        change = rstore.Commit(now_unix_ns=now_ns)
        # Counted only once the decision is committed: a group retried after a store failure is not counted twice.
        detect_s: list[float] = []
        new_incidents: list[correlate.Incident] = []
        decisions = 0
        scopes: set[str] = set()  # the correlation scopes and nodes the events touched: nothing else changes
        port_nodes: set[str] = set()
        for node_id, events, labels, _future, append, _stored in group:
            if append is not None:
                change.event_appends.append(append)
            state = states.get(node_id) or self.node_states.get(node_id) or escalation.RemediationState(node_id)
            for stored in events:
                event = health_event(stored, nvlink_domain=labels.get("nvlink_domain", ""))
                scopes.add(correlate.scope_of(event))
                port_nodes.add(event.node_id)
                result = escalation.handle_event(
                    corr, state, event, now_s=now, catalog=self.catalog, policy=self.policy
                )
                corr = result.correlation.state
                state = result.decision.state
                detect_s.append(max(0.0, (stored.received_unix_ns - stored.observed_unix_ns) / 1e9))
                if result.correlation.incident is not None and result.correlation.outcome is correlate.Outcome.NEW:
                    new_incidents.append(result.correlation.incident)
                if result.decision.actions:
                    decisions += 1
                    clock = _EventClock(stored.received_unix_ns / 1e9)  # shared: its first command to leave is timed
                    for action in result.decision.actions:
                        self._event_times.setdefault(action.command_id, clock)
                    new_actions.extend(result.decision.actions)
                    log.info(
                        "remediation_decided",
                        node=node_id,
                        seq=stored.seq,
                        actions=[a.kind for a in result.decision.actions],
                        reason=result.decision.reason,
                    )
                self._close(result.decision, change, now)
            if state is not (states.get(node_id) or self.node_states.get(node_id)):
                states[node_id] = state  # a duplicate or secondary leaves the node's state as it was: not rewritten
            _note_consumed(change, node_id, events)
        self._correlation_into(change, corr, changed_incidents=True, scopes=scopes, port_nodes=port_nodes)
        dispatched, follow_up = self._admit_with_decision(new_actions, states, change, waiting_ahead)
        new_actions.extend(follow_up)
        decided = _Pass(
            group=group,
            change=change,
            states=states,
            new_actions=new_actions,
            dispatched=dispatched,
            detect_s=detect_s,
            new_incidents=new_incidents,
            decisions=decisions,
            states_before={node_id: self.node_states.get(node_id) for node_id in states},
            correlation_before=self.correlation,
            budget_before=budget_before,
            budget_stored_before=self._budget_stored,
        )
        self._budget_stored = self._stage_commit(states, new_actions, change, dispatched)
        self.node_states.update(states)
        self.correlation = corr
        return decided

    def _undo_pass(self, undone: _Pass) -> None:
        """Put memory back as it was before a pass whose commit did not happen."""
        for node_id, state in undone.states_before.items():
            if state is None:
                self.node_states.pop(node_id, None)
            else:
                self.node_states[node_id] = state
        self.correlation = undone.correlation_before
        self.budget = undone.budget_before
        self._budget_stored = undone.budget_stored_before
        for action in undone.admitted:
            self._deferred.setdefault(action.command_id, action)

    def _finish_pass(self, done: _Pass, fresh: set[str], later: Sequence[_Pass]) -> None:
        """A pass's commit is done: count it and send its commands.

        later: the passes decided after it, still in flight; a hold on the budget given back here
        stays given back should one of them be undone.
        """
        for call in done.group:
            if call.stored is not None:
                call.stored()
        sent = self._after_commit(done.new_actions, done.change, done.dispatched, fresh, done.admitted)
        now = done.change.now_unix_ns / 1e9
        for command_id in done.dispatched.keys() - fresh:
            for undoable in later:
                undoable.budget_before = blast_radius.complete(undoable.budget_before, command_id, now_s=now)
        metrics = self.ingest.metrics
        self.stats.events += len(done.detect_s)
        self.stats.decisions += done.decisions
        if done.group:
            self.stats.passes += 1
            self.stats.passes_overlapped += done.overlapped
        for seconds in done.detect_s:
            metrics.time_to_detect_seconds.observe(seconds)
        for incident in done.new_incidents:
            metrics.incidents.labels(
                cause=incident.fault_key, component=str(incident.classification.component.value)
            ).inc()
            self._note_incident_opened(incident)
        if done.change.quarantines or done.change.releases:
            # The gauge is refreshed by the next tick, not here: counting is a query, and a
            # burst dispatches many times a second while Prometheus scrapes every few seconds.
            self._quarantine_gauge_stale = True
        self._send_dispatched(sent)

    def _note_incident_opened(self, incident: correlate.Incident) -> None:
        """Observe the time since the node's previous incident opened (its committed new incident).

        An incident opens at the controller's clock: one that opened before the node's latest (the
        clock stepped back, or a new leader's runs behind the last one's) is not an interval and
        moves nothing back.
        """
        previous = self._last_incident_s.get(incident.node_id)
        if previous is not None and incident.opened_at >= previous:
            self.ingest.metrics.time_between_incidents_seconds.observe(incident.opened_at - previous)
        if previous is None or incident.opened_at > previous:
            self._last_incident_s[incident.node_id] = incident.opened_at

    def _admit_with_decision(
        self,
        new_actions: Sequence[actions.Action],
        states: dict[str, escalation.RemediationState],
        change: rstore.Commit,
        waiting_ahead: Sequence[actions.Action] = (),
    ) -> tuple[dict[str, actions.Action], list[actions.Action]]:
        """Admit a pass's actions into its own transaction; returns them by command id, and the ladder's follow-ups.

        Most decisions are one agent command (restart, reset, reboot), or a quarantine and its
        repair. Admitting them before the decision commits, and recording them as dispatched in
        that commit, saves the dispatch round's transaction and its wait on every such decision.
        The outbox rule is unchanged: no agent command is sent before the transaction that says it
        was dispatched has committed. A controller-side action whose adapter waits on nothing
        (record only, or no adapter: an RMA ticket, a notice) is carried out here, its record and
        outcome in the same transaction: the record is the whole of what it does, so it is as
        durable as the decision and no sooner. The ladder's follow-ups to those outcomes go into
        the outbox pending, for the dispatch round.

        Taken only when it cannot change what is admitted or in which order:
        - none of the node's actions has an adapter that waits on another system (Kubernetes,
          Slurm, a BMC): such an adapter is called only on a durable decision, and its node's
          repair is sent when it returns, so such a node goes the two-step way; nor waits for
          admission;
        - what waits for admission (on the waiting list, or left waiting by a pass ahead still
          committing, waiting_ahead) is admitted first by the dispatch round; so the actions are
          admitted now only if the budget admits everything waiting and them together, and at most
          ``MAX_WAITING_CHECKED`` actions wait (more: the budget is binding anyway);
        - an admission that answers with an action of its own (the breaker's notice) is dropped,
          and the two-step way decides it.
        """
        if not new_actions:
            return {}, []
        cancelled = _cancelled_ids(change)
        waiting = [a for a in (*self._deferred.values(), *waiting_ahead) if a.command_id not in cancelled]
        if len(waiting) > MAX_WAITING_CHECKED:
            return {}, []
        held = {a.node_id for a in waiting} | {a.node_id for a in new_actions if self._waits_on_adapter(a)}
        candidates = [a for a in new_actions if a.node_id not in held and a.command_id not in cancelled]
        if not candidates:
            return {}, []
        if waiting:
            together = blast_radius.admit(
                self.budget,
                [*waiting, *candidates],
                self._fleet_view(),
                now_s=change.now_unix_ns / 1e9,
                policy=self.policy.disruption,
            )
            if len(together.admitted) != len(waiting) + len(candidates) or together.deferred:
                return {}, []
        now_ns = change.now_unix_ns
        now = now_ns / 1e9
        admission = blast_radius.admit(
            self.budget, candidates, self._fleet_view(), now_s=now, policy=self.policy.disruption
        )
        proposed = {a.command_id for a in candidates}
        if not admission.admitted or any(a.command_id not in proposed for a in admission.admitted):
            return {}, []
        self.budget = admission.state
        self._export_budget()
        self.stats.max_disrupted_nodes = max(self.stats.max_disrupted_nodes, len(self.budget.disrupted_nodes()))
        for action, reason in zip(admission.deferred, admission.reasons, strict=False):
            log.info("remediation_deferred", node=action.node_id, action=action.kind, reason=reason)
        admitted: dict[str, actions.Action] = {}
        for action in admission.admitted:
            self._record_dispatch(action, states, change)
            admitted[action.command_id] = action
        follow_up: list[actions.Action] = []
        for action in admission.admitted:
            if action.kind not in AGENT_KINDS:
                self._record_controller_side(action, change, source="automation")
                self._note_dispatched(action)
                follow_up += self._carry_out_now(action, change, states)
        return admitted, follow_up

    def _waits_on_adapter(self, action: actions.Action) -> bool:
        """A controller-side action whose adapter waits on another system: called only once its dispatch is durable."""
        return action.kind not in AGENT_KINDS and self._leaves_after_commit(action)

    def _record_dispatch(
        self, action: actions.Action, states: dict[str, escalation.RemediationState], change: rstore.Commit
    ) -> None:
        """Put an admitted action's dispatch into change: its ticket's dispatch time (in states) and the audit row."""
        now_ns = change.now_unix_ns
        state = states.get(action.node_id) or self.node_states.get(action.node_id)
        if state is not None:
            states[action.node_id] = escalation.mark_dispatched(state, action.command_id, now_s=now_ns / 1e9)
        change.audit.append(
            _audit(
                now_ns,
                "automation",
                action.kind,
                action.node_id,
                getattr(action, "gpu_uuid", ""),
                action.reason,
                "dispatched",
            )
        )

    def _note_dispatched(self, action: actions.Action) -> None:
        """Count an action admitted and recorded as dispatched."""
        self.stats.actions_by_kind[action.kind] = self.stats.actions_by_kind.get(action.kind, 0) + 1
        self._kinds[action.command_id] = action.kind

    def _note_handed_over(self, action: actions.Action, *, at_ns: int | None = None) -> None:
        """The decision latency of an action an event led to: event stored → now (or at_ns).

        Now is when it leaves the decision path for its executor: an agent command put on its
        node's stream (after the commit that records it dispatched), a controller-side action
        (quarantine, RMA, notice) as its adapter is called (at_ns: read in the adapter's thread,
        after any wait for a thread or for the node's calls before it). Not the decision's own
        clock reading, taken before deciding and committing, which would leave both out of the figure.
        """
        event = self._event_times.pop(action.command_id, None)
        if event is not None:
            latency_s = max(0.0, (self._clock() if at_ns is None else at_ns) / 1e9 - event.stored_s)
            self.stats.decision_latency_s.append(latency_s)
            self.stats.decision_latency_kinds.append(action.kind)
            if not event.acted:
                # Once per event: a quarantine and the reset that follows it are one response, and
                # timing both would count each such event twice, the second from further away.
                event.acted = True
                self.ingest.metrics.time_to_first_action_seconds.observe(latency_s)

    def _forget_command(self, command_id: str, outcome: str) -> None:
        """A command is finished (answered, or no longer awaited): count it by kind and outcome, stop tracking it.

        One that never left has no decision latency (`_note_handed_over`), so its arrival time goes too.
        """
        kind = self._kinds.pop(command_id, "unknown")
        self._unanswered.pop(command_id, None)
        self._event_times.pop(command_id, None)
        blocker = self._held_by.pop(command_id, None)
        if blocker is not None:
            self._held[blocker] = [a for a in self._held.get(blocker, ()) if a.command_id != command_id]
        # Finished without its adapter's outcome (cancelled, or closed before it ran): what waited
        # for it goes now, as it would have had the adapter returned.
        self._send_held(command_id)
        self.ingest.metrics.remediation_actions.labels(kind=kind, outcome=outcome).inc()

    def _leaves_after_commit(self, action: actions.Action) -> bool:
        """Whether an admitted action leaves once its dispatch has committed: agent commands and adapters' calls.

        An adapter whose calls wait on nothing (``blocking = False`` on the callable: record only) is
        called in the dispatch round instead, as an action without one is recorded there: a thread
        and a commit for its outcome would cost a burst more than the call.
        """
        if action.kind in AGENT_KINDS:
            return True
        executor = self._executors.get(action.kind)
        return executor is not None and _blocking(executor)

    def _send_dispatched(self, dispatched: Sequence[actions.Action]) -> None:
        """Start the adapters of dispatched controller-side actions, then send the agent commands.

        Adapters first: a repair whose ticket's quarantine is being carried out waits for it
        (`_hold`), sent when its adapter returns. Agent commands go with the same ids again on
        reconnect if lost.
        """
        for action in dispatched:
            if action.kind not in AGENT_KINDS:
                self._start_adapter(action)
        for action in dispatched:
            if action.kind not in AGENT_KINDS:
                continue
            blocker = self._adapter_of_ticket.get(action.ticket_id)
            if blocker is not None:
                self._hold(action, blocker)
            else:
                self._send_now(action)

    def _send_now(self, action: actions.Action) -> None:
        """Put a dispatched agent command on its node's stream; without one, it waits for the node's reconnect."""
        self._unanswered[action.command_id] = action
        if self._send(action):
            self._note_handed_over(action)
        else:
            # No stream: the command stays dispatched; a reconnect re-sends it with the
            # same id, and the ladder's timeout climbs if the node never comes back. It has
            # not left, so its latency is counted when it does (`node_connected`).
            log.warning("remediation_node_unreachable", node=action.node_id, action=action.kind)

    def _hold(self, action: actions.Action, blocker: str) -> None:
        """Keep a dispatched agent command until the adapter of blocker (its ticket's quarantine) returns."""
        self._held.setdefault(blocker, []).append(action)
        self._held_by[action.command_id] = blocker

    def _send_held(self, blocker: str) -> None:
        """Send the agent commands that waited for blocker's adapter (`_hold`)."""
        for held in self._held.pop(blocker, ()):
            self._held_by.pop(held.command_id, None)
            self._send_now(held)

    def _start_adapter(self, action: actions.Action) -> None:
        """Call a dispatched controller-side action's adapter outside the decision lock (`_run_adapter`)."""
        if action.command_id in self._running:
            return  # called already this term: its outcome comes once
        self._running[action.command_id] = action
        self._adapter_of_ticket[action.ticket_id] = action.command_id
        task = asyncio.create_task(self._run_adapter(action), name=f"rasd-adapter-{action.kind}")
        self._running_tasks.add(task)
        task.add_done_callback(self._running_tasks.discard)

    async def _run_adapter(self, action: actions.Action) -> None:
        """The adapter, after the node's calls before it (one node's in order; nodes at once), then its outcome."""
        lock, waiting = self._node_adapters.setdefault(action.node_id, (asyncio.Lock(), [0]))
        waiting[0] += 1
        called_ns: list[int] = []
        try:
            async with lock:
                outcome, message = await self._execute(action, called_ns=called_ns)
        finally:
            waiting[0] -= 1
            if waiting[0] == 0:
                self._node_adapters.pop(action.node_id, None)
        self._note_handed_over(action, at_ns=called_ns[0] if called_ns else None)
        if self._adapter_of_ticket.get(action.ticket_id) == action.command_id:
            del self._adapter_of_ticket[action.ticket_id]
        # Whatever the outcome: the quarantine was tried first, as the ladder asked (a failed one
        # does not stop its repair; it is in the audit log).
        self._send_held(action.command_id)
        result = commands_pb.ActionResult(command_id=action.command_id, outcome=outcome, message=message)
        self._adapter_results.append((action.node_id, result))
        if self._results_drain is None or self._results_drain.done():
            self._results_drain = asyncio.create_task(self._drain_adapter_results(), name="rasd-adapter-results")

    async def _drain_adapter_results(self) -> None:
        """Commit the adapters' outcomes, all that returned meanwhile in one transaction, then dispatch.

        In a storm hundreds of quarantines return a second: a transaction each would cost more than
        deciding the events. Outcomes the store cannot take wait for the tick (`_results_owed`).
        """
        while self._adapter_results:
            async with self._lock:
                batch, self._adapter_results = self._adapter_results, []
                try:
                    await self._apply_results(batch)
                except repo.STORE_UNAVAILABLE as exc:
                    self._results_owed.extend(batch)
                    log.warning("remediation_result_deferred", results=len(batch), error=str(exc))
                    return
                except Exception:  # a bug, or this replica lost the lead: the next term carries them out again
                    log.exception("remediation_adapter_results_failed", results=len(batch))
                    return
                await self._dispatch_after_commit()

    async def _dispatch_after_commit(self) -> None:
        """Dispatch once a decision is durable; if the store fails now, the next tick dispatches."""
        try:
            await self._dispatch_locked()
        except repo.STORE_UNAVAILABLE as exc:
            log.warning("remediation_dispatch_deferred", error=str(exc))

    async def on_result(self, node_id: str, result: commands_pb.ActionResult) -> None:
        """A command's result from an agent (or a controller-side executor): advance the ladder.

        If the store cannot take it, the result is kept and applied by the next tick: the agent has
        answered and will not answer again unless asked, so dropping it would stall the ladder until
        its timeout climbed a rung for a repair that worked.
        """
        if not await self.commit_result(node_id, result):
            self._results_owed.append((node_id, result))

    async def commit_result(self, node_id: str, result: commands_pb.ActionResult) -> bool:
        """Advance the ladder on a result and commit it now; False when the store could not take it.

        Nothing of it is kept then: a caller whose result is stored (relayed by another replica)
        offers it again next round. Owed in memory (as `on_result` keeps an agent's) and the stored
        row forgotten, the result died with this term if it ended first, and the next leader's
        ladder climbed past a repair that had worked.
        """
        async with self._lock:
            try:
                await self._apply_result(node_id, result)
            except repo.STORE_UNAVAILABLE as exc:
                log.warning("remediation_result_deferred", node=node_id, command_id=result.command_id, error=str(exc))
                return False
            await self._dispatch_after_commit()
            return True

    async def _apply_result(self, node_id: str, result: commands_pb.ActionResult) -> None:
        await self._apply_results([(node_id, result)])

    async def _apply_results(self, results: Sequence[tuple[str, commands_pb.ActionResult]]) -> None:
        """Advance the ladder on results and commit them in one transaction."""
        change = rstore.Commit(now_unix_ns=self._clock())
        states: dict[str, escalation.RemediationState] = {}
        new_actions: list[actions.Action] = []
        for node_id, result in results:
            by_adapter = self._running.get(result.command_id)
            if by_adapter is not None:  # audited with its outcome, as a round audits what it records
                self._audit_controller_side(by_adapter, change, result.outcome, source="automation")
            new_actions += self._result_into(node_id, result, change, states)
        await self._commit_states(states, new_actions, change)
        for _node_id, result in results:
            self._running.pop(result.command_id, None)

    def _result_into(
        self,
        node_id: str,
        result: commands_pb.ActionResult,
        change: rstore.Commit,
        states: dict[str, escalation.RemediationState],
    ) -> list[actions.Action]:
        """Advance the ladder on a result; record it in change and the new state in states."""
        now_ns = change.now_unix_ns
        state = states.get(node_id) or self.node_states.get(node_id) or escalation.RemediationState(node_id)
        sent = self._unanswered.get(result.command_id)
        failed = tuple(sorted({v.gpu_uuid for v in result.verdicts if v.verdict == "fail" and v.gpu_uuid}))
        decision = escalation.on_result(
            state,
            escalation.ActionResult(
                command_id=result.command_id,
                outcome=escalation.Outcome(result.outcome),
                message=result.message,
                validation_verdict=result.validation_verdict,
                failed_gpu_uuids=failed,
            ),
            now_s=now_ns / 1e9,
            policy=self.policy.escalation,
        )
        change.command_updates.append(
            (
                result.command_id,
                {
                    "status": _OUTCOME_STATUS.get(result.outcome, "failed"),
                    "finished_unix_ns": now_ns,
                    "result": {
                        "outcome": commands_pb.ActionOutcome.Name(result.outcome),
                        "message": result.message,
                        "validation_verdict": result.validation_verdict,
                        "failed_gpu_uuids": list(failed),
                        "replayed": result.replayed,
                    },
                },
            )
        )
        if result.validation_verdict:
            targets = sdc_service.validation_targets(sent, self.ingest.node_gpus(node_id))
            waited = next(
                (
                    t.pending
                    for t in state.tickets
                    if t.pending is not None and t.pending.command_id == result.command_id
                ),
                None,
            )
            change.validations.append(
                {
                    "validation_id": result.command_id,
                    "node_id": node_id,
                    "gpu_uuid": targets[0] if len(targets) == 1 else "",
                    "verdict": result.validation_verdict,
                    # When the ladder sent it (0: no ticket waited for it any more, a stale answer):
                    # `operator_release` counts only runs that started after the quarantine.
                    "started_unix_ns": int((waited.dispatched_at or waited.issued_at) * 1e9) if waited else 0,
                    "finished_unix_ns": now_ns,
                    "evidence": {
                        # What it covered (`_validated_gpus`); None when not known: none, for a release.
                        "covered": {
                            "gpu_uuids": list(sent.gpu_uuids),
                            "exclude_gpu_uuids": list(sent.exclude_gpu_uuids),
                        }
                        if isinstance(sent, actions.RunValidation)
                        else None,
                        "checks": [
                            {"check": v.check, "gpu": v.gpu_uuid, "verdict": v.verdict, "evidence": v.evidence}
                            for v in result.verdicts
                        ],
                    },
                    "suite": sent.suite if isinstance(sent, actions.RunValidation) else "",
                }
            )
            change.docs.update(
                self.sdc.verdicts(
                    node_id,
                    sdc_service.gpu_verdicts(result, targets),
                    now=now_ns / 1e9,
                    watch=dict(decision.state.sdc_watch),
                )
            )
        self.budget = blast_radius.complete(self.budget, result.command_id, now_s=now_ns / 1e9)
        self._close(decision, change, now_ns / 1e9, answered=result.command_id)
        self._forget_command(
            result.command_id, commands_pb.ActionOutcome.Name(result.outcome).removeprefix("ACTION_OUTCOME_").lower()
        )
        for action in decision.actions:
            ticket = decision.state.ticket(action.ticket_id)
            if isinstance(action, actions.Release) and ticket is not None and not action.forced:
                self.ingest.metrics.time_to_repair_seconds.observe(max(0.0, now_ns / 1e9 - ticket.opened_at))
        log.info(
            "remediation_result",
            node=node_id,
            command_id=result.command_id,
            outcome=commands_pb.ActionOutcome.Name(result.outcome),
            verdict=result.validation_verdict,
            reason=decision.reason,
            next_actions=[a.kind for a in decision.actions],
        )
        states[node_id] = decision.state
        return list(decision.actions)

    # -- periodic --------------------------------------------------------------------------------------------
    async def _tick_forever(self) -> None:
        while True:
            await asyncio.sleep(self._tick_interval_s)
            try:
                await self.tick()
            except Exception:
                log.exception("remediation_tick_failed")

    async def tick(self) -> None:
        """Results the store could not take earlier, timeouts, watch windows, waiting tickets; then deferred actions.

        The lock is taken only for work there is: each hold ends a burst's pipeline (its commits
        drained first, then the decider starts again with what arrived meanwhile), and a tick that
        took it for every chunk of nodes cost the events of a 2,000 events/s burst 40-60 ms more
        each time. So the nodes whose due time has come (`_nodes_due`) are first looked at without
        the lock (a look that finds nothing due changes nothing, and state a pass has not committed
        yet is only ever looked at), and only the nodes due are ticked under it, looked at again
        there, in chunks of ``TICK_CHUNK_NODES``, each chunk one transaction: ticking every node
        with a ticket at once held the lock ~40 ms at 1,600 such nodes. Each node's tick is
        independent of the others'. The quarantine gauge is refreshed without the lock.
        """
        if self._results_owed:
            async with self._lock:
                owed, self._results_owed = self._results_owed, []
                for index, (node_id, result) in enumerate(owed):
                    try:
                        await self._apply_result(node_id, result)
                    except repo.STORE_UNAVAILABLE:
                        self._results_owed[:0] = owed[index:]
                        raise
        if correlate.expire(self.correlation, self._clock() / 1e9, self.policy) is not self.correlation:
            async with self._lock:
                await self._expire_incidents()
        due = await self._nodes_due()
        for start in range(0, len(due), TICK_CHUNK_NODES):
            async with self._lock:
                # One transaction per chunk, not per node: after a partition every node's command
                # times out at once, and a commit per node held the lock ~5 ms a node.
                now_ns = self._clock()
                change = rstore.Commit(now_unix_ns=now_ns)
                states: dict[str, escalation.RemediationState] = {}
                new_actions: list[actions.Action] = []
                for node_id in due[start : start + TICK_CHUNK_NODES]:
                    decision = self._tick_decision(node_id, now_ns / 1e9)
                    if decision is None:
                        continue
                    # A tick closes a dispatched command only when its wait ran out.
                    self._close(decision, change, now_ns / 1e9, unanswered_status="timed_out")
                    states[node_id] = decision.state
                    new_actions.extend(decision.actions)
                if states:
                    await self._commit_states(states, new_actions, change)
        if self._deferred:
            async with self._lock:
                await self._dispatch_locked()
        if self._quarantine_gauge_stale:
            # Without the lock: the gauge counts what is committed, and no decision waits for it.
            # Taken for it, the lock drained a burst's pipeline at every tick that followed a
            # quarantine, and events queued behind the drain for ~60 ms. A pass that commits
            # quarantines meanwhile marks the gauge stale again, for the next tick.
            self._quarantine_gauge_stale = False
            await self._export_quarantines()

    async def _nodes_due(self) -> list[str]:
        """The nodes whose tick would change something now: a look without the lock.

        Only the nodes whose due time (`escalation.tick_due_at`) has come are ticked to see, in
        chunks of `TICK_CHUNK_NODES`. A node's due time is kept with the state it was computed
        from, so a node whose state did not change since the last tick costs a lookup: ticking
        every node with a ticket, as this did before, took 25-35 ms of the event loop per tick at
        2,000 such nodes in a burst, and would take ten times that at 16,000.
        """
        now = self._clock() / 1e9
        nodes = [node_id for node_id, state in self.node_states.items() if self._tick_due_at(node_id, state) <= now]
        due: list[str] = []
        for start in range(0, len(nodes), TICK_CHUNK_NODES):
            if start:
                await asyncio.sleep(0)  # events decided in between: the look is not a pause
            now = self._clock() / 1e9
            due += [
                node_id
                for node_id in nodes[start : start + TICK_CHUNK_NODES]
                if self._tick_decision(node_id, now) is not None
            ]
        return due

    def _tick_due_at(self, node_id: str, state: escalation.RemediationState) -> float:
        """When the node's tick may next change something (`escalation.tick_due_at`); inf for a node with no ticket.

        Remembered with the state and policy it was computed for: states are immutable and
        replaced whole, so a different state object is a different node state.
        """
        if not state.tickets:
            return math.inf  # as before: a node without tickets is left to its next event
        remembered = self._tick_due.get(node_id)
        policy = self.policy.escalation
        if remembered is not None and remembered[0] is state and remembered[1] is policy:
            return remembered[2]
        due_at = escalation.tick_due_at(state, policy=policy)
        self._tick_due[node_id] = (state, policy, due_at)
        return due_at

    def _tick_decision(self, node_id: str, now: float) -> escalation.Decision | None:
        """The node's tick at now, or None when it would change nothing (no ticket, nothing due)."""
        state = self.node_states.get(node_id)
        if state is None or not state.tickets:
            return None
        decision = escalation.tick(state, now_s=now, policy=self.policy.escalation)
        return None if decision.state == state and not decision.actions else decision

    async def _expire_incidents(self) -> None:
        """Close the incidents whose correlation window ended in scopes no event has touched since."""
        now_ns = self._clock()
        corr = correlate.expire(self.correlation, now_ns / 1e9, self.policy)
        if corr is self.correlation:
            return
        change = rstore.Commit(now_unix_ns=now_ns)
        self._correlation_into(change, corr, changed_incidents=False)
        await self.ingest.run_in_store(self._store_commit, change)
        self.correlation = corr

    # -- rolling SDC sweeps -----------------------------------------------------------------------------------
    async def _sweep_forever(self) -> None:
        while True:
            await asyncio.sleep(self.policy.sdc.sweep_interval_s)
            try:
                await self.sweep_once()
            except Exception:
                log.exception("sdc_sweep_failed")

    async def sweep_once(self) -> list[str]:
        """One pass of the rolling SDC sweep: start the quick suite on due idle nodes; returns them.

        The planner (``sdc.plan_sweep``) takes a share of the idle nodes, least recently swept
        first, within the free disruption budget minus a reserve for repairs; each start is one
        transaction (ladder state, outbox, last-swept document, audit) before anything is sent.
        """
        pol = self.policy.sdc
        if not pol.sweep_enabled:
            return []
        async with self._lock:
            now_ns = self._clock()
            now = now_ns / 1e9
            candidates = sdc_service.sweep_candidates(
                connected=list(self.ingest.sessions),
                node_gpus={n: self.ingest.node_gpus(n) for n in self.ingest.sessions},
                latest=self.ingest.latest,
                node_states=self.node_states,
                budget=self.budget,
                last_swept=self.sdc.last_swept,
                now_unix_ns=now_ns,
                stale_after_s=self.ingest.settings.power_stale_after_s,
                policy=pol,
            )
            in_flight = sum(
                1 for s in self.node_states.values() for t in s.tickets if t.purpose is escalation.Purpose.SWEEP
            )
            fleet_view = self._fleet_view()
            free = blast_radius.free_node_slots(self.budget, fleet_view, now_s=now, policy=self.policy.disruption)
            picks = sdc.plan_sweep(candidates, now_s=now, policy=pol, in_flight=in_flight, free_disruption_slots=free)
            started = []
            for pick in picks:
                state = self.node_states.get(pick.node_id) or escalation.RemediationState(pick.node_id)
                decision = escalation.start_sweep(
                    state,
                    sweep_id=pick.sweep_id,
                    suite=pick.suite,
                    seed=pick.seed,
                    now_s=now,
                    policy=self.policy.escalation,
                )
                if not decision.actions:
                    continue
                change = rstore.Commit(now_unix_ns=now_ns)
                change.docs.update(self.sdc.swept(pick.node_id, now=now, seed=pick.seed, suite=pick.suite))
                why = f"suite {pick.suite} seed {pick.seed}"
                change.audit.append(_audit(now_ns, "rasd-controller", "sdc_sweep", pick.node_id, "", why, "started"))
                await self._commit(pick.node_id, decision.state, list(decision.actions), change)
                started.append(pick.node_id)
                log.info("sdc_sweep_started", node=pick.node_id, suite=pick.suite, seed=pick.seed)
            if started:
                await self._dispatch_locked()
            return started

    def sdc_records(self) -> list[dict[str, Any]]:
        """Every GPU with SDC history or under watch, most suspicious first (``rasctl sdc list``)."""
        now = self._clock() / 1e9
        return self.sdc.records(now=now, watch=sdc_service.watches(self.node_states, now=now))

    # -- operator --------------------------------------------------------------------------------------------
    async def set_paused(self, paused: bool, *, reason: str, actor: str) -> blast_radius.BudgetState:
        """Pause automation, or resume it (which also resets a tripped breaker)."""
        async with self._lock:
            now_ns = self._clock()
            if paused:
                self.budget = blast_radius.pause(self.budget, now_s=now_ns / 1e9, reason=reason)
            else:
                self.budget = blast_radius.resume(self.budget, now_s=now_ns / 1e9, policy=self.policy.disruption)
            change = rstore.Commit(now_unix_ns=now_ns)
            self._export_budget()
            budget = self._stage_budget(change)
            change.audit.append(_audit(now_ns, actor, "pause" if paused else "resume", "", "", reason, "ok"))
            await self.ingest.run_in_store(self._store_commit, change)
            self._budget_stored = budget
            if not paused:
                await self._dispatch_locked()
            return self.budget

    async def operator_quarantine(self, node_id: str, gpu_uuid: str, *, reason: str, actor: str) -> None:
        """Take a node or GPU out of scheduling by hand (recorded, audited, through the adapter).

        The node's ladder state keeps the operator's hold, committed with the record: a ticket that
        quarantined the same target earlier, or does later, leaves it quarantined when it releases
        (`escalation.operator_holds`). Only `operator_release` lifts it.
        """
        async with self._lock:
            now_ns = self._clock()
            action = (
                actions.QuarantineGpu(
                    ticket_id=f"operator/{now_ns}", step=0, node_id=node_id, gpu_uuid=gpu_uuid, reason=reason
                )
                if gpu_uuid
                else actions.QuarantineNode(ticket_id=f"operator/{now_ns}", step=0, node_id=node_id, reason=reason)
            )
            change = rstore.Commit(now_unix_ns=now_ns)
            await self._run_controller_side(action, source=actor, change=change)
            state = self.node_states.get(node_id) or escalation.RemediationState(node_id)
            held = escalation.operator_holds(state, f"gpu:{gpu_uuid}" if gpu_uuid else "node", held=True)
            await self._commit(node_id, held, [], change)
            await self._export_quarantines()

    async def operator_release(self, node_id: str, gpu_uuid: str, *, reason: str, force: bool, actor: str) -> str:
        """Return a node or GPU to service: through its ticket's validation, or by force (audited).

        Returns:
            What happened, one sentence.

        Raises:
            LookupError: nothing is quarantined there.
            PermissionError: no passing validation since the quarantine and force is not set.
        """
        async with self._lock:
            now_ns = self._clock()
            hold = f"gpu:{gpu_uuid}" if gpu_uuid else "node"
            state = self.node_states.get(node_id)
            ticket = next((t for t in (state.tickets if state else ()) if hold in t.held), None)
            change = rstore.Commit(now_unix_ns=now_ns)
            change.audit.append(
                _audit(now_ns, actor, "release", node_id, gpu_uuid, reason, "forced" if force else "requested")
            )
            if ticket is not None and state is not None:
                decision = escalation.operator_release(
                    state, ticket.ticket_id, now_s=now_ns / 1e9, policy=self.policy.escalation, force=force, hold=hold
                )
                self._close(decision, change, now_ns / 1e9)
                await self._commit(node_id, decision.state, list(decision.actions), change)
                await self._dispatch_locked()
                return decision.reason
            active = await self.ingest.run_in_store(lambda: self.store.quarantines(node_id=node_id))
            mine = [q for q in active if q["gpu_uuid"] == gpu_uuid and not q["port"]]
            if not mine:
                raise LookupError(f"{node_id}{'/' + gpu_uuid if gpu_uuid else ''} is not quarantined")
            if not force:
                since = min(q["since_unix_ns"] for q in mine)
                # What must have passed: the GPU, or for the node every GPU (from the store: the node
                # may not be connected) not quarantined on its own.
                nodes = await self.ingest.run_in_store(lambda: self.ingest.store.list_nodes([node_id]))
                node_gpus = [g.record.uuid for n in nodes for g in n.gpus]
                held_gpus = {q["gpu_uuid"] for q in active if q["gpu_uuid"] and not q["port"]}
                needed = {gpu_uuid} if gpu_uuid else set(node_gpus) - held_gpus
                runs = await self.ingest.run_in_store(lambda: self.store.validations(node_id=node_id))
                passed = [
                    v for v in runs if v["verdict"] == "pass" and (v["started_unix_ns"] or 0) >= since
                    and needed <= _validated_gpus(v, node_gpus)
                ]  # fmt: skip
                if not passed:
                    raise PermissionError(
                        "no passing validation of "
                        + (gpu_uuid or "the node's GPUs")
                        + " started since the quarantine: run `rasctl validate` or --force"
                    )
            release = actions.Release(
                ticket_id=f"operator/{now_ns}", step=0, node_id=node_id, gpu_uuid=gpu_uuid, reason=reason, forced=force
            )
            # The record, and the node out of the disruption budget's count if automation had put it there.
            self._record_controller_side(release, change, source=actor)
            if state is not None and hold in state.operator_holds:
                await self._commit(node_id, escalation.operator_holds(state, hold, held=False), [], change)
            else:
                budget = self._stage_budget(change)
                await self.ingest.run_in_store(self._store_commit, change)
                self._budget_stored = budget
            await self._export_quarantines()
            if (executor := self._executors.get("release")) is not None:
                await asyncio.to_thread(executor, release)
            return "released" + (" by force, without validation" if force else " after a passing validation")

    async def _local_stream(self, node_id: str) -> bool:
        return node_id in self.ingest.sessions

    async def operator_validate(self, node_id: str, gpu_uuid: str, *, suite: str, seed: int, actor: str) -> str:
        """Start a validation run on a node or GPU; its verdict is stored when it comes back."""
        now_ns = self._clock()
        validation_id = f"manual-{now_ns}"
        command = commands_pb.Command(
            command_id=validation_id,
            issued_unix_ns=now_ns,
            deadline_unix_ns=now_ns + int(self.policy.escalation.validation_timeout_s * 1e9),
            reason=f"operator {actor} asked for validation",
            run_validation=commands_pb.RunValidation(suite=suite, gpu_uuids=[gpu_uuid] if gpu_uuid else [], seed=seed),
        )
        if not await self.node_reachable(node_id):
            raise ConnectionError(f"node {node_id!r} has no open agent stream")
        change = rstore.Commit(now_unix_ns=now_ns)
        change.validations.append(
            {"validation_id": validation_id, "node_id": node_id, "gpu_uuid": gpu_uuid, "suite": suite,
             "command_id": validation_id, "verdict": "running", "started_unix_ns": now_ns}
        )  # fmt: skip
        change.audit.append(_audit(now_ns, actor, "validate", node_id, gpu_uuid, suite, "started"))
        await self.ingest.run_in_store(self._store_commit, change)

        async def wait_for_verdict() -> None:
            try:
                result = await self.command_sender(
                    node_id, command, timeout_s=self.policy.escalation.validation_timeout_s
                )
                verdict, evidence = (
                    result.validation_verdict or "error",
                    {
                        "message": result.message,
                        "checks": [
                            {"check": v.check, "gpu": v.gpu_uuid, "verdict": v.verdict} for v in result.verdicts
                        ],
                    },
                )
            except (TimeoutError, ConnectionError, LookupError) as exc:
                verdict, evidence = "error", {"message": str(exc)}
            done = rstore.Commit(now_unix_ns=self._clock())
            done.validations.append(
                {"validation_id": validation_id, "node_id": node_id, "gpu_uuid": gpu_uuid, "suite": suite,
                 "command_id": validation_id, "verdict": verdict, "evidence": evidence,
                 "started_unix_ns": now_ns, "finished_unix_ns": done.now_unix_ns}
            )  # fmt: skip
            await self.ingest.run_in_store(self._store_commit, done)

        task = asyncio.create_task(wait_for_verdict())
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return validation_id

    async def accuse(self, node_id: str, gpu_uuid: str, *, reason: str, accuser: str) -> None:
        """An SDC accusation (operator or training job): it enters the ladder like any health event."""
        now_ns = self._clock()
        event = repo.StoredEvent(
            node_id=node_id,
            seq=0,
            observed_unix_ns=now_ns,
            received_unix_ns=now_ns,
            kind=int(health.EventKind.SDC_SUSPECT),
            severity=int(health.Severity.ERROR),
            gpu_uuid=gpu_uuid,
            xid=None,
            message=reason,
            source="accusation",
            attributes={"accuser": accuser},
        )
        state = self.node_states.get(node_id) or escalation.RemediationState(node_id)
        watched = sdc.watched_until(dict(state.sdc_watch), gpu_uuid, now_s=now_ns / 1e9)
        change = rstore.Commit(
            now_unix_ns=now_ns, audit=[_audit(now_ns, accuser, "accuse_sdc", node_id, gpu_uuid, reason, "accepted")]
        )
        change.docs.update(self.sdc.accusation(node_id, gpu_uuid, now=now_ns / 1e9, watch_until=watched))
        await self.ingest.run_in_store(self._store_commit, change)
        if self.accusation_hook is not None:
            self.accusation_hook(node_id, gpu_uuid, reason=reason, accuser=accuser, at_unix_ns=now_ns)
        await self.on_events(node_id, [event], self.ingest.node_labels.get(node_id, {}))

    async def approve_rma(self, rma_id: str, *, actor: str) -> dict[str, Any] | None:
        """Approve a pending RMA ticket (audited)."""
        now_ns = self._clock()
        approved = await self.ingest.run_in_store(
            lambda: self.store.approve_rma(rma_id, actor=actor, now_unix_ns=now_ns)
        )
        if approved is not None:
            await self.ingest.run_in_store(
                self._store_commit,
                rstore.Commit(
                    now_unix_ns=now_ns,
                    audit=[
                        _audit(
                            now_ns, actor, "approve_rma", approved["node_id"], approved["gpu_uuid"], rma_id, "approved"
                        )
                    ],
                ),
            )
        return approved

    # -- internals --------------------------------------------------------------------------------------------
    def _close(
        self,
        decision: escalation.Decision,
        change: rstore.Commit,
        now: float,
        *,
        answered: str = "",
        unanswered_status: str = "cancelled",
    ) -> None:
        """Give back the budget of the commands a decision closed, and finish their outbox rows.

        One still waiting for admission is cancelled. One dispatched and not answered (its timeout
        passed, or its ticket was folded or closed) is finished with unanswered_status: left
        "dispatched", it would be sent again when its node reconnects, or by the next controller
        term, and a reset or reboot the ladder gave up on would run after the rungs above it. The
        answered command (a result's own) is finished by its result. Either leaves the service's
        lists only once change has committed (`_after_commit`): a commit that fails leaves it
        there, and the decision made again closes it again.
        """
        for command_id in decision.closed_command_ids:
            self.budget = blast_radius.complete(self.budget, command_id, now_s=now)
            if command_id in self._deferred:
                change.command_updates.append((command_id, {"status": "cancelled"}))
            elif command_id != answered:
                # Dispatched, or admitted in a pass still committing (not yet sent: the pipeline
                # commits in order, so this update lands after its "dispatched"); a final row is
                # left as it is (`_update_commands`).
                change.command_updates.append(
                    (
                        command_id,
                        {
                            "status": unanswered_status,
                            "finished_unix_ns": change.now_unix_ns,
                            "result": {
                                "outcome": _STATUS_OUTCOME.get(unanswered_status, ""),
                                "message": f"no longer awaited: {decision.reason}",
                            },
                        },
                    )
                )

    def _correlation_into(
        self,
        change: rstore.Commit,
        after: correlate.CorrelationState,
        *,
        changed_incidents: bool,
        scopes: Collection[str] | None = None,
        port_nodes: Collection[str] | None = None,
    ) -> None:
        """Add what moving the correlation state from `self.correlation` to after writes.

        That is its documents, the rows of the incidents that changed, and the expired incidents' rows
        closed. scopes and port_nodes: see `correlation_changes` (None: look at all of them).
        """
        docs, changed = correlation_changes(self.correlation, after, scopes=scopes, port_nodes=port_nodes)
        change.docs.update(docs)
        now_ns = change.now_unix_ns
        if changed_incidents:
            change.incidents.extend(_incident_row(incident, now_ns) for incident in changed)
        change.incidents.extend(
            _incident_row(incident, now_ns, closed=True)
            for incident in expired_incidents(self.correlation, after, scopes=scopes)
        )

    def _store_commit(self, change: rstore.Commit) -> list[str]:
        """`RemediationStore.commit` (on the store thread), timed: every remediation transaction goes through it.

        Only a commit that succeeded is counted: its time is how long a decision waited on the
        database to be durable (``rasd_remediation_commit_seconds``, `RemediationStats.commit_s`).
        """
        started = time.perf_counter()
        fresh = self.store.commit(change)
        seconds = time.perf_counter() - started
        self.ingest.metrics.remediation_commit_seconds.observe(seconds)
        self.stats.commit_s.append(seconds)
        return fresh

    async def _commit(
        self, node_id: str, state: escalation.RemediationState, new_actions: list[actions.Action], change: rstore.Commit
    ) -> None:
        await self._commit_states({node_id: state}, new_actions, change)

    async def _commit_states(
        self,
        states: Mapping[str, escalation.RemediationState],
        new_actions: list[actions.Action],
        change: rstore.Commit,
    ) -> None:
        """Commit the nodes' new ladder states, projections and the new outbox rows in one transaction.

        The new actions go into the outbox pending, admitted later by `_dispatch_locked`.
        """
        budget = self._stage_commit(states, new_actions, change, {})
        fresh = set(await self.ingest.run_in_store(self._store_commit, change))
        self._budget_stored = budget
        self.node_states.update(states)
        self._after_commit(new_actions, change, {}, fresh)

    def _stage_commit(
        self,
        states: Mapping[str, escalation.RemediationState],
        new_actions: Sequence[actions.Action],
        change: rstore.Commit,
        dispatched: Mapping[str, actions.Action],
    ) -> blast_radius.BudgetState:
        """Put the nodes' new ladder states, their projections and the new outbox rows into change.

        New actions go into the outbox pending, except those in dispatched (admitted with their
        decision), which go in dispatched. The tickets are diffed against `node_states`, so this runs
        before the states are applied. Returns the budget staged (`_stage_budget`).
        """
        for node_id, state in states.items():
            change.node_states[node_id] = state.to_dict()
            # Only tickets this commit changed: the core shares unchanged Ticket values between states.
            before = self.node_states.get(node_id)
            unchanged = {id(t) for t in before.tickets} if before is not None else set()
            change.tickets.extend(_ticket_row(t, change.now_unix_ns) for t in state.tickets if id(t) not in unchanged)
            if before is not None and before.tickets:
                # A ticket the ladder let go of (released, watch ended, folded, force-released, closed by
                # an operator): its row is closed, or `rasctl repairs --open` would list it for ever.
                still = {t.ticket_id for t in state.tickets}
                change.tickets.extend(
                    _ticket_row(t, change.now_unix_ns, closed=True) for t in before.tickets if t.ticket_id not in still
                )
        for action in new_actions:
            change.new_commands.append(
                rstore.CommandRecord(
                    command_id=action.command_id,
                    node_id=action.node_id,
                    gpu_uuid=getattr(action, "gpu_uuid", ""),
                    ticket_id=action.ticket_id,
                    kind=action.kind,
                    payload=action.to_dict(),
                    status="dispatched" if action.command_id in dispatched else "pending",
                    reason=action.reason,
                    created_unix_ns=change.now_unix_ns,
                    dispatched_unix_ns=change.now_unix_ns if action.command_id in dispatched else None,
                    finished_unix_ns=None,
                    result=None,
                )
            )
        return self._stage_budget(change)

    def _after_commit(
        self,
        new_actions: Sequence[actions.Action],
        change: rstore.Commit,
        dispatched: Mapping[str, actions.Action],
        fresh: set[str],
        admitted: Sequence[actions.Action] = (),
    ) -> list[actions.Action]:
        """What follows a commit of `_stage_commit`'s rows; returns the dispatched commands to send now.

        Those are the ones new in the outbox (or pending there before: a decision made again after a
        crash), then the agent commands a dispatch round in the commit admitted (admitted). One the
        outbox already had further on is not sent twice; its hold on the budget is given back. New
        pending ones start waiting for admission, and cancelled ones stop.
        """
        cancelled = _cancelled_ids(change)
        for command_id in cancelled:
            self._deferred.pop(command_id, None)
        leaving = [a for a in admitted if self._leaves_after_commit(a)]
        unsent = {a.command_id for a in leaving}
        finished: set[str] = set()
        for command_id, update in change.command_updates:
            # Finished by `_close` without a result (a result's own command left already): one sent
            # and unanswered, or one the round admitted and the pass committed with it superseded
            # (`_merged`), which so never leaves.
            if update.get("status") in rstore.FINAL_STATUSES and (
                command_id in self._unanswered
                or command_id in self._running
                or command_id in self._held_by
                or (command_id in unsent and command_id not in finished)
            ):
                finished.add(command_id)
                self._forget_command(command_id, update["status"])
        if self.decision_hook is not None:
            self.decision_hook([a for a in new_actions if a.command_id in fresh], change.now_unix_ns)
        sent: list[actions.Action] = []
        now = change.now_unix_ns / 1e9
        for action in new_actions:
            if action.command_id not in dispatched:
                # One a later event of the same pass superseded is in the outbox cancelled: it never waits.
                if action.command_id in fresh and action.command_id not in cancelled:
                    self._deferred[action.command_id] = action
            elif action.command_id in fresh:
                if action.kind in AGENT_KINDS:  # the controller-side ones were carried out with the decision
                    self._note_dispatched(action)
                    sent.append(action)
            else:
                log.info("remediation_command_exists", node=action.node_id, command_id=action.command_id)
                self.budget = blast_radius.complete(self.budget, action.command_id, now_s=now)
        sent.extend(a for a in leaving if a.command_id not in finished)
        return sent

    async def _dispatch_locked(self) -> None:
        """Admit what the budget allows, then carry it out.

        One transaction records the admitted commands as dispatched together with what the
        controller-side ones (quarantine, release, RMA, notify, power cycle) did and the ladder's
        answer to them; only after it commits are agent commands sent. A crash before that commit
        leaves everything pending (executors are idempotent, so re-running them is harmless); after
        it, agent commands are re-sent with the same ids on reconnect.
        """
        for _round in range(MAX_DISPATCH_ROUNDS):  # a result can admit follow-up actions; bounded, never a loop
            if not self._deferred:
                return
            dispatch = await self._stage_dispatch()
            if not dispatch.admitted and not dispatch.change.docs:
                return
            try:  # nothing admitted: only the budget document (a deferral can change it)
                fresh = set(await self.ingest.run_in_store(self._store_commit, dispatch.change))
            except Exception:
                # Nothing of this round is durable: the admitted actions are still pending in the
                # store, so they wait here again (the next tick admits them again; controller-side
                # executors are idempotent) and the budget they took is given back.
                self._undo_pass(dispatch)
                raise
            self._finish_pass(dispatch, fresh, ())
            if not dispatch.admitted:
                return

    async def _stage_dispatch(self, closing: Collection[str] = ()) -> _Pass:
        """Admit what waits and carry out its controller-side part; returns the round staged, not committed.

        Its state is applied in memory (`_undo_pass` puts it back): the admitted actions leave the
        waiting list, the budget holds them, and the ladder has the controller-side results. Agent
        commands are sent once its commit is done (`_finish_pass`). Only called when every decision
        the waiting actions come from has committed: the adapters act on durable decisions only.

        closing: waiting commands that a later decision, still committing, cancels. They stay on the
        waiting list until that commit is done (`_close`), and are not admitted meanwhile: sent,
        they would run although their outbox row ends cancelled.
        """
        now_ns = self._clock()
        now = now_ns / 1e9
        budget_before, budget_stored_before = self.budget, self._budget_stored
        waiting = [a for a in self._deferred.values() if a.command_id not in closing]
        admission = blast_radius.admit(
            self.budget, waiting, self._fleet_view(), now_s=now, policy=self.policy.disruption
        )
        self.budget = admission.state
        self._export_budget()
        self.stats.max_disrupted_nodes = max(self.stats.max_disrupted_nodes, len(self.budget.disrupted_nodes()))
        for action, reason in zip(admission.deferred, admission.reasons, strict=False):
            log.info("remediation_deferred", node=action.node_id, action=action.kind, reason=reason)
        change = rstore.Commit(now_unix_ns=now_ns)
        touched: dict[str, escalation.RemediationState] = {}
        for action in admission.admitted:
            self._deferred.pop(action.command_id, None)
            change.command_updates.append((action.command_id, {"status": "dispatched", "dispatched_unix_ns": now_ns}))
            self._record_dispatch(action, touched, change)
            self._note_dispatched(action)
        for action in admission.admitted:
            if action.kind not in AGENT_KINDS:
                self._record_controller_side(action, change, source="automation")
        # Recorded and done in this round: the controller-side actions without an adapter, or with
        # one that waits on nothing. The others leave after the commit, as agent commands do
        # (`_send_dispatched`).
        follow_up: list[actions.Action] = []
        for action in admission.admitted:
            if not self._leaves_after_commit(action):
                follow_up += self._carry_out_now(action, change, touched)
        dispatch = _Pass(
            group=[],
            change=change,
            states=touched,
            new_actions=follow_up,
            dispatched={},
            admitted=list(admission.admitted),
            states_before={node_id: self.node_states.get(node_id) for node_id in touched},
            correlation_before=self.correlation,
            budget_before=budget_before,
            budget_stored_before=budget_stored_before,
        )
        self._budget_stored = self._stage_commit(touched, follow_up, change, {})
        self.node_states.update(touched)
        return dispatch

    def _carry_out_now(
        self, action: actions.Action, change: rstore.Commit, states: dict[str, escalation.RemediationState]
    ) -> list[actions.Action]:
        """Call an admitted controller-side action's adapter that waits on nothing, and fold its outcome into change.

        Its record (`_record_controller_side`) is already in change; the call, its audit row and the
        ladder's answer (states) join the same transaction. Returns the ladder's follow-up actions.
        """
        self._note_handed_over(action)
        outcome, message = self._execute_now(action)
        self._audit_controller_side(action, change, outcome, source="automation")
        return self._result_into(
            action.node_id,
            commands_pb.ActionResult(command_id=action.command_id, outcome=outcome, message=message),
            change,
            states,
        )

    def _send(self, action: actions.Action, *, deadline_unix_ns: int | None = None) -> bool:
        """Put an agent command on its node's stream; False when the node has none.

        deadline_unix_ns: when the ladder stops waiting for it (None: its kind's timeout from now).
        """
        if self.send_hook is not None:  # several replicas: the one holding the node's stream sends it
            return self.send_hook(action)
        command = agent_command(
            action,
            self.policy.escalation,
            self.ingest.node_gpus(action.node_id),
            self._clock(),
            deadline_unix_ns=deadline_unix_ns,
        )
        return self.ingest.dispatch(action.node_id, command)

    async def _run_controller_side(
        self, action: actions.Action, *, source: str = "automation", change: rstore.Commit | None = None
    ) -> tuple[int, str]:
        """Quarantine, release, RMA, notify, power-cycle: the record, the adapter, the audit row.

        With change, the records join that transaction; without, they are committed here.
        """
        own = change is None
        change = change or rstore.Commit(now_unix_ns=self._clock())
        self._record_controller_side(action, change, source=source)
        outcome, message = await self._execute(action)
        self._audit_controller_side(action, change, outcome, source=source)
        if own:
            budget = self._stage_budget(change)
            await self.ingest.run_in_store(self._store_commit, change)
            self._budget_stored = budget
            if change.quarantines or change.releases:
                await self._export_quarantines()
        return outcome, message

    def _record_controller_side(self, action: actions.Action, change: rstore.Commit, *, source: str) -> None:
        """Put a controller-side action's record (quarantine, release, RMA) into change and its hold into the budget."""
        now_ns = change.now_unix_ns
        gpu_uuid = getattr(action, "gpu_uuid", "")
        if isinstance(action, actions.QuarantineNode | actions.QuarantineGpu | actions.QuarantinePort):
            port = getattr(action, "ib_port", "")
            change.quarantines.append(
                {
                    "node_id": action.node_id,
                    "gpu_uuid": gpu_uuid,
                    "port": port,
                    "reason": action.reason,
                    "source": source,
                }
            )
            if isinstance(action, actions.QuarantineNode) and source == "automation":
                self.budget = dataclasses.replace(
                    self.budget, quarantined_nodes=tuple(sorted({*self.budget.quarantined_nodes, action.node_id}))
                )
            elif isinstance(action, actions.QuarantineGpu) and source == "automation":
                # Admitted by automation, `blast_radius.admit` counted it already: then the same state.
                self.budget = self.budget.with_gpu(action.node_id, action.gpu_uuid, self._fleet_view(), held=True)
        elif isinstance(action, actions.Release):
            change.releases.append(
                {
                    "node_id": action.node_id,
                    "gpu_uuid": action.gpu_uuid,
                    "port": action.ib_port,
                    "reason": action.reason,
                    "forced": action.forced,
                }
            )
            if not action.gpu_uuid and not action.ib_port:
                self.budget = dataclasses.replace(
                    self.budget,
                    quarantined_nodes=tuple(n for n in self.budget.quarantined_nodes if n != action.node_id),
                )
            elif action.gpu_uuid:
                self.budget = self.budget.with_gpu(action.node_id, action.gpu_uuid, self._fleet_view(), held=False)
        elif isinstance(action, actions.OpenRma):
            change.rmas.append(
                {
                    "rma_id": action.command_id,
                    "node_id": action.node_id,
                    "gpu_uuid": action.gpu_uuid,
                    "state": "pending",
                    "reason": action.reason,
                    "evidence": {"history": list(action.evidence), "ticket_id": action.ticket_id},
                    "opened_unix_ns": now_ns,
                }
            )
        elif isinstance(action, actions.Notify):
            log.warning("remediation_notice", node=action.node_id, severity=action.severity, summary=action.summary)

    async def _execute(self, action: actions.Action, *, called_ns: list[int] | None = None) -> tuple[int, str]:
        """Call a controller-side action's adapter in a thread (they block on other systems); its outcome and message.

        An adapter failure is a failed action, never a crash. Without an adapter the record is the action.
        called_ns: gets the clock's reading as the thread calls the adapter.
        """
        executor = self._executors.get(action.kind)
        if executor is None or not _blocking(executor):
            return self._execute_now(action)
        pool = self._long_adapter_threads if action.kind in LONG_ADAPTER_KINDS else self._adapter_threads

        def timed(action: actions.Action) -> Any:
            if called_ns is not None:
                called_ns.append(self._clock())
            return executor(action)

        try:
            call = functools.partial(contextvars.copy_context().run, timed, action)  # as asyncio.to_thread does
            message = str(await asyncio.get_running_loop().run_in_executor(pool, call))
        except Exception as exc:  # an adapter failure is a failed action, never a crash
            return commands_pb.ACTION_OUTCOME_FAILED, f"{type(exc).__name__}: {exc}"
        return commands_pb.ACTION_OUTCOME_SUCCEEDED, message or f"{action.kind} recorded"

    def _execute_now(self, action: actions.Action) -> tuple[int, str]:
        """`_execute` for an action whose adapter waits on nothing (`_leaves_after_commit` is False): called here."""
        executor = self._executors.get(action.kind)
        if executor is None:
            if isinstance(action, actions.PowerCycleBmc):
                return commands_pb.ACTION_OUTCOME_NOT_SUPPORTED, "no BMC power-cycle hook configured"
            return commands_pb.ACTION_OUTCOME_SUCCEEDED, f"{action.kind} recorded"
        try:
            message = str(executor(action))
        except Exception as exc:  # an adapter failure is a failed action, never a crash
            return commands_pb.ACTION_OUTCOME_FAILED, f"{type(exc).__name__}: {exc}"
        return commands_pb.ACTION_OUTCOME_SUCCEEDED, message or f"{action.kind} recorded"

    def _audit_controller_side(
        self, action: actions.Action, change: rstore.Commit, outcome: int, *, source: str
    ) -> None:
        change.audit.append(
            _audit(
                change.now_unix_ns,
                source,
                action.kind,
                action.node_id,
                getattr(action, "gpu_uuid", ""),
                action.reason,
                commands_pb.ActionOutcome.Name(outcome),
            )
        )

    def _fleet_view(self) -> blast_radius.FleetView:
        """The fleet as the budget sees it; rebuilt only when a node's labels changed.

        Kept between passes so that its per-domain node counts are computed once, not on every
        admission (a 2,000-node count took ~5 ms per pass); the ingest counts label changes, so
        telling whether anything changed is one compare.
        """
        labels = self.ingest.node_labels
        if self._fleet is None or self._fleet_version != labels.version:
            # A node's GPUs are set with its labels (its Hello), so the labels' version covers them.
            self._fleet_version = labels.version
            self._fleet = blast_radius.FleetView(
                node_labels={n: dict(v) for n, v in labels.items()},
                node_gpu_counts={n: len(self.ingest.node_gpus(n)) for n in labels},
            )
        return self._fleet

    def _stage_budget(self, change: rstore.Commit) -> blast_radius.BudgetState:
        """Put the budget into change where it differs from the stored one; returns what is staged.

        The document (a few KB with a burst's nodes in flight) only when it changed, and of the
        breaker's demand only the documents of the times whose nodes changed: written whole, the
        demand was ~80 KB after a 2,000-node burst and rewritten on most of its commits, which
        doubled the burst's p99. The caller records the returned state as stored once its commit
        succeeded, never before: a failed commit leaves the stored copy as it was.
        """
        budget, stored = self.budget, self._budget_stored
        if budget is not stored:
            if not budget.same_document(stored):
                change.docs["budget"] = budget.to_dict()
            demand = blast_radius.demand_documents(stored.demand if stored is not None else {}, budget.demand)
            change.docs.update((BUDGET_DEMAND_PREFIX + key, doc) for key, doc in demand.items())
        return budget

    def _export_budget(self) -> None:
        self.ingest.metrics.breaker_tripped.set(1 if self.budget.breaker_tripped else 0)
        self.ingest.metrics.automation_paused.set(1 if self.budget.paused else 0)

    async def _export_quarantines(self) -> None:
        counts = await self.ingest.run_in_store(self.store.quarantine_counts)
        for scope, count in counts.items():
            self.ingest.metrics.quarantined.labels(scope=scope).set(count)


def _validated_gpus(run: Mapping[str, Any], node_gpus: Iterable[str]) -> set[str]:
    """The GPUs a stored validation run covered, of node_gpus (the node's GPUs).

    The ladder's runs keep their scope (``evidence["covered"]``: the GPUs named, or the node's but
    those excluded; None when the run's command was not known, which covers none); an operator's
    ``rasctl validate`` ran on its one GPU, or on every GPU of the node when it named none.
    """
    evidence = run.get("evidence") or {}
    if "covered" in evidence:
        covered = evidence["covered"]
        if covered is None:
            return set()
        return set(sdc_service.scope_targets(covered["gpu_uuids"], covered["exclude_gpu_uuids"], node_gpus))
    return {run["gpu_uuid"]} if run["gpu_uuid"] else set(node_gpus)


def agent_command(
    action: actions.Action,
    policy: policy_mod.EscalationPolicy,
    node_gpus: Sequence[str],
    now_unix_ns: int,
    *,
    deadline_unix_ns: int | None = None,
) -> commands_pb.Command:
    """The wire command for an agent action.

    Its deadline is deadline_unix_ns, by default the action kind's timeout from now. A command sent
    again passes when the ladder's wait for it runs out: the agent grants it the span between the
    two stamps (`rasd.agent.runtime.on_local_clock`), so it refuses to start one the ladder has
    given up on meanwhile.
    """
    timeout_s = policy.timeout_s(action.kind)
    command = commands_pb.Command(
        command_id=action.command_id,
        issued_unix_ns=now_unix_ns,
        deadline_unix_ns=now_unix_ns + int(timeout_s * 1e9) if deadline_unix_ns is None else deadline_unix_ns,
        reason=action.reason,
    )
    if isinstance(action, actions.RestartProcess):
        command.restart_process.CopyFrom(commands_pb.RestartProcess(gpu_uuid=action.gpu_uuid, grace_s=action.grace_s))
    elif isinstance(action, actions.ResetGpu):
        command.reset_gpu.CopyFrom(commands_pb.ResetGpu(gpu_uuid=action.gpu_uuid))
    elif isinstance(action, actions.RebootNode):
        command.reboot_node.CopyFrom(commands_pb.RebootNode())
    elif isinstance(action, actions.RunValidation):
        gpus = list(action.gpu_uuids)
        if not gpus and action.exclude_gpu_uuids:
            gpus = [g for g in node_gpus if g not in action.exclude_gpu_uuids]
        command.run_validation.CopyFrom(commands_pb.RunValidation(suite=action.suite, gpu_uuids=gpus, seed=action.seed))
    return command


BUDGET_DEMAND_PREFIX = "budget/demand/"
"""controller_states documents of the circuit breaker's demand (`blast_radius.demand_documents`)."""
CORRELATION_PREFIX = "correlation/"
"""controller_states names of the correlation state: one document per scope ("correlation/incidents/<scope>")
and per node's IB port history ("correlation/ports/<node>"), so a decision rewrites only what it changed."""


def correlation_changes(
    before: correlate.CorrelationState,
    after: correlate.CorrelationState,
    *,
    scopes: Collection[str] | None = None,
    port_nodes: Collection[str] | None = None,
) -> tuple[dict[str, Any], list[correlate.Incident]]:
    """What a decision must write for its correlation state: documents, and incidents for their rows.

    A scope's document lists its incidents' ids in order (``{"ids": [...]}``), written only when
    that list changes (an incident opened or expired; None: the scope is gone, delete it). Each
    incident's data lives in its row of the incidents table, which operators query anyway: every
    incident that differs from before is returned for that row, in the same transaction. So a
    duplicate, the most common event in a burst, rewrites one incident row, not its whole scope.
    The core shares unchanged scope tuples and incidents between states, so identity tells what
    changed.

    scopes and port_nodes, when given, are the only scopes and nodes whose entries can differ
    (those of the events that moved before to after: `correlate.correlate` touches the event's scope
    and node alone), so a small pass does not walk every scope in the fleet.
    """
    docs: dict[str, Any] = {}
    changed: list[correlate.Incident] = []
    for scope in set(before.incidents) | set(after.incidents) if scopes is None else scopes:
        incidents = after.incidents.get(scope, ())
        old = before.incidents.get(scope, ())
        if incidents is old:
            continue
        kept = {id(i) for i in old}
        changed.extend(i for i in incidents if id(i) not in kept)
        ids = [i.incident_id for i in incidents]
        if ids != [i.incident_id for i in old]:
            docs[f"{CORRELATION_PREFIX}incidents/{scope}"] = {"ids": ids} if ids else None
    for node in set(before.ports) | set(after.ports) if port_nodes is None else port_nodes:
        ports = after.ports.get(node)
        if ports is not before.ports.get(node):
            docs[f"{CORRELATION_PREFIX}ports/{node}"] = (
                {
                    "items": [
                        {"node_id": p.node_id, "ib_port": p.ib_port, "changed_at": list(p.changed_at)} for p in ports
                    ]
                }
                if ports
                else None
            )
    return docs, changed


def correlation_incident_ids(docs: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """The incident ids the scope documents name (their data is read from the incidents table)."""
    prefix = f"{CORRELATION_PREFIX}incidents/"
    return [i for name, doc in docs.items() if name.startswith(prefix) for i in doc.get("ids", ())]


def correlation_from_docs(
    docs: Mapping[str, Mapping[str, Any]], incident_data: Mapping[str, Mapping[str, Any]] | None = None
) -> correlate.CorrelationState:
    """Rebuild the correlation state from its per-scope documents and the incidents' stored data.

    Args:
        docs: the ``correlation/`` documents.
        incident_data: incident id → the ``data`` of its incidents-table row, for the ids the
            documents name. A scope document written before ids were stored carries its
            incidents inline (``{"items": [...]}``) and needs none.
    """
    data = incident_data or {}
    incidents: dict[str, tuple[correlate.Incident, ...]] = {}
    ports: dict[str, tuple[correlate.PortHistory, ...]] = {}
    for name, doc in docs.items():
        kind, _, key = name.removeprefix(CORRELATION_PREFIX).partition("/")
        if kind == "incidents":
            items = doc["items"] if "items" in doc else [data[i] for i in doc["ids"] if i in data]
            incidents[key] = tuple(correlate.Incident.from_dict(i) for i in items)
        elif kind == "ports":
            ports[key] = tuple(
                correlate.PortHistory(p["node_id"], p["ib_port"], tuple(p["changed_at"])) for p in doc["items"]
            )
    return correlate.CorrelationState(incidents={k: v for k, v in incidents.items() if v}, ports=ports)


def _blocking(executor: Callable[[actions.Action], Any]) -> bool:
    """Whether an adapter's calls wait on another system (`quarantine.executors` sets ``blocking``; default yes)."""
    return getattr(executor, "blocking", True)


def _answer(calls: Sequence[_Call], exc: BaseException | None = None) -> None:
    """Return from the `on_events` calls whose decisions are done (or raise exc in them)."""
    for call in calls:
        future = call.future
        if not future.done():
            if exc is None:
                future.set_result(None)
            else:
                future.set_exception(exc)


_APPENDED_COMMIT_FIELDS = (
    "event_appends",
    "new_commands",
    "command_updates",
    "incidents",
    "tickets",
    "quarantines",
    "releases",
    "rmas",
    "validations",
    "audit",
)
"""`rstore.Commit`'s lists; the store writes them in order (incidents and tickets: the last row per id)."""


def _note_consumed(change: rstore.Commit, node_id: str, events: Sequence[repo.StoredEvent]) -> None:
    """Move node_id's replay watermark in change over decided events: its newest spool epoch's highest seq.

    A pass can hold a node's events of two spools (the agent came back with a new one while the old
    one's last batch was being decided): the new spool's seqs start over, so the old one's, however
    high, say nothing about them. An event that does not know its epoch counts in the one noted.
    """
    seq = change.processed_seq.get(node_id)
    epoch = change.processed_epoch.get(node_id)
    for event in events:
        if event.seq <= 0:
            continue
        if event.spool_epoch is not None and epoch is not None and event.spool_epoch != epoch:
            if event.spool_epoch < epoch:
                continue
            seq = None
        if event.spool_epoch is not None:
            epoch = event.spool_epoch
        seq = event.seq if seq is None else max(seq, event.seq)
    if seq is not None:
        change.processed_seq[node_id] = seq
    if epoch is not None:
        change.processed_epoch[node_id] = epoch


def _merged(first: _Pass, second: _Pass) -> _Pass:
    """Two staged passes as one transaction: second was staged on first's state, so its rows go after.

    Upserts keep the last row per key (a node's ladder state, a ticket, a document), so second's
    win where both wrote; the rest is appended in order. Undoing it puts back what was before first.
    """
    change = first.change
    later = second.change
    change.now_unix_ns = later.now_unix_ns
    for node_id, seq in later.processed_seq.items():
        change.processed_seq[node_id] = seq
        if node_id in later.processed_epoch:
            change.processed_epoch[node_id] = later.processed_epoch[node_id]
        else:
            change.processed_epoch.pop(node_id, None)
    change.node_states.update(later.node_states)
    change.docs.update(later.docs)
    for field in _APPENDED_COMMIT_FIELDS:
        getattr(change, field).extend(getattr(later, field))
    return _Pass(
        group=second.group,
        change=change,
        states={**first.states, **second.states},
        new_actions=[*first.new_actions, *second.new_actions],
        dispatched=second.dispatched,
        states_before={**second.states_before, **first.states_before},
        correlation_before=first.correlation_before,
        budget_before=first.budget_before,
        budget_stored_before=first.budget_stored_before,
        detect_s=second.detect_s,
        new_incidents=second.new_incidents,
        decisions=second.decisions,
        admitted=[*first.admitted, *second.admitted],
        answers=[*first.answers, *second.answers],
        overlapped=second.overlapped,
    )


def _cancelled_ids(change: rstore.Commit) -> set[str]:
    """The waiting commands change cancels (`RemediationService._close`): they stop waiting once it commits."""
    return {command_id for command_id, update in change.command_updates if update.get("status") == "cancelled"}


def _audit(
    now_ns: int, actor: str, action: str, node_id: str, gpu_uuid: str, reason: str, outcome: str
) -> dict[str, Any]:
    return {
        "at_unix_ns": now_ns,
        "actor": actor,
        "action": action,
        "node_id": node_id,
        "gpu_uuid": gpu_uuid,
        "reason": reason,
        "outcome": outcome,
        "details": {},
    }


def expired_incidents(
    before: correlate.CorrelationState,
    after: correlate.CorrelationState,
    *,
    scopes: Collection[str] | None = None,
) -> list[correlate.Incident]:
    """Incidents before remembers and after no longer does: their window ended, so their rows close.

    scopes, when given, are the only scopes that can differ (see `correlation_changes`).
    """
    gone: dict[str, correlate.Incident] = {}
    for scope in before.incidents if scopes is None else scopes:
        old = before.incidents.get(scope, ())
        if after.incidents.get(scope, ()) is old:
            continue
        gone.update((i.incident_id, i) for i in old)
    if gone:
        # An incident still remembered sits in a scope whose tuple changed too (it was pruned from one
        # or moved into another), so the unchanged scopes, most of them, need no look.
        for scope in after.incidents if scopes is None else scopes:
            incidents = after.incidents.get(scope, ())
            if before.incidents.get(scope, ()) is incidents:
                continue
            for incident in incidents:
                gone.pop(incident.incident_id, None)
    return list(gone.values())


def _incident_row(incident: correlate.Incident, now_ns: int, *, closed: bool = False) -> dict[str, Any]:
    """The incidents-table row; closed once the correlation window forgot the incident."""
    return {
        "incident_id": incident.incident_id,
        "node_id": incident.node_id,
        "gpu_uuid": incident.gpu_uuid,
        "cause": incident.fault_key[:128],
        "component": str(incident.classification.component.value)[:32],
        "severity": int(incident.classification.severity),
        "state": "closed" if closed else "open",
        "opened_unix_ns": int(incident.opened_at * 1e9),
        "closed_unix_ns": now_ns if closed else None,
        "data": incident.to_dict(),
    }


def _ticket_row(ticket: escalation.Ticket, now_ns: int, *, closed: bool = False) -> dict[str, Any]:
    """The repair_tickets row (a projection of the ticket in the node's ladder state)."""
    return {
        "ticket_id": ticket.ticket_id,
        "node_id": ticket.node_id,
        "gpu_uuid": ticket.gpu_uuid,
        "incident_id": ticket.incident_ids[0] if ticket.incident_ids else "",
        "state": ticket.state.value,
        "rung": ticket.rung.word if ticket.rung else "",
        "purpose": ticket.purpose.value,
        "reason": ticket.reason,
        "opened_unix_ns": int(ticket.opened_at * 1e9),
        "updated_unix_ns": now_ns if closed else int(ticket.updated_at * 1e9),
        "closed": closed,
        "steps": [*ticket.history, f"{now_ns / 1e9:.0f} ticket closed"] if closed else list(ticket.history),
    }
