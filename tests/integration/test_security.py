"""Issue #7 acceptance over real gRPC and mutual TLS on loopback, with a dev CA made per test.

An agent without a client certificate cannot connect; node A's certificate cannot report as node B
(Hello, telemetry, events); a viewer cannot quarantine; an operator cannot set budgets or force a
release; bad and unknown bearer tokens are refused; every refusal is in the audit log with the
authenticated caller; the controller's certificate is reloaded from disk without a restart.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import signal
import socket
import ssl
import subprocess
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from rasd.agent import runtime, spool
from rasd.agent import settings as agent_settings
from rasd.agent.gpu import simulated
from rasd.api.v1 import admin_service_pb2 as admin_pb
from rasd.api.v1 import admin_service_pb2_grpc as admin_grpc
from rasd.api.v1 import agent_service_pb2 as agent_pb
from rasd.api.v1 import agent_service_pb2_grpc as agent_grpc
from rasd.api.v1 import health_pb2 as health_pb
from rasd.cli import main as rasctl
from rasd.common import devcerts, tls, tokens
from rasd.controller import server
from rasd.controller.rpc import authn

GPU_A = "GPU-0000000a-0000-4000-8000-00000000000a"
GPU_B = "GPU-0000000b-0000-4000-8000-00000000000b"


@pytest.fixture
def pki(tmp_path):
    return devcerts.init(tmp_path / "certs", ["node-a", "node-b", "node-op"])


def _files(pki, pair):
    return tls.TlsFiles(pki.ca.cert, pair.cert, pair.key)


def _controller(tmp_path, port, pki, **security):
    return server.Controller(
        server.ControllerSettings(
            listen=f"127.0.0.1:{port}",
            db_url=f"sqlite:///{tmp_path / 'rasd.db'}",
            metrics_port=None,
            security=authn.SecuritySettings(tls=_files(pki, pki.controller), **security),
        )
    )


def _hello(node_id, gpu):
    return agent_pb.AgentMessage(
        hello=agent_pb.Hello(
            node_id=node_id,
            boot_id="boot",
            gpus=[health_pb.GpuInfo(uuid=gpu, power_limit_min_w=200, power_limit_max_w=700)],
        )
    )


async def _connect(address, files, node_id, gpu):
    """Open a stream with `files`, say Hello as node_id; returns (channel, call, first reply or error)."""
    channel = tls.aio_channel(address, files)
    call = agent_grpc.AgentServiceStub(channel).Connect()
    try:
        await call.write(_hello(node_id, gpu))
        return channel, call, await call.read()
    except grpc.aio.AioRpcError as exc:
        return channel, call, exc


async def _read_error(call):
    try:
        while await call.read() is not grpc.aio.EOF:
            pass
    except grpc.aio.AioRpcError as exc:
        return exc
    raise AssertionError("the stream ended without an error")


async def _audit(controller):
    rows = await controller.ingest.store_calls.run_in_store(lambda: controller.remediation.store.audit(limit=1000))
    return [(r["actor"], r["action"], r["node_id"], r["outcome"]) for r in rows]


def _rasctl(address, pki, role, *argv, token=None):
    out, err = io.StringIO(), io.StringIO()
    flags = ["--controller", address, "--tls-ca", str(pki.ca.cert)]
    if role is not None:
        pair = pki.operators[role]
        flags += ["--tls-cert", str(pair.cert), "--tls-key", str(pair.key)]
    if token is not None:
        flags += ["--token", token]
    code = rasctl.run([*flags, *argv], out, err)
    return code, out.getvalue(), err.getvalue()


def test_rasctl_says_certificate_refused_when_the_controller_refuses_its_certificate(tmp_path, free_port, pki):
    """Issue #37 item 18: a certificate of another CA showed as "Socket closed ... is rasd-controller running?"."""
    foreign = devcerts.init(tmp_path / "foreign", ["node-a"]).operators["admin"]

    async def scenario():
        controller = _controller(tmp_path, free_port, pki)
        await controller.start()
        out, err = io.StringIO(), io.StringIO()
        flags = ["--controller", controller.address, "--tls-ca", str(pki.ca.cert), "--tls-cert", str(foreign.cert)]
        argv = [*flags, "--tls-key", str(foreign.key), "--timeout-s", "10", "nodes"]
        code = await asyncio.to_thread(rasctl.run, argv, out, err)
        await controller.stop()
        return code, err.getvalue()

    code, err = asyncio.run(scenario())
    assert code == rasctl.EXIT_UNREACHABLE
    assert f"rasctl: certificate refused: rasd-controller at 127.0.0.1:{free_port}" in err, err
    assert "is rasd-controller running" not in err


def test_rasctl_says_certificate_not_trusted_when_the_controllers_is_of_another_ca(tmp_path, free_port, pki):
    """Issue #37 item 18: a failed TLS handshake (the controller's certificate not of --tls-ca's CA)
    read "is rasd-controller running?"."""
    foreign_ca = devcerts.init(tmp_path / "foreign", ["node-a"]).ca.cert
    admin = pki.operators["admin"]

    async def scenario():
        controller = _controller(tmp_path, free_port, pki)
        await controller.start()
        out, err = io.StringIO(), io.StringIO()
        flags = ["--controller", controller.address, "--tls-ca", str(foreign_ca), "--tls-cert", str(admin.cert)]
        argv = [*flags, "--tls-key", str(admin.key), "--timeout-s", "10", "nodes"]
        code = await asyncio.to_thread(rasctl.run, argv, out, err)
        await controller.stop()
        return code, err.getvalue()

    code, err = asyncio.run(scenario())
    assert code == rasctl.EXIT_UNREACHABLE
    assert f"rasctl: certificate not trusted: the TLS handshake with rasd-controller at 127.0.0.1:{free_port}" in err
    assert str(foreign_ca) in err and "is rasd-controller running" not in err


def test_an_agent_without_a_client_certificate_cannot_connect(tmp_path, free_port, pki):
    async def scenario():
        controller = _controller(tmp_path, free_port, pki)
        await controller.start()
        # Server-verified TLS, but no client certificate: the handshake itself fails.
        credentials = grpc.ssl_channel_credentials(root_certificates=pki.ca.cert.read_bytes())
        async with grpc.aio.secure_channel(controller.address, credentials) as channel:
            call = agent_grpc.AgentServiceStub(channel).Connect()
            with pytest.raises(grpc.aio.AioRpcError) as no_cert:
                await call.write(_hello("node-a", GPU_A))
                await call.read()
        # Plaintext to a TLS port fails too.
        async with grpc.aio.insecure_channel(controller.address) as channel:
            call = agent_grpc.AgentServiceStub(channel).Connect()
            with pytest.raises(grpc.aio.AioRpcError) as plaintext:
                await call.write(_hello("node-a", GPU_A))
                await call.read()
        connected = dict(controller.ingest.sessions)
        await controller.stop()
        return no_cert.value, plaintext.value, connected

    no_cert, plaintext, connected = asyncio.run(scenario())
    assert no_cert.code() == grpc.StatusCode.UNAVAILABLE
    assert plaintext.code() == grpc.StatusCode.UNAVAILABLE
    assert connected == {}


def test_an_operator_certificate_cannot_open_an_agent_stream(tmp_path, free_port, pki):
    async def scenario():
        controller = _controller(tmp_path, free_port, pki)
        await controller.start()
        channel, _call, reply = await _connect(controller.address, _files(pki, pki.operators["admin"]), "node-a", GPU_A)
        await channel.close()
        audit = await _audit(controller)
        denials = controller.registry.get_sample_value(
            "rasd_auth_denials_total", {"method": "Connect", "code": "PERMISSION_DENIED"}
        )
        await controller.stop()
        return reply, audit, denials

    reply, audit, denials = asyncio.run(scenario())
    assert isinstance(reply, grpc.aio.AioRpcError) and reply.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "not a node certificate" in reply.details()
    assert ("cert:dev-admin", "Connect", "", "denied:PERMISSION_DENIED") in audit
    assert denials == 1.0


def test_node_a_cannot_speak_for_node_b(tmp_path, free_port, pki):
    async def scenario():
        controller = _controller(tmp_path, free_port, pki)
        await controller.start()
        address = controller.address
        node_a, node_b = _files(pki, pki.nodes["node-a"]), _files(pki, pki.nodes["node-b"])
        # B connects as itself.
        b_channel, b_call, b_reply = await _connect(address, node_b, "node-b", GPU_B)
        assert b_reply.HasField("welcome")
        # A's certificate saying Hello as B.
        channel, _call, hello_error = await _connect(address, node_a, "node-b", GPU_B)
        await channel.close()
        # A as itself, then telemetry about B's GPU.
        channel, call, reply = await _connect(address, node_a, "node-a", GPU_A)
        assert reply.HasField("welcome")
        series = health_pb.PowerSeries(gpu_uuid=GPU_B, first_sample_unix_ns=1, sample_interval_ms=100, power_w=[1.0])
        await call.write(agent_pb.AgentMessage(telemetry=health_pb.TelemetryBatch(power=[series])))
        telemetry_error = await _read_error(call)
        await channel.close()
        # A as itself, then an event about B's GPU; A's own event before it stays stored.
        channel, call, reply = await _connect(address, node_a, "node-a", GPU_A)
        own = health_pb.HealthEvent(seq=1, kind=health_pb.EVENT_KIND_XID, gpu_uuid=GPU_A, xid=79, message="own")
        await call.write(agent_pb.AgentMessage(events=agent_pb.HealthEventBatch(events=[own])))
        assert (await call.read()).ack.acked_seq == 1
        other = health_pb.HealthEvent(seq=2, kind=health_pb.EVENT_KIND_XID, gpu_uuid=GPU_B, xid=79, message="fake")
        await call.write(agent_pb.AgentMessage(events=agent_pb.HealthEventBatch(events=[other])))
        event_error = await _read_error(call)
        await channel.close()
        stored_a = await controller.ingest.list_events(node_id="node-a", since_unix_ns=0, limit=10)
        stored_b = await controller.ingest.list_events(node_id="node-b", since_unix_ns=0, limit=10)
        b_still_connected = "node-b" in controller.ingest.sessions
        b_call.cancel()
        await b_channel.close()
        audit = await _audit(controller)
        rejections = {
            kind: controller.registry.get_sample_value("rasd_identity_rejections_total", {"kind": kind})
            for kind in ("hello", "telemetry", "events")
        }
        streams = (controller.security.streams_total, controller.security.streams_mtls)
        await controller.stop()
        return (
            hello_error,
            telemetry_error,
            event_error,
            stored_a,
            stored_b,
            b_still_connected,
            audit,
            rejections,
            streams,
        )

    hello_error, telemetry_error, event_error, stored_a, stored_b, b_connected, audit, rejections, streams = (
        asyncio.run(scenario())
    )
    assert isinstance(hello_error, grpc.aio.AioRpcError)
    assert hello_error.code() == grpc.StatusCode.PERMISSION_DENIED and "hello.node_id" in hello_error.details()
    assert telemetry_error.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "telemetry.power[0].gpu_uuid" in telemetry_error.details() and "node-b" in telemetry_error.details()
    assert event_error.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "events.events[0].gpu_uuid" in event_error.details()
    assert [e.message for e in stored_a] == ["own"] and stored_b == []
    assert b_connected
    assert rejections == {"hello": 1.0, "telemetry": 1.0, "events": 1.0}
    assert ("node:node-a", "AgentService.Connect", "node-b", "denied:PERMISSION_DENIED") in audit
    assert sum(1 for row in audit if row[0] == "node:node-a" and row[3] == "denied:PERMISSION_DENIED") == 3
    assert streams == (3, 3)  # B once, A twice as itself: every stream that got a Welcome was mTLS


def test_roles_are_enforced_and_every_refusal_is_audited(tmp_path, free_port, pki):
    token = tokens.new_token()
    bad_token = tokens.new_token()
    tokens_file = tmp_path / "tokens"
    tokens_file.write_text(f"# name role hash\nci-bot viewer {tokens.hash_token(token)}\n")

    async def scenario():
        controller = _controller(tmp_path, free_port, pki, tokens_file=tokens_file)
        await controller.start()
        address = controller.address
        backend = simulated.SimulatedBackend("node-op", 2, 1, workload=None)
        agent = runtime.Agent(
            agent_settings.AgentSettings(
                node_id="node-op",
                link=agent_settings.LinkSettings(controller_address=address),
                tls=agent_settings.TlsSettings(files=_files(pki, pki.nodes["node-op"])),
            ),
            backend,
            spool.Spool(":memory:"),
            boot_id="boot",
        )
        stop = asyncio.Event()
        task = asyncio.create_task(agent.run(stop))
        while "node-op" not in controller.ingest.sessions:
            await asyncio.sleep(0.05)
        gpu = backend.inventory()[0].uuid

        def cli(role, *argv, token=None):
            return asyncio.to_thread(_rasctl, address, pki, role, *argv, token=token)

        results = {
            "viewer nodes": await cli("viewer", "nodes", "--json"),
            "viewer quarantine": await cli("viewer", "quarantine", f"node-op/{gpu}", "--reason", "try"),
            "operator quarantine": await cli("operator", "quarantine", f"node-op/{gpu}", "--reason", "fan"),
            "operator forced release": await cli("operator", "release", f"node-op/{gpu}", "--force"),
            "admin forced release": await cli("admin", "release", f"node-op/{gpu}", "--force", "--reason", "t-1"),
            "token nodes": await cli("viewer", "nodes", token=token),
            "token pause": await cli("viewer", "automation", "pause", "--reason", "x", token=token),
            "bad token": await cli("admin", "nodes", token=bad_token),
            "admin audit": await cli("admin", "audit", "--json", "--limit", "500"),
        }
        # SetPowerBudget has no rasctl command yet; call it directly as an operator and as an admin.
        budget_errors = {}
        for role in ("operator", "admin"):
            async with tls.aio_channel(address, _files(pki, pki.operators[role])) as channel:
                try:
                    await admin_grpc.AdminServiceStub(channel).SetPowerBudget(
                        admin_pb.SetPowerBudgetRequest(), timeout=10
                    )
                    budget_errors[role] = grpc.StatusCode.OK
                except grpc.aio.AioRpcError as exc:
                    budget_errors[role] = exc.code()
        audit = await _audit(controller)
        stop.set()
        await task
        await controller.stop()
        return results, budget_errors, audit

    results, budget_errors, audit = asyncio.run(scenario())
    assert results["viewer nodes"][0] == 0 and "node-op" in results["viewer nodes"][1]
    code, _, err = results["viewer quarantine"]
    assert code == 1 and "PERMISSION_DENIED" in err and "needs role operator" in err
    assert results["operator quarantine"][0] == 0
    code, _, err = results["operator forced release"]
    assert code == 1 and "needs role admin" in err
    assert results["admin forced release"][0] == 0
    assert results["token nodes"][0] == 0
    code, _, err = results["token pause"]
    assert code == 1 and "token:ci-bot has viewer" in err
    code, _, err = results["bad token"]
    assert code == 1 and "UNAUTHENTICATED" in err
    # The interceptor refuses before the handler: an operator gets PERMISSION_DENIED, never the
    # handler's answer; an admin reaches the handler (UNIMPLEMENTED until the power RPCs land).
    assert budget_errors["operator"] == grpc.StatusCode.PERMISSION_DENIED
    assert budget_errors["admin"] != grpc.StatusCode.PERMISSION_DENIED
    rows = {(a, b, c, d) for a, b, c, d in audit}
    assert ("cert:dev-viewer", "Quarantine", "node-op", "denied:PERMISSION_DENIED") in rows
    assert ("cert:dev-operator", "Quarantine", "node-op", "OK") in rows
    assert ("cert:dev-operator", "quarantine_gpu", "node-op", "ACTION_OUTCOME_SUCCEEDED") in rows
    assert ("cert:dev-operator", "Release", "node-op", "denied:PERMISSION_DENIED") in rows
    assert ("cert:dev-admin", "Release", "node-op", "OK") in rows
    assert ("cert:dev-admin", "release", "node-op", "forced") in rows
    assert ("token:ci-bot", "SetAutomationPaused", "", "denied:PERMISSION_DENIED") in rows
    # A bad token on a connection whose certificate was verified is that certificate's (issue #37 item 16).
    assert ("cert:dev-admin", "ListNodes", "", "denied:UNAUTHENTICATED") in rows
    assert ("cert:dev-operator", "SetPowerBudget", "", "denied:PERMISSION_DENIED") in rows
    # rasctl audit shows the same trail.
    listed = json.loads(results["admin audit"][1])
    assert {"cert:dev-viewer", "cert:dev-operator", "cert:dev-admin", "token:ci-bot"} <= {r["actor"] for r in listed}


def _served_certificate(port, pki):
    context = ssl.create_default_context(cafile=str(pki.ca.cert))
    context.load_cert_chain(str(pki.nodes["node-a"].cert), str(pki.nodes["node-a"].key))
    context.set_alpn_protocols(["h2"])
    with (
        socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
        context.wrap_socket(raw, server_hostname="localhost") as wrapped,
    ):
        return ssl.DER_cert_to_PEM_cert(wrapped.getpeercert(binary_form=True))


def test_the_controller_certificate_reloads_without_a_restart(tmp_path, free_port, pki):
    async def scenario():
        controller = _controller(tmp_path, free_port, pki)
        await controller.start()
        before = await asyncio.to_thread(_served_certificate, controller.port, pki)
        # A renewal rewrites the files in place (new key, new name): the next handshake serves it.
        devcerts.issue_controller(pki, extra_names=["rasd.example.test"])
        after = await asyncio.to_thread(_served_certificate, controller.port, pki)
        # A half-written renewal (key of another certificate) is refused; the last good pair keeps serving.
        pki.controller.key.write_bytes(pki.nodes["node-b"].key.read_bytes())
        during_bad = await asyncio.to_thread(_served_certificate, controller.port, pki)
        # Agents still connect through all of it.
        channel, _call, reply = await _connect(controller.address, _files(pki, pki.nodes["node-a"]), "node-a", GPU_A)
        await channel.close()
        reloads = controller.tls.reloads
        await controller.stop()
        return before, after, during_bad, reply, reloads

    before, after, during_bad, reply, reloads = asyncio.run(scenario())
    assert before != after
    assert tls.parse_certificate(after.encode()).dns_names == ("localhost", "rasd.example.test")
    assert during_bad == after
    assert reply.HasField("welcome")
    assert reloads == 1


def test_bearer_tokens_reload_when_the_file_changes(tmp_path):
    path = tmp_path / "tokens"
    first, second = tokens.new_token(), tokens.new_token()
    path.write_text(f"alice operator {tokens.hash_token(first)}\n")
    store = authn.TokenStore(path)
    assert store.lookup(first).role == authn.Role.OPERATOR and store.lookup(second) is None
    path.write_text(f"alice operator {tokens.hash_token(first)}\nbob admin {tokens.hash_token(second)}\n# more\n")
    assert store.lookup(second).name == "bob"
    path.write_text("broken line\n")  # a bad edit keeps the last good entries
    assert store.lookup(second).name == "bob"


def test_the_real_entry_points_over_mtls_with_dev_certificates(tmp_path, venv_bin, free_port):
    """`rasctl certs init`, `rasd-controller --dev-certs`, `rasd-agent --tls-*`, rasctl with $RASD_TLS_*,
    and a plaintext health-only port for kubelet probes."""
    certs = tmp_path / "certs"
    made = subprocess.run(
        [str(venv_bin / "rasctl"), "certs", "init", "--dir", str(certs), "--nodes", "node-x"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert made.returncode == 0, made.stderr
    assert "rasctl as viewer: RASD_TLS_CA=" in made.stdout
    with socket.socket() as probe_socket:
        probe_socket.bind(("127.0.0.1", 0))
        health_port = probe_socket.getsockname()[1]
    address = f"127.0.0.1:{free_port}"
    logs = [open(tmp_path / "controller.log", "w"), open(tmp_path / "agent.log", "w")]  # noqa: SIM115
    controller = subprocess.Popen(
        [str(venv_bin / "rasd-controller"), "--dev-certs", str(certs), "--listen", address, "--metrics-port", "-1",
         "--health-listen", f"127.0.0.1:{health_port}", "--db", f"sqlite:///{tmp_path / 'rasd.db'}"],
        stdout=logs[0], stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    agent = subprocess.Popen(
        [str(venv_bin / "rasd-agent"), "--backend", "simulated", "--gpus", "1", "--node-id", "node-x",
         "--controller", address, "--state-dir", str(tmp_path / "agent"), "--metrics-port", "-1",
         "--tls-ca", str(certs / "ca.crt"), "--tls-cert", str(certs / "nodes" / "node-x.crt"),
         "--tls-key", str(certs / "nodes" / "node-x.key")],
        stdout=logs[1], stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    env = {
        **os.environ,
        "RASD_TLS_CA": str(certs / "ca.crt"),
        "RASD_TLS_CERT": str(certs / "operators" / "viewer.crt"),
        "RASD_TLS_KEY": str(certs / "operators" / "viewer.key"),
    }
    try:
        deadline = time.monotonic() + 45
        nodes = []
        while time.monotonic() < deadline and not nodes:
            listed = subprocess.run(
                [str(venv_bin / "rasctl"), "--controller", address, "nodes", "--json"],
                capture_output=True, text=True, timeout=30, env=env,
            )  # fmt: skip
            if listed.returncode == 0:
                nodes = [n for n in json.loads(listed.stdout) if n["connected"]]
            time.sleep(0.5)
        assert [n["node_id"] for n in nodes] == ["node-x"], (tmp_path / "controller.log").read_text()[-2000:]
        # Plaintext rasctl is refused by the mTLS port; the health-only port answers without credentials.
        plain = subprocess.run(
            [str(venv_bin / "rasctl"), "--controller", address, "nodes"], capture_output=True, text=True, timeout=30
        )
        assert plain.returncode == 3
        with grpc.insecure_channel(f"127.0.0.1:{health_port}") as channel:
            status = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10).status
        assert status == health_pb2.HealthCheckResponse.SERVING
    finally:
        for process in (agent, controller):
            process.send_signal(signal.SIGTERM)
            process.wait(timeout=20)
        for log in logs:
            log.close()


def test_an_agent_rereads_its_certificate_files_on_reconnect(tmp_path, free_port, pki):
    """A broken renewal (key of another certificate) keeps the agent out; fixing the files lets it in,
    without restarting the agent."""
    node = tmp_path / "node-a"
    node.mkdir()
    cert, key = node / "agent.crt", node / "agent.key"
    cert.write_bytes(pki.nodes["node-a"].cert.read_bytes())
    key.write_bytes(pki.nodes["node-b"].key.read_bytes())

    async def scenario():
        controller = _controller(tmp_path, free_port, pki)
        await controller.start()
        agent = runtime.Agent(
            agent_settings.AgentSettings(
                node_id="node-a",
                link=agent_settings.LinkSettings(
                    controller_address=controller.address, reconnect_initial_s=0.05, reconnect_max_s=0.2
                ),
                tls=agent_settings.TlsSettings(files=tls.TlsFiles(pki.ca.cert, cert, key)),
            ),
            simulated.SimulatedBackend("node-a", 1, 1, workload=None),
            spool.Spool(":memory:"),
            boot_id="boot",
        )
        stop = asyncio.Event()
        task = asyncio.create_task(agent.run(stop))
        await asyncio.sleep(1.0)
        refused = (agent.stats.connected, agent.stats.connect_failures)
        key.write_bytes(pki.nodes["node-a"].key.read_bytes())
        deadline = asyncio.get_running_loop().time() + 20
        while "node-a" not in controller.ingest.sessions and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.05)
        connected = "node-a" in controller.ingest.sessions
        stop.set()
        await task
        await controller.stop()
        return refused, connected

    (was_connected, failures), connected = asyncio.run(scenario())
    assert not was_connected and failures >= 2
    assert connected
