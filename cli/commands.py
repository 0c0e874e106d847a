"""rasctl's commands that call the controller: listings (with ``-o``, ``--since``, ``--watch``) and changes.

Imported only by commands that need the controller: it brings gRPC, protobuf and the generated API.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Sequence
from typing import Any, TextIO

import grpc

from rasd.api.v1 import admin_service_pb2 as admin_pb
from rasd.api.v1 import admin_service_pb2_grpc as admin_grpc
from rasd.cli import kinds, listings, output, power_views

PAGE_ITEMS = 1000
"""Items rasctl asks for per page (the controller's most: `rasd.controller.rpc.pages.MAX_PAGE_SIZE`)."""
_LISTINGS = frozenset({"nodes", "node", "events", "incidents", "repairs", "validations", "audit", "stragglers"})
"""Commands that only read (``get sdc``, ``get rma`` and ``describe rma`` are read under their groups)."""


def target(text: str) -> admin_pb.Target:
    """NODE or NODE/GPU as a Target.

    Raises:
        ValueError: no node.
    """
    node_id, _, gpu_uuid = text.partition("/")
    if not node_id:
        raise ValueError(f"target {text!r} is not NODE or NODE/GPU")
    return admin_pb.Target(node_id=node_id, gpu_uuid=gpu_uuid)


def check_arguments(args: argparse.Namespace) -> None:
    """Refuse bad arguments before dialling (ValueError naming what was wrong)."""
    if hasattr(args, "target"):
        target(args.target)
    selector(getattr(args, "selector", []))
    power_views.parse_changes(getattr(args, "changes", None) or [])
    args.since_unix_ns = listings.since_unix_ns(getattr(args, "since", ""), time.time_ns())


def selector(pairs: Sequence[str]) -> dict[str, str]:
    """-l KEY=VALUE pairs as a label selector.

    Raises:
        ValueError: a pair that is not KEY=VALUE.
    """
    selector = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"--selector {pair!r} is not KEY=VALUE")
        selector[key] = value
    return selector


def paged(
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


def run_command(args: argparse.Namespace, channel: grpc.Channel, out: TextIO, err: TextIO) -> None:
    """Carry out one command against the controller on channel."""
    stub = admin_grpc.AdminServiceStub(channel)
    now = time.time_ns()
    if args.command in _LISTINGS or (args.command == "sdc" and args.sdc_command == "list"):
        _run_listing(args, stub, out, err, now)
    elif args.command == "rma":
        _run_rma(args, stub, out, now)
    elif args.command == "power":
        power_views.run(args, stub, out, args.timeout_s)
    else:
        _run_change(args, stub, out)


_LISTING_CALLS: dict[str, Callable[[admin_grpc.AdminServiceStub, argparse.Namespace], tuple[Any, Any, str]]] = {
    "events": lambda stub, args: (
        stub.ListEvents, admin_pb.ListEventsRequest(node_id=args.node, since_unix_ns=args.since_unix_ns), "events"
    ),
    "incidents": lambda stub, args: (
        stub.ListIncidents, admin_pb.ListIncidentsRequest(node_id=args.node, open_only=args.open), "incidents"
    ),
    "repairs": lambda stub, args: (
        stub.ListRepairs, admin_pb.ListRepairsRequest(node_id=args.node, open_only=args.open), "repairs"
    ),
    "validations": lambda stub, args: (
        stub.ListValidations, admin_pb.ListValidationsRequest(node_id=args.node), "validations"
    ),
    "audit": lambda stub, args: (
        stub.ListAudit, admin_pb.ListAuditRequest(since_unix_ns=args.since_unix_ns), "records"
    ),
}  # fmt: skip
"""The paged listings: (call, its request, the answer's item field) per command."""


def _run_listing(
    args: argparse.Namespace, stub: admin_grpc.AdminServiceStub, out: TextIO, err: TextIO, now: int
) -> None:
    """The commands that read: nodes, node, events, incidents, repairs, validations, sdc, audit, stragglers."""
    timeout, form = args.timeout_s, args.output
    listing = kinds.LISTINGS[args.command]
    if args.command == "nodes":
        request = admin_pb.ListNodesRequest(label_selector=selector(args.selector))
        nodes, _more = paged(stub.ListNodes, request, "nodes", limit=None, timeout=timeout, size_field="page_size")
        listings.render(listing, nodes, form, now, out)
        if args.watch:
            _watch(args, stub, out, err, nodes)
        return
    if args.command == "node":
        _show_node(args, stub.GetNode(admin_pb.GetNodeRequest(node_id=args.node_id), timeout=timeout), now, out)
        return
    if args.command == "sdc":
        listed = stub.ListSdc(admin_pb.ListSdcRequest(limit=args.limit), timeout=timeout)
        listings.render(listing, list(listed.gpus), form, now, out)
        return
    if args.command == "stragglers":
        named = stub.ListStragglers(admin_pb.ListStragglersRequest(limit=args.limit), timeout=timeout)
        listings.render(listing, list(named.stragglers), form, now, out)
        if not named.stragglers and not form:
            print(f"rasctl: no stragglers named ({named.steps_judged} steps judged)", file=err)
        if named.HasField("stall"):  # beside the listing, never in it: `-o json` stays a list of GPUs
            from rasd.cli import remediation_views as rviews

            print(rviews.stall_text(named.stall, now), file=err)
        return
    call, request, items = _LISTING_CALLS[args.command](stub, args)
    found, more = paged(call, request, items, limit=args.limit, timeout=timeout)
    listings.render(listing, found, form, now, out)
    if more:
        print(f"rasctl: {args.command}: more than {len(found)}; --limit N shows more", file=err)
    if getattr(args, "watch", False):
        _watch(args, stub, out, err, found)


def _watch(
    args: argparse.Namespace, stub: admin_grpc.AdminServiceStub, out: TextIO, err: TextIO, listed: list[Any]
) -> None:
    """After a listing, its changes as the controller streams them (`listings.follow`).

    Until interrupted, or for --timeout-s when it was given (kubectl's --request-timeout): its end
    is then the watch's, not an error.
    """
    out.flush()
    try:
        _follow(args, stub, out, err, listed)
    except grpc.RpcError as exc:
        if args.watch_timeout_s is None or exc.code() is not grpc.StatusCode.DEADLINE_EXCEEDED:  # type: ignore[attr-defined]
            raise


def _follow(
    args: argparse.Namespace, stub: admin_grpc.AdminServiceStub, out: TextIO, err: TextIO, listed: list[Any]
) -> None:
    timeout = args.watch_timeout_s
    listing = kinds.LISTINGS[args.command]
    if args.command == "nodes":
        answers = stub.WatchNodes(admin_pb.WatchNodesRequest(label_selector=selector(args.selector)), timeout=timeout)
        listings.follow(listing, answers, lambda a: a.nodes, args.output, out, err)
    elif args.command == "events":
        # From just after the newest event listed (the controller's clock): none stored between the
        # listing and the watch is missed. With none listed, from --since, or only new ones.
        since = max((e.received_unix_ns for e in listed), default=args.since_unix_ns - 1) + 1
        answers = stub.WatchEvents(
            admin_pb.WatchEventsRequest(node_id=args.node, since_unix_ns=max(since, 0)), timeout=timeout
        )
        listings.follow(listing, answers, lambda a: a.events, args.output, out, err)
    elif args.command == "incidents":
        answers = stub.WatchIncidents(admin_pb.WatchIncidentsRequest(node_id=args.node), timeout=timeout)
        listings.follow(listing, answers, lambda a: [i for i in a.incidents if _open(args, i)], args.output, out, err)
    else:
        answers = stub.WatchRepairs(admin_pb.WatchRepairsRequest(node_id=args.node), timeout=timeout)
        listings.follow(listing, answers, lambda a: a.repairs, args.output, out, err)


def _open(args: argparse.Namespace, incident: admin_pb.Incident) -> bool:
    return not args.open or not incident.closed_unix_ns


def _show_node(args: argparse.Namespace, detail: admin_pb.GetNodeResponse, now: int, out: TextIO) -> None:
    """``describe node``: the node, then its quarantines and repair ladder when it has any."""
    from rasd.cli import remediation_views as rviews
    from rasd.cli import views

    if args.output in ("json", "yaml"):
        data = output.message_json(detail)
        listings.dump(data, args.output, out)
        return
    if args.output in ("name", "wide"):
        listings.render(kinds.LISTINGS["node"], [detail], args.output, now, out)
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
    """``get rma``, ``describe rma``, ``approve rma``."""
    timeout = args.timeout_s
    if args.rma_command == "list":
        listed = stub.ListRma(admin_pb.ListRmaRequest(pending_only=args.pending), timeout=timeout)
        listings.render(kinds.LISTINGS["rma"], list(listed.tickets), args.output, now, out)
    elif args.rma_command == "show":
        ticket = stub.GetRma(admin_pb.GetRmaRequest(rma_id=args.rma_id), timeout=timeout)
        if args.output in ("name", "wide"):
            listings.render(kinds.LISTINGS["rma"], [ticket.ticket], args.output, now, out)
        elif args.output == "yaml":
            listings.dump_yaml(output.message_json(ticket), out)
        else:  # JSON by default: the evidence bundle is a document, not a row
            output.dump_json(output.message_json(ticket), out)
    else:
        approved = stub.ApproveRma(admin_pb.ApproveRmaRequest(rma_id=args.rma_id), timeout=timeout)
        ticket = approved.ticket
        print(f"RMA {output.printable(ticket.rma_id)}: {output.printable(ticket.state)}", file=out)


def _run_change(args: argparse.Namespace, stub: admin_grpc.AdminServiceStub, out: TextIO) -> None:
    """The commands that change something: quarantine, release, validate, sdc accuse, gpu forget-owner, automation."""
    timeout = args.timeout_s
    if args.command == "quarantine":
        stub.Quarantine(admin_pb.QuarantineRequest(target=target(args.target), reason=args.reason), timeout=timeout)
        print(f"quarantined {args.target}", file=out)
    elif args.command == "release":
        released, call = stub.Release.with_call(
            admin_pb.ReleaseRequest(target=target(args.target), reason=args.reason, force=args.force), timeout=timeout
        )
        outcome = dict(call.trailing_metadata() or ()).get("rasd-outcome", "")
        state = admin_pb.ComponentState.Name(released.state).removeprefix("COMPONENT_STATE_").lower()
        print(f"{args.target}: {state}" + (f" ({output.printable(outcome)})" if outcome else ""), file=out)
    elif args.command == "validate":
        started = stub.Validate(
            admin_pb.ValidateRequest(target=target(args.target), suite=args.suite, seed=args.seed), timeout=timeout
        )
        validation_id = output.printable(started.validation_id)
        print(f"validation {validation_id} started on {args.target}; see `rasctl get validations`", file=out)
    elif args.command == "sdc":
        stub.AccuseSdc(
            admin_pb.AccuseSdcRequest(target=target(args.target), reason=args.reason),
            timeout=timeout,
        )
        print(f"accused {args.target}: quarantined for the accusation suite", file=out)
    elif args.command == "gpu":
        stub.ForgetGpuOwner(
            admin_pb.ForgetGpuOwnerRequest(target=target(args.target), reason=args.reason), timeout=timeout
        )
        print(f"{args.target}: no longer its node's; the next node whose Hello lists it owns it", file=out)
    elif args.command == "automation":
        if args.action == "status":
            status = stub.GetAutomationStatus(admin_pb.GetAutomationStatusRequest(), timeout=timeout)
        else:
            status = stub.SetAutomationPaused(
                admin_pb.SetAutomationPausedRequest(paused=args.action == "pause", reason=args.reason), timeout=timeout
            )
        if args.output in ("json", "yaml"):
            data = output.message_json(status)
            listings.dump(data, args.output, out)
        else:
            print(automation_line(status), file=out)


def automation_line(status: admin_pb.AutomationStatus) -> str:
    """One line: running, paused by an operator, or held by the circuit breaker (since when), and why."""
    if not status.paused:
        return "automation running"
    who = "the circuit breaker" if status.breaker_tripped else "an operator"
    since = ""
    if status.since_unix_ns:
        since = time.strftime(" since %Y-%m-%dT%H:%M:%SZ", time.gmtime(status.since_unix_ns / 1e9))
    return f"automation paused by {who}{since}" + (f": {output.printable(status.reason)}" if status.reason else "")
