"""Two controller replicas in one process on PostgreSQL: a command from the leader to a node whose
stream ends on the follower goes through the store and its result comes back (`Relay.send_command`).

This is the path the fleet-wide loops outside the repair ladder (power caps) take with several
replicas; the ladder's own commands go through the outbox (tests/integration/test_leader_failover.py).
The follower serves reads and refuses a fleet-changing admin call, naming the leader; the leader
learns the GPUs and labels of the follower's nodes; a replica starting does not mark the other
replicas' streams disconnected.
"""

from __future__ import annotations

import asyncio
import functools

import grpc
import pytest

from rasd.agent import node_ops, runtime, spool
from rasd.agent import settings as agent_settings
from rasd.agent.gpu import simulated
from rasd.api.v1 import admin_service_pb2 as admin_pb
from rasd.api.v1 import admin_service_pb2_grpc as admin_grpc
from rasd.api.v1 import commands_pb2 as commands_pb
from rasd.controller import server
from rasd.controller.replication import leader


def _controller(db_url, port, name):
    return server.Controller(
        server.ControllerSettings(
            listen=f"127.0.0.1:{port}",
            db_url=db_url,
            metrics_port=None,
            leader=leader.LeaderSettings(replica_id=f"ctl-{name}", lease_s=3.0, renew_s=0.5, relay_poll_s=0.05),
        )
    )


def test_a_command_reaches_a_node_on_the_other_replica_and_its_result_comes_back(
    postgres_schema_url, free_port, tmp_path
):
    async def scenario():
        first = _controller(postgres_schema_url, free_port, "a")
        await first.start()
        second = _controller(postgres_schema_url, 0, "b")
        await second.start()
        backend = simulated.SimulatedBackend("node-r", 2, 0, workload=simulated.StepWorkload())
        agent = runtime.Agent(
            agent_settings.AgentSettings(
                node_id="node-r",
                link=agent_settings.LinkSettings(controller_address=second.address, telemetry_send_interval_ms=200),
                actions=agent_settings.ActionSettings(destructive_enabled=True, kill_poll_s=0.0),
            ),
            backend,
            spool.Spool(str(tmp_path / "spool.db")),
            boot_id="boot-1",
            ops=node_ops.SimulatedNodeOps(backend),
        )
        stop = asyncio.Event()
        task = asyncio.create_task(agent.run(stop))
        while "node-r" not in second.ingest.sessions:
            await asyncio.sleep(0.05)
        uuids = [g.uuid for g in backend.inventory()]
        command = commands_pb.Command(
            command_id="cap-relayed-1",
            reason="power loop on the leader",
            set_power_cap=commands_pb.SetPowerCap(
                limits=[commands_pb.GpuPowerLimit(gpu_uuid=u, power_limit_w=450) for u in uuids]
            ),
        )
        leads = (first.leadership.is_leader(), second.leadership.is_leader())
        result = await first.send_command("node-r", command, timeout_s=20)
        with pytest.raises(TimeoutError):
            await first.relay.send_command("node-nowhere", commands_pb.Command(command_id="lost"), timeout_s=0.5)
        # `rasctl validate` lands on the leader; the node's stream is on the follower.
        await first.remediation.operator_validate("node-r", "", suite="quick", seed=1, actor="test")
        verdicts: list = []
        for _ in range(400):
            rows = await first.ingest.store_calls.run_in_store(
                functools.partial(first.remediation.store.validations, node_id="node-r")
            )
            verdicts = [r["verdict"] for r in rows]
            if verdicts and "running" not in verdicts:
                break
            await asyncio.sleep(0.05)
        with pytest.raises(ConnectionError):
            await first.remediation.operator_validate("node-nowhere", "", suite="quick", seed=1, actor="test")
        left = await first.ingest.store_calls.run_in_store(first.relay.store.relayed_commands, 0)
        refused, listed = await _admin_on_follower(second.address)
        await first.relay.refresh_inventory()
        known = (first.ingest.node_gpus("node-r"), first.ingest.node_labels.get("node-r"))
        third = _controller(postgres_schema_url, 0, "c")  # a replica starting (a rolling update)
        await third.start()
        await third.stop()
        (node,) = await first.ingest.list_nodes()
        stop.set()
        await task
        await second.stop()
        await first.stop()
        return leads, result, left, agent, node, refused, listed, known, uuids, verdicts

    leads, result, left, agent, node, refused, listed, known, uuids, verdicts = asyncio.run(scenario())
    assert leads == (True, False)
    assert result.command_id == "cap-relayed-1" and result.outcome == commands_pb.ACTION_OUTCOME_SUCCEEDED
    assert {limit.power_limit_w for limit in result.enforced_limits} == {450}
    assert agent.stats.commands_executed == 2
    assert verdicts == ["pass"], "an operator's validation reaches a node on the other replica"
    assert left == [], "answered and given-up commands are withdrawn"
    assert node.connected, "a replica starting does not mark another replica's streams disconnected"
    assert refused.code() is grpc.StatusCode.FAILED_PRECONDITION
    assert "Quarantine changes the fleet and runs on the leader" in refused.details()
    assert "leader: ctl-a" in refused.details()
    assert listed == ["node-r"], "a follower serves reads"
    assert known == (tuple(sorted(uuids)), {}), "the leader knows the GPUs of a node on another replica"


async def _admin_on_follower(address):
    async with grpc.aio.insecure_channel(address) as channel:
        stub = admin_grpc.AdminServiceStub(channel)
        try:
            await stub.Quarantine(
                admin_pb.QuarantineRequest(target=admin_pb.Target(node_id="node-r"), reason="disk noise")
            )
        except grpc.aio.AioRpcError as exc:
            refused = exc
        else:
            raise AssertionError("a follower quarantined")
        nodes = await stub.ListNodes(admin_pb.ListNodesRequest())
        return refused, [n.node_id for n in nodes.nodes]
