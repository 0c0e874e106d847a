"""The agent's Prometheus exporter: GPU health as DCGM-exporter would show it, plus the agent itself.

A custom collector renders the latest sample at scrape time, so sampling pays nothing for metrics.
ECC, row-remap, retired-page, NVLink, PCIe replay and XID figures are on by default: they are what a
RAS system is for. Counter-like GPU values are exported as gauges (as DCGM does) because the driver
resets them (volatile counts on reboot); rasd's own monotonic counts are counters. A counter the GPU
does not support is absent, never 0.

Metric names (labels `node`, `gpu` = UUID, and `pci` on every GPU metric):
  rasd_gpu_power_watts, rasd_gpu_power_limit_watts, rasd_gpu_energy_joules, rasd_gpu_temperature_celsius,
  rasd_gpu_utilization_ratio, rasd_gpu_clock_event_reasons (bitmask),
  rasd_gpu_ecc_errors{type=sbe|dbe, scope=volatile|aggregate}, rasd_gpu_retired_pages{cause=sbe|dbe},
  rasd_gpu_retired_pages_pending, rasd_gpu_remapped_rows{type=correctable|uncorrectable},
  rasd_gpu_remapped_rows_pending, rasd_gpu_remapped_rows_failure, rasd_gpu_pcie_replays,
  rasd_gpu_recovery_action, rasd_gpu_nvlink_active{link}, rasd_gpu_nvlink_errors{link, type=crc|replay|recovery};
  rasd_agent_health_events_total{kind}, rasd_agent_xid_events_total{xid}, rasd_agent_spool_depth,
  rasd_agent_controller_connected, rasd_agent_power_samples_total, rasd_agent_failsafe_applied_total.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from rasd.agent.core import model

if TYPE_CHECKING:
    from rasd.agent import runtime


class AgentCollector(Collector):
    """Scrape-time metrics over the agent's latest samples and counters."""

    def __init__(
        self,
        node_id: str,
        inventory: Sequence[model.GpuInfo],
        latest_power: Callable[[], Mapping[str, model.PowerReading]],
        latest_counters: Callable[[], Mapping[str, model.GpuCounters]],
        stats: Callable[[], Mapping[str, float]],
        event_counts: Callable[[], Mapping[tuple[str, str], int]],
    ) -> None:
        """Read the agent's state through callables (no copies kept here)."""
        self._node = node_id
        self._pci = {g.uuid: g.pci_bus_id for g in inventory}
        self._power = latest_power
        self._counters = latest_counters
        self._stats = stats
        self._event_counts = event_counts

    def collect(self) -> Iterable[Metric]:
        """Yield every metric family: GPU power, the GPU counters, then the agent's own figures."""
        yield self._power_family()
        yield from self._counter_families()
        yield from self._agent_families()

    def _gpu_labels(self, uuid: str) -> list[str]:
        return [self._node, uuid, self._pci.get(uuid, "")]

    def _power_family(self) -> Metric:
        power = GaugeMetricFamily("rasd_gpu_power_watts", "Instant GPU power draw.", labels=_GPU_LABELS)
        for uuid, reading in self._power().items():
            power.add_metric(self._gpu_labels(uuid), reading.power_w)
        return power

    def _counter_families(self) -> Iterable[Metric]:
        families = {
            key: GaugeMetricFamily(name, doc, labels=[*_GPU_LABELS, *extra])
            for key, (name, doc, extra) in _COUNTER_FAMILIES.items()
        }
        for uuid, counters in self._counters().items():
            base = self._gpu_labels(uuid)
            for key, value, extra in _counter_samples(counters):
                if value is not None:  # unsupported: absent, never 0
                    families[key].add_metric([*base, *extra], float(value))
        return families.values()

    def _agent_families(self) -> Iterable[Metric]:
        stats = self._stats()
        events = CounterMetricFamily(
            "rasd_agent_health_events", "Health events spooled, by kind.", labels=["node", "kind"]
        )
        xids = CounterMetricFamily("rasd_agent_xid_events", "XID events spooled, by XID.", labels=["node", "xid"])
        for (kind, xid), count in sorted(self._event_counts().items()):
            if kind == "XID":
                xids.add_metric([self._node, xid], count)
            events.add_metric([self._node, kind], count)
        yield events
        yield xids
        depth = GaugeMetricFamily("rasd_agent_spool_depth", "Events waiting for the controller's ack.", labels=["node"])
        depth.add_metric([self._node], stats["spool_depth"])
        yield depth
        connected = GaugeMetricFamily("rasd_agent_controller_connected", "1 while the stream is up.", labels=["node"])
        connected.add_metric([self._node], stats["connected"])
        yield connected
        samples = CounterMetricFamily("rasd_agent_power_samples", "Power samples taken.", labels=["node"])
        samples.add_metric([self._node], stats["power_samples"])
        yield samples
        failsafe = CounterMetricFamily(
            "rasd_agent_failsafe_applied", "GPU caps lowered by the fail-safe.", labels=["node"]
        )
        failsafe.add_metric([self._node], stats["failsafe_applied"])
        yield failsafe


_GPU_LABELS = ["node", "gpu", "pci"]

_COUNTER_FAMILIES: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "limit": ("rasd_gpu_power_limit_watts", "Enforced GPU power limit.", ()),
    "energy": ("rasd_gpu_energy_joules", "Energy since the driver loaded.", ()),
    "temp": ("rasd_gpu_temperature_celsius", "GPU temperature.", ()),
    "util": ("rasd_gpu_utilization_ratio", "GPU utilization, 0..1.", ()),
    "reasons": ("rasd_gpu_clock_event_reasons", "NVML clock event reasons bitmask.", ()),
    "ecc": ("rasd_gpu_ecc_errors", "ECC error counts.", ("type", "scope")),
    "retired": ("rasd_gpu_retired_pages", "Retired memory pages.", ("cause",)),
    "retired_pending": ("rasd_gpu_retired_pages_pending", "1 if a page retirement awaits a reset.", ()),
    "remapped": ("rasd_gpu_remapped_rows", "Remapped HBM rows.", ("type",)),
    "remap_pending": ("rasd_gpu_remapped_rows_pending", "1 if a row remap awaits a reset.", ()),
    "remap_failure": ("rasd_gpu_remapped_rows_failure", "1 if row remapping failed.", ()),
    "pcie": ("rasd_gpu_pcie_replays", "PCIe replay counter.", ()),
    "recovery": ("rasd_gpu_recovery_action", "NVML GPU recovery action (field 230).", ()),
    "nvl_active": ("rasd_gpu_nvlink_active", "1 if the NVLink is active.", ("link",)),
    "nvl_errors": ("rasd_gpu_nvlink_errors", "NVLink error counters.", ("link", "type")),
}
"""The GPU counter gauges: key -> (metric name, help, labels beyond node, gpu and pci), in export order."""

_Sample = tuple[str, float | int | bool | None, tuple[str, ...]]


def _counter_samples(c: model.GpuCounters) -> Iterator[_Sample]:
    """(family key, value or None when unsupported, extra label values) for one GPU's counters."""
    yield "limit", c.enforced_power_limit_w, ()
    yield "energy", None if c.total_energy_mj is None else c.total_energy_mj / 1000, ()
    yield "temp", c.temperature_c, ()
    yield "util", None if c.utilization_gpu_pct is None else c.utilization_gpu_pct / 100, ()
    yield "reasons", c.clock_event_reasons, ()
    yield "ecc", c.ecc_sbe_volatile, ("sbe", "volatile")
    yield "ecc", c.ecc_dbe_volatile, ("dbe", "volatile")
    yield "ecc", c.ecc_sbe_aggregate, ("sbe", "aggregate")
    yield "ecc", c.ecc_dbe_aggregate, ("dbe", "aggregate")
    yield "retired", c.retired_pages_sbe, ("sbe",)
    yield "retired", c.retired_pages_dbe, ("dbe",)
    yield "retired_pending", c.retired_pages_pending, ()
    yield "remapped", c.remapped_rows_correctable, ("correctable",)
    yield "remapped", c.remapped_rows_uncorrectable, ("uncorrectable",)
    yield "remap_pending", c.remapped_rows_pending, ()
    yield "remap_failure", c.remapped_rows_failure, ()
    yield "pcie", c.pcie_replay_count, ()
    yield "recovery", c.recovery_action, ()
    for link in c.nvlinks:
        yield "nvl_active", link.active, (str(link.link),)
        yield "nvl_errors", link.crc_errors, (str(link.link), "crc")
        yield "nvl_errors", link.replay_errors, (str(link.link), "replay")
        yield "nvl_errors", link.recovery_errors, (str(link.link), "recovery")


def register(registry: CollectorRegistry, agent: runtime.Agent) -> AgentCollector:
    """Build the collector over an agent and register it."""
    collector = AgentCollector(
        node_id=agent.identity.node_id,
        inventory=agent.backend.inventory(),
        latest_power=agent.latest_power,
        latest_counters=agent.latest_counters,
        stats=agent.metric_stats,
        event_counts=agent.event_counts,
    )
    registry.register(collector)
    return collector
