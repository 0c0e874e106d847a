"""Prometheus metrics of the controller. The registry is injected; nothing uses the global one.

Per-GPU gauges are computed at scrape time from the ingest's in-memory latest telemetry by a custom
collector, so ingest pays nothing per sample for them.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from rasd.controller.core import fleet

_INDEX_RE = re.compile(r"\[[^\]]*\]")


class ControllerMetrics:
    """Counters and gauges the ingest and RPC layers update."""

    def __init__(self, registry: CollectorRegistry) -> None:
        """Register every metric on registry."""
        self.registry = registry
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
        self.wire_rejections = Counter(
            "rasd_wire_rejections",
            "Agent messages rejected as INVALID_ARGUMENT, by field (indices removed).",
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
        self.event_persist_seconds = Histogram(
            "rasd_event_persist_seconds",
            "Time from receiving a health-event batch to its ack being queued.",
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1),
            registry=registry,
        )

        self.incidents = Counter(
            "rasd_incidents",
            "New incidents, by cause (fault key) and component.",
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
            "From a health event stored to the first command it caused being dispatched.",
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1, 5, 30),
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
        self.automation_paused = Gauge(
            "rasd_automation_paused", "1 while an operator has paused automation.", registry=registry
        )
        self.quarantined = Gauge(
            "rasd_quarantined", "Active quarantines, by scope (node, gpu, port).", ["scope"], registry=registry
        )

    def rejected(self, field: str) -> None:
        """Count a rejected message under its field with list indices stripped (bounded labels)."""
        self.wire_rejections.labels(field=_INDEX_RE.sub("[]", field)).inc()


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
        """Yield per-GPU power gauges, the fleet total and nodes by state."""
        power = GaugeMetricFamily("rasd_gpu_power_watts", "Latest GPU power draw.", labels=["node", "gpu"])
        limit = GaugeMetricFamily("rasd_gpu_power_limit_watts", "Enforced GPU power limit.", labels=["node", "gpu"])
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
