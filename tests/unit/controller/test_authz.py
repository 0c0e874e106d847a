"""The auth interceptor's table, principals from certificates and tokens, and deny-by-default."""

from __future__ import annotations

import asyncio

import grpc
import pytest
import structlog

from rasd.api.v1 import admin_service_pb2 as admin_pb
from rasd.api.v1 import agent_service_pb2 as agent_pb
from rasd.common import devcerts, tokens
from rasd.controller import server
from rasd.controller.rpc import authn, authz

Role = authn.Role


def test_every_rpc_of_the_api_has_a_rule():
    """A new RPC must be added to METHOD_RULES (until then it is denied): this names the missing ones."""
    methods = {
        f"/{service.full_name}/{method.name}"
        for module in (admin_pb, agent_pb)
        for service in module.DESCRIPTOR.services_by_name.values()
        for method in service.methods
    }
    assert methods - set(authz.METHOD_RULES) == set()


@pytest.mark.parametrize(
    ("method", "request_", "role"),
    [
        ("ListNodes", admin_pb.ListNodesRequest(), Role.VIEWER),
        ("ListAudit", admin_pb.ListAuditRequest(), Role.VIEWER),
        ("GetPowerStatus", admin_pb.GetPowerStatusRequest(), Role.VIEWER),
        ("Quarantine", admin_pb.QuarantineRequest(), Role.OPERATOR),
        ("Validate", admin_pb.ValidateRequest(), Role.OPERATOR),
        ("AccuseSdc", admin_pb.AccuseSdcRequest(), Role.OPERATOR),
        ("SetAutomationPaused", admin_pb.SetAutomationPausedRequest(), Role.OPERATOR),
        ("Release", admin_pb.ReleaseRequest(), Role.OPERATOR),
        ("Release", admin_pb.ReleaseRequest(force=True), Role.ADMIN),
        ("SetPowerBudget", admin_pb.SetPowerBudgetRequest(), Role.ADMIN),
        ("SetPowerPolicy", admin_pb.SetPowerPolicyRequest(), Role.ADMIN),
        ("ApproveRma", admin_pb.ApproveRmaRequest(), Role.ADMIN),
        ("ForgetGpuOwner", admin_pb.ForgetGpuOwnerRequest(), Role.ADMIN),
    ],
)
def test_least_role_per_method(method, request_, role):
    rule = authz.METHOD_RULES[authz.ADMIN + method]
    assert (rule.who(request_) if callable(rule.who) else rule.who) == role
    assert rule.mutating == (role > Role.VIEWER)


def _auth(pem: bytes) -> dict[str, list[bytes]]:
    return {"transport_security_type": [b"ssl"], "x509_pem_cert": [pem]}


def test_principals_from_certificates_tokens_and_plaintext(tmp_path):
    pki = devcerts.init(tmp_path, ["gpu-7"])
    token = tokens.new_token()
    (tmp_path / "tokens").write_text(f"alice admin {tokens.hash_token(token)}\n")
    store = authn.TokenStore(tmp_path / "tokens")
    tls_on = authn.SecuritySettings(tls=object())  # type: ignore[arg-type]
    plain = authn.SecuritySettings()

    def resolve(auth, metadata=(), settings=tls_on):
        return authn.resolve(auth, metadata, token_store=store, settings=settings)

    node = resolve(_auth(pki.nodes["gpu-7"].cert.read_bytes()))
    assert (node.kind, node.name, node.node_id, node.role) == ("node", "node:gpu-7", "gpu-7", None)
    viewer = resolve(_auth(pki.operators["viewer"].cert.read_bytes()))
    assert (viewer.name, viewer.role) == ("cert:dev-viewer", Role.VIEWER)
    # A token decides over the certificate; a wrong one is refused outright.
    with_token = resolve(_auth(pki.operators["viewer"].cert.read_bytes()), [("authorization", f"Bearer {token}")])
    assert (with_token.name, with_token.role) == ("token:alice", Role.ADMIN)
    with pytest.raises(authn.AuthError, match="not recognised"):
        resolve({}, [("authorization", "Bearer rasd_guess")])
    with pytest.raises(authn.AuthError, match="Bearer"):
        resolve({}, [("authorization", "Basic YTpi")])
    with pytest.raises(authn.AuthError, match="no client certificate"):
        resolve({})
    anonymous = resolve({}, settings=plain)
    assert (anonymous.name, anonymous.role) == ("anonymous", Role.ADMIN)
    with pytest.raises(authn.AuthError):
        resolve({}, settings=authn.SecuritySettings(insecure_role=None))


@pytest.mark.parametrize(
    ("text", "complaint"),
    [
        ("alice admin\n", "tokens:1: expected NAME ROLE sha256:HEX"),
        ("alice root sha256:" + "0" * 64 + "\n", "not one of viewer, operator, admin"),
        ("# ok\nbob viewer md5:abc\n", "tokens:2: hash must be sha256"),
    ],
)
def test_bad_token_lines_are_named(text, complaint):
    with pytest.raises(ValueError, match=complaint):
        authn.TokenStore.parse(text)


def test_a_method_missing_from_the_table_is_denied_and_audited(tmp_path, free_port):
    """A servicer registered without a rule (a new RPC) answers PERMISSION_DENIED, never its handler."""
    calls = []

    async def handler(request, context):
        calls.append(request)
        return b"served"

    extra = grpc.method_handlers_generic_handler(
        "rasd.test.Extra",
        {"Do": grpc.unary_unary_rpc_method_handler(handler, lambda b: b, lambda b: b)},
    )

    async def scenario():
        controller = server.Controller(
            server.ControllerSettings(
                listen=f"127.0.0.1:{free_port}", db_url=f"sqlite:///{tmp_path / 'rasd.db'}", metrics_port=None
            )
        )
        await controller.ingest.start()
        interceptor = authz.AuthInterceptor(
            controller.settings.security, controller.tokens, controller.audit, controller.security
        )
        grpc_server = grpc.aio.server(interceptors=[interceptor])
        grpc_server.add_generic_rpc_handlers((extra,))
        port = grpc_server.add_insecure_port("127.0.0.1:0")
        await grpc_server.start()
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            with pytest.raises(grpc.aio.AioRpcError) as raised:
                await channel.unary_unary("/rasd.test.Extra/Do")(b"x", timeout=5)
        await grpc_server.stop(None)
        rows = await controller.ingest.store_calls.run_in_store(
            lambda: controller.remediation.store.audit(limit=10) if controller.remediation else []
        )
        await controller.ingest.stop()
        controller.store.close()
        return raised.value, rows

    error, rows = asyncio.run(scenario())
    assert error.code() == grpc.StatusCode.PERMISSION_DENIED and "denied by default" in error.details()
    assert calls == []
    assert [(r["actor"], r["action"], r["outcome"]) for r in rows] == [("anonymous", "Do", "denied:PERMISSION_DENIED")]


@pytest.mark.parametrize("how", ["deleted", "unreadable"])
def test_a_deleted_or_unreadable_tokens_file_leaves_no_token_valid_and_says_so(tmp_path, how):
    """Issue #37 item 13: the tokens a file no longer grants are refused at once, with an error logged."""
    path = tmp_path / "tokens"
    token = tokens.new_token()
    path.write_text(f"alice admin {tokens.hash_token(token)}\n")
    store = authn.TokenStore(path)
    assert store.lookup(token).name == "alice"
    path.unlink()
    if how == "unreadable":
        path.mkdir()  # a directory where the file was: read_text fails, as for a file nobody may read
    with structlog.testing.capture_logs() as logs:
        assert store.lookup(token) is None
        assert store.lookup(token) is None
    assert [entry["event"] for entry in logs] == ["tokens_file_unreadable"]  # once, not per call
    assert logs[0]["log_level"] == "error" and str(path) in logs[0]["path"]
    if how == "unreadable":
        path.rmdir()
    path.write_text(f"alice admin {tokens.hash_token(token)}\n")
    assert store.lookup(token).name == "alice"  # back once the file is
