"""A node whose agent stops streaming is quarantined by the leader, whichever replica held its stream;
when its agent streams again, it is validated and released.

Two replicas on a real PostgreSQL (the chart's default); node-f streams to the follower, node-l to the
leader. The leader hears neither stream of node-f itself: only the follower's last-seen writes keep it
alive. Times are shrunk (lost after 2 s, last-seen flushed every 0.2 s) so the test runs in seconds.
"""

from __future__ import annotations

import asyncio
import dataclasses

import fleetlib
import pytest

from rasd.agent import node_ops, runtime, spool
from rasd.agent import settings as agent_settings
from rasd.agent.gpu import simulated
from rasd.controller import server
from rasd.controller.core.remediation import policy as policy_mod
from rasd.controller.ingest import service as ingest_mod

LOST_AFTER_S = 2.0
LINK = {"telemetry_send_interval_ms": 200, "heartbeat_interval_ms": 500, "reconnect_max_s": 0.3}


def _replica(db_url: str, name: str) -> server.Controller:
    policy = policy_mod.RemediationPolicy(
        lost_nodes=policy_mod.LostNodePolicy(lost_after_s=LOST_AFTER_S, check_interval_s=0.2)
    )
    ingest = dataclasses.replace(ingest_mod.IngestSettings(), flush_interval_s=0.2)
    return fleetlib.replica(db_url, name, ingest=ingest, remediation_policy=policy)


def _agent(node_id: str, address: str, tmp_path) -> runtime.Agent:
    backend = simulated.SimulatedBackend(node_id, 2, 0, workload=simulated.StepWorkload())
    return runtime.Agent(
        agent_settings.AgentSettings(
            node_id=node_id,
            link=agent_settings.LinkSettings(controller_address=address, **LINK),
            actions=agent_settings.ActionSettings(destructive_enabled=True, kill_poll_s=0.0),  # validation runs
        ),
        backend,
        spool.Spool(str(tmp_path / f"{node_id}.db")),
        boot_id="boot-1",
        ops=node_ops.SimulatedNodeOps(backend),
    )


async def _until(predicate, timeout_s: float = 20.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.05)


@pytest.mark.slow  # about 10 s of wall time: left to `make test-all`; the unit tests cover the watch on both stores
def test_the_leader_quarantines_a_node_that_fell_silent_on_the_follower_spares_the_live_ones_and_takes_it_back(
    postgres_schema_url, tmp_path
):
    async def scenario():
        first, second = _replica(postgres_schema_url, "a"), _replica(postgres_schema_url, "b")
        await first.start()
        await second.start()
        agents = {
            "node-f": _agent("node-f", second.address, tmp_path),
            "node-l": _agent("node-l", first.address, tmp_path),
        }
        stops = {node: asyncio.Event() for node in agents}
        tasks = {node: asyncio.create_task(agent.run(stops[node])) for node, agent in agents.items()}
        ladder = first.remediation
        try:
            await _until(lambda: "node-f" in second.ingest.sessions and "node-l" in first.ingest.sessions)
            await asyncio.sleep(2.5 * LOST_AFTER_S)  # both alive past lost_after_s: node-f only through the follower
            quiet = list(ladder.store.quarantines())

            stops["node-f"].set()  # its agent stops: the stream ends, nothing more is heard
            await tasks.pop("node-f")
            await _until(lambda: bool(ladder.store.quarantines()), timeout_s=10 * LOST_AFTER_S)
            await asyncio.sleep(2 * LOST_AFTER_S)  # and nothing more follows
            lost = (ladder.store.quarantines(), ladder.store.tickets(open_only=True))

            stops["node-f"] = asyncio.Event()  # the host is back: its agent streams again, to the follower
            back = _agent("node-f", second.address, tmp_path)
            tasks["node-f"] = asyncio.create_task(back.run(stops["node-f"]))
            await _until(lambda: not ladder.store.quarantines(), timeout_s=20 * LOST_AFTER_S)
            validations = [c.status for c in ladder.store.commands(node_id="node-f") if c.kind == "run_validation"]
            return quiet, lost, validations
        finally:
            for node, task in tasks.items():
                stops[node].set()
                await task
            await second.stop()
            await first.stop()

    quiet, (quarantines, tickets), validations = asyncio.run(scenario())
    assert quiet == []
    assert [(q["node_id"], q["gpu_uuid"]) for q in quarantines] == [("node-f", "")]
    (ticket,) = tickets
    assert (ticket["node_id"], ticket["state"]) == ("node-f", "awaiting_operator")
    assert "fault node_lost: node lost: no replica has heard from its agent" in ticket["steps"][0]
    assert validations == ["succeeded"]  # back: validated on the node, then released by the leader
