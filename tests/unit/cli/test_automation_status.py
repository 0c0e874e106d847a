"""`rasctl automation status`: the stored budget as the controller answers it, and the line rasctl prints."""

from __future__ import annotations

from rasd.cli import commands
from rasd.controller.core.remediation import blast_radius
from rasd.controller.rpc import admin_service, authz, leader_gate

TRIPPED_AT_S = 1_780_000_000.0  # 2026-05-28T20:26:40Z


def test_a_tripped_breaker_says_since_when_and_why():
    budget = blast_radius.BudgetState(breaker_tripped_at=TRIPPED_AT_S, breaker_reason="12% of nodes in 600 s")
    status = admin_service.automation_status_to_wire(budget)
    assert (status.paused, status.breaker_tripped) == (True, True)
    assert status.since_unix_ns == int(TRIPPED_AT_S * 1e9)
    assert commands.automation_line(status) == (
        "automation paused by the circuit breaker since 2026-05-28T20:26:40Z: 12% of nodes in 600 s"
    )


def test_an_operators_pause_and_running():
    paused = admin_service.automation_status_to_wire(blast_radius.BudgetState(paused=True, pause_reason="upgrade"))
    assert commands.automation_line(paused) == "automation paused by an operator: upgrade"
    running = admin_service.automation_status_to_wire(blast_radius.BudgetState())
    assert commands.automation_line(running) == "automation running"
    assert running.since_unix_ns == 0


def test_status_is_a_read_every_replica_serves_and_viewers_may_call():
    method = "/rasd.api.v1.AdminService/GetAutomationStatus"
    assert not leader_gate.needs_leader(method)
    assert authz.METHOD_RULES[method] == authz.Rule(authz.Role.VIEWER)
