"""The pure lease decision: renew, take over after expiry, follow; a new term always gets the next token."""

from __future__ import annotations

import pytest

from rasd.controller.core import lease

S = 1_000_000_000


def test_the_first_look_elects_with_token_1():
    decision = lease.decide(None, replica_id="a", now_unix_ns=10 * S, lease_s=15)
    assert decision.verdict is lease.Verdict.ACQUIRED and decision.leader
    assert decision.lease == lease.Lease("a", 1, 25 * S, 10 * S)


def test_the_holder_renews_in_its_term():
    current = lease.Lease("a", 4, 25 * S, 1 * S)
    decision = lease.decide(current, replica_id="a", now_unix_ns=20 * S, lease_s=15)
    assert decision.verdict is lease.Verdict.RENEWED
    assert decision.lease == lease.Lease("a", 4, 35 * S, 1 * S)


def test_another_replica_follows_an_unexpired_lease_and_writes_nothing():
    current = lease.Lease("a", 4, 25 * S)
    decision = lease.decide(current, replica_id="b", now_unix_ns=21 * S, lease_s=15)
    assert decision.verdict is lease.Verdict.FOLLOWING and not decision.leader
    assert decision.lease is None
    assert "a leads term 4 (4.0 s left)" in decision.reason


def test_an_expired_lease_is_taken_with_the_next_token():
    current = lease.Lease("a", 4, 25 * S)
    decision = lease.decide(current, replica_id="b", now_unix_ns=25 * S, lease_s=15)
    assert decision.verdict is lease.Verdict.ACQUIRED
    assert decision.lease == lease.Lease("b", 5, 40 * S, 25 * S)
    assert "a stopped renewing" in decision.reason


def test_a_lapsed_own_term_is_a_new_term():
    current = lease.Lease("a", 4, 25 * S)
    decision = lease.decide(current, replica_id="a", now_unix_ns=30 * S, lease_s=15)
    assert decision.verdict is lease.Verdict.ACQUIRED and decision.lease.fencing_token == 5


def test_a_released_lease_is_taken_at_once_and_the_token_still_grows():
    current = lease.Lease("a", 4, 25 * S)
    released = lease.release(current, replica_id="a", now_unix_ns=20 * S)
    assert released == lease.Lease("", 4, 20 * S)
    decision = lease.decide(released, replica_id="b", now_unix_ns=20 * S + 1, lease_s=15)
    assert decision.verdict is lease.Verdict.ACQUIRED and decision.lease.fencing_token == 5
    assert "released" in decision.reason


def test_only_the_holder_of_a_live_lease_can_release_it():
    current = lease.Lease("a", 4, 25 * S)
    assert lease.release(current, replica_id="b", now_unix_ns=20 * S) is None
    assert lease.release(current, replica_id="a", now_unix_ns=26 * S) is None
    assert lease.release(None, replica_id="a", now_unix_ns=0) is None


def test_tokens_never_repeat_over_many_terms():
    current, tokens = None, []
    for step in range(50):
        replica = "abc"[step % 3]
        now = step * 20 * S  # every look comes after the previous lease expired
        decision = lease.decide(current, replica_id=replica, now_unix_ns=now, lease_s=15)
        current = decision.lease
        tokens.append(current.fencing_token)
    assert tokens == list(range(1, 51))


def test_a_leader_steps_down_before_anyone_may_take_over():
    assert lease.holds_until(100.0, 15.0, margin_s=1.0) == 114.0


def test_a_follower_looks_just_after_expiry_and_a_leader_every_renew_period():
    current = lease.Lease("a", 4, 25 * S)
    assert lease.next_look_s(current, leader=True, now_unix_ns=20 * S, renew_s=5) == 5
    assert lease.next_look_s(current, leader=False, now_unix_ns=23 * S, renew_s=5) == pytest.approx(2.05)
    assert lease.next_look_s(current, leader=False, now_unix_ns=10 * S, renew_s=5) == 5
    assert lease.next_look_s(current, leader=False, now_unix_ns=30 * S, renew_s=5) == 0.05


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="replica_id"):
        lease.decide(None, replica_id="", now_unix_ns=0, lease_s=15)
    with pytest.raises(ValueError, match="lease_s"):
        lease.decide(None, replica_id="a", now_unix_ns=0, lease_s=0)
