"""Edges arriving per summary cut into steps, and the clock event reasons named as evidence (issue #40)."""

from __future__ import annotations

from rasd.controller.core import straggler

GROUPING = straggler.StepGrouping(gap_s=0.5, settle_s=3.0)


def test_a_step_is_complete_only_once_an_edge_settle_s_later_has_arrived():
    pending = [(1.00, "a"), (1.02, "b"), (1.09, "c"), (3.01, "a"), (4.0, "b")]
    steps, rest = straggler.complete_steps(pending, GROUPING)
    assert steps == [] and len(rest) == 5
    steps, rest = straggler.complete_steps([*pending, (4.5, "c")], GROUPING)
    assert steps == [{"a": 1.00, "b": 1.02, "c": 1.09}]
    assert rest == [(3.01, "a"), (4.0, "b"), (4.5, "c")]


def test_edges_arriving_out_of_order_across_nodes_fall_in_their_step():
    pending = [(3.02, "b"), (1.01, "b"), (5.0, "a"), (1.00, "a"), (3.00, "a"), (7.5, "a")]
    steps, rest = straggler.complete_steps(pending, GROUPING)
    assert steps == [{"a": 1.00, "b": 1.01}, {"a": 3.00, "b": 3.02}]
    assert rest == [(5.0, "a"), (7.5, "a")]


def test_a_gpu_counts_with_its_first_edge_of_a_step():
    steps, _ = straggler.complete_steps([(1.0, "a"), (1.2, "a"), (1.1, "b"), (9.0, "a")], GROUPING)
    assert steps == [{"a": 1.0, "b": 1.1}]


def test_pending_edges_are_bounded():
    grouping = straggler.StepGrouping(gap_s=0.5, settle_s=100.0, max_pending=3)
    _, rest = straggler.complete_steps([(float(i), "a") for i in range(10)], grouping)
    assert rest == [(7.0, "a"), (8.0, "a"), (9.0, "a")]


def test_slowing_clock_reasons_are_named_and_the_sw_power_cap_is_not():
    assert straggler.clock_signals(0x44) == ("clock event: hardware thermal slowdown",)
    assert straggler.clock_signals(0x4) == ()
    assert straggler.clock_signals(None) == ()
    assert straggler.clock_signals(0x88) == ("clock event: hardware slowdown", "clock event: hardware power brake")
