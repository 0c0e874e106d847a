"""Commands run once per id, respect deadlines, and confirm caps by read-back."""

from __future__ import annotations

import itertools

from rasd.agent import actions, spool
from rasd.agent.core import model
from rasd.agent.gpu import simulated


def _executor():
    backend = simulated.SimulatedBackend("n", 2, 0, workload=simulated.StepWorkload())
    ticks = itertools.count(1_000)
    return backend, actions.ActionExecutor(backend, spool.Spool(":memory:"), clock=lambda: next(ticks))


def _cap_command(backend, watts, command_id="cmd-1", deadline=0):
    limits = {g.uuid: watts for g in backend.inventory()}
    return model.Command(command_id, 0, deadline, "test", model.SetPowerCap(limits_w=limits))


def test_power_cap_is_applied_and_read_back():
    backend, executor = _executor()
    result = executor.execute(_cap_command(backend, 450))
    assert result.outcome is model.ActionOutcome.SUCCEEDED
    assert set(result.enforced_limits_w.values()) == {450}
    assert {c.enforced_power_limit_w for c in backend.read_counters(0)} == {450}


def test_a_repeated_command_id_is_answered_not_rerun():
    backend, executor = _executor()
    first = executor.execute(_cap_command(backend, 450))
    # The same id with a different body must not change anything: the id is the idempotency key.
    again = executor.execute(_cap_command(backend, 300))
    assert again.replayed and not first.replayed
    assert again.enforced_limits_w == first.enforced_limits_w
    assert {c.enforced_power_limit_w for c in backend.read_counters(0)} == {450}


def test_partial_failure_reports_what_was_enforced():
    backend, executor = _executor()
    good = backend.inventory()[0].uuid
    command = model.Command("c", 0, 0, "t", model.SetPowerCap(limits_w={good: 400, "GPU-missing": 400}))
    result = executor.execute(command)
    assert result.outcome is model.ActionOutcome.FAILED
    assert result.enforced_limits_w == {good: 400}
    assert "GPU-missing" in result.message


def test_command_past_its_deadline_is_not_started():
    backend, executor = _executor()
    result = executor.execute(_cap_command(backend, 450, deadline=10))
    assert result.outcome is model.ActionOutcome.TIMED_OUT
    assert {c.enforced_power_limit_w for c in backend.read_counters(0)} == {700}


def test_destructive_actions_are_dry_run():
    backend, executor = _executor()
    uuid = backend.inventory()[0].uuid
    result = executor.execute(model.Command("r", 0, 0, "xid 79", model.ResetGpu(uuid)))
    assert result.outcome is model.ActionOutcome.DRY_RUN
    assert uuid in result.message
