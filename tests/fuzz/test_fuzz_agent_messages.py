"""Fuzzed AgentMessages against the controller's edge and ingest: no crash, no accepted event lost.

Most inputs go through the same function a live stream uses (`agent_service.deliver`: edge checks,
then the ingest and its store, with remediation on), in process for speed; a sample goes through a
live controller over mutual TLS. For every input the only allowed failures are the ones the wire
contract names (INVALID_ARGUMENT, PERMISSION_DENIED), and after every example:

* every event whose batch was accepted is in the store (zero accepted-then-lost records);
* no event of a refused batch is in the store, unless an accepted batch carried the same seq;
* every ack the controller queued covers only seqs that are stored.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import math
import os
import pathlib

import grpc
import pytest
import rasd_fuzz_strategies as fuzz
from conftest import FUZZ_INPUTS
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rasd.api.v1 import agent_service_pb2 as agent_pb
from rasd.api.v1 import agent_service_pb2_grpc as agent_grpc
from rasd.api.v1 import health_pb2 as health_pb
from rasd.common import devcerts, tls
from rasd.controller import server
from rasd.controller.rpc import agent_service, authn, validate_input
from rasd.controller.wire import agent as wire

PER_EXAMPLE = 40
BASES_PER_EXAMPLE = 4
OTHER_GPU = "GPU-0ddba11d-0000-4000-8000-000000000000"


def _gpus(index: int) -> list[str]:
    return [f"GPU-{index:08x}-0000-4000-8000-{gpu:012x}" for gpu in range(2)]


def _hello(node_id: str, gpus: list[str]) -> agent_pb.Hello:
    return agent_pb.Hello(
        node_id=node_id,
        boot_id="boot",
        gpus=[health_pb.GpuInfo(uuid=g, power_limit_min_w=100, power_limit_max_w=700) for g in gpus],
    )


class Harness:
    """A controller in its own event loop; `live` also serves gRPC over mutual TLS with dev certs."""

    def __init__(self, tmp_path, *, live: bool = False):
        self.loop = asyncio.new_event_loop()
        self.pki = devcerts.init(tmp_path / "certs", ["fuzz-live"]) if live else None
        security = authn.SecuritySettings()
        if self.pki is not None:
            security = authn.SecuritySettings(
                tls=tls.TlsFiles(self.pki.ca.cert, self.pki.controller.cert, self.pki.controller.key)
            )
        # The store lives on tmpfs when there is one: the fuzz tests exercise rasd, not the disk's fsync.
        db_dir = pathlib.Path("/dev/shm") if pathlib.Path("/dev/shm").is_dir() else tmp_path
        self.db_path = db_dir / f"rasd-fuzz-{os.getpid()}-{id(self)}.db"
        self.controller = server.Controller(
            server.ControllerSettings(
                listen="127.0.0.1:0",
                db_url=f"sqlite:///{self.db_path}",
                metrics_port=None,
                security=security,
                # In process the target is the edge and the ingest; the live sample runs remediation too.
                remediation=live,
            )
        )
        self.live = live
        self.run(self._start())
        self.nodes = itertools.count()
        self.tried = self.delivered = self.refused = self.unparseable = 0

    async def _start(self):
        if self.live:
            await self.controller.start()
        else:
            await self.controller.ingest.start()
        # Another node owns OTHER_GPU: naming it must be PERMISSION_DENIED on an authenticated stream.
        await self.controller.ingest.open_session(wire.hello_from_wire(_hello("fuzz-other", [OTHER_GPU])))

    def run(self, coroutine):
        return self.loop.run_until_complete(coroutine)

    def close(self):
        async def stop():
            # Command results fuzzed into the ingest, and events stored apart, are decided as tasks: let them finish.
            tasks = self.controller.ingest.result_tasks()
            if self.controller.remediation is not None:
                tasks += self.controller.remediation.deciding.tasks()
            await asyncio.gather(*tasks, return_exceptions=True)
            if self.live:
                await self.controller.stop()
                return
            await self.controller.ingest.stop()

        self.run(stop())
        if not self.live:
            self.controller.store.close()
        self.loop.close()
        for suffix in ("", "-wal", "-shm"):
            pathlib.Path(f"{self.db_path}{suffix}").unlink(missing_ok=True)

    async def in_process(self, index: int, messages, authenticated: bool):
        """One example through `agent_service.deliver`, then the consistency checks."""
        ingest = self.controller.ingest
        node_id = f"fuzz-{index}"
        session, _welcome = await ingest.open_session(wire.hello_from_wire(_hello(node_id, _gpus(index))))
        identity = validate_input.StreamIdentity(
            node_id=node_id if authenticated else None, gpu_owners=ingest.gpu_nodes
        )
        accepted: set[int] = set()
        refused: set[int] = set()
        limits = validate_input.InputLimits()
        for message in messages:
            self.tried += 1
            if message is None:
                self.unparseable += 1
                continue
            seqs = {e.seq for e in message.events.events} if message.HasField("events") else set()
            try:
                await agent_service.deliver(ingest, session, message, identity, limits)
            except (wire.WireError, validate_input.IdentityError) as exc:
                self.refused += 1
                assert exc.field, "every refusal names a field"
                refused |= seqs
                continue
            self.delivered += 1
            accepted |= seqs
        acks = []
        while not session.outbound.empty():
            queued = session.outbound.get_nowait()
            if queued is not None and queued.HasField("ack"):
                acks.append(queued.ack.acked_seq)
        await ingest.close_session(session)
        stored = {e.seq for e in await ingest.list_events(node_id=node_id, since_unix_ns=0, limit=100_000)}
        _check(accepted, refused, acks, stored)

    async def over_grpc(self, messages):
        """Each message on its own real mTLS stream after Hello; only the contract's errors come back.

        One hostile message per stream: a second write could race the server's refusal of the first,
        and a write to a stream the server ended fails on the client side with INTERNAL.
        """
        assert self.pki is not None
        node_id = "fuzz-live"
        pair = self.pki.nodes[node_id]
        gpus = _gpus(10**6)
        acks: list[int] = []
        async with tls.aio_channel(self.controller.address, tls.TlsFiles(self.pki.ca.cert, pair.cert, pair.key)) as ch:
            for message in messages:
                self.tried += 1
                if message is None:
                    self.unparseable += 1
                    continue
                call = agent_grpc.AgentServiceStub(ch).Connect()
                await call.write(agent_pb.AgentMessage(hello=_hello(node_id, gpus)))
                assert (await call.read()).HasField("welcome")
                await call.write(message)
                await call.done_writing()
                with contextlib.suppress(grpc.aio.AioRpcError):
                    while (reply := await call.read()) is not grpc.aio.EOF:
                        if reply.HasField("ack"):
                            acks.append(reply.ack.acked_seq)
                code = await call.code()
                if code == grpc.StatusCode.OK:
                    self.delivered += 1
                else:
                    assert code in ALLOWED_CODES, (code, await call.details(), message)
                    self.refused += 1
                while node_id in self.controller.ingest.sessions:
                    await asyncio.sleep(0.005)
        stored = {
            e.seq for e in await self.controller.ingest.list_events(node_id=node_id, since_unix_ns=0, limit=100_000)
        }
        _check(set(), set(), acks, stored)


ALLOWED_CODES = {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.PERMISSION_DENIED}


def _check(accepted: set[int], refused: set[int], acks: list[int], stored: set[int]) -> None:
    assert accepted <= stored, f"accepted then lost: {sorted(accepted - stored)}"
    assert not (refused - accepted) & stored, f"refused but stored: {sorted((refused - accepted) & stored)}"
    for acked in acks:
        assert set(range(1, acked + 1)) <= stored, f"ack {acked} covers seqs that are not stored"


@pytest.fixture(scope="module")
def harness(tmp_path_factory):
    h = Harness(tmp_path_factory.mktemp("fuzz-ingest"))
    yield h
    h.close()


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    h = Harness(tmp_path_factory.mktemp("fuzz-live"), live=True)
    yield h
    h.close()


FUZZ_SETTINGS = settings(
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture],
    database=None,
)


# 20 % more examples than the count needs: hypothesis discards examples whose data overruns its
# buffer (a CI run once tried 9,820 of 10,000), and the count below is a promise, not a target.
@settings(FUZZ_SETTINGS, max_examples=max(1, math.ceil(1.2 * FUZZ_INPUTS / PER_EXAMPLE)))
@given(data=st.data(), authenticated=st.booleans())
def test_fuzzed_agent_messages_in_process(harness, data, authenticated):
    index = next(harness.nodes)
    gpus = _gpus(index)
    strategy = fuzz.hostile_agent_message([*gpus, OTHER_GPU, fuzz.GPU_UUID_SHAPES[0]])
    bases = data.draw(st.lists(strategy, min_size=BASES_PER_EXAMPLE, max_size=BASES_PER_EXAMPLE), label="bases")
    rng = data.draw(st.randoms(use_true_random=False), label="mutations")
    harness.run(harness.in_process(index, fuzz.amplified(bases, rng, PER_EXAMPLE), authenticated))


def test_in_process_counts(harness, record_property):
    """Runs after the fuzz test above (file order): reports and checks how many inputs were tried."""
    record_property("fuzz:agent messages, in process", harness.tried)
    record_property("fuzz:agent messages, in process, refused naming a field", harness.refused)
    record_property("fuzz:agent messages, in process, unparseable bytes", harness.unparseable)
    assert harness.tried >= FUZZ_INPUTS
    assert harness.delivered > 0 and harness.refused > 0
    nodes = harness.run(harness.controller.ingest.list_nodes())
    fuzz_nodes = [n for n in nodes if n.node_id.startswith("fuzz-") and n.node_id != "fuzz-other"]
    assert len(fuzz_nodes) >= FUZZ_INPUTS // PER_EXAMPLE and not any(n.connected for n in fuzz_nodes)


@settings(FUZZ_SETTINGS, max_examples=max(6, math.ceil(1.2 * FUZZ_INPUTS / 200)))
@given(data=st.data())
def test_fuzzed_agent_messages_over_live_mtls(live, data):
    gpus = _gpus(10**6)
    strategy = fuzz.hostile_agent_message([*gpus, OTHER_GPU])
    messages = data.draw(st.lists(strategy, min_size=1, max_size=4))
    live.run(live.over_grpc(messages))


def test_live_counts(live, record_property):
    record_property("fuzz:agent messages, live mTLS streams", live.tried)
    assert live.tried >= max(5, FUZZ_INPUTS // 200)
    # Still serving: a fresh stream gets its Welcome.
    assert live.run(live.controller.ingest.list_nodes())
