"""AdminService servicer: the RPCs rasctl calls. Kept thin: validate, call the service, convert.

The power RPCs answer FAILED_PRECONDITION on a controller without a power loop (no `[power]` table).
Every state-changing call is audited with the caller the auth interceptor authenticated
(``authz.actor()``); who may call what is decided there, never here.

Listings answer a page at a time, bounded in items and bytes (`pages`), and read beside the store
thread (`StoreCalls.run_read`), never on it: the store thread serializes every write, agents' acks
included, and a viewer's read there held every node's ack behind it. A page is read and converted
to its answer on the read thread, so the event loop that serves the agents only sends it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import grpc

from rasd.api.v1 import admin_service_pb2 as admin_pb
from rasd.api.v1 import admin_service_pb2_grpc as admin_grpc
from rasd.common.text import echoed
from rasd.controller import changes as changes_mod
from rasd.controller.core import fleet
from rasd.controller.core.power import policy as power_policy
from rasd.controller.core.power import tree as power_tree
from rasd.controller.core.remediation import blast_radius, repair_queue
from rasd.controller.ingest import service as ingest
from rasd.controller.power import loop as power_loop
from rasd.controller.remediation import service as remediation_mod
from rasd.controller.rpc import authz, pages, watch_rpcs
from rasd.controller.store import paging
from rasd.controller.store import thread as store_thread
from rasd.controller.wire import agent as wire
from rasd.controller.wire import power as power_wire

MAX_LIST_LIMIT = 10_000
"""ListEvents' limit above this is INVALID_ARGUMENT (as before pages; up to it, a page holds at most
`pages.MAX_PAGE_SIZE`)."""
RECENT_EVENTS = 50
"""Events GetNode shows."""
RECENT_TICKETS = 20
"""Repair tickets GetNode shows."""

AnswerT = TypeVar("AnswerT")


def automation_status_to_wire(budget: blast_radius.BudgetState) -> admin_pb.AutomationStatus:
    """The pause and the breaker as rasctl shows them; since_unix_ns is the breaker's trip (0 for a pause)."""
    tripped_at_s = budget.breaker_tripped_at
    return admin_pb.AutomationStatus(
        paused=budget.paused or budget.breaker_tripped,
        breaker_tripped=budget.breaker_tripped,
        reason=budget.breaker_reason or budget.pause_reason,
        since_unix_ns=int(tripped_at_s * 1e9) if tripped_at_s is not None else 0,
    )


class AdminService(watch_rpcs.WatchRpcs, admin_grpc.AdminServiceServicer):
    """Serves the operator API (its watches: `watch_rpcs`)."""

    def __init__(
        self,
        service: ingest.Ingest,
        remediation: remediation_mod.RemediationService | None = None,
        *,
        power: power_loop.PowerLoop | None = None,
        changes: changes_mod.Changes | None = None,
    ) -> None:
        """Bind to the ingest service and (when they run) the remediation service and the power loop.

        changes: what the watches follow (the replica's `wiring.Wired.changes`; None: a fan-out nothing publishes to).
        """
        self._ingest = service
        self._changes = changes if changes is not None else changes_mod.Changes()
        self._remediation = remediation
        self._power = power

    async def _read(self, context: grpc.aio.ServicerContext, read: Callable[[], AnswerT]) -> AnswerT:
        """Run read beside the store thread (`StoreCalls.run_read`); RESOURCE_EXHAUSTED when too many reads wait."""
        try:
            return await self._ingest.store_calls.run_read(read)
        except store_thread.ReadsBusy as exc:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc))
            raise  # unreachable: abort raises

    async def _after(self, listing: str, page_token: str, context: grpc.aio.ServicerContext) -> paging.Position | None:
        """Where the page a request's page_token names starts; INVALID_ARGUMENT for a token not of this listing."""
        try:
            return pages.position(listing, page_token)
        except pages.BadPageToken as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
            raise  # unreachable: abort raises

    async def _need_power(self, context: grpc.aio.ServicerContext) -> power_loop.PowerLoop:
        if self._power is None:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, "no power loop: controller.toml has no [power]")
        return self._power  # type: ignore[return-value]

    async def GetPowerStatus(
        self, request: admin_pb.GetPowerStatusRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb.GetPowerStatusResponse:
        """The budget tree with what may be in force, targets, draw, headroom and the swing now."""
        loop = await self._need_power(context)
        return power_wire.power_status_to_wire(loop.status)

    async def SetPowerBudget(
        self, request: admin_pb.SetPowerBudgetRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb.SetPowerBudgetResponse:
        """Change one domain's budget at run time (persisted, enforced at once)."""
        loop = await self._need_power(context)
        if not request.domain_id:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "domain_id: required")
        if request.domain_id not in {d.name for d in loop.tree.domains}:
            await context.abort(
                grpc.StatusCode.NOT_FOUND, f"domain_id: {echoed(request.domain_id)} is not in the power tree"
            )
        reason = request.reason or "operator"
        try:
            domain = await loop.set_budget(
                request.domain_id, None if request.clear else request.budget_w, reason=reason, actor=authz.actor()
            )
        except power_tree.PowerTreeError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"budget_w: {exc}")
        return admin_pb.SetPowerBudgetResponse(
            domain=admin_pb.PowerDomain(
                domain_id=domain.name,
                level=domain.level,
                budget_w=domain.budget_w or 0,
                has_budget=domain.budget_w is not None,
            )
        )

    async def GetPowerPolicy(
        self, request: admin_pb.GetPowerPolicyRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb.GetPowerPolicyResponse:
        """The power policy in force as TOML."""
        loop = await self._need_power(context)
        return admin_pb.GetPowerPolicyResponse(policy_toml=loop.policy_toml())

    async def SetPowerPolicy(
        self, request: admin_pb.SetPowerPolicyRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb.SetPowerPolicyResponse:
        """Replace the power policy (persisted); the response is the policy as parsed."""
        loop = await self._need_power(context)
        try:
            await loop.set_policy(
                power_loop.policy_from_toml(request.policy_toml),
                reason=request.reason or "operator",
                actor=authz.actor(),
            )
        except power_policy.PolicyError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        return admin_pb.SetPowerPolicyResponse(policy_toml=loop.policy_toml())

    async def _need_remediation(self, context: grpc.aio.ServicerContext) -> remediation_mod.RemediationService:
        if self._remediation is None:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, "remediation is disabled on this controller")
        return self._remediation  # type: ignore[return-value]

    async def _known_target(self, target: admin_pb.Target, context: grpc.aio.ServicerContext) -> None:
        if not target.node_id:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "target.node_id: required")
        nodes = await self._ingest.list_nodes(node_ids=[target.node_id])
        node = nodes[0] if nodes else None
        if node is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"target.node_id: {echoed(target.node_id)} never connected")
        if target.gpu_uuid and target.gpu_uuid not in {g.record.uuid for g in node.gpus}:
            await context.abort(
                grpc.StatusCode.NOT_FOUND,
                f"target.gpu_uuid: {echoed(target.gpu_uuid)} is not a GPU of {target.node_id}",
            )

    async def ListIncidents(
        self, request: admin_pb.ListIncidentsRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb.ListIncidentsResponse:
        """Incidents, newest first, a page at a time."""
        store = (await self._need_remediation(context)).store
        after = await self._after("incidents", request.page_token, context)

        def read() -> admin_pb.ListIncidentsResponse:
            page = store.incidents_page(node_id=request.node_id, open_only=request.open_only, after=after,
                                        limit=pages.page_size(request.limit), max_bytes=pages.PAGE_BYTES)  # fmt: skip
            return admin_pb.ListIncidentsResponse(
                incidents=[wire.incident_to_wire(r) for r in page.items],
                next_page_token=pages.token("incidents", page.next_after),
            )

        return await self._read(context, read)

    async def ListRepairs(
        self, request: admin_pb.ListRepairsRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb.ListRepairsResponse:
        """Repair tickets, most recently updated first, a page at a time."""
        store = (await self._need_remediation(context)).store
        after = await self._after("repairs", request.page_token, context)

        def read() -> admin_pb.ListRepairsResponse:
            page = store.tickets_page(node_id=request.node_id, open_only=request.open_only, after=after,
                                      limit=pages.page_size(request.limit), max_bytes=pages.PAGE_BYTES)  # fmt: skip
            return admin_pb.ListRepairsResponse(
                repairs=[wire.repair_to_wire(r) for r in page.items],
                next_page_token=pages.token("repairs", page.next_after),
            )

        return await self._read(context, read)

    async def Quarantine(
        self, request: admin_pb.QuarantineRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb.QuarantineResponse:
        """Take a node or GPU out of scheduling by hand."""
        service = await self._need_remediation(context)
        await self._known_target(request.target, context)
        if not request.reason:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "reason: required (it goes to the audit log)")
        node_id = request.target.node_id
        active = await self._ingest.store_calls.run_in_store(lambda: service.store.quarantines(node_id=node_id))
        if any(q["gpu_uuid"] == request.target.gpu_uuid and not q["port"] for q in active):
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, "target: already quarantined")
        await service.operator_quarantine(
            request.target.node_id, request.target.gpu_uuid, reason=request.reason, actor=authz.actor()
        )
        return admin_pb.QuarantineResponse(target=request.target, state=admin_pb.COMPONENT_STATE_QUARANTINED)

    async def Release(
        self, request: admin_pb.ReleaseRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb.ReleaseResponse:
        """Return a node or GPU to service: after a passing validation, or by force (audited)."""
        service = await self._need_remediation(context)
        await self._known_target(request.target, context)
        try:
            outcome = await service.operator_release(
                request.target.node_id,
                request.target.gpu_uuid,
                reason=request.reason or "operator release",
                force=request.force,
                actor=authz.actor(),
            )
        except LookupError as exc:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"target: {exc}")
        except PermissionError as exc:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
        context.set_trailing_metadata((("rasd-outcome", outcome),))
        state = (
            admin_pb.COMPONENT_STATE_HEALTHY
            if request.force or "released" in outcome
            else admin_pb.COMPONENT_STATE_VALIDATING
        )
        return admin_pb.ReleaseResponse(target=request.target, state=state)

    async def Validate(
        self, request: admin_pb.ValidateRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb.ValidateResponse:
        """Start a validation run; rasctl validations shows its verdict."""
        service = await self._need_remediation(context)
        await self._known_target(request.target, context)
        if request.suite not in ("quick", "accusation", "post-repair"):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "suite: one of quick, accusation, post-repair")
        try:
            validation_id = await service.operator_validate(
                request.target.node_id,
                request.target.gpu_uuid,
                suite=request.suite,
                seed=request.seed,
                actor=authz.actor(),
            )
        except ConnectionError as exc:
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
        return admin_pb.ValidateResponse(validation_id=validation_id, command_id=validation_id)

    async def AccuseSdc(
        self, request: admin_pb.AccuseSdcRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb.AccuseSdcResponse:
        """A GPU is accused of silent data corruption: quarantine it and run the accusation suite."""
        service = await self._need_remediation(context)
        await self._known_target(request.target, context)
        if not request.target.gpu_uuid:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "target.gpu_uuid: an accusation names one GPU")
        await service.accuse(
            request.target.node_id,
            request.target.gpu_uuid,
            reason=(request.reason or "SDC accusation")
            + (f" (reported by {request.accuser})" if request.accuser else ""),
            accuser=authz.actor(),
        )
        return admin_pb.AccuseSdcResponse()

    async def ListValidations(
        self, request: admin_pb.ListValidationsRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb.ListValidationsResponse:
        """Validation runs, newest first, a page at a time."""
        store = (await self._need_remediation(context)).store
        after = await self._after("validations", request.page_token, context)

        def read() -> admin_pb.ListValidationsResponse:
            page = store.validations_page(node_id=request.node_id, after=after, limit=pages.page_size(request.limit),
                                          max_bytes=pages.PAGE_BYTES)  # fmt: skip
            return admin_pb.ListValidationsResponse(
                validations=[wire.validation_to_wire(r) for r in page.items],
                next_page_token=pages.token("validations", page.next_after),
            )

        return await self._read(context, read)

    async def ListSdc(
        self, request: admin_pb.ListSdcRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb.ListSdcResponse:
        """GPUs with SDC history or under watch, most suspicious first (at most `pages.MAX_PAGE_SIZE`)."""
        service = await self._need_remediation(context)
        rows = service.sdc_records()[: pages.page_size(request.limit, default=pages.MAX_PAGE_SIZE)]
        return admin_pb.ListSdcResponse(gpus=[wire.sdc_gpu_to_wire(r) for r in rows])

    async def ListStragglers(
        self, request: admin_pb.ListStragglersRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb.ListStragglersResponse:
        """GPUs named stragglers on this replica's streams, in the order named (at most `pages.MAX_PAGE_SIZE`)."""
        watch = self._ingest.stragglers
        found = watch.listing()[: pages.page_size(request.limit, default=pages.MAX_PAGE_SIZE)]
        stalled, stalled_at_ns = watch.stall, watch.stalled_at_unix_ns()
        return admin_pb.ListStragglersResponse(
            stall=wire.job_stall_to_wire(watch.node_of(stalled.suspect_gpu), stalled, stalled_at_ns)
            if stalled is not None
            else None,
            stragglers=[
                wire.straggler_to_wire(
                    s.node_id, s.verdict, s.named_unix_ns, action=s.action, action_reason=s.action_reason
                )
                for s in found
            ],
            steps_judged=watch.steps_judged,
        )

    async def ListRma(
        self, request: admin_pb.ListRmaRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb.ListRmaResponse:
        """RMA tickets."""
        service = await self._need_remediation(context)
        rows = await self._read(context, lambda: service.store.rmas(pending_only=request.pending_only))
        quarantined = await self._read(context, service.store.quarantines)
        items = repair_queue.build_items(
            [r for r in rows if r["state"] == "pending"],
            node_gpu_counts={r["node_id"]: len(self._ingest.node_gpus(r["node_id"])) or 8 for r in rows},
            quarantined_nodes={q["node_id"] for q in quarantined if not q["gpu_uuid"] and not q["port"]},
        )
        by_id = {r["rma_id"]: r for r in rows}
        ordered = [(by_id[i.ticket_id], i) for i in repair_queue.order(items)]
        ordered += [(r, None) for r in rows if r["state"] != "pending"]
        tickets = []
        for row, item in ordered:
            ticket = wire.rma_to_wire(row)
            if item is not None:
                ticket.gpus_per_technician_hour = item.gpus_per_hour
                ticket.gpus_returned = item.gpus_returned
            tickets.append(ticket)
        return admin_pb.ListRmaResponse(tickets=tickets)

    async def GetRma(
        self, request: admin_pb.GetRmaRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb.GetRmaResponse:
        """One RMA ticket with its evidence bundle."""
        service = await self._need_remediation(context)
        rows = await self._read(context, lambda: service.store.rmas())
        row = next((r for r in rows if r["rma_id"] == request.rma_id), None)
        if row is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"rma_id: {echoed(request.rma_id)} unknown")
        return admin_pb.GetRmaResponse(ticket=wire.rma_to_wire(row))

    async def ApproveRma(
        self, request: admin_pb.ApproveRmaRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb.ApproveRmaResponse:
        """Approve a pending RMA ticket."""
        service = await self._need_remediation(context)
        try:
            row = await service.approve_rma(request.rma_id, actor=authz.actor())
        except ValueError as exc:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
        if row is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"rma_id: {echoed(request.rma_id)} unknown")
        return admin_pb.ApproveRmaResponse(ticket=wire.rma_to_wire(row))

    async def ForgetGpuOwner(
        self, request: admin_pb.ForgetGpuOwnerRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb.ForgetGpuOwnerResponse:
        """A GPU was moved out of its node by hand: the next node whose Hello lists it owns it."""
        target = request.target
        if not target.node_id or not target.gpu_uuid:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "target: NODE/GPU, the node the GPU was taken out of")
        if not request.reason:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "reason: required (it goes to the audit log)")
        try:
            await self._ingest.forget_gpu_owner(target.node_id, target.gpu_uuid)
        except LookupError:  # its text repeats the request's fields whole: named here, echoed
            detail = f"target: GPU {echoed(target.gpu_uuid)} is not node {echoed(target.node_id)}'s"
            await context.abort(grpc.StatusCode.NOT_FOUND, detail)
        except ValueError as exc:  # the node is connected and lists the GPU: both known, bounded
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"target: {exc}")
        return admin_pb.ForgetGpuOwnerResponse()

    async def SetAutomationPaused(
        self, request: admin_pb.SetAutomationPausedRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb.AutomationStatus:
        """Pause automation, or resume it (which also resets a tripped circuit breaker)."""
        service = await self._need_remediation(context)
        budget = await service.set_paused(request.paused, reason=request.reason or "operator", actor=authz.actor())
        return automation_status_to_wire(budget)

    async def GetAutomationStatus(
        self, request: admin_pb.GetAutomationStatusRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb.AutomationStatus:
        """Whether automation is paused and why, from the stored budget (every replica reads the same)."""
        service = await self._need_remediation(context)
        stored = await self._ingest.store_calls.run_in_store(lambda: service.store.load_doc("budget"))
        budget = blast_radius.BudgetState.from_dict(stored) if stored is not None else blast_radius.BudgetState()
        return automation_status_to_wire(budget)

    async def ListAudit(
        self, request: admin_pb.ListAuditRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb.ListAuditResponse:
        """Audit records, newest first, a page at a time."""
        store = (await self._need_remediation(context)).store
        after = await self._after("audit", request.page_token, context)

        def read() -> admin_pb.ListAuditResponse:
            page = store.audit_page(since_unix_ns=request.since_unix_ns, after=after,
                                    limit=pages.page_size(request.limit), max_bytes=pages.PAGE_BYTES)  # fmt: skip
            return admin_pb.ListAuditResponse(
                records=[wire.audit_to_wire(r) for r in page.items],
                next_page_token=pages.token("audit", page.next_after),
            )

        return await self._read(context, read)

    async def ListNodes(
        self, request: admin_pb.ListNodesRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb.ListNodesResponse:
        """Nodes with their GPUs and latest power, sorted by id, a page at a time."""
        after = await self._after("nodes", request.page_token, context)
        size = pages.page_size(request.page_size, default=pages.MAX_PAGE_SIZE)
        selector = dict(request.label_selector)
        ingest = self._ingest

        def read() -> admin_pb.ListNodesResponse:
            nodes = ingest.store.list_nodes(after=str(after[1]) if after else "", limit=size + 1)
            listed: list[admin_pb.NodeStatus] = []
            used, last = 0, ""
            for node in nodes[:size]:
                if not selector or fleet.matches_selector(node.labels, selector):
                    message = wire.node_status_to_wire(ingest.overlaid(node))
                    if listed and used + message.ByteSize() > pages.PAGE_BYTES:
                        return admin_pb.ListNodesResponse(nodes=listed, next_page_token=pages.token("nodes", (0, last)))
                    listed.append(message)
                    used += message.ByteSize()
                last = node.node_id
            more = len(nodes) > size
            return admin_pb.ListNodesResponse(
                nodes=listed, next_page_token=pages.token("nodes", (0, last)) if more else ""
            )

        return await self._read(context, read)

    async def GetNode(
        self, request: admin_pb.GetNodeRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb.GetNodeResponse:
        """One node, its most recent events, repair tickets and quarantines."""
        if not request.node_id:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "node_id: required")
        nodes = await self._ingest.list_nodes(node_ids=[request.node_id])
        if not nodes:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"node_id: {echoed(request.node_id)} never connected")
        store, remediation = self._ingest.store, self._remediation

        def read() -> admin_pb.GetNodeResponse:
            events = store.events_page(node_id=request.node_id, limit=RECENT_EVENTS, max_bytes=pages.PAGE_BYTES // 2)
            response = admin_pb.GetNodeResponse(
                node=wire.node_status_to_wire(nodes[0]),
                recent_events=[wire.stored_event_to_wire(e) for e in events.items],
            )
            if remediation is not None:
                tickets = remediation.store.tickets_page(
                    node_id=request.node_id, limit=RECENT_TICKETS, max_bytes=pages.PAGE_BYTES // 4
                )
                response.repairs.extend(wire.repair_to_wire(t) for t in tickets.items)
                quarantines = remediation.store.quarantines(node_id=request.node_id)
                response.quarantines.extend(wire.quarantine_to_wire(q) for q in quarantines)
            return response

        return await self._read(context, read)

    async def ListEvents(
        self, request: admin_pb.ListEventsRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb.ListEventsResponse:
        """Stored health events, newest first, a page at a time."""
        if request.limit > MAX_LIST_LIMIT:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"limit: at most {MAX_LIST_LIMIT}")
        after = await self._after("events", request.page_token, context)
        store = self._ingest.store

        def read() -> admin_pb.ListEventsResponse:
            page = store.events_page(node_id=request.node_id, since_unix_ns=request.since_unix_ns, after=after,
                                     limit=pages.page_size(request.limit), max_bytes=pages.PAGE_BYTES)  # fmt: skip
            return admin_pb.ListEventsResponse(
                events=[wire.stored_event_to_wire(e) for e in page.items],
                next_page_token=pages.token("events", page.next_after),
            )

        return await self._read(context, read)
