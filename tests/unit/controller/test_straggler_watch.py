"""The straggler watch: summaries' edges in, suspects with evidence and metrics out (issue #40)."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from rasd.controller import stragglers
from rasd.controller.core import fleet, straggler_actions
from rasd.controller.observability import metrics

NS = 1_000_000_000
GPUS = [f"GPU-{i:02d}" for i in range(10)]


def _feed(watch: stragglers.StragglerWatch, steps: int, late: dict[str, float], latest, *, first: int = 0) -> None:
    """Each step 2 s apart; one summary per node (5 GPUs each) per step; late GPUs' edges later by late[gpu] s."""
    for k in range(first, first + steps):
        for node, members in (("n0", GPUS[:5]), ("n1", GPUS[5:])):
            edges = {g: [round((2.0 * k + 1.4 + 0.002 * i + late.get(g, 0.0)) * NS)] for i, g in enumerate(members)}
            watch.add_edges(node, edges, (2 * k + 2) * NS, latest)


def test_a_late_gpu_is_named_once_with_its_clock_reason_as_evidence_and_exported():
    registry = CollectorRegistry()
    watch = stragglers.StragglerWatch(metrics.ControllerMetrics(registry))
    latest = {"GPU-07": fleet.GpuLatest(clock_event_reasons=0x84)}  # SW power cap (not named) and power brake
    _feed(watch, 20, {"GPU-07": 0.15}, latest)
    (named,) = watch.listing()
    assert (named.node_id, named.verdict.gpu_uuid) == ("n1", "GPU-07")
    assert named.verdict.reason.endswith("; clock event: hardware power brake")
    assert watch.steps_judged >= 15
    labels = {"node": "n1", "gpu": "GPU-07"}
    assert registry.get_sample_value("rasd_straggler_suspect", labels) == 1.0
    assert registry.get_sample_value("rasd_straggler_lag_seconds", labels) > 0.1
    assert registry.get_sample_value("rasd_straggler_steps_total") == watch.steps_judged


def test_a_whole_job_slowing_down_names_nobody():
    watch = stragglers.StragglerWatch(metrics.ControllerMetrics(CollectorRegistry()))
    _feed(watch, 20, {g: 0.2 for g in GPUS}, {})
    assert watch.listing() == [] and watch.steps_judged >= 15


def test_a_named_straggler_that_keeps_lagging_is_notified_validated_then_quarantined_and_a_vanished_lag_clears_it():
    registry = CollectorRegistry()
    policy = straggler_actions.ActionPolicy(steps_per_rung=3, clear_after_quiet_steps=4)
    watch = stragglers.StragglerWatch(metrics.ControllerMetrics(registry), action_policy=policy)
    taken: list[straggler_actions.Effect] = []
    watch.actuator = taken.extend
    _feed(watch, 20, {"GPU-07": 0.15}, {})  # nothing here takes it out of the job: it lags on
    assert [(e.kind, e.gpu_uuid, e.node_id) for e in taken] == [
        ("notify", "GPU-07", "n1"),
        ("validate", "GPU-07", "n1"),
        ("quarantine", "GPU-07", "n1"),
    ]
    (named,) = watch.listing()
    assert named.action == "quarantined" and "quarantine it so the scheduler replaces it" in named.action_reason
    assert registry.get_sample_value("rasd_straggler_actions_total", {"action": "validate"}) == 1.0
    _feed(watch, 12, {}, {}, first=20)  # back without its lag (repaired, or replaced by a healthy GPU of that name)
    assert taken[-1].kind == "clear" and watch.listing() == [] and watch.cases == {}
    assert registry.get_sample_value("rasd_straggler_suspect", {"node": "n1", "gpu": "GPU-07"}) is None


def test_a_power_braked_straggler_gets_a_raise_sized_to_the_room_the_power_loop_published():
    """Issue #40: with a power loop in this process the watch asks it for the GPU's room (`PowerLoop.power_room`)."""
    watch = stragglers.StragglerWatch(metrics.ControllerMetrics(CollectorRegistry()))
    taken: list[straggler_actions.Effect] = []
    watch.actuator = taken.extend
    rooms = {"GPU-07": straggler_actions.PowerRoom(cap_w=600.0, max_w=700.0, headroom_w=30.0)}
    watch.room = rooms.get
    _feed(watch, 20, {"GPU-07": 0.15}, {"GPU-07": fleet.GpuLatest(clock_event_reasons=0x80)})  # power brake
    assert [(e.kind, e.to_w) for e in taken[:2]] == [("notify", None), ("raise_cap", 630.0)]
    assert "cap raised 600 → 630 W within the budget" in taken[0].reason
    # Still lagging with its cap raised: it climbs on (nothing here takes it out of the job).
    assert [e.kind for e in taken[2:]] == ["validate", "quarantine"] and "after its cap was raised" in taken[2].reason


def test_without_a_power_loop_the_raise_is_refused_as_not_known_here_and_a_capped_gpu_is_raised_with_one():
    watch = stragglers.StragglerWatch(metrics.ControllerMetrics(CollectorRegistry()))
    taken: list[straggler_actions.Effect] = []
    watch.actuator = taken.extend
    _feed(watch, 20, {"GPU-07": 0.15}, {"GPU-07": fleet.GpuLatest(clock_event_reasons=0x80)})
    assert [e.kind for e in taken] == ["notify", "validate", "quarantine"]
    assert "headroom for this GPU is not known here" in taken[0].reason
    # No brake in its clock reasons, but the power loop judged it capped at its limit: raised all the same.
    other = stragglers.StragglerWatch(metrics.ControllerMetrics(CollectorRegistry()))
    other.actuator = (raised := []).extend
    other.room = {"GPU-07": straggler_actions.PowerRoom(600.0, 700.0, 500.0, capped=True)}.get
    _feed(other, 20, {"GPU-07": 0.15}, {})
    assert [(e.kind, e.to_w) for e in raised[:2]] == [("notify", None), ("raise_cap", 650.0)]


def test_a_gpu_behind_a_downtrained_pcie_link_is_named_with_the_link_from_the_latest_view():
    watch = stragglers.StragglerWatch(metrics.ControllerMetrics(CollectorRegistry()))
    latest = {
        "GPU-02": fleet.GpuLatest(pcie_link=fleet.PcieLink(4, 16, 5, 5)),
        "GPU-03": fleet.GpuLatest(pcie_link=fleet.PcieLink(16, 16, 5, 5)),
    }
    _feed(watch, 20, {"GPU-02": 0.15}, latest)
    (named,) = watch.listing()
    assert named.verdict.gpu_uuid == "GPU-02" and named.verdict.reason.endswith("; PCIe link x4 of x16")


def test_every_gpu_of_a_slow_node_is_named_with_node_wide_evidence_and_no_gpu_of_the_other_node():
    watch = stragglers.StragglerWatch(metrics.ControllerMetrics(CollectorRegistry()))
    nodes = {f"n{n}": [f"GPU-{n}{i}" for i in range(8)] for n in range(4)}  # 32 GPUs: one slow node is a quarter
    for k in range(20):
        for node, members in nodes.items():
            late = 0.15 if node == "n2" else 0.0
            edges = {g: [round((2.0 * k + 1.4 + 0.002 * i + late) * NS)] for i, g in enumerate(members)}
            watch.add_edges(node, edges, (2 * k + 2) * NS, {})
    named = watch.listing()
    assert sorted(s.verdict.gpu_uuid for s in named) == nodes["n2"]
    assert all("; node-wide: all 8 GPUs of n2 lag" in s.verdict.reason for s in named)


def test_a_busy_job_whose_edges_stop_is_named_stalled_once_and_its_idle_rank_restarted_until_it_steps_again():
    registry = CollectorRegistry()
    watch = stragglers.StragglerWatch(metrics.ControllerMetrics(registry))
    taken: list[straggler_actions.Effect] = []
    watch.actuator = taken.extend
    spinning = fleet.GpuLatest(power_w=120.0, enforced_power_limit_w=700, utilization_gpu_pct=100)
    latest = {gpu: spinning for gpu in GPUS}
    _feed(watch, 15, {}, latest)  # edges up to 29.4 s
    latest["GPU-06"] = fleet.GpuLatest(power_w=70.0, enforced_power_limit_w=700, utilization_gpu_pct=0)
    for second in range(30, 62):  # the summaries go on, with no edge in them
        for node in ("n0", "n1"):
            watch.add_edges(node, {}, second * NS, latest)
    assert [(e.kind, e.gpu_uuid, e.node_id) for e in taken] == [("stall", "GPU-06", "n1"), ("restart", "GPU-06", "n1")]
    assert taken[0].reason.startswith("the job's steps stopped 3") and "9 of 10 GPUs still busy" in taken[0].reason
    assert watch.stall is not None and watch.stall.suspect_gpu == "GPU-06"
    assert registry.get_sample_value("rasd_job_stalled") == 1.0
    assert registry.get_sample_value("rasd_job_stalls_total") == 1.0
    assert registry.get_sample_value("rasd_straggler_actions_total", {"action": "restart"}) == 1.0
    _feed(watch, 1, {}, latest, first=31)  # the restarted job steps again
    assert watch.stall is None and registry.get_sample_value("rasd_job_stalled") == 0.0
    assert len(taken) == 2


def test_a_job_that_ended_with_its_gpus_idle_is_not_stalled_and_restart_off_only_notifies():
    watch = stragglers.StragglerWatch(metrics.ControllerMetrics(CollectorRegistry()))
    taken: list[straggler_actions.Effect] = []
    watch.actuator = taken.extend
    idle = {gpu: fleet.GpuLatest(utilization_gpu_pct=0) for gpu in GPUS}
    _feed(watch, 15, {}, idle)
    for second in range(30, 120):
        watch.add_edges("n0", {}, second * NS, idle)
    assert taken == [] and watch.stall is None

    settings = stragglers.StragglerSettings.from_mapping({"stall": {"restart": False, "min_silence_s": 10.0}})
    notify_only = stragglers.StragglerWatch.of(metrics.ControllerMetrics(CollectorRegistry()), settings)
    notify_only.actuator = taken.extend
    busy = {gpu: fleet.GpuLatest(power_w=150.0, enforced_power_limit_w=700, utilization_gpu_pct=97) for gpu in GPUS}
    _feed(notify_only, 15, {}, busy)
    for second in range(30, 45):
        notify_only.add_edges("n0", {}, second * NS, busy)
    assert [e.kind for e in taken] == ["stall"]


def test_a_bad_stall_setting_is_refused_naming_its_path():
    with pytest.raises(ValueError, match=r"^stragglers\.stall\.silent_periods"):
        stragglers.StragglerSettings.from_mapping({"stall": {"silent_periods": 0.0}})
    with pytest.raises(ValueError, match=r"^stragglers\.stall\.restarts"):
        stragglers.StragglerSettings.from_mapping({"stall": {"restarts": True}})


def test_a_stall_with_a_node_fallen_silent_is_named_but_no_rank_is_restarted():
    """The dead host's node is the lost-node watch's; a restart now would hang again on it."""
    watch = stragglers.StragglerWatch(metrics.ControllerMetrics(CollectorRegistry()))
    taken: list[straggler_actions.Effect] = []
    watch.actuator = taken.extend
    spinning = fleet.GpuLatest(power_w=120.0, enforced_power_limit_w=700, utilization_gpu_pct=100)
    latest = {gpu: spinning for gpu in GPUS}
    _feed(watch, 15, {}, latest)
    for second in range(30, 62):  # only n0 is heard from: n1 went down with the hang
        watch.add_edges("n0", {}, second * NS, latest)
    assert [(e.kind, e.node_id) for e in taken] == [("stall", "n0")]
    assert taken[0].reason.endswith("node n1 fell silent: its host may be down")
    assert watch.stall is not None and watch.stall.silent_nodes == ("n1",)


def test_the_rhythms_newest_edge_counts_summaries_that_cut_nothing():
    """Edges of a summary that came between two cuts still move the job's newest edge (no false silence)."""
    watch = stragglers.StragglerWatch(metrics.ControllerMetrics(CollectorRegistry()))
    _feed(watch, 12, {}, {})
    watch.add_edges("n0", {"GPU-00": [int(50.0 * NS)]}, int(24.1 * NS), {})  # within 0.5 s of the last cut
    watch.add_edges("n1", {}, int(24.7 * NS), {})  # the cut: no edge of its own
    assert watch.rhythm.newest_edge_s == 50.0
