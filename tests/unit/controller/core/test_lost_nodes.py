"""The lost-node judgement: silent in-service nodes are named once; busy nodes, old silences and storms are not."""

from __future__ import annotations

import dataclasses

import pytest

from rasd.controller.core.remediation import lost_nodes, policy

POL = policy.LostNodePolicy()  # lost after 60 s; storms above max(16, 5 % of the nodes seen)
T0 = 1_800_000_000.0


def _seen(node: str, at_s: float, *, judged: bool = True) -> lost_nodes.Sighting:
    return lost_nodes.Sighting(node, at_s, judged)


def _judge(state, sightings, now_s):
    return lost_nodes.judge(state, sightings, now_s=now_s, pol=POL)


def test_a_node_silent_for_lost_after_s_is_named_once_and_again_only_after_it_was_heard_from():
    state = lost_nodes.WatchState(started_s=T0)
    fleet = [_seen("a", T0 + 10), _seen("b", T0 + 69)]
    early = _judge(state, fleet, T0 + 69.9)
    assert early.lost == () and early.silent == 0

    named = _judge(state, fleet, T0 + 70)
    assert [(n.node_id, n.silent_s) for n in named.lost] == [("a", 60.0)]
    assert named.silent == 1 and not named.storm

    again = _judge(named.state, fleet, T0 + 200)
    assert [n.node_id for n in again.lost] == ["b"]  # b's turn; a is not named twice
    assert again.silent == 2

    back = [_seen("a", T0 + 300), _seen("b", T0 + 69)]  # a was heard from again
    assert _judge(again.state, back, T0 + 301).lost == ()
    silent_again = _judge(again.state, back, T0 + 360)
    assert [n.node_id for n in silent_again.lost] == ["a"]


def test_silence_counts_from_the_watch_start_and_nodes_silent_before_this_term_are_not_judged():
    state = lost_nodes.WatchState(started_s=T0)
    fleet = [
        _seen("failed-over", T0 - 20),  # went silent during the failover: counted from the start
        _seen("long-gone", T0 - 61),  # silent since before this term could have seen it alive
    ]
    assert _judge(state, fleet, T0 + 59).lost == ()
    judged = _judge(state, fleet, T0 + 60)
    assert [(n.node_id, n.silent_s) for n in judged.lost] == [("failed-over", 60.0)]
    assert judged.silent == 1


def test_a_node_the_ladder_is_working_on_is_counted_silent_but_never_named():
    judged = _judge(lost_nodes.WatchState(started_s=T0), [_seen("rebooting", T0, judged=False)], T0 + 600)
    assert judged.lost == ()
    assert judged.silent == 1


def test_more_nodes_silent_at_once_than_hosts_explain_is_a_storm_and_none_is_named():
    state = lost_nodes.WatchState(started_s=T0)
    live = [_seen(f"live-{i}", T0 + 100) for i in range(400)]
    rack = [_seen(f"rack-{i}", T0 + 10) for i in range(16)]
    assert [n.node_id for n in _judge(state, live + rack, T0 + 100).lost] == [f"rack-{i}" for i in range(16)]

    partition = [_seen(f"cut-{i}", T0 + 10) for i in range(30)]  # 30 > max(16, 5 % of 430 = 21)
    stormy = _judge(state, live + partition, T0 + 100)
    assert stormy.storm and stormy.lost == () and stormy.silent == 30
    assert stormy.state.reported == {}  # judged again at the next check

    big_fleet = [_seen(f"live-{i}", T0 + 100) for i in range(1000)]
    assert [len(_judge(state, big_fleet + partition, T0 + 100).lost)] == [30]  # under 5 % of 1,030


def test_a_node_heard_from_after_it_was_named_is_released_once_and_left_to_a_person_when_it_relapses():
    state = lost_nodes.WatchState(started_s=T0)
    named = _judge(state, [_seen("a", T0)], T0 + 60)
    assert [n.node_id for n in named.lost] == ["a"] and named.release == ()

    back = _judge(named.state, [_seen("a", T0 + 500, judged=False)], T0 + 501)  # quarantined, streaming again
    assert (back.release, back.relapsed, back.lost) == (("a",), (), ())
    assert back.state.reported == {} and back.state.returned == {"a": T0 + 501}
    assert _judge(back.state, [_seen("a", T0 + 510, judged=False)], T0 + 511).release == ()  # once only

    released = _judge(back.state, [_seen("a", T0 + 1000)], T0 + 1000)  # validated and released: in service
    lost_again = _judge(released.state, [_seen("a", T0 + 1000)], T0 + 1060)
    assert [n.node_id for n in lost_again.lost] == ["a"]
    relapse = _judge(lost_again.state, [_seen("a", T0 + 2000, judged=False)], T0 + 2000)
    assert (relapse.release, relapse.relapsed) == ((), ("a",))  # back twice within a day: a person looks

    day_later = dataclasses.replace(lost_again.state, returned={"a": T0 + 501 - POL.relapse_window_s})
    assert _judge(day_later, [_seen("a", T0 + 2000, judged=False)], T0 + 2000).release == ("a",)


def test_a_node_named_and_gone_from_the_store_is_forgotten():
    named = _judge(lost_nodes.WatchState(started_s=T0), [_seen("a", T0)], T0 + 60)
    assert named.state.reported == {"a": T0}
    assert _judge(named.state, [], T0 + 70).state.reported == {}


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("lost_after_s", 19),
        ("check_interval_s", -1),
        ("relapse_window_s", 0),
        ("storm_min_nodes", 0),
        ("storm_fraction_pct", 101),
    ],
)
def test_a_bad_setting_is_refused_naming_its_key(key, value):
    with pytest.raises(policy.PolicyError, match=rf"^remediation\.lost_nodes\.{key}: "):
        policy.RemediationPolicy.from_mapping({"lost_nodes": {key: value}}, prefix="remediation.")
