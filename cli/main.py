"""rasctl: the operator CLI. Each subcommand is one AdminService call rendered as a table or JSON.

The controller address comes from --controller or $RASD_CONTROLLER (default 127.0.0.1:7443); how
rasctl authenticates (mutual TLS, bearer token) is in ``rasd.cli.credentials``.
Targets are written NODE or NODE/GPU-UUID. Exit codes: 0 success, 1 the controller answered with
an error, 2 usage error, 3 unreachable.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import re
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any, TextIO

import grpc

from rasd.api.v1 import admin_service_pb2 as admin_pb
from rasd.api.v1 import admin_service_pb2_grpc as admin_grpc
from rasd.cli import credentials, output, power_views, views
from rasd.cli import remediation_views as rviews
from rasd.common import VERSION

EXIT_RPC_ERROR = 1
EXIT_USAGE = 2
EXIT_UNREACHABLE = 3
LEADER_ADDRESS_KEY = "rasd-leader-address"
"""Trailing metadata of a follower's FAILED_PRECONDITION: where the leader serves (controller/rpc/leader_gate.py)."""


def build_parser() -> argparse.ArgumentParser:
    """The command line of rasctl."""
    parser = argparse.ArgumentParser(prog="rasctl", description="Operate a rasd-managed GPU fleet.")
    parser.add_argument(
        "--controller",
        default=os.environ.get("RASD_CONTROLLER", "127.0.0.1:7443"),
        help="controller address host:port (default $RASD_CONTROLLER or 127.0.0.1:7443)",
    )
    parser.add_argument("--timeout-s", type=float, default=10.0, help="RPC deadline (default %(default)s)")
    credentials.add_global_arguments(parser)
    parser.add_argument("--version", action="version", version=f"rasctl {VERSION}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, help_text: str, *, json: bool = True) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, help=help_text)
        if json:
            sub.add_argument("--json", action="store_true", help="machine-readable output")
        return sub

    nodes = command("nodes", "the fleet: nodes, GPUs, state, last seen, power draw and cap")
    nodes.add_argument("-l", "--selector", action="append", default=[], metavar="KEY=VALUE", help="label filter")
    command("node", "one node: GPUs, telemetry, ladder position with reasons, quarantines, events").add_argument(
        "node_id"
    )
    events = command("events", "stored health events, newest first")
    events.add_argument("--node", default="")
    events.add_argument("--limit", type=int, default=50, help="at most this many (default %(default)s)")
    incidents = command("incidents", "correlated incidents, newest first")
    incidents.add_argument("--node", default="")
    incidents.add_argument("--open", action="store_true", help="only open incidents")
    incidents.add_argument("--limit", type=int, default=100, help="at most this many (default %(default)s)")
    repairs = command("repairs", "repair tickets: state, rung and why")
    repairs.add_argument("--node", default="")
    repairs.add_argument("--open", action="store_true", help="only open tickets")
    repairs.add_argument("--limit", type=int, default=100, help="at most this many (default %(default)s)")
    quarantine = command("quarantine", "take NODE or NODE/GPU out of scheduling", json=False)
    quarantine.add_argument("target", metavar="NODE[/GPU]")
    quarantine.add_argument("--reason", required=True)
    release = command(
        "release", "return NODE or NODE/GPU to service (needs a passing validation, or --force)", json=False
    )
    release.add_argument("target", metavar="NODE[/GPU]")
    release.add_argument("--reason", default="operator release")
    release.add_argument("--force", action="store_true", help="release without validation (audited)")
    validate = command("validate", "run a validation suite on NODE or NODE/GPU", json=False)
    validate.add_argument("target", metavar="NODE[/GPU]")
    validate.add_argument("--suite", default="quick", choices=("quick", "accusation", "post-repair"))
    validate.add_argument("--seed", type=int, default=0)
    validations = command("validations", "validation runs and verdicts")
    validations.add_argument("--node", default="")
    validations.add_argument("--limit", type=int, default=100, help="at most this many (default %(default)s)")
    _add_groups(commands)
    audit = command("audit", "who did what, when, to what, why, and how it ended")
    audit.add_argument("--limit", type=int, default=50, help="at most this many (default %(default)s)")

    credentials.add_commands(commands)
    power_views.add_parser(commands)
    return parser


def _add_groups(commands: Any) -> None:
    """The commands with verbs of their own: sdc, rma, gpu, automation, kmsg."""
    sdc = commands.add_parser("sdc", help="silent data corruption")
    sdc_commands = sdc.add_subparsers(dest="sdc_command", required=True, metavar="SDC_COMMAND")
    accuse = sdc_commands.add_parser("accuse", help="accuse NODE/GPU of SDC: quarantine and run the accusation suite")
    accuse.add_argument("target", metavar="NODE/GPU")
    accuse.add_argument("--reason", required=True)
    sdc_list = sdc_commands.add_parser("list", help="GPUs with SDC history, most suspicious first")
    sdc_list.add_argument("--limit", type=int, default=100)
    sdc_list.add_argument("--json", action="store_true")
    rma = commands.add_parser("rma", help="RMA tickets")
    rma_commands = rma.add_subparsers(dest="rma_command", required=True, metavar="RMA_COMMAND")
    rma_list = rma_commands.add_parser("list", help="RMA tickets")
    rma_list.add_argument("--pending", action="store_true")
    rma_list.add_argument("--json", action="store_true")
    rma_show = rma_commands.add_parser("show", help="one ticket with its evidence bundle (JSON)")
    rma_show.add_argument("rma_id")
    rma_approve = rma_commands.add_parser("approve", help="approve a pending ticket")
    rma_approve.add_argument("rma_id")
    gpu = commands.add_parser("gpu", help="a GPU's place in the fleet")
    gpu_commands = gpu.add_subparsers(dest="gpu_command", required=True, metavar="GPU_COMMAND")
    forget = gpu_commands.add_parser(
        "forget-owner",
        help="NODE/GPU was moved out of NODE by hand: the next node whose Hello lists the GPU owns it (admin)",
    )
    forget.add_argument("target", metavar="NODE/GPU")
    forget.add_argument("--reason", required=True)
    automation = commands.add_parser("automation", help="pause or resume automated repairs, or show whether they run")
    automation.add_argument("action", choices=("pause", "resume", "status"), help="status only reads")
    automation.add_argument("--reason", default="")
    automation.add_argument("--json", action="store_true", help="machine-readable output (status)")
    kmsg = commands.add_parser("kmsg", help="kernel-log tools that need no controller")
    kmsg_commands = kmsg.add_subparsers(dest="kmsg_command", required=True, metavar="KMSG_COMMAND")
    kmsg_commands.add_parser(
        "classify", help="read kernel log text on stdin; print one JSON object per GPU/IB event found"
    )


def _selector(pairs: Sequence[str]) -> dict[str, str]:
    selector = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"--selector {pair!r} is not KEY=VALUE")
        selector[key] = value
    return selector


def _target(text: str) -> admin_pb.Target:
    node_id, _, gpu_uuid = text.partition("/")
    if not node_id:
        raise ValueError(f"target {text!r} is not NODE or NODE/GPU")
    return admin_pb.Target(node_id=node_id, gpu_uuid=gpu_uuid)


_LISTINGS = frozenset({"nodes", "node", "events", "incidents", "repairs", "validations", "audit"})
"""Commands that only read (``sdc list`` and ``rma list``/``show`` are read under their groups)."""


PAGE_ITEMS = 1000
"""Items rasctl asks for per page (the controller's most: `rasd.controller.rpc.pages.MAX_PAGE_SIZE`)."""


def _paged(
    call: Callable[..., Any], request: Any, items: str, *, limit: int | None, timeout: float, size_field: str = "limit"
) -> tuple[list[Any], bool]:
    """The items of a listing page after page, until limit (None: all); and whether more were left.

    The controller answers a listing a page at a time (at most 1,000 items and about 2 MiB a page);
    rasctl follows ``next_page_token`` so that ``--limit`` means what it says.
    """
    listed: list[Any] = []
    while True:
        wanted = PAGE_ITEMS if limit is None else max(1, min(PAGE_ITEMS, limit - len(listed)))
        setattr(request, size_field, wanted)
        response = call(request, timeout=timeout)
        listed.extend(getattr(response, items))
        if limit is not None and len(listed) >= limit:
            return listed[:limit], bool(response.next_page_token) or len(listed) > limit
        if not response.next_page_token:
            return listed, False
        request.page_token = response.next_page_token


def _run_command(args: argparse.Namespace, stub: admin_grpc.AdminServiceStub, out: TextIO, err: TextIO) -> None:
    now = time.time_ns()
    if args.command in _LISTINGS or (args.command == "sdc" and args.sdc_command == "list"):
        _run_listing(args, stub, out, err, now)
    elif args.command == "rma":
        _run_rma(args, stub, out, now)
    elif args.command == "power":
        power_views.run(args, stub, out, args.timeout_s)
    else:
        _run_change(args, stub, out)


def _show(
    args: argparse.Namespace,
    messages: Sequence[Any],
    table: Callable[[list[Any], int, TextIO], None],
    now: int,
    out: TextIO,
) -> None:
    """Print messages as JSON (--json) or as a table."""
    if getattr(args, "json", False):
        output.dump_json([output.message_json(m) for m in messages], out)
    else:
        table(list(messages), now, out)


_LISTING_CALLS: dict[str, Callable[[admin_grpc.AdminServiceStub, argparse.Namespace], tuple[Any, Any, str, Any]]] = {
    "events": lambda stub, args: (
        stub.ListEvents, admin_pb.ListEventsRequest(node_id=args.node), "events", views.events_table
    ),
    "incidents": lambda stub, args: (
        stub.ListIncidents, admin_pb.ListIncidentsRequest(node_id=args.node, open_only=args.open), "incidents",
        rviews.incidents_table,
    ),
    "repairs": lambda stub, args: (
        stub.ListRepairs, admin_pb.ListRepairsRequest(node_id=args.node, open_only=args.open), "repairs",
        rviews.repairs_table,
    ),
    "validations": lambda stub, args: (
        stub.ListValidations, admin_pb.ListValidationsRequest(node_id=args.node), "validations",
        rviews.validations_table,
    ),
    "audit": lambda stub, args: (stub.ListAudit, admin_pb.ListAuditRequest(), "records", rviews.audit_table),
}  # fmt: skip
"""The paged listings: (call, its request, the answer's item field, the table that shows them) per command."""


def _run_listing(
    args: argparse.Namespace, stub: admin_grpc.AdminServiceStub, out: TextIO, err: TextIO, now: int
) -> None:
    """The commands that read: nodes, node, events, incidents, repairs, validations, sdc list, audit."""
    timeout = args.timeout_s
    if args.command == "nodes":
        request = admin_pb.ListNodesRequest(label_selector=_selector(args.selector))
        nodes, _more = _paged(stub.ListNodes, request, "nodes", limit=None, timeout=timeout, size_field="page_size")
        if getattr(args, "json", False):
            output.dump_json(views.nodes_json(nodes), out)
        else:
            views.nodes_table(nodes, now, out)
        return
    if args.command == "node":
        _show_node(args, stub.GetNode(admin_pb.GetNodeRequest(node_id=args.node_id), timeout=timeout), now, out)
        return
    if args.command == "sdc":
        listed = stub.ListSdc(admin_pb.ListSdcRequest(limit=args.limit), timeout=timeout)
        _show(args, listed.gpus, rviews.sdc_table, now, out)
        return
    call, request, items, table = _LISTING_CALLS[args.command](stub, args)
    listed, more = _paged(call, request, items, limit=args.limit, timeout=timeout)
    _show(args, listed, table, now, out)
    if more:
        print(f"rasctl: {args.command}: more than {len(listed)}; --limit N shows more", file=err)


def _show_node(args: argparse.Namespace, detail: admin_pb.GetNodeResponse, now: int, out: TextIO) -> None:
    """``rasctl node``: the node, then its quarantines and repair ladder when it has any."""
    if getattr(args, "json", False):
        output.dump_json(output.message_json(detail), out)
        return
    views.node_detail(detail, now, out)
    if detail.quarantines:
        print("quarantined:", file=out)
        rviews.quarantines_table(list(detail.quarantines), now, out)
    if detail.repairs:
        print("repair ladder:", file=out)
        rviews.repairs_table(list(detail.repairs), now, out)
        rviews.repair_history(list(detail.repairs), out)


def _run_rma(args: argparse.Namespace, stub: admin_grpc.AdminServiceStub, out: TextIO, now: int) -> None:
    """``rasctl rma list|show|approve``."""
    timeout = args.timeout_s
    if args.rma_command == "list":
        listed = stub.ListRma(admin_pb.ListRmaRequest(pending_only=args.pending), timeout=timeout)
        _show(args, listed.tickets, rviews.rma_table, now, out)
    elif args.rma_command == "show":
        output.dump_json(
            output.message_json(stub.GetRma(admin_pb.GetRmaRequest(rma_id=args.rma_id), timeout=timeout)), out
        )
    else:
        approved = stub.ApproveRma(admin_pb.ApproveRmaRequest(rma_id=args.rma_id), timeout=timeout)
        ticket = approved.ticket
        print(f"RMA {output.printable(ticket.rma_id)}: {output.printable(ticket.state)}", file=out)


def _run_change(args: argparse.Namespace, stub: admin_grpc.AdminServiceStub, out: TextIO) -> None:
    """The commands that change something: quarantine, release, validate, sdc accuse, gpu forget-owner, automation."""
    timeout = args.timeout_s
    if args.command == "quarantine":
        stub.Quarantine(admin_pb.QuarantineRequest(target=_target(args.target), reason=args.reason), timeout=timeout)
        print(f"quarantined {args.target}", file=out)
    elif args.command == "release":
        released, call = stub.Release.with_call(
            admin_pb.ReleaseRequest(target=_target(args.target), reason=args.reason, force=args.force), timeout=timeout
        )
        outcome = dict(call.trailing_metadata() or ()).get("rasd-outcome", "")
        state = admin_pb.ComponentState.Name(released.state).removeprefix("COMPONENT_STATE_").lower()
        print(f"{args.target}: {state}" + (f" ({output.printable(outcome)})" if outcome else ""), file=out)
    elif args.command == "validate":
        started = stub.Validate(
            admin_pb.ValidateRequest(target=_target(args.target), suite=args.suite, seed=args.seed), timeout=timeout
        )
        validation_id = output.printable(started.validation_id)
        print(f"validation {validation_id} started on {args.target}; see `rasctl validations`", file=out)
    elif args.command == "sdc":
        stub.AccuseSdc(
            admin_pb.AccuseSdcRequest(target=_target(args.target), reason=args.reason),
            timeout=timeout,
        )
        print(f"accused {args.target}: quarantined for the accusation suite", file=out)
    elif args.command == "gpu":
        stub.ForgetGpuOwner(
            admin_pb.ForgetGpuOwnerRequest(target=_target(args.target), reason=args.reason), timeout=timeout
        )
        print(f"{args.target}: no longer its node's; the next node whose Hello lists it owns it", file=out)
    elif args.command == "automation":
        if args.action == "status":
            status = stub.GetAutomationStatus(admin_pb.GetAutomationStatusRequest(), timeout=timeout)
        else:
            status = stub.SetAutomationPaused(
                admin_pb.SetAutomationPausedRequest(paused=args.action == "pause", reason=args.reason), timeout=timeout
            )
        if args.json:
            output.dump_json(output.message_json(status), out)
        else:
            print(_automation_line(status), file=out)


def _automation_line(status: admin_pb.AutomationStatus) -> str:
    """One line: running, paused by an operator, or held by the circuit breaker (since when), and why."""
    if not status.paused:
        return "automation running"
    who = "the circuit breaker" if status.breaker_tripped else "an operator"
    since = ""
    if status.since_unix_ns:
        since = time.strftime(" since %Y-%m-%dT%H:%M:%SZ", time.gmtime(status.since_unix_ns / 1e9))
    return f"automation paused by {who}{since}" + (f": {output.printable(status.reason)}" if status.reason else "")


def unreachable_hint(details: str, args: argparse.Namespace) -> str:
    """What an UNAVAILABLE (or timed-out) call most likely means, for the operator to act on.

    Every one of them said "is rasd-controller running?": a controller that refused the client
    certificate (gRPC reports only "Socket closed"), a controller certificate this client does not
    trust or that does not carry the name dialled (a failed TLS handshake), and a controller whose
    store was down sent operators looking for a process that was running.
    """
    controller = args.controller
    if "store unavailable" in details:
        return f"store unavailable: rasd-controller at {controller} runs, but cannot reach its store; retry later"
    if "Hostname Verification" in details or "No match found for server name" in details:
        name = getattr(args, "tls_server_name", None) or controller.rpartition(":")[0].strip("[]")
        return (
            f"certificate name mismatch: rasd-controller at {controller} presented a certificate not issued for "
            f"{name!r}; dial a name its certificate carries, or pass --tls-server-name"
        )
    verify = re.search(r"CERTIFICATE_VERIFY_FAILED(?::\s*([^:]+))?", details)
    if verify is not None or "handshake failed" in details.lower():
        reason = f" ({verify.group(1).strip()})" if verify is not None and verify.group(1) else ""
        return (
            f"certificate not trusted: the TLS handshake with rasd-controller at {controller} failed{reason}; check "
            f"that its certificate is signed by {getattr(args, 'tls_ca', None) or 'the CA given'} and not expired"
        )
    if "Socket closed" in details and getattr(args, "tls_cert", None):
        return (
            f"certificate refused: rasd-controller at {controller} closed the TLS connection; check that "
            f"{args.tls_cert} is signed by the controller's CA and not expired"
        )
    return f"is rasd-controller running at {controller}?"


def run(argv: Sequence[str] | None, out: TextIO, err: TextIO) -> int:
    """Run rasctl with argv, printing to out/err; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "kmsg":
        from rasd.cli import kmsg

        kmsg.classify_stream(sys.stdin, out)
        return 0
    try:
        if credentials.run_offline(args, out):
            return 0
        channel = credentials.channel(args)
        for attribute in ("target",):
            if hasattr(args, attribute):
                _target(getattr(args, attribute))
        _selector(getattr(args, "selector", []))
        power_views.parse_changes(getattr(args, "changes", None) or [])
    except (OSError, ValueError) as exc:
        print(f"rasctl: {exc}", file=err)
        return EXIT_USAGE
    try:
        try:
            _run_command(args, admin_grpc.AdminServiceStub(credentials.authenticated(args, channel)), out, err)
        except grpc.RpcError as refused:
            leader_args = _at_the_leader(args, refused)
            if leader_args is None:
                raise
            print(f"rasctl: {args.controller} does not lead; calling the leader at {leader_args.controller}", file=err)
            channel.close()
            args, channel = leader_args, credentials.channel(leader_args)
            _run_command(args, admin_grpc.AdminServiceStub(credentials.authenticated(args, channel)), out, err)
    except ValueError as exc:  # the leader's address cannot be dialled as the first one was
        print(f"rasctl: {exc}", file=err)
        return EXIT_USAGE
    except grpc.RpcError as exc:
        code = exc.code()  # type: ignore[attr-defined]
        details = output.printable(exc.details() or "")  # type: ignore[attr-defined]
        print(f"rasctl: {args.command}: {code.name}: {details}", file=err)
        if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
            print(f"rasctl: {unreachable_hint(details, args)}", file=err)
            return EXIT_UNREACHABLE
        return EXIT_RPC_ERROR
    finally:
        channel.close()
    return 0


def _at_the_leader(args: argparse.Namespace, refused: grpc.RpcError) -> argparse.Namespace | None:
    """args aimed at the leader a follower's refusal names; None when the error is not such a refusal.

    The leader serves the same certificate as the replica first called (one Secret), so the TLS name
    checked stays the one the operator dialled (or --tls-server-name) although the address is the
    leader pod's own. One retry: a second refusal (the leader changed meanwhile) is the answer.
    """
    if refused.code() is not grpc.StatusCode.FAILED_PRECONDITION:  # type: ignore[attr-defined]
        return None
    trailers = dict(refused.trailing_metadata() or ())  # type: ignore[attr-defined]
    address = trailers.get(LEADER_ADDRESS_KEY, "")
    if not address or address == args.controller:
        return None
    server_name = args.tls_server_name
    if not server_name:
        host = args.controller.rpartition(":")[0].strip("[]")
        server_name = "" if _is_ip_address(host) else host  # an IP: the leader's own address is checked
    return argparse.Namespace(**{**vars(args), "controller": address, "tls_server_name": server_name})


def _is_ip_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def main() -> int:
    """Console-script entry point."""
    return run(sys.argv[1:], sys.stdout, sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
