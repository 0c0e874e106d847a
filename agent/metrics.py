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

from collections.abc import Callable, Iterable, Mapping, Sequence
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
        """Yield every metric family."""
        labels = ["node", "gpu", "pci"]

        def gauge(name: str, doc: str, extra: Sequence[str] = ()) -> GaugeMetricFamily:
            return GaugeMetricFamily(name, doc, labels=[*labels, *extra])

        power = gauge("rasd_gpu_power_watts", "Instant GPU power draw.")
        for uuid, reading in self._power().items():
            power.add_metric([self._node, uuid, self._pci.get(uuid, "")], reading.power_w)
        yield power

        families = {
            "limit": gauge("rasd_gpu_power_limit_watts", "Enforced GPU power limit."),
            "energy": gauge("rasd_gpu_energy_joules", "Energy since the driver loaded."),
            "temp": gauge("rasd_gpu_temperature_celsius", "GPU temperature."),
            "util": gauge("rasd_gpu_utilization_ratio", "GPU utilization, 0..1."),
            "reasons": gauge("rasd_gpu_clock_event_reasons", "NVML clock event reasons bitmask."),
            "ecc": gauge("rasd_gpu_ecc_errors", "ECC error counts.", ("type", "scope")),
            "retired": gauge("rasd_gpu_retired_pages", "Retired memory pages.", ("cause",)),
            "retired_pending": gauge("rasd_gpu_retired_pages_pending", "1 if a page retirement awaits a reset."),
            "remapped": gauge("rasd_gpu_remapped_rows", "Remapped HBM rows.", ("type",)),
            "remap_pending": gauge("rasd_gpu_remapped_rows_pending", "1 if a row remap awaits a reset."),
            "remap_failure": gauge("rasd_gpu_remapped_rows_failure", "1 if row remapping failed."),
            "pcie": gauge("rasd_gpu_pcie_replays", "PCIe replay counter."),
            "recovery": gauge("rasd_gpu_recovery_action", "NVML GPU recovery action (field 230)."),
            "nvl_active": gauge("rasd_gpu_nvlink_active", "1 if the NVLink is active.", ("link",)),
            "nvl_errors": gauge("rasd_gpu_nvlink_errors", "NVLink error counters.", ("link", "type")),
        }
        for uuid, c in self._counters().items():
            base = [self._node, uuid, self._pci.get(uuid, "")]

            def put(key: str, value: float | int | bool | None, *extra: str, base: list[str] = base) -> None:
                if value is not None:
                    families[key].add_metric([*base, *extra], float(value))

            put("limit", c.enforced_power_limit_w)
            put("energy", None if c.total_energy_mj is None else c.total_energy_mj / 1000)
            put("temp", c.temperature_c)
            put("util", None if c.utilization_gpu_pct is None else c.utilization_gpu_pct / 100)
            put("reasons", c.clock_event_reasons)
            put("ecc", c.ecc_sbe_volatile, "sbe", "volatile")
            put("ecc", c.ecc_dbe_volatile, "dbe", "volatile")
            put("ecc", c.ecc_sbe_aggregate, "sbe", "aggregate")
            put("ecc", c.ecc_dbe_aggregate, "dbe", "aggregate")
            put("retired", c.retired_pages_sbe, "sbe")
            put("retired", c.retired_pages_dbe, "dbe")
            put("retired_pending", c.retired_pages_pending)
            put("remapped", c.remapped_rows_correctable, "correctable")
            put("remapped", c.remapped_rows_uncorrectable, "uncorrectable")
            put("remap_pending", c.remapped_rows_pending)
            put("remap_failure", c.remapped_rows_failure)
            put("pcie", c.pcie_replay_count)
            put("recovery", c.recovery_action)
            for link in c.nvlinks:
                put("nvl_active", link.active, str(link.link))
                put("nvl_errors", link.crc_errors, str(link.link), "crc")
                put("nvl_errors", link.replay_errors, str(link.link), "replay")
                put("nvl_errors", link.recovery_errors, str(link.link), "recovery")
        yield from families.values()

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
