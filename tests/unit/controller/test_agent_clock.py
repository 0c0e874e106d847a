"""Agent stamps in controller time (`ingest.Session.to_controller_ns`): what the power loop compares with its deadlines.

The helper audit's repro: agents whose clocks run 2 h ahead. A read-back sampled before a raise
reached the agent carried a stamp past the raise's deadline, and the apply state settled the raise
as expired before it landed; the allocator then gave its watts to another GPU (1,200 W enforced
against a 1,000 W rack).
"""

from __future__ import annotations

import asyncio

import numpy as np

from rasd.controller import ingest
from rasd.controller.core import power_apply, power_policy, power_tree

S = 1_000_000_000
AHEAD_NS = 7200 * S
POLICY = power_policy.PowerPolicy()


def _session() -> ingest.Session:
    return ingest.Session("s1", "n1", frozenset(), asyncio.Queue(), 0)


def test_a_stamp_is_never_later_than_its_arrival():
    session = _session()
    # Nothing heard yet: the arrival bounds it.
    assert session.to_controller_ns(10 * S + AHEAD_NS, 10 * S) == 10 * S
    assert session.to_controller_ns(9 * S, 10 * S) == 9 * S


def test_the_offset_bound_comes_from_stamps_and_corrects_older_samples():
    t0 = 1_780_000_000 * S
    session = _session()
    session.note_stamp(t0 + 20 * S + AHEAD_NS, t0 + 20 * S + 2_000_000)  # a heartbeat, 2 ms in transit
    session.note_stamp(t0 + 21 * S + AHEAD_NS, t0 + 21 * S + 50_000_000)  # a slower one does not loosen it
    assert session.agent_ahead_ns == AHEAD_NS - 2_000_000
    # A sample taken at 25.0 s that arrives at 26.0 s (batched): dated 25.002 s, not 26 s.
    assert session.to_controller_ns(t0 + 25 * S + AHEAD_NS, t0 + 26 * S) == t0 + 25 * S + 2_000_000
    # An agent behind the controller is corrected too.
    behind = _session()
    behind.note_stamp(t0 + 20 * S - AHEAD_NS, t0 + 20 * S + 1_000_000)
    assert behind.to_controller_ns(t0 + 25 * S - AHEAD_NS, t0 + 26 * S) == t0 + 25 * S + 1_000_000
    session.note_stamp(0, t0 + 30 * S)  # an unset stamp (0) says nothing
    assert session.agent_ahead_ns == AHEAD_NS - 2_000_000


def test_a_read_back_from_before_a_raise_arrived_does_not_settle_it_with_the_agent_2h_ahead():
    tree = power_tree.PowerTree.from_mapping(
        {
            "budget_w": 100_000,
            "rows": [{"name": "row", "racks": [{"name": "rack", "budget_w": 1_000, "nodes": [{"name": "n1"}]}]}],
        }
    )
    gpus = [power_apply.GpuLimits("GPU-a", "n1", 200, 700), power_apply.GpuLimits("GPU-b", "n1", 200, 700)]
    state = power_apply.ApplyState.unknown(gpus, now=0.0, policy=POLICY, epoch="e1")
    session = _session()
    session.note_stamp(7 * S + AHEAD_NS, 7 * S + 1_000_000)  # a heartbeat

    def readback(gpu: str, watts: float, sampled_s: float, arrived_s: float) -> power_apply.CapReadback:
        at_ns = session.to_controller_ns(int(sampled_s * S) + AHEAD_NS, int(arrived_s * S))
        return power_apply.CapReadback(gpu, watts, at_ns / S)

    state = power_apply.record(
        state, readbacks=[readback("GPU-a", 400, 7.0, 7.1), readback("GPU-b", 400, 7.0, 7.1)], policy=POLICY
    )
    state, plan = power_apply.plan(state, np.array([600.0, 400.0]), tree, now=10.0, policy=POLICY)
    assert [c.gpu_uuid for c in plan.increases] == ["GPU-a"]
    # Sampled at 9.9 s, before the raise reached the agent; read at the next period. Dated by the
    # agent's clock (7,209.9 s) it was "after the deadline" and settled the raise as expired.
    state = power_apply.record(state, readbacks=[readback("GPU-a", 400, 9.9, 10.0)], policy=POLICY)
    assert power_apply.may_be_in_force(state, "GPU-a") == 600  # still counted at the raise
    state, plan = power_apply.plan(state, np.array([400.0, 600.0]), tree, now=10.3, policy=POLICY)
    assert plan.increases == ()  # GPU-b gets no watts the rack does not have
    assert power_apply.may_be_in_force_w(state).sum() <= 1_000
