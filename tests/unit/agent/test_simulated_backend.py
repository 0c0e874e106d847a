"""The simulated backend is deterministic, step-synchronous, and honours caps like a real GPU."""

from __future__ import annotations

import pytest

from rasd.agent import gpu
from rasd.agent.core import model
from rasd.agent.gpu import simulated

NS = 1_000_000_000


def _backend(seed: int = 3, **kwargs) -> simulated.SimulatedBackend:
    return simulated.SimulatedBackend("node-x", 4, seed, workload=simulated.StepWorkload(period_s=2.0), **kwargs)


def test_same_seed_same_readings():
    a, b = _backend(), _backend()
    times = [i * 100_000_000 for i in range(50)]
    assert [a.read_power(t) for t in times] == [b.read_power(t) for t in times]
    assert [g.uuid for g in a.inventory()] == [g.uuid for g in b.inventory()]


def test_different_seed_different_gpus():
    assert [g.uuid for g in _backend(1).inventory()] != [g.uuid for g in _backend(2).inventory()]


def test_uuids_are_well_formed_and_unique():
    uuids = [g.uuid for g in _backend().inventory()]
    assert len(set(uuids)) == 4
    assert all(u.startswith("GPU-") and len(u) == 40 for u in uuids)


def test_draw_alternates_between_compute_and_communication_with_the_step_period():
    backend = _backend()
    # Sample 10 steps at 10 Hz and classify each sample of GPU 0 as compute (> 400 W) or not.
    samples = [backend.read_power(i * 100_000_000)[0].power_w for i in range(200)]
    compute_share = sum(1 for w in samples if w > 400) / len(samples)
    assert 0.6 <= compute_share <= 0.8
    assert max(samples) <= 700 + 8 and min(samples) >= 100 - 8
    # Step-synchronous: the same phase one period later.
    assert (samples[3] > 400) == (samples[23] > 400)


def test_every_gpu_of_every_node_swings_together():
    workload = simulated.StepWorkload(period_s=2.0)
    nodes = [simulated.SimulatedBackend(f"n{i}", 8, 0, workload=workload) for i in range(3)]
    for t_ns in (int(0.5 * NS), int(1.7 * NS)):
        phases = {r.power_w > 400 for node in nodes for r in node.read_power(t_ns)}
        assert len(phases) == 1


def test_cap_limits_draw_and_sets_the_sw_power_cap_reason():
    backend = _backend()
    uuid = backend.inventory()[0].uuid
    assert backend.set_power_limit(uuid, 300) == 300
    compute_t = int(0.5 * NS)
    assert backend.read_power(compute_t)[0].power_w <= 300 + 8
    counters = backend.read_counters(compute_t)[0]
    assert counters.enforced_power_limit_w == 300
    assert counters.clock_event_reasons & model.ClockEventReason.SW_POWER_CAP


def test_cap_outside_constraints_is_rejected_and_unknown_gpu_is_named():
    backend = _backend()
    uuid = backend.inventory()[0].uuid
    with pytest.raises(gpu.InvalidValue, match="outside"):
        backend.set_power_limit(uuid, 100)
    with pytest.raises(gpu.GpuNotFound, match="GPU-nope"):
        backend.set_power_limit("GPU-nope", 500)


def test_lost_gpu_is_reported_once_and_then_skipped():
    backend = _backend()
    uuid = backend.inventory()[2].uuid
    backend.fire(simulated.ScriptedFault(at_s=0, kind="gpu_lost", gpu=2), 1)
    assert [(o.kind, o.gpu_uuid) for o in backend.poll_events(2, 0.0)] == [(model.EventKind.GPU_LOST, uuid)]
    assert backend.poll_events(3, 0.0) == []
    assert uuid not in {r.gpu_uuid for r in backend.read_power(4)}
    assert uuid not in {c.gpu_uuid for c in backend.read_counters(4)}
    with pytest.raises(gpu.GpuLost):
        backend.set_power_limit(uuid, 500)


def test_energy_integrates_power():
    backend = _backend()
    for i in range(11):
        backend.read_power(i * 100_000_000)
    energy_mj = backend.read_counters(NS)[0].total_energy_mj
    assert 100_000 < energy_mj < 720_000  # one second at 100..700 W plus noise


def test_bad_workload_is_named():
    with pytest.raises(ValueError, match="period_s"):
        simulated.StepWorkload(period_s=0)


def test_scripted_faults_fire_on_time_relative_to_the_epoch():
    faults = [
        simulated.ScriptedFault(at_s=2.0, kind="xid", gpu=1, xid=13),
        simulated.ScriptedFault(at_s=1.0, kind="ecc_dbe", gpu=0),
    ]
    backend = simulated.SimulatedBackend("n", 2, 0, faults=faults, epoch_unix_ns=10 * NS)
    assert backend.poll_events(10 * NS + NS // 2, 0) == [] and backend.fired == []
    backend.read_counters(11 * NS)
    assert [f.fault.kind for f in backend.fired] == ["ecc_dbe"]
    assert backend.read_counters(11 * NS)[0].ecc_dbe_volatile == 1
    (xid,) = backend.poll_events(12 * NS, 0)
    assert xid.kind is model.EventKind.XID and xid.xid == 13 and xid.gpu_uuid == backend.inventory()[1].uuid
    assert xid.observed_unix_ns == 12 * NS


def test_reset_applies_a_pending_remap_and_reboot_brings_back_a_lost_gpu():
    backend = _backend()
    gpu0, gpu1 = (g.uuid for g in backend.inventory()[:2])
    backend.fire(simulated.ScriptedFault(at_s=0, kind="row_remap_pending", gpu=0), 0)
    backend.fire(simulated.ScriptedFault(at_s=0, kind="fallen_off_bus", gpu=1), 0)
    with pytest.raises(gpu.GpuLost):
        backend.reset_gpu(gpu1)
    backend.reset_gpu(gpu0)
    counters = {c.gpu_uuid: c for c in backend.read_counters(1)}
    assert counters[gpu0].remapped_rows_pending is False and counters[gpu0].remapped_rows_correctable == 1
    assert gpu1 not in counters
    backend.reboot()
    assert gpu1 in {c.gpu_uuid for c in backend.read_counters(2)}


def test_sdc_is_silent():
    backend = _backend()
    backend.fire(simulated.ScriptedFault(at_s=0, kind="sdc", gpu=3), 0)
    assert backend.poll_events(1, 0) == []
    assert backend.sdc_gpus() == {backend.inventory()[3].uuid}


def test_ib_flaps_are_node_level_and_spread_over_time():
    backend = _backend()
    backend.fire(simulated.ScriptedFault(at_s=0, kind="ib_link_flap", count=2), 0)
    states = [o.attributes["ib_state"] for t in range(5) for o in backend.poll_events(t * NS, 0)]
    assert states == ["DOWN", "ACTIVE", "DOWN", "ACTIVE"]


def test_fault_file_errors_name_the_key(tmp_path):
    bad = tmp_path / "faults.toml"
    bad.write_text('[[faults]]\nat_s = 1\nkind = "meteor"\n')
    with pytest.raises(ValueError, match=r"faults\[0\].*meteor"):
        simulated.load_faults(bad)
    bad.write_text('[[faults]]\nat_s = 1\nkind = "xid"\ncolour = 3\n')
    with pytest.raises(ValueError, match="colour"):
        simulated.load_faults(bad)


def test_the_trough_filler_holds_the_floor_and_lands_softly_when_switched_off():
    # No workload: the GPU idles (70 W), so the filler's floor is what it draws.
    backend = simulated.SimulatedBackend("node-x", 1, 3)
    (info,) = backend.inventory()
    backend.fill_troughs(info.uuid, 600.0)
    assert backend.read_power(1 * NS)[0].power_w == pytest.approx(600, abs=2)
    backend.fill_troughs(info.uuid, 0.0, ramp_down_w_per_s=100.0)
    assert backend.read_power(2 * NS)[0].power_w == pytest.approx(600, abs=2), "the ramp starts at this reading"
    assert backend.read_power(4 * NS)[0].power_w == pytest.approx(400, abs=2)
    assert backend.read_power(9 * NS)[0].power_w == pytest.approx(70, abs=2), "down to idle, then off"
    assert backend.read_power(10 * NS)[0].power_w == pytest.approx(70, abs=2)
    with pytest.raises(gpu.InvalidValue, match="ramp_down_w_per_s"):
        backend.fill_troughs(info.uuid, 0.0, ramp_down_w_per_s=-1.0)


def test_a_straggler_fault_brakes_the_rank_below_its_demand_whatever_limit_is_set_after():
    backend = _backend()
    gpu = backend.inventory()[2]
    job = backend._job
    assert job is not None
    rank = 2
    demand_w = float(job.compute_w[rank])
    backend.fire(simulated.ScriptedFault(at_s=0, kind="straggler", gpu=2, slowdown=0.05), 0)
    assert job.cap_w[rank] == pytest.approx(demand_w / 1.05)
    backend.set_power_limit(gpu.uuid, gpu.power_limit_max_w)  # a raised limit does not lift the brake
    assert job.cap_w[rank] == pytest.approx(demand_w / 1.05)
    counters = {c.gpu_uuid: c for c in backend.read_counters(1_000_000_000)}
    assert counters[gpu.uuid].clock_event_reasons & model.ClockEventReason.HW_POWER_BRAKE_SLOWDOWN
    assert backend.poll_events(1_000_000_000, 0.0) == []  # silent: no event


@pytest.mark.parametrize("slowdown", [0, 1.0, -0.1, True, "5%"])
def test_a_straggler_slowdown_outside_0_1_is_refused_naming_it(slowdown):
    with pytest.raises(ValueError, match="slowdown must be a number in"):
        simulated.ScriptedFault(at_s=0, kind="straggler", slowdown=slowdown)


def _reasons(backend: simulated.SimulatedBackend, uuid: str, at_ns: int) -> model.GpuCounters:
    return {c.gpu_uuid: c for c in backend.read_counters(at_ns)}[uuid]


def test_a_thermal_throttle_brakes_the_rank_and_shows_thermal_reasons_and_heat_not_a_power_brake():
    backend = _backend()
    gpu_info = backend.inventory()[1]
    job = backend._job
    assert job is not None
    backend.fire(simulated.ScriptedFault(at_s=0, kind="thermal_throttle", gpu=1, slowdown=0.05), 0)
    assert job.cap_w[1] == pytest.approx(float(job.compute_w[1]) / 1.05)
    counters = _reasons(backend, gpu_info.uuid, 1 * NS)
    assert counters.clock_event_reasons & model.ClockEventReason.SW_THERMAL_SLOWDOWN
    assert not counters.clock_event_reasons & model.ClockEventReason.HW_POWER_BRAKE_SLOWDOWN
    assert counters.temperature_c >= simulated.THROTTLED_TEMPERATURE_C
    assert simulated.ScriptedFault(at_s=0, kind="thermal_throttle").expected_event_kind == model.EventKind.THERMAL


def test_a_pcie_downtrain_delays_the_compute_and_reports_the_link_below_its_max_with_no_clock_reason():
    backend = _backend()
    slow, clean = backend.inventory()[2], backend.inventory()[0]
    job = backend._job
    assert job is not None
    backend.fire(simulated.ScriptedFault(at_s=0, kind="pcie_downtrain", gpu=2, slowdown=0.05), 0)
    assert list(job.start_delay_s) == pytest.approx([0.0, 0.0, 0.05 * 0.7 * 2.0, 0.0])
    assert job.cap_w[2] == slow.power_limit_default_w  # full clocks: no brake
    counters = _reasons(backend, slow.uuid, 1 * NS)
    assert (counters.pcie_link_width, counters.pcie_link_width_max) == (4, 16)
    assert (counters.pcie_link_gen, counters.pcie_link_gen_max) == (5, 5)
    assert not counters.clock_event_reasons & ~int(model.ClockEventReason.SW_POWER_CAP)
    assert _reasons(backend, clean.uuid, 1 * NS).pcie_link_width == 16
    assert backend.poll_events(1 * NS, 0.0) == []


def test_a_slow_node_delays_every_gpu_of_the_node_records_each_and_shows_no_gpu_signal():
    backend = _backend()
    job = backend._job
    assert job is not None
    backend.fire(simulated.ScriptedFault(at_s=0, kind="slow_node", slowdown=0.05), 0)
    assert list(job.start_delay_s) == pytest.approx([0.07] * 4)
    assert [f.gpu_uuid for f in backend.fired] == [g.uuid for g in backend.inventory()]
    for counters in backend.read_counters(1 * NS):
        assert counters.pcie_link_width == counters.pcie_link_width_max
        assert not counters.clock_event_reasons & ~int(model.ClockEventReason.SW_POWER_CAP)


def test_power_brake_is_the_straggler_fault_by_its_own_name():
    backend = _backend()
    job = backend._job
    assert job is not None
    backend.fire(simulated.ScriptedFault(at_s=0, kind="power_brake", gpu=3, slowdown=0.1), 0)
    assert job.cap_w[3] == pytest.approx(float(job.compute_w[3]) / 1.1)
    assert _reasons(backend, backend.inventory()[3].uuid, NS).clock_event_reasons & 0x80
