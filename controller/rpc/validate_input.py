"""Hostile-input checks at the edge of AgentService: every field of every AgentMessage, and identity.

Called by the AgentService servicer on each message *before* the ingest sees it (the ingest's own
conversions in ``rasd.controller.wire.agent`` still run after, and stay the source of the conversion rules).
Three outcomes:

* ``wire.WireError(field, problem)``: a malformed field, answered INVALID_ARGUMENT naming the field
  (``events.events[3].seq``). Nothing of that message is applied; everything applied before it stays
  (acks cover only stored, gap-free seqs, so the agent resends nothing that was lost).
* ``IdentityError(field, problem)``: the message speaks for another node than the stream's
  certificate (its Hello names another node, or it reports a GPU another node announced), answered
  PERMISSION_DENIED and counted in ``rasd_identity_rejections``.
* None: the message is well formed.

Rules, for the record: numbers finite and inside physical ranges; enums known and not UNSPECIFIED
where the agent always sets them; GPU ids in NVML UUID form; strings bounded and free of NUL (which
PostgreSQL cannot store); integers that land in signed 64-bit SQL columns below 2**63; every time a
unix time in ns before 2100 (so that no offset or deadline computed from one leaves 64 bits); every
seq and spool position within what a spool can reach (`MAX_SPOOL_SEQ`); repeated fields and maps
bounded (`InputLimits`).

Rate: `TokenBucket` paces each stream's messages. A stream over its rate is not cut: the servicer
waits before reading its next message, so gRPC flow control slows the sender and nothing is lost.
"""

from __future__ import annotations

import dataclasses
import math
import operator
import re
from collections.abc import Iterable, Mapping, Sequence

from rasd.api.v1 import agent_service_pb2 as agent_pb
from rasd.api.v1 import commands_pb2 as commands_pb
from rasd.api.v1 import health_pb2 as health_pb
from rasd.common import vocabulary
from rasd.common.text import echoed
from rasd.controller.wire import agent as wire

INT63 = 2**63 - 1
"""Largest value a signed 64-bit SQL column holds (seqs and times are stored there)."""
MAX_SPOOL_SEQ = 2**40
"""Highest seq an agent's spool can have reached: it numbers its health events one by one from 1, and
2**40 is a thousand events a second for 35 years. A Hello's spool positions and an event's seq above
it are a hostile or corrupt sender (a Hello claiming 2**63 - 1 acked added 9.2e18 to the events lost
by the store and made its later events count as duplicates)."""
MAX_UNIX_NS = 4_102_444_800 * 1_000_000_000
"""2100-01-01: a later timestamp is a corrupt clock or a hostile sender."""
MAX_POWER_W = wire.MAX_POWER_W
MAX_GPUS = wire.MAX_GPUS_PER_NODE
MAX_EVIDENCE_CHARS = 64 * 1024
MAX_ATTRIBUTE_CHARS = 253
MAX_SOURCE_CHARS = 32
UUID_RE = re.compile(r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$")
TOKEN_RE = re.compile(r"^[A-Za-z0-9._:/+-]*$")
"""Identifier-like strings (backend names, check names, verdicts, sources)."""


@dataclasses.dataclass(frozen=True)
class InputLimits:
    """Bounds on one agent stream."""

    max_events_per_batch: int = 1000
    """Health events in one HealthEventBatch (the agent sends at most 500)."""
    max_series_per_batch: int = 4 * MAX_GPUS
    """Power series in one TelemetryBatch."""
    max_counters_per_batch: int = 16 * MAX_GPUS
    """GpuCounters in one TelemetryBatch."""
    max_messages_per_s: float = 200.0
    """Sustained messages per second per stream (an agent sends a few per second)."""
    burst_messages: int = 2000
    """Messages a stream may send at once (a reconnect resends its spool in batches)."""
    hello_timeout_s: float = 30.0
    """How long a new stream may wait before its Hello (an agent sends it at once): a stream that
    never said Hello was held for ever, and 17,000 such were held by one client."""

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            if getattr(self, field.name) <= 0:
                raise ValueError(f"limits.{field.name}: must be > 0")


class IdentityError(Exception):
    """A message speaks for another node (PERMISSION_DENIED); `field` names where."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field


@dataclasses.dataclass(frozen=True)
class StreamIdentity:
    """What a stream may speak for."""

    node_id: str | None
    """The node of the stream's certificate; None on a plaintext controller (nothing to check)."""
    gpu_owners: Mapping[str, str]
    """GPU UUID → the node that announced it (the ingest's view)."""


# -- field helpers ----------------------------------------------------------------------------------
def _text(field: str, value: str, max_len: int, *, pattern: re.Pattern[str] | None = None) -> None:
    if len(value) > max_len:
        raise wire.WireError(field, f"longer than {max_len} characters")
    if "\x00" in value:
        raise wire.WireError(field, "contains a NUL character")
    if pattern is not None and not pattern.match(value):
        raise wire.WireError(field, f"{echoed(value)} has characters outside {pattern.pattern}")


def _gpu_uuid(field: str, value: str, *, required: bool = True) -> None:
    if not value and not required:
        return
    if not wire.GPU_UUID_RE.match(value):
        raise wire.WireError(field, f"{echoed(value)} is not a GPU UUID (GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx)")


def _range(field: str, value: float, lo: float, hi: float) -> None:
    if isinstance(value, float) and not math.isfinite(value):
        raise wire.WireError(field, f"{echoed(value)} is not a finite number")
    if not lo <= value <= hi:
        raise wire.WireError(field, f"{echoed(value)} is outside [{lo:g}, {hi:g}]")


def _time(field: str, value: int) -> None:
    if not 0 <= value <= MAX_UNIX_NS:
        raise wire.WireError(field, f"{value} is not a unix time in ns before 2100")


def _count(field: str, items: Iterable[object] | int, limit: int) -> None:
    n = items if isinstance(items, int) else len(items)  # type: ignore[arg-type]
    if n > limit:
        raise wire.WireError(field, f"{n} entries, more than {limit}")


def _map(field: str, mapping: Mapping[str, str], *, max_entries: int = wire.MAX_LABELS) -> None:
    _count(field, len(mapping), max_entries)
    for key, value in mapping.items():
        _text(f"{field}[{echoed(key, 40)}]", key, MAX_ATTRIBUTE_CHARS)
        _text(f"{field}[{echoed(key, 40)}]", value, MAX_ATTRIBUTE_CHARS)


def _enum(field: str, value: int, enum_type: object, *, allow_unspecified: bool = False) -> None:
    known = set(enum_type.values())  # type: ignore[attr-defined]
    if value not in known or (value == 0 and not allow_unspecified):
        raise wire.WireError(field, f"{value} is not a known {enum_type.DESCRIPTOR.name}")  # type: ignore[attr-defined]


def _owned(field: str, gpu_uuid: str, identity: StreamIdentity) -> None:
    """PERMISSION_DENIED when an authenticated stream names a GPU another node announced."""
    if identity.node_id is None or not gpu_uuid:
        return
    owner = identity.gpu_owners.get(gpu_uuid)
    if owner is not None and owner != identity.node_id:
        raise IdentityError(field, f"GPU {echoed(gpu_uuid)} belongs to node {owner}, not {identity.node_id}")


# -- messages -----------------------------------------------------------------------------------------
def check_hello(hello: agent_pb.Hello, identity: StreamIdentity) -> None:
    """Validate a Hello; with a certificate, it must name the certificate's node and none of another node's GPUs.

    A GPU is another node's while that node's last Hello (on this replica) listed it, connected or
    not: a claim alone never moves a GPU (the store holds the same rule for every replica,
    `repo.GpuClaimRefused`). Before, only a connected node's GPUs were kept, and a Hello naming an
    offline node's GPUs took them.
    """
    if identity.node_id is not None and hello.node_id != identity.node_id:
        raise IdentityError(
            "hello.node_id",
            f"{echoed(hello.node_id)} is not this stream's certificate identity {echoed(identity.node_id)}",
        )
    if not wire.NODE_ID_RE.match(hello.node_id):
        raise wire.WireError("hello.node_id", f"{echoed(hello.node_id)} is not a valid node id")
    _text("hello.boot_id", hello.boot_id, 64, pattern=TOKEN_RE)
    _text("hello.agent_version", hello.agent_version, 64)
    _text("hello.hostname", hello.hostname, 253)
    _text("hello.backend", hello.backend, 32, pattern=TOKEN_RE)
    _time("hello.sent_unix_ns", hello.sent_unix_ns)
    _range("hello.spool_head_seq", hello.spool_head_seq, 0, MAX_SPOOL_SEQ)
    _text("hello.spool_id", hello.spool_id, 64, pattern=TOKEN_RE)
    _range("hello.spool_acked_seq", hello.spool_acked_seq, 0, hello.spool_head_seq)
    _map("hello.labels", hello.labels)
    _count("hello.gpus", hello.gpus, MAX_GPUS)
    for index, gpu in enumerate(hello.gpus):
        field = f"hello.gpus[{index}]"
        _gpu_uuid(f"{field}.uuid", gpu.uuid)
        owner = identity.gpu_owners.get(gpu.uuid)
        if identity.node_id is not None and owner not in (None, identity.node_id):
            raise IdentityError(
                f"{field}.uuid", f"GPU {echoed(gpu.uuid)} belongs to node {owner}, whose last Hello listed it"
            )
        _text(f"{field}.model", gpu.model, 96)
        _text(f"{field}.pci_bus_id", gpu.pci_bus_id, 32)
        _text(f"{field}.serial", gpu.serial, 64)
        _text(f"{field}.vbios_version", gpu.vbios_version, 64)
        _range(f"{field}.memory_total_mib", gpu.memory_total_mib, 0, 16 * 1024 * 1024)
        _range(f"{field}.power_limit_max_w", gpu.power_limit_max_w, 1, MAX_POWER_W)
        _range(f"{field}.power_limit_min_w", gpu.power_limit_min_w, 1, gpu.power_limit_max_w)
        if gpu.power_limit_default_w:
            _range(f"{field}.power_limit_default_w", gpu.power_limit_default_w, 1, gpu.power_limit_max_w)
        _map(f"{field}.labels", gpu.labels)


MAX_PCIE_LANES = 32
"""A PCIe link's lanes at most (x32)."""
MAX_PCIE_GEN = 8
"""A PCIe generation at most (Gen8 is in draft; today's GPUs run Gen5 or Gen6)."""
_COUNTER_RANGES = (
    ("enforced_power_limit_w", 0, MAX_POWER_W),
    ("requested_power_limit_w", 0, MAX_POWER_W),
    ("power_limit_slew_target_w", 0, MAX_POWER_W),
    ("temperature_c", -50, 200),
    ("utilization_gpu_pct", 0, 100),
    ("total_energy_mj", 0, INT63),
    ("ecc_sbe_volatile", 0, INT63),
    ("ecc_dbe_volatile", 0, INT63),
    ("ecc_sbe_aggregate", 0, INT63),
    ("ecc_dbe_aggregate", 0, INT63),
    ("pcie_replay_count", 0, INT63),
    ("recovery_action", 0, 4),
    ("pcie_link_width", 1, MAX_PCIE_LANES),
    ("pcie_link_width_max", 1, MAX_PCIE_LANES),
    ("pcie_link_gen", 1, MAX_PCIE_GEN),
    ("pcie_link_gen_max", 1, MAX_PCIE_GEN),
)
_COUNTER_BOUNDS = {name: (lo, hi) for name, lo, hi in _COUNTER_RANGES}
_LINK_COUNTERS = ("crc_errors", "replay_errors", "recovery_errors")
_MAX_NVLINKS = 64


def telemetry_certainly_valid(batch: health_pb.TelemetryBatch, identity: StreamIdentity, limits: InputLimits) -> bool:
    """True only when `check_telemetry` would accept the batch; decided without naming fields.

    Telemetry is nearly everything a controller reads (a 2,048-node fleet sends 2,048 batches of
    80 power samples a second), and building a field name per sample cost more than the check.
    This mirrors every rule of `check_telemetry` as plain comparisons (NaN fails them all, inf the
    upper bound); on False the full check runs and names the field. A test holds the two to
    "True here implies accepted there".
    """
    if len(batch.power) > limits.max_series_per_batch or len(batch.counters) > limits.max_counters_per_batch:
        return False
    return _series_certainly_valid(batch.power, identity) and _counters_certainly_valid(batch.counters, identity)


def _series_certainly_valid(series_list: Iterable[health_pb.PowerSeries], identity: StreamIdentity) -> bool:
    me = identity.node_id
    owners = identity.gpu_owners
    is_uuid = wire.GPU_UUID_RE.match
    for series in series_list:
        gpu = series.gpu_uuid
        if (me is not None and gpu and owners.get(gpu, me) != me) or not is_uuid(gpu):
            return False
        if not (0 <= series.first_sample_unix_ns <= MAX_UNIX_NS and 1 <= series.sample_interval_ms <= 60_000):
            return False
        samples = series.power_w
        if len(samples) > wire.MAX_SAMPLES_PER_SERIES or not all(0.0 <= w <= MAX_POWER_W for w in samples):
            return False
    return True


def _counters_certainly_valid(counters_list: Iterable[health_pb.GpuCounters], identity: StreamIdentity) -> bool:
    me = identity.node_id
    owners = identity.gpu_owners
    is_uuid = wire.GPU_UUID_RE.match
    for counters in counters_list:
        gpu = counters.gpu_uuid
        if (me is not None and gpu and owners.get(gpu, me) != me) or not is_uuid(gpu):
            return False
        if not (0 <= counters.sample_unix_ns <= MAX_UNIX_NS and 0 <= counters.nvlink_sample_unix_ns <= MAX_UNIX_NS):
            return False
        for descriptor, value in counters.ListFields():  # only the fields that are set: one call
            bounds = _COUNTER_BOUNDS.get(descriptor.name)
            if bounds is not None and not bounds[0] <= value <= bounds[1]:
                return False
        if len(counters.nvlinks) > _MAX_NVLINKS:
            return False
        for link in counters.nvlinks:
            if not 0 <= link.link <= 63:
                return False
            for name in _LINK_COUNTERS:
                if link.HasField(name) and not 0 <= getattr(link, name) <= INT63:
                    return False
    return True


def check_telemetry(batch: health_pb.TelemetryBatch, identity: StreamIdentity, limits: InputLimits) -> None:
    """Validate a telemetry batch (the ingest then checks the GPUs against the node's Hello)."""
    if not telemetry_certainly_valid(batch, identity, limits):
        check_telemetry_fields(batch, identity, limits)


def check_telemetry_fields(batch: health_pb.TelemetryBatch, identity: StreamIdentity, limits: InputLimits) -> None:
    """Every rule for a telemetry batch, field by field; raises naming the first bad field."""
    _count("telemetry.power", batch.power, limits.max_series_per_batch)
    _count("telemetry.counters", batch.counters, limits.max_counters_per_batch)
    _check_series_fields("telemetry.power", batch.power, identity)
    _check_counters_fields("telemetry.counters", batch.counters, identity)


def _check_series_fields(prefix: str, series_list: Iterable[health_pb.PowerSeries], identity: StreamIdentity) -> None:
    for index, series in enumerate(series_list):
        field = f"{prefix}[{index}]"
        _owned(f"{field}.gpu_uuid", series.gpu_uuid, identity)
        _gpu_uuid(f"{field}.gpu_uuid", series.gpu_uuid)
        _time(f"{field}.first_sample_unix_ns", series.first_sample_unix_ns)
        _range(f"{field}.sample_interval_ms", series.sample_interval_ms, 1, 60_000)
        _count(f"{field}.power_w", series.power_w, wire.MAX_SAMPLES_PER_SERIES)
        # Fast path first (NaN fails both comparisons, inf the upper one): the per-sample field
        # name is built only to name a bad sample. Telemetry is most of what a controller reads.
        if not all(0.0 <= watts <= MAX_POWER_W for watts in series.power_w):
            for sample_index, watts in enumerate(series.power_w):
                _range(f"{field}.power_w[{sample_index}]", watts, 0.0, MAX_POWER_W)


def _check_counters_fields(
    prefix: str, counters_list: Iterable[health_pb.GpuCounters], identity: StreamIdentity
) -> None:
    for index, counters in enumerate(counters_list):
        field = f"{prefix}[{index}]"
        _owned(f"{field}.gpu_uuid", counters.gpu_uuid, identity)
        _gpu_uuid(f"{field}.gpu_uuid", counters.gpu_uuid)
        _time(f"{field}.sample_unix_ns", counters.sample_unix_ns)
        _time(f"{field}.nvlink_sample_unix_ns", counters.nvlink_sample_unix_ns)
        for name in ("enforced_power_limit_w", "requested_power_limit_w", "power_limit_slew_target_w"):
            if counters.HasField(name):
                _range(f"{field}.{name}", getattr(counters, name), 0, MAX_POWER_W)
        if counters.HasField("temperature_c"):
            _range(f"{field}.temperature_c", counters.temperature_c, -50, 200)
        if counters.HasField("utilization_gpu_pct"):
            _range(f"{field}.utilization_gpu_pct", counters.utilization_gpu_pct, 0, 100)
        for name in (
            "total_energy_mj", "ecc_sbe_volatile", "ecc_dbe_volatile", "ecc_sbe_aggregate", "ecc_dbe_aggregate",
            "pcie_replay_count",
        ):  # fmt: skip
            if counters.HasField(name):
                _range(f"{field}.{name}", getattr(counters, name), 0, INT63)
        if counters.HasField("recovery_action"):
            # NVML's nvmlDeviceGpuRecoveryAction_t: NONE, GPU_RESET, NODE_REBOOT, DRAIN_P2P, DRAIN_AND_RESET.
            _range(f"{field}.recovery_action", counters.recovery_action, 0, 4)
        for name in ("pcie_link_width", "pcie_link_width_max", "pcie_link_gen", "pcie_link_gen_max"):
            if counters.HasField(name):
                _range(f"{field}.{name}", getattr(counters, name), *_COUNTER_BOUNDS[name])
        _count(f"{field}.nvlinks", counters.nvlinks, 64)
        for link_index, link in enumerate(counters.nvlinks):
            _range(f"{field}.nvlinks[{link_index}].link", link.link, 0, 63)
            for name in ("crc_errors", "replay_errors", "recovery_errors"):
                if link.HasField(name):
                    _range(f"{field}.nvlinks[{link_index}].{name}", getattr(link, name), 0, INT63)


MAX_SUMMARY_SAMPLES = 1_000_000
"""Power samples one GPU summary may stand for (a minute's backlog of a driver buffer is ~3,000)."""
MAX_NODE_POWER_W = MAX_POWER_W * MAX_GPUS
"""A node's summed draw at most."""
_SUMMARY_DRAWS = ("mean_w", "min_w", "max_w", "last_w")
MAX_SUMMARY_EDGES = 8
"""Compute -> communication edges one GPU's summary may carry (the agent sends its newest 8 at most)."""


def _edges(field: str, edges: Sequence[int]) -> None:
    """A GPU's falling edges: at most `MAX_SUMMARY_EDGES`, each a time, strictly in order."""
    _count(field, edges, MAX_SUMMARY_EDGES)
    for index, at in enumerate(edges):
        _time(f"{field}[{index}]", at)
        if at == 0:
            raise wire.WireError(f"{field}[{index}]", "must be a time after the Unix epoch, got 0")
        if index and at <= edges[index - 1]:
            raise wire.WireError(f"{field}[{index}]", f"{at} is not after the edge before it ({edges[index - 1]})")


def summary_certainly_valid(summary: health_pb.TelemetrySummary, identity: StreamIdentity, limits: InputLimits) -> bool:
    """True only when `check_summary` would accept the summary; decided without naming fields (as for telemetry)."""
    if (
        len(summary.gpus) > limits.max_series_per_batch
        or len(summary.full_rate) > limits.max_series_per_batch
        or len(summary.counters) > limits.max_counters_per_batch
    ):
        return False
    me = identity.node_id
    owners = identity.gpu_owners
    is_uuid = wire.GPU_UUID_RE.match
    for gpu in summary.gpus:
        uuid = gpu.gpu_uuid
        if (me is not None and uuid and owners.get(uuid, me) != me) or not is_uuid(uuid):
            return False
        # Chained comparisons, not all() over a generator: this runs for 16,000 GPUs a second on one
        # core. A NaN fails every comparison, as in the full check.
        min_w = gpu.min_w
        if gpu.samples > MAX_SUMMARY_SAMPLES or not 0.0 <= min_w <= gpu.max_w <= MAX_POWER_W:
            return False
        if not (0.0 <= gpu.mean_w <= MAX_POWER_W and 0.0 <= gpu.last_w <= MAX_POWER_W):
            return False
        if not (0 <= gpu.last_sample_unix_ns <= MAX_UNIX_NS and 0 <= gpu.counters_sample_unix_ns <= MAX_UNIX_NS):
            return False
        if gpu.enforced_power_limit_w > MAX_POWER_W or gpu.power_limit_slew_target_w > MAX_POWER_W:
            return False
        if gpu.utilization_gpu_pct > 100 or gpu.clock_event_reasons > INT63:
            return False
        edges = gpu.falling_edge_unix_ns
        if edges and (len(edges) > MAX_SUMMARY_EDGES or not all(map(operator.lt, edges, edges[1:]))):
            return False
        if edges and not 0 < edges[0] <= edges[-1] <= MAX_UNIX_NS:
            return False
    if summary.HasField("node_power"):
        node = summary.node_power
        if not (0 <= node.first_sample_unix_ns <= MAX_UNIX_NS and 1 <= node.sample_interval_ms <= 60_000):
            return False
        watts, gpus = node.power_w, node.gpus
        if len(watts) > wire.MAX_SAMPLES_PER_SERIES or len(gpus) != len(watts):
            return False
        if not all(0.0 <= w <= MAX_NODE_POWER_W for w in watts) or not all(n <= MAX_GPUS for n in gpus):
            return False
    return _series_certainly_valid(summary.full_rate, identity) and _counters_certainly_valid(
        summary.counters, identity
    )


def check_summary(summary: health_pb.TelemetrySummary, identity: StreamIdentity, limits: InputLimits) -> None:
    """Validate a telemetry summary (the ingest then checks the GPUs against the node's Hello)."""
    if not summary_certainly_valid(summary, identity, limits):
        check_summary_fields(summary, identity, limits)


def check_summary_fields(summary: health_pb.TelemetrySummary, identity: StreamIdentity, limits: InputLimits) -> None:
    """Every rule for a telemetry summary, field by field; raises naming the first bad field."""
    _count("summary.gpus", summary.gpus, limits.max_series_per_batch)
    _count("summary.full_rate", summary.full_rate, limits.max_series_per_batch)
    _count("summary.counters", summary.counters, limits.max_counters_per_batch)
    for index, gpu in enumerate(summary.gpus):
        field = f"summary.gpus[{index}]"
        _owned(f"{field}.gpu_uuid", gpu.gpu_uuid, identity)
        _gpu_uuid(f"{field}.gpu_uuid", gpu.gpu_uuid)
        _range(f"{field}.samples", gpu.samples, 0, MAX_SUMMARY_SAMPLES)
        for name in _SUMMARY_DRAWS:
            _range(f"{field}.{name}", getattr(gpu, name), 0.0, MAX_POWER_W)
        _range(f"{field}.max_w", gpu.max_w, gpu.min_w, MAX_POWER_W)
        _time(f"{field}.last_sample_unix_ns", gpu.last_sample_unix_ns)
        _time(f"{field}.counters_sample_unix_ns", gpu.counters_sample_unix_ns)
        _range(f"{field}.enforced_power_limit_w", gpu.enforced_power_limit_w, 0, MAX_POWER_W)
        _range(f"{field}.power_limit_slew_target_w", gpu.power_limit_slew_target_w, 0, MAX_POWER_W)
        _range(f"{field}.utilization_gpu_pct", gpu.utilization_gpu_pct, 0, 100)
        _range(f"{field}.clock_event_reasons", gpu.clock_event_reasons, 0, INT63)
        _edges(f"{field}.falling_edge_unix_ns", gpu.falling_edge_unix_ns)
    if summary.HasField("node_power"):
        node = summary.node_power
        _time("summary.node_power.first_sample_unix_ns", node.first_sample_unix_ns)
        _range("summary.node_power.sample_interval_ms", node.sample_interval_ms, 1, 60_000)
        _count("summary.node_power.power_w", node.power_w, wire.MAX_SAMPLES_PER_SERIES)
        if len(node.gpus) != len(node.power_w):
            raise wire.WireError(
                "summary.node_power.gpus", f"{len(node.gpus)} entries, not one per power_w entry ({len(node.power_w)})"
            )
        for sample_index, watts in enumerate(node.power_w):
            _range(f"summary.node_power.power_w[{sample_index}]", watts, 0.0, MAX_NODE_POWER_W)
        for sample_index, count in enumerate(node.gpus):
            _range(f"summary.node_power.gpus[{sample_index}]", count, 0, MAX_GPUS)
    _check_series_fields("summary.full_rate", summary.full_rate, identity)
    _check_counters_fields("summary.counters", summary.counters, identity)


def check_events(batch: agent_pb.HealthEventBatch, identity: StreamIdentity, limits: InputLimits) -> None:
    """Validate a batch of health events."""
    _count("events.events", batch.events, limits.max_events_per_batch)
    for index, event in enumerate(batch.events):
        field = f"events.events[{index}]"
        _owned(f"{field}.gpu_uuid", event.gpu_uuid, identity)
        _range(f"{field}.seq", event.seq, 1, MAX_SPOOL_SEQ)
        _time(f"{field}.observed_unix_ns", event.observed_unix_ns)
        _enum(f"{field}.kind", event.kind, health_pb.EventKind)
        if event.kind == health_pb.EVENT_KIND_NODE_LOST:
            raise wire.WireError(
                f"{field}.kind", "EVENT_KIND_NODE_LOST is the controller's own verdict, never an agent's"
            )
        _enum(f"{field}.severity", event.severity, health_pb.Severity, allow_unspecified=True)
        _gpu_uuid(f"{field}.gpu_uuid", event.gpu_uuid, required=False)
        if event.HasField("xid"):
            _range(f"{field}.xid", event.xid, 1, vocabulary.XID_MAX)
        _text(f"{field}.message", event.message, wire.MAX_TEXT)
        _text(f"{field}.source", event.source, MAX_SOURCE_CHARS, pattern=TOKEN_RE)
        _map(f"{field}.attributes", event.attributes)
        if event.HasField("kernel_log"):
            _kernel_log(f"{field}.kernel_log", event.kernel_log)


_KERNEL_LOG_TEXTS = ("pci_bus_id", "process_name", "nvlink_subcode", "nvswitch", "ib_device", "ib_state")


def _kernel_log(field: str, facts: health_pb.KernelLogFacts) -> None:
    """Validate the kernel-log facts of an event (the wire types bound the other numbers)."""
    _text(f"{field}.raw", facts.raw, wire.MAX_TEXT)
    for name in _KERNEL_LOG_TEXTS:
        _text(f"{field}.{name}", getattr(facts, name), wire.MAX_FACT_CHARS)
    _count(f"{field}.nvlink_registers", facts.nvlink_registers, wire.MAX_REGISTERS)
    for name in ("pid", "kernel_time_us"):
        if facts.HasField(name):
            _range(f"{field}.{name}", getattr(facts, name), 0, INT63)


def check_result(result: commands_pb.ActionResult, identity: StreamIdentity) -> None:
    """Validate a command result."""
    _text("action_result.command_id", result.command_id, 128, pattern=TOKEN_RE)
    _enum("action_result.outcome", result.outcome, commands_pb.ActionOutcome)
    _enum("action_result.severity", result.severity, health_pb.Severity, allow_unspecified=True)
    _text("action_result.message", result.message, wire.MAX_TEXT)
    _time("action_result.started_unix_ns", result.started_unix_ns)
    _time("action_result.finished_unix_ns", result.finished_unix_ns)
    _text("action_result.validation_verdict", result.validation_verdict, 32, pattern=TOKEN_RE)
    _count("action_result.enforced_limits", result.enforced_limits, MAX_GPUS)
    for index, limit in enumerate(result.enforced_limits):
        field = f"action_result.enforced_limits[{index}]"
        _owned(f"{field}.gpu_uuid", limit.gpu_uuid, identity)
        _gpu_uuid(f"{field}.gpu_uuid", limit.gpu_uuid)
        _range(f"{field}.power_limit_w", limit.power_limit_w, 0, MAX_POWER_W)
    _count("action_result.verdicts", result.verdicts, 64 * MAX_GPUS)
    for index, verdict in enumerate(result.verdicts):
        field = f"action_result.verdicts[{index}]"
        _owned(f"{field}.gpu_uuid", verdict.gpu_uuid, identity)
        _gpu_uuid(f"{field}.gpu_uuid", verdict.gpu_uuid, required=False)
        _text(f"{field}.check", verdict.check, 64, pattern=TOKEN_RE)
        _text(f"{field}.verdict", verdict.verdict, 32, pattern=TOKEN_RE)
        _text(f"{field}.evidence", verdict.evidence, MAX_EVIDENCE_CHARS)
        _range(f"{field}.duration_s", verdict.duration_s, 0.0, 7 * 86_400.0)


def check_heartbeat(heartbeat: agent_pb.Heartbeat) -> None:
    """Validate a heartbeat."""
    _time("heartbeat.sent_unix_ns", heartbeat.sent_unix_ns)
    _range("heartbeat.spool_depth", heartbeat.spool_depth, 0, INT63)


def check_message(message: agent_pb.AgentMessage, identity: StreamIdentity, limits: InputLimits) -> str:
    """Validate one non-first message of a stream; returns its payload kind.

    Raises:
        wire.WireError: a malformed field (INVALID_ARGUMENT).
        IdentityError: the message speaks for another node (PERMISSION_DENIED).
    """
    kind = message.WhichOneof("payload")
    if kind == "telemetry":
        check_telemetry(message.telemetry, identity, limits)
    elif kind == "summary":
        check_summary(message.summary, identity, limits)
    elif kind == "events":
        check_events(message.events, identity, limits)
    elif kind == "action_result":
        check_result(message.action_result, identity)
    elif kind == "heartbeat":
        check_heartbeat(message.heartbeat)
    elif kind == "hello":
        raise wire.WireError("hello", "Hello may only be the first message of a stream")
    else:
        raise wire.WireError("payload", "empty or unknown payload")
    return kind


@dataclasses.dataclass
class TokenBucket:
    """Message pacing for one stream: `delay(now_s)` says how long to wait before the next read."""

    rate_per_s: float
    burst: float
    tokens: float = -1.0
    last_s: float | None = None

    def delay(self, now_s: float) -> float:
        """Take one token; the seconds to wait until it would have been there (0 when in budget)."""
        if self.last_s is None:
            self.tokens = self.burst
        else:
            self.tokens = min(self.burst, self.tokens + (now_s - self.last_s) * self.rate_per_s)
        self.last_s = now_s
        self.tokens -= 1.0
        return 0.0 if self.tokens >= 0 else -self.tokens / self.rate_per_s
