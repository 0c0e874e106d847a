"""Fuzzed AdminService requests against a live controller with a connected agent.

Every RPC of the service gets random-structure requests and mutated valid ones (a real node and GPU
as targets, then one field set to a hostile value), through the auth interceptor as an admin. Every
answer must be OK or one of the status codes the API documents for bad input; UNKNOWN or INTERNAL
(an unhandled exception in a handler) fails the test. Afterwards the controller still serves.
"""

from __future__ import annotations

import asyncio
import math

import grpc
import pytest
import rasd_fuzz_strategies as fuzz
from conftest import FUZZ_INPUTS
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rasd.agent import node_ops, runtime, spool
from rasd.agent import settings as agent_settings
from rasd.agent.gpu import simulated
from rasd.api.v1 import admin_service_pb2 as admin_pb
from rasd.controller import server

METHODS = list(admin_pb.DESCRIPTOR.services_by_name["AdminService"].methods)
ALLOWED = {
    grpc.StatusCode.OK,
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.ALREADY_EXISTS,
    grpc.StatusCode.UNIMPLEMENTED,
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.DEADLINE_EXCEEDED,
}
NODE = "node-fz"
WATCH_DEADLINE_S = 0.5
"""How long a fuzzed watch is read: its refusal comes at once; a valid one may stay silent."""


def _request_class(method):
    return getattr(admin_pb, method.input_type.name)


class Live:
    """A plaintext loopback controller (anonymous callers are admins) and one simulated agent."""

    def __init__(self, tmp_path):
        self.loop = asyncio.new_event_loop()
        self.controller = server.Controller(
            server.ControllerSettings(
                listen="127.0.0.1:0", db_url=f"sqlite:///{tmp_path / 'rasd.db'}", metrics_port=None
            )
        )
        self.backend = simulated.SimulatedBackend(NODE, 2, 1, workload=None)
        self.stop = asyncio.Event()
        self.calls = 0
        self.codes: dict[str, int] = {}
        self.loop.run_until_complete(self._start())

    async def _start(self):
        await self.controller.start()
        self.agent = runtime.Agent(
            agent_settings.AgentSettings(
                node_id=NODE,
                link=agent_settings.LinkSettings(controller_address=self.controller.address),
                actions=agent_settings.ActionSettings(destructive_enabled=True, kill_poll_s=0.0),
            ),
            self.backend,
            spool.Spool(":memory:"),
            boot_id="boot",
            ops=node_ops.SimulatedNodeOps(self.backend),
        )
        self.task = asyncio.create_task(self.agent.run(self.stop))
        while NODE not in self.controller.ingest.sessions:
            await asyncio.sleep(0.05)
        self.channel = grpc.aio.insecure_channel(self.controller.address)

    async def call(self, method, request):
        path = f"/rasd.api.v1.AdminService/{method.name}"
        self.calls += 1
        try:
            if method.server_streaming:
                # A watch stays open and may say nothing until the fleet changes: a bad request is
                # refused at once, so a short deadline (DEADLINE_EXCEEDED: accepted and silent) is
                # enough, where 10 s per watch would make the fuzzing idle for minutes.
                stream = self.channel.unary_stream(
                    path, request_serializer=lambda m: m.SerializeToString(), response_deserializer=lambda b: b
                )(request, timeout=WATCH_DEADLINE_S)
                await stream.read()
                stream.cancel()
            else:
                await self.channel.unary_unary(
                    path, request_serializer=lambda m: m.SerializeToString(), response_deserializer=lambda b: b
                )(request, timeout=10)
            code = grpc.StatusCode.OK
        except grpc.aio.AioRpcError as exc:
            code = exc.code()
            assert code in ALLOWED, f"{method.name}({request}) -> {code.name}: {exc.details()}"
        self.codes[code.name] = self.codes.get(code.name, 0) + 1

    def close(self):
        async def stop():
            self.stop.set()
            await self.task
            await self.channel.close()
            await self.controller.stop()

        self.loop.run_until_complete(stop())
        self.loop.close()


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    harness = Live(tmp_path_factory.mktemp("fuzz-admin"))
    yield harness
    harness.close()


def _valid(method, gpus):
    """A request a careful operator could send to this method, naming the live node and its GPUs."""
    target = st.builds(admin_pb.Target, node_id=st.just(NODE), gpu_uuid=st.sampled_from(["", *gpus]))
    reason = st.text(min_size=1, max_size=30)
    cls = _request_class(method)
    fields = cls.DESCRIPTOR.fields_by_name
    kwargs = {}
    if "target" in fields:
        kwargs["target"] = target
    if "reason" in fields:
        kwargs["reason"] = reason
    if "node_id" in fields:
        kwargs["node_id"] = st.sampled_from(["", NODE])
    if "suite" in fields:
        kwargs["suite"] = st.sampled_from(["quick", "accusation", "post-repair"])
    if "limit" in fields:
        kwargs["limit"] = st.integers(0, 200)
    return st.builds(cls, **kwargs)


@settings(
    max_examples=max(24, math.ceil(1.2 * FUZZ_INPUTS / 20)),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture],
    database=None,
)
@given(data=st.data())
def test_fuzzed_admin_requests(live, data):
    method = data.draw(st.sampled_from(METHODS))
    gpus = [g.uuid for g in live.backend.inventory()]
    cls = _request_class(method)
    request = data.draw(
        st.one_of(fuzz.message(cls), _valid(method, gpus), fuzz.field_mutated(_valid(method, gpus))), label="request"
    )
    live.loop.run_until_complete(live.call(method, request))


def test_admin_counts_and_still_serving(live, record_property):
    record_property("fuzz:admin requests (live gRPC)", live.calls)
    assert live.calls >= max(20, FUZZ_INPUTS // 20)

    async def still_serving():
        return await live.channel.unary_unary(
            "/rasd.api.v1.AdminService/ListNodes",
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=admin_pb.ListNodesResponse.FromString,
        )(admin_pb.ListNodesRequest(), timeout=10)

    nodes = live.loop.run_until_complete(still_serving()).nodes
    assert [n.node_id for n in nodes] == [NODE] and nodes[0].connected
