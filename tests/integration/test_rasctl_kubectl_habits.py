"""rasctl in kubectl's habits against a live controller and agent (issue #39 item 2).

Every listing in every ``-o`` form (and its old spelling), global flags after the command,
``--since``, a ``--watch`` that sees a new event arrive through the server-streaming RPC, and the
contexts file choosing the controller.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import threading
import time

import fleetlib
import yaml
from fleetlib import wait_for
from test_operator_cli import operator_fleet

from rasd.agent.gpu import simulated

LISTINGS = [
    (("get", "nodes"), ("nodes",), "node/node-op"),
    (("get", "events"), ("events",), "event/node-op/"),
    (("get", "incidents"), ("incidents",), "incident/"),
    (("get", "repairs"), ("repairs",), "repair/"),
    (("get", "validations"), ("validations",), None),
    (("get", "audit"), ("audit",), "audit/"),
    (("get", "sdc"), ("sdc", "list"), None),
    (("get", "rma"), ("rma", "list"), None),
    (("describe", "node", "node-op"), ("node", "node-op"), "node/node-op"),
]
"""(new spelling, old spelling, a prefix every -o name line has; None: the listing may be empty)."""


def _check_forms(fleet: fleetlib.ThreadedFleet, argv: tuple[str, ...], name_prefix: str | None) -> None:
    code, table, err = fleet.rasctl(*argv)
    assert code == 0, err
    code, wide, err = fleet.rasctl(*argv, "-o", "wide")
    assert code == 0, err
    assert len(wide.splitlines()[0]) > len(table.splitlines()[0]), "wide shows more columns"
    code, as_json, err = fleet.rasctl(*argv, "-o", "json")
    assert code == 0, err
    code, as_yaml, err = fleet.rasctl(*argv, "-o", "yaml")
    assert code == 0, err
    # The fleet is live (last seen, ticket states move): the same objects with the same fields.
    assert _shape(yaml.safe_load(as_yaml)) == _shape(json.loads(as_json))
    assert _shape(json.loads(fleet.rasctl(*argv, "--json")[1])) == _shape(json.loads(as_json))
    code, names, err = fleet.rasctl(*argv, "-o", "name")
    assert code == 0, err
    lines = names.splitlines()
    if name_prefix is not None:
        assert lines and all(line.startswith(name_prefix) for line in lines), names
    data = json.loads(as_json)
    assert len(lines) == (len(data) if isinstance(data, list) else 1)


def _shape(data):  # type: ignore[no-untyped-def]
    """The objects' field names, and the names that say which objects they are."""
    items = data if isinstance(data, list) else [data]
    return [sorted(item) for item in items]


def test_every_listing_in_every_output_form_new_and_old_spelling(tmp_path, free_port):
    with operator_fleet(tmp_path, free_port) as fleet:
        fleet.fire(simulated.ScriptedFault(at_s=0, kind="xid", gpu=0, xid=48))
        wait_for(lambda: json.loads(fleet.rasctl("get", "repairs", "-o", "json")[1]))
        wait_for(lambda: json.loads(fleet.rasctl("get", "audit", "-o", "json")[1]))
        for new, old, prefix in LISTINGS:
            _check_forms(fleet, new, prefix)
            assert fleet.rasctl(*old, "-o", "name")[1] == fleet.rasctl(*new, "-o", "name")[1], old
        for argv in (("get", "power-policy"), ("get", "automation")):
            assert fleet.rasctl(*argv, "-o", "yaml")[0] in (0, 1)  # no power loop here: a named error
        assert fleet.rasctl("get", "automation", "-o", "json")[1] == fleet.rasctl("automation", "status", "--json")[1]


def test_global_flags_anywhere_and_since(tmp_path, free_port):
    with operator_fleet(tmp_path, free_port) as fleet:
        fleet.fire(simulated.ScriptedFault(at_s=0, kind="xid", gpu=0, xid=48))
        wait_for(lambda: json.loads(fleet.rasctl("get", "events", "-o", "json")[1]))
        out = fleet.rasctl("get", "nodes", "-o", "name")[1]
        # fleet.rasctl puts --controller first; after the command it must work the same.
        from rasd.cli import main as rasctl

        after = _run(rasctl, ["get", "nodes", "-o", "name", "--controller", fleet.address, "--timeout-s", "5"])
        assert after == (0, out, "")
        assert fleet.rasctl("get", "events", "--since", "1h", "-o", "name")[1]
        assert fleet.rasctl("get", "events", "--since", "2000-01-01T00:00:00Z", "-o", "name")[1]
        assert fleet.rasctl("get", "events", "--since", "2999-01-01T00:00:00Z", "-o", "name")[1] == ""
        code, _, err = fleet.rasctl("get", "events", "--since", "yesterday")
        assert code == 2 and "--since 'yesterday'" in err and "RFC 3339" in err


def _run(rasctl, argv):  # type: ignore[no-untyped-def]
    import io

    out, err = io.StringIO(), io.StringIO()
    return rasctl.run(argv, out, err), out.getvalue(), err.getvalue()


def test_watch_sees_a_new_event_arrive(tmp_path, free_port):
    with operator_fleet(tmp_path, free_port) as fleet:
        with subprocess.Popen(
            [sys.executable, "-m", "rasd.cli.main", "get", "events", "--watch", "-o", "name",
             "--controller", fleet.address],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
            env={**os.environ, "RASCTL_CONFIG": str(tmp_path / "none.toml")},
        ) as watch:  # fmt: skip
            lines: list[str] = []
            reader = threading.Thread(target=lambda: lines.extend(iter(watch.stdout.readline, "")), daemon=True)
            reader.start()
            try:
                # The watch is open once the controller counts a watcher; then an event arrives.
                wait_for(lambda: fleet.controller.wired.changes.watchers("events") == 1)
                fleet.fire(simulated.ScriptedFault(at_s=0, kind="xid", gpu=1, xid=31))
                wait_for(lambda: any(line.startswith("event/node-op/") for line in lines))
            finally:
                watch.terminate()
                watch.wait(timeout=10)
                reader.join(timeout=10)
        wait_for(lambda: fleet.controller.wired.changes.watchers("events") == 0)


def test_watch_repairs_and_nodes_stream_changes(tmp_path, free_port):
    with operator_fleet(tmp_path, free_port) as fleet:
        from rasd.api.v1 import admin_service_pb2 as admin_pb
        from rasd.api.v1 import admin_service_pb2_grpc as admin_grpc
        from rasd.common import tls

        channel = tls.sync_channel(fleet.address, None)
        stub = admin_grpc.AdminServiceStub(channel)
        repairs = stub.WatchRepairs(admin_pb.WatchRepairsRequest())
        nodes = stub.WatchNodes(admin_pb.WatchNodesRequest())
        incidents = stub.WatchIncidents(admin_pb.WatchIncidentsRequest(node_id="node-op"))
        wait_for(lambda: fleet.controller.wired.changes.watchers("repairs") == 1)
        wait_for(lambda: fleet.controller.wired.changes.watchers("incidents") == 1)
        fleet.fire(simulated.ScriptedFault(at_s=0, kind="xid", gpu=0, xid=48))
        first_repair = next(iter(repairs))
        assert first_repair.repairs and first_repair.repairs[0].target.node_id == "node-op"
        assert next(iter(incidents)).incidents[0].cause.startswith("xid:48")
        assert next(iter(nodes)).nodes[0].node_id == "node-op"
        for call in (repairs, nodes, incidents):
            call.cancel()
        channel.close()


def test_contexts_file_chooses_the_controller(tmp_path, free_port, monkeypatch):
    config = pathlib.Path(tmp_path / "rasctl.toml")
    config.write_text(
        '# my contexts\ncurrent-context = "nowhere"\n\n'
        f'[contexts.here]\ncontroller = "127.0.0.1:{free_port}"\n\n'
        '[contexts.nowhere]\ncontroller = "127.0.0.1:1"\n'
    )
    monkeypatch.setenv("RASCTL_CONFIG", str(config))
    monkeypatch.delenv("RASD_CONTROLLER", raising=False)
    from rasd.cli import main as rasctl

    with operator_fleet(tmp_path, free_port):
        code, _, err = _run(rasctl, ["get", "nodes", "--timeout-s", "1"])
        assert code == 3 and "127.0.0.1:1" in err
        assert _run(rasctl, ["get", "nodes", "-o", "name", "--context", "here"])[:2] == (0, "node/node-op\n")
        assert _run(rasctl, ["config", "use-context", "here"])[0] == 0
        assert config.read_text().startswith('# my contexts\ncurrent-context = "here"\n')
        assert _run(rasctl, ["get", "nodes", "-o", "name"])[:2] == (0, "node/node-op\n")
        code, out, _ = _run(rasctl, ["config", "get-contexts"])
        assert code == 0 and [line.split()[:2] for line in out.splitlines()[1:]] == [
            ["*", "here"],
            ["nowhere", "127.0.0.1:1"],
        ]
        code, _, err = _run(rasctl, ["config", "use-context", "gone"])
        assert code == 2 and "'gone' is not in" in err


def test_a_watch_that_falls_behind_resyncs_from_the_store(tmp_path, free_port):
    """A watcher whose queue overflows gets the current state re-read from the store, marked resync."""
    with operator_fleet(tmp_path, free_port) as fleet:
        from rasd.api.v1 import admin_service_pb2 as admin_pb
        from rasd.api.v1 import admin_service_pb2_grpc as admin_grpc
        from rasd.common import tls

        fleet.controller.wired.changes.max_queued = 0  # every change overflows: always behind
        channel = tls.sync_channel(fleet.address, None)
        events = admin_grpc.AdminServiceStub(channel).WatchEvents(admin_pb.WatchEventsRequest(node_id="node-op"))
        wait_for(lambda: fleet.controller.wired.changes.watchers("events") == 1)
        fleet.fire(simulated.ScriptedFault(at_s=0, kind="xid", gpu=2, xid=31))
        answer = next(iter(events))
        assert answer.resync and [e.event.xid for e in answer.events] == [31]
        events.cancel()
        channel.close()


def test_watches_are_authorized_as_the_listings(tmp_path, free_port):
    """Over mutual TLS a viewer's certificate or bearer token may watch (the token rides the stream too);
    an unknown token may not."""
    import argparse
    import asyncio

    import grpc
    from test_security import _controller

    from rasd.api.v1 import admin_service_pb2 as admin_pb
    from rasd.api.v1 import admin_service_pb2_grpc as admin_grpc
    from rasd.cli import credentials
    from rasd.common import devcerts, tokens

    pki = devcerts.init(tmp_path / "certs", ["node-op"])
    token = tokens.new_token()
    tokens_file = tmp_path / "tokens"
    tokens_file.write_text(f"ci-bot viewer {tokens.hash_token(token)}\n")
    viewer = pki.operators["viewer"]

    def watch(address: str, bearer: str | None) -> grpc.StatusCode:
        args = argparse.Namespace(controller=address, tls_ca=str(pki.ca.cert), tls_cert=str(viewer.cert),
                                  tls_key=str(viewer.key), tls_server_name="", token=bearer)  # fmt: skip
        channel = credentials.channel(args)
        call = admin_grpc.AdminServiceStub(credentials.authenticated(args, channel)).WatchNodes(
            admin_pb.WatchNodesRequest(), timeout=1.5
        )
        try:
            next(iter(call))
        except grpc.RpcError as exc:
            return exc.code()  # type: ignore[attr-defined,no-any-return]
        finally:
            channel.close()
        raise AssertionError("no node changed: the watch should have ended at its deadline")

    async def scenario() -> dict[str, grpc.StatusCode]:
        controller = _controller(tmp_path, free_port, pki, tokens_file=tokens_file)
        await controller.start()
        try:
            return {
                "viewer": await asyncio.to_thread(watch, controller.address, None),
                "token": await asyncio.to_thread(watch, controller.address, token),
                "bad token": await asyncio.to_thread(watch, controller.address, tokens.new_token()),
            }
        finally:
            await controller.stop()

    codes = asyncio.run(scenario())
    # Allowed watches stream until their deadline; the refused one is refused at once.
    assert codes == {
        "viewer": grpc.StatusCode.DEADLINE_EXCEEDED,
        "token": grpc.StatusCode.DEADLINE_EXCEEDED,
        "bad token": grpc.StatusCode.UNAUTHENTICATED,
    }


def test_a_follower_refuses_a_watch_and_the_leader_streams_every_replicas_events(postgres_schema_url, tmp_path):
    """Two replicas: a follower refuses a watch naming the leader (rasctl then watches there), and the
    leader's watch sees an event of a node that streams to the follower (published as its relay takes it)."""
    import asyncio

    import grpc

    from rasd.api.v1 import admin_service_pb2 as admin_pb
    from rasd.api.v1 import admin_service_pb2_grpc as admin_grpc
    from rasd.cli import main as rasctl
    from rasd.controller.rpc import leader_gate

    async def refusal(address: str) -> tuple[grpc.StatusCode, dict[str, str]]:
        async with grpc.aio.insecure_channel(address) as channel:
            call = admin_grpc.AdminServiceStub(channel).WatchEvents(admin_pb.WatchEventsRequest())
            try:
                await call.read()
            except grpc.aio.AioRpcError as exc:
                return exc.code(), dict(exc.trailing_metadata() or ())
        raise AssertionError("a follower served a watch")

    async def first_event(address: str, backend: simulated.SimulatedBackend, leader) -> admin_pb.WatchEventsResponse:  # type: ignore[no-untyped-def]
        async with grpc.aio.insecure_channel(address) as channel:
            call = admin_grpc.AdminServiceStub(channel).WatchEvents(admin_pb.WatchEventsRequest(node_id="node-r"))
            while leader.wired.changes.watchers("events") == 0:
                await asyncio.sleep(0.05)
            backend.fire(simulated.ScriptedFault(at_s=0, kind="xid", gpu=0, xid=31), time.time_ns())
            answer = await asyncio.wait_for(call.read(), 20)
            call.cancel()
            return answer

    async def scenario() -> None:
        async with fleetlib.two_replicas_a_node_on_the_follower(postgres_schema_url, tmp_path) as replicas:
            first, second = replicas.first, replicas.second
            code, trailers = await refusal(second.address)
            assert code == grpc.StatusCode.FAILED_PRECONDITION
            assert trailers[leader_gate.LEADER_ADDRESS_KEY] == first.address
            argv = ["--controller", second.address, "get", "events", "--watch", "--timeout-s", "2"]
            code, _, err = await asyncio.to_thread(_run, rasctl, argv)
            # The listing is served here; the watch is refused, and rasctl runs the command at the leader.
            assert code == 0 and f"calling the leader at {first.address}" in err, err
            answer = await first_event(first.address, replicas.backend, first)
            assert [(e.node_id, e.event.xid) for e in answer.events] == [("node-r", 31)]

    asyncio.run(scenario())


def test_watch_nodes_sees_a_node_connect_and_disconnect(tmp_path, free_port):
    import asyncio

    import grpc

    from rasd.api.v1 import admin_service_pb2 as admin_pb
    from rasd.api.v1 import admin_service_pb2_grpc as admin_grpc
    from rasd.api.v1 import agent_service_pb2 as agent_pb
    from rasd.api.v1 import agent_service_pb2_grpc as agent_grpc
    from rasd.api.v1 import health_pb2 as health_pb
    from rasd.controller import server

    gpu = health_pb.GpuInfo(uuid="GPU-00000000-0000-0000-0000-0000000000aa", power_limit_min_w=200,
                            power_limit_max_w=700)  # fmt: skip
    hello = agent_pb.AgentMessage(hello=agent_pb.Hello(node_id="node-w", boot_id="b", gpus=[gpu]))

    async def scenario() -> list[tuple[str, bool, int]]:
        controller = server.Controller(fleetlib.sqlite_settings(tmp_path, free_port))
        await controller.start()
        seen: list[tuple[str, bool, int]] = []
        try:
            async with grpc.aio.insecure_channel(controller.address) as channel:
                watch = admin_grpc.AdminServiceStub(channel).WatchNodes(admin_pb.WatchNodesRequest())
                while controller.wired.changes.watchers("nodes") == 0:
                    await asyncio.sleep(0.05)
                agent = agent_grpc.AgentServiceStub(channel).Connect()
                await agent.write(hello)
                await agent.read()  # the Welcome
                answer = await asyncio.wait_for(watch.read(), 10)
                seen += [(n.node_id, n.connected, n.state) for n in answer.nodes]
                agent.cancel()
                answer = await asyncio.wait_for(watch.read(), 10)
                seen += [(n.node_id, n.connected, n.state) for n in answer.nodes]
                watch.cancel()
        finally:
            await controller.stop()
        return seen

    assert asyncio.run(scenario()) == [
        ("node-w", True, admin_pb.COMPONENT_STATE_HEALTHY),
        ("node-w", False, admin_pb.COMPONENT_STATE_OFFLINE),
    ]
