"""Prometheus metrics of the controller. The registry is injected; nothing uses the global one.

Per-GPU gauges are computed at scrape time from the ingest's in-memory latest telemetry by a custom
collector, so ingest pays nothing per sample for them. They are named `rasd_controller_gpu_*`, not
the agent's `rasd_gpu_*`: a Prometheus that scrapes both must not count each GPU twice in a
`sum by (node)`. The controller keeps its view because the chart scrapes only the controller, and it
is the fleet's power as the power loop saw it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from rasd.common import exposition, xid_catalog
from rasd.controller.core import fleet
from rasd.controller.wire import fields as wire_fields
from rasd.controller.wire import stream as wire_stream

if TYPE_CHECKING:
    from rasd.controller.power import loop as power_loop


class ControllerMetrics:
    """Counters and gauges the ingest and RPC layers update."""

    def __init__(self, registry: CollectorRegistry) -> None:
        """Register every metric on registry, with `rasd_build_info` and without `_created` series."""
        self.registry = registry
        exposition.prepare_registry(registry)
        self._register_ingest(registry)
        self._register_remediation(registry)
        self._register_power(registry)
        self._register_stragglers(registry)

    def _register_ingest(self, registry: CollectorRegistry) -> None:
        """The agent streams' and the ingest's metrics: messages, samples, events, store writes."""
        self.agent_streams = Gauge("rasd_agent_streams", "Agent streams open on this replica.", registry=registry)
        self.agent_messages = Counter(
            "rasd_agent_messages",
            "Messages received from agents, by payload kind.",
            ["kind"],
            registry=registry,
        )
        self.power_samples = Counter("rasd_power_samples", "Power samples ingested from agents.", registry=registry)
        self.health_events = Counter(
            "rasd_health_events",
            "Health events stored (duplicates excluded), by kind.",
            ["kind"],
            registry=registry,
        )
        self._health_events_by_kind: dict[int, Counter] = {}
        self.events_lost_by_store = Counter(
            "rasd_events_lost_by_store",
            "Events agents had had acked that the store no longer holds (it lost its last commits: a restore "
            "from backup, a failover to a standby behind the primary); the ack position moved past them.",
            registry=registry,
        )
        self.wire_rejections = Counter(
            "rasd_wire_rejections",
            "Agent messages rejected as INVALID_ARGUMENT, by the field's place in the message (list indices "
            "and map keys as [], other for a name that is none).",
            ["field"],
            registry=registry,
        )
        self.commands = Counter(
            "rasd_commands", "Command results received from agents.", ["action", "outcome"], registry=registry
        )
        self.store_flush_seconds = Histogram(
            "rasd_store_flush_seconds",
            "Time to write the latest telemetry to the store.",
            buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
            registry=registry,
        )
        self.summaries_absorbed_at_once = Counter(
            "rasd_telemetry_summaries_absorbed_at_once",
            "Telemetry summaries absorbed on arrival of a newer one of their node, rather than after the "
            "health events in flight (the node had the most summaries waiting already): the ingest was behind.",
            registry=registry,
        )
        self.event_persist_seconds = Histogram(
            "rasd_event_persist_seconds",
            "Time from receiving a health-event batch to its ack being queued.",
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1),
            registry=registry,
        )
        self.event_batches_stored = Counter(
            "rasd_event_batches_stored",
            "Health-event batches stored, by how: with_decision (in the transaction of the decision on "
            "them); apart (in one of their own, then decided: their stream could not tell they were new, "
            "a resend or a gap, or this replica does not decide); refused (apart, after the decision's "
            "transaction found them not new or failed).",
            ["how"],
            registry=registry,
        )
        self.event_batches_stored_with_decision = self.event_batches_stored.labels(how="with_decision")
        """The child every batch of a storm counts under (looked up once: `events_stored` says why)."""

    def _register_remediation(self, registry: CollectorRegistry) -> None:
        """The repair path's metrics: incidents, actions, its latencies, the budget and quarantines."""
        self.incidents = Counter(
            "rasd_incidents",
            "New incidents, by cause (the fault's kind, with the Xid when NVIDIA's catalog lists it) and component.",
            ["cause", "component"],
            registry=registry,
        )
        self.remediation_actions = Counter(
            "rasd_remediation_actions",
            "Remediation actions that finished, by kind (ladder rung or executor) and outcome.",
            ["kind", "outcome"],
            registry=registry,
        )
        self.time_to_detect_seconds = Histogram(
            "rasd_time_to_detect_seconds",
            "From the agent observing a health event to the controller storing it.",
            buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
            registry=registry,
        )
        self.time_to_first_action_seconds = Histogram(
            "rasd_time_to_first_action_seconds",
            "From a health event stored to the first command it caused leaving the controller (once per "
            "event): an agent command put on its node's stream after its commit, or a quarantine, RMA or "
            "notice handed to its adapter.",
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1, 5, 30),
            registry=registry,
        )
        self.time_between_incidents_seconds = Histogram(
            "rasd_time_between_incidents_seconds",
            "From one incident opening on a node to the next one opening on the same node (each node's "
            "intervals, fleet-wide): short intervals are nodes that fail again soon after a repair.",
            buckets=(60, 300, 900, 3600, 21600, 86400, 259200, 604800, 2592000, 7776000),
            registry=registry,
        )
        self.remediation_commit_seconds = Histogram(
            "rasd_remediation_commit_seconds",
            "Time the store took to make one remediation transaction durable (a decision pass, a dispatch "
            "round, a result or an operator's action), on the store thread or in the commit writer process: "
            "the database's share of rasd_time_to_first_action_seconds.",
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10),
            registry=registry,
        )
        self.gc_pause_seconds = Histogram(
            "rasd_gc_pause_seconds",
            "Pauses of the controller process for Python's cyclic garbage collector, by generation (0 young, "
            "2 full) and trigger: quiet (run while no decision waited) or threshold (CPython's own, which can "
            "stop a decision pass; also start-up's explicit one).",
            ["generation", "trigger"],
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
            registry=registry,
        )
        self.time_to_repair_seconds = Histogram(
            "rasd_time_to_repair_seconds",
            "From a repair ticket opening to its parts returning to service after validation.",
            buckets=(1, 10, 60, 300, 900, 1800, 3600, 7200, 21600, 86400),
            registry=registry,
        )
        self.breaker_tripped = Gauge(
            "rasd_breaker_tripped", "1 while the circuit breaker holds all automation.", registry=registry
        )
        self.store_file_lost = Gauge(
            "rasd_store_file_lost",
            "1 once the store's SQLite file was deleted or replaced under this replica: nothing is acked "
            "and health is NOT_SERVING until it is restarted.",
            registry=registry,
        )
        self.store_unwritable = Gauge(
            "rasd_store_unwritable",
            "1 while the store's write probe fails (PostgreSQL read-only, out of disk or privileges): nothing "
            "is acked and health is NOT_SERVING until a probe commits again.",
            registry=registry,
        )
        self.automation_paused = Gauge(
            "rasd_automation_paused", "1 while an operator has paused automation.", registry=registry
        )
        self.quarantined = Gauge(
            "rasd_quarantined", "Active quarantines, by scope (node, gpu, port).", ["scope"], registry=registry
        )

    def _register_stragglers(self, registry: CollectorRegistry) -> None:
        """The straggler watch's metrics (issue #40)."""
        self.straggler_steps = Counter(
            "rasd_straggler_steps",
            "Training steps whose compute -> communication edges the straggler watch judged.",
            registry=registry,
        )
        self.lost_nodes = Gauge(
            "rasd_lost_nodes",
            "In-service nodes no replica has heard from for lost_after_s (the leader's lost-node watch).",
            registry=registry,
        )
        self.nodes_named_lost = Counter(
            "rasd_nodes_named_lost",
            "Nodes the lost-node watch handed to the ladder as lost (each is quarantined for a person).",
            registry=registry,
        )
        self.lost_node_storm = Gauge(
            "rasd_lost_node_storm",
            "1 while more nodes fell silent at once than a failure of hosts explains: none is named lost.",
            registry=registry,
        )
        self.straggler_actions = Counter(
            "rasd_straggler_actions",
            "Straggler watch actions, by kind: notify, raise_cap, validate, quarantine, clear, stall, restart (#40).",
            ["action"],
            registry=registry,
        )
        self.job_stalled = Gauge(
            "rasd_job_stalled",
            "1 while the job's steps have stopped with its GPUs still busy: a hung collective (issue #40).",
            registry=registry,
        )
        self.job_stalls = Counter(
            "rasd_job_stalls",
            "Stalls of the job's step rhythm the straggler watch named (each restarts a rank by policy).",
            registry=registry,
        )
        self.straggler_suspect = Gauge(
            "rasd_straggler_suspect",
            "1 for a GPU named a straggler: its edge lagged its job's median step after step (issue #40).",
            ["node", "gpu"],
            registry=registry,
        )
        self.straggler_lag_seconds = Gauge(
            "rasd_straggler_lag_seconds",
            "A suspect straggler's mean lag behind its job's median edge while its score climbed.",
            ["node", "gpu"],
            registry=registry,
        )

    def _register_power(self, registry: CollectorRegistry) -> None:
        """The power loop's metrics."""
        self.power_period_seconds = Histogram(
            "rasd_power_period_seconds",
            "Time one power control period took (allocate, plan, persist, send).",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
            registry=registry,
        )
        self.power_bmc_limits = Counter(
            "rasd_power_bmc_limits",
            "Node power limits asked of a BMC for an unreachable node (the fallback), by outcome.",
            ["outcome"],
            registry=registry,
        )

    def events_stored(self, kinds: Iterable[int]) -> None:
        """Count newly stored events under ``rasd_health_events`` by kind (EventKind values).

        Each kind's labelled child is looked up once: `labels()` validates and locks at every call,
        and this runs for every event of a storm, on the event loop.
        """
        children = self._health_events_by_kind
        for kind in kinds:
            child = children.get(kind)
            if child is None:
                child = children[kind] = self.health_events.labels(kind=wire_stream.event_kind_name(kind))
            child.inc()

    def incident_opened(self, fault_key: str, component: str) -> None:
        """Count a new incident under ``rasd_incidents`` by its cause's kind (`incident_cause_label`) and component."""
        self.incidents.labels(cause=incident_cause_label(fault_key), component=component).inc()

    def rejected(self, field: str) -> None:
        """Count a rejected message under its field's place in the message (`wire.fields`: a fixed set of labels)."""
        self.wire_rejections.labels(field=wire_fields.rejection_label(field)).inc()


_CAUSE_KIND_RE = re.compile(r"[a-z][a-z0-9_]{0,31}")


def incident_cause_label(fault_key: str) -> str:
    """An incident's cause as a label from a fixed set: the fault key's kind, with the Xid when NVIDIA lists it.

    A fault key names the fault's kind and, after a colon, what the event said: ``xid:79``,
    ``ib_flap:mlx5_0/1``, ``nvlink_down:3``. The part after the colon comes from the node (any Xid
    up to 99,999, any port name), so as a label it minted a series per value a node chose. Kept
    whole only for an Xid in NVIDIA's catalog (about a hundred); otherwise the kind alone
    (``xid:other`` for an Xid the catalog does not list).
    """
    kind, colon, detail = fault_key.partition(":")
    if not _CAUSE_KIND_RE.fullmatch(kind):
        return "other"
    if kind == "xid" and colon:
        return fault_key if detail.isdigit() and int(detail) in xid_catalog.load_catalog() else "xid:other"
    return kind


class FleetCollector(Collector):
    """Scrape-time gauges over the in-memory fleet view."""

    def __init__(
        self,
        latest: Callable[[], Mapping[str, fleet.GpuLatest]],
        gpu_nodes: Callable[[], Mapping[str, str]],
        node_states: Callable[[], Mapping[str, fleet.ComponentState]],
    ) -> None:
        """Read latest telemetry, the GPU→node map and node states through callables."""
        self._latest = latest
        self._gpu_nodes = gpu_nodes
        self._node_states = node_states

    def collect(self) -> Iterable[Metric]:
        """Yield per-GPU power gauges (labelled `node` and dcgm-exporter's `UUID`), the fleet total, nodes by state."""
        labels = ["node", "UUID"]
        power = GaugeMetricFamily(
            "rasd_controller_gpu_power_watts", "Latest GPU power draw the controller received.", labels=labels
        )
        limit = GaugeMetricFamily(
            "rasd_controller_gpu_power_limit_watts", "Enforced GPU power limit the controller received.", labels=labels
        )
        gpu_nodes = self._gpu_nodes()
        total_w = 0.0
        for uuid, latest in self._latest().items():
            node = gpu_nodes.get(uuid, "")
            if latest.power_w is not None:
                power.add_metric([node, uuid], latest.power_w)
                total_w += latest.power_w
            if latest.enforced_power_limit_w is not None:
                limit.add_metric([node, uuid], latest.enforced_power_limit_w)
        yield power
        yield limit
        yield GaugeMetricFamily("rasd_fleet_power_watts", "Sum of the latest GPU power draws.", value=total_w)
        nodes = GaugeMetricFamily("rasd_nodes", "Nodes known to this replica, by state.", labels=["state"])
        counts: dict[str, int] = {state.name.lower(): 0 for state in fleet.ComponentState if state.value}
        for state in self._node_states().values():
            counts[state.name.lower()] = counts.get(state.name.lower(), 0) + 1
        for state_name, count in counts.items():
            nodes.add_metric([state_name], count)
        yield nodes


SDC_SUSPECT_MARKS = frozenset({"accusation", "fail", "suspect"})
"""The SDC marks that leave a GPU a suspect until a later passing run clears it."""


def sdc_suspects(records: Iterable[Mapping[str, Any]]) -> int:
    """GPUs whose latest SDC mark is an accusation, a failed run or a suspect run (`rasctl sdc list` rows)."""
    return sum(1 for record in records if record.get("marks") and record["marks"][-1][0] in SDC_SUSPECT_MARKS)


class RemediationCollector(Collector):
    """Scrape-time gauges of the leader's repair queues: RMA tickets awaiting approval and SDC suspects.

    Only the leader exports them (followers' ladders stand still, and the store is shared), so a
    fleet has one series of each and alerts need no de-duplication.
    """

    def __init__(
        self,
        is_leader: Callable[[], bool],
        rma_pending: Callable[[], int | None],
        sdc_records: Callable[[], Iterable[Mapping[str, Any]]],
    ) -> None:
        """Read leadership, the pending RMA count (a store query) and the SDC rows through callables."""
        self._is_leader = is_leader
        self._rma_pending = rma_pending
        self._sdc_records = sdc_records

    def collect(self) -> Iterable[Metric]:
        """Yield rasd_rma_pending and rasd_sdc_suspects on the leader; nothing on a follower."""
        if not self._is_leader():
            return
        pending = self._rma_pending()
        if pending is not None:  # None: the store is unreachable now
            yield GaugeMetricFamily("rasd_rma_pending", "RMA tickets awaiting an operator's approval.", value=pending)
        yield GaugeMetricFamily(
            "rasd_sdc_suspects",
            "GPUs whose latest SDC mark is an accusation, a failed or a suspect run (no passing run since).",
            value=sdc_suspects(self._sdc_records()),
        )


SMOOTHING_MODES = ("off", "firmware", "emulated")

POWER_LEVELS = ("cluster", "row", "rack")
"""Levels of the budget tree the power gauges cover; nodes are left out (thousands of series, and
rasd_controller_gpu_power_watts already has each GPU)."""


class PowerCollector(Collector):
    """Scrape-time gauges over the power loop's latest period (nothing is paid per period)."""

    def __init__(self, status: Callable[[], power_loop.PowerStatus | None]) -> None:
        """Read the latest `PowerStatus` through a callable (None: no power loop on this replica)."""
        self._status = status

    def collect(self) -> Iterable[Metric]:
        """Yield budget, allocated, target and drawn watts per domain, swing, smoothing and apply gauges."""
        status = self._status()
        if status is None:
            return
        labels = ["domain", "level"]
        budget = GaugeMetricFamily(
            "rasd_power_budget_watts", "Power budget of a domain (domains with one).", labels=labels
        )
        allocated = GaugeMetricFamily(
            "rasd_power_allocated_watts", "Sum of the caps that may be in force in a domain.", labels=labels
        )
        target = GaugeMetricFamily(
            "rasd_power_target_watts", "Sum of this period's target caps in a domain.", labels=labels
        )
        drawn = GaugeMetricFamily("rasd_power_drawn_watts", "Sum of the latest GPU draws in a domain.", labels=labels)
        pending = [status.root] if status.root is not None else []
        while pending:
            domain = pending.pop()
            pending.extend(domain.children)
            if domain.level not in POWER_LEVELS:
                continue
            key = [domain.name, domain.level]
            if domain.budget_w is not None:
                budget.add_metric(key, domain.budget_w)
            allocated.add_metric(key, domain.allocated_w)
            target.add_metric(key, domain.target_w)
            drawn.add_metric(key, domain.drawn_w)
        yield from (budget, allocated, target, drawn)
        if status.swing is not None:
            yield GaugeMetricFamily(
                "rasd_power_swing_p2p_watts",
                "Peak-to-peak swing of aggregate power over the last 10 s.",
                value=status.swing.p2p_w,
            )
        mode = status.smoothing.mode if status.smoothing is not None and status.smoothing.active else "off"
        smoothing = GaugeMetricFamily(
            "rasd_power_smoothing_mode", "1 for the smoothing mode in force (off, firmware, emulated).", labels=["mode"]
        )
        for name in SMOOTHING_MODES:
            smoothing.add_metric([name], 1.0 if name == mode else 0.0)
        yield smoothing
        yield GaugeMetricFamily(
            "rasd_power_stranded_watts",
            "Headroom held by uncapped GPUs while some GPU is capped (sloshing should move it).",
            value=status.stranded_w,
        )
        yield GaugeMetricFamily(
            "rasd_power_unconfirmed_decreases",
            "GPUs whose cap decrease is not confirmed yet (counted at the old cap).",
            value=status.unconfirmed_decreases,
        )
        yield GaugeMetricFamily(
            "rasd_power_over_budget_domains",
            "Domains whose caps that may be in force exceed the budget (only while a cut is enforced).",
            value=len(status.over_budget),
        )
        yield GaugeMetricFamily("rasd_power_periods", "Power control periods run since start.", value=status.periods)
