"""A starting power loop's state from what the store kept: an unreadable apply state is dropped, cautiously."""

from __future__ import annotations

import numpy as np
import structlog

from rasd.controller.core.power import apply as power_apply
from rasd.controller.core.power import inputs as period_inputs
from rasd.controller.power import loop as power_loop

SETTINGS = power_loop.PowerSettings.from_mapping(
    {"tree": {"budget_w": 1000, "rows": [{"name": "r", "racks": [{"name": "k", "nodes": [{"name": "n"}]}]}]}}
)


def _kept_state():
    gpus = [power_apply.GpuLimits("GPU-a", "n", 200, 700), power_apply.GpuLimits("GPU-b", "n", 200, 700)]
    state = power_apply.ApplyState.unknown(gpus, now_s=10.0, policy=SETTINGS.policy, epoch="old")
    return state._replace(next_seq=7, pending_seq=np.array([5, 6]), pending_w=np.array([300.0, 400.0]))


def _restored(doc):
    docs = {power_loop.APPLY_DOC: doc}
    state, _ = power_loop.restored_state(
        settings=SETTINGS, config=period_inputs.PeriodConfig(), docs=docs, now_s=100.0, replica="r1"
    )
    return state.apply


def test_the_kept_apply_state_is_continued():
    kept = _kept_state()
    apply = _restored(kept.to_mapping())
    assert apply.epoch == "old" and apply.next_seq == 7 and list(apply.pending_seq) == [5, 6]


def test_an_unreadable_apply_state_is_logged_and_the_loop_starts_as_if_it_knew_nothing():
    doc = _kept_state().to_mapping()
    doc["columns"]["pending_seq"] = doc["columns"]["pending_seq"][:8]
    with structlog.testing.capture_logs() as logs:
        apply = _restored(doc)
    assert [entry["event"] for entry in logs if entry["log_level"] == "error"] == ["power_state_unreadable"]
    assert "pending_seq" in next(e["error"] for e in logs if e["event"] == "power_state_unreadable")
    # A new lineage: its command ids never collide with ones the old lineage may have sent.
    assert apply.epoch != "old" and apply.next_seq == 0


def test_the_floors_kept_are_served_again_but_not_the_expired_ones():
    """A new leader serves the straggler floors its predecessor stored (`PowerLoop._persist`)."""
    from rasd.controller.core.power import floors as power_floors

    kept = {
        "GPU-a": power_floors.floor("GPU-a", "n", 650.0, "power-braked: raised", now_s=90.0),
        "GPU-b": power_floors.floor("GPU-b", "n", 640.0, "an old one", now_s=90.0 - power_floors.TTL_S),
    }
    docs = {power_loop.FLOORS_DOC: power_floors.to_mapping(kept)}
    assert power_loop.restored_floors(docs, now_s=100.0) == {"GPU-a": kept["GPU-a"]}
    assert power_loop.restored_floors({}, now_s=100.0) == {}


def test_an_unreadable_floors_document_is_logged_and_dropped():
    docs = {power_loop.FLOORS_DOC: {"floors": [{"gpu_uuid": "GPU-a", "floor_w": -5}]}}
    with structlog.testing.capture_logs() as logs:
        assert power_loop.restored_floors(docs, now_s=100.0) == {}
    (error,) = [entry for entry in logs if entry["log_level"] == "error"]
    assert error["event"] == "power_floors_dropped" and "not a floor" in error["error"]
