"""The agent's sampler: reads the GPU backend on the agent's clock and keeps what it read until it is sent.

Every cycle, each on its own tick: power (`power_interval_ms`, 10 Hz) into a bounded buffer per GPU
that drops the oldest samples while the controller is away; counters (`counter_interval_ms`, 1 Hz),
which `core.health.evaluate` turns into findings; the backend's event poll; and the executor's slew
steps. Findings and events go to `observe` (the durable spool). Then the fail-safe is checked. It
keeps running while the controller is unreachable, so no event is missed during an outage.

The link drains the buffers into telemetry batches (`drain_telemetry`); the exporter reads the
newest values (`latest_power`, `latest_counters`). A tick that was missed is skipped, not burst.
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

import structlog

from rasd.agent import actions, failsafe, gpu, wire
from rasd.agent import settings as agent_settings
from rasd.agent.core import health, model
from rasd.api.v1 import agent_service_pb2 as agent_pb

if TYPE_CHECKING:
    from rasd.agent import runtime


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
    ) -> None:
        """Bind the sampler; call(fn, *args) runs a backend call off the event loop if it blocks."""
        self._settings = settings
        self._backend = backend
        self._executor = executor
        self._stats = stats
        self._failsafe = fail_safe
        self._observe = observe
        self._clock = clock
        self._call = call
        self.power_interval_ms = settings.sampling.power_sample_interval_ms
        """Power sampling period; the controller's Welcome may change it."""
        self.counter_interval_ms = settings.sampling.counter_interval_ms
        """Counter sampling period; the controller's Welcome may change it."""
        inventory: Sequence[model.GpuInfo] = backend.inventory()
        max_samples = max(1, int(settings.sampling.buffer_s * 1000 / settings.sampling.power_sample_interval_ms))
        self._power: dict[str, collections.deque[model.PowerReading]] = {
            g.uuid: collections.deque(maxlen=max_samples) for g in inventory
        }
        self._counters: dict[str, model.GpuCounters] = {}
        self._latest_power: dict[str, model.PowerReading] = {}
        self._latest_counters: dict[str, model.GpuCounters] = {}
        self._power_at_counters: dict[str, float | None] = {}
        self._log = structlog.get_logger("rasd.agent").bind(node=settings.node_id)

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
                    next_power = next_tick(next_power, self.power_interval_ms, now_loop)
                if now_loop >= next_counters:
                    await self._sample_counters(now_ns)
                    next_counters = next_tick(next_counters, self.counter_interval_ms, now_loop)
                if now_loop >= next_events:
                    observations = await self._call(self._backend.poll_events, now_ns, 0.0)
                    if observations:
                        self._observe(observations)
                    next_events = next_tick(next_events, self._settings.sampling.event_poll_interval_ms, now_loop)
                if now_loop >= next_slew:
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
            await asyncio.sleep(max(0.0, min(next_power, next_counters, next_events, next_slew) - loop.time()))

    async def _sample_power(self, now_ns: int) -> None:
        for reading in await self._call(self._backend.read_power, now_ns):
            self._power[reading.gpu_uuid].append(reading)
            self._latest_power[reading.gpu_uuid] = reading
            self._stats.power_samples += 1

    async def _sample_counters(self, now_ns: int) -> None:
        findings: list[model.Observation] = []
        # Through the executor: a slewing GPU's counters carry its raise's target.
        for counters in await self._call(self._executor.read_counters, now_ns):
            uuid = counters.gpu_uuid
            reading = self._latest_power.get(uuid)
            power_w = reading.power_w if reading else None
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

    def drain_telemetry(self) -> agent_pb.AgentMessage | None:
        """The samples and counters taken since the last drain as one batch; None when there are none."""
        power = {uuid: list(buffer) for uuid, buffer in self._power.items() if buffer}
        for buffer in self._power.values():
            buffer.clear()
        counters = list(self._counters.values())
        self._counters.clear()
        if not power and not counters:
            return None
        return wire.telemetry(power, counters, self.power_interval_ms)

    def latest_power(self) -> dict[str, model.PowerReading]:
        """The newest power reading per GPU."""
        return dict(self._latest_power)

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
