"""The sampler's drain in the stream's format: summaries (counters on change and heartbeat) or raw batches."""

from __future__ import annotations

import asyncio

from rasd.agent import runtime, spool
from rasd.agent import settings as agent_settings
from rasd.agent.gpu import simulated

T0 = 1_800_000_000 * 10**9
MS = 1_000_000


def _agent(clock) -> runtime.Agent:
    settings = agent_settings.AgentSettings(
        node_id="node-a", link=agent_settings.LinkSettings(controller_address="127.0.0.1:1")
    )
    backend = simulated.SimulatedBackend("node-a", 2, 0, epoch_unix_ns=T0)
    return runtime.Agent(settings, backend, spool.Spool(":memory:"), boot_id="boot", clock=clock)


def _sample_one_second(agent: runtime.Agent, now: list[int]) -> None:
    """Ten power ticks and one counters tick, as the sampler's loop would, then the clock at the second's end."""

    async def run() -> None:
        sampler = agent._sampler
        start = now[0]
        for tick in range(10):
            await sampler._sample_power(start + (50 + 100 * tick) * MS)
        await sampler._sample_counters(start + 950 * MS)
        now[0] = start + 1000 * MS

    asyncio.run(run())


def _drain(agent: runtime.Agent):
    return asyncio.run(agent._sampler.drain_telemetry())


def test_a_summaries_stream_gets_a_summary_with_counters_first_then_only_on_change():
    now = [T0]
    agent = _agent(lambda: now[0])
    agent._sampler.stream_started(summaries=True)
    _sample_one_second(agent, now)
    first = _drain(agent)
    assert first.WhichOneof("payload") == "summary"
    summary = first.summary
    assert [g.samples for g in summary.gpus] == [10, 10]
    assert all(g.min_w <= g.mean_w <= g.max_w and g.enforced_power_limit_w for g in summary.gpus)
    assert list(summary.node_power.gpus) == [2] * 10, "ten complete 100 ms buckets, both GPUs in each"
    assert summary.node_power.first_sample_unix_ns == T0
    assert len(summary.counters) == 2, "a new stream's first summary carries every GPU's counters"
    assert not summary.full_rate

    _sample_one_second(agent, now)
    second = _drain(agent).summary
    assert second.node_power.first_sample_unix_ns == T0 + 1000 * MS, "the grid resumes where it ended"
    assert not second.counters, "counters that did not change stay on the node until the heartbeat"


def test_a_raw_stream_gets_every_sample_and_counters_as_before_summaries():
    now = [T0]
    agent = _agent(lambda: now[0])
    agent._sampler.stream_started(summaries=False)
    _sample_one_second(agent, now)
    message = _drain(agent)
    assert message.WhichOneof("payload") == "telemetry"
    assert [len(s.power_w) for s in message.telemetry.power] == [10, 10]
    assert len(message.telemetry.counters) == 2
    assert _drain(agent) is None, "nothing sampled since: nothing sent"


def test_the_canaries_asked_for_ride_along_in_full():
    now = [T0]
    agent = _agent(lambda: now[0])
    agent._sampler.stream_started(summaries=True)
    canary = agent.backend.inventory()[1].uuid
    agent._sampler.full_rate = frozenset({canary})
    _sample_one_second(agent, now)
    summary = _drain(agent).summary
    assert [(s.gpu_uuid, len(s.power_w)) for s in summary.full_rate] == [(canary, 10)]
