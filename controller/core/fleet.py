"""The controller's view of the fleet: nodes, GPUs, their latest telemetry, and fleet power.

Pure: no I/O, no logging, no clock reads. The time comes in as `now_s` (Unix seconds); stored and wire
timestamps keep their unit in their names (`*_unix_ns`).

`PowerWindow` keeps the fleet's aggregate draw in fixed time buckets (100 ms by default) for a
bounded span: the "controller memory window" of DESIGN.md §7 that the swing detector and the
simulator's report read. High-rate series never go to SQL.
"""

from __future__ import annotations

import array
import bisect
import collections
import dataclasses
import enum
import functools
import typing
from collections.abc import Iterable, Mapping, Sequence

from rasd.common.vocabulary import GpuInfo


class ComponentState(enum.IntEnum):
    """Lifecycle state of a node or GPU; values match rasd.api.v1.ComponentState."""

    UNSPECIFIED = 0
    HEALTHY = 1
    DEGRADED = 2
    REPAIRING = 3
    QUARANTINED = 4
    VALIDATING = 5
    RMA = 6
    OFFLINE = 7


# States an operator or the repair ladder set; losing the stream does not override them.
STICKY_STATES = frozenset(
    {ComponentState.REPAIRING, ComponentState.QUARANTINED, ComponentState.VALIDATING, ComponentState.RMA}
)


def effective_node_state(stored: ComponentState, *, connected: bool) -> ComponentState:
    """The state to show for a node: repair states stick; otherwise no stream means OFFLINE.

    Example: stored HEALTHY, connected False -> OFFLINE; stored QUARANTINED, connected False ->
    QUARANTINED (a quarantined node that reboots must not look merely offline).
    """
    if stored in STICKY_STATES:
        return stored
    if not connected:
        return ComponentState.OFFLINE
    return ComponentState.HEALTHY if stored in (ComponentState.UNSPECIFIED, ComponentState.OFFLINE) else stored


@dataclasses.dataclass(frozen=True, kw_only=True)
class GpuRecord(GpuInfo):
    """A GPU as inventoried in its node's Hello: its identity (`rasd.common.vocabulary.GpuInfo`) and its node."""

    node_id: str


@dataclasses.dataclass(frozen=True)
class NodeHello:
    """What a node said about itself when its stream opened."""

    node_id: str
    boot_id: str
    agent_version: str
    hostname: str
    backend: str
    labels: Mapping[str, str]
    gpus: tuple[GpuRecord, ...]
    spool_head_seq: int
    spool_id: str = ""
    """The spool's identity ("" from agents that do not send one); a new one is a new spool epoch."""
    spool_acked_seq: int = 0
    """The highest seq the agent's spool has had acked and dropped (0: not sent)."""
    summaries_offered: bool = False
    """The agent can send telemetry summaries (its Hello lists TELEMETRY_FORMAT_SUMMARY)."""


class PcieLink(typing.NamedTuple):
    """A GPU's PCIe link now and at its best: lanes and generation (a current below its max: trained down)."""

    width: int
    width_max: int
    gen: int
    gen_max: int

    @property
    def downtrained(self) -> bool:
        """Fewer lanes or a lower generation than the link's best (the generation also drops at idle)."""
        return self.width < self.width_max or self.gen < self.gen_max


class GpuLatest(typing.NamedTuple):
    """The freshest telemetry of one GPU. None means not reported (yet, or unsupported).

    A NamedTuple, not a dataclass: the controller builds one per GPU per second (a summary's reading,
    then the merged one that stays in the view) and the leader one per GPU of every replica's
    aggregate it decodes, 100,000 a period at fleet scale. A tuple built from its values in field
    order (`latest_rows`, `_merge`) costs a fifth of a frozen dataclass's ``__init__``, which sets
    each field through ``object.__setattr__``, and takes less memory (no instance dict).
    """

    power_w: float | None = None
    power_sample_unix_ns: int = 0
    enforced_power_limit_w: int | None = None
    temperature_c: int | None = None
    utilization_gpu_pct: int | None = None
    clock_event_reasons: int | None = None
    counters_unix_ns: int = 0
    power_smoothing_enabled: bool | None = None
    """Whether the GPU's power-smoothing profile is on (None: no such hardware, or not reported)."""
    power_limit_slew_target_w: int | None = None
    """The target of a raise the agent was still moving when the counters were read (None: none):
    the limit gets there without another command (`rasd.agent.core.cap_slew`)."""
    pcie_link: PcieLink | None = None
    """The PCIe link as of the counters that last carried it (None: not reported)."""


LATEST_FIELDS: tuple[str, ...] = GpuLatest._fields
"""`GpuLatest`'s fields, in order."""

latest_row: typing.Callable[[Iterable[typing.Any]], GpuLatest] = GpuLatest._make
"""The `GpuLatest` of a row of every field's value, in `LATEST_FIELDS` order (a row of another length
raises TypeError): the hot paths' constructor, a third of the keyword constructor's cost."""


def latest_rows(columns: Sequence[Sequence[typing.Any]]) -> list[GpuLatest]:
    """A `GpuLatest` per row of columns: one column per field, in `LATEST_FIELDS` order, all of one length.

    For bulk reads: the leader decodes 100,000 GPUs' readings from the other replicas each power
    period. The rows are built by C code alone (`tuple.__new__` mapped over the zipped columns),
    without a Python call per row as `latest_row` makes: half the time.

    Raises:
        ValueError: not one column per field, or columns of different lengths.
    """
    if len(columns) != len(LATEST_FIELDS):
        raise ValueError(f"{len(columns)} columns for the {len(LATEST_FIELDS)} fields of a GpuLatest")
    return list(map(_new_latest, zip(*columns, strict=True)))


_new_latest = functools.partial(tuple.__new__, GpuLatest)


def merge_latest(previous: GpuLatest | None, update: GpuLatest) -> GpuLatest:
    """Combine a new partial reading with what was known: newer timestamps win, per family.

    Power and counters arrive at different rates and can be reordered after a reconnect, so each
    family keeps its own timestamp and an older message never overwrites a newer value.
    """
    return _merge(previous, update, keep_unsent=False)


def merge_summary(previous: GpuLatest | None, update: GpuLatest) -> GpuLatest:
    """`merge_latest` for a telemetry summary's values, which carry no temperature, smoothing or PCIe state.

    A summary brings a GPU's draw and its power-loop counters (limit, slew target, clock event
    reasons, utilisation) every second, and its counters whole only when they changed: a temperature
    or smoothing state it does not bring stays as it was.
    """
    return _merge(previous, update, keep_unsent=True)


def _merge(previous: GpuLatest | None, update: GpuLatest, *, keep_unsent: bool) -> GpuLatest:
    """`merge_latest`, and with keep_unsent `merge_summary`: one value built (this runs per GPU per second)."""
    if previous is None:
        return update
    power_newer = update.power_sample_unix_ns >= previous.power_sample_unix_ns and update.power_w is not None
    counters_newer = update.counters_unix_ns >= previous.counters_unix_ns and update.counters_unix_ns > 0
    temperature_c, smoothing = update.temperature_c, update.power_smoothing_enabled
    if not counters_newer or (keep_unsent and temperature_c is None):
        temperature_c = previous.temperature_c
    if not counters_newer or (keep_unsent and smoothing is None):
        smoothing = previous.power_smoothing_enabled
    pcie_link = update.pcie_link
    if not counters_newer or (keep_unsent and pcie_link is None):
        pcie_link = previous.pcie_link
    update_counters = update if counters_newer else previous
    power = update if power_newer else previous
    # In `LATEST_FIELDS` order (the tests compare the merge with readings built by keyword).
    return latest_row(
        (
            power.power_w,
            power.power_sample_unix_ns,
            update_counters.enforced_power_limit_w,
            temperature_c,
            update_counters.utilization_gpu_pct,
            update_counters.clock_event_reasons,
            update_counters.counters_unix_ns,
            smoothing,
            update_counters.power_limit_slew_target_w,
            pcie_link,
        )
    )


def drop_stale_power(latest: GpuLatest, *, now_s: float, stale_after_s: float) -> GpuLatest:
    """Forget a power reading older than stale_after_s: a GPU that stopped reporting draws unknown.

    Example: a GPU that fell off the bus 30 s ago last reported 650 W; showing 650 W forever would
    hide it, so its draw becomes None (unknown) while its cap stays what it was.
    """
    if latest.power_w is None or now_s - latest.power_sample_unix_ns / 1e9 <= stale_after_s:
        return latest
    return latest._replace(power_w=None)


@dataclasses.dataclass(frozen=True)
class GpuStatus:
    """A GPU for display: inventory, state and latest telemetry."""

    record: GpuRecord
    state: ComponentState
    latest: GpuLatest


@dataclasses.dataclass(frozen=True)
class NodeStatus:
    """A node for display, with totals over its GPUs."""

    node_id: str
    state: ComponentState
    connected: bool
    last_seen_unix_ns: int
    boot_id: str
    agent_version: str
    backend: str
    hostname: str
    labels: Mapping[str, str]
    gpus: tuple[GpuStatus, ...]

    @property
    def power_draw_w(self) -> float:
        """Sum of the GPUs' latest draw (GPUs with no reading count as 0)."""
        return sum(g.latest.power_w or 0.0 for g in self.gpus)

    @property
    def power_cap_w(self) -> int:
        """Sum of the GPUs' enforced caps; a GPU with no reading yet counts at its default limit."""
        return sum(
            g.latest.enforced_power_limit_w
            if g.latest.enforced_power_limit_w is not None
            else g.record.power_limit_default_w
            for g in self.gpus
        )


def matches_selector(labels: Mapping[str, str], selector: Mapping[str, str]) -> bool:
    """True when every selector pair is present in labels."""
    return all(labels.get(key) == value for key, value in selector.items())


class PowerWindow:
    """Fleet power in fixed buckets over a bounded span, and each GPU's recent peak.

    Memory is O(buckets + sources), not O(buckets × GPUs): a bucket keeps the fleet's sum and the
    number of GPUs in it (16,384 GPUs at 10 Hz over 600 s would otherwise be 98 M entries).

    What comes in, by the agent's telemetry format:

    * every sample of every GPU (`add`, from `TelemetryBatch`): each GPU is a source that counts
      once per bucket;
    * a node's summed draw per bucket (`add_node`, from `TelemetrySummary`): the node is a source
      that counts as the GPUs its sum is over; and each GPU's peak per summary (`add_peak`);
    * the full series of a tracked GPU (`add_tracked`): into the tracked sums only, since its node's
      sum holds it already.

    Each source contributes at most one value per bucket, its latest, so the bucket total is the
    fleet's draw at that instant even when agents' sampling clocks drift against the grid. A
    source's values are taken in time order: one for a bucket before the source's newest (a
    duplicate after a reconnect, or a reordered old batch) is dropped, so nothing is counted twice;
    a late value is lost from the aggregate, never misplaced. Per GPU, the peak of each series (or
    summary) it sent is kept for ``detail_s`` for `gpu_max_w`. A small set of GPUs can also be
    summed on their own (`track`, `series(tracked=True)`): the power loop's canaries, whose draw
    shows the swing that smoothing profiles mask on every other GPU. Not thread-safe; the ingest
    owns one.
    """

    def __init__(self, bucket_ms: int = 100, span_s: float = 600.0, detail_s: float = 30.0) -> None:
        """Keep span_s seconds of bucket_ms buckets, and detail_s seconds of per-GPU peaks."""
        if bucket_ms <= 0 or span_s <= 0 or detail_s <= 0:
            raise ValueError("bucket_ms, span_s and detail_s must be positive")
        self.bucket_ns = bucket_ms * 1_000_000
        self._max_buckets = int(span_s * 1000 / bucket_ms)
        self._detail_buckets = max(1, int(detail_s * 1000 / bucket_ms))
        self._sums: dict[int, list[float]] = {}
        """bucket → [sum W, GPUs]"""
        self._order: collections.deque[int] = collections.deque()
        """Buckets in the order they first appeared (nearly time order), for trimming."""
        self._newest = 0
        self._last: dict[object, tuple[int, float, int]] = {}
        """Source (a GPU uuid, ("node", id) or ("tracked", uuid)) → (its newest bucket, the W and GPUs it put there)."""
        self._peaks: dict[str, tuple[array.array[int], array.array[float]]] = {}
        """GPU → (last buckets of its series in order, the series' peak W), for ``detail_s``. Two flat
        arrays rather than a deque of (bucket, W) tuples: a fifth of the bytes per GPU, no object per
        series, and `gpu_max_w` finds its start by bisection."""
        self._tracked: frozenset[str] = frozenset()
        self._tracked_sums: dict[int, list[float]] = {}
        """bucket → [sum W, GPUs] of the tracked GPUs alone."""

    @property
    def tracked(self) -> frozenset[str]:
        """The GPUs summed on their own (`track`)."""
        return self._tracked

    def track(self, gpu_uuids: Iterable[str]) -> None:
        """Sum these GPUs on their own from now on (`series(tracked=True)`), forgetting any set tracked before."""
        tracked = frozenset(gpu_uuids)
        if tracked != self._tracked:
            self._tracked, self._tracked_sums = tracked, {}

    def add(self, gpu_uuid: str, first_sample_unix_ns: int, interval_ms: int, power_w: Sequence[float]) -> int:
        """Record one GPU's packed series (every sample); returns how many samples were kept."""
        tracked = self._tracked_sums if gpu_uuid in self._tracked else None
        kept, peak, last_bucket = self._add_series(
            gpu_uuid, first_sample_unix_ns, interval_ms, power_w, None, self._sums, tracked
        )
        if kept:
            self._note_peak(gpu_uuid, last_bucket, peak)
        return kept

    def add_node(
        self,
        node_id: str,
        first_sample_unix_ns: int,
        interval_ms: int,
        power_w: Sequence[float],
        gpus: Sequence[int],
    ) -> int:
        """Record a node's summed draw per bucket (power_w[i] over gpus[i] GPUs); returns the buckets kept.

        A value over no GPU is skipped.
        """
        kept, _, _ = self._add_series(("node", node_id), first_sample_unix_ns, interval_ms, power_w, gpus, self._sums)
        return kept

    def add_peak(self, gpu_uuid: str, last_sample_unix_ns: int, max_w: float) -> None:
        """One GPU's peak over a summary whose last sample was at last_sample_unix_ns (`gpu_max_w`)."""
        bucket = last_sample_unix_ns // self.bucket_ns
        if bucket > self._newest - self._max_buckets:
            self._note_peak(gpu_uuid, bucket, max_w)

    def add_tracked(self, gpu_uuid: str, first_sample_unix_ns: int, interval_ms: int, power_w: Sequence[float]) -> int:
        """Record a tracked GPU's full series into the tracked sums alone; 0 for a GPU not tracked."""
        if gpu_uuid not in self._tracked:
            return 0
        kept, _, _ = self._add_series(
            ("tracked", gpu_uuid), first_sample_unix_ns, interval_ms, power_w, None, None, self._tracked_sums
        )
        return kept

    def _add_series(
        self,
        source: object,
        first_sample_unix_ns: int,
        interval_ms: int,
        power_w: Sequence[float],
        gpus: Sequence[int] | None,
        sums: dict[int, list[float]] | None,
        tracked: dict[int, list[float]] | None = None,
    ) -> tuple[int, float, int]:
        """Add one source's evenly spaced values to sums (and tracked); (values kept, their peak W, last bucket)."""
        if interval_ms <= 0 or not power_w:
            return 0, -1.0, -1
        step_ns = interval_ms * 1_000_000
        bucket_ns = self.bucket_ns
        last_bucket, last_w, last_gpus = self._last.get(source, (-1, 0.0, 0))
        oldest_allowed = self._newest - self._max_buckets
        kept = 0
        peak = -1.0
        t_ns = first_sample_unix_ns
        for i, watts in enumerate(power_w):
            bucket = t_ns // bucket_ns
            t_ns += step_ns
            count = 1 if gpus is None else gpus[i]
            if bucket < last_bucket or bucket <= oldest_allowed or count <= 0:
                continue
            replaces = (last_w, last_gpus) if bucket == last_bucket else None
            if sums is not None and _accumulate(sums, bucket, watts, count, replaces):
                self._order.append(bucket)
            if tracked is not None:
                _accumulate(tracked, bucket, watts, count, replaces)
            last_bucket, last_w, last_gpus = bucket, watts, count
            peak = max(peak, watts)
            kept += 1
        if not kept:
            return 0, peak, last_bucket
        self._last[source] = (last_bucket, last_w, last_gpus)
        if last_bucket > self._newest:
            self._newest = last_bucket
            self._trim()
        return kept, peak, last_bucket

    def _note_peak(self, gpu_uuid: str, last_bucket: int, peak: float) -> None:
        kept = self._peaks.get(gpu_uuid)
        if kept is None:
            kept = self._peaks[gpu_uuid] = (array.array("q"), array.array("d"))
        buckets, peaks = kept
        if buckets and last_bucket < buckets[-1]:  # a reordered series: keep the buckets in order
            at = bisect.bisect_right(buckets, last_bucket)
            buckets.insert(at, last_bucket)
            peaks.insert(at, peak)
        else:
            buckets.append(last_bucket)
            peaks.append(peak)
        stale = bisect.bisect_right(buckets, buckets[-1] - self._detail_buckets)
        if stale:
            del buckets[:stale]
            del peaks[:stale]

    def series(
        self, since_unix_ns: int = 0, until_unix_ns: int | None = None, *, tracked: bool = False
    ) -> list[tuple[int, float, int]]:
        """(bucket start unix ns, total watts, GPUs reporting) in time order.

        With `tracked`, of the tracked GPUs alone (from when `track` named them).
        """
        first = -(-since_unix_ns // self.bucket_ns)  # the first bucket starting at or after since
        sums = self._tracked_sums if tracked else self._sums
        rows = []
        for bucket in sorted(b for b in sums if b >= first):
            start_ns = bucket * self.bucket_ns
            if until_unix_ns is not None and start_ns >= until_unix_ns:
                break
            total_w, count = sums[bucket]
            rows.append((start_ns, total_w, int(count)))
        return rows

    def gpu_max_w(self, since_unix_ns: int) -> dict[str, float]:
        """Each GPU's highest sample in series ending at or after since_unix_ns, W (up to ``detail_s`` back).

        The power loop's "recent draw": a GPU in a step-synchronous job spends part of every step near
        idle, so its instant sample says little about the cap it needs; its peak over a control
        period does. A series (one batch or summary, about a second) counts whole when its last
        sample is recent.
        """
        first = since_unix_ns // self.bucket_ns
        out: dict[str, float] = {}
        for gpu_uuid, (buckets, peaks) in self._peaks.items():
            best = max(peaks[bisect.bisect_left(buckets, first) :], default=None)
            if best is not None:
                out[gpu_uuid] = best
        return out

    def _trim(self) -> None:
        cutoff = self._newest - self._max_buckets
        order = self._order
        while order and order[0] <= cutoff:
            self._sums.pop(order.popleft(), None)
        tracked = self._tracked_sums
        while tracked and (oldest := next(iter(tracked))) <= cutoff:  # insertion order: nearly time order
            del tracked[oldest]
        if len(order) > 2 * self._max_buckets:  # out-of-order arrivals hid old buckets behind newer ones
            for bucket in [b for b in self._sums if b <= cutoff]:
                del self._sums[bucket]
            self._order = collections.deque(sorted(self._sums))


def _accumulate(
    sums: dict[int, list[float]], bucket: int, watts: float, gpus: int, replaces: tuple[float, int] | None
) -> bool:
    """Add one source's value over `gpus` GPUs to a bucket's [sum W, GPUs]; True when the bucket is new.

    `replaces`: that source's older value (W, GPUs) in the same bucket, which the new one replaces.
    """
    cell = sums.get(bucket)
    if cell is None:
        sums[bucket] = [watts, gpus]
        return True
    if replaces is not None:
        cell[0] += watts - replaces[0]  # this source's newer value replaces its older one
        cell[1] += gpus - replaces[1]
    else:
        cell[0] += watts
        cell[1] += gpus
    return False


def summarize_power(rows: Iterable[tuple[int, float, int]], *, min_gpus: int) -> dict[str, float]:
    """Mean, min, max and peak-to-peak of fleet power over buckets where ≥ min_gpus reported.

    Buckets where fewer GPUs reported are partial (start-up, edges of the window) and would show a
    fake swing, so they are excluded.
    """
    totals = [total for _, total, count in rows if count >= min_gpus]
    if not totals:
        return {"buckets": 0}
    return {
        "buckets": len(totals),
        "mean_w": sum(totals) / len(totals),
        "min_w": min(totals),
        "max_w": max(totals),
        "p2p_w": max(totals) - min(totals),
    }
