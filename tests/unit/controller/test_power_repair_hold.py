"""The power loop's hold on resets and reboots: each leaves once, when there is room or after the wait."""

from __future__ import annotations

from rasd.controller.core.power import repairs
from rasd.controller.power import repair_gate

NOW = 1_800_000_000.0


def _repair(command_id: str = "c1", handed_at_s: float = NOW) -> repairs.Repair:
    return repairs.Repair(command_id, "reset_gpu", "n", frozenset({"g"}), "b1", handed_at_s)


def test_a_held_repair_leaves_once_when_a_period_that_counted_it_found_room():
    sent: list[str] = []
    hold = repair_gate.RepairHold(wait_s=10.0)
    hold.add(_repair(), lambda: sent.append("c1") or True)
    gpus, ids = hold.counted()
    assert gpus == {"g"} and ids == {"c1"}
    hold.release(ids, over_budget=True, now_s=NOW + 1)
    assert sent == []
    hold.release(ids, over_budget=False, now_s=NOW + 2)
    hold.release(ids, over_budget=False, now_s=NOW + 3)
    assert sent == ["c1"] and hold.repairs["c1"].sent
    assert hold.nodes_sent() == {"n"}, "its outbox status settles it from now on"


def test_a_repair_handed_over_again_after_it_left_goes_on_at_once():
    sent: list[str] = []
    hold = repair_gate.RepairHold(wait_s=10.0)
    hold.add(_repair(), lambda: sent.append("first") or True)
    hold.release({"c1"}, over_budget=False, now_s=NOW + 1)
    hold.add(_repair(handed_at_s=NOW + 5), lambda: sent.append("re-sent on reconnect") or True)
    assert sent == ["first", "re-sent on reconnect"]


def test_a_repair_waits_at_most_wait_s_and_everything_held_leaves_when_the_loop_stops():
    sent: list[str] = []
    hold = repair_gate.RepairHold(wait_s=10.0)
    hold.add(_repair("c1"), lambda: sent.append("c1") or True)
    hold.add(_repair("c2", handed_at_s=NOW + 5), lambda: sent.append("c2") or True)
    hold.release({"c1", "c2"}, over_budget=True, now_s=NOW + 10)
    assert sent == ["c1"]
    hold.release_all("the power loop stopped")
    assert sent == ["c1", "c2"] and all(r.sent for r in hold.repairs.values())


def test_settled_repairs_stop_counting():
    hold = repair_gate.RepairHold(wait_s=10.0)
    hold.add(_repair(), lambda: True)
    hold.release({"c1"}, over_budget=False, now_s=NOW + 1)
    hold.settle({"c1": "dispatched"}, {"n": "b1"}, {"n"})
    assert hold.counted()[0] == {"g"}
    hold.settle({"c1": "succeeded"}, {"n": "b1"}, {"n"})
    assert hold.counted() == (frozenset(), frozenset())
