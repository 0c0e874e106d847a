"""rasctl against a follower: the refusal names the leader's address, and rasctl calls the leader there.

Two controller replicas in one process on PostgreSQL (the chart's default: two replicas behind one
Service that may route rasctl to either). A node streams to the follower; `rasctl quarantine` is
sent to the follower, which refuses it (FAILED_PRECONDITION) with the leader's replica id and
advertised address in the trailing metadata; rasctl retries once at the leader, and it succeeds.
"""

from __future__ import annotations

import asyncio
import io

import fleetlib
import grpc

from rasd.api.v1 import admin_service_pb2 as admin_pb
from rasd.api.v1 import admin_service_pb2_grpc as admin_grpc
from rasd.cli import main as rasctl
from rasd.controller.rpc import leader_gate


async def _rasctl(*argv):
    out, err = io.StringIO(), io.StringIO()
    code = await asyncio.to_thread(rasctl.run, list(argv), out, err)
    return code, out.getvalue(), err.getvalue()


async def _refusal(address):
    async with grpc.aio.insecure_channel(address) as channel:
        call = admin_grpc.AdminServiceStub(channel).SetAutomationPaused(
            admin_pb.SetAutomationPausedRequest(paused=True, reason="x")
        )
        try:
            await call
        except grpc.aio.AioRpcError as exc:
            return exc.code(), dict(exc.trailing_metadata() or ())
        raise AssertionError("a follower paused automation")


def test_rasctl_quarantine_against_a_follower_reaches_the_leader(postgres_schema_url, tmp_path):
    async def scenario():
        async with fleetlib.two_replicas_a_node_on_the_follower(postgres_schema_url, tmp_path) as replicas:
            first, second = replicas.first, replicas.second
            gpu = replicas.backend.inventory()[0].uuid
            refusal = await _refusal(second.address)
            quarantined = await _rasctl(
                "--controller", second.address, "quarantine", f"node-r/{gpu}", "--reason", "fan noise"
            )
            rows = await first.ingest.store_calls.run_in_store(lambda: first.remediation.store.quarantines())
            again = await _rasctl("--controller", second.address, "quarantine", f"node-r/{gpu}", "--reason", "x")
            return (first.leadership.is_leader(), second.leadership.is_leader()), first.address, gpu, refusal, \
                quarantined, rows, again  # fmt: skip

    leads, leader_address, gpu, refusal, quarantined, rows, again = asyncio.run(scenario())
    assert leads == (True, False)
    code, trailers = refusal
    assert code is grpc.StatusCode.FAILED_PRECONDITION
    assert trailers == {leader_gate.LEADER_ID_KEY: "ctl-a", leader_gate.LEADER_ADDRESS_KEY: leader_address}
    assert quarantined[:2] == (0, f"quarantined node-r/{gpu}\n")
    assert f"does not lead; calling the leader at {leader_address}" in quarantined[2]
    assert [(r["node_id"], r["gpu_uuid"], r["reason"]) for r in rows] == [("node-r", gpu, "fan noise")]
    # The leader's own refusal carries no leader address: it is the answer, not retried.
    assert again[0] == rasctl.EXIT_RPC_ERROR and "already quarantined" in again[2]
