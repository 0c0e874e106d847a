"""The one gRPC server interceptor that authenticates every call and authorises it by method.

`METHOD_RULES` maps each full method name to the least role that may call it; a method missing
from the table is denied (PERMISSION_DENIED), so a new RPC stays closed until someone decides who
may call it. Handlers never check roles: they read the caller from `current_principal()` to record
it as the actor.

==================================================  ==========  ==========================
method (rasd.api.v1.AdminService/...)               least role  audited
==================================================  ==========  ==========================
ListNodes GetNode ListEvents ListIncidents          viewer      on denial
ListRepairs ListValidations GetPowerStatus
GetPowerPolicy ListRma GetRma ListAudit ListSdc
ListStragglers GetAutomationStatus WatchNodes
WatchEvents
WatchIncidents WatchRepairs
Quarantine Validate AccuseSdc SetAutomationPaused   operator    always (with outcome)
Release                                             operator;   always
                                                    admin with
                                                    force=true
SetPowerBudget SetPowerPolicy ApproveRma            admin       always
ForgetGpuOwner
AgentService/Connect                                a node      on denial (identity
                                                    cert        mismatches are audited by
                                                                the AgentService servicer)
grpc.health.v1.Health/*                             anyone      never (Kubernetes probes)
==================================================  ==========  ==========================

Status codes: UNAUTHENTICATED (no or unknown credentials on a TLS controller, a bad bearer
token), PERMISSION_DENIED (role too low, not a node certificate, unknown method). A denial is
written to the audit log with the caller (the certificate the connection presented when its bearer
token was refused; "unauthenticated" without one), its peer address and the method, within the
caller's allowance (`audit.AuditLog.record_denial`: a shorter reason, rationed per caller).
"""

from __future__ import annotations

import contextvars
import dataclasses
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
import structlog
from prometheus_client import CollectorRegistry, Counter

from rasd.common.text import echoed
from rasd.controller.observability import audit
from rasd.controller.rpc import authn

log = structlog.get_logger("rasd.controller")

Role = authn.Role
ADMIN = "/rasd.api.v1.AdminService/"
AGENT_CONNECT = "/rasd.api.v1.AgentService/Connect"
NODE = "node"
"""Rule for AgentService: the caller must hold a node certificate (anyone on a plaintext controller)."""
PUBLIC = "public"
"""Rule for the health service: no credentials needed."""

RoleRule = Role | str | Callable[[Any], Role]


@dataclasses.dataclass(frozen=True)
class Rule:
    """Who may call a method, and whether its calls change state (and so are always audited)."""

    who: RoleRule
    mutating: bool = False


def _release_role(request: Any) -> Role:
    return Role.ADMIN if getattr(request, "force", False) else Role.OPERATOR


METHOD_RULES: dict[str, Rule] = {
    **{
        ADMIN + name: Rule(Role.VIEWER)
        for name in (
            "ListNodes",
            "GetNode",
            "ListEvents",
            "ListIncidents",
            "ListRepairs",
            "ListValidations",
            "GetPowerStatus",
            "GetPowerPolicy",
            "ListRma",
            "GetRma",
            "ListAudit",
            "ListSdc",  # on main (SDC sweeps) and not yet on this branch: reads only
            "ListStragglers",
            "GetAutomationStatus",
            "WatchNodes",
            "WatchEvents",
            "WatchIncidents",
            "WatchRepairs",
        )
    },
    **{
        ADMIN + name: Rule(Role.OPERATOR, mutating=True)
        for name in ("Quarantine", "Validate", "AccuseSdc", "SetAutomationPaused")
    },
    ADMIN + "Release": Rule(_release_role, mutating=True),
    **{
        ADMIN + name: Rule(Role.ADMIN, mutating=True)
        for name in ("SetPowerBudget", "SetPowerPolicy", "ApproveRma", "ForgetGpuOwner")
    },
    AGENT_CONNECT: Rule(NODE),
    "/grpc.health.v1.Health/Check": Rule(PUBLIC),
    "/grpc.health.v1.Health/Watch": Rule(PUBLIC),
}

_principal: contextvars.ContextVar[authn.Principal | None] = contextvars.ContextVar("rasd_principal", default=None)


def current_principal() -> authn.Principal | None:
    """The authenticated caller of the RPC being served (None outside an intercepted call)."""
    return _principal.get()


def actor() -> str:
    """The audit name of the current caller."""
    principal = _principal.get()
    return principal.name if principal is not None else "unauthenticated"


def _short(method: str) -> str:
    return method.rsplit("/", 1)[-1]


def _target_of(request: Any) -> tuple[str, str, str]:
    """(node_id, gpu_uuid, reason) a request names, for the audit record."""
    node_id = gpu_uuid = ""
    target = getattr(request, "target", None)
    if target is not None and hasattr(target, "node_id"):
        node_id, gpu_uuid = target.node_id, target.gpu_uuid
    elif isinstance(getattr(request, "node_id", None), str):
        node_id = request.node_id
    reason = getattr(request, "reason", "")
    if not isinstance(reason, str) or not reason:
        reason = getattr(request, "rma_id", "") or ""
    return node_id, gpu_uuid, str(reason)


class SecurityMetrics:
    """Denials and authenticated agent streams."""

    def __init__(self, registry: CollectorRegistry) -> None:
        """Register on registry."""
        self.auth_denials = Counter(
            "rasd_auth_denials",
            "Calls refused by the auth interceptor, by method and status code.",
            ["method", "code"],
            registry=registry,
        )
        self.identity_rejections = Counter(
            "rasd_identity_rejections",
            "Agent messages that spoke for another node than the stream's certificate (PERMISSION_DENIED), "
            "by payload kind.",
            ["kind"],
            registry=registry,
        )
        self.agent_streams_opened = Counter(
            "rasd_agent_streams_opened",
            "Agent streams that got a Welcome, by transport authentication (mtls or none).",
            ["auth"],
            registry=registry,
        )
        self.throttled_seconds = Counter(
            "rasd_agent_throttled_seconds",
            "Time agent streams were held back by the per-stream rate limit.",
            registry=registry,
        )
        self.streams_total = 0
        self.streams_mtls = 0

    def stream_opened(self, *, mutual_tls: bool) -> None:
        """Count a stream that got its Welcome."""
        self.streams_total += 1
        self.streams_mtls += 1 if mutual_tls else 0
        self.agent_streams_opened.labels(auth="mtls" if mutual_tls else "none").inc()

    @property
    def all_streams_mutual_tls(self) -> bool:
        """True when at least one stream opened and every one was mutually authenticated."""
        return self.streams_total > 0 and self.streams_mtls == self.streams_total


class AuthInterceptor(grpc.aio.ServerInterceptor):
    """Authenticates each call, enforces `METHOD_RULES`, and audits denials and state changes."""

    def __init__(
        self,
        settings: authn.SecuritySettings,
        tokens: authn.TokenStore,
        audit_log: audit.AuditLog,
        metrics: SecurityMetrics,
    ) -> None:
        """Bind the settings, token store, audit log and metrics."""
        self._settings = settings
        self._tokens = tokens
        self._audit = audit_log
        self._metrics = metrics

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        """Wrap the method's handler with the check (which needs the call's auth context)."""
        handler = await continuation(handler_call_details)
        if handler is None:
            return None  # type: ignore[return-value]  # no such method: gRPC answers UNIMPLEMENTED
        method = handler_call_details.method
        rule = METHOD_RULES.get(method)
        if rule is not None and rule.who == PUBLIC:
            return handler
        metadata = tuple(handler_call_details.invocation_metadata or ())
        if handler.unary_unary is not None:
            behavior = handler.unary_unary

            async def unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
                principal = await self._authorize(method, rule, request, metadata, context)
                token = _principal.set(principal)
                try:
                    if rule is None or not rule.mutating:
                        return await behavior(request, context)
                    return await self._audited(method, principal, request, context, behavior)
                finally:
                    _principal.reset(token)

            return grpc.unary_unary_rpc_method_handler(
                unary,
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        if handler.unary_stream is not None or handler.stream_stream is not None:
            return self._streaming(handler, method, rule, metadata)
        # No rasd method streams from the client alone; refuse rather than serve a kind this check does not wrap.
        return _denying_handler(handler, method, self)

    def _streaming(
        self, handler: grpc.RpcMethodHandler, method: str, rule: Rule | None, metadata: tuple[Any, ...]
    ) -> grpc.RpcMethodHandler:
        """A streaming handler behind the check, either kind rasd serves.

        Server-streaming (the AdminService watches, which only read) is authorised by its request;
        bidirectional (the agent's stream) by the caller alone, as its requests come later.
        """
        client_streams = handler.stream_stream is not None
        behavior = handler.stream_stream if client_streams else handler.unary_stream
        wrap = grpc.stream_stream_rpc_method_handler if client_streams else grpc.unary_stream_rpc_method_handler

        async def serve(request_or_iterator: Any, context: grpc.aio.ServicerContext) -> Any:
            request = None if client_streams else request_or_iterator
            principal = await self._authorize(method, rule, request, metadata, context)
            token = _principal.set(principal)
            try:
                return await behavior(request_or_iterator, context)
            finally:
                _principal.reset(token)

        return wrap(
            serve,
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )

    async def deny(
        self,
        method: str,
        context: grpc.aio.ServicerContext,
        code: grpc.StatusCode,
        detail: str,
        *,
        actor: str,
        request: Any = None,
    ) -> None:
        """Count, audit (within the caller's allowance, `audit.AuditLog.record_denial`) and abort one refused call."""
        node_id, gpu_uuid, reason = _target_of(request) if request is not None else ("", "", "")
        self._metrics.auth_denials.labels(method=_short(method), code=code.name).inc()
        peer = _peer_of(context)
        recorded = await self._audit.record_denial(
            actor=actor,
            peer=peer,
            action=_short(method),
            node_id=node_id,
            gpu_uuid=gpu_uuid,
            reason=reason or detail,
            outcome=f"denied:{code.name}",
            details={"method": method, "detail": detail[: audit.DENIED_REASON_CHARS]},
        )
        if recorded:  # a caller refused over its allowance floods neither the audit log nor this one
            log.warning("rpc_denied", method=method, actor=actor, peer=peer, code=code.name, detail=detail[:200])
        await context.abort(code, detail)

    async def _authorize(
        self,
        method: str,
        rule: Rule | None,
        request: Any,
        metadata: tuple[Any, ...],
        context: grpc.aio.ServicerContext,
    ) -> authn.Principal:
        try:
            principal = authn.resolve(
                context.auth_context(), metadata, token_store=self._tokens, settings=self._settings
            )
        except authn.AuthError as exc:
            # A bad token on a connection with a verified certificate: the certificate says who sent it.
            presented = authn.certificate_principal(context.auth_context())
            actor = presented.name if presented is not None else "unauthenticated"
            await self.deny(method, context, grpc.StatusCode.UNAUTHENTICATED, str(exc), actor=actor, request=request)
            raise  # unreachable: abort raises
        if rule is None:
            await self.deny(
                method,
                context,
                grpc.StatusCode.PERMISSION_DENIED,
                f"{echoed(method, 120)} is not in the authorization table; denied by default",
                actor=principal.name,
                request=request,
            )
        assert rule is not None
        if rule.who == NODE:
            if principal.kind not in ("node", "anonymous"):
                await self.deny(
                    method,
                    context,
                    grpc.StatusCode.PERMISSION_DENIED,
                    f"{principal.name} is not a node certificate (OU={authn.NODE_UNIT})",
                    actor=principal.name,
                )
            return principal
        needed = rule.who(request) if callable(rule.who) else rule.who
        assert isinstance(needed, Role)
        if principal.role is None or principal.role < needed:
            have = principal.role.label if principal.role is not None else "no role"
            await self.deny(
                method,
                context,
                grpc.StatusCode.PERMISSION_DENIED,
                f"{_short(method)} needs role {needed.label}; {principal.name} has {have}",
                actor=principal.name,
                request=request,
            )
        return principal

    async def _audited(
        self,
        method: str,
        principal: authn.Principal,
        request: Any,
        context: grpc.aio.ServicerContext,
        behavior: Callable[[Any, grpc.aio.ServicerContext], Awaitable[Any]],
    ) -> Any:
        node_id, gpu_uuid, reason = _target_of(request)
        outcome = "OK"
        try:
            return await behavior(request, context)
        except BaseException as exc:
            code = _code_of(context)
            outcome = code.name if code is not None else type(exc).__name__
            raise
        finally:
            await self._audit.record(
                actor=principal.name,
                action=_short(method),
                node_id=node_id,
                gpu_uuid=gpu_uuid,
                reason=reason,
                outcome=outcome,
                details={"method": method, "role": principal.role.label if principal.role else ""},
            )


def _peer_of(context: grpc.aio.ServicerContext) -> str:
    """The caller's address as gRPC names it (``ipv4:10.0.0.5:41234``), or "" when the context has none."""
    try:
        return str(context.peer() or "")
    except (AttributeError, NotImplementedError):
        return ""


def _code_of(context: grpc.aio.ServicerContext) -> grpc.StatusCode | None:
    try:
        return context.code()  # type: ignore[return-value]
    except (AttributeError, NotImplementedError):
        return None


def _denying_handler(handler: grpc.RpcMethodHandler, method: str, interceptor: AuthInterceptor) -> Any:
    async def refuse(request: Any, context: grpc.aio.ServicerContext) -> Any:
        await interceptor.deny(
            method,
            context,
            grpc.StatusCode.PERMISSION_DENIED,
            f"{echoed(method, 120)}: this streaming kind is not served",
            actor="unchecked",
        )

    if handler.unary_stream is not None:
        return grpc.unary_stream_rpc_method_handler(
            refuse, request_deserializer=handler.request_deserializer, response_serializer=handler.response_serializer
        )
    return grpc.stream_unary_rpc_method_handler(
        refuse, request_deserializer=handler.request_deserializer, response_serializer=handler.response_serializer
    )
