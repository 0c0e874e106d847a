"""A refused caller's audit records are rationed per caller and overall (issue #37 item 16)."""

from __future__ import annotations

import pytest

from rasd.controller.observability import audit
from rasd.controller.wire import agent as wire


def test_a_caller_gets_its_burst_then_its_rate_and_learns_what_was_left_out():
    allowance = audit.DenialAllowance(per_caller_burst=3, per_caller_per_s=1.0, overall_burst=100, overall_per_s=100)
    assert [allowance.admit("node:a", 0.0) for _ in range(5)] == [(True, 0)] * 3 + [(False, 0)] * 2
    assert allowance.admit("node:b", 0.0) == (True, 0)  # another caller has its own
    assert allowance.admit("node:a", 0.5) == (False, 0)
    assert allowance.admit("node:a", 1.5) == (True, 3)  # one token back; three refusals were not written


def test_all_callers_together_are_rationed_too():
    allowance = audit.DenialAllowance(per_caller_burst=5, per_caller_per_s=1, overall_burst=4, overall_per_s=1)
    admitted = [allowance.admit(f"ipv4:10.0.0.{n}", 0.0)[0] for n in range(10)]
    assert admitted == [True] * 4 + [False] * 6


def test_forgotten_callers_keep_the_table_bounded():
    allowance = audit.DenialAllowance(max_callers=8)
    for n in range(1000):
        allowance.admit(f"ipv4:10.0.{n // 256}.{n % 256}", 0.0)
    assert len(allowance._callers) == 8


@pytest.mark.parametrize(
    ("peer", "host"),
    [
        ("ipv4:10.0.0.5:41234", "ipv4:10.0.0.5"),
        ("ipv6:[::1]:5555", "ipv6:[::1]"),
        ("unix:/run/rasd.sock", "unix:/run/rasd.sock"),
        ("", ""),
    ],
)
def test_one_caller_whatever_its_port(peer, host):
    assert audit.peer_host(peer) == host


def test_an_audit_record_shows_its_peer_and_what_was_left_out():
    row = {"at_unix_ns": 5, "actor": "node:a", "action": "Quarantine", "node_id": "", "gpu_uuid": "", "reason": "r",
           "outcome": "denied", "details": {"peer": "ipv4:10.0.0.5:1", "dropped_before": 7}}  # fmt: skip
    record = wire.audit_to_wire(row)
    assert (record.peer, record.dropped_before) == ("ipv4:10.0.0.5:1", 7)
    assert wire.audit_to_wire({**row, "details": None}).peer == ""
