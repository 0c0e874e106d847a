"""A real run's power periods, replayed through `period.step`, give the same commands, status and state.

The fixture (fixtures/power_periods.jsonl.gz, written by fixtures/record_power_periods.py) holds
every period of a run of the real controller and two simulated agents: GPUs parked at the start cap,
a job start (ramp, start profiles, canaries), the swing plan taking over, a node's budget cut, a
quarantined GPU, an agent gone (a node limit through its BMC) and back. Each record is the state the
period started from, what the loop gathered, the time, and what the period decided. The power
invariant (DESIGN.md §2.1) is checked on the replay too.
"""

from __future__ import annotations

import math
import pathlib

import numpy as np
import pytest

from rasd.controller.core.power import apply as power_apply
from rasd.controller.core.power import period, snapshot
from rasd.controller.power import recording

FIXTURE = pathlib.Path(__file__).parent / "fixtures" / "power_periods.jsonl.gz"


@pytest.fixture(scope="module")
def records():
    return list(recording.read(FIXTURE))


@pytest.fixture(scope="module")
def replayed(records):
    return [period.step(r["state"], r["inputs"], r["now_s"]) for r in records]


def _same(replayed, recorded, path="") -> list[str]:
    """Where two plain-data trees differ (floats to 1e-9: the replay may run on other floating-point code)."""
    if isinstance(recorded, float) and isinstance(replayed, float):
        close = math.isclose(replayed, recorded, rel_tol=1e-9, abs_tol=1e-9)
        return [] if close else [f"{path}: {replayed} != {recorded}"]
    if isinstance(recorded, dict) and isinstance(replayed, dict):
        if recorded.keys() != replayed.keys():
            return [f"{path}: keys {sorted(replayed)} != {sorted(recorded)}"]
        return [d for k in recorded for d in _same(replayed[k], recorded[k], f"{path}.{k}")]
    if isinstance(recorded, list) and isinstance(replayed, list):
        if len(recorded) != len(replayed):
            return [f"{path}: {len(replayed)} items != {len(recorded)}"]
        return [d for i, (a, b) in enumerate(zip(replayed, recorded, strict=True)) for d in _same(a, b, f"{path}[{i}]")]
    return [] if replayed == recorded else [f"{path}: {replayed!r} != {recorded!r}"]


def test_the_recorded_run_went_through_the_decisions_the_replay_is_meant_to_cover(records):
    results = [r["result"] for r in records]
    assert len(records) >= 40 and any(res.commands.cap_commands for res in results)
    assert any(res.status.ramp_parked for res in results), "GPUs were parked at the start cap"
    assert any(p.job_start and p.enabled for res in results for p in res.commands.start_profiles)
    assert any(res.commands.smoothing for res in results), "the swing plan went out"
    assert any(res.status.power and res.status.power.over_budget for res in results), "a budget cut was enforced"
    assert any(r["inputs"].quarantined_gpus for r in records), "a GPU was quarantined"
    limits = [request.limit_w for res in results for request in res.commands.node_limits]
    assert any(w is not None for w in limits) and None in limits, "a BMC limit was set and lifted"
    assert any(r["inputs"].node_limit_results for r in records) and any(r["inputs"].acks for r in records)


def test_every_recorded_period_replays_to_the_same_commands_status_and_state(records, replayed):
    for record, result in zip(records, replayed, strict=True):
        recorded = record["result"]
        at = f"period at {record['now_s']:.3f}"
        for part in ("commands", "status", "state"):
            differences = _same(snapshot.to_plain(getattr(result, part)), snapshot.to_plain(getattr(recorded, part)))
            assert not differences, f"{at}, {part}: {differences[:5]}"


def test_a_period_is_a_function_of_its_arguments(records):
    """Stepping the same recorded period twice gives the same result: nothing is kept between calls."""
    record = records[len(records) // 2]
    first, second = (period.step(record["state"], record["inputs"], record["now_s"]) for _ in range(2))
    assert snapshot.to_plain(first) == snapshot.to_plain(second)


def test_the_caps_that_may_be_in_force_never_exceed_a_budget_on_the_replay(replayed):
    """At every level: targets within every budget; caps that may be in force over one only where the
    period says so (a cut, or GPUs not yet confirmed down), and then no raise goes to a GPU below it."""
    checked = 0
    for result in replayed:
        if result.status.power is None:
            continue
        state = result.state
        index = state.tree.index
        node_idx = np.array([index.node_of_name[g.node_id] for g in state.apply.gpus], dtype=np.intp)
        assert state.targets_w is not None
        assert index.over_budget(node_idx, state.targets_w.astype(np.float64)) == []
        assert (state.targets_w >= state.apply.min_w).all() and (state.targets_w <= state.apply.max_w).all()
        over = set(result.status.power.over_budget)
        assert set(index.over_budget(node_idx, power_apply.may_be_in_force_w(state.apply))) <= over
        for increase in result.commands.caps.increases:
            assert not {increase.node_id, *state.tree.ancestors(increase.node_id)} & over
        checked += 1
    assert checked >= 40
