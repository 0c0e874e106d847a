"""The remediation service: the pure repair core run on a replica's events, its actions carried out.

Edges only; every decision is made by `rasd.controller.core` (classify → correlate → escalate →
blast radius). This facade wires the parts that own the I/O around it, each around one shared
`state.LadderState` under one decision lock (decisions are serialised, as the pure core assumes):

- `decider`: the group-commit decision pipeline (events in, passes committed, undone on failure);
- `dispatch`: admission within the disruption budget, dispatch rounds;
- `sender`: agent commands to the `outlet`, held behind their quarantine's adapter, re-sent on reconnect;
- `adapters`: controller-side executors in thread pools, and their outcomes;
- `results`: command results into the ladder; `ticker`: timeouts, watch windows, expiry;
- `sweeps`: rolling SDC sweeps; `lost_nodes`: silent nodes to the ladder; `operator`: quarantine, release,
  validate, accuse, RMA, pause;
- `ledger`: what every transaction writes and what follows its commit; `startup`: a term's start.

On a single replica the service is the ingest's consumer (`ingest.consumer.IngestConsumer`): an
event that arrives in order is stored in the transaction of the decision on it and acked only
after that commit, before its commands leave; anything else is stored apart first (`EventLog`),
acked, then decided. Each batch is handed over once.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

import structlog
from sqlalchemy.orm import Session

from rasd.controller.core import agent_messages as msgs
from rasd.controller.core.remediation import blast_radius, correlate, escalation
from rasd.controller.core.remediation import policy as policy_mod
from rasd.controller.ingest import consumer as consumer_mod
from rasd.controller.ingest import store_calls
from rasd.controller.ingest import streams as streams_mod
from rasd.controller.observability import metrics as metrics_mod
from rasd.controller.remediation import adapters as adapters_mod
from rasd.controller.remediation import decider as decider_mod
from rasd.controller.remediation import dispatch as dispatch_mod
from rasd.controller.remediation import ledger as ledger_mod
from rasd.controller.remediation import lost_nodes as lost_nodes_mod
from rasd.controller.remediation import node_sync as node_sync_mod
from rasd.controller.remediation import operator as operator_mod
from rasd.controller.remediation import outlet as outlet_mod
from rasd.controller.remediation import passes, sdc_ledger, startup
from rasd.controller.remediation import results as results_mod
from rasd.controller.remediation import sender as sender_mod
from rasd.controller.remediation import state as state_mod
from rasd.controller.remediation import stragglers as stragglers_mod
from rasd.controller.remediation import sweeps as sweeps_mod
from rasd.controller.remediation import ticker as ticker_mod
from rasd.controller.store import remediation as rstore
from rasd.controller.store import repo
from rasd.controller.store import thread as store_thread
from rasd.controller.store import writer as store_writer

log = structlog.get_logger("rasd.controller")

AGENT_KINDS = state_mod.AGENT_KINDS
BUDGET_DEMAND_PREFIX = ledger_mod.BUDGET_DEMAND_PREFIX
MAX_GROUP_EVENTS = decider_mod.MAX_GROUP_EVENTS
RemediationStats = state_mod.RemediationStats
TermEnded = passes.TermEnded


class RemediationService:
    """Drives the repair ladder for the whole fleet (runs on the leader replica: rasd.controller.replication.leader)."""

    def __init__(
        self,
        store: repo.Store,
        thread: store_thread.StoreThread,
        agent_streams: streams_mod.AgentStreams,
        controller_metrics: metrics_mod.ControllerMetrics,
        *,
        event_log: consumer_mod.EventLog,
        outlet: outlet_mod.CommandOutlet | None = None,
        recorder: outlet_mod.DecisionRecorder | None = None,
        policy: policy_mod.RemediationPolicy | None = None,
        executors: Mapping[str, adapters_mod.Executor] | None = None,
        clock: Callable[[], int] = time.time_ns,
        tick_interval_s: float = 2.0,
        power_stale_after_s: float = 10.0,
        fence: Callable[[Session], None] | None = None,
        writer: store_writer.CommitProcess | None = None,
        node_sync: node_sync_mod.SyncNodes | None = None,
        node_sync_s: float = 60.0,
        lost_node_checks: bool = True,
    ) -> None:
        """Wire the parts; call `start()` inside the event loop (again at each leader term).

        Args:
            store: the replica's store (nodes and events; the ladder's tables through `RemediationStore`).
            thread: the store thread every store call runs on.
            agent_streams: this replica's streams and the nodes' inventory.
            controller_metrics: where decisions, commits and gauges are counted.
            event_log: stores event batches apart (`events`, when they cannot go with their decision).
            outlet: where dispatched agent commands go (default: `outlet.LocalStreams`, this replica's streams).
            recorder: hears of every decision, accusation and lost node (default: none).
            policy: the ladder's policy.
            executors: controller-side adapters by action kind (none: every such action is its record).
            clock: the controller's clock, unix ns.
            tick_interval_s: the ticker's period.
            power_stale_after_s: telemetry older than this does not make a node idle (SDC sweeps).
            fence: refuses the ladder's commits once this replica's term as leader ended (`Leadership.fence`).
            writer: a commit writer process (`use_writer`); None: commits run on the store thread.
            node_sync: the scheduler's node read (topology, heartbeats: `node_sync`); None: none.
            node_sync_s: its period.
            lost_node_checks: False: the lost-node watch runs no checks of its own (a replay feeds verdicts).
        """
        policy = policy or policy_mod.RemediationPolicy()
        self.state = state_mod.LadderState(
            policy=policy, clock=clock, streams=agent_streams, metrics=controller_metrics
        )
        self.store = rstore.RemediationStore(store.engine, fence=fence)
        self.outlet = outlet or outlet_mod.LocalStreams(agent_streams, policy.escalation)
        self._event_log = event_log
        self._node_store = store
        recorder = recorder or outlet_mod.NoRecorder()
        self.sdc = sdc_ledger.SdcLedger(policy.sdc)
        self.sender = sender_mod.Sender(self.state, self.outlet)
        self.adapters = adapters_mod.Adapters(self.state, self.sender, executors or {}, deliver=self._deliver_outcomes)
        self.ledger = ledger_mod.Ledger(
            self.state, self.store, thread, self.sender, recorder, leaves_after_commit=self.adapters.leaves_after_commit
        )
        self.results = results_mod.Results(self.state, self.ledger, self.sdc)
        self.dispatcher = dispatch_mod.Dispatcher(self.state, self.ledger, self.sender, self.adapters, self.results)
        self.decider = decider_mod.Decider(self.state, self.ledger, self.dispatcher, self.results)
        self.ticker = ticker_mod.Ticker(
            self.state, self.ledger, self.dispatcher, self.results,
            tick_interval_s=tick_interval_s, power_stale_after_s=power_stale_after_s,
        )  # fmt: skip
        self.node_sync = node_sync_mod.NodeSync.configured(self.state, node_sync, period_s=node_sync_s)
        self.sweeps = sweeps_mod.Sweeps(
            self.state, self.ledger, self.dispatcher, self.sdc, power_stale_after_s=power_stale_after_s
        )
        self.operator = operator_mod.OperatorCommands(
            self.state, self.ledger, self.dispatcher, self.adapters, self.decider,
            node_store=store, outlet=self.outlet, recorder=recorder, sdc_records=self.sdc,
        )  # fmt: skip
        self._recorder, self._lost_node_checks = recorder, lost_node_checks
        self.deciding = consumer_mod.Deciding()
        """Decisions on events stored apart, running on their own (`events`)."""
        if writer is not None:
            self.use_writer(writer)

    @functools.cached_property
    def lost_nodes(self) -> lost_nodes_mod.LostNodeWatch:
        """The lost-node watch: silent in-service nodes to the ladder, returned ones validated and released."""
        return lost_nodes_mod.LostNodeWatch(
            self.state, self.ledger, self.decider, self._read_sightings, self._release_returned, self._read_labels,
            recorder=self._recorder, loop_checks=self._lost_node_checks,
        )  # fmt: skip

    @functools.cached_property
    def stragglers(self) -> stragglers_mod.StragglerActions:
        """The straggler watch's effects: audited, and its validate/quarantine rungs decided here (#40)."""
        actions = stragglers_mod.StragglerActions(self.state, self.ledger, self.decider)
        actions.on_stall = self.lost_nodes.check_stalled
        return actions

    # -- the shared state, read ----------------------------------------------------------------------------
    @property
    def policy(self) -> policy_mod.RemediationPolicy:
        """The ladder's policy."""
        return self.state.policy

    @property
    def stats(self) -> state_mod.RemediationStats:
        """What the service did."""
        return self.state.stats

    @property
    def node_states(self) -> dict[str, escalation.RemediationState]:
        """Every node's ladder state."""
        return self.state.node_states

    @property
    def correlation(self) -> correlate.CorrelationState:
        """The correlation state."""
        return self.state.correlation

    @property
    def budget(self) -> blast_radius.BudgetState:
        """The disruption budget."""
        return self.state.budget

    @property
    def adapters_busy(self) -> int:
        """Adapter calls whose outcome is not committed yet, plus the repairs that wait for one."""
        return self.adapters.busy

    @property
    def quiet(self) -> bool:
        """Nothing waits for a decision now: no event waits, no pass, result, tick or operator action holds the lock.

        `gc_policy.QuietCollector` collects only then, so that no decision waits for a collection.
        """
        return self.decider.quiet

    def use_writer(self, writer: store_writer.CommitProcess) -> None:
        """Commit in writer's process, and decide the next pass while one commits (`decider`).

        With commits in this process, deciding while committing only makes the two take turns at
        the GIL (measured slower than one pass at a time), so the pipeline is one pass deep.
        """
        self.store.writer = writer
        self.decider.pipeline_depth = decider_mod.PIPELINE_DEPTH

    # -- lifecycle -------------------------------------------------------------------------------------
    async def start(self) -> None:
        """Load durable state, resume the outbox, start the tick loop (again at each leader term)."""
        state = self.state
        state.term_ended = False
        state.clear_transient()  # a new term starts from the store alone
        if self.store.writer is not None:
            await asyncio.to_thread(self.store.writer.start)  # before the first decision waits for it
        else:
            await self.ledger.run(self.store.warm_up)  # the writer process warms itself
        await startup.load_ladder(state, self.ledger, self._node_store)
        # All of them: a storm leaves more than the read's default 10,000 unfinished, and a new term that
        # resumed only the oldest would never admit the rest nor know what the others were sent for.
        unfinished = startup.outbox(
            await self.ledger.run(lambda: self.store.commands(statuses=("pending", "dispatched"), limit=None)),
            self.adapters,
        )
        state.deferred.update((a.command_id, a) for a in unfinished.pending)
        self.sdc.load(
            await self.ledger.run(self.store.load_docs, sdc_ledger.GPU_PREFIX),
            await self.ledger.run(self.store.load_docs, sdc_ledger.SWEEP_PREFIX),
        )
        self.ticker.start()
        self.sweeps.start()
        self.lost_nodes.start()
        if self.node_sync is not None:
            self.node_sync.start()
        self.ledger.export_budget()
        await self.ledger.export_quarantines()
        startup.await_answers(state, self.sender, unfinished)
        async with state.lock:
            for action in unfinished.redo:
                state.deferred[action.command_id] = action  # re-admitted and carried out again
            await self.dispatcher.dispatch_locked()
        replayed = await self._replay_backlog()
        log.info(
            "remediation_started",
            nodes_with_state=len(state.node_states),
            pending=len(state.deferred),
            dispatched_unanswered=len(unfinished.resend),
            controller_side_redone=len(unfinished.redo),
            nodes_replayed=replayed,
        )

    async def _read_sightings(
        self, seen_since_ns: int, silent_before_ns: int, also: Collection[str]
    ) -> tuple[list[repo.NodeSighting], int]:
        """`Store.silent_nodes` for the lost-node watch: beside the store thread where the store allows."""
        return await self._read_beside(
            functools.partial(
                self._node_store.silent_nodes,
                seen_since_unix_ns=seen_since_ns, silent_before_unix_ns=silent_before_ns, also=also,
            )
        )  # fmt: skip

    async def _read_labels(self, node_ids: Sequence[str]) -> dict[str, dict[str, str]]:
        """Stored labels of the nodes named lost (their topology for the disruption budget)."""
        return await self._read_beside(functools.partial(self._node_store.node_labels, node_ids))

    async def _read_beside(self, read: Callable[[], Any]) -> Any:
        """A node-table read beside the store thread where the store allows it (else on it, in turn)."""
        return await store_calls.run_beside(self._node_store, self.ledger.thread, read)

    async def _release_returned(self, node_id: str, reason: str) -> str:
        """A lost node back: `OperatorCommands.release` as the lost-node watch (validation first)."""
        return await self.operator.release(node_id, "", reason=reason, force=False, actor=lost_nodes_mod.ACTOR)

    async def _replay_backlog(self) -> int:
        """Run events stored before a crash but never through the ladder, in order; how many nodes had some."""
        backlog = await self.ledger.run(self.store.unprocessed_events)
        for node_id, (labels, events) in backlog.items():
            log.info("remediation_replaying_events", node=node_id, events=len(events))
            await self.on_events(node_id, events, labels)
        return len(backlog)

    async def stop(self) -> None:
        """Stop the loops and stop waiting for long adapters (state is already durable).

        An adapter's thread runs on; its outcome is not recorded by this term. The next term carries
        the action out again (`start`): adapters are idempotent (a repeated quarantine is a no-op
        that says so; the BMC journal never cycles a node twice for one ticket).
        """
        await self.ticker.stop()
        await self.stragglers.stop()
        await self.sweeps.stop()
        await self.lost_nodes.stop()
        if self.node_sync is not None:
            await self.node_sync.stop()
        await self.adapters.stop()
        await self.decider.stop()

    # -- the ingest's consumer ----------------------------------------------------------------------------
    async def events(self, batch: consumer_mod.EventBatch) -> consumer_mod.TakenEvents:
        """A stream's batch: stored with its decision when it arrived in order; else stored apart, then decided.

        An arriving batch the decision's transaction refused (a resend the stream took for new, a
        spool the node has left, the term ended) is stored apart (`EventLog.store_apart`), which keeps
        only what is new, and what is new is decided as any stored event is.
        """
        if batch.append is not None:
            try:
                await self.on_arrivals(batch.node_id, batch.events, batch.labels, batch.append, batch.on_durable)
            except Exception as exc:
                # Not stored with a decision (or not known to be): stored on their own below.
                log.info("events_stored_apart", node=batch.node_id, seqs=[e.seq for e in batch.events], error=str(exc))
                taken = await self._event_log.store_apart(batch, how="refused")
            else:
                events = batch.events
                return consumer_mod.TakenEvents(batch.append.acked_seq, len(events), events, with_decision=True)
        else:
            taken = await self._event_log.store_apart(batch)
        if not taken.fresh:
            return taken
        seqs = [e.seq for e in taken.fresh]
        decided = self.deciding.start(batch.node_id, seqs, self.on_events(batch.node_id, taken.fresh, batch.labels))
        return dataclasses.replace(taken, decided=decided)

    async def result(self, node_id: str, result: msgs.AgentResult) -> None:
        """A command's result from an agent: `on_result`."""
        await self.on_result(node_id, result)

    async def connected(self, node_id: str) -> None:
        """A node's stream opened: `node_connected`."""
        await self.node_connected(node_id)

    # -- inbound -------------------------------------------------------------------------------------------
    async def on_events(self, node_id: str, events: Sequence[repo.StoredEvent], labels: Mapping[str, str]) -> None:
        """Decide stored events (`Decider.on_events`); returns once they are decided and their commands sent."""
        await self.decider.on_events(node_id, events, labels)

    async def on_arrivals(
        self,
        node_id: str,
        events: Sequence[repo.StoredEvent],
        labels: Mapping[str, str],
        append: repo.ExpectedAppend,
        stored: Callable[[], None] | None = None,
    ) -> None:
        """Store events with the decision on them (`Decider.on_arrivals`), which raises when it cannot."""
        await self.decider.on_arrivals(node_id, events, labels, append, stored)

    async def node_connected(self, node_id: str) -> None:
        """Re-send this node's dispatched, unanswered commands (`Sender.resend`)."""
        self.sender.resend(node_id)

    async def on_result(self, node_id: str, result: msgs.AgentResult) -> None:
        """A command's result from an agent (or a controller-side executor): advance the ladder.

        If the store cannot take it, the result is kept and applied by the next tick (`Results.owed`).
        """
        if not await self.commit_result(node_id, result):
            self.results.owed.append((node_id, result))

    async def commit_result(self, node_id: str, result: msgs.AgentResult) -> bool:
        """`commit_results` for one result."""
        return await self.commit_results([(node_id, result)])

    async def commit_results(self, results: Sequence[tuple[str, msgs.AgentResult]]) -> bool:
        """Advance the ladder on results (node, result), in order, and commit them now in one transaction.

        False when the store could not take them: nothing of them is kept then, and a caller whose
        results are stored (relayed by another replica) offers them again next round. Owed in memory
        (as `on_result` keeps an agent's) and the stored rows forgotten, they died with this term if
        it ended first, and the next leader's ladder climbed past a repair that had worked.
        """
        async with self.state.lock:
            try:
                await self.results.apply(results)
            except repo.STORE_UNAVAILABLE as exc:
                log.warning("remediation_results_deferred", results=len(results),
                            command_ids=[r.command_id for _node, r in results[:5]], error=str(exc))  # fmt: skip
                return False
            await self.dispatcher.dispatch_after_commit()
            return True

    def _deliver_outcomes(self, batch: list[tuple[str, msgs.AgentResult]]) -> None:
        """Adapters' outcomes, committed by the decider's next pass (`Decider.take_outcomes`)."""
        self.decider.take_outcomes(batch)

    # -- periodic and operator -----------------------------------------------------------------------------
    async def tick(self) -> None:
        """`Ticker.tick`: owed results, timeouts, watch windows, expiry, waiting actions."""
        await self.ticker.tick()

    async def sweep_once(self) -> list[str]:
        """`Sweeps.sweep_once`: start the quick suite on due idle nodes; returns them."""
        return await self.sweeps.sweep_once()

    def sdc_records(self) -> list[dict[str, Any]]:
        """Every GPU with SDC history or under watch, most suspicious first (``rasctl sdc list``)."""
        return self.sweeps.records()

    async def set_paused(
        self, paused: bool, *, reason: str, actor: str, at_unix_ns: int | None = None
    ) -> blast_radius.BudgetState:
        """Pause automation, or resume it (`OperatorCommands.set_paused`)."""
        return await self.operator.set_paused(paused, reason=reason, actor=actor, at_unix_ns=at_unix_ns)

    async def operator_quarantine(
        self, node_id: str, gpu_uuid: str, *, reason: str, actor: str, at_unix_ns: int | None = None
    ) -> None:
        """Quarantine a node or GPU by hand (`OperatorCommands.quarantine`)."""
        await self.operator.quarantine(node_id, gpu_uuid, reason=reason, actor=actor, at_unix_ns=at_unix_ns)

    async def operator_release(
        self, node_id: str, gpu_uuid: str, *, reason: str, force: bool, actor: str, at_unix_ns: int | None = None
    ) -> str:
        """Return a node or GPU to service (`OperatorCommands.release`, which says what it raises)."""
        return await self.operator.release(
            node_id, gpu_uuid, reason=reason, force=force, actor=actor, at_unix_ns=at_unix_ns
        )

    async def operator_validate(self, node_id: str, gpu_uuid: str, *, suite: str, seed: int, actor: str) -> str:
        """Start a validation run (`OperatorCommands.validate`); its id."""
        return await self.operator.validate(node_id, gpu_uuid, suite=suite, seed=seed, actor=actor)

    async def accuse(
        self, node_id: str, gpu_uuid: str, *, reason: str, accuser: str, at_unix_ns: int | None = None
    ) -> None:
        """An SDC accusation into the ladder (`OperatorCommands.accuse`)."""
        await self.operator.accuse(node_id, gpu_uuid, reason=reason, accuser=accuser, at_unix_ns=at_unix_ns)

    async def approve_rma(self, rma_id: str, *, actor: str) -> dict[str, Any] | None:
        """Approve a pending RMA ticket (`OperatorCommands.approve_rma`)."""
        return await self.operator.approve_rma(rma_id, actor=actor)
