"""What rasctl tells an operator when the controller did not answer (issue #37 item 18)."""

from __future__ import annotations

from rasd.cli import main as rasctl
from rasd.controller.rpc import store_outage


def _args(*flags: str):
    return rasctl.build_parser().parse_args(["--controller", "ctl:7443", *flags, "nodes"])


def test_a_store_outage_is_not_reported_as_a_controller_that_is_not_running():
    # The detail the controller sends when its store is down (tests/unit/controller/rpc/test_store_outage.py).
    hint = rasctl.unreachable_hint(store_outage.STORE_UNAVAILABLE_DETAIL, _args())
    assert hint.startswith("store unavailable: rasd-controller at ctl:7443 runs")
    assert "is rasd-controller running" not in hint


def test_a_closed_tls_connection_with_a_client_certificate_says_certificate_refused():
    args = _args("--tls-ca", "ca.crt", "--tls-cert", "me.crt", "--tls-key", "me.key")
    closed = "failed to connect to all addresses; last error: UNAVAILABLE: ipv4:127.0.0.1:7443: Socket closed"
    assert rasctl.unreachable_hint(closed, args).startswith("certificate refused: rasd-controller at ctl:7443")
    assert "me.crt" in rasctl.unreachable_hint(closed, args)


def test_a_refused_connection_still_asks_whether_the_controller_runs():
    refused = "failed to connect to all addresses; last error: UNAVAILABLE: ipv4:127.0.0.1:7443: Connection refused"
    assert rasctl.unreachable_hint(refused, _args()) == "is rasd-controller running at ctl:7443?"


def test_a_controller_certificate_this_client_does_not_trust_says_so():
    # What gRPC 1.7x reports for a controller whose certificate is of another CA than --tls-ca.
    failed = (
        "failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:7443: Tls handshake failed "
        "(TSI_PROTOCOL_FAILURE): SSL_ERROR_SSL: error:1000007d:SSL routines:OPENSSL_internal:"
        "CERTIFICATE_VERIFY_FAILED: unable to get local issuer certificate"
    )
    hint = rasctl.unreachable_hint(failed, _args("--tls-ca", "ca.crt", "--tls-cert", "me.crt", "--tls-key", "me.key"))
    assert hint.startswith("certificate not trusted: the TLS handshake with rasd-controller at ctl:7443 failed")
    assert "(unable to get local issuer certificate)" in hint and "signed by ca.crt" in hint


def test_a_controller_certificate_for_another_name_says_name_mismatch():
    failed = (
        "failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:7443: Custom verification "
        "check failed with error: UNAUTHENTICATED: Hostname Verification Check failed."
    )
    args = _args("--tls-ca", "ca.crt", "--tls-cert", "me.crt", "--tls-key", "me.key", "--tls-server-name", "x.example")
    hint = rasctl.unreachable_hint(failed, args)
    assert hint.startswith("certificate name mismatch: rasd-controller at ctl:7443") and "'x.example'" in hint
    assert "'ctl'" in rasctl.unreachable_hint(failed, _args())  # no --tls-server-name: the host dialled
