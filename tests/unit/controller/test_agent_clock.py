"""Agent stamps in controller time (`ingest.Session.to_controller_ns`): what the power loop compares with its deadlines.

The helper audit's repro: agents whose clocks run 2 h ahead. A read-back sampled before a raise
reached the agent carried a stamp past the raise's deadline, and the apply state settled the raise
as expired before it landed; the allocator then gave its watts to another GPU (1,200 W enforced
against a 1,000 W rack).
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from rasd.api.v1 import commands_pb2 as commands_pb
from rasd.controller.core.power import apply as power_apply
from rasd.controller.core.power import policy as power_policy
from rasd.controller.core.power import tree as power_tree
from rasd.controller.ingest import service as ingest
from rasd.controller.wire import commands as wire_commands

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
    state = power_apply.ApplyState.unknown(gpus, now_s=0.0, policy=POLICY, epoch="e1")
    session = _session()
    session.note_stamp(7 * S + AHEAD_NS, 7 * S + 1_000_000)  # a heartbeat

    def readback(gpu: str, watts: float, sampled_s: float, arrived_s: float) -> power_apply.CapReadback:
        at_ns = session.to_controller_ns(int(sampled_s * S) + AHEAD_NS, int(arrived_s * S))
        return power_apply.CapReadback(gpu, watts, at_ns / S)

    state = power_apply.record(
        state, readbacks=[readback("GPU-a", 400, 7.0, 7.1), readback("GPU-b", 400, 7.0, 7.1)], policy=POLICY
    )
    state, plan = power_apply.plan(state, np.array([600.0, 400.0]), tree, now_s=10.0, policy=POLICY)
    assert [c.gpu_uuid for c in plan.increases] == ["GPU-a"]
    # Sampled at 9.9 s, before the raise reached the agent; read at the next period. Dated by the
    # agent's clock (7,209.9 s) it was "after the deadline" and settled the raise as expired.
    state = power_apply.record(state, readbacks=[readback("GPU-a", 400, 9.9, 10.0)], policy=POLICY)
    assert power_apply.may_be_in_force(state, "GPU-a") == 600  # still counted at the raise
    state, plan = power_apply.plan(state, np.array([400.0, 600.0]), tree, now_s=10.3, policy=POLICY)
    assert plan.increases == ()  # GPU-b gets no watts the rack does not have
    assert power_apply.may_be_in_force_w(state).sum() <= 1_000


def _cap_command(issued_ns: int, deadline_ns: int, gpu_uuid: str, limit_w: int):
    from rasd.api.v1 import commands_pb2 as commands_pb

    return commands_pb.Command(
        command_id="cap-e1-7",
        issued_unix_ns=issued_ns,
        deadline_unix_ns=deadline_ns,
        reason="test",
        set_power_cap=commands_pb.SetPowerCap(
            limits=[commands_pb.GpuPowerLimit(gpu_uuid=gpu_uuid, power_limit_w=limit_w)]
        ),
    )


def test_a_cap_delivered_after_its_deadline_is_refused_on_an_agent_2h_ahead():
    """The helper audit's repro A: counted from its late arrival, a raise the loop had settled as expired still ran."""
    from rasd.agent import actions, runtime, spool
    from rasd.agent import wire as agent_wire
    from rasd.agent.core import model
    from rasd.agent.gpu import simulated

    t0 = 1_780_000_000 * S
    backend = simulated.SimulatedBackend("n1", 1, 0)
    gpu_uuid = backend.inventory()[0].uuid
    backend.set_power_limit(gpu_uuid, 400)
    executor = actions.ActionExecutor(backend, spool.Spool(":memory:"), clock=lambda: agent_now[0])
    session = _session()
    session.note_stamp(t0 + AHEAD_NS, t0 + 1_000_000)  # the Hello: 1 ms in transit
    agent_now = [0]

    def deliver(command, arrived_controller_ns: int) -> model.ActionResult:
        session.stamp_agent_deadline(command)
        agent_now[0] = arrived_controller_ns + AHEAD_NS
        local = runtime.on_local_clock(agent_wire.command_from_wire(command), agent_now[0])
        return executor.execute(local)

    late = _cap_command(t0 + 10 * S, t0 + 15 * S, gpu_uuid, 600)
    assert late.deadline_agent_unix_ns == 0  # not stamped before it is sent
    # It reaches the agent at 20 s, after the loop settled it as expired (a read-back past 15 s + 1 s).
    assert deliver(late, t0 + 20 * S).outcome is model.ActionOutcome.TIMED_OUT
    assert backend.read_counters(0)[0].enforced_power_limit_w == 400
    on_time = _cap_command(t0 + 30 * S, t0 + 35 * S, gpu_uuid, 600)
    on_time.command_id = "cap-e1-8"
    assert deliver(on_time, t0 + 30 * S + 5_000_000).outcome is model.ActionOutcome.SUCCEEDED
    assert backend.read_counters(0)[0].enforced_power_limit_w == 600


@pytest.mark.parametrize("ahead_ns", [2**63 - 1 - 1_800_000_000 * S, -(2**63) + 1, 4 * 10**18])
def test_an_agent_deadline_stays_a_64_bit_time_whatever_the_offset(ahead_ns):
    """Issue #37 item 12: deadline plus an absurd agent offset raised ValueError (int64 overflow) in dispatch."""
    command = commands_pb.Command(command_id="c1", deadline_unix_ns=1_800_000_000 * S + 30 * S)
    wire_commands.stamp_agent_deadline(command, ahead_ns)
    assert 1 <= command.deadline_agent_unix_ns <= 2**63 - 1
