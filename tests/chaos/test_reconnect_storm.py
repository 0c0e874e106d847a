"""2,000 agents reconnecting at once: all back within 60 s, with bounded controller memory.

2,000 light agents (8 GPUs each: 16,000 GPUs) hold streams to a real `rasd-controller` process,
each on its own TCP connection. The controller is SIGKILLed and started again on the same store:
every agent retries (full jitter, at most 0.5 s apart), so the new process meets the whole fleet's
Hellos at once. The test measures how long until every agent has its Welcome, and the controller's
resident memory through the storm (sampled, and its VmHWM peak), then proves the streams still work
by having every tenth agent deliver a health event and get it acked.
"""

from __future__ import annotations

import asyncio
import os
import time

import chaoslib
import pytest

pytestmark = pytest.mark.slow

AGENTS = int(os.environ.get("RASD_CHAOS_STORM_AGENTS", "2000"))
BACK_WITHIN_S = 60.0
# Measured on the shared 2-core dev machine: 204 MiB idle with 2,000 streams, 214 MiB after the storm. The bound
# leaves room for allocator noise, not for per-message growth: an unbounded queue per stream or a
# leak across the 2,000 Hellos would cross it.
MAX_RSS_MIB = 600.0


async def _run(tmp_path, figures):
    controller = chaoslib.ControllerProcess(tmp_path, f"sqlite:///{tmp_path / 'rasd.db'}", chaoslib.free_port())
    controller.start()
    await controller.wait_ready()
    fleet = chaoslib.LightFleet(controller.address, AGENTS, reconnect_max_s=0.5, heartbeat_s=20.0)
    samples: list[float] = []
    sampling = asyncio.Event()

    async def sample_memory() -> None:
        while not sampling.is_set():
            rss = controller.sample_rss()
            if rss:
                samples.append(rss)
            await asyncio.sleep(0.25)

    sampler = asyncio.create_task(sample_memory())
    try:
        fleet.start()
        first_s = await fleet.wait_connected(180)
        idle_rss = controller.sample_rss()

        controller.kill()
        peak_before = controller.peak_rss_mib
        controller.peak_rss_mib = 0.0
        samples.clear()
        await chaoslib.until(lambda: fleet.connected() == 0, 30, "every agent saw the controller die")
        controller.start()
        ready_s = await controller.wait_ready()
        storm_started = time.monotonic()
        back_s = await fleet.wait_connected(BACK_WITHIN_S + 30, welcomes_at_least=2)
        storm_rss_max = max(samples, default=0.0)

        # The streams work after the storm: every tenth agent delivers a health event and gets it acked.
        sample = fleet.agents[::10]
        for agent in sample:
            agent.spool_event(xid=13)
            assert agent.outbox is not None
            agent.outbox.put_nowait(
                chaoslib.agent_pb.AgentMessage(events=chaoslib.agent_pb.HealthEventBatch(events=agent.unacked()))
            )
        acked_s = await chaoslib.until(
            lambda: all(a.acked_seq == a.next_seq - 1 for a in sample), 120, "the sampled agents' events acked"
        )
        controller.sample_rss()
        peak_after = controller.peak_rss_mib
    finally:
        sampling.set()
        await fleet.stop()
        await asyncio.gather(sampler, return_exceptions=True)
        controller.close()
    welcomes = [a.welcomed_at - storm_started for a in fleet.agents]
    figures(
        f"agents {AGENTS} (GPUs {AGENTS * 8}), first connect {first_s:.1f} s, controller restart {ready_s:.1f} s, "
        f"all back {back_s:.1f} s after it listened (p50 {chaoslib.percentile(welcomes, 50):.1f} s, "
        f"p99 {chaoslib.percentile(welcomes, 99):.1f} s), {len(fleet.agents[::10])} agents' events acked "
        f"{acked_s:.1f} s later; controller RSS "
        f"idle {idle_rss:.0f} MiB, peak before kill {peak_before:.0f} MiB, storm max {storm_rss_max:.0f} MiB, "
        f"peak after {peak_after:.0f} MiB (bound {MAX_RSS_MIB:.0f})"
    )
    return back_s, max(peak_before, peak_after)


def test_2000_agents_reconnecting_at_once_are_back_within_60_s_with_bounded_memory(tmp_path, figures):
    back_s, peak_rss_mib = asyncio.run(_run(tmp_path, figures))
    assert back_s <= BACK_WITHIN_S
    assert peak_rss_mib <= MAX_RSS_MIB
