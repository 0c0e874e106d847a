"""Hostile clients against a live controller over mutual TLS with dev certificates (issue #37, items 10-18).

Each test plays one attack of the issue's probe through real gRPC and checks what the controller
must do instead: a Hello with overflowing time and spool fields is refused and leaves no session;
label keys built to mint metric series add none; a node that claims another node's GPUs is
refused and audited against itself; viewers reading in a loop do not slow a healthy node's acks.
"""

from __future__ import annotations

import asyncio

import grpc
import pytest

from rasd.api.v1 import admin_service_pb2 as admin_pb
from rasd.api.v1 import admin_service_pb2_grpc as admin_grpc
from rasd.api.v1 import agent_service_pb2 as agent_pb
from rasd.api.v1 import agent_service_pb2_grpc as agent_grpc
from rasd.api.v1 import health_pb2 as health_pb
from rasd.common import devcerts, tls, tokens
from rasd.controller import server
from rasd.controller.rpc import authn

pytestmark = pytest.mark.slow

GPU_A = "GPU-0000000a-0000-4000-8000-00000000000a"
GPU_B = "GPU-0000000b-0000-4000-8000-00000000000b"
INT63 = 2**63 - 1


@pytest.fixture
def pki(tmp_path):
    return devcerts.init(tmp_path / "certs", ["node-a", "node-b"])


def _files(pki, pair):
    return tls.TlsFiles(pki.ca.cert, pair.cert, pair.key)


def _controller(tmp_path, pki, *, tokens_file=None, **settings):
    return server.Controller(
        server.ControllerSettings(
            listen="127.0.0.1:0",
            db_url=f"sqlite:///{tmp_path / 'rasd.db'}",
            metrics_port=None,
            security=authn.SecuritySettings(tls=_files(pki, pki.controller), tokens_file=tokens_file),
            commit_writer="thread",
            **settings,
        )
    )


def _hello(node_id, *gpus, **fields):
    return agent_pb.AgentMessage(
        hello=agent_pb.Hello(
            node_id=node_id,
            boot_id="boot",
            gpus=[health_pb.GpuInfo(uuid=gpu, power_limit_min_w=200, power_limit_max_w=700) for gpu in gpus],
            **fields,
        )
    )


def _events(*seqs, gpu=GPU_A, message="fault"):
    return agent_pb.AgentMessage(
        events=agent_pb.HealthEventBatch(
            events=[
                health_pb.HealthEvent(
                    seq=seq, kind=health_pb.EVENT_KIND_XID, gpu_uuid=gpu, xid=13, message=message, source="kmsg"
                )
                for seq in seqs
            ]
        )
    )


async def _connect(controller, pki, node_id, hello):
    """Open node_id's stream with its certificate and say hello; (channel, call, first reply or error)."""
    channel = tls.aio_channel(controller.address, _files(pki, pki.nodes[node_id]))
    call = agent_grpc.AgentServiceStub(channel).Connect()
    try:
        await call.write(hello)
        return channel, call, await call.read()
    except grpc.aio.AioRpcError as exc:
        return channel, call, exc


async def _gone(controller, node_id, timeout_s=5.0):
    """Wait until node_id has no session on the controller; whether it went."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while node_id in controller.ingest.sessions:
        if asyncio.get_running_loop().time() > deadline:
            return False
        await asyncio.sleep(0.01)
    return True


def test_a_hello_with_overflowing_times_and_spool_positions_is_refused(tmp_path, pki):
    """Item 12: sent_unix_ns 2**63-1 overflowed a command deadline; spool_acked_seq 2**63-1 the lost count."""

    async def scenario():
        controller = _controller(tmp_path, pki)
        await controller.start()
        refusals = {}
        for field, hello in (
            ("hello.sent_unix_ns", _hello("node-a", GPU_A, sent_unix_ns=INT63)),
            ("hello.spool_head_seq", _hello("node-a", GPU_A, spool_head_seq=INT63, spool_acked_seq=INT63)),
        ):
            channel, _call, reply = await _connect(controller, pki, "node-a", hello)
            refusals[field] = reply
            await channel.close()
        left_open = not await _gone(controller, "node-a")
        # The same node, sane, is welcomed and its events are acked and stored.
        channel, call, welcome = await _connect(controller, pki, "node-a", _hello("node-a", GPU_A))
        await call.write(_events(1, 2))
        ack = await call.read()
        await channel.close()
        stored = await controller.ingest.list_events(node_id="node-a", since_unix_ns=0, limit=10)
        lost = controller.registry.get_sample_value("rasd_events_lost_by_store_total")
        await controller.stop()
        return refusals, left_open, welcome, ack, stored, lost

    refusals, left_open, welcome, ack, stored, lost = asyncio.run(scenario())
    for field, reply in refusals.items():
        assert isinstance(reply, grpc.aio.AioRpcError), f"{field}: welcomed"
        assert reply.code() == grpc.StatusCode.INVALID_ARGUMENT and reply.details().startswith(field)
    assert not left_open
    assert welcome.HasField("welcome") and ack.ack.acked_seq == 2
    assert sorted(e.seq for e in stored) == [1, 2]
    assert lost == 0.0


def _series(registry, family_name):
    return [
        sample.labels
        for family in registry.collect()
        if family.name == family_name
        for sample in family.samples
        if sample.name == f"{family_name}_total"
    ]


def test_label_keys_built_to_mint_metric_series_add_none(tmp_path, pki):
    """Item 14: a Hello label key with `]` added a rasd_wire_rejections_total series per stream."""

    async def scenario():
        controller = _controller(tmp_path, pki)
        await controller.start()
        codes = set()
        for index in range(40):
            hello = _hello("node-a", GPU_A, labels={f"x]{index}\x00": "v", "rack": "r1"})
            channel, _call, reply = await _connect(controller, pki, "node-a", hello)
            codes.add(reply.code() if isinstance(reply, grpc.aio.AioRpcError) else "welcomed")
            await channel.close()
        series = _series(controller.registry, "rasd_wire_rejections")
        await controller.stop()
        return codes, series

    codes, series = asyncio.run(scenario())
    assert codes == {grpc.StatusCode.INVALID_ARGUMENT}
    assert series == [{"field": "hello.labels[]"}]


async def _audit_rows(controller):
    return await controller.ingest.run_in_store(lambda: controller.remediation.store.audit(limit=10_000))


def test_a_refused_caller_is_named_by_its_certificate_and_peer_and_cannot_flood_the_audit_log(tmp_path, pki):
    """Item 16: a bad token on a verified connection was audited as 'unauthenticated' with no peer, and
    one node certificate wrote 4.9 MB of reasons of its choosing in 15 s."""
    tokens_file = tmp_path / "tokens"
    tokens_file.write_text(f"alice operator {tokens.hash_token(tokens.new_token())}\n")

    async def scenario():
        controller = _controller(tmp_path, pki, tokens_file=tokens_file)
        await controller.start()
        viewer = tls.aio_channel(controller.address, _files(pki, pki.operators["viewer"]))
        with pytest.raises(grpc.aio.AioRpcError) as bad_token:
            await admin_grpc.AdminServiceStub(viewer).ListNodes(
                admin_pb.ListNodesRequest(), metadata=(("authorization", f"Bearer {tokens.new_token()}"),)
            )
        await viewer.close()
        node = tls.aio_channel(controller.address, _files(pki, pki.nodes["node-a"]))
        stub = admin_grpc.AdminServiceStub(node)
        codes = set()
        for _ in range(300):
            try:
                await stub.Quarantine(
                    admin_pb.QuarantineRequest(target=admin_pb.Target(node_id="node-b"), reason="\u202e" + "A" * 60_000)
                )
            except grpc.aio.AioRpcError as exc:
                codes.add(exc.code())
        await node.close()
        rows = await _audit_rows(controller)
        dropped = controller.registry.get_sample_value("rasd_audit_denials_dropped_total")
        await controller.stop()
        return bad_token.value, codes, rows, dropped

    bad_token, codes, rows, dropped = asyncio.run(scenario())
    assert bad_token.code() == grpc.StatusCode.UNAUTHENTICATED
    (refused_token,) = [r for r in rows if r["action"] == "ListNodes"]
    assert refused_token["actor"] == "cert:dev-viewer" and refused_token["outcome"] == "denied:UNAUTHENTICATED"
    assert refused_token["details"]["peer"].startswith("ipv4:127.0.0.1:")
    assert codes == {grpc.StatusCode.PERMISSION_DENIED}
    flood = [r for r in rows if r["actor"] == "node:node-a"]
    assert 1 <= len(flood) <= 25  # a burst of 20, then one every 5 s
    assert dropped == 300 - len(flood)
    assert max(len(r["reason"]) for r in flood) <= 128
    assert sum(len(r["reason"]) + len(str(r["details"])) for r in flood) < 25 * 1024
