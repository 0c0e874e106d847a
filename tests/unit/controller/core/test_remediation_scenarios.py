"""Scenario tests for the remediation core: event sequences on a fake clock through
correlate → decide → on_result/tick, as the service will run them (minus persistence)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from rasd.common import xid_catalog
from rasd.controller.core.remediation import actions, correlate, escalation, policy
from rasd.controller.core.remediation import events as health

EventKind = health.EventKind
Outcome = escalation.Outcome
TicketState = escalation.TicketState
CATALOG = xid_catalog.load_catalog()
T0 = 1_780_000_000.0
REPAIR_KINDS = ("restart_process", "reset_gpu", "reboot_node", "power_cycle_bmc", "run_validation", "drain_node")


class FakeClock:
    def __init__(self, start: float = T0) -> None:
        self.now = start

    def advance(self, seconds: float) -> None:
        self.now += seconds


class Node:
    """One node's remediation driven like the service does it, with every action recorded."""

    def __init__(self, pol: policy.RemediationPolicy | None = None, node_id: str = "n1") -> None:
        self.clock = FakeClock()
        self.policy = pol or policy.RemediationPolicy()
        self.node_id = node_id
        self.corr = correlate.CorrelationState()
        self.state = escalation.RemediationState(node_id)
        self.actions: list[actions.Action] = []
        self.reasons: list[str] = []
        self.outcomes: list[correlate.Outcome] = []

    # -- inputs ------------------------------------------------------------------------------

    def event(self, kind: EventKind, gpu: str = "GPU-1", **fields: object) -> escalation.Decision | None:
        ev = health.HealthEvent(node_id=self.node_id, kind=kind, observed_at=self.clock.now, gpu_uuid=gpu, **fields)
        # The service's whole pipeline: correlation reads the ladder's state too (a finished repair).
        handled = escalation.handle_event(
            self.corr, self.state, ev, now_s=self.clock.now, catalog=CATALOG, policy=self.policy
        )
        self.corr = handled.correlation.state
        self.outcomes.append(handled.correlation.outcome)
        if not handled.correlation.needs_decision:
            return None
        assert handled.correlation.incident is not None
        return self._take(handled.decision)

    def xid(self, xid: int, gpu: str = "GPU-1", **fields: object) -> escalation.Decision | None:
        return self.event(EventKind.XID, gpu, xid=xid, **fields)

    def result(
        self, kind: str, outcome: Outcome, verdict: str = "", failed: tuple[str, ...] = ()
    ) -> escalation.Decision:
        """Answer the newest outstanding command of ``kind``."""
        cmd = self.pending(kind)
        return self._take(
            escalation.on_result(
                self.state,
                escalation.ActionResult(cmd, outcome, validation_verdict=verdict, failed_gpu_uuids=failed),
                now_s=self.clock.now,
                policy=self.policy.escalation,
            )
        )

    def tick(self) -> escalation.Decision:
        return self._take(escalation.tick(self.state, now_s=self.clock.now, policy=self.policy.escalation))

    def _take(self, decision: escalation.Decision) -> escalation.Decision:
        assert decision.reason and "\n" not in decision.reason
        self.state = decision.state
        self.actions.extend(decision.actions)
        self.reasons.append(decision.reason)
        for action in decision.actions:
            if action.kind in REPAIR_KINDS:
                self.state = escalation.mark_dispatched(self.state, action.command_id, now_s=self.clock.now)
        return decision

    # -- views -------------------------------------------------------------------------------

    def pending(self, kind: str) -> str:
        for t in self.state.tickets:
            if t.pending is not None and t.pending.kind == kind:
                return t.pending.command_id
        raise AssertionError(f"no pending {kind}: {[t.pending for t in self.state.tickets]}")

    def kinds(self, decision: escalation.Decision | None) -> list[str]:
        return [] if decision is None else [a.kind for a in decision.actions]

    def ticket(self, gpu: str = "GPU-1") -> escalation.Ticket:
        matches = [t for t in self.state.tickets if t.covers_gpu(gpu)]
        assert len(matches) == 1, self.state.tickets
        return matches[0]

    def all_kinds(self) -> list[str]:
        return [a.kind for a in self.actions]


# ---- the acceptance scenarios ----------------------------------------------------------------


def test_xid13_restarts_the_process_and_a_repeat_within_the_window_resets_the_gpu():
    node = Node()
    first = node.xid(13)
    assert node.kinds(first) == ["restart_process"]
    assert first.actions[0].gpu_uuid == "GPU-1"
    node.result("restart_process", Outcome.SUCCEEDED)
    assert node.ticket().state is TicketState.WATCHING

    node.clock.advance(20 * 60)
    again = node.xid(13)
    assert node.kinds(again) == ["quarantine_gpu", "reset_gpu"]
    assert "recurred" in again.reason
    assert node.ticket().rung is escalation.Rung.RESET_GPU


def test_failed_reset_reboots_and_a_recurrence_after_the_reboot_goes_to_rma():
    node = Node()
    node.xid(13)
    node.result("restart_process", Outcome.SUCCEEDED)
    node.clock.advance(600)
    node.xid(13)

    failed = node.result("reset_gpu", Outcome.FAILED)
    assert node.kinds(failed) == ["quarantine_node", "reboot_node"]
    assert "reset_gpu failed" in failed.reason

    rebooted = node.result("reboot_node", Outcome.SUCCEEDED)
    assert node.kinds(rebooted) == ["run_validation"]
    assert rebooted.actions[0].suite == "post-repair"
    assert node.ticket().state is TicketState.VALIDATING

    passed = node.result("run_validation", Outcome.SUCCEEDED, "pass")
    released = {(a.gpu_uuid, a.forced) for a in passed.actions if isinstance(a, actions.Release)}
    assert released == {("", False), ("GPU-1", False)}  # the node and the GPU held since the reset
    assert node.ticket().state is TicketState.WATCHING

    node.clock.advance(3600)
    recurred = node.xid(13)
    assert node.kinds(recurred) == ["quarantine_gpu", "open_rma", "notify"]
    assert node.ticket().state is TicketState.RMA_PENDING
    rma = recurred.actions[1]
    assert isinstance(rma, actions.OpenRma) and rma.gpu_uuid == "GPU-1"
    assert any("reset_gpu failed" in line for line in rma.evidence)


def test_row_remap_failure_goes_straight_to_rma_and_other_gpus_stay_in_service():
    node = Node()
    decision = node.event(EventKind.ROW_REMAP_FAILURE, gpu="GPU-2")
    assert node.kinds(decision) == ["quarantine_gpu", "open_rma", "notify"]
    assert {a.gpu_uuid for a in decision.actions if hasattr(a, "gpu_uuid")} == {"GPU-2"}
    assert "quarantine_node" not in node.all_kinds()
    assert node.ticket("GPU-2").state is TicketState.RMA_PENDING


@pytest.mark.parametrize("outcome", [Outcome.FAILED, Outcome.TIMED_OUT, Outcome.SUCCEEDED])
def test_xid79_reboots_and_never_resets(outcome):
    node = Node()
    decision = node.xid(79, gpu="GPU-3")
    assert node.kinds(decision) == ["quarantine_node", "reboot_node"]
    node.result("reboot_node", outcome)
    if outcome is Outcome.SUCCEEDED:
        node.result("run_validation", Outcome.SUCCEEDED, "fail")
    node.clock.advance(4 * 3600)
    node.xid(79, gpu="GPU-3")
    node.tick()
    assert "reset_gpu" not in node.all_kinds()
    assert "restart_process" not in node.all_kinds()
    assert node.ticket("GPU-3").state is TicketState.RMA_PENDING


def test_fallen_off_bus_from_the_kernel_log_and_xid79_are_one_incident():
    node = Node()
    node.xid(79, gpu="GPU-3")
    node.event(EventKind.FALLEN_OFF_BUS, gpu="GPU-3")
    assert node.outcomes == [correlate.Outcome.NEW, correlate.Outcome.SECONDARY]
    assert node.all_kinds().count("reboot_node") == 1


def test_xid154_node_reboot_required_reboots():
    node = Node()
    decision = node.xid(
        154, gpu="GPU-4", message="GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)"
    )
    assert node.kinds(decision) == ["quarantine_node", "reboot_node"]
    assert "NODE_REBOOT" in decision.reason


def test_nvml_recovery_action_field_drain_and_reset_resets_the_gpu():
    node = Node()
    decision = node.event(EventKind.RECOVERY_ACTION, gpu="GPU-5", recovery_action=4)
    assert node.kinds(decision) == ["quarantine_gpu", "reset_gpu"]


def flap_storm(node: Node) -> None:
    """15 down/up flaps across two ports of mlx5_0 in 5 minutes."""
    for i in range(30):
        node.clock.advance(10)
        port = "1" if i % 3 else "2"
        state = "DOWN" if i % 2 == 0 else "ACTIVE"
        node.event(
            EventKind.IB_LINK_STATE, gpu="", attributes={"ib_device": "mlx5_0", "ib_port": port, "ib_state": state}
        )


def test_link_flap_storm_on_one_node_is_one_incident_and_quarantines_the_node():
    node = Node()
    flap_storm(node)
    assert node.outcomes.count(correlate.Outcome.NEW) == 1
    assert node.all_kinds() == ["quarantine_node", "notify"]
    assert len(node.corr.open_incidents()) == 1
    assert node.ticket("").state is TicketState.AWAITING_OPERATOR


def test_link_flap_storm_with_port_isolation_quarantines_only_the_port():
    pol = policy.RemediationPolicy.from_mapping({"classification": {"ib_flap_isolation": "port"}})
    node = Node(pol)
    for i in range(10):
        node.clock.advance(10)
        node.event(
            EventKind.IB_LINK_STATE,
            gpu="",
            attributes={"ib_device": "mlx5_1", "ib_port": "1", "ib_state": "DOWN" if i % 2 == 0 else "ACTIVE"},
        )
    assert node.all_kinds() == ["quarantine_port", "notify"]
    assert node.actions[0].ib_port == "mlx5_1/1"


def test_xid45_following_xid48_is_one_incident():
    node = Node()
    node.xid(48)
    node.clock.advance(2)
    node.xid(45)
    node.event(EventKind.ECC_DBE)
    assert node.outcomes == [correlate.Outcome.NEW, correlate.Outcome.SECONDARY, correlate.Outcome.SECONDARY]
    assert len(node.corr.open_incidents()) == 1
    assert node.all_kinds() == ["quarantine_gpu", "reset_gpu"]


def test_a_burst_of_the_same_xid_is_one_incident_and_one_action():
    node = Node()
    for _ in range(50):
        node.xid(13)
        node.clock.advance(3)
    assert node.outcomes.count(correlate.Outcome.NEW) == 1
    assert node.all_kinds() == ["restart_process"]


# ---- timeouts, validation, holding ----------------------------------------------------------


def test_a_reset_that_times_out_climbs_to_reboot_on_tick():
    node = Node()
    node.xid(95)  # RESET_GPU bucket
    node.clock.advance(node.policy.escalation.reset_gpu_timeout_s - 1)
    assert node.kinds(node.tick()) == []
    node.clock.advance(1)
    climbed = node.tick()
    assert node.kinds(climbed) == ["quarantine_node", "reboot_node"]
    assert "timed_out" in climbed.reason


def test_a_command_is_awaited_exactly_until_the_tick_would_time_it_out():
    """What a reconnect may send again, and its deadline: nothing the tick would already have given up on."""
    node = Node()
    node.xid(95)  # RESET_GPU bucket: a reset, dispatched now
    reset = node.pending("reset_gpu")
    timeout_s = node.policy.escalation.reset_gpu_timeout_s
    ends = node.clock.now + timeout_s
    awaited = escalation.awaited_until
    assert awaited(node.state, now_s=ends - 1, policy=node.policy.escalation) == {reset: ends}
    assert awaited(node.state, now_s=ends, policy=node.policy.escalation) == {}
    node.clock.advance(timeout_s)
    climbed = node.tick()  # the same instant: the tick times it out and climbs to a reboot
    assert node.kinds(climbed) == ["quarantine_node", "reboot_node"]
    reboot = node.pending("reboot_node")
    assert awaited(node.state, now_s=node.clock.now, policy=node.policy.escalation) == {
        reboot: node.clock.now + node.policy.escalation.reboot_node_timeout_s
    }
    assert awaited(None, now_s=node.clock.now, policy=node.policy.escalation) == {}


def test_a_command_held_back_by_the_budget_never_times_out():
    node = Node()
    decision = escalation.decide(
        node.state,
        correlate.correlate(
            node.corr,
            health.HealthEvent("n1", EventKind.XID, T0, gpu_uuid="GPU-1", xid=95),
            now_s=T0,
            catalog=CATALOG,
            policy=node.policy,
        ).incident,
        now_s=T0,
        policy=node.policy.escalation,
    )
    later = escalation.tick(decision.state, now_s=T0 + 10 * 86400, policy=node.policy.escalation)
    assert later.actions == ()


def test_suspect_validation_is_retested_then_counts_as_failed():
    node = Node()
    node.xid(95)
    node.result("reset_gpu", Outcome.SUCCEEDED)
    retest = node.result("run_validation", Outcome.SUCCEEDED, "suspect")
    assert node.kinds(retest) == ["run_validation"]
    assert retest.actions[0].suite == "accusation"
    failed = node.result("run_validation", Outcome.SUCCEEDED, "suspect")
    assert node.kinds(failed) == ["quarantine_node", "reboot_node"]


def test_software_drift_releases_and_tells_a_person():
    node = Node()
    node.xid(95)
    node.result("reset_gpu", Outcome.SUCCEEDED)
    decision = node.result("run_validation", Outcome.SUCCEEDED, "software_drift")
    assert node.kinds(decision) == ["release", "notify"]
    assert node.ticket().state is TicketState.WATCHING


def test_the_watch_closes_the_ticket_after_the_recurrence_window():
    node = Node()
    node.xid(13)
    node.result("restart_process", Outcome.SUCCEEDED)
    node.clock.advance(node.policy.escalation.recurrence_window_s)
    closed = node.tick()
    assert "closed" in closed.reason
    assert node.state.tickets == ()


def test_remap_pending_within_spare_capacity_resets_and_returns_to_service():
    node = Node()
    decision = node.event(EventKind.ROW_REMAP_PENDING, remapped_rows_uncorrectable=3)
    assert node.kinds(decision) == []  # the counter waits for an Xid that would say more (issue #37)
    node.clock.advance(node.policy.escalation.counter_hold_s)
    assert node.kinds(node.tick()) == []  # then the reset that applies the remap waits for the drain
    assert node.ticket().state is TicketState.DRAINING and node.ticket().held == ()
    drained = escalation.gpu_idle(node.state, "GPU-1", now_s=node.clock.now, policy=node.policy.escalation)
    assert node.kinds(node._take(drained)) == ["quarantine_gpu", "reset_gpu"]
    node.result("reset_gpu", Outcome.SUCCEEDED)
    released = node.result("run_validation", Outcome.SUCCEEDED, "pass")
    assert [(a.kind, a.gpu_uuid) for a in released.actions] == [("release", "GPU-1")]


def test_retired_pages_within_capacity_take_no_action():
    node = Node()
    assert node.event(EventKind.RETIRED_PAGES, retired_pages=12) is None
    assert node.outcomes == [correlate.Outcome.OBSERVED]


def test_sdc_accusation_holds_the_gpu_and_a_reproducible_failure_goes_to_rma():
    node = Node()
    decision = node.event(EventKind.SDC_SUSPECT, gpu="GPU-6")
    assert node.kinds(decision) == ["quarantine_gpu", "run_validation"]
    assert decision.actions[1].suite == "accusation"
    first = node.result("run_validation", Outcome.SUCCEEDED, "fail")
    assert node.kinds(first) == ["run_validation"], "one failure is not yet reproducible: rerun"
    assert first.actions[0].suite == "accusation"
    assert "1 of 1 runs failed" in first.reason
    second = node.result("run_validation", Outcome.SUCCEEDED, "fail")
    assert node.kinds(second) == ["open_rma", "notify"]
    assert "reproducible: 2 of 2 runs failed" in second.reason
    assert node.ticket("GPU-6").sdc_verdicts == ("fail", "fail")


def test_sdc_failure_two_of_three_with_a_pass_between_still_goes_to_rma():
    node = Node()
    node.event(EventKind.SDC_SUSPECT, gpu="GPU-6")
    node.result("run_validation", Outcome.SUCCEEDED, "fail")
    between = node.result("run_validation", Outcome.SUCCEEDED, "pass")
    assert node.kinds(between) == ["run_validation"], "2 of 3 is still reachable"
    third = node.result("run_validation", Outcome.SUCCEEDED, "fail")
    assert "open_rma" in node.kinds(third)


def test_sdc_one_off_gets_a_hot_retest_then_a_watch_and_a_second_accusation_quarantines():
    node = Node()
    node.event(EventKind.SDC_SUSPECT, gpu="GPU-6")
    node.result("run_validation", Outcome.SUCCEEDED, "fail")
    node.result("run_validation", Outcome.SUCCEEDED, "pass")
    hot = node.result("run_validation", Outcome.SUCCEEDED, "pass")
    assert node.kinds(hot) == ["run_validation"]
    assert hot.actions[0].suite == node.policy.escalation.sdc_hot_retest_suite == "post-repair"
    assert "one-off" in hot.reason
    cleared = node.result("run_validation", Outcome.SUCCEEDED, "pass")
    assert [(a.kind, a.gpu_uuid) for a in cleared.actions] == [("release", "GPU-6")]
    assert dict(node.state.sdc_watch) == {"GPU-6": node.clock.now + node.policy.escalation.sdc_watch_s}
    assert node.ticket("GPU-6").sdc_verdicts == ("fail", "pass", "pass", "hot:pass")

    # Days later (the repair watch is long over, the SDC watch is not): a second accusation.
    node.clock.advance(3 * 86400)
    node.tick()
    again = node.event(EventKind.SDC_SUSPECT, gpu="GPU-6")
    assert node.kinds(again) == ["quarantine_gpu", "open_rma", "notify"]
    assert "second accusation while watched" in again.reason
    assert node.state.sdc_watch == ()


def test_sdc_hot_retest_failure_is_reproducible():
    node = Node()
    node.event(EventKind.SDC_SUSPECT, gpu="GPU-6")
    node.result("run_validation", Outcome.SUCCEEDED, "suspect")
    node.result("run_validation", Outcome.SUCCEEDED, "pass")  # 0 fails + 1 left < 2: one-off
    failed = node.result("run_validation", Outcome.SUCCEEDED, "fail")
    assert "open_rma" in node.kinds(failed)
    assert "failed again under the hot retest" in failed.reason


def test_sdc_hot_retest_that_deviates_again_holds_the_gpu_for_an_operator():
    """Suspect under the hot retest is no clearing: the GPU deviated in run after run (the audit's F8)."""
    node = Node()
    node.event(EventKind.SDC_SUSPECT, gpu="GPU-6")
    node.result("run_validation", Outcome.SUCCEEDED, "fail")
    node.result("run_validation", Outcome.SUCCEEDED, "pass")
    node.result("run_validation", Outcome.SUCCEEDED, "pass")  # one-off so far: the hot retest
    held = node.result("run_validation", Outcome.SUCCEEDED, "suspect")
    assert node.kinds(held) == ["notify"], "no release, no RMA: a person decides"
    assert "deviated again: 1 of 3 runs failed, hot retest suspect" in held.reason
    ticket = node.ticket("GPU-6")
    assert ticket.state is escalation.TicketState.AWAITING_OPERATOR
    assert ticket.sdc_verdicts == ("fail", "pass", "pass", "hot:suspect")
    assert node.state.sdc_watch == (), "not cleared, so not watched"


def test_sdc_accusation_that_passes_releases_the_gpu_and_watches_it():
    node = Node()
    node.event(EventKind.SDC_SUSPECT, gpu="GPU-6")
    passed = node.result("run_validation", Outcome.SUCCEEDED, "pass")
    assert [(a.kind, a.gpu_uuid) for a in passed.actions] == [("release", "GPU-6")]
    assert "did not reproduce" in passed.reason
    node.clock.advance(node.policy.escalation.sdc_watch_s + 1)
    node.tick()
    assert node.state.sdc_watch == ()
    fresh = node.event(EventKind.SDC_SUSPECT, gpu="GPU-6")
    assert node.kinds(fresh) == ["quarantine_gpu", "run_validation"], "the watch expired: a fresh accusation"


def test_sdc_runs_that_never_finish_hold_the_gpu_for_an_operator():
    node = Node()
    node.event(EventKind.SDC_SUSPECT, gpu="GPU-6")
    node.result("run_validation", Outcome.TIMED_OUT)
    held = node.result("run_validation", Outcome.FAILED)
    assert node.kinds(held) == ["notify"]
    assert node.ticket("GPU-6").state is TicketState.AWAITING_OPERATOR


def test_watch_state_survives_a_round_trip_through_the_store_format():
    node = Node()
    node.event(EventKind.SDC_SUSPECT, gpu="GPU-6")
    node.result("run_validation", Outcome.SUCCEEDED, "pass")
    again = escalation.RemediationState.from_dict(json.loads(json.dumps(node.state.to_dict())))
    assert again == node.state


# ---- rolling sweeps ----------------------------------------------------------------------------


def sweep(node: Node, seed: int = 42) -> escalation.Decision:
    return node._take(
        escalation.start_sweep(
            node.state,
            sweep_id=f"sweep/{node.node_id}/1",
            suite="quick",
            seed=seed,
            now_s=node.clock.now,
            policy=node.policy.escalation,
        )
    )


def test_a_second_sweep_in_the_same_seed_epoch_gets_new_command_ids():
    node = Node()
    first = sweep(node)
    node.result("run_validation", Outcome.SUCCEEDED, "pass")
    node.clock.advance(3700)  # sweeps every hour, seeds every day: the same sweep id
    second = sweep(node)
    assert [a.kind for a in second.actions] == ["quarantine_node", "run_validation"]
    assert not {a.command_id for a in first.actions} & {a.command_id for a in second.actions}


def test_a_sweep_that_passes_holds_the_node_only_while_it_runs():
    node = Node()
    started = sweep(node)
    assert node.kinds(started) == ["quarantine_node", "run_validation"]
    assert started.actions[0].planned is True
    assert (started.actions[1].suite, started.actions[1].seed) == ("quick", 42)
    passed = node.result("run_validation", Outcome.SUCCEEDED, "pass")
    assert [(a.kind, a.gpu_uuid) for a in passed.actions] == [("release", "")]
    assert node.state.tickets == ()


def test_a_sweep_failure_on_one_gpu_becomes_an_accusation_of_that_gpu():
    node = Node()
    sweep(node)
    failed = node.result("run_validation", Outcome.SUCCEEDED, "fail", failed=("GPU-3",))
    assert node.kinds(failed) == ["quarantine_gpu", "release", "run_validation"]
    assert (failed.actions[0].gpu_uuid, failed.actions[1].gpu_uuid) == ("GPU-3", ""), "GPU held before the node goes"
    assert failed.actions[2].gpu_uuids == ("GPU-3",)
    assert failed.actions[2].suite == "accusation"
    ticket = node.ticket("GPU-3")
    assert (ticket.purpose, ticket.held, ticket.sdc_verdicts) == (
        escalation.Purpose.ACCUSATION,
        ("gpu:GPU-3",),
        ("fail",),
    )
    confirmed = node.result("run_validation", Outcome.SUCCEEDED, "fail")
    assert "open_rma" in node.kinds(confirmed)


def test_a_sweep_is_refused_on_a_node_with_a_ticket():
    node = Node()
    node.xid(13)
    refused = sweep(node)
    assert refused.actions == ()
    assert "no sweep" in refused.reason


# ---- the node while it reboots ----------------------------------------------------------------


def test_gpu_fault_during_a_reboot_folds_into_the_reboot_and_gets_no_gpu_action():
    node = Node()
    node.xid(79, gpu="GPU-3")
    decision = node.xid(13, gpu="GPU-4")
    assert node.kinds(decision) == []
    assert "folded" in decision.reason
    assert node.ticket("GPU-3") is node.ticket("GPU-4")
    node.result("reboot_node", Outcome.SUCCEEDED)
    passed = node.result("run_validation", Outcome.SUCCEEDED, "pass")
    assert node.kinds(passed) == ["release"]
    assert "restart_process" not in node.all_kinds()


def test_a_reboot_supersedes_a_reset_in_flight_on_another_gpu():
    node = Node()
    node.xid(95, gpu="GPU-1")
    reset_cmd = node.pending("reset_gpu")
    node.xid(79, gpu="GPU-2")
    assert len(node.state.tickets) == 1
    assert node.ticket("GPU-1") is node.ticket("GPU-2")
    stale = escalation.on_result(
        node.state,
        escalation.ActionResult(reset_cmd, Outcome.FAILED),
        now_s=node.clock.now,
        policy=node.policy.escalation,
    )
    assert stale.actions == () and "stale" in stale.reason
    node.result("reboot_node", Outcome.SUCCEEDED)
    passed = node.result("run_validation", Outcome.SUCCEEDED, "pass")
    assert sorted(a.gpu_uuid for a in passed.actions) == ["", "GPU-1"]


def test_a_folded_gpu_that_faults_during_the_node_validation_is_not_released_by_that_run():
    node = Node()
    node.xid(79, gpu="GPU-3")  # reboot, node quarantined
    node.xid(13, gpu="GPU-4")  # folded into the reboot
    node.result("reboot_node", Outcome.SUCCEEDED)
    run = node.pending("run_validation")
    node.clock.advance(120)
    during = node.xid(79, gpu="GPU-4")  # GPU-4 falls off the bus while the node is validated
    assert node.kinds(during) == ["reboot_node"]  # its own ticket: the node reboots again
    late = node._take(
        escalation.on_result(
            node.state,
            escalation.ActionResult(run, Outcome.SUCCEEDED, validation_verdict="pass"),
            now_s=node.clock.now,
            policy=node.policy.escalation,
        )
    )
    assert [a for a in late.actions if a.kind == "release"] == []  # the run no ticket waits for releases nothing
    assert any("node" in t.held for t in node.state.tickets)


def test_a_dry_run_validation_releases_nothing_and_tells_a_person():
    """An agent with destructive actions disabled answers DRY_RUN: nothing was reset or validated."""
    node = Node()
    node.xid(95, gpu="GPU-1")  # reset: GPU-1 quarantined
    node.result("reset_gpu", Outcome.DRY_RUN)
    held = node.result("run_validation", Outcome.DRY_RUN)
    assert node.kinds(held) == ["notify"]
    assert node.ticket().state is TicketState.AWAITING_OPERATOR and node.ticket().held == ("gpu:GPU-1",)
    accused = Node()
    accused.event(EventKind.SDC_SUSPECT, gpu="GPU-2", severity=health.Severity.ERROR)
    assert accused.kinds(accused.result("run_validation", Outcome.DRY_RUN)) == ["notify"]
    assert accused.ticket("GPU-2").held == ("gpu:GPU-2",)
    swept = Node()
    sweep(swept)
    let_go = swept.result("run_validation", Outcome.DRY_RUN)  # a healthy node taken for a sweep goes back
    assert swept.kinds(let_go) == ["release"] and swept.state.tickets == ()


def test_rma_after_a_reboot_releases_the_node_once_its_other_gpus_pass():
    node = Node()
    node.xid(79, gpu="GPU-3")
    rma = node.result("reboot_node", Outcome.FAILED)
    assert node.kinds(rma) == ["quarantine_gpu", "open_rma", "notify", "run_validation"]
    assert rma.actions[-1].exclude_gpu_uuids == ("GPU-3",)
    released = node.result("run_validation", Outcome.SUCCEEDED, "pass")
    assert [(a.kind, a.gpu_uuid) for a in released.actions] == [("release", "")]
    assert node.ticket("GPU-3").held == ("gpu:GPU-3",)


# ---- budgets, optional rungs, operator --------------------------------------------------------


def test_spent_rung_budgets_make_a_new_ticket_skip_rungs():
    node = Node()
    for _ in range(2):
        node.xid(13)
        node.result("restart_process", Outcome.SUCCEEDED)
        node.clock.advance(node.policy.escalation.recurrence_window_s)
        node.tick()  # the watch closes; the next Xid 13 opens a new ticket
    third = node.xid(13)
    assert node.kinds(third) == ["quarantine_gpu", "reset_gpu"]
    assert "budget 2 spent" in third.reason


def test_the_bmc_power_cycle_rung_is_used_when_enabled():
    pol = policy.RemediationPolicy.from_mapping({"escalation": {"bmc_power_cycle_enabled": True}})
    node = Node(pol)
    node.xid(79)
    cycled = node.result("reboot_node", Outcome.TIMED_OUT)
    assert node.kinds(cycled) == ["power_cycle_bmc"]  # the node is already quarantined
    rma = node.result("power_cycle_bmc", Outcome.NOT_SUPPORTED)
    assert "open_rma" in node.kinds(rma)


def test_operator_release_of_an_isolated_node_needs_a_passing_validation():
    node = Node()
    node.event(EventKind.SXID, gpu="", xid=12028, severity=health.Severity.FATAL)
    ticket = node.ticket("")
    assert ticket.state is TicketState.AWAITING_OPERATOR and ticket.held == ("node",)
    decision = node._take(
        escalation.operator_release(node.state, ticket.ticket_id, now_s=node.clock.now, policy=node.policy.escalation)
    )
    assert node.kinds(decision) == ["run_validation"]
    still = node.result("run_validation", Outcome.SUCCEEDED, "fail")
    assert node.kinds(still) == ["notify"]
    assert node.ticket("").state is TicketState.AWAITING_OPERATOR


def test_operator_force_release_is_marked_forced_and_closes_the_ticket():
    node = Node()
    node.event(EventKind.ROW_REMAP_FAILURE)
    ticket = node.ticket()
    decision = escalation.operator_release(
        node.state, ticket.ticket_id, now_s=node.clock.now, policy=node.policy.escalation, force=True
    )
    assert [(a.kind, a.forced) for a in decision.actions] == [("release", True)]
    assert decision.state.tickets == ()


def node_releases(decision: escalation.Decision) -> list[actions.Action]:
    return [a for a in decision.actions if a.kind == "release" and not a.gpu_uuid and not a.ib_port]


def test_a_repair_does_not_release_a_node_another_ticket_still_holds():
    node = Node()
    flap_storm(node)  # the optics: node quarantined, waiting for a person
    isolation = node.ticket("")
    node.clock.advance(60)
    assert node.kinds(node.xid(79, gpu="GPU-3")) == ["quarantine_node", "reboot_node"]
    node.result("reboot_node", Outcome.SUCCEEDED)
    passed = node.result("run_validation", Outcome.SUCCEEDED, "pass")
    assert node_releases(passed) == []
    assert passed.reason.endswith(f"node stays quarantined, held by {isolation.ticket_id}")
    assert node.ticket("GPU-3").held == () and node.ticket("").held == ("node",)
    # The optics ticket is the last holder: its release lifts the quarantine.
    node._take(
        escalation.operator_release(
            node.state, isolation.ticket_id, now_s=node.clock.now, policy=node.policy.escalation, hold="node"
        )
    )
    assert len(node_releases(node.result("run_validation", Outcome.SUCCEEDED, "pass"))) == 1


def test_an_operators_hold_outlives_a_tickets_release_until_the_operator_lifts_it():
    node = Node()
    node.state = escalation.operator_holds(node.state, "node", held=True)
    node.xid(79, gpu="GPU-3")
    node.result("reboot_node", Outcome.SUCCEEDED)
    passed = node.result("run_validation", Outcome.SUCCEEDED, "pass")
    assert node_releases(passed) == [] and passed.reason.endswith("node stays quarantined, held by operator")
    stored = escalation.RemediationState.from_dict(json.loads(json.dumps(node.state.to_dict())))
    assert stored.operator_holds == ("node",)
    assert escalation.operator_holds(stored, "node", held=False).operator_holds == ()
    # A state stored before operator holds existed reads back with none.
    legacy = {k: v for k, v in node.state.to_dict().items() if k != "operator_holds"}
    assert escalation.RemediationState.from_dict(legacy).operator_holds == ()


def test_a_forced_release_lifts_the_target_from_every_holder():
    node = Node()
    flap_storm(node)
    isolation = node.ticket("")
    node.state = escalation.operator_holds(node.state, "node", held=True)
    forced = node._take(
        escalation.operator_release(
            node.state,
            isolation.ticket_id,
            now_s=node.clock.now,
            policy=node.policy.escalation,
            force=True,
            hold="node",
        )
    )
    assert [(a.kind, a.forced) for a in node_releases(forced)] == [("release", True)]
    assert node.state.operator_holds == () and node.state.tickets == ()


def test_a_forced_release_of_the_node_keeps_the_gpu_waiting_for_its_rma():
    node = Node()
    node.xid(79, gpu="GPU-3")
    node.result("reboot_node", Outcome.FAILED)  # RMA for GPU-3; the node's other GPUs are validated
    node.result("run_validation", Outcome.SUCCEEDED, "fail")
    ticket = node.ticket("GPU-3")
    assert ticket.state is TicketState.RMA_PENDING and set(ticket.held) == {"node", "gpu:GPU-3"}
    forced = node._take(
        escalation.operator_release(
            node.state, ticket.ticket_id, now_s=node.clock.now, policy=node.policy.escalation, force=True, hold="node"
        )
    )
    assert [(a.kind, a.gpu_uuid, a.forced) for a in forced.actions] == [("release", "", True)]
    assert node.ticket("GPU-3").held == ("gpu:GPU-3",) and node.ticket("GPU-3").state is TicketState.RMA_PENDING


def test_a_forced_release_of_one_gpu_leaves_the_node_and_its_other_holders_alone():
    node = Node()
    node.state = escalation.operator_holds(node.state, "node", held=True)
    node.xid(95, gpu="GPU-1")  # a reset: GPU-1 quarantined
    node.xid(79, gpu="GPU-2")  # a reboot folds it: the ticket holds gpu:GPU-1 and the node
    ticket = node.ticket("GPU-2")
    forced = node._take(
        escalation.operator_release(
            node.state,
            ticket.ticket_id,
            now_s=node.clock.now,
            policy=node.policy.escalation,
            force=True,
            hold="gpu:GPU-1",
        )
    )
    assert [(a.kind, a.gpu_uuid) for a in forced.actions] == [("release", "GPU-1")]
    assert node.state.operator_holds == ("node",) and "node" in node.ticket("GPU-2").held


def test_a_mild_unknown_xid_only_tells_a_person():
    node = Node()
    decision = node.xid(9999)
    assert node.kinds(decision) == ["notify"]
    assert node.state.tickets == ()


# ---- determinism and restart ------------------------------------------------------------------


def _ladder(node: Node, checkpoint: bool) -> list[str]:
    node.xid(13)
    node.result("restart_process", Outcome.SUCCEEDED)
    node.clock.advance(600)
    if checkpoint:  # the controller restarts: state comes back from the store
        node.state = escalation.RemediationState.from_dict(json.loads(json.dumps(node.state.to_dict())))
        node.corr = correlate.CorrelationState.from_dict(json.loads(json.dumps(node.corr.to_dict())))
    node.xid(13)
    node.result("reset_gpu", Outcome.FAILED)
    node.result("reboot_node", Outcome.SUCCEEDED)
    node.result("run_validation", Outcome.SUCCEEDED, "pass")
    return [a.command_id for a in node.actions]


def test_a_replayed_ladder_produces_the_same_command_ids_across_a_restart():
    assert _ladder(Node(), checkpoint=False) == _ladder(Node(), checkpoint=True)


def test_replaying_one_decision_from_stored_state_reuses_its_command_ids():
    node = Node()
    node.xid(13)
    stored = json.dumps(node.state.to_dict())
    restart = node.pending("restart_process")
    first = node.result("restart_process", Outcome.FAILED)
    replay = escalation.on_result(
        escalation.RemediationState.from_dict(json.loads(stored)),
        escalation.ActionResult(restart, Outcome.FAILED),
        now_s=node.clock.now,
        policy=node.policy.escalation,
    )
    assert [a.command_id for a in replay.actions] == [a.command_id for a in first.actions]
    assert len(set(a.command_id for a in node.actions)) == len(node.actions)


def test_a_result_for_an_unknown_command_is_stale_and_changes_nothing():
    node = Node()
    node.xid(13)
    decision = escalation.on_result(
        node.state,
        escalation.ActionResult("not-a-command", Outcome.FAILED),
        now_s=node.clock.now,
        policy=node.policy.escalation,
    )
    assert decision.state == node.state and decision.actions == ()


def test_every_action_carries_the_reason_and_a_ticket_scoped_key():
    node = Node()
    node.xid(79)
    for action in node.actions:
        assert action.reason
        assert action.key.startswith(node.ticket().ticket_id + "/")
        assert dataclasses.asdict(action)["node_id"] == "n1"


def test_a_gpu_covered_by_a_reboot_that_faults_later_gets_its_own_ticket():
    node = Node()
    node.xid(79, gpu="GPU-3")
    node.xid(95, gpu="GPU-4")  # folds into the reboot
    node.result("reboot_node", Outcome.SUCCEEDED)
    node.result("run_validation", Outcome.SUCCEEDED, "pass")
    node.clock.advance(3600)
    decision = node.xid(95, gpu="GPU-4")
    assert node.kinds(decision) == ["quarantine_gpu", "reset_gpu"]
    assert node.ticket("GPU-4") is not node.ticket("GPU-3")


def test_handle_event_runs_the_whole_pipeline():
    pol = policy.RemediationPolicy()
    corr = correlate.CorrelationState()
    state = escalation.RemediationState("n1")
    first = escalation.handle_event(
        corr,
        state,
        health.HealthEvent("n1", EventKind.XID, T0, gpu_uuid="GPU-1", xid=48),
        now_s=T0,
        catalog=CATALOG,
        policy=pol,
    )
    assert first.correlation.outcome is correlate.Outcome.NEW
    assert [a.kind for a in first.decision.actions] == ["quarantine_gpu", "reset_gpu"]
    second = escalation.handle_event(
        first.correlation.state,
        first.decision.state,
        health.HealthEvent("n1", EventKind.XID, T0 + 2, gpu_uuid="GPU-1", xid=45),
        now_s=T0 + 2,
        catalog=CATALOG,
        policy=pol,
    )
    assert second.decision.actions == () and second.decision.state == first.decision.state
    assert "Xid 45 is the cleanup after Xid 48" in second.decision.reason


def test_xid154_reset_then_reboot_required_upgrades_the_reset_to_a_reboot():
    node = Node()
    first = node.xid(154, message="... to 0x1 (GPU Reset Required)")
    assert node.kinds(first) == ["quarantine_gpu", "reset_gpu"]
    node.clock.advance(20)
    second = node.xid(154, message="... from 0x1 (GPU Reset Required) to 0x2 (Node Reboot Required)")
    assert node.kinds(second) == ["quarantine_node", "reboot_node"]
    assert "supersedes reset_gpu" in second.reason


def test_decisions_name_the_commands_they_stop_waiting_for():
    node = Node()
    node.xid(95, gpu="GPU-1")
    reset = node.pending("reset_gpu")
    superseding = node.xid(79, gpu="GPU-2")  # the reboot folds GPU-1's reset in
    assert superseding.closed_command_ids == (reset,)
    reboot = node.pending("reboot_node")
    answered = node.result("reboot_node", Outcome.SUCCEEDED)
    assert answered.closed_command_ids == (reboot,)
    assert node.xid(13, gpu="GPU-5").closed_command_ids == ()


def test_an_incident_for_another_node_changes_nothing():
    node = Node()
    other = Node(node_id="n2")
    other.xid(13)
    incident = other.corr.open_incidents()[0]
    decision = escalation.decide(node.state, incident, now_s=node.clock.now, policy=node.policy.escalation)
    assert decision.actions == () and decision.state == node.state


def test_a_ticket_update_is_dataclasses_replace_and_never_reuses_the_old_values_dict():
    ticket = escalation.Ticket(
        ticket_id="n1/GPU-1/xid:13/1t5@1", node_id="n1", gpu_uuid="GPU-1", fault_key="xid:13",
        purpose=escalation.Purpose.REPAIR, state=escalation.TicketState.ACTING, opened_at=1.0, updated_at=1.0,
        history=("1 fault xid:13",),
    )  # fmt: skip
    before = escalation._ticket_to_dict(ticket)
    assert escalation._ticket_to_dict(ticket) is before  # made once per value
    changes = {"state": escalation.TicketState.WATCHING, "updated_at": 2.0, "history": ("1 a", "2 b")}
    evolved = escalation._evolve(ticket, **changes)
    assert evolved == dataclasses.replace(ticket, **changes)
    assert escalation._ticket_to_dict(evolved) == escalation._ticket_as_dict(evolved)
    assert escalation._ticket_to_dict(evolved)["state"] == "watching" and before["state"] == "acting"
    with pytest.raises(TypeError, match="statee"):
        escalation._evolve(ticket, statee=escalation.TicketState.WATCHING)


# ---- issue #37: the ladder and correlation after a repair, counters and Xids, busy GPUs ---------


def test_a_fault_back_within_the_dedupe_window_after_its_restart_finished_climbs_to_a_reset():
    """Xid 13 again 120 s after its restart succeeded: the repair did not hold, it is no duplicate."""
    node = Node()
    node.xid(13)
    node.clock.advance(5)
    node.result("restart_process", Outcome.SUCCEEDED)
    node.clock.advance(120)  # within the 180 s dedupe window of the first incident
    again = node.xid(13)
    assert node.kinds(again) == ["quarantine_gpu", "reset_gpu"]
    assert "recurred" in again.reason
    node.clock.advance(2)  # the recurrence's own burst still folds into it: one reset, not two
    assert node.xid(13) is None
    assert node.all_kinds().count("reset_gpu") == 1


def test_a_fresh_dbe_after_a_finished_reset_and_release_climbs_to_a_reboot():
    """A new uncorrectable error 12 s after the GPU came back is no detail of the old Xid 48: it climbs."""
    node = Node()
    node.xid(48)
    node.clock.advance(10)
    node.result("reset_gpu", Outcome.SUCCEEDED)
    node.clock.advance(30)
    released = node.result("run_validation", Outcome.SUCCEEDED, "pass")
    assert node.kinds(released) == ["release"]
    node.clock.advance(12)
    fresh = node.event(EventKind.ECC_DBE)
    assert node.kinds(fresh) == ["quarantine_node", "reboot_node"]
    assert node.ticket().rung is escalation.Rung.REBOOT_NODE


def test_a_repeat_while_the_repair_still_runs_folds_into_it():
    node = Node()
    node.xid(13)
    node.clock.advance(60)
    assert node.xid(13) is None  # the restart has not answered: a duplicate
    assert node.all_kinds() == ["restart_process"]


def test_a_reset_refused_for_running_processes_stops_them_and_resets_again():
    node = Node()
    node.xid(95)  # RESET_GPU bucket
    refused = node.result("reset_gpu", Outcome.REFUSED)
    assert node.kinds(refused) == ["restart_process"]
    assert refused.actions[0].gpu_uuid == "GPU-1"
    assert "refused" in refused.reason and "stop" in refused.reason
    assert node.ticket().rung is escalation.Rung.RESET_GPU and node.ticket().held == ("gpu:GPU-1",)
    stopped = node.result("restart_process", Outcome.SUCCEEDED)
    assert node.kinds(stopped) == ["reset_gpu"]
    node.result("reset_gpu", Outcome.SUCCEEDED)
    node.result("run_validation", Outcome.SUCCEEDED, "pass")
    assert "reboot_node" not in node.all_kinds()
    assert node.ticket().state is TicketState.WATCHING


@pytest.mark.parametrize("how", ["refused again", "stop failed", "stop timed out"])
def test_a_reset_still_refused_or_whose_processes_do_not_stop_climbs_to_a_reboot(how):
    node = Node()
    node.xid(95)
    node.result("reset_gpu", Outcome.REFUSED)
    if how == "refused again":
        node.result("restart_process", Outcome.SUCCEEDED)
        climbed = node.result("reset_gpu", Outcome.REFUSED)
    elif how == "stop failed":
        climbed = node.result("restart_process", Outcome.FAILED)
    else:
        node.clock.advance(node.policy.escalation.restart_process_timeout_s)
        climbed = node.tick()
    assert node.kinds(climbed) == ["quarantine_node", "reboot_node"]
    assert node.all_kinds().count("reset_gpu") == (2 if how == "refused again" else 1)


def test_an_xid48_after_its_dbe_counter_change_is_the_same_incident_and_one_reset():
    """The counter is read at 1 Hz and may be seen first: the Xid that follows names it, one incident either way."""
    node = Node()
    assert node.event(EventKind.ECC_DBE) is not None  # held briefly for the Xid that names it
    assert node.all_kinds() == []
    node.clock.advance(1)
    named = node.xid(48)
    assert node.kinds(named) == ["quarantine_gpu", "reset_gpu"]
    assert node.outcomes == [correlate.Outcome.NEW, correlate.Outcome.NAMED]
    (incident,) = node.corr.open_incidents()
    assert incident.xid == 48 and incident.fault_key == "xid:48" and "ecc_dbe" in incident.secondary_keys
    node.clock.advance(1)
    node.xid(45)  # its cleanup folds in too
    assert len(node.corr.open_incidents()) == 1 and node.all_kinds() == ["quarantine_gpu", "reset_gpu"]


def test_a_dbe_counter_change_no_xid_names_is_reset_once_its_hold_ends():
    node = Node()
    node.event(EventKind.ECC_DBE)
    hold_s = node.policy.escalation.counter_hold_s
    node.clock.advance(hold_s - 1)
    assert node.kinds(node.tick()) == []
    node.clock.advance(1)
    assert node.kinds(node.tick()) == ["quarantine_gpu", "reset_gpu"]


@pytest.mark.parametrize("counter_first", [False, True])
def test_a_contained_xid94_restarts_the_application_and_its_dbe_counter_does_not_reset_the_gpu(counter_first):
    """NVIDIA: Xid 94 is contained, restart the application; the GPU is reset to remap only when convenient."""
    node = Node()
    if counter_first:
        node.event(EventKind.ECC_DBE)
        node.clock.advance(1)
        node.xid(94)
    else:
        node.xid(94)
        node.clock.advance(1)
        node.event(EventKind.ECC_DBE)
    node.clock.advance(1)
    node.event(EventKind.ROW_REMAP_PENDING, remapped_rows_uncorrectable=1)
    assert node.all_kinds() == ["restart_process"]
    assert len(node.corr.open_incidents()) == 1
    ticket = node.ticket()
    assert ticket.rung is escalation.Rung.RESTART_PROCESS and ticket.held == ()

    # The restart is done: the GPU stays in service, its remap waits for it to drain (no kill, no quarantine).
    node.clock.advance(5)
    restarted = node.result("restart_process", Outcome.SUCCEEDED)
    assert node.kinds(restarted) == [] and node.ticket().state is TicketState.DRAINING
    assert escalation.draining_gpus(node.state) == ("GPU-1",)
    node.clock.advance(3600)
    assert node.kinds(node.tick()) == []
    drained = node._take(escalation.gpu_idle(node.state, "GPU-1", now_s=node.clock.now, policy=node.policy.escalation))
    assert node.kinds(drained) == ["quarantine_gpu", "reset_gpu"]
    node.result("reset_gpu", Outcome.SUCCEEDED)
    released = node.result("run_validation", Outcome.SUCCEEDED, "pass")
    assert node.kinds(released) == ["release"] and node.ticket().state is TicketState.WATCHING
    assert node.all_kinds().count("restart_process") == 1


def test_a_drained_reset_refused_after_all_gives_the_gpu_back_and_waits_for_the_next_drain():
    node = Node()
    node.xid(94)
    node.result("restart_process", Outcome.SUCCEEDED)
    node._take(escalation.gpu_idle(node.state, "GPU-1", now_s=node.clock.now, policy=node.policy.escalation))
    refused = node.result("reset_gpu", Outcome.REFUSED)  # work started on it meanwhile: no kill for a remap
    assert node.kinds(refused) == ["release"]
    assert node.ticket().state is TicketState.DRAINING and node.ticket().held == ()


def test_a_fault_back_while_the_remap_waits_for_the_drain_climbs_to_a_real_reset():
    node = Node()
    node.xid(94)
    node.clock.advance(5)
    node.result("restart_process", Outcome.SUCCEEDED)
    node.clock.advance(600)
    again = node.xid(94)
    assert node.kinds(again) == ["quarantine_gpu", "reset_gpu"]
    refused = node.result("reset_gpu", Outcome.REFUSED)  # a repair reset stops the processes (item 4)
    assert node.kinds(refused) == ["restart_process"]


# ---- drains before repairs (issue #38 item 1) ---------------------------------------------------


def _draining(**escalation_fields: object) -> Node:
    fields = {"drain_before": ("reset_gpu", "reboot_node"), "drain_deadline_s": 300.0, **escalation_fields}
    return Node(policy.RemediationPolicy(escalation=policy.EscalationPolicy(**fields)))


def test_a_reboot_waits_for_its_drain_and_the_node_takes_no_gpu_action_meanwhile():
    node = _draining(drain_pods="all")
    decision = node.xid(79, gpu="GPU-3")
    assert node.kinds(decision) == ["quarantine_node", "drain_node"]
    drain = decision.actions[1]
    assert isinstance(drain, actions.DrainNode)
    assert (drain.pods, drain.deadline_s, drain.repair_kind) == ("all", 300.0, "reboot_node")

    node.clock.advance(30)
    assert node.kinds(node.xid(13, gpu="GPU-1")) == [], "no reset while the node drains for its reboot"

    drained = node.result("drain_node", Outcome.SUCCEEDED)
    assert node.kinds(drained) == ["reboot_node"]
    assert "drain_node succeeded" in drained.reason
    assert node.state.node_command_id == drained.actions[0].command_id
    node.result("reboot_node", Outcome.SUCCEEDED)
    passed = node.result("run_validation", Outcome.SUCCEEDED, "pass")
    assert any(isinstance(a, actions.Release) and not a.gpu_uuid for a in passed.actions)


def test_a_reset_waits_for_its_drain():
    node = _draining()
    node.xid(13)
    node.result("restart_process", Outcome.SUCCEEDED)
    node.clock.advance(600)

    again = node.xid(13)
    assert node.kinds(again) == ["quarantine_gpu", "drain_node"]
    assert again.actions[1].gpu_uuid == "GPU-1" and again.actions[1].pods == "gpu"
    assert node.kinds(node.result("drain_node", Outcome.SUCCEEDED)) == ["reset_gpu"]
    assert node.kinds(node.result("reset_gpu", Outcome.SUCCEEDED)) == ["run_validation"]


def test_a_blocked_drain_asks_an_operator_and_starts_no_repair():
    node = _draining()
    node.xid(79, gpu="GPU-3")

    blocked = node.result("drain_node", Outcome.FAILED)

    assert node.kinds(blocked) == ["notify"]
    assert node.ticket("GPU-3").state is TicketState.AWAITING_OPERATOR
    assert node.ticket("GPU-3").held == ("node",), "the node stays quarantined"
    assert "reboot_node" not in node.all_kinds()
    assert blocked.actions[0].severity == "error" and "operator" in blocked.actions[0].summary

    ticket_id = node.ticket("GPU-3").ticket_id
    released = escalation.operator_release(node.state, ticket_id, now_s=node.clock.now, policy=node.policy.escalation)
    assert [a.kind for a in released.actions] == ["run_validation"]


def test_a_blocked_drain_message_reaches_the_notice():
    node = _draining()
    node.xid(79, gpu="GPU-3")
    cmd = node.pending("drain_node")
    words = "The disruption budget trainer-pdb needs 2 healthy pods and has 2 currently"

    decision = node._take(
        escalation.on_result(
            node.state, escalation.ActionResult(cmd, Outcome.FAILED, message=f"DrainBlockedError: {words}"),
            now_s=node.clock.now, policy=node.policy.escalation,
        )
    )  # fmt: skip

    assert words in decision.actions[0].summary and words in decision.reason
    assert any(words in line for line in node.ticket("GPU-3").history)


def test_escalate_goes_ahead_with_the_repair_and_says_so():
    node = _draining(drain_on_timeout="escalate")
    node.xid(79, gpu="GPU-3")

    blocked = node.result("drain_node", Outcome.FAILED)

    assert node.kinds(blocked) == ["notify", "reboot_node"]
    assert blocked.actions[0].severity == "warning" and "escalate" in blocked.actions[0].summary
    assert node.state.node_command_id == blocked.actions[1].command_id


def test_a_drain_that_never_answers_times_out_after_its_deadline_and_a_minute():
    node = _draining()
    node.xid(79, gpu="GPU-3")

    node.clock.advance(300 + 59)
    assert node.kinds(node.tick()) == []
    node.clock.advance(2)
    timed_out = node.tick()

    assert node.kinds(timed_out) == ["notify"]
    assert node.ticket("GPU-3").state is TicketState.AWAITING_OPERATOR


def test_drain_policy_names_a_bad_value():
    with pytest.raises(policy.PolicyError, match=r"escalation\.drain_before"):
        policy.RemediationPolicy.from_mapping({"escalation": {"drain_before": ["restart_process"]}})
    with pytest.raises(policy.PolicyError, match=r"escalation\.drain_on_timeout"):
        policy.RemediationPolicy.from_mapping({"escalation": {"drain_on_timeout": "ignore"}})
