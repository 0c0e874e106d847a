"""`views.inventory`'s memo: the last answer is given back only while every input equals the last call's.
`views.latest_columns`: the period's one pass over the latest readings reads each field as the
per-GPU code did (a missing reading or field, a raise still slewing, controller time or not)."""

from __future__ import annotations

import dataclasses

from rasd.controller.core import fleet
from rasd.controller.core.power import apply as power_apply
from rasd.controller.core.power import inputs as period_inputs
from rasd.controller.core.power import views

NODES = frozenset({"node-a", "node-b"})


def _record(gpu: str, node: str, max_w: int = 1000) -> fleet.GpuRecord:
    return fleet.GpuRecord(gpu, "B200", "", 200, max_w, max_w, node_id=node)


def _view(records: dict[str, fleet.GpuRecord], known_records=None, gpu_nodes=None) -> period_inputs.FleetView:
    return period_inputs.FleetView(
        records=records,
        known_records=known_records or {},
        gpu_nodes=gpu_nodes if gpu_nodes is not None else {g: r.node_id for g, r in records.items()},
        node_gpus={},
        boot_ids={},
        sessions={},
        node_labels={},
        latest={},
        latest_controller_ns={},
    )


def _records() -> dict[str, fleet.GpuRecord]:
    return {"b0": _record("b0", "node-b"), "a1": _record("a1", "node-a"), "a0": _record("a0", "node-a")}


def _computed(node_names, view, known):
    """The inventory with no memo to answer from."""
    views._last_inventory.clear()
    return views.inventory(node_names, view, known)


def test_equal_inputs_give_the_last_answer_and_every_changed_input_a_new_one():
    records = _records()
    first = _computed(NODES, _view(records), ())
    assert [g.gpu_uuid for g in first] == ["a0", "a1", "b0"]
    # Equal inputs in new objects (a new period's view): the same answer, the same GpuLimits objects.
    again = views.inventory(frozenset(NODES), _view(dict(records)), ())
    assert again == first and all(a is b for a, b in zip(again, first, strict=True))
    changes = {
        "a record's limits": (NODES, _view({**records, "a0": _record("a0", "node-a", max_w=900)}), ()),
        "a GPU moved": (NODES, _view(records, gpu_nodes={"a0": "node-b", "a1": "node-a", "b0": "node-b"}), ()),
        "a store record": (NODES, _view(records, known_records={"c0": _record("c0", "node-b")}), ()),
        "the tree's nodes": (frozenset({"node-a"}), _view(records), ()),
        "the apply state's GPUs": (NODES, _view(records), (power_apply.GpuLimits("d0", "node-a", 100, 800),)),
    }
    for what, (node_names, view, known) in changes.items():
        views.inventory(NODES, _view(records), ())  # the memo holds the first inputs again
        assert views.inventory(node_names, view, known) == _computed(node_names, view, known), what


def test_a_live_mapping_changed_after_the_call_is_not_answered_from_the_memo():
    """The loop's view wraps the ingest's own dicts: the memo must hold copies, not the dicts."""
    records = _records()
    view = _view(records)
    first = _computed(NODES, view, ())
    records["a0"] = dataclasses.replace(records["a0"], power_limit_max_w=700)
    second = views.inventory(NODES, view, ())
    assert second != first and next(g for g in second if g.gpu_uuid == "a0").max_w == 700
    assert second == _computed(NODES, view, ())


def test_an_answer_from_the_memo_is_a_new_list():
    first = _computed(NODES, _view(_records()), ())
    first.clear()
    assert len(views.inventory(NODES, _view(_records()), ())) == 3


def test_latest_columns_read_each_gpus_reading_as_the_per_gpu_code_did():
    gpus = [power_apply.GpuLimits(g, "node-a", 200, 1000) for g in ("none", "no-limit", "never", "slew", "plain")]
    latest = {
        "no-limit": fleet.GpuLatest(power_w=300.0, power_sample_unix_ns=5, counters_unix_ns=7, utilization_gpu_pct=0),
        "never": fleet.GpuLatest(enforced_power_limit_w=600, counters_unix_ns=0),
        "slew": fleet.GpuLatest(enforced_power_limit_w=500, power_limit_slew_target_w=700, counters_unix_ns=9 * 10**9,
                                utilization_gpu_pct=80, clock_event_reasons=views.SW_POWER_CAP),
        "plain": fleet.GpuLatest(enforced_power_limit_w=650, power_limit_slew_target_w=600, counters_unix_ns=8 * 10**9),
    }  # fmt: skip
    view = dataclasses.replace(_view({}), latest=latest, latest_controller_ns={"plain": 3 * 10**9})

    columns = views.latest_columns(gpus, view)
    has, enforced_w, sample_s = views.readbacks_aligned(gpus, view, now_s=10.0, columns=columns)
    idle_for, since = views.idle_for_s(columns, {"no-limit": 2.0}, now_s=10.0)

    assert has.tolist() == [False, False, False, True, True], "no reading, no limit, or never read: no read-back"
    assert enforced_w.tolist() == [0, 0, 0, 700, 650], "a raise still slewing counts at its target"
    assert sample_s.tolist() == [0, 0, 0, 9.0, 3.0], "controller time where known, else the counters' own"
    assert columns.idle().tolist() == [False, True, False, False, False], "idle: utilisation read 0"
    assert columns.busy().tolist() == [False, False, False, True, False]
    assert ((columns.clock_event_reasons & views.SW_POWER_CAP) != 0).tolist() == [False, False, False, True, False]
    assert since == {"none": 10.0, "no-limit": 2.0, "never": 10.0, "plain": 8.0}, "idle runs: kept, or from the sample"
    assert idle_for.tolist()[:3] == [0.0, 8.0, 0.0] and idle_for.tolist()[4] == 2.0
    assert str(idle_for[3]) == "nan", "a busy GPU has no idle run"


def test_job_running_counts_the_gpus_whose_reading_shows_utilisation():
    """At least half busy: a missing reading, a missing utilisation or 0 % is not busy."""
    gpus = [power_apply.GpuLimits(g, "node-a", 200, 1000) for g in ("none", "no-util", "zero", "busy-1", "busy-2")]
    readings = {
        "no-util": fleet.GpuLatest(power_w=300.0),
        "zero": fleet.GpuLatest(utilization_gpu_pct=0),
        "busy-1": fleet.GpuLatest(utilization_gpu_pct=5),
        "busy-2": fleet.GpuLatest(utilization_gpu_pct=100),
    }
    for busy_ones in ((), ("busy-1",), ("busy-1", "busy-2")):
        latest = {g: r for g, r in readings.items() if not g.startswith("busy") or g in busy_ones}
        columns = views.latest_columns(gpus, dataclasses.replace(_view({}), latest=latest))
        by_readings = sum(1 for r in latest.values() if r.utilization_gpu_pct) >= 0.5 * len(gpus)
        assert views.job_running(columns) == by_readings, busy_ones
    assert views.job_running(views.latest_columns(gpus[3:], dataclasses.replace(_view({}), latest=readings)))
    assert not views.job_running(views.latest_columns(gpus, dataclasses.replace(_view({}), latest=readings))), "2 of 5"
