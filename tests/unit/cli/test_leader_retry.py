"""rasctl's one retry at the leader a follower names, and the address a replica advertises."""

from __future__ import annotations

import argparse

import grpc

from rasd.cli import main as rasctl
from rasd.controller import server
from rasd.controller.rpc import leader_gate


class _Refusal(grpc.RpcError):
    """A refused call as the sync gRPC client raises it (a third-party edge: no controller here)."""

    def __init__(self, code: grpc.StatusCode, trailers: tuple[tuple[str, str], ...]) -> None:
        self._code, self._trailers = code, trailers

    def code(self) -> grpc.StatusCode:
        return self._code

    def trailing_metadata(self) -> tuple[tuple[str, str], ...]:
        return self._trailers


def _args(controller: str, tls_server_name: str = "") -> argparse.Namespace:
    return rasctl.build_parser().parse_args(
        ["--controller", controller, "--tls-server-name", tls_server_name, "quarantine", "n1", "--reason", "x"]
    )


def test_rasctl_reads_the_key_the_gate_writes():
    assert rasctl.LEADER_ADDRESS_KEY == leader_gate.LEADER_ADDRESS_KEY


def test_the_retry_goes_to_the_leader_checking_the_name_first_dialled():
    refusal = _Refusal(grpc.StatusCode.FAILED_PRECONDITION, ((leader_gate.LEADER_ADDRESS_KEY, "10.0.3.7:7443"),))
    at_leader = rasctl._at_the_leader(_args("rasd.rasd.svc:7443"), refusal)
    assert (at_leader.controller, at_leader.tls_server_name) == ("10.0.3.7:7443", "rasd.rasd.svc")
    through_forward = rasctl._at_the_leader(_args("127.0.0.1:7443", "rasd.rasd.svc"), refusal)
    assert through_forward.tls_server_name == "rasd.rasd.svc"
    assert rasctl._at_the_leader(_args("127.0.0.1:7443"), refusal).tls_server_name == ""


def test_no_retry_without_a_leader_address_or_for_other_errors():
    named = ((leader_gate.LEADER_ADDRESS_KEY, "10.0.3.7:7443"),)
    assert rasctl._at_the_leader(_args("rasd:7443"), _Refusal(grpc.StatusCode.FAILED_PRECONDITION, ())) is None
    assert rasctl._at_the_leader(_args("rasd:7443"), _Refusal(grpc.StatusCode.PERMISSION_DENIED, named)) is None
    assert rasctl._at_the_leader(_args("10.0.3.7:7443"), _Refusal(grpc.StatusCode.FAILED_PRECONDITION, named)) is None


def test_a_replica_advertises_its_pod_ip_for_a_wildcard_listen():
    assert server.advertised_address("0.0.0.0:7443", 7443, {"POD_IP": "10.0.3.7"}) == "10.0.3.7:7443"
    assert server.advertised_address("[::]:7443", 7443, {"POD_IP": "fd00::7"}) == "[fd00::7]:7443"
    assert server.advertised_address("127.0.0.1:0", 40123, {}) == "127.0.0.1:40123"
    assert server.advertised_address("0.0.0.0:7443", 7443, {}) == ""
    explicit = {"RASD_ADVERTISE_ADDRESS": "rasd-0.rasd:7443", "POD_IP": "10.0.3.7"}
    assert server.advertised_address("0.0.0.0:7443", 7443, explicit) == "rasd-0.rasd:7443"
