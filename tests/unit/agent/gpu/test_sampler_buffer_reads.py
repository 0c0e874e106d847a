"""The sampler's reads of the driver's power-sample buffer: one a tick, whoever makes it (issue #36)."""

from __future__ import annotations

import asyncio

import fake_nvml

from rasd.agent import runtime, spool
from rasd.agent import settings as agent_settings

TICK_MS = 200


def _buffer_reads(install_fake, open_backend, *, drain_every_s: float | None, run_s: float) -> tuple[int, int]:
    """(buffer reads, drains) in run_s of the sampler's loop beside a drain every drain_every_s (None: none)."""
    fake = install_fake(fake_nvml.FakeNvml([fake_nvml.h100_sxm5(0), fake_nvml.h100_sxm5(1)], wall_clock=True))
    backend = open_backend(power_buffer_max_spacing_ms=100)
    assert backend.power_sample_buffer
    settings = agent_settings.AgentSettings(
        node_id="node-a",
        link=agent_settings.LinkSettings(controller_address="127.0.0.1:1"),
        sampling=agent_settings.SamplingSettings(power_buffer_interval_ms=TICK_MS),
    )
    agent = runtime.Agent(settings, backend, spool.Spool(":memory:"), boot_id="boot")
    agent._sampler.stream_started(summaries=True)
    drains = 0

    async def drain_forever() -> None:
        nonlocal drains
        await asyncio.sleep(0.05)  # a stream's sends are on their own grid, out of phase with the loop's
        while True:
            await agent._sampler.drain_telemetry()
            drains += 1
            await asyncio.sleep(drain_every_s)

    async def run() -> None:
        stop = asyncio.Event()
        fake.calls.clear()
        loop = asyncio.create_task(agent._sampler.run(stop))
        drainer = asyncio.create_task(drain_forever()) if drain_every_s else None
        await asyncio.sleep(run_s)
        stop.set()
        if drainer is not None:
            drainer.cancel()
        await asyncio.gather(loop, *([drainer] if drainer else []), return_exceptions=True)

    asyncio.run(run())
    reads = sum(1 for name, _ in fake.calls if name == "nvmlDeviceGetSamples") // 2  # one call per GPU a read
    return reads, drains


def test_a_connected_agent_reads_the_buffer_once_a_drain_not_again_on_its_own_tick(install_fake, open_backend):
    reads, drains = _buffer_reads(install_fake, open_backend, drain_every_s=TICK_MS / 1000, run_s=1.2)
    # The loop's first read, then the drains'; before, the loop read on its own grid too (about twice as many).
    assert drains >= 4
    assert reads <= drains + 2, f"{reads} buffer reads for {drains} drains"


def test_an_agent_away_from_its_controller_still_reads_the_buffer_every_tick(install_fake, open_backend):
    reads, _ = _buffer_reads(install_fake, open_backend, drain_every_s=None, run_s=1.2)
    assert reads >= 4, f"{reads} buffer reads in 1.2 s at a {TICK_MS} ms tick"
