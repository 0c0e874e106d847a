"""rasd_nodes{state} counts the nodes this replica holds in the state the store says they are in."""

from __future__ import annotations

import asyncio
import time

from prometheus_client import CollectorRegistry, generate_latest

from rasd.api.v1 import agent_service_pb2 as agent_pb
from rasd.api.v1 import health_pb2 as health_pb
from rasd.controller import server
from rasd.controller.core import agent_messages as msgs
from rasd.controller.core import fleet
from rasd.controller.ingest import consumer as consumer_mod
from rasd.controller.ingest import service as ingest_mod
from rasd.controller.ingest import streams as streams_mod
from rasd.controller.observability import metrics
from rasd.controller.store import records, repo
from rasd.controller.store import remediation as rstore
from rasd.controller.store import thread as store_thread
from rasd.controller.wire import agent as wire


def _hello(node_id: str, gpu: str) -> fleet.NodeHello:
    info = health_pb.GpuInfo(uuid=gpu, model="H100", power_limit_min_w=200, power_limit_max_w=700)
    return wire.hello_from_wire(agent_pb.Hello(node_id=node_id, boot_id="b", gpus=[info]))


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
            store.commit(
                rstore.Commit(now_unix_ns=1, quarantines=[records.QuarantineRecord(node_id="node-1", reason="test")])
            )
            after = (_gauge(controller, "healthy"), _gauge(controller, "quarantined"))
            return (*before, *after)
        finally:
            await controller.stop()

    healthy_before, quarantined_before, healthy_after, quarantined_after = asyncio.run(scenario())
    assert (healthy_before, quarantined_before) == (3, 0)
    assert (healthy_after, quarantined_after) == (2, 1)


class _Refusing(consumer_mod.StoreOnly):
    """The consumer of a replica that lost the lead: it cannot take a result."""

    async def result(self, node_id: str, result: msgs.AgentResult) -> None:
        raise RuntimeError("this replica is not the leader")


def test_a_result_the_consumer_refuses_is_logged_with_its_command(tmp_path, capsys):
    store = repo.Store.open(f"sqlite:///{tmp_path / 'rasd.db'}")
    thread = store_thread.StoreThread()
    controller_metrics = metrics.ControllerMetrics(CollectorRegistry())
    consumer = _Refusing(consumer_mod.EventLog(store, thread, controller_metrics))
    ingest = ingest_mod.Ingest(
        store, thread, streams_mod.AgentStreams(clock=time.time_ns), controller_metrics, consumer
    )

    async def scenario() -> None:
        await ingest.start()
        try:
            session, _welcome = await ingest.open_session(_hello("node-1", "GPU-00000000-0000-4000-8000-000000000001"))
            ingest.on_result(session, msgs.AgentResult(command_id="cmd-7", outcome=msgs.Outcome.SUCCEEDED))
            for _ in range(5):
                await asyncio.sleep(0)
        finally:
            await ingest.stop()

    try:
        asyncio.run(scenario())
    finally:
        thread.close()
        store.close()
    out = capsys.readouterr()
    logged = out.out + out.err
    assert "command_result_not_applied" in logged and "cmd-7" in logged and "not the leader" in logged
    assert "never retrieved" not in logged
