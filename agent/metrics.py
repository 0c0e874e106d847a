"""The agent's Prometheus exporter: GPU health with dcgm-exporter's labels, plus the agent itself.

A custom collector renders the latest sample at scrape time, so sampling pays nothing for metrics.
ECC, row-remap, retired-page, NVLink, PCIe replay and XID figures are on by default: they are what a
RAS system is for. A counter the GPU does not support is absent, never 0.

Every per-GPU series carries dcgm-exporter's labels with dcgm-exporter's meanings, so `rasd_gpu_*` and
`DCGM_FI_*` series join (`* on (Hostname, gpu) group_left ...`): `gpu` the NVML index, `UUID`,
`pci_bus_id` as NVML prints it, `Hostname` (the NODE_NAME environment variable, else the host name,
as dcgm-exporter takes it) and `modelName`; plus rasd's own `node` (the agent's node id), which the
alert rules and the controller use. The driver's monotonic counts (ECC, energy, retired pages,
remapped rows, PCIe replays, NVLink errors) are counters (`_total`): they fall only when the driver
reloads, which `rate()` reads as a counter reset. Per-link NVLink series are opt-in
(`metrics_nvlink_per_link`): 18 links a GPU would be most of a node's series. docs/metrics.md lists
every series and the count per 8-GPU node.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from rasd.agent.core import model
from rasd.common import exposition

if TYPE_CHECKING:
    from rasd.agent import runtime

GPU_LABELS = ("node", "gpu", "UUID", "pci_bus_id", "Hostname", "modelName")
"""The labels of every per-GPU series: rasd's node id, then dcgm-exporter's names and meanings."""


class AgentCollector(Collector):
    """Scrape-time metrics over the agent's latest samples and counters."""

    def __init__(
        self,
        node_id: str,
        hostname: str,
        inventory: Sequence[model.GpuInfo],
        latest_power: Callable[[], Mapping[str, model.PowerReading]],
        latest_counters: Callable[[], Mapping[str, model.GpuCounters]],
        stats: Callable[[], Mapping[str, float]],
        event_counts: Callable[[], Mapping[tuple[str, str], int]],
        nvlink_per_link: bool = False,
    ) -> None:
        """Read the agent's state through callables (no copies kept here); label GPUs from inventory."""
        self._node = node_id
        self._hostname = hostname
        self._gpu_label_values = {
            g.uuid: (node_id, gpu_index(g, position), g.uuid, g.pci_bus_id, hostname, g.model)
            for position, g in enumerate(inventory)
        }
        self._power = latest_power
        self._counters = latest_counters
        self._stats = stats
        self._event_counts = event_counts
        self._nvlink_per_link = nvlink_per_link

    def collect(self) -> Iterable[Metric]:
        """Yield every metric family: GPU power, the GPU counters, then the agent's own figures."""
        yield self._power_family()
        yield from self._counter_families()
        yield from self._agent_families()

    def _gpu_labels(self, uuid: str) -> tuple[str, ...]:
        # A GPU outside the start-up inventory cannot happen with the backends we have; label it anyway.
        return self._gpu_label_values.get(uuid) or (self._node, "", uuid, "", self._hostname, "")

    def _power_family(self) -> Metric:
        power = GaugeMetricFamily("rasd_gpu_power_watts", "Instant GPU power draw.", labels=GPU_LABELS)
        for uuid, reading in self._power().items():
            power.add_metric(self._gpu_labels(uuid), reading.power_w)
        return power

    def _counter_families(self) -> Iterable[Metric]:
        families: dict[str, Metric] = {}
        for key, (kind, name, doc, extra) in GPU_FAMILIES.items():
            if key in _PER_LINK and not self._nvlink_per_link:
                continue
            family = CounterMetricFamily if kind == "counter" else GaugeMetricFamily
            families[key] = family(name, doc, labels=[*GPU_LABELS, *extra])
        for uuid, counters in self._counters().items():
            base = self._gpu_labels(uuid)
            for key, value, extra in _counter_samples(counters, self._nvlink_per_link):
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


def gpu_index(info: model.GpuInfo, position: int) -> str:
    """dcgm-exporter's `gpu` label: the NVML index the backend read, else the GPU's place in PCI bus order.

    NVML enumerates in PCI bus order unless told otherwise, so the fallback is the index on every node
    we know of; the NVML backend records the index it used, so even an unusual order stays right.
    """
    return info.labels.get("index", str(position))


GPU_FAMILIES: dict[str, tuple[str, str, str, tuple[str, ...]]] = {
    "limit": ("gauge", "rasd_gpu_power_limit_watts", "Enforced GPU power limit.", ()),
    "energy": ("counter", "rasd_gpu_energy_joules", "Energy since the driver loaded.", ()),
    "temp": ("gauge", "rasd_gpu_temperature_celsius", "GPU temperature.", ()),
    "util": ("gauge", "rasd_gpu_utilization_ratio", "GPU utilization, 0..1.", ()),
    "reason": (
        "gauge",
        "rasd_gpu_clock_event_reason",
        "1 while NVML reports this clock event (throttle) reason, else 0.",
        ("reason",),
    ),
    "ecc": ("counter", "rasd_gpu_ecc_errors", "ECC errors (volatile: since the driver loaded).", ("type", "scope")),
    "retired": ("counter", "rasd_gpu_retired_pages", "Retired memory pages.", ("cause",)),
    "retired_pending": ("gauge", "rasd_gpu_retired_pages_pending", "1 if a page retirement awaits a reset.", ()),
    "remapped": ("counter", "rasd_gpu_remapped_rows", "Remapped HBM rows.", ("type",)),
    "remap_pending": ("gauge", "rasd_gpu_remapped_rows_pending", "1 if a row remap awaits a reset.", ()),
    "remap_failure": ("gauge", "rasd_gpu_remapped_rows_failure", "1 if row remapping failed.", ()),
    "pcie": ("counter", "rasd_gpu_pcie_replays", "PCIe replays.", ()),
    "recovery": ("gauge", "rasd_gpu_recovery_action", "NVML GPU recovery action (field 230).", ()),
    "nvl_active": ("gauge", "rasd_gpu_nvlinks_active", "NVLinks active.", ()),
    "nvl_errors": ("counter", "rasd_gpu_nvlink_errors", "NVLink errors, summed over the GPU's links.", ("type",)),
    "link_active": ("gauge", "rasd_gpu_nvlink_link_active", "1 if this NVLink is active (opt-in).", ("link",)),
    "link_errors": ("counter", "rasd_gpu_nvlink_link_errors", "NVLink errors of one link (opt-in).", ("link", "type")),
}
"""The per-GPU families: key -> (type, metric name, help, labels beyond GPU_LABELS), in export order."""

_PER_LINK = frozenset({"link_active", "link_errors"})
"""The families exported only with metrics_nvlink_per_link."""

_Sample = tuple[str, float | int | bool | None, tuple[str, ...]]


def _counter_samples(c: model.GpuCounters, per_link: bool) -> Iterator[_Sample]:
    """(family key, value or None when unsupported, extra label values) for one GPU's counters."""
    yield "limit", c.enforced_power_limit_w, ()
    yield "energy", None if c.total_energy_mj is None else c.total_energy_mj / 1000, ()
    yield "temp", c.temperature_c, ()
    yield "util", None if c.utilization_gpu_pct is None else c.utilization_gpu_pct / 100, ()
    yield from _clock_event_samples(c.clock_event_reasons)
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
    yield from _nvlink_samples(c.nvlinks, per_link)


_NAMED_REASONS = sum(model.ClockEventReason)


def _clock_event_samples(bits: int | None) -> Iterator[_Sample]:
    """One 0/1 sample per named reason, and `other` for any bit rasd does not name (none when unsupported)."""
    if bits is None:
        return
    for reason in model.ClockEventReason:
        yield "reason", int(bool(bits & reason)), (str(reason.name).lower(),)
    yield "reason", int(bool(bits & ~_NAMED_REASONS)), ("other",)


_LINK_ERROR_FIELDS = {"crc": "crc_errors", "replay": "replay_errors", "recovery": "recovery_errors"}
"""NVLink error `type` label value -> its NvLinkCounters field."""


def _nvlink_samples(links: Sequence[model.NvLinkCounters], per_link: bool) -> Iterator[_Sample]:
    """The GPU's active-link count and error sums (a type none of its links supports is absent); per link on request."""
    if not links:
        return
    yield "nvl_active", sum(1 for link in links if link.active), ()
    for error_type, field in _LINK_ERROR_FIELDS.items():
        counts = [getattr(link, field) for link in links]
        supported = [count for count in counts if count is not None]
        yield "nvl_errors", sum(supported) if supported else None, (error_type,)
    if not per_link:
        return
    for link in links:
        yield "link_active", link.active, (str(link.link),)
        for error_type, field in _LINK_ERROR_FIELDS.items():
            yield "link_errors", getattr(link, field), (str(link.link), error_type)


def register(
    registry: CollectorRegistry, agent: runtime.Agent, hostname: str, nvlink_per_link: bool = False
) -> AgentCollector:
    """Build the collector over an agent and register it with `rasd_build_info`, without `_created` series."""
    collector = AgentCollector(
        node_id=agent.identity.node_id,
        hostname=hostname,
        inventory=agent.backend.inventory(),
        latest_power=agent.latest_power,
        latest_counters=agent.latest_counters,
        stats=agent.metric_stats,
        event_counts=agent.event_counts,
        nvlink_per_link=nvlink_per_link,
    )
    exposition.prepare_registry(registry)
    registry.register(collector)
    return collector
