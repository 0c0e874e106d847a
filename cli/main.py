"""rasctl: the operator CLI. Each subcommand is one AdminService call rendered as a table or JSON.

The controller address comes from --controller or $RASD_CONTROLLER (default 127.0.0.1:7443).
Exit codes: 0 success, 1 the controller answered with an error, 2 usage error, 3 unreachable.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from typing import TextIO

import grpc

from rasd.api.v1 import admin_service_pb2 as admin_pb
from rasd.api.v1 import admin_service_pb2_grpc as admin_grpc
from rasd.cli import output, views
from rasd.common import VERSION, net

EXIT_RPC_ERROR = 1
EXIT_USAGE = 2
EXIT_UNREACHABLE = 3


def build_parser() -> argparse.ArgumentParser:
    """rasctl's command line."""
    parser = argparse.ArgumentParser(prog="rasctl", description="Operate a rasd-managed GPU fleet.")
    parser.add_argument(
        "--controller",
        default=os.environ.get("RASD_CONTROLLER", "127.0.0.1:7443"),
        help="controller address host:port (default $RASD_CONTROLLER or 127.0.0.1:7443)",
    )
    parser.add_argument("--timeout-s", type=float, default=10.0, help="RPC deadline (default %(default)s)")
    parser.add_argument("--version", action="version", version=f"rasctl {VERSION}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    nodes = commands.add_parser("nodes", help="the fleet: nodes, GPUs, state, last seen, power draw and cap")
    nodes.add_argument("--json", action="store_true", help="machine-readable output")
    nodes.add_argument("-l", "--selector", action="append", default=[], metavar="KEY=VALUE", help="label filter")

    node = commands.add_parser("node", help="one node: GPUs, telemetry and recent events")
    node.add_argument("node_id")
    node.add_argument("--json", action="store_true", help="machine-readable output")

    events = commands.add_parser("events", help="stored health events, newest first")
    events.add_argument("--node", default="", help="only this node")
    events.add_argument("--limit", type=int, default=50)
    events.add_argument("--json", action="store_true", help="machine-readable output")

    kmsg = commands.add_parser("kmsg", help="kernel-log tools that need no controller")
    kmsg_commands = kmsg.add_subparsers(dest="kmsg_command", required=True, metavar="KMSG_COMMAND")
    kmsg_commands.add_parser(
        "classify", help="read kernel log text on stdin; print one JSON object per GPU/IB event found"
    )
    return parser


def _selector(pairs: Sequence[str]) -> dict[str, str]:
    selector = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"--selector {pair!r} is not KEY=VALUE")
        selector[key] = value
    return selector


def _channel(address: str) -> grpc.Channel:
    host, _port = net.split_host_port(address)
    if not net.is_loopback_host(host):
        raise ValueError(
            f"refusing plaintext gRPC to non-loopback controller {host!r} (TLS arrives with the security issue)"
        )
    return grpc.insecure_channel(address)


def run(argv: Sequence[str] | None, out: TextIO, err: TextIO) -> int:
    """Run rasctl with argv, printing to out/err; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "kmsg":
        from rasd.cli import kmsg

        kmsg.classify_stream(sys.stdin, out)
        return 0
    try:
        channel = _channel(args.controller)
        selector = _selector(getattr(args, "selector", []))
    except ValueError as exc:
        print(f"rasctl: {exc}", file=err)
        return EXIT_USAGE
    stub = admin_grpc.AdminServiceStub(channel)
    now = time.time_ns()
    try:
        if args.command == "nodes":
            response = stub.ListNodes(admin_pb.ListNodesRequest(label_selector=selector), timeout=args.timeout_s)
            if args.json:
                output.dump_json(views.nodes_json(list(response.nodes)), out)
            else:
                views.nodes_table(list(response.nodes), now, out)
        elif args.command == "node":
            detail = stub.GetNode(admin_pb.GetNodeRequest(node_id=args.node_id), timeout=args.timeout_s)
            if args.json:
                output.dump_json(output.message_json(detail), out)
            else:
                views.node_detail(detail, now, out)
        elif args.command == "events":
            listed = stub.ListEvents(
                admin_pb.ListEventsRequest(node_id=args.node, limit=args.limit), timeout=args.timeout_s
            )
            if args.json:
                output.dump_json([output.message_json(e) for e in listed.events], out)
            else:
                views.events_table(list(listed.events), now, out)
    except grpc.RpcError as exc:
        code = exc.code()  # type: ignore[attr-defined]
        print(f"rasctl: {args.command}: {code.name}: {exc.details()}", file=err)  # type: ignore[attr-defined]
        if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
            print(f"rasctl: is rasd-controller running at {args.controller}?", file=err)
            return EXIT_UNREACHABLE
        return EXIT_RPC_ERROR
    finally:
        channel.close()
    return 0


def main() -> int:
    """Console-script entry point."""
    return run(sys.argv[1:], sys.stdout, sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
