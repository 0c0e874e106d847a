"""A straggler named on the follower is acted on by the leader (the chart's default: two replicas on PostgreSQL).

Each replica's straggler watch judges the GPUs whose streams it holds; its effects go to the store and
the leader carries them out in order: the audit rows, and the quarantine rung through the ladder. The
watch itself is tested apart (tests/unit/controller/test_straggler_watch.py); here the follower's watch
hands its effects to its actuator as it does after naming a suspect.
"""

from __future__ import annotations

import asyncio

import fleetlib

from rasd.controller.core import straggler_actions
from rasd.controller.store import relay as relay_store


async def _until(predicate, timeout_s: float = 20.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.05)


def test_a_suspect_on_the_follower_is_quarantined_by_the_leaders_ladder(postgres_schema_url, tmp_path):
    async def scenario():
        async with fleetlib.two_replicas_a_node_on_the_follower(postgres_schema_url, tmp_path) as replicas:
            leader, follower = replicas.first, replicas.second
            slow = replicas.backend.inventory()[1].uuid
            watch = follower.ingest.stragglers
            assert watch.actuator is not None  # with several replicas too: effects go to the leader
            watch.actuator(
                [
                    straggler_actions.Effect("notify", slow, "node-r", "edge lags the job's median by 40 ms"),
                    straggler_actions.Effect("quarantine", slow, "node-r", "still lags after validation"),
                ]
            )
            ladder = leader.remediation
            await _until(lambda: any(q["gpu_uuid"] == slow for q in ladder.store.quarantines()))
            # The count moves after the store forgets them, so wait on the count: the store alone may
            # already be empty while the relay has not yet resumed from its forget.
            await _until(lambda: follower.relay.straggler_effects_carried + leader.relay.straggler_effects_carried >= 2)
            assert not relay_store.RelayStore(leader.store.engine).straggler_effects()
            audit = [a for a in ladder.store.audit(limit=1000) if a["actor"] == "straggler-watch"]
            tickets = ladder.store.tickets(open_only=True)
            return (
                slow,
                audit,
                tickets,
                follower.relay.straggler_effects_carried,
                leader.relay.straggler_effects_carried,
            )

    slow, audit, tickets, carried_by_follower, carried_by_leader = asyncio.run(scenario())
    assert sorted((a["action"], a["gpu_uuid"]) for a in audit) == [
        ("straggler_notify", slow),
        ("straggler_quarantine", slow),
    ]
    (ticket,) = tickets
    assert (ticket["node_id"], ticket["gpu_uuid"], ticket["state"]) == ("node-r", slow, "awaiting_operator")
    assert (carried_by_follower, carried_by_leader) == (0, 2)  # the leader acted; the follower only kept them


def test_kept_effects_come_back_in_order_and_go_once_forgotten(postgres_schema_url):
    from rasd.controller.store import repo

    store = repo.Store.open(postgres_schema_url)
    try:
        records = relay_store.RelayStore(store.engine)
        effects = [
            straggler_actions.Effect("notify", "GPU-a", "node-1", "named"),
            straggler_actions.Effect("raise_cap", "GPU-a", "node-1", "power-braked", to_w=650.0),
            straggler_actions.Effect("clear", "GPU-b", "node-2", "quiet"),
        ]
        records.keep_straggler_effects(effects[:2], replica_id="ctl-b", now_unix_ns=1)
        records.keep_straggler_effects(effects[2:], replica_id="ctl-a", now_unix_ns=2)
        kept = records.straggler_effects()
        assert [effect for _id, effect in kept] == effects
        records.forget_straggler_effects([kept[0][0], kept[1][0]])
        assert [effect for _id, effect in records.straggler_effects()] == effects[2:]
    finally:
        store.close()
