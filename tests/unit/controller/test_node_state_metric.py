"""rasd_nodes{state} counts the nodes this replica holds in the state the store says they are in."""

from __future__ import annotations

import asyncio

from prometheus_client import generate_latest

from rasd.api.v1 import agent_service_pb2 as agent_pb
from rasd.api.v1 import commands_pb2 as commands_pb
from rasd.api.v1 import health_pb2 as health_pb
from rasd.controller import server
from rasd.controller.store import remediation as rstore


def _hello(node_id: str, gpu: str) -> agent_pb.Hello:
    info = health_pb.GpuInfo(uuid=gpu, model="H100", power_limit_min_w=200, power_limit_max_w=700)
    return agent_pb.Hello(node_id=node_id, boot_id="b", gpus=[info])


def _gauge(controller: server.Controller, state: str) -> float:
    for line in generate_latest(controller.registry).decode().splitlines():
        if line.startswith(f'rasd_nodes{{state="{state}"}}'):
            return float(line.split()[-1])
    raise AssertionError(f"no rasd_nodes sample for {state}")


def test_a_quarantined_node_is_counted_as_quarantined_not_healthy(tmp_path, free_port):
    async def scenario() -> tuple[float, float, float, float]:
        settings = server.ControllerSettings(
            listen=f"127.0.0.1:{free_port}", db_url=f"sqlite:///{tmp_path / 'rasd.db'}", metrics_port=None
        )
        controller = server.Controller(settings)
        await controller.start()
        try:
            for i in range(3):
                await controller.ingest.open_session(_hello(f"node-{i}", f"GPU-00000000-0000-4000-8000-00000000000{i}"))
            before = (_gauge(controller, "healthy"), _gauge(controller, "quarantined"))
            store = rstore.RemediationStore(controller.store.engine)
            store.commit(rstore.Commit(now_unix_ns=1, quarantines=[{"node_id": "node-1", "reason": "test"}]))
            after = (_gauge(controller, "healthy"), _gauge(controller, "quarantined"))
            return (*before, *after)
        finally:
            await controller.stop()

    healthy_before, quarantined_before, healthy_after, quarantined_after = asyncio.run(scenario())
    assert (healthy_before, quarantined_before) == (3, 0)
    assert (healthy_after, quarantined_after) == (2, 1)


def test_a_result_the_remediation_hook_refuses_is_logged_with_its_command(tmp_path, free_port, capsys):
    async def scenario() -> None:
        settings = server.ControllerSettings(
            listen=f"127.0.0.1:{free_port}", db_url=f"sqlite:///{tmp_path / 'rasd.db'}", metrics_port=None
        )
        controller = server.Controller(settings)
        await controller.start()
        try:
            session, _welcome = await controller.ingest.open_session(
                _hello("node-1", "GPU-00000000-0000-4000-8000-000000000001")
            )

            async def refusing(node_id: str, result: object) -> None:
                raise RuntimeError("this replica is not the leader")

            controller.ingest.command_result_hook = refusing
            controller.ingest.on_result(session, commands_pb.ActionResult(command_id="cmd-7", outcome=1))
            for _ in range(5):
                await asyncio.sleep(0)
        finally:
            await controller.stop()

    asyncio.run(scenario())
    out = capsys.readouterr()
    logged = out.out + out.err
    assert "command_result_not_applied" in logged and "cmd-7" in logged and "not the leader" in logged
    assert "never retrieved" not in logged
