"""Telemetry summaries built on the node from its full-rate power samples. Pure.

The agent samples power at 10 Hz (or reads the driver's own sample buffer) and keeps those series
on the node (its Prometheus exporter shows them). Once per send interval it sends the controller
what the controller's loops read (proto: `TelemetrySummary`), not every sample:

* per GPU, its draw over the interval: samples, mean, min, max and the last sample (`GpuDraw`);
* the node's summed draw on the sample grid (`NodeSeries`), which the swing detector reads: the
  grid's buckets are the controller's power-window buckets (`interval_ms` wide, aligned to Unix
  time), and in each bucket a GPU counts with its last sample in it, as the window counts a raw
  series. A GPU with no sample in a bucket counts with its newest earlier one if that is at most
  `HOLD_BUCKETS` old (a 10 Hz tick that jittered past a bucket, a driver buffer sampling at 5 Hz),
  and not at all otherwise;
* on the same grid, the full series of the few GPUs the controller asked for (`GpuSeries`: the
  power loop's canaries), split where the GPU has no value.

A bucket is sent once it is complete (its end is at or before `until_unix_ns`); what the next
summary needs of this one (where the grid resumes, each GPU's newest bucketed sample) is its
`GridCarry`. Counters go out when they change (`counters_changed`), plus a slow heartbeat.

Samples come as flat arrays per GPU (`model.PowerSamples`), never one object per sample.

Example: interval 100 ms, GPU A sampled at 0.05 s (300 W) and 0.15 s (310 W), GPU B at 0.06 s
(200 W) and nothing after, until 0.2 s: buckets 0 and 1 are complete; the node series is
[500 W over 2 GPUs, 510 W over 2 GPUs] from 0.0 s (B held in bucket 1).
"""

from __future__ import annotations

import array
import bisect
import dataclasses
import itertools
import operator
from collections.abc import Mapping, Sequence
from collections.abc import Set as AbstractSet

from rasd.agent.core import model

HOLD_BUCKETS = 2
"""How many buckets a GPU's newest sample still counts for when it has no newer one."""
MAX_GRID_BUCKETS = 6000
"""Buckets one summary carries at most (the controller's bound on a series); older ones are dropped."""

# Counters whose movement alone is no reason to send: energy, temperature and the sample times move
# nearly every read; utilisation, clock event reasons (the SW power cap bit follows every training
# step) and a slewing limit's target travel in every summary (`GpuPowerSummary`) anyway.
_NOT_A_CHANGE = frozenset({
    "sample_unix_ns", "nvlink_sample_unix_ns", "total_energy_mj", "temperature_c", "utilization_gpu_pct",
    "clock_event_reasons", "power_limit_slew_target_w",
})  # fmt: skip
_COMPARED = tuple(f for f in model.GpuCounters.__dataclass_fields__ if f not in _NOT_A_CHANGE)
_compared = operator.attrgetter(*_COMPARED)
"""The compared fields of a GpuCounters as one tuple (one C call, not a getattr each)."""


@dataclasses.dataclass(frozen=True, slots=True)
class GpuDraw:
    """One GPU's draw over one summary interval, W."""

    gpu_uuid: str
    samples: int
    mean_w: float
    min_w: float
    max_w: float
    last_w: float
    last_sample_unix_ns: int


@dataclasses.dataclass(frozen=True, slots=True)
class NodeSeries:
    """The node's summed draw per bucket: power_w[i] over gpus[i] GPUs at first + i * interval."""

    first_sample_unix_ns: int
    interval_ms: int
    power_w: array.array[float]
    gpus: array.array[int]


@dataclasses.dataclass(frozen=True, slots=True)
class GpuSeries:
    """A run of one GPU's values on the grid, with no gap."""

    gpu_uuid: str
    first_sample_unix_ns: int
    interval_ms: int
    power_w: array.array[float]


@dataclasses.dataclass(frozen=True, slots=True)
class GridCarry:
    """What a summary hands the next: the first bucket not yet sent, and each GPU's newest bucketed sample."""

    next_bucket: int | None = None
    held: Mapping[str, tuple[int, float]] = dataclasses.field(default_factory=dict)
    """GPU -> (the bucket of its newest sample, that sample's W)."""


@dataclasses.dataclass(frozen=True, slots=True)
class PowerSummary:
    """One interval's power, summarised."""

    draws: tuple[GpuDraw, ...]
    node: NodeSeries | None
    """None when no bucket was complete."""
    full_rate: tuple[GpuSeries, ...]
    carry: GridCarry


def draw(samples: model.PowerSamples) -> GpuDraw | None:
    """Mean, min, max and last of one GPU's samples (None without any)."""
    watts = samples.watts
    if not watts:
        return None
    return GpuDraw(
        gpu_uuid=samples.gpu_uuid,
        samples=len(watts),
        mean_w=sum(watts) / len(watts),
        min_w=min(watts),
        max_w=max(watts),
        last_w=watts[-1],
        last_sample_unix_ns=samples.times_unix_ns[-1],
    )


def summarize(
    samples: Sequence[model.PowerSamples],
    *,
    carry: GridCarry,
    interval_ms: int,
    until_unix_ns: int,
    full_rate: AbstractSet[str] = frozenset(),
) -> PowerSummary:
    """Summarise the samples taken since the last summary (see the module doc).

    Args:
        samples: Per GPU, its samples since the last summary, in time order.
        carry: The last summary's `GridCarry` (a fresh one for the first).
        interval_ms: The grid's bucket width (the power sample interval).
        until_unix_ns: Every sample up to this time has been read: buckets ending by then are complete.
        full_rate: The GPUs whose own grid series the controller asked for.
    """
    if interval_ms <= 0:
        raise ValueError(f"interval_ms must be positive, got {interval_ms}")
    interval_ns = interval_ms * 1_000_000
    draws = tuple(d for s in samples if (d := draw(s)) is not None)
    lasts = {s.gpu_uuid: _bucket_lasts(s, interval_ns, carry.held.get(s.gpu_uuid)) for s in samples}
    for gpu_uuid, held in carry.held.items():
        lasts.setdefault(gpu_uuid, ([held[0]], [held[1]]))
    last_complete = until_unix_ns // interval_ns - 1
    # Where the grid resumes: where the last summary ended, unless the new samples begin later than
    # a held one could bridge (after an outage longer than the agent's buffer): then where they begin.
    earliest = min((s.times_unix_ns[0] // interval_ns for s in samples if s.times_unix_ns), default=None)
    first = carry.next_bucket
    if first is None or (earliest is not None and earliest - first > HOLD_BUCKETS):
        first = earliest if earliest is not None else last_complete + 1
    first = max(first, last_complete + 1 - MAX_GRID_BUCKETS)
    held = {gpu: (buckets[-1], watts[-1]) for gpu, (buckets, watts) in lasts.items() if buckets}
    if first > last_complete:
        return PowerSummary(draws, None, (), GridCarry(first, _fresh(held, first)))
    count = last_complete - first + 1
    total_w = array.array("d", bytes(8 * count))
    gpus = array.array("I", bytes(4 * count))
    series: list[GpuSeries] = []
    for gpu_uuid, (buckets, watts) in lasts.items():
        values = _on_grid(buckets, watts, first, count)
        for i, value in enumerate(values):
            if value is not None:
                total_w[i] += value
                gpus[i] += 1
        if gpu_uuid in full_rate:
            series.extend(_runs(gpu_uuid, values, first, interval_ms))
    node = NodeSeries(first * interval_ns, interval_ms, total_w, gpus)
    next_bucket = last_complete + 1
    return PowerSummary(draws, node, tuple(series), GridCarry(next_bucket, _fresh(held, next_bucket)))


def _bucket_lasts(
    samples: model.PowerSamples, interval_ns: int, held: tuple[int, float] | None
) -> tuple[list[int], list[float]]:
    """(buckets, W): the last sample in each bucket, in order, starting with the held one.

    One `bisect` per bucket boundary, not a step per sample: a driver buffer brings some 50 samples
    a GPU a second into ten buckets.
    """
    buckets: list[int] = [held[0]] if held is not None else []
    watts: list[float] = [held[1]] if held is not None else []
    times, values = samples.times_unix_ns, samples.watts
    end = len(times)
    if not end:
        return buckets, watts
    if not all(map(operator.le, times, itertools.islice(times, 1, None))):  # a clock stepped back
        return _bucket_lasts_unsorted(samples, interval_ns, buckets, watts)
    start = 0
    if buckets:  # samples in a bucket before the held one (a clock stepped back) are not placed
        start = bisect.bisect_left(times, buckets[-1] * interval_ns)
    while start < end:
        bucket = times[start] // interval_ns
        last = bisect.bisect_left(times, (bucket + 1) * interval_ns, start) - 1  # the bucket's last sample
        if buckets and bucket == buckets[-1]:
            watts[-1] = values[last]
        else:
            buckets.append(bucket)
            watts.append(values[last])
        start = last + 1
    return buckets, watts


def _bucket_lasts_unsorted(
    samples: model.PowerSamples, interval_ns: int, buckets: list[int], watts: list[float]
) -> tuple[list[int], list[float]]:
    """`_bucket_lasts` for samples out of time order: step by step, older ones than a placed bucket dropped."""
    for t_ns, w in zip(samples.times_unix_ns, samples.watts, strict=True):
        bucket = t_ns // interval_ns
        if buckets and bucket == buckets[-1]:
            watts[-1] = w
        elif not buckets or bucket > buckets[-1]:
            buckets.append(bucket)
            watts.append(w)
    return buckets, watts


def _on_grid(buckets: list[int], watts: list[float], first: int, count: int) -> list[float | None]:
    """The GPU's value in each grid bucket: its last sample there, else one held ≤ HOLD_BUCKETS, else None."""
    values: list[float | None] = [None] * count
    j = 0
    n = len(buckets)
    for i in range(count):
        bucket = first + i
        while j + 1 < n and buckets[j + 1] <= bucket:
            j += 1
        if n and buckets[j] <= bucket and bucket - buckets[j] <= HOLD_BUCKETS:
            values[i] = watts[j]
    return values


def _runs(gpu_uuid: str, values: list[float | None], first: int, interval_ms: int) -> list[GpuSeries]:
    """The gap-free runs of one GPU's grid values."""
    runs = []
    start = None
    for i, value in enumerate([*values, None]):
        if value is not None and start is None:
            start = i
        elif value is None and start is not None:
            run = array.array("d", values[start:i])  # type: ignore[arg-type]
            runs.append(GpuSeries(gpu_uuid, (first + start) * interval_ms * 1_000_000, interval_ms, run))
            start = None
    return runs


def _fresh(held: Mapping[str, tuple[int, float]], next_bucket: int) -> dict[str, tuple[int, float]]:
    """The held samples that can still count in next_bucket or later."""
    return {gpu: last for gpu, last in held.items() if next_bucket - last[0] <= HOLD_BUCKETS}


def counters_changed(sent: model.GpuCounters | None, current: model.GpuCounters) -> bool:
    """True when current differs from what was last sent in anything but the always-moving counters.

    ECC, row remaps, retired pages, PCIe replays, NVLink state and errors, the recovery action, the
    limits and the smoothing state move when something happened; the others (`_NOT_A_CHANGE`) do not
    count.
    """
    if sent is None:
        return True
    return _compared(sent) != _compared(current)
