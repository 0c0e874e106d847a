"""Property tests: random event/result/time sequences against the ladder's invariants.

Invariants, for every sequence:
1. attempts per (target, rung) within the budget window never exceed the rung's budget (no loops);
2. no GPU-disruptive action (restart, reset) while the node has a reboot/power-cycle in flight;
3. a Release only comes from a passing (or drift / dry-run) validation, or a forced operator release;
4. command ids never repeat; every decision has a one-line reason; a decision only closes
   commands that were awaited;
5. ticket invariants: ACTING has a pending command, WAITING has a rung to start, and the rung never
   goes down;
6. the state survives a JSON round trip unchanged;
7. before `tick_due_at`, a tick changes nothing (the service ticks only the nodes due).
"""

from __future__ import annotations

import collections
import json
import math

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rasd.common import xid_catalog
from rasd.controller.core.remediation import correlate, escalation, policy
from rasd.controller.core.remediation import events as health

CATALOG = xid_catalog.load_catalog()
T0 = 1_780_000_000.0
GPUS = ("GPU-0", "GPU-1", "GPU-2")
EventKind = health.EventKind
Outcome = escalation.Outcome
MAX_EXAMPLES = 300

FAULTS = [
    {"kind": EventKind.XID, "xid": 13},
    {"kind": EventKind.XID, "xid": 48},
    {"kind": EventKind.XID, "xid": 45},
    {"kind": EventKind.XID, "xid": 79},
    {"kind": EventKind.XID, "xid": 95},
    {"kind": EventKind.XID, "xid": 61},
    {"kind": EventKind.XID, "xid": 154, "message": "changed from 0x0 (None) to 0x2 (Node Reboot Required)"},
    {"kind": EventKind.RECOVERY_ACTION, "recovery_action": 1},
    {"kind": EventKind.ROW_REMAP_FAILURE},
    {"kind": EventKind.ROW_REMAP_PENDING},
    {"kind": EventKind.ECC_DBE},
    {"kind": EventKind.SDC_SUSPECT},
    {"kind": EventKind.PCIE_REPLAY, "pcie_replay_rate_per_s": 100.0},
    # A node-level isolation (an NVSwitch fatal): the node held for an operator, whatever GPU is drawn.
    {"kind": EventKind.SXID, "xid": 12028, "severity": health.Severity.FATAL, "gpu_uuid": ""},
]

event_op = st.tuples(st.just("event"), st.sampled_from(range(len(FAULTS))), st.sampled_from(GPUS))
result_op = st.tuples(
    st.just("result"),
    st.integers(min_value=0, max_value=5),
    st.sampled_from([Outcome.SUCCEEDED, Outcome.FAILED, Outcome.TIMED_OUT, Outcome.REFUSED, Outcome.DRY_RUN]),
    st.sampled_from(["pass", "fail", "suspect", "software_drift", ""]),
)
time_op = st.tuples(st.just("advance"), st.sampled_from([1.0, 60.0, 400.0, 1800.0, 4000.0, 7 * 3600.0]))
tick_op = st.tuples(st.just("tick"))
release_op = st.tuples(st.just("release"), st.integers(min_value=0, max_value=5), st.booleans())
ops = st.lists(st.one_of(event_op, result_op, result_op, time_op, tick_op, release_op), min_size=1, max_size=40)

POLICIES = {
    "default": policy.RemediationPolicy(),
    "bmc": policy.RemediationPolicy.from_mapping(
        {"escalation": {"bmc_power_cycle_enabled": True, "max_attempts_reset_gpu": 1, "validate_after_restart": True}}
    ),
    # Drains before every repair (issue #38): the drain's answer decides whether the repair goes.
    "drain": policy.RemediationPolicy.from_mapping(
        {
            "escalation": {
                "bmc_power_cycle_enabled": True,
                "drain_before": ["reset_gpu", "reboot_node", "power_cycle_bmc"],
                "drain_deadline_s": 300.0,
                "drain_on_timeout": "escalate",
            }
        }
    ),
    "drain-operator": policy.RemediationPolicy.from_mapping(
        {"escalation": {"drain_before": ["reset_gpu", "reboot_node"], "drain_deadline_s": 300.0}}
    ),
}


PROBE_OFFSETS_S = (0.0, 1.0, 59.0, 60.0, 399.0, 600.0, 1799.0, 1800.0, 3600.0, 4000.0, 6 * 3600.0, 7 * 3600.0, 86400.0)


def _nothing_due_before(state: escalation.RemediationState, now: float, esc: policy.EscalationPolicy) -> None:
    """Invariant 7: a tick at any probed time before the state's due time returns it unchanged, with no action."""
    due = escalation.tick_due_at(state, policy=esc)
    probes = [now + offset for offset in PROBE_OFFSETS_S]
    if now <= due - 0.001 < math.inf:
        probes.append(due - 0.001)
    for at in probes:
        if at < due:
            decision = escalation.tick(state, now_s=at, policy=esc)
            assert decision.state == state and not decision.actions, (at - now, due - now, decision.reason)


def _run(sequence, pol: policy.RemediationPolicy) -> None:
    now = T0
    corr = correlate.CorrelationState()
    state = escalation.RemediationState("n1")
    seen_ids: set[str] = set()
    attempts: list[tuple[str, str, float]] = []
    esc = pol.escalation
    rung_of = {
        "restart_process": escalation.Rung.RESTART_PROCESS,
        "reset_gpu": escalation.Rung.RESET_GPU,
        "reboot_node": escalation.Rung.REBOOT_NODE,
        "power_cycle_bmc": escalation.Rung.POWER_CYCLE_BMC,
    }
    last_rung: dict[str, int] = {}

    def take(decision: escalation.Decision, *, releases_allowed: bool) -> escalation.RemediationState:
        nonlocal state
        before = state
        assert decision.reason and "\n" not in decision.reason
        busy_before = before.node_command_id
        awaited = {t.pending.command_id for t in before.tickets if t.pending is not None} | {busy_before}
        assert set(decision.closed_command_ids) <= awaited
        for action in decision.actions:
            assert action.command_id not in seen_ids, action
            seen_ids.add(action.command_id)
            if action.kind in rung_of:
                target = "node" if action.kind in ("reboot_node", "power_cycle_bmc") else action.gpu_uuid
                attempts.append((target, action.kind, now))
            if action.gpu_disruptive and busy_before:
                # allowed only when this very decision finished the in-flight node command
                assert decision.state.node_command_id != busy_before, (action, decision.reason)
            if action.kind == "release" and not action.forced:
                assert releases_allowed, decision.reason
                # Never lifted while another ticket still holds it (one quarantine stands for all).
                hold = (
                    f"gpu:{action.gpu_uuid}"
                    if action.gpu_uuid
                    else f"port:{action.ib_port}"
                    if action.ib_port
                    else "node"
                )
                holders = [t.ticket_id for t in decision.state.tickets if hold in t.held]
                assert holders == [], (action, holders, decision.reason)
        state = decision.state
        for action in decision.actions:
            if action.kind in (*rung_of, "run_validation", "drain_node"):
                state = escalation.mark_dispatched(state, action.command_id, now_s=now)
        for t in state.tickets:
            if t.state is escalation.TicketState.ACTING:
                assert t.pending is not None
            if t.state is escalation.TicketState.WAITING:
                assert t.waiting_rung is not None
            if t.rung is not None:
                assert t.rung >= last_rung.get(t.ticket_id, 0)
                last_rung[t.ticket_id] = t.rung
        assert escalation.RemediationState.from_dict(json.loads(json.dumps(state.to_dict()))) == state
        _nothing_due_before(state, now, esc)
        return state

    for op in sequence:
        if op[0] == "event":
            fault = dict(FAULTS[op[1]])
            kind = fault.pop("kind")
            gpu = fault.pop("gpu_uuid", op[2])
            ev = health.HealthEvent(node_id="n1", kind=kind, observed_at=now, gpu_uuid=gpu, **fault)
            c = correlate.correlate(corr, ev, now_s=now, catalog=CATALOG, policy=pol)
            corr = c.state
            if c.needs_decision:
                take(escalation.decide(state, c.incident, now_s=now, policy=esc), releases_allowed=False)
        elif op[0] == "result":
            pendings = [t.pending for t in state.tickets if t.pending is not None]
            if not pendings:
                continue
            pending = pendings[op[1] % len(pendings)]
            verdict = op[3] if pending.kind == "run_validation" else ""
            result = escalation.ActionResult(pending.command_id, op[2], validation_verdict=verdict)
            # A dry run validated nothing: it never releases (invariant 5).
            passing = pending.kind == "run_validation" and (
                op[2] is Outcome.SUCCEEDED and verdict in ("pass", "software_drift")
            )
            take(escalation.on_result(state, result, now_s=now, policy=esc), releases_allowed=passing)
        elif op[0] == "advance":
            now += op[1]
        elif op[0] == "tick":
            take(escalation.tick(state, now_s=now, policy=esc), releases_allowed=False)
        elif op[0] == "release":
            if not state.tickets:
                continue
            ticket = state.tickets[op[1] % len(state.tickets)]
            decision = escalation.operator_release(state, ticket.ticket_id, now_s=now, policy=esc, force=op[2])
            take(decision, releases_allowed=op[2])

    # The budget invariant over the whole run (the run is far shorter than the budget window).
    assert now - T0 < esc.attempt_budget_window_s
    counts = collections.Counter((target, kind) for target, kind, _ in attempts)
    for (target, kind), count in counts.items():
        assert count <= esc.max_attempts(kind), (target, kind, count)


@settings(max_examples=MAX_EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sequence=ops)
def test_random_sequences_keep_the_ladder_invariants(sequence):
    _run(sequence, POLICIES["default"])


@settings(max_examples=MAX_EXAMPLES // 2, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sequence=ops)
def test_random_sequences_keep_the_invariants_with_the_bmc_rung(sequence):
    _run(sequence, POLICIES["bmc"])


@settings(max_examples=MAX_EXAMPLES // 2, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sequence=ops, name=st.sampled_from(["drain", "drain-operator"]))
def test_random_sequences_keep_the_invariants_with_drains_before_repairs(sequence, name):
    _run(sequence, POLICIES[name])


@settings(max_examples=MAX_EXAMPLES // 3, deadline=None)
@given(sequence=ops)
def test_the_same_sequence_replays_to_the_same_actions(sequence):
    """Determinism: a decision replayed from the same inputs yields the same command ids."""

    def actions_of(seq):
        now = T0
        corr = correlate.CorrelationState()
        state = escalation.RemediationState("n1")
        out = []
        for op in seq:
            if op[0] == "event":
                fault = dict(FAULTS[op[1]])
                kind = fault.pop("kind")
                gpu = fault.pop("gpu_uuid", op[2])
                ev = health.HealthEvent(node_id="n1", kind=kind, observed_at=now, gpu_uuid=gpu, **fault)
                c = correlate.correlate(corr, ev, now_s=now, catalog=CATALOG, policy=POLICIES["default"])
                corr = c.state
                if c.needs_decision:
                    d = escalation.decide(state, c.incident, now_s=now, policy=POLICIES["default"].escalation)
                    state = d.state
                    out.extend(a.command_id for a in d.actions)
            elif op[0] == "result":
                pendings = [t.pending for t in state.tickets if t.pending is not None]
                if pendings:
                    p = pendings[op[1] % len(pendings)]
                    d = escalation.on_result(
                        state,
                        escalation.ActionResult(p.command_id, op[2], validation_verdict=op[3]),
                        now_s=now,
                        policy=POLICIES["default"].escalation,
                    )
                    state = d.state
                    out.extend(a.command_id for a in d.actions)
            elif op[0] == "advance":
                now += op[1]
        return out

    assert actions_of(sequence) == actions_of(sequence)


def test_a_ticket_reopened_for_the_same_occurrence_gets_new_command_ids():
    # Found by hypothesis: a recovery-action fault, a forced release (the ticket closes), the same
    # fault again at the same instant (the incident occurrence is unchanged), and a second forced
    # release. The reopened ticket had the closed one's id, so its Quarantine and Release repeated the
    # old command ids, and an executor that deduplicates by id would have skipped the new quarantine.
    _run([("event", 7, "GPU-0"), ("release", 0, True), ("event", 6, "GPU-0"), ("release", 0, True)], POLICIES["bmc"])
    _run(
        [("event", 7, "GPU-0"), ("release", 0, True), ("event", 7, "GPU-0"), ("release", 0, True)], POLICIES["default"]
    )


def test_a_repair_never_lifts_a_quarantine_another_ticket_holds():
    # An NVSwitch fatal holds the node for an operator; an Xid 79 on a GPU reboots it and passes
    # validation. Its release lifted the node's one quarantine, the operator's ticket's too.
    _run(
        [
            ("event", len(FAULTS) - 1, "GPU-0"),
            ("advance", 60.0),
            ("event", 3, "GPU-1"),
            ("result", 0, Outcome.SUCCEEDED, ""),
            ("result", 0, Outcome.SUCCEEDED, "pass"),
        ],
        POLICIES["default"],
    )
