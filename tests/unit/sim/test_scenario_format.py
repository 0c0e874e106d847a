"""The scenario format's repair faults, bare Xids and IB flaps, and what the simulated node does with them.

The executor and the simulated node are the agent's own (`ActionExecutor`, `SimulatedNodeOps`): a
scripted fault must reach the controller as the outcome a real node would give (FAILED, no answer,
REFUSED again, a node that is gone).
"""

from __future__ import annotations

import itertools
import threading
import time

import pytest

from rasd.agent import actions, node_ops, spool
from rasd.agent import settings as agent_settings
from rasd.agent.core import model
from rasd.agent.gpu import simulated
from rasd.controller.executors import bmc
from rasd.sim import bmc as sim_bmc
from rasd.sim import report, scenario

Outcome = model.ActionOutcome


def _node(*faults: simulated.ActionFault):
    backend = simulated.SimulatedBackend("n", 2, 0, workload=simulated.StepWorkload(period_s=1.0))
    ops = node_ops.SimulatedNodeOps(backend, faults)
    ticks = itertools.count(1_000)
    executor = actions.ActionExecutor(
        backend,
        spool.Spool(":memory:"),
        clock=lambda: next(ticks),
        ops=ops,
        settings=agent_settings.ActionSettings(destructive_enabled=True, kill_poll_s=0.0),
        sleep=lambda _s: None,
    )
    return backend, ops, executor


def _run(executor, action, command_id):
    return executor.execute(model.Command(command_id, 0, 0, "test", action))


def test_a_bare_xid_reports_the_kernel_log_line_and_moves_no_counter():
    backend = simulated.SimulatedBackend("n", 1, 0)
    gpu = backend.inventory()[0].uuid
    backend.fire(simulated.ScriptedFault(at_s=0, kind="xid", xid=48, bare=True), 1)
    backend.fire(simulated.ScriptedFault(at_s=0, kind="xid", xid=79, bare=True), 2)
    assert [o.xid for o in backend.poll_events(3, 0)] == [48, 79]
    (counters,) = backend.read_counters(3)
    assert counters.ecc_dbe_volatile == 0 and not backend.workload_crashed(gpu)
    backend.fire(simulated.ScriptedFault(at_s=0, kind="xid", xid=48), 4)  # not bare: the DBE counter moves
    assert backend.read_counters(5)[0].ecc_dbe_volatile == 1


def test_an_ib_flap_names_its_port_and_the_timing_of_each_flap():
    backend = simulated.SimulatedBackend("n", 1, 0)
    fault = simulated.ScriptedFault(at_s=0, kind="ib_link_flap", ib_port="mlx5_3/2", flap_down_s=0.5, flap_at_s=(0, 4))
    backend.fire(fault, 0)
    seen = backend.poll_events(10 * 10**9, 0)
    assert [(o.observed_unix_ns / 1e9, o.attributes["ib_state"]) for o in seen] == [
        (0.0, "DOWN"),
        (0.5, "ACTIVE"),
        (4.0, "DOWN"),
        (4.5, "ACTIVE"),
    ]
    assert {(o.attributes["ib_device"], o.attributes["ib_port"]) for o in seen} == {("mlx5_3", "2")}
    assert "mlx5_3: Port 2 Link DOWN" in seen[0].message
    regular = simulated.ScriptedFault(at_s=0, kind="ib_link_flap", count=3, flap_every_s=5.0)
    assert regular.flap_offsets_s() == (0.0, 5.0, 10.0)


@pytest.mark.parametrize(
    ("table", "error"),
    [
        ({"at_s": 0, "kind": "ib_link_flap", "ib_port": "mlx5_0"}, r"faults\[0\]: ib_port must be \"device/port\""),
        ({"at_s": 0, "kind": "ib_link_flap", "flap_at_s": [0, 0.5]}, r"flap_at_s must rise by more than flap_down_s"),
        ({"at_s": 0, "kind": "ib_link_flap", "flap_every_s": 1.0}, r"flap_every_s > flap_down_s"),
        ({"at_s": 0, "kind": "ecc_dbe", "bare": True}, r"bare applies to an xid fault only"),
        ({"at_s": "soon", "kind": "xid", "xid": 13}, r"at_s must be a number"),
    ],
)
def test_a_bad_fault_table_names_what_is_wrong(table, error):
    with pytest.raises(scenario.ScenarioError, match=error):
        scenario.parse({"faults": [table]}, source="t")


@pytest.mark.parametrize(
    ("table", "error"),
    [
        (
            {"action": "reset_gpu", "outcome": "never_returns"},
            r"action_faults\[0\]: outcome 'never_returns' of reset_gpu",
        ),
        ({"action": "format_disk", "outcome": "fail"}, r"action_faults\[0\]: action 'format_disk' is not one of"),
        ({"action": "reset_gpu", "outcome": "fail", "times": -1}, r"times must be an integer ≥ 0"),
        ({"action": "reset_gpu", "outcome": "fail", "colour": "red"}, r"unknown key\(s\) colour"),
        ({"action": "reset_gpu", "outcome": "fail", "node": -2}, r"action_faults\[0\]\.node"),
    ],
)
def test_a_bad_action_fault_names_what_is_wrong(table, error):
    with pytest.raises(scenario.ScenarioError, match=error):
        scenario.parse({"action_faults": [table]}, source="t")


@pytest.mark.parametrize(
    ("table", "error"),
    [
        ({"at_s": 1, "action": "release", "node": 0, "force": "yes"}, r"operator\[0\]\.force: expected true or false"),
        ({"at_s": 1, "action": "quarantine"}, r"operator\[0\]\.node: expected a number"),
        ({"at_s": 1, "action": "drain"}, r"operator\[0\]\.action: 'drain' is not one of"),
        ({"at_s": 1, "action": "release", "node": 0, "forse": True}, r"unknown key\(s\) for release: forse"),
    ],
)
def test_a_bad_operator_action_names_what_is_wrong(table, error):
    with pytest.raises(scenario.ScenarioError, match=error):
        scenario.parse({"operator": [table]}, source="t")


def test_operator_actions_by_hand_name_a_gpu_or_the_node():
    parsed = scenario.parse(
        {"operator": [
            {"at_s": 1, "action": "quarantine", "node": 2, "gpu": 5, "reason": "fan"},
            {"at_s": 2, "action": "release", "node": 2, "force": True},
            {"at_s": 3, "action": "pause_automation", "reason": "window"},
        ]},
        source="t",
    )  # fmt: skip
    assert [(a.action, a.node, a.gpu, a.force) for a in parsed.operator] == [
        ("quarantine", 2, 5, False), ("release", 2, None, True), ("pause_automation", 0, 0, False),
    ]  # fmt: skip


def test_a_bad_expectation_names_what_is_wrong():
    with pytest.raises(scenario.ScenarioError, match=r"expect.path: 'reboot:ok' is not kind\[:outcome\]"):
        scenario.parse({"expect": {"path": ["reboot:ok"]}}, source="t")
    with pytest.raises(scenario.ScenarioError, match=r"expect: unknown key\(s\) paths"):
        scenario.parse({"expect": {"paths": []}}, source="t")


def test_failing_and_hanging_repairs_reach_the_ladder_as_a_real_node_answers_them():
    faults = (
        simulated.ActionFault("reset_gpu", "fail", gpu=0, message="GPU reset failed"),
        simulated.ActionFault("reset_gpu", "hang", gpu=1, hang_s=30.0),
        simulated.ActionFault("run_validation", "verdict_fail", skip=1),
    )
    backend, ops, executor = _node(*faults)
    first, second = (g.uuid for g in backend.inventory())
    for gpu in (first, second):
        _run(executor, model.RestartProcess(gpu, grace_s=0.0), f"stop-{gpu}")  # a reset needs an idle GPU
    failed = _run(executor, model.ResetGpu(first), "r1")
    assert failed.outcome is Outcome.FAILED and failed.message == "GPU reset failed"
    assert _run(executor, model.ResetGpu(first), "r2").outcome is Outcome.SUCCEEDED  # times = 1

    hung: list[model.ActionResult] = []
    worker = threading.Thread(target=lambda: hung.append(_run(executor, model.ResetGpu(second), "r3")))
    worker.start()
    time.sleep(0.2)
    assert worker.is_alive() and not hung, "it hangs: the ladder's timeout answers for it"
    ops.close()  # the simulation stops: every hang ends
    worker.join(5)
    assert hung[0].outcome is Outcome.FAILED and "no answer within 30 s" in hung[0].message

    passed = _run(executor, model.RunValidation("post-repair", (first,), 1), "v1")
    failing = _run(executor, model.RunValidation("post-repair", (first,), 2), "v2")
    assert (passed.validation_verdict, failing.validation_verdict) == ("pass", "fail")


def test_processes_stuck_in_the_driver_survive_the_kill_and_the_reset_stays_refused():
    backend, ops, executor = _node(simulated.ActionFault("restart_process", "stuck"))
    gpu = backend.inventory()[0].uuid
    stopped = _run(executor, model.RestartProcess(gpu, grace_s=0.0), "p1")
    assert stopped.outcome is Outcome.SUCCEEDED and "SIGKILL" in stopped.message
    assert ops.compute_pids(gpu) != []
    assert _run(executor, model.ResetGpu(gpu), "r1").outcome is Outcome.REFUSED


def test_a_killed_workload_leaves_its_gpu_idle_until_the_next_boot():
    backend, ops, executor = _node()
    gpu = backend.inventory()[0].uuid
    busy_w = _draw_w(backend, gpu, 0.5)
    _run(executor, model.RestartProcess(gpu, grace_s=0.0), "p1")
    idle_w = _draw_w(backend, gpu, 4.5)
    ops.reboot()
    again_w = _draw_w(backend, gpu, 8.5)
    assert idle_w < 100 < min(busy_w, again_w)


def _draw_w(backend, gpu, at_s):
    """The GPU's highest draw over the second from at_s (covering a compute phase)."""
    return max(
        r.power_w for t in range(10) for r in backend.read_power(int((at_s + t / 10) * 1e9)) if r.gpu_uuid == gpu
    )


def test_a_reboot_that_never_comes_back_leaves_the_node_down_until_the_bmc_power_cycles_it():
    backend, ops, executor = _node(simulated.ActionFault("reboot_node", "never_returns"))
    cycler = sim_bmc.SimulatedBmc({"n": [simulated.ActionFault("power_cycle_bmc", "no_answer")]})
    cycler.attach("n", ops)
    done: list[model.ActionResult] = []
    worker = threading.Thread(target=lambda: done.append(_run(executor, model.RebootNode(), "boot")))
    worker.start()
    time.sleep(0.2)
    assert ops.down and backend.read_power(10**9) == [], "down: no GPU answers"
    with pytest.raises(bmc.BmcUnavailableError, match="does not answer"):
        cycler.power_cycle("n", reason="t", ticket_id="t1")
    assert ops.down and worker.is_alive()
    outcome = cycler.power_cycle("n", reason="t", ticket_id="t1")
    assert outcome.status is bmc.BmcStatus.POWERED_ON and cycler.cycles == ["n"]
    worker.join(5)
    assert not ops.down and len(backend.read_power(2 * 10**9)) == 2
    assert done[0].outcome is Outcome.SUCCEEDED  # journaled before it went down; the ladder timed it out long ago
    assert isinstance(cycler, bmc.BmcPowerCycler)


def test_the_ladder_path_lists_the_repairs_in_the_order_decided_with_their_outcomes():
    def row(kind, created, step, status, verdict=""):
        result = {"validation_verdict": verdict} if verdict else None
        return {"node_id": "node-000", "kind": kind, "created_unix_ns": created, "payload": {"step": step},
                "status": status, "result": result}  # fmt: skip

    outbox = [
        row("run_validation", 3, 4, "succeeded", "pass"),
        row("reset_gpu", 1, 1, "refused"),
        row("quarantine_gpu", 1, 0, "succeeded"),
        row("reset_gpu", 2, 3, "succeeded"),
        row("restart_process", 2, 2, "succeeded"),
        {**row("reboot_node", 1, 0, "pending"), "node_id": "node-001"},
    ]
    assert report.ladder_path(outbox, "node-000") == [
        "reset_gpu:refused",
        "restart_process:succeeded",
        "reset_gpu:succeeded",
        "run_validation:pass",
    ]


def test_the_ladder_library_loads_and_states_what_each_run_must_show():
    names = scenario.library_names("ladder")
    assert len(names) >= 15 and scenario.builtin_names() == ["demo", "job_hang", "straggler"]
    for name in names:
        loaded = scenario.load(name)
        assert loaded.name == name and loaded.description, name
        assert loaded.expect is not None and loaded.expect.tickets is not None, name


def test_the_stragglers_library_loads_one_scenario_per_kind_with_the_probes_clean_twin():
    names = scenario.library_names("stragglers")
    assert names == [
        "stragglers/job_slowdown",
        "stragglers/pcie_downtrain",
        "stragglers/slow_node",
        "stragglers/thermal_throttle",
    ]
    for name in names:
        loaded = scenario.load(name)
        assert loaded.name == name and loaded.description, name
        assert loaded.power is not None and not loaded.power.managed, name  # the edges unsmoothed, the twin stepped
        assert {f.fault.kind for f in loaded.faults} <= simulated.STRAGGLER_FAULTS, name
    assert len(scenario.load("stragglers/job_slowdown").faults) == 8  # every node of an 8-node fleet


def test_a_scenarios_stragglers_table_is_the_controllers_and_a_bad_key_is_named():
    parsed = scenario.parse({"stragglers": {"stall": {"min_steps": 5, "restart": False}}}, source="t")
    assert (parsed.stragglers.stall.min_steps, parsed.stragglers.stall.restart) == (5, False)
    assert scenario.parse({}, source="t").stragglers.stall.min_steps == 10  # the controller's default
    with pytest.raises(scenario.ScenarioError, match=r"^t: stragglers\.stall\.min_steps"):
        scenario.parse({"stragglers": {"stall": {"min_steps": 1}}}, source="t")
    hang = scenario.load("job_hang")
    assert [(f.node, f.fault.kind) for f in hang.faults] == [(1, "job_hang")]
    assert hang.expect is not None and hang.expect.path == ("restart_process:succeeded",)
