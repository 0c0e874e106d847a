"""Commands run once per id, respect deadlines, and confirm caps by read-back."""

from __future__ import annotations

import itertools
import json
import sys

import pytest

from rasd.agent import actions, node_ops, runtime, spool
from rasd.agent import settings as agent_settings
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


# -- destructive actions ---------------------------------------------------------------------------


def _armed(destructive=True):
    backend = simulated.SimulatedBackend("n", 2, 0, workload=simulated.StepWorkload())
    ops = node_ops.SimulatedNodeOps(backend)
    ticks = itertools.count(1_000)
    executor = actions.ActionExecutor(
        backend,
        spool.Spool(":memory:"),
        clock=lambda: next(ticks),
        ops=ops,
        settings=agent_settings.ActionSettings(destructive_enabled=destructive, kill_poll_s=0.0),
        sleep=lambda _s: None,
    )
    return backend, ops, executor


def _cmd(action, command_id="c"):
    return model.Command(command_id, 0, 0, "test", action)


def test_reset_is_refused_while_processes_run_and_succeeds_after_a_restart():
    backend, ops, executor = _armed()
    uuid = backend.inventory()[0].uuid
    refused = executor.execute(_cmd(model.ResetGpu(uuid), "r1"))
    assert refused.outcome is model.ActionOutcome.REFUSED and "still run" in refused.message
    restarted = executor.execute(_cmd(model.RestartProcess(uuid, grace_s=1.0), "p1"))
    assert restarted.outcome is model.ActionOutcome.SUCCEEDED and "SIGTERM" in restarted.message
    assert ops.compute_pids(uuid) == []
    assert executor.execute(_cmd(model.ResetGpu(uuid), "r2")).outcome is model.ActionOutcome.SUCCEEDED


def test_reset_applies_a_pending_row_remap():
    backend, _ops, executor = _armed()
    uuid = backend.inventory()[1].uuid
    backend.fire(simulated.ScriptedFault(at_s=0, kind="row_remap_pending", gpu=1), 0)
    executor.execute(_cmd(model.RestartProcess(uuid), "p"))
    executor.execute(_cmd(model.ResetGpu(uuid), "r"))
    assert {c.gpu_uuid: c.remapped_rows_pending for c in backend.read_counters(0)}[uuid] is False


def test_reboot_is_journaled_before_it_runs_and_never_repeated():
    _backend, ops, executor = _armed()
    first = executor.execute(_cmd(model.RebootNode(), "boot-1"))
    again = executor.execute(_cmd(model.RebootNode(), "boot-1"))
    assert first.outcome is model.ActionOutcome.SUCCEEDED
    assert again.replayed and ops.reboots == 1


def test_validation_fails_the_sdc_gpu_and_names_it():
    backend, _ops, executor = _armed()
    bad = backend.inventory()[1].uuid
    backend.fire(simulated.ScriptedFault(at_s=0, kind="sdc", gpu=1), 0)
    result = executor.execute(_cmd(model.RunValidation("accusation"), "v"))
    assert result.outcome is model.ActionOutcome.SUCCEEDED
    assert result.validation_verdict == "fail"
    assert [(gpu, verdict) for _, gpu, verdict, _ in result.check_verdicts if verdict == "fail"] == [(bad, "fail")]
    replay = executor.execute(_cmd(model.RunValidation("accusation"), "v"))
    assert replay.replayed and replay.check_verdicts == result.check_verdicts


def test_without_enablement_destructive_actions_stay_dry_run():
    backend, ops, executor = _armed(destructive=False)
    uuid = backend.inventory()[0].uuid
    assert executor.execute(_cmd(model.ResetGpu(uuid))).outcome is model.ActionOutcome.DRY_RUN
    assert ops.compute_pids(uuid) != [] and ops.reboots == 0


def _python(code: str) -> tuple[str, ...]:
    return (sys.executable, "-c", code)


def test_host_ops_read_processes_from_the_listing_command():
    ops = node_ops.HostNodeOps(
        agent_settings.CommandSettings(
            list_compute_apps=_python("print('GPU-a, 123'); print('GPU-b, 456'); print('GPU-a, 789')")
        )
    )
    assert ops.compute_pids("GPU-a") == [123, 789]
    assert ops.compute_pids("GPU-c") == []


def test_host_ops_failures_name_the_command_and_its_answer():
    ops = node_ops.HostNodeOps(
        agent_settings.CommandSettings(reset_gpu=_python("import sys; sys.exit('GPU {gpu_uuid} is busy')"))
    )
    with pytest.raises(node_ops.NodeOpError, match="exit 1: GPU GPU-x is busy"):
        ops.reset_gpu("GPU-x")
    with pytest.raises(node_ops.NodeOpError, match="not found"):
        node_ops.HostNodeOps(agent_settings.CommandSettings(reboot=("/nonexistent/reboot",))).reboot()


def test_host_ops_read_the_validation_report():
    report = {
        "schema": "rasd.validation.report/v1",
        "suite": "quick",
        "verdict": "fail",
        "duration_s": 1.5,
        "checks": [{"check": "V1", "gpus": [{"gpu": "GPU-a", "verdict": "fail", "evidence": [{"index": 7}]}]}],
    }
    code = f"import sys; print({json.dumps(json.dumps(report))}); sys.exit(1)"
    ops = node_ops.HostNodeOps(agent_settings.CommandSettings(validate=_python(code)))
    run = ops.run_validation("quick", ["GPU-a"], 3, timeout_s=30)
    assert run.verdict == "fail"
    assert run.checks[0][:3] == ("V1", "GPU-a", "fail")


def test_power_smoothing_is_applied_where_supported_and_refused_where_not():
    ticks = itertools.count(1_000)
    b200 = simulated.SimulatedBackend("n", 2, 0, workload=simulated.StepWorkload(), gpu_model=simulated.B200)
    executor = actions.ActionExecutor(b200, spool.Spool(":memory:"), clock=lambda: next(ticks))
    profile = model.SetPowerSmoothing((), True, 60.0, 200.0, 100.0)
    result = executor.execute(_cmd(profile, "s1"))
    assert result.outcome is model.ActionOutcome.SUCCEEDED
    # The floor holds draw up during the communication phase (demand ~100-150 W, floor 600 W).
    assert min(r.power_w for t in range(20) for r in b200.read_power(t * 100_000_000)) >= 590
    _, _, h100_executor = _armed()
    refused = h100_executor.execute(_cmd(profile, "s2"))
    assert refused.outcome is model.ActionOutcome.NOT_SUPPORTED


def test_the_trough_filler_hook_holds_the_floor_on_gpus_without_smoothing_hardware():
    # Not destructive: it runs with destructive actions off.
    h100, _, executor = _armed(destructive=False)
    result = executor.execute(_cmd(model.SetTroughFiller((), True, 550.0, 10.0), "f1"))
    assert result.outcome is model.ActionOutcome.SUCCEEDED, result.message
    assert min(r.power_w for t in range(20) for r in h100.read_power(t * 100_000_000)) >= 540
    off = executor.execute(_cmd(model.SetTroughFiller((), False, 550.0, 0.0), "f2"))  # at once (no ramp)
    assert off.outcome is model.ActionOutcome.SUCCEEDED
    # From the next steps on (the ones already run keep their floor) the troughs are back.
    assert min(r.power_w for t in range(100, 120) for r in h100.read_power(t * 100_000_000)) < 200


def test_a_bad_trough_filler_floor_is_refused_naming_the_field():
    _, _, executor = _armed()
    result = executor.execute(_cmd(model.SetTroughFiller((), True, float("nan"), 10.0)))
    assert result.outcome is model.ActionOutcome.FAILED
    assert "set_trough_filler.floor_w" in result.message


def test_without_a_hook_the_trough_filler_is_not_supported():
    backend = simulated.SimulatedBackend("n", 1, 0, workload=simulated.StepWorkload())
    ticks = itertools.count(1_000)
    bare = actions.ActionExecutor(backend, spool.Spool(":memory:"), clock=lambda: next(ticks))
    assert bare.execute(_cmd(model.SetTroughFiller((), True, 500.0, 0.0))).outcome is model.ActionOutcome.NOT_SUPPORTED
    host = actions.ActionExecutor(
        backend, spool.Spool(":memory:"), clock=lambda: next(ticks), ops=node_ops.HostNodeOps()
    )
    result = host.execute(_cmd(model.SetTroughFiller((), True, 500.0, 0.0), "h"))
    assert result.outcome is model.ActionOutcome.NOT_SUPPORTED
    assert "commands.trough_filler" in result.message


def test_host_ops_run_the_configured_trough_filler_hook_with_its_arguments(tmp_path):
    out = tmp_path / "hook.txt"
    code = f"import sys; open({str(out)!r}, 'w').write(' '.join(sys.argv[1:]))"
    ops = node_ops.HostNodeOps(
        agent_settings.CommandSettings(trough_filler=(*_python(code), "--gpus", "{gpu_uuids}", "--floor-w", "{floor_w}",
                                             "--ramp-down-w-per-s", "{ramp_down_w_per_s}"))
    )  # fmt: skip
    ops.fill_troughs(["GPU-a", "GPU-b"], 512.4, 9.76)
    assert out.read_text() == "--gpus GPU-a,GPU-b --floor-w 512 --ramp-down-w-per-s 9.8"


@pytest.mark.parametrize("agent_clock_off_s", [-7200, 0, 7200])
def test_a_command_deadline_is_a_span_from_arrival_on_the_agent_clock(agent_clock_off_s):
    issued = 1_800_000_000 * 10**9  # controller clock
    command = model.Command("c", issued, issued + 30 * 10**9, "test", model.RebootNode())
    arrived = issued + agent_clock_off_s * 10**9 + 5 * 10**6  # agent clock, 5 ms in transit
    local = runtime.on_local_clock(command, arrived)
    assert local.deadline_unix_ns == arrived + 30 * 10**9
    assert (
        runtime.on_local_clock(
            model.Command("d", issued, 0, "no deadline", model.RebootNode()), arrived
        ).deadline_unix_ns
        == 0
    )


def test_a_deadline_the_controller_put_on_the_agent_clock_is_kept_as_given():
    issued = 1_800_000_000 * 10**9
    command = model.Command("c", issued, issued + 30 * 10**9, "test", model.RebootNode(), deadline_agent_unix_ns=7)
    assert runtime.on_local_clock(command, issued + 60 * 10**9).deadline_unix_ns == 7


# ---- caps survive reboots and resets --------------------------------------------------------------


def _limits(backend):
    return {c.gpu_uuid: c.enforced_power_limit_w for c in backend.read_counters(0)}


def test_a_reboot_or_reset_puts_back_the_last_confirmed_caps_and_never_raises():
    backend, ops, executor = _armed()
    uuids = [g.uuid for g in backend.inventory()]
    executor.execute(_cmd(model.SetPowerCap(limits_w={uuids[0]: 400, uuids[1]: 450}), "cap-1"))
    assert _limits(backend) == {uuids[0]: 400, uuids[1]: 450}

    executor.execute(_cmd(model.RebootNode(), "boot-1"))
    assert ops.reboots == 1
    assert _limits(backend) == {uuids[0]: 400, uuids[1]: 450}, "the reboot's default limits did not stay"

    for uuid in uuids:  # a reset needs the GPU free
        executor.execute(_cmd(model.RestartProcess(uuid, grace_s=0.0), f"p-{uuid}"))
    reset = executor.execute(_cmd(model.ResetGpu(uuids[1]), "r1"))
    assert reset.outcome is model.ActionOutcome.SUCCEEDED
    assert reset.enforced_limits_w == {uuids[1]: 450}
    assert _limits(backend)[uuids[1]] == 450

    # Lower by hand (a fail-safe, an operator): a restore never raises it back up.
    backend.set_power_limit(uuids[0], 300)
    assert executor.restore_power_caps() == {}
    assert _limits(backend)[uuids[0]] == 300


def test_caps_are_restored_from_the_spool_by_a_new_agent_process(tmp_path):
    path = str(tmp_path / "spool.db")
    backend = simulated.SimulatedBackend("n", 2, 0)
    ticks = itertools.count(1_000)
    executor = actions.ActionExecutor(backend, spool.Spool(path), clock=lambda: next(ticks))
    uuids = [g.uuid for g in backend.inventory()]
    executor.execute(_cmd(model.SetPowerCap(limits_w=dict.fromkeys(uuids, 500)), "cap-1"))

    rebooted = simulated.SimulatedBackend("n", 2, 0)  # the machine came back: default limits
    assert set(_limits(rebooted).values()) == {simulated.H100_SXM.power_limit_default_w}
    fresh = actions.ActionExecutor(rebooted, spool.Spool(path), clock=lambda: next(ticks))
    assert fresh.restore_power_caps() == dict.fromkeys(uuids, 500)
    assert set(_limits(rebooted).values()) == {500}


# -- slewing raises ---------------------------------------------------------------------------------


class _Clock:
    """The agent's unix-ns clock, moved by the test."""

    def __init__(self, now_s: float) -> None:
        self.now_s = now_s

    def __call__(self) -> int:
        return int(self.now_s * 1e9)


def _slewing():
    backend = simulated.SimulatedBackend("n", 2, 0, workload=simulated.StepWorkload())
    clock = _Clock(100.0)
    executor = actions.ActionExecutor(backend, spool.Spool(":memory:"), clock=clock)
    gpus = [g.uuid for g in backend.inventory()]
    executor.execute(model.Command("low", 0, 0, "t", model.SetPowerCap(limits_w=dict.fromkeys(gpus, 200))))
    return backend, executor, clock, gpus


def _enforced(backend):
    return [c.enforced_power_limit_w for c in backend.read_counters(0)]


def test_a_raise_with_a_rate_is_answered_at_once_with_its_target_and_slewed():
    backend, executor, clock, gpus = _slewing()
    raise_ = model.SetPowerCap(limits_w=dict.fromkeys(gpus, 400), max_raise_w_per_s=dict.fromkeys(gpus, 100.0))
    result = executor.execute(model.Command("up", 0, 0, "t", raise_))
    assert result.outcome is model.ActionOutcome.SUCCEEDED
    assert result.enforced_limits_w == dict.fromkeys(gpus, 200), "the limit read back now"
    assert result.slew_targets_w == dict.fromkeys(gpus, 400), "and where it is going"
    assert _enforced(backend) == [200, 200]
    assert [c.power_limit_slew_target_w for c in executor.read_counters(0)] == [400, 400]
    observed = []
    for _ in range(20):
        clock.now_s += 0.1
        assert executor.step_slews() == []
        observed.append(_enforced(backend)[0])
    assert observed[:3] == [210, 220, 230] and observed[-1] == 400
    assert max(b - a for a, b in zip([200, *observed], observed, strict=False)) <= 10, "10 W per 0.1 s"
    assert [c.power_limit_slew_target_w for c in executor.read_counters(0)] == [None, None], "arrived"


def test_a_new_command_replaces_the_slew_and_a_decrease_goes_at_once():
    backend, executor, clock, gpus = _slewing()
    rate = dict.fromkeys(gpus, 100.0)
    executor.execute(model.Command("up", 0, 0, "t", model.SetPowerCap(dict.fromkeys(gpus, 600), rate)))
    clock.now_s += 0.5
    executor.step_slews()
    assert _enforced(backend) == [250, 250]
    # A raise at a new rate starts from where the limit is: no stacking of the two raises.
    executor.execute(
        model.Command("up2", 0, 0, "t", model.SetPowerCap(dict.fromkeys(gpus, 700), dict.fromkeys(gpus, 20.0)))
    )
    clock.now_s += 0.5
    executor.step_slews()
    assert _enforced(backend) == [260, 260]
    # A decrease (even one with a rate) is set at once and ends the slew.
    result = executor.execute(model.Command("down", 0, 0, "t", model.SetPowerCap(dict.fromkeys(gpus, 230), rate)))
    assert result.enforced_limits_w == dict.fromkeys(gpus, 230) and result.slew_targets_w == {}
    clock.now_s += 1.0
    executor.step_slews()
    assert _enforced(backend) == [230, 230]


def test_without_a_rate_a_raise_is_set_at_once_as_before():
    backend, executor, _, gpus = _slewing()
    result = executor.execute(model.Command("up", 0, 0, "t", model.SetPowerCap(dict.fromkeys(gpus, 500))))
    assert result.enforced_limits_w == dict.fromkeys(gpus, 500) and result.slew_targets_w == {}
    assert _enforced(backend) == [500, 500]


def test_a_slew_stops_where_it_is_when_cancelled_and_the_journal_keeps_its_target():
    backend, executor, clock, gpus = _slewing()
    executor.execute(
        model.Command("up", 0, 0, "t", model.SetPowerCap(dict.fromkeys(gpus, 600), dict.fromkeys(gpus, 100.0)))
    )
    clock.now_s += 0.3
    executor.step_slews()
    executor.cancel_slews()  # the fail-safe: the agent never raises on its own
    clock.now_s += 1.0
    executor.step_slews()
    assert _enforced(backend) == [230, 230]
    assert executor._journal.power_caps() == dict.fromkeys(gpus, 600), "restores only ever lower"


def test_a_replayed_slewing_raise_reports_its_target_again():
    _, executor, _, gpus = _slewing()
    command = model.Command("up", 0, 0, "t", model.SetPowerCap(dict.fromkeys(gpus, 600), dict.fromkeys(gpus, 100.0)))
    first = executor.execute(command)
    again = executor.execute(command)
    assert again.replayed and again.slew_targets_w == first.slew_targets_w == dict.fromkeys(gpus, 600)
