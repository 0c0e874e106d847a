"""rasd.sim.swarm against a real controller: own streams, telemetry, events to a repair, a mass reconnect."""

from __future__ import annotations

import asyncio

from rasd.api.v1 import health_pb2 as health_pb
from rasd.controller import server
from rasd.sim import swarm

NODES = 40


async def _until(predicate, timeout_s: float = 30.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not predicate():
        if loop.time() > deadline:
            raise TimeoutError("condition not met in time")
        await asyncio.sleep(0.05)


def _controller(tmp_path, port: int) -> server.Controller:
    return server.Controller(
        server.ControllerSettings(
            listen=f"127.0.0.1:{port}", db_url=f"sqlite:///{tmp_path / 'rasd.db'}", metrics_port=None
        )
    )


def test_a_swarm_streams_telemetry_gets_repairs_and_reconnects_after_a_controller_restart(tmp_path, free_port):
    async def scenario() -> None:
        controller = _controller(tmp_path, free_port)
        await controller.start()
        fleet = swarm.Swarm(
            [f"node-{i:03d}" for i in range(NODES)],
            swarm.SwarmSettings(
                controller_address=controller.address,
                send_interval_ms=200,
                power_sample_interval_ms=100,
                reconnect_initial_s=0.2,
                reconnect_max_s=1.0,
            ),
            labels=lambda i: {"rack": f"rack-{i // 8}"},
        )
        stop = asyncio.Event()
        runner = asyncio.create_task(fleet.run(stop))
        try:
            await _until(lambda: len(controller.ingest.sessions) == NODES)
            # Each agent is its own node with its own GPUs and stream.
            assert len({a.gpus[0].uuid for a in fleet.agents}) == NODES
            assert len({s.session_id for s in controller.ingest.sessions.values()}) == NODES
            await _until(lambda: controller.ingest.samples_ingested >= NODES * 8 * 2 * 2)

            # An application Xid on one node travels spool → stream → store → ack → ladder → command.
            agent = fleet.agents[7]
            agent.inject(health_pb.EVENT_KIND_XID, gpu_index=3, xid=13, message="NVRM: Xid 13, Graphics Exception")
            await _until(lambda: agent.stats.commands and agent.spool_depth == 0)
            assert [kind for _at, _cid, kind in agent.stats.commands] == ["restart_process"]
            assert agent.stats.acked_seq == 1
            await _until(lambda: controller.remediation.stats.actions_by_kind.get("restart_process") == 1)
            assert all(not a.stats.commands for a in fleet.agents if a is not agent)

            # The controller goes away; every agent loses its stream and comes back to the new one.
            await controller.stop()
            await _until(lambda: fleet.connected == 0)
            agent.inject(
                health_pb.EVENT_KIND_XID, gpu_index=0, xid=31, message="NVRM: Xid 31 while the controller is down"
            )
            controller = _controller(tmp_path, free_port)
            await controller.start()
            await _until(lambda: len(controller.ingest.sessions) == NODES and fleet.connected == NODES)
            assert all(a.stats.connects >= 2 for a in fleet.agents)
            # The event spooled during the outage is delivered and acked on the new stream.
            await _until(lambda: agent.spool_depth == 0)
            assert agent.stats.acked_seq == 2
        finally:
            stop.set()
            await runner
            await controller.stop()

    asyncio.run(scenario())


def test_swarm_agents_send_summaries_and_raw_batches_and_the_window_counts_every_gpu_once(tmp_path, free_port):
    """Summaries (as a real agent sends them now) and raw batches (as agents before them) side by side."""

    async def scenario() -> None:
        controller = _controller(tmp_path, free_port)
        await controller.start()
        fleets = [
            swarm.Swarm(
                [f"{kind}-{i}" for i in range(4)],
                swarm.SwarmSettings(controller_address=controller.address, telemetry_summaries=kind == "summary"),
            )
            for kind in ("summary", "raw")
        ]
        stop = asyncio.Event()
        runners = [asyncio.create_task(f.run(stop)) for f in fleets]
        try:
            await _until(lambda: len(controller.ingest.sessions) == 8)
            sessions = controller.ingest.sessions
            assert all(s.summaries == node.startswith("summary") for node, s in sessions.items())
            await _until(lambda: all(a.stats.telemetry_batches >= 3 for f in fleets for a in f.agents))
            # A bucket that every node has sent: every GPU of both kinds counted, once.
            rows = controller.ingest.power_window.series()
            assert max(gpus for _, _, gpus in rows) == 8 * 8
            assert all(gpus <= 8 * 8 for _, _, gpus in rows)
            summarised = next(a for a in fleets[0].agents)
            latest = controller.ingest.latest[summarised.gpus[0].uuid]
            assert latest.enforced_power_limit_w == 700 and latest.temperature_c == 62
        finally:
            stop.set()
            await asyncio.gather(*runners)
            await controller.stop()

    asyncio.run(scenario())
