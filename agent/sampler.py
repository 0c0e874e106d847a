"""The agent's sampler: reads the GPU backend on the agent's clock and keeps what it read until it is sent.

Every cycle, each on its own tick: power, counters (`counter_interval_ms`, 1 Hz), which
`core.health.evaluate` turns into findings; the backend's event poll (unless a thread of the agent
waits in it); and the executor's slew steps while a raise is slewing. Findings and events go to
`observe` (the durable spool). Then the fail-safe is checked. It keeps running while the controller
is unreachable, so no event is missed during an outage.

Power comes one of two ways. A backend that keeps its own samples (NVML's driver buffer,
`power_sample_buffer`) is read just before each send, and by the loop where no read came within
`power_buffer_interval_ms` (while the controller is away); any
other is read every `power_interval_ms` (10 Hz). Either way the samples go into flat arrays per GPU
(`PowerBuffers`, bounded by `buffer_s`, oldest dropped while the controller is away): no Python
object is kept per sample.

The link drains them (`drain_telemetry`) in the stream's format: a `TelemetrySummary`
(`core.summary`: per-second draw per GPU, the node's summed draw per bucket, the canaries' full
series, counters only when they change plus a heartbeat) or, to a controller before summaries, a
`TelemetryBatch` with every sample. The exporter reads the newest values (`latest_power`,
`latest_counters`). A tick that was missed is skipped, not burst.
"""

from __future__ import annotations

import array
import asyncio
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

import structlog

from rasd.agent import actions, failsafe, gpu, wire
from rasd.agent import settings as agent_settings
from rasd.agent.core import health, model, power_edges, summary
from rasd.api.v1 import agent_service_pb2 as agent_pb

if TYPE_CHECKING:
    from rasd.agent import runtime


BUFFER_READ_SLACK = 1.05
"""A driver buffer is read again this many ticks after its last read (by the loop or a drain), at most."""


class PowerBuffers:
    """Per GPU, the power samples taken since the last drain: two flat arrays each, bounded."""

    def __init__(self, gpu_uuids: Iterable[str], max_samples: int) -> None:
        """Keep at most max_samples per GPU (the oldest go first)."""
        self._max = max(1, max_samples)
        self._times: dict[str, array.array[int]] = {uuid: array.array("q") for uuid in gpu_uuids}
        self._watts: dict[str, array.array[float]] = {uuid: array.array("d") for uuid in self._times}
        self._drained: dict[str, model.PowerReading] = {}
        """Each GPU's newest sample as of the last drain (what `newest` answers once its arrays are empty)."""

    def add(self, gpu_uuid: str, time_unix_ns: int, watts: float) -> None:
        """One sample of one GPU (of this node's inventory; any other is ignored)."""
        times = self._times.get(gpu_uuid)
        if times is None:
            return
        times.append(time_unix_ns)
        self._watts[gpu_uuid].append(watts)
        if len(times) > 2 * self._max:
            self._trim(gpu_uuid)

    def extend(self, samples: model.PowerSamples) -> None:
        """A GPU's samples, in time order."""
        times = self._times.get(samples.gpu_uuid)
        if times is None:
            return
        times.extend(samples.times_unix_ns)
        self._watts[samples.gpu_uuid].extend(samples.watts)
        if len(times) > self._max:
            self._trim(samples.gpu_uuid)

    def _trim(self, gpu_uuid: str) -> None:
        # Trimmed in steps (at twice the bound when sampling one at a time), not on every append.
        excess = len(self._times[gpu_uuid]) - self._max
        del self._times[gpu_uuid][:excess]
        del self._watts[gpu_uuid][:excess]

    def take(self) -> list[model.PowerSamples]:
        """Every GPU's samples since the last take, in inventory order; the buffers start again empty."""
        taken = []
        for gpu_uuid, times in self._times.items():
            if not times:
                continue
            watts = self._watts[gpu_uuid]
            taken.append(model.PowerSamples(gpu_uuid, times, watts))
            self._drained[gpu_uuid] = model.PowerReading(gpu_uuid, times[-1], watts[-1])
            self._times[gpu_uuid] = array.array("q")
            self._watts[gpu_uuid] = array.array("d")
        return taken

    def newest(self) -> dict[str, model.PowerReading]:
        """The newest sample per GPU."""
        out = dict(self._drained)
        for gpu_uuid, times in self._times.items():
            if times:
                out[gpu_uuid] = model.PowerReading(gpu_uuid, times[-1], self._watts[gpu_uuid][-1])
        return out

    def newest_w(self, gpu_uuid: str) -> float | None:
        """One GPU's newest draw, W (None: never sampled)."""
        watts = self._watts.get(gpu_uuid)
        if watts:
            return watts[-1]
        drained = self._drained.get(gpu_uuid)
        return drained.power_w if drained is not None else None


class Sampler:
    """Power, counters, health findings, event polls and slew steps on the agent's clock."""

    def __init__(
        self,
        settings: agent_settings.AgentSettings,
        backend: gpu.GpuBackend,
        executor: actions.ActionExecutor,
        stats: runtime.AgentStats,
        fail_safe: failsafe.FailSafe,
        *,
        observe: Callable[[list[model.Observation] | tuple[model.Observation, ...]], None],
        clock: Callable[[], int],
        call: Callable[..., Awaitable[Any]],
        poll_events: bool = True,
    ) -> None:
        """Bind the sampler; call(fn, *args) runs a backend call off the event loop if it blocks.

        poll_events: poll the backend for observations every event_poll_interval_ms; False where a
        thread of the agent waits in the backend's event poll (`runtime.Agent._watch_gpu_events`).
        """
        self._settings = settings
        self._backend = backend
        self._executor = executor
        self._stats = stats
        self._failsafe = fail_safe
        self._observe = observe
        self._clock = clock
        self._call = call
        self._poll_events = poll_events
        self.power_interval_ms = settings.sampling.power_sample_interval_ms
        """Power sampling period; the controller's Welcome may change it."""
        self.counter_interval_ms = settings.sampling.counter_interval_ms
        """Counter sampling period; the controller's Welcome may change it."""
        self.summaries = False
        """Drain into `TelemetrySummary` (the stream's Welcome chose it) rather than `TelemetryBatch`."""
        self.full_rate: frozenset[str] = frozenset()
        """GPUs whose full series the controller asked for (`FullRateRequest`)."""
        inventory: Sequence[model.GpuInfo] = backend.inventory()
        self._order = tuple(g.uuid for g in inventory)
        max_samples = max(1, int(settings.sampling.buffer_s * 1000 / settings.sampling.power_sample_interval_ms))
        self._buffered = bool(getattr(backend, "power_sample_buffer", False))
        self._buffer_read_lock = asyncio.Lock()
        self._buffer_read_s = 0.0  # the event loop's time of the last buffer read
        if self._buffered:
            # A driver buffer samples faster than the agent would: room for buffer_s of its samples too.
            max_samples *= 10
        self._power = PowerBuffers(self._order, max_samples)
        self._grid = summary.GridCarry()
        self._edges = power_edges.EdgeCarry()
        self._counters: dict[str, model.GpuCounters] = {}
        """Newest counters per GPU read since the last drain."""
        self._latest_counters: dict[str, model.GpuCounters] = {}
        self._counters_sent: dict[str, model.GpuCounters] = {}
        self._counters_heartbeat_s = 0.0  # monotonic time of the last full send (0: due)
        self._power_at_counters: dict[str, float | None] = {}
        self._log = structlog.get_logger("rasd.agent").bind(node=settings.node_id)

    # -- the stream's side -----------------------------------------------------------------------
    def stream_started(self, *, summaries: bool) -> None:
        """A new stream: its format; every GPU's counters go out in its first summary, no canary is asked yet."""
        self.summaries = summaries
        self.full_rate = frozenset()
        self._counters_sent.clear()

    async def drain_telemetry(self) -> agent_pb.AgentMessage | None:
        """What was sampled since the last drain, in the stream's format; None when there is nothing."""
        if self._buffered:
            await self._read_power_buffer(self._clock())
        now_ns = self._clock()
        power = self._power.take()
        if not self.summaries:
            counters = list(self._counters.values())
            self._counters.clear()
            if not power and not counters:
                return None
            return wire.telemetry(power, counters, self.power_interval_ms)
        self._counters.clear()
        power_summary = summary.summarize(
            power, carry=self._grid, interval_ms=self.power_interval_ms, until_unix_ns=now_ns, full_rate=self.full_rate
        )
        self._grid = power_summary.carry
        edges, self._edges = power_edges.interval_edges(power, self._edges)
        counters = self._counters_to_send()
        if not power_summary.draws and power_summary.node is None and not counters:
            return None
        return wire.summary(power_summary, self._latest_counters, counters, self._order, edges)

    def _counters_to_send(self) -> list[model.GpuCounters]:
        """The GPUs' newest counters that changed since sent, or every GPU's when the heartbeat is due."""
        heartbeat = time.monotonic() - self._counters_heartbeat_s >= self._settings.sampling.counters_heartbeat_s
        if heartbeat:
            self._counters_heartbeat_s = time.monotonic()
        out = []
        for gpu_uuid in self._order:
            current = self._latest_counters.get(gpu_uuid)
            if current is None:
                continue
            if heartbeat or summary.counters_changed(self._counters_sent.get(gpu_uuid), current):
                out.append(current)
                self._counters_sent[gpu_uuid] = current
        return out

    # -- sampling ----------------------------------------------------------------------------------
    async def run(self, stop: asyncio.Event) -> None:
        """Sample until stop is set; a failing cycle is logged and the next one runs."""
        loop = asyncio.get_running_loop()
        next_power = next_counters = next_events = next_slew = loop.time()
        slew_step_s = self._executor.settings.cap_slew_step_s
        while not stop.is_set():
            now_loop = loop.time()
            now_ns = self._clock()
            try:
                if now_loop >= next_power:
                    await self._sample_power(now_ns)
                    next_power = next_tick(next_power, self._power_tick_ms(), now_loop)
                if self._buffered:
                    # The next read is due a tick after the last one, whoever made it: a connected
                    # agent's drains read the buffer every second, and a read on this loop's own grid
                    # as well (one call per GPU and a thread hop) took only what the next drain would.
                    # A little after the tick, so that a drain due at the same moment reads first.
                    next_power = self._buffer_read_s + BUFFER_READ_SLACK * self._power_tick_ms() / 1000
                if now_loop >= next_counters:
                    await self._sample_counters(now_ns)
                    next_counters = next_tick(next_counters, self.counter_interval_ms, now_loop)
                if self._poll_events and now_loop >= next_events:
                    observations = await self._call(self._backend.poll_events, now_ns, 0.0)
                    if observations:
                        self._observe(observations)
                    next_events = next_tick(next_events, self._settings.sampling.event_poll_interval_ms, now_loop)
                if now_loop >= next_slew:
                    if self._executor.slewing():  # no thread hop ten times a second for nothing
                        for failure in await self._call(self._executor.step_slews):
                            self._log.warning("cap_slew_step_failed", error=failure)
                    next_slew = next_tick(next_slew, round(slew_step_s * 1000), now_loop)
                self._stats.last_cycle_ok_monotonic = time.monotonic()
            except gpu.BackendError as exc:
                # A failing read must not kill sampling; lost GPUs surface as observations.
                self._log.warning("gpu_read_failed", error=str(exc), error_type=type(exc).__name__)
            except Exception:
                # A bug must not silently end sampling. The cycle is not counted as good, so under
                # systemd the watchdog stops being petted and the agent is restarted.
                self._log.exception("sampling_cycle_failed")
            await self._failsafe.check()
            wake = min(next_power, next_counters, next_events if self._poll_events else next_counters)
            if self._executor.slewing():
                wake = min(wake, next_slew)
            await asyncio.sleep(max(0.0, wake - loop.time()))

    def _power_tick_ms(self) -> int:
        return self._settings.sampling.power_buffer_interval_ms if self._buffered else self.power_interval_ms

    async def _sample_power(self, now_ns: int) -> None:
        if self._buffered:
            # Read on this tick only if no drain read the buffer within one.
            if asyncio.get_running_loop().time() - self._buffer_read_s >= self._power_tick_ms() / 1000:
                await self._read_power_buffer(now_ns)
            return
        readings = await self._call(self._backend.read_power, now_ns)
        add = self._power.add
        for reading in readings:
            add(reading.gpu_uuid, reading.time_unix_ns, reading.power_w)
        self._stats.power_samples += len(readings)

    async def _read_power_buffer(self, now_ns: int) -> None:
        # The sampling loop and a drain may both read; one at a time, or the backend's "seen up to"
        # marks race.
        async with self._buffer_read_lock:
            self._buffer_read_s = asyncio.get_running_loop().time()
            for samples in await self._call(self._backend.read_power_samples, now_ns):
                self._power.extend(samples)
                self._stats.power_samples += len(samples.watts)

    async def _sample_counters(self, now_ns: int) -> None:
        findings: list[model.Observation] = []
        # Through the executor: a slewing GPU's counters carry its raise's target.
        for counters in await self._call(self._executor.read_counters, now_ns):
            uuid = counters.gpu_uuid
            power_w = self._power.newest_w(uuid)
            findings.extend(
                health.evaluate(
                    self._latest_counters.get(uuid),
                    counters,
                    power_w=power_w,
                    previous_power_w=self._power_at_counters.get(uuid),
                    thresholds=self._settings.health,
                )
            )
            self._power_at_counters[uuid] = power_w
            self._counters[uuid] = counters
            self._latest_counters[uuid] = counters
        if findings:
            self._observe(findings)

    def latest_power(self) -> dict[str, model.PowerReading]:
        """The newest power reading per GPU."""
        return self._power.newest()

    def latest_counters(self) -> dict[str, model.GpuCounters]:
        """The newest counters per GPU."""
        return dict(self._latest_counters)


def next_tick(previous_s: float, interval_ms: int, now_s: float) -> float:
    """Next tick on the original grid; skips ticks that were missed rather than bursting."""
    interval_s = interval_ms / 1000
    tick = previous_s + interval_s
    if tick <= now_s:
        tick = now_s + interval_s - ((now_s - previous_s) % interval_s)
    return tick
