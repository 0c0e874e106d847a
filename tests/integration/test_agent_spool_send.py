"""DESIGN.md invariant 3 at the agent's sender: every spooled event reaches the controller and is stored.

Through the real Agent runtime over gRPC on loopback: against the real controller where what matters
is that it stores the events, against a scripted one where the test must choose when an ack arrives.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3

import grpc

from rasd.agent import runtime, spool, wire
from rasd.agent import settings as agent_settings
from rasd.agent.core import model
from rasd.agent.gpu import simulated
from rasd.api.v1 import agent_service_pb2 as agent_pb
from rasd.api.v1 import agent_service_pb2_grpc as agent_grpc
from rasd.controller import server

FAST_LINK = {
    "telemetry_send_interval_ms": 200,
    "reconnect_initial_s": 0.05,
    "reconnect_max_s": 0.3,
    "heartbeat_interval_ms": 500,
}


def _agent(
    address: str, spool_path: str, *, gpus: int, spool_read_page_events: int = 10_000, **link: int
) -> runtime.Agent:
    return runtime.Agent(
        agent_settings.AgentSettings(
            node_id="node-1",
            link=agent_settings.LinkSettings(controller_address=address, **FAST_LINK, **link),
            spool=agent_settings.SpoolSettings(read_page_events=spool_read_page_events),
        ),
        simulated.SimulatedBackend("node-1", gpus, 0),
        spool.Spool(spool_path),
        boot_id=f"boot-{gpus}",
    )


def _controller(tmp_path, port: int) -> server.Controller:
    settings = server.ControllerSettings(
        listen=f"127.0.0.1:{port}", db_url=f"sqlite:///{tmp_path / 'rasd.db'}", metrics_port=None
    )
    return server.Controller(settings)


async def _until(predicate, timeout_s: float) -> bool:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not predicate():
        if loop.time() > deadline:
            return False
        await asyncio.sleep(0.05)
    return True


def _xid(gpu_uuid: str, message: str) -> model.Observation:
    return model.Observation(model.EventKind.XID, 2_000, message, "kmsg", gpu_uuid=gpu_uuid, xid=13)


def test_an_event_about_a_gpu_gone_since_it_was_spooled_is_stored_naming_the_gpu(tmp_path, free_port):
    """A GPU falls off the bus while the controller is away; after the reboot NVML no longer enumerates
    it, so the Hello does not announce it. The controller refused the spooled event about it, with the
    whole batch, on every resend: nothing the node saw afterwards was ever stored."""
    spool_path = str(tmp_path / "spool.db")

    async def scenario():
        before_reboot = _agent(f"127.0.0.1:{free_port}", spool_path, gpus=2)
        gone = before_reboot.backend.inventory()[1].uuid
        before_reboot.observe(
            [
                model.Observation(
                    model.EventKind.FALLEN_OFF_BUS,
                    1_000,
                    "GPU has fallen off the bus",
                    "kmsg",
                    gpu_uuid=gone,
                    xid=79,
                    severity=model.Severity.FATAL,
                )
            ]
        )
        before_reboot.spool.close()

        controller = _controller(tmp_path, free_port)
        await controller.start()
        agent = _agent(controller.address, spool_path, gpus=1)
        assert gone not in {g.uuid for g in agent.backend.inventory()}
        present = agent.backend.inventory()[0].uuid
        agent.observe([_xid(present, "Xid 13 after the reboot")])
        stop = asyncio.Event()
        task = asyncio.create_task(agent.run(stop))
        drained = await _until(lambda: agent.spool.depth() == 0, timeout_s=8.0)
        stored = await controller.ingest.list_events(node_id="node-1", since_unix_ns=0, limit=10)
        stop.set()
        await task
        await controller.stop()
        return drained, agent, stored, gone, present

    drained, agent, stored, gone, present = asyncio.run(scenario())
    by_seq = {e.seq: e for e in stored}
    assert drained, f"spool depth {agent.spool.depth()}, streams lost: {agent.stats.stream_lost_by_code}"
    assert agent.stats.stream_lost_by_code == {}
    assert sorted(by_seq) == [1, 2]
    assert (by_seq[1].gpu_uuid, by_seq[1].xid) == ("", 79)
    assert by_seq[1].attributes[wire.UNANNOUNCED_GPU_ATTRIBUTE] == gone
    assert by_seq[2].gpu_uuid == present


def test_a_backlog_larger_than_one_spool_read_is_sent_to_its_newest_event(tmp_path, free_port):
    """A storm spooled while the controller was away, larger than one read of the spool, ending with
    the fatal event: once the first read's events were acked nothing woke the sender again."""
    page_events = 50

    async def scenario():
        agent = _agent(
            f"127.0.0.1:{free_port}",
            str(tmp_path / "spool.db"),
            gpus=1,
            spool_read_page_events=page_events,
            max_events_per_message=20,
        )
        gpu_uuid = agent.backend.inventory()[0].uuid
        flap = model.Observation(model.EventKind.IB_LINK_STATE, 1_000, "ib0: Link DOWN", "kmsg")
        agent.spool.append([flap] * (3 * page_events + 7))
        fatal = model.Observation(
            model.EventKind.XID, 2_000, "Xid 79", "kmsg", gpu_uuid=gpu_uuid, xid=79, severity=model.Severity.FATAL
        )
        (last,) = agent.spool.append([fatal])
        controller = _controller(tmp_path, free_port)
        await controller.start()
        stop = asyncio.Event()
        task = asyncio.create_task(agent.run(stop))
        drained = await _until(lambda: agent.spool.acked_seq() == last.seq, timeout_s=8.0)
        stored = await controller.ingest.list_events(node_id="node-1", since_unix_ns=0, limit=1)
        stop.set()
        await task
        await controller.stop()
        return drained, agent, stored, last

    drained, agent, stored, last = asyncio.run(scenario())
    assert drained, f"acked through {agent.spool.acked_seq()} of {last.seq}: the newest events were never sent"
    assert agent.stats.events_sent == last.seq
    assert [(e.seq, e.xid) for e in stored] == [(last.seq, 79)]


class AckLaterController(agent_grpc.AgentServiceServicer):
    """Acks the first event batch only after `before_ack` ran, then records the seqs sent next."""

    def __init__(self, before_ack) -> None:
        self.before_ack = before_ack
        self.first_batch: list[int] = []
        self.after_ack: list[int] = []
        self.got_more = asyncio.Event()

    async def Connect(self, request_iterator, context):
        await context.read()  # the Hello
        await context.write(agent_pb.ControllerMessage(welcome=agent_pb.Welcome(acked_seq=0, session_id="s1")))
        while not self.first_batch:
            message = await context.read()
            if message.HasField("events"):
                self.first_batch = [e.seq for e in message.events.events]
        self.before_ack()
        await context.write(agent_pb.ControllerMessage(ack=agent_pb.EventAck(acked_seq=self.first_batch[-1])))
        while True:
            message = await context.read()
            if message is grpc.aio.EOF:
                return
            if message.HasField("events"):
                self.after_ack.extend(e.seq for e in message.events.events)
                self.got_more.set()


def test_an_ack_wakes_the_sender_for_events_spooled_without_a_wake_up(tmp_path):
    """The sender reads the spool when woken; an event written to the spool without observe()'s wake-up
    is sent once the controller acks what came before, not left for the next observation."""

    async def scenario():
        agent: runtime.Agent | None = None

        def spool_behind_the_senders_back() -> None:
            assert agent is not None
            agent.spool.append([_xid(agent.backend.inventory()[0].uuid, "spooled directly")])

        controller = AckLaterController(spool_behind_the_senders_back)
        grpc_server = grpc.aio.server()
        agent_grpc.add_AgentServiceServicer_to_server(controller, grpc_server)
        port = grpc_server.add_insecure_port("127.0.0.1:0")
        await grpc_server.start()
        agent = _agent(f"127.0.0.1:{port}", str(tmp_path / "spool.db"), gpus=1)
        agent.observe([_xid(agent.backend.inventory()[0].uuid, "observed")])
        stop = asyncio.Event()
        task = asyncio.create_task(agent.run(stop))
        with contextlib.suppress(TimeoutError):  # the assertions below say what did not arrive
            await asyncio.wait_for(controller.got_more.wait(), timeout=3.0)
        stop.set()
        await task
        await grpc_server.stop(None)
        return controller

    controller = asyncio.run(scenario())
    assert controller.first_batch == [1]
    assert controller.after_ack == [2], "the event spooled without a wake-up waited for the next observation"


def test_a_reimaged_node_whose_new_spool_passed_the_old_acked_position_loses_nothing(tmp_path, free_port):
    """The invariant-3 audit: a new spool (state dir lost) with more events than the old one had acked
    was welcomed with the old acked position, and the agent deleted its first new events unsent."""

    async def scenario():
        controller = _controller(tmp_path, free_port)
        await controller.start()
        try:
            old = _agent(controller.address, str(tmp_path / "spool-old.db"), gpus=2)
            gpu_uuid = old.backend.inventory()[0].uuid
            stop = asyncio.Event()
            task = asyncio.create_task(old.run(stop))
            old.observe([_xid(gpu_uuid, f"old-{i}") for i in range(3)])
            assert await _until(lambda: old.spool.acked_seq() == 3, 10)
            stop.set()
            await task
            new = _agent(controller.address, str(tmp_path / "spool-new.db"), gpus=2)  # reimaged: a new spool
            new.observe([_xid(gpu_uuid, f"new-{i}") for i in range(4)])  # boot-time faults, before it connects
            stop = asyncio.Event()
            task = asyncio.create_task(new.run(stop))
            assert await _until(lambda: new.stats.connected and new.spool.depth() == 0, 10)
            stop.set()
            await task
            stored = await controller.ingest.list_events(node_id="node-1", since_unix_ns=0, limit=100)
            return sorted(e.message for e in stored)
        finally:
            await controller.stop()

    messages = asyncio.run(scenario())
    assert [m for m in messages if "new" in m] == [f"new-{i}" for i in range(4)], messages


def test_a_controller_restored_from_a_backup_takes_the_agents_word_for_what_it_had_acked(tmp_path, free_port):
    """The store comes back without its last acks: the agent, which dropped them, resends after them,
    and the ack waited on the gap for ever (its spool grew, every reconnect resent all of it)."""

    async def scenario():
        controller = _controller(tmp_path, free_port)
        await controller.start()
        agent = _agent(controller.address, str(tmp_path / "spool.db"), gpus=2)
        gpu_uuid = agent.backend.inventory()[0].uuid
        stop = asyncio.Event()
        task = asyncio.create_task(agent.run(stop))
        try:
            agent.observe([_xid(gpu_uuid, f"before-{i}") for i in range(5)])
            assert await _until(lambda: agent.spool.acked_seq() == 5, 10)
            await controller.stop()
            # The backup: seqs 3..5 and their ack are not in it.
            with contextlib.closing(sqlite3.connect(tmp_path / "rasd.db")) as db, db:
                db.execute("UPDATE nodes SET acked_seq = 2 WHERE node_id = 'node-1'")
                db.execute("DELETE FROM health_events WHERE node_id = 'node-1' AND seq > 2")
            controller = _controller(tmp_path, free_port)
            await controller.start()
            assert await _until(lambda: agent.stats.connected, 10)
            agent.observe([_xid(gpu_uuid, f"after-{i}") for i in range(3)])  # seqs 6..8
            drained = await _until(lambda: agent.spool.depth() == 0, 5)
            stored = await controller.ingest.list_events(node_id="node-1", since_unix_ns=0, limit=50)
            lost = controller.metrics.registry.get_sample_value("rasd_events_lost_by_store_total")
            return drained, sorted(e.seq for e in stored), lost
        finally:
            stop.set()
            await task
            await controller.stop()

    drained, stored, lost = asyncio.run(scenario())
    assert drained and stored == [1, 2, 6, 7, 8] and lost == 3
