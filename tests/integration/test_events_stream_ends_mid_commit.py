"""Invariant 3 at the ingest: a batch whose stream ends while it commits is still decided.

The commit lands whether or not the stream is still there, and the agent's resend on its next
stream is a duplicate. The hand-over to remediation used to wait for the stream's reader: cancelled
with the stream, the events were stored and acked but never decided (the invariant-3 audit: 25 of 25
trials with a client gone 0 ms after sending, 17 of 25 at 1 ms), and the node's next decision moved
the start-up replay's watermark past them.

A busy store widens the window: another connection holds the SQLite write lock (a real one, on
the same file) while the stream sends its batch and goes away.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time

import grpc

from rasd.api.v1 import agent_service_pb2 as agent_pb
from rasd.api.v1 import agent_service_pb2_grpc as agent_grpc
from rasd.api.v1 import health_pb2 as health_pb
from rasd.controller import server

GPUS = ("GPU-00000000-0000-4000-8000-0000000000a0", "GPU-00000000-0000-4000-8000-0000000000a1")
HELLO = agent_pb.AgentMessage(
    hello=agent_pb.Hello(
        node_id="node-c",
        boot_id="b",
        spool_head_seq=3,
        gpus=[health_pb.GpuInfo(uuid=g, power_limit_min_w=200, power_limit_max_w=700) for g in GPUS],
    )
)


def _event(seq: int, gpu: str, xid: int) -> health_pb.HealthEvent:
    return health_pb.HealthEvent(
        seq=seq, observed_unix_ns=time.time_ns(), kind=health_pb.EVENT_KIND_XID, gpu_uuid=gpu, xid=xid,
        severity=health_pb.SEVERITY_FATAL, message=f"Xid {xid}",
    )  # fmt: skip


def _hold_write_lock(db_path, held_s: float, taken: threading.Event) -> None:
    conn = sqlite3.connect(db_path, isolation_level=None)
    conn.execute("BEGIN IMMEDIATE")
    taken.set()
    time.sleep(held_s)
    conn.execute("ROLLBACK")
    conn.close()


def test_a_batch_whose_stream_ends_while_it_commits_is_decided(tmp_path, free_port):
    db_path = tmp_path / "rasd.db"

    async def scenario():
        controller = server.Controller(
            server.ControllerSettings(listen=f"127.0.0.1:{free_port}", db_url=f"sqlite:///{db_path}", metrics_port=None)
        )
        await controller.start()
        try:
            async with grpc.aio.insecure_channel(controller.address) as channel:
                call = agent_grpc.AgentServiceStub(channel).Connect()
                await call.write(HELLO)
                assert (await call.read()).HasField("welcome")
                taken = threading.Event()
                holder = threading.Thread(target=_hold_write_lock, args=(db_path, 0.8, taken))
                holder.start()
                taken.wait(5)
                await call.write(
                    agent_pb.AgentMessage(
                        events=agent_pb.HealthEventBatch(events=[_event(1, GPUS[0], 79), _event(2, GPUS[1], 48)])
                    )
                )
                await asyncio.sleep(0.2)
                call.cancel()  # the agent is killed while its batch waits for the store
            await asyncio.to_thread(holder.join, 5)

            for _ in range(200):
                if controller.remediation.store.tickets(node_id="node-c"):
                    break
                await asyncio.sleep(0.05)
            stored = sorted(
                e.seq for e in await controller.ingest.list_events(node_id="node-c", since_unix_ns=0, limit=10)
            )
            tickets = sorted((t["gpu_uuid"], t["rung"]) for t in controller.remediation.store.tickets(node_id="node-c"))
            return stored, tickets
        finally:
            await controller.stop()

    stored, tickets = asyncio.run(scenario())
    assert stored == [1, 2]
    # Xid 79 reboots the node; the Xid 48 on its other GPU folds into that reboot.
    assert tickets == [(GPUS[0], "reboot_node")], tickets
