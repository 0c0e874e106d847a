"""rasd-sim goodput: ETTR arithmetic by hand, determinism, and decisions that come from the real core."""

from __future__ import annotations

import dataclasses
import json

import pytest

from rasd.common import xid_catalog
from rasd.controller.core.remediation import policy
from rasd.sim import goodput, goodput_cli, goodput_rasd, main
from rasd.sim import goodput_faults as gf

CATALOG = xid_catalog.load_catalog()
DAY_S = 86_400.0
SOFTWARE = gf.Variant(1.0, "", gf.FIX_JOB)


def _rasd(pol: policy.RemediationPolicy | None = None):
    return lambda world: goodput_rasd.RasdArm(world, pol or policy.RemediationPolicy(), CATALOG)


def _tiny(**changes) -> goodput.Params:
    values = {
        "gpus": 8,
        "spare_nodes": 1,
        "days": 1.0,
        "checkpoint_interval_s": 1000.0,
        "restart_s": 100.0,
        "crash_detect_s": 50.0,
        "detect_s": 5.0,
        "manual_delay_s": 600.0,
        **changes,
    }
    return goodput.Params(**values)


def test_ettr_of_one_software_crash_is_the_hand_computed_one():
    """Start 0-100 (restart), run 100-2000, crash: 900 s since the checkpoint at 1100 lost, 50 s to see it, restart."""
    fault = goodput.Fault(0, 2000.0, "software_bug", SOFTWARE, rank=0, gpu=0)
    result = goodput.simulate(_tiny(), [fault], goodput.BaselineArm)
    assert result.time_lost_h == pytest.approx(
        {"detection": 50 / 3600, "repair": 0.0, "restart": 200 / 3600, "lost_work": 900 / 3600}
    )
    # Kept: 1,900 s run - 900 s lost + (86,400 - 2,150) s after the restart.
    assert result.ettr == pytest.approx((1900 - 900 + 86_400 - 2150) / DAY_S)
    assert result.interruptions == {"software_bug": 1}


def test_a_hardware_fault_costs_the_baseline_its_manual_delay_and_rasd_its_detection():
    """Xid 48 on the only node: the baseline waits 50 s + 600 s for a person, rasd 5 s; both restart on the spare."""
    fault = goodput.Fault(0, 2000.0, "gpu_hbm3", gf.Variant(1.0, "xid:48", "reset_gpu"), rank=0, gpu=3)
    base = goodput.simulate(_tiny(), [fault], goodput.BaselineArm)
    rasd = goodput.simulate(_tiny(), [fault], _rasd())
    assert base.time_lost_h["detection"] == pytest.approx(50 / 3600)
    assert base.time_lost_h["repair"] == pytest.approx(600 / 3600)
    assert rasd.time_lost_h["detection"] == pytest.approx(5 / 3600)
    assert rasd.time_lost_h["repair"] == 0.0
    assert rasd.ettr - base.ettr == pytest.approx((50 + 600 - 5) / DAY_S)
    # The core's ladder for Xid 48: quarantine the GPU, reset it, validate, release.
    assert rasd.detail["commands"] == {"quarantine_gpu": 1, "reset_gpu": 1, "run_validation": 1, "release": 1}


def test_an_xid79_that_a_reboot_does_not_fix_climbs_to_rma_through_the_core():
    fault = goodput.Fault(0, 2000.0, "faulty_gpu", gf.Variant(1.0, "xid:79", "rma"), rank=0, gpu=1)
    rasd = goodput.simulate(_tiny(days=10.0), [fault], _rasd())
    commands = rasd.detail["commands"]
    assert commands["reboot_node"] == 1 and commands["open_rma"] == 1
    assert commands["release"] >= 2  # the node after its other GPUs passed, then the replaced GPU
    assert rasd.detail["open_tickets_at_end"] == 0


def test_the_same_seed_gives_the_same_report_and_another_seed_another():
    params = goodput.Params(gpus=1024, rate_scale=16.0, days=20.0, seed=7)

    def report(p):
        out = goodput_cli.run(p, policy.RemediationPolicy())
        out.pop("elapsed_s")
        return out

    assert report(params) == report(params)
    assert (
        report(params)["faults_by_cause"]
        != report(goodput.Params(gpus=1024, rate_scale=16.0, days=20.0, seed=8))["faults_by_cause"]
    )


def _small_run(pol: policy.RemediationPolicy, days: float = 30.0) -> dict:
    return goodput_cli.run(goodput.Params(gpus=1024, rate_scale=16.0, days=days, seed=3), pol)["arms"]["rasd"]


def test_a_classification_override_changes_the_repairs_the_sim_carries_out():
    default = _small_run(policy.RemediationPolicy())
    override = _small_run(
        policy.RemediationPolicy.from_mapping({"classification": {"xid_action_overrides": {48: "rma"}}})
    )
    assert default["commands"]["reset_gpu"] > 0
    assert override["commands"]["open_rma"] > default["commands"]["open_rma"]
    assert override["commands"].get("reset_gpu", 0) < default["commands"]["reset_gpu"]


def test_a_disruption_budget_of_zero_nodes_leaves_node_faults_to_people_and_costs_ettr():
    default = _small_run(policy.RemediationPolicy(), days=8.0)
    frozen = _small_run(policy.RemediationPolicy.from_mapping({"disruption": {"max_disrupted_nodes": 0}}), days=8.0)
    assert frozen["commands_deferred_by_budget"] > default["commands_deferred_by_budget"]
    assert frozen["left_to_person"] > default["left_to_person"]
    assert frozen["time_lost_h"]["repair"] > default["time_lost_h"]["repair"]
    assert frozen["ettr"] < default["ettr"]


def test_llama3_scale_runs_in_well_under_a_minute_at_the_published_rate():
    report = goodput_cli.run(goodput.Params(), policy.RemediationPolicy())
    assert report["elapsed_s"] < 60.0
    assert 419 - 4 * 21 < report["faults_injected"] < 419 + 4 * 21  # Poisson: 4 standard deviations
    assert report["arms"]["rasd"]["ettr"] > report["arms"]["baseline"]["ettr"]


def test_the_fault_table_is_llama3s():
    assert gf.total() == 419
    assert gf.rate_per_gpu_s() * 3600 == pytest.approx(1.97e-5, rel=0.01)  # ras-anchors.md §6: per GPU-hour
    for cause in gf.LLAMA3_CAUSES:
        assert sum(v.share for v in cause.variants) == pytest.approx(1.0), cause.name


def test_rasd_sim_goodput_writes_its_report(tmp_path, capsys):
    assert main.main(["goodput", "--gpus", "64", "--days", "5", "--rate-scale", "50", "--out", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "goodput.json").read_text())
    assert set(report["arms"]) == {"rasd", "baseline"}
    assert "Goal: ETTR ≥ 97% with rasd's policy" in (tmp_path / "goodput.md").read_text()
    assert "| ETTR |" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--repair-s", "reboot=5"], "--repair-s 'reboot=5': expected RUNG=SECONDS"),
        (["--repair-s", "reset_gpu=soon"], "--repair-s 'reset_gpu=soon': expected RUNG=SECONDS"),
        (["--gpus", "12"], "gpus: 12 is not a positive multiple of gpus_per_node 8"),
        (["--restart-s", "-1"], "restart_s: must be >= 0"),
    ],
)
def test_bad_parameters_are_named(argv, message, tmp_path, capsys):
    with pytest.raises(SystemExit) as exited:
        goodput_cli.main([*argv, "--out", str(tmp_path)])
    assert exited.value.code == 2
    assert message in capsys.readouterr().err


def test_a_bad_policy_file_is_named(tmp_path, capsys):
    bad = tmp_path / "policy.toml"
    bad.write_text("[remediation.escalation]\nmax_attempts_reset_gpu = -1\n")
    with pytest.raises(SystemExit):
        goodput_cli.main(["--policy", str(bad), "--out", str(tmp_path)])
    assert "max_attempts_reset_gpu: must be >= 0" in capsys.readouterr().err


def test_a_fault_while_every_node_is_out_and_no_spare_is_left_hits_nothing():
    host = gf.Variant(1.0, "", gf.FIX_PERSON, node_down=True)
    faults = [
        goodput.Fault(0, 2000.0, "psu", host, rank=0, gpu=0),
        goodput.Fault(1, 3000.0, "ssd", host, rank=0, gpu=0),
    ]
    result = goodput.simulate(_tiny(spare_nodes=0), faults, goodput.BaselineArm)
    assert result.interruptions == {"psu": 1} and result.faults_while_down == 0
    # Down from 2,000 s: 300 s until NotReady, then 600 s + 4 h for a person, with no spare to run on.
    assert result.time_lost_h["repair"] == pytest.approx((600 + 4 * 3600) / 3600)


def test_a_dead_host_is_quarantined_by_the_lost_node_watch_before_the_scheduler_sees_it_not_ready():
    """The host's agent falls silent and the job it runs hangs: at the stall (30 s) the leader takes the
    node, silent 20 s or more, for lost (the baseline's scheduler: 300 s). With no rhythm yet (the job
    restarted under 10 steps ago) the periodic check names it after 70 s."""
    fault = goodput.Fault(0, 2000.0, "psu", gf.HOST_DOWN, rank=0, gpu=0)
    base = goodput.simulate(_tiny(), [fault], goodput.BaselineArm)
    rasd = goodput.simulate(_tiny(), [fault], _rasd())
    assert goodput.Params().lost_node_detect_s == 70.0  # LostNodePolicy: lost after 60 s, checked every 10 s
    assert base.time_lost_h["detection"] == pytest.approx(300 / 3600)
    assert rasd.time_lost_h["detection"] == pytest.approx(30 / 3600)
    early = dataclasses.replace(fault, at=100.0 + 30.0)  # 5 steps after the first start (restart 100 s)
    assert goodput.simulate(_tiny(), [early], _rasd()).time_lost_h["detection"] == pytest.approx(70 / 3600)
    assert rasd.time_lost_h["repair"] == base.time_lost_h["repair"] == 0.0  # the spare takes its place at once
    # The core isolates the node and calls a person, who mends it; validation, then release.
    assert rasd.detail["commands"] == {"quarantine_node": 1, "notify": 1, "run_validation": 1, "release": 1}
    assert rasd.people == base.people == 1


def test_an_ib_port_flapping_is_a_flap_storm_to_the_core_and_a_person_mends_the_link():
    """Six state changes: the core quarantines the node and calls a person, who mends it; validation, release."""
    fault = goodput.Fault(0, 2000.0, "nic", gf.Variant(1.0, "ib_flap", gf.FIX_PERSON), rank=0, gpu=0)
    rasd = goodput.simulate(_tiny(), [fault], _rasd())
    assert rasd.detail["commands"] == {"quarantine_node": 1, "notify": 1, "run_validation": 1, "release": 1}
    assert rasd.detail["left_to_person"] == 0 and rasd.people == 1
    assert rasd.time_lost_h["repair"] == 0.0  # the spare took the node's place at once


def test_a_hung_collective_is_named_by_the_stall_rule_and_the_cores_restart_ends_it_long_before_the_watchdog():
    """The baseline waits for the 600 s watchdog; rasd's straggler watch names the stall 30 s in (5 of
    Llama 3's 6 s steps, the 30 s floor, checked every 0.5 s) and the core's restart_process (60 s) ends it."""
    (cause,) = [c for c in gf.LLAMA3_CAUSES if c.name == "nccl_watchdog"]
    fault = goodput.Fault(0, 2000.0, cause.name, cause.variants[0], rank=0, gpu=3)
    base = goodput.simulate(_tiny(), [fault], goodput.BaselineArm)
    rasd = goodput.simulate(_tiny(), [fault], _rasd())
    assert goodput.Params().hang_detect_s == pytest.approx(30.0)
    assert base.time_lost_h["detection"] == pytest.approx(600 / 3600)
    assert rasd.time_lost_h["detection"] == pytest.approx(30.0 / 3600)
    assert rasd.time_lost_h["repair"] == pytest.approx(60 / 3600)  # the rank's restart, then the job's
    assert rasd.detail["commands"] == {"restart_process": 1}
    assert rasd.people == base.people == 0
    # A stall rule slower than the job's watchdog: the watchdog ends the hang first, at 600 s.
    slow = goodput.simulate(_tiny(stall_detect_s=900.0), [fault], _rasd())
    assert slow.time_lost_h["detection"] == pytest.approx(600 / 3600) and slow.time_lost_h["repair"] == 0.0


def test_the_stall_detection_follows_the_steps_and_may_be_given():
    assert goodput.Params(step_s=15.0).hang_detect_s == pytest.approx(75.0)  # 5 steps of 15 s
    assert goodput.Params(stall_detect_s=12.0).hang_detect_s == 12.0
