"""How one replica's ingest, repair ladder and relay are built and connected, each given its collaborators.

`rasd-controller` (`server.Controller`), the recording's replay (`rasd.sim.replay`), the benchmarks
and the tests build them here, so every path runs the same wiring:

- one replica: the ladder is the ingest's consumer and sends on this replica's streams;
- lease election (`replicated`): the relay is the ingest's consumer (events stored apart, results
  and straggler effects stored for the leader) and its courier is the ladder's outlet; the ladder
  runs on the leader.
  Every replica ships its aggregate to the leader (`replication.aggregates.Shipper`), and the
  leader's fleet-wide loops (the power loop, the SDC sweeps) read them all
  (`replication.aggregates.FleetReader`).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping

from sqlalchemy.orm import Session

from rasd.controller import changes as changes_mod
from rasd.controller.core import aggregates as aggregates_core
from rasd.controller.core.remediation import policy as policy_mod
from rasd.controller.ingest import consumer as consumer_mod
from rasd.controller.ingest import service as ingest_mod
from rasd.controller.ingest import streams as streams_mod
from rasd.controller.observability import metrics as metrics_mod
from rasd.controller.remediation import adapters as adapters_mod
from rasd.controller.remediation import node_sync as node_sync_mod
from rasd.controller.remediation import outlet as outlet_mod
from rasd.controller.remediation import service as remediation_mod
from rasd.controller.replication import aggregates as aggregates_mod
from rasd.controller.replication import leader as leader_mod
from rasd.controller.replication import relay as relay_mod
from rasd.controller.store import aggregates as aggregate_store
from rasd.controller.store import relay as relay_store
from rasd.controller.store import remediation as rstore
from rasd.controller.store import repo
from rasd.controller.store import thread as store_thread
from rasd.controller.store import writer as store_writer


@dataclasses.dataclass(frozen=True)
class Ladder:
    """What the repair ladder is built with (`remediation_mod.RemediationService`)."""

    policy: policy_mod.RemediationPolicy = dataclasses.field(default_factory=policy_mod.RemediationPolicy)
    executors: Mapping[str, adapters_mod.Executor] = dataclasses.field(default_factory=dict)
    recorder: outlet_mod.DecisionRecorder | None = None
    tick_interval_s: float = 2.0
    fence: Callable[[Session], None] | None = None
    """Refuses the ladder's commits once this replica is no longer the leader (`Leadership.fence`)."""
    writer: store_writer.CommitProcess | None = None
    """Where the ladder's commits run (None: the store thread)."""
    outlet: outlet_mod.CommandOutlet | None = None
    """Where its agent commands go (None: this replica's streams, or with lease election the relay's courier)."""
    wrap_outlet: Callable[[outlet_mod.CommandOutlet], outlet_mod.CommandOutlet] | None = None
    """Wraps that outlet (the power loop's `repair_gate.RepairGate`: resets and reboots wait for power headroom)."""
    node_sync: node_sync_mod.SyncNodes | None = None
    """The scheduler's periodic node read: topology for the budget, heartbeats (Kubernetes adapter's ``sync_nodes``)."""
    node_sync_s: float = 60.0
    lost_node_checks: bool = True
    """False: the lost-node watch judges nothing itself (a replay feeds the recorded verdicts on its clock)."""


DEFAULT_LADDER = Ladder()
"""The default policy, no adapter (every controller-side action is its record), no recording."""


@dataclasses.dataclass
class Wired:
    """One replica's services, connected."""

    store: repo.Store
    thread: store_thread.StoreThread
    streams: streams_mod.AgentStreams
    event_log: consumer_mod.EventLog
    ingest: ingest_mod.Ingest
    remediation: remediation_mod.RemediationService | None
    relay: relay_mod.Relay | None = None
    shipper: aggregates_mod.Shipper | None = None
    """With several replicas: ships this replica's aggregate to the leader while it does not lead."""
    fleet: aggregates_mod.FleetReader | None = None
    """With several replicas: the leader's read of the other replicas' aggregates."""
    changes: changes_mod.Changes = dataclasses.field(default_factory=changes_mod.Changes)
    """What changed, for the operators watching (AdminService ``Watch*``)."""

    async def stop(self) -> None:
        """Stop the ladder, the shipper and the ingest (flushed), then the store thread (the store stays open)."""
        if self.remediation is not None:
            await self.remediation.stop()
        if self.shipper is not None:
            await self.shipper.stop()
        await self.ingest.stop()
        self.thread.close()


def _ladder(
    store: repo.Store,
    thread: store_thread.StoreThread,
    agent_streams: streams_mod.AgentStreams,
    controller_metrics: metrics_mod.ControllerMetrics,
    event_log: consumer_mod.EventLog,
    ladder: Ladder,
    *,
    settings: ingest_mod.IngestSettings,
    outlet: outlet_mod.CommandOutlet | None,
    clock: Callable[[], int],
) -> remediation_mod.RemediationService:
    outlet = ladder.outlet or outlet or outlet_mod.LocalStreams(agent_streams, ladder.policy.escalation)
    if ladder.wrap_outlet is not None:
        outlet = ladder.wrap_outlet(outlet)
    return remediation_mod.RemediationService(
        store,
        thread,
        agent_streams,
        controller_metrics,
        event_log=event_log,
        outlet=outlet,
        recorder=ladder.recorder,
        policy=ladder.policy,
        executors=ladder.executors,
        clock=clock,
        tick_interval_s=ladder.tick_interval_s,
        power_stale_after_s=settings.power_stale_after_s,
        fence=ladder.fence,
        writer=ladder.writer,
        node_sync=ladder.node_sync,
        node_sync_s=ladder.node_sync_s,
        lost_node_checks=ladder.lost_node_checks,
    )


def single_replica(
    store: repo.Store,
    controller_metrics: metrics_mod.ControllerMetrics,
    *,
    ladder: Ladder | None = DEFAULT_LADDER,
    settings: ingest_mod.IngestSettings | None = None,
    clock: Callable[[], int] = time.time_ns,
    thread: store_thread.StoreThread | None = None,
) -> Wired:
    """The ingest and, unless ladder is None, the repair ladder as its consumer, on this replica's streams."""
    settings = settings or ingest_mod.IngestSettings()
    thread = thread or store_thread.StoreThread()
    changes = changes_mod.Changes()
    agent_streams = changes_mod.WatchedStreams(changes, clock=clock)
    event_log = consumer_mod.EventLog(store, thread, controller_metrics)
    remediation = None
    consumer: consumer_mod.IngestConsumer = consumer_mod.StoreOnly(event_log)
    if ladder is not None:
        remediation = _ladder(
            store, thread, agent_streams, controller_metrics, event_log, ladder, settings=settings, outlet=None,
            clock=clock,
        )  # fmt: skip
        consumer = remediation
    _watch_commits(changes, remediation)
    watched = changes_mod.Watched(consumer, changes)
    ingest = ingest_mod.Ingest(store, thread, agent_streams, controller_metrics, watched, settings, clock=clock)
    if remediation is not None:  # the straggler watch's validate and quarantine rungs go up this ladder (#40)
        ingest.stragglers.actuator = remediation.stragglers.take
    return Wired(store, thread, agent_streams, event_log, ingest, remediation, changes=changes)


def _watch_commits(changes: changes_mod.Changes, remediation: remediation_mod.RemediationService | None) -> None:
    """Feed the replica's watch fan-out every commit of the ladder (when it runs)."""
    if remediation is not None:
        remediation.ledger.on_commit = changes.publish_commit


def replicated(
    store: repo.Store,
    controller_metrics: metrics_mod.ControllerMetrics,
    leadership: leader_mod.Leadership,
    *,
    ladder: Ladder | None,
    settings: ingest_mod.IngestSettings,
    poll_s: float,
    aggregate_reads: aggregates_core.AggregateReads | None = None,
    clock: Callable[[], int] = time.time_ns,
) -> Wired:
    """One of several replicas (lease election): the relay takes events and results, its courier the commands.

    The ladder (unless None) runs while this replica leads: the relay starts and stops it with the
    leadership's terms. With aggregate_reads (what to ship until the leader asks; None: the fleet-wide
    loops need nothing) this replica ships its aggregate to the leader, and the leader's sweeps read
    every replica's.
    """
    thread = store_thread.StoreThread()
    changes = changes_mod.Changes()
    agent_streams = changes_mod.WatchedStreams(changes, clock=clock)
    event_log = consumer_mod.EventLog(store, thread, controller_metrics)
    policy = (ladder.policy if ladder is not None else policy_mod.RemediationPolicy()).escalation
    remediation = None
    courier = relay_mod.Courier(
        agent_streams, thread, relay_store.RelayStore(store.engine), leadership.replica_id, poll_s=poll_s,
        outbox=None if ladder is None else rstore.RemediationStore(store.engine), policy=policy,
    )  # fmt: skip
    if ladder is not None:
        remediation = _ladder(
            store, thread, agent_streams, controller_metrics, event_log, ladder, settings=settings, outlet=courier,
            clock=clock,
        )  # fmt: skip
    relay = relay_mod.Relay(
        courier, event_log, leadership, remediation, agent_streams=agent_streams, thread=thread, poll_s=poll_s
    )
    _watch_commits(changes, remediation)
    if remediation is not None:  # the leader publishes every replica's events as its relay takes them
        relay.on_fresh = changes.publish_events
    watched = changes_mod.Watched(relay, changes, events=remediation is None)
    ingest = ingest_mod.Ingest(store, thread, agent_streams, controller_metrics, watched, settings, clock=clock)
    ingest.stragglers.actuator = relay.take_straggler_effects  # every replica's suspects, acted on by the leader
    wired = Wired(store, thread, agent_streams, event_log, ingest, remediation, relay, changes=changes)
    if aggregate_reads is not None:
        records = aggregate_store.AggregateStore(store.engine)
        wired.shipper = aggregates_mod.Shipper(ingest, records, leadership, defaults=aggregate_reads, clock=clock)
        wired.fleet = aggregates_mod.FleetReader(ingest, records, leadership.replica_id, clock=clock)
        if remediation is not None:
            remediation.sweeps.use_fleet(wired.fleet)
    return wired
