"""`escalation.tick_due_at`: before it a tick changes nothing; at (or just after) it, the tick acts.

One state per thing a tick reacts to. The property test (test_escalation_properties, invariant 7)
checks the "changes nothing before" half on random ladders; these pin each bound, including those
random sequences rarely reach (week-long windows, SDC watches, a waiting ticket whose node is free).
"""

from __future__ import annotations

import math

import pytest

from rasd.controller.core.remediation import escalation, policy

POLICY = policy.EscalationPolicy()
T0 = 1_800_000_000.0
WEEK_S = POLICY.attempt_budget_window_s
Rung = escalation.Rung
TicketState = escalation.TicketState


def _ticket(state: TicketState, **fields) -> escalation.Ticket:
    return escalation.Ticket(
        ticket_id="n1/GPU-1/xid:13/1@1",
        node_id="n1",
        gpu_uuid=fields.pop("gpu_uuid", "GPU-1"),
        fault_key="xid:13",
        purpose=escalation.Purpose.REPAIR,
        state=state,
        opened_at=T0,
        updated_at=T0,
        **fields,
    )


def _changes(state: escalation.RemediationState, at: float) -> bool:
    decision = escalation.tick(state, now_s=at, policy=POLICY)
    return decision.state != state or bool(decision.actions)


def _pending(kind: str, dispatched_at: float | None) -> escalation.Pending:
    return escalation.Pending(command_id="c1", kind=kind, issued_at=T0, dispatched_at=dispatched_at)


CASES = {
    "a dispatched reset times out": (
        escalation.RemediationState(
            "n1", tickets=(_ticket(TicketState.ACTING, rung=Rung.RESET_GPU, pending=_pending("reset_gpu", T0)),)
        ),
        T0 + POLICY.timeout_s("reset_gpu"),
    ),
    "a watch window ends": (
        escalation.RemediationState(
            "n1", tickets=(_ticket(TicketState.WATCHING, rung=Rung.RESTART_PROCESS, watch_until=T0 + 3600),)
        ),
        T0 + 3600,
    ),
    "an orphaned reboot expires": (
        escalation.RemediationState("n1", node_command_id="reboot-1", node_command_at=T0),
        T0 + POLICY.reboot_node_timeout_s,
    ),
    "an attempt leaves the budget window": (
        escalation.RemediationState("n1", attempts=(escalation.Attempt("GPU-1", Rung.RESET_GPU, T0),)),
        T0 + WEEK_S,
    ),
    "a closed ticket leaves the budget window": (
        escalation.RemediationState("n1", closed_tickets=(("n1/GPU-1/xid:13/1@1", T0),)),
        T0 + WEEK_S,
    ),
    "an SDC watch ends": (
        escalation.RemediationState("n1", sdc_watch=(("GPU-1", T0 + POLICY.sdc_watch_s),)),
        T0 + POLICY.sdc_watch_s,
    ),
}


@pytest.mark.parametrize("case", CASES)
def test_a_tick_changes_nothing_before_the_due_time_and_acts_after_it(case):
    state, due = CASES[case]
    assert escalation.tick_due_at(state, policy=POLICY) == due
    assert not _changes(state, due - 1.0), "nothing is due a second before"
    assert _changes(state, due + 1.0), "the tick acts once the time has come"


def test_a_command_held_by_the_budget_is_never_due():
    held = escalation.RemediationState(
        "n1", tickets=(_ticket(TicketState.ACTING, rung=Rung.RESET_GPU, pending=_pending("reset_gpu", None)),)
    )
    assert escalation.tick_due_at(held, policy=POLICY) == math.inf
    assert not _changes(held, T0 + 30 * 86400)


def test_a_waiting_ticket_is_due_at_once_when_its_node_is_free_and_not_before():
    waiting = _ticket(TicketState.WAITING, rung=Rung.RESTART_PROCESS, waiting_rung=Rung.RESET_GPU)
    free = escalation.RemediationState("n1", tickets=(waiting,))
    assert escalation.tick_due_at(free, policy=POLICY) == -math.inf
    assert _changes(free, T0), "the reset starts at the next tick"
    busy = escalation.RemediationState("n1", tickets=(waiting,), node_command_id="reboot-1", node_command_at=T0)
    assert escalation.tick_due_at(busy, policy=POLICY) == T0 + POLICY.reboot_node_timeout_s
    assert not _changes(busy, T0 + 60.0), "it waits for the node's reboot"


def test_an_rma_pending_gpu_whose_node_is_free_is_due_at_once():
    rma = _ticket(TicketState.RMA_PENDING, rung=Rung.RMA, held=("node", "gpu:GPU-1"))
    state = escalation.RemediationState("n1", tickets=(rma,))
    assert escalation.tick_due_at(state, policy=POLICY) == -math.inf
    assert _changes(state, T0), "the rest of the node is validated"


def test_a_node_with_nothing_timed_is_never_due():
    state = escalation.RemediationState(
        "n1", tickets=(_ticket(TicketState.AWAITING_OPERATOR, rung=Rung.RMA, held=("gpu:GPU-1",)),)
    )
    assert escalation.tick_due_at(state, policy=POLICY) == math.inf
    assert not _changes(state, T0 + 30 * 86400)
