"""A slow store: backpressure reaches the agents, which spool; no queue in the controller grows without bound.

Latency is injected at the third-party edge: an SQLAlchemy `before_cursor_execute` listener on the
controller's engine sleeps before every SQL statement. Four in-process agents (real runtime, real
disk spools) meanwhile see health events far faster than the slowed store can take them. The test
samples every queue in the controller that holds work (the store thread's queue, the per-stream
outbound queues, the remediation inbox) and the process's resident memory, and watches the agents'
spool depth. Then the latency goes away and everything must drain: every spooled event stored once
and acked.
"""

from __future__ import annotations

import asyncio
import os
import time

import chaoslib
import pytest
import sqlalchemy as sa

from rasd.agent import runtime, spool
from rasd.agent import settings as agent_settings
from rasd.agent.core import model
from rasd.agent.gpu import simulated
from rasd.controller import server

pytestmark = pytest.mark.slow

AGENTS = 4
STATEMENT_LATENCY_S = 0.05
SLOW_S = 8.0
EVENTS_PER_AGENT_PER_S = 50


async def _run(tmp_path, figures):
    settings = server.ControllerSettings(
        listen="127.0.0.1:0", db_url=f"sqlite:///{tmp_path / 'rasd.db'}", metrics_port=None
    )
    controller = server.Controller(settings)
    await controller.start()
    latency = {"s": 0.0, "statements": 0}

    @sa.event.listens_for(controller.store.engine, "before_cursor_execute")
    def _slow_sql(conn, cursor, statement, parameters, context, executemany):  # type: ignore[no-untyped-def]
        if latency["s"]:
            latency["statements"] += 1
            time.sleep(latency["s"])

    fleet = []
    for i in range(AGENTS):
        backend = simulated.SimulatedBackend(f"node-s{i}", 2, i, workload=simulated.StepWorkload())
        journal = spool.Spool(str(tmp_path / f"node-s{i}-spool.db"))
        agent = runtime.Agent(
            agent_settings.AgentSettings(
                node_id=f"node-s{i}",
                labels={"rack": "rack-s"},
                link=agent_settings.LinkSettings(
                    controller_address=controller.address, reconnect_initial_s=0.05, reconnect_max_s=0.5
                ),
            ),
            backend,
            journal,
            boot_id=f"boot-{i}",
        )
        fleet.append((agent, backend, journal))
    stop = asyncio.Event()
    tasks = [asyncio.create_task(a.run(stop)) for a, _, _ in fleet]
    peaks = {"store_queue": 0, "outbound": 0, "inbox": 0, "spool": 0, "rss_mib": 0.0}
    sampling = asyncio.Event()

    def writer_queue() -> int:
        # The single store thread's work queue.
        return controller.wired.thread.queued

    async def sample() -> None:
        while not sampling.is_set():
            peaks["store_queue"] = max(peaks["store_queue"], writer_queue())
            peaks["outbound"] = max(
                [peaks["outbound"], *(s.outbound.qsize() for s in controller.ingest.sessions.values())]
            )
            assert controller.remediation is not None
            peaks["inbox"] = max(peaks["inbox"], len(controller.remediation.decider.inbox))
            peaks["spool"] = max(peaks["spool"], max(j.depth() for _, _, j in fleet))
            peaks["rss_mib"] = max(peaks["rss_mib"], chaoslib.proc_status_mib(os.getpid(), "VmRSS"))
            await asyncio.sleep(0.05)

    sampler = asyncio.create_task(sample())
    produced = 0
    try:
        await chaoslib.until(lambda: all(a.stats.connected for a, _, _ in fleet), 30, "agents connected")
        rss_before = chaoslib.proc_status_mib(os.getpid(), "VmRSS")
        latency["s"] = STATEMENT_LATENCY_S
        slow_started = time.monotonic()
        while time.monotonic() - slow_started < SLOW_S:
            for agent, backend, _ in fleet:
                gpu = backend.inventory()[0].uuid
                agent.observe(
                    [
                        model.Observation(
                            model.EventKind.XID, time.time_ns(), "NVRM: Xid 13 (slow store)", "kmsg", gpu, 13
                        )
                    ]
                )
                produced += 1
            await asyncio.sleep(1.0 / EVENTS_PER_AGENT_PER_S)
        stored_while_slow = controller.ingest.events_stored
        spool_at_end_of_slow = sum(j.depth() for _, _, j in fleet)
        slow_statements = latency["statements"]
        latency["s"] = 0.0
        drained_s = await chaoslib.until(
            lambda: chaoslib.agents_alive(tasks) and all(j.depth() == 0 for _, _, j in fleet),
            60,
            "spools drained once the store is fast again",
        )
        stored = await controller.ingest.store_calls.run_in_store(lambda: controller.store.list_events(limit=100_000))
        heads = {a.identity.node_id: j.head_seq() for a, _, j in fleet}
    finally:
        sampling.set()
        stop.set()
        await asyncio.gather(sampler, *tasks, return_exceptions=True)
        await controller.stop()
        for _, _, journal in fleet:
            journal.close()

    per_node: dict[str, list[int]] = {}
    for event in stored:
        per_node.setdefault(event.node_id, []).append(event.seq)
    lost = sum(len(set(range(1, heads[n] + 1)) - set(per_node.get(n, []))) for n in heads)
    duplicates = sum(len(s) - len(set(s)) for s in per_node.values())
    figures(
        f"agents {AGENTS}, store latency {STATEMENT_LATENCY_S * 1000:.0f} ms/statement for {SLOW_S:g} s "
        f"({slow_statements} statements), events produced {produced}, stored while slow {stored_while_slow}, "
        f"spooled on agents at the end of it {spool_at_end_of_slow} (peak per agent {peaks['spool']}); controller "
        f"peaks: store queue {peaks['store_queue']}, outbound queue {peaks['outbound']}, remediation inbox "
        f"{peaks['inbox']}, test-process RSS +{peaks['rss_mib'] - rss_before:.0f} MiB; drained {drained_s:.1f} s "
        f"after the store recovered, lost {lost}, duplicates {duplicates}"
    )
    return peaks, produced, stored_while_slow, lost, duplicates, rss_before


def test_a_slow_store_pushes_back_to_the_agents_spools_not_into_unbounded_queues(tmp_path, figures):
    peaks, produced, stored_while_slow, lost, duplicates, rss_before = asyncio.run(_run(tmp_path, figures))
    # Each stream waits for its own store call before reading its next message, so the store
    # thread never holds more than one call per stream plus the flush, hooks and session bookkeeping.
    assert peaks["store_queue"] <= AGENTS + 4
    assert peaks["inbox"] <= AGENTS
    assert peaks["outbound"] <= 10, "acks do not pile up for agents"
    assert stored_while_slow < produced, "the store really was the bottleneck"
    assert peaks["spool"] > EVENTS_PER_AGENT_PER_S, "the agents held the backlog in their spools"
    assert peaks["rss_mib"] - rss_before < 150, "no memory grows with the backlog"
    assert lost == 0 and duplicates == 0
