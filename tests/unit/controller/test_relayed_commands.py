"""Relayed commands (the power loop's caps to nodes on other replicas) in the store: grouped, and cleaned up.

- A power period sends one SetPowerCap per node at once; relayed, each was a transaction to write
  and another to withdraw on the leader's store thread. Those waiting together now share one.
- Only the sender withdrew a relayed command (once answered or given up); a sender killed meanwhile
  (a leader SIGKILLed mid-period) left the command and its result in the store for good. The leader
  now drops those long past their expiry; a live sender's stay.
"""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from prometheus_client import CollectorRegistry
from sqlalchemy import event as sa_event

from rasd.api.v1 import commands_pb2 as commands_pb
from rasd.controller import wiring
from rasd.controller.core import agent_messages as msgs
from rasd.controller.ingest import service as ingest_mod
from rasd.controller.observability import metrics
from rasd.controller.replication import leader
from rasd.controller.replication import relay as relay_mod
from rasd.controller.store import repo


@pytest.fixture
def store(tmp_path):
    opened = repo.Store.open(f"sqlite:///{tmp_path / 'rasd.db'}")
    yield opened
    opened.close()


@pytest.fixture
def relay_only(store):
    """Makes a replica on store that runs no ladder (its relay and courier alone); its thread closes after the test."""
    made: list[wiring.Wired] = []

    def make(replica_id: str, election: str = "lease") -> wiring.Wired:
        leadership = leader.Leadership(store.engine, leader.LeaderSettings(replica_id=replica_id), election=election)
        made.append(wiring.replicated(store, metrics.ControllerMetrics(CollectorRegistry()), leadership, ladder=None,
                                      settings=ingest_mod.IngestSettings(), poll_s=0.05))  # fmt: skip
        return made[-1]

    yield make
    for wired in made:
        wired.thread.close()


def test_the_leader_drops_relayed_commands_long_past_their_expiry_with_their_results(relay_only):
    wired = relay_only("ctl-b", election="static")
    relay, records = wired.relay, wired.relay.store
    now = time.time_ns()
    dead_expired = now - int((relay_mod.ABANDONED_AFTER_S + 5) * 1e9)
    for command_id, expires in (("cap-dead-1", dead_expired), ("cap-live-1", now + 10**10)):
        records.relay_command(command_id=command_id, node_id="n1", command=b"c", replica_id="ctl-a",
                              now_unix_ns=expires - 10**10, expires_unix_ns=expires)  # fmt: skip
        records.save_result(command_id=command_id, node_id="n1", result=b"r", replica_id="ctl-b", now_unix_ns=now,
                            relayed=True)  # fmt: skip

    async def scenario():
        await relay.leadership.start()
        try:
            await relay.take_in()
        finally:
            await relay.leadership.stop()

    asyncio.run(scenario())
    left = [command_id for command_id, _node, _payload in records.relayed_commands(0)]
    results = records.results_of(["cap-dead-1", "cap-live-1"])
    assert left == ["cap-live-1"]
    assert set(results) == {"cap-live-1"}
    assert relay.abandoned_dropped == 1


def test_commands_relayed_at_once_are_written_and_withdrawn_in_few_transactions(store, relay_only):
    commits: list[int] = []
    sa_event.listen(store.engine, "commit", lambda _conn: commits.append(1))
    wired = relay_only("ctl-a")

    async def period():
        # 200 nodes no replica holds: each command waits out its timeout and is withdrawn.
        sends = [
            wired.relay.send_command(f"node-{n}", commands_pb.Command(command_id=f"cap-e-{n}"), timeout_s=0.5)
            for n in range(200)
        ]
        return await asyncio.gather(*sends, return_exceptions=True)

    outcomes = asyncio.run(period())
    left = wired.relay.store.relayed_commands(0)
    assert all(isinstance(o, TimeoutError) for o in outcomes)
    assert left == []
    assert len(commits) <= 4, f"{len(commits)} transactions for 200 relayed commands"


def test_results_arriving_at_once_are_stored_in_few_transactions_and_each_kept_once(store, relay_only):
    """A power period's caps come back from every node of a follower at once (a transaction each took seconds)."""
    commits: list[int] = []
    sa_event.listen(store.engine, "commit", lambda _conn: commits.append(1))
    wired = relay_only("ctl-b")

    async def answers():
        results = [
            wired.relay.result(f"node-{n}", msgs.AgentResult(f"cap-e-{n}", msgs.Outcome.SUCCEEDED)) for n in range(200)
        ]
        await asyncio.gather(*results)
        await wired.relay.result("node-7", msgs.AgentResult("cap-e-7", msgs.Outcome.SUCCEEDED))

    commits.clear()
    asyncio.run(answers())
    kept = wired.relay.store.results(limit=1000)
    assert sorted(command_id for command_id, _node, _payload in kept) == sorted(f"cap-e-{n}" for n in range(200))
    assert len(commits) <= 4, f"{len(commits)} transactions for 200 results"
    assert wired.relay.results_relayed == 201  # the repeat is taken, and kept once


def test_a_relayed_commands_result_goes_to_its_sender_and_never_to_the_ladder(relay_only):
    """The replica that delivered a relayed command marks its result: the ladder's reads pass it by
    without an anti-join over every relayed command (a third of the leader's store thread at 12,500 caps)."""
    wired = relay_only("ctl-b")
    records, now = wired.relay.store, time.time_ns()
    for command_id, sender in (("cap-from-a", "ctl-a"), ("cap-from-c", "ctl-c")):
        records.relay_command(command_id=command_id, node_id="n1", command=b"c", replica_id=sender,
                              now_unix_ns=now, expires_unix_ns=now + 10**10)  # fmt: skip

    async def answers():
        wired.relay.courier.relayed_sent.update({"cap-from-a", "cap-from-c"})  # as `deliver_pending` leaves it
        await wired.relay.result("n1", msgs.AgentResult("cap-from-a", msgs.Outcome.SUCCEEDED))
        await wired.relay.result("n1", msgs.AgentResult("cap-from-c", msgs.Outcome.SUCCEEDED))
        await wired.relay.result("n1", msgs.AgentResult("restart-1", msgs.Outcome.SUCCEEDED))  # the ladder's

    asyncio.run(answers())
    ladder = [command_id for command_id, _node, _payload in records.results()]
    for_a, for_c = records.results_for("ctl-a"), records.results_for("ctl-c")
    assert ladder == ["restart-1"]
    assert list(for_a) == ["cap-from-a"] and list(for_c) == ["cap-from-c"]


def test_a_relayed_command_stored_after_its_deadline_gives_up_at_once_and_is_withdrawn(relay_only):
    """No courier delivers a row past its expiry: the sender does not wait another whole timeout for it."""
    wired = relay_only("ctl-a")
    busy_started = threading.Event()

    def long_call() -> None:
        busy_started.set()
        time.sleep(0.8)

    async def send():
        busy = asyncio.create_task(wired.thread.run(long_call))  # the store thread behind a long queue
        # Sent once the long call runs (the thread may finish a poll of the courier first), so the
        # write is stored 0.8 s after the send however late the call started; the 0.5 s deadline
        # leaves room for a stall of the test's own loop.
        while not busy_started.is_set():
            await asyncio.sleep(0.001)
        started = time.monotonic()
        with pytest.raises(TimeoutError, match="stored after its deadline"):
            await wired.relay.send_command("node-far", commands_pb.Command(command_id="cap-late"), timeout_s=0.5)
        waited_s = time.monotonic() - started
        await busy
        return waited_s

    waited_s = asyncio.run(send())
    left = wired.relay.store.relayed_commands(0)
    assert waited_s < 1.1, f"waited {waited_s:.2f} s for a command stored 0.8 s after it was sent (timeout 0.5 s)"
    assert left == []


def test_a_periods_commands_sent_together_each_get_one_outcome_as_it_comes(store, relay_only):
    """`Courier.send_many` (a power period's caps): answered ones hand over their results, the rest time out,
    every one once; written and withdrawn in a few transactions, and nothing is left in the store."""
    sender, holder = relay_only("ctl-a"), relay_only("ctl-b")
    commits: list[int] = []
    sa_event.listen(store.engine, "commit", lambda _conn: commits.append(1))
    outcomes: dict[int, list] = {}

    def on_result(index, outcome):
        outcomes.setdefault(index, []).append(outcome)

    async def period():
        commands = [(f"node-{n}", commands_pb.Command(command_id=f"cap-m-{n}")) for n in range(300)]
        sending = asyncio.create_task(sender.relay.courier.send_many(commands, timeout_s=1.0, on_result=on_result))
        while len(sender.relay.store.relayed_commands(0)) < 300:  # written (as the holder's courier finds them)
            await asyncio.sleep(0.01)
        holder.relay.courier.relayed_sent.update({"cap-m-3", "cap-m-250"})  # as `deliver_pending` leaves them
        for n in (3, 250):
            await holder.relay.result(f"node-{n}", msgs.AgentResult(f"cap-m-{n}", msgs.Outcome.SUCCEEDED))
        await sender.relay.courier.collect_awaited()
        await asyncio.sleep(0.05)  # the futures' callbacks run on the loop's next turns
        answered_early = sorted(outcomes)
        await sending
        return answered_early

    answered_early = asyncio.run(period())
    assert answered_early == [3, 250], "a result goes to its sender as it comes, not at the deadline"
    assert sorted(outcomes) == list(range(300)) and all(len(o) == 1 for o in outcomes.values())
    assert [o[0].command_id for i, o in sorted(outcomes.items()) if i in (3, 250)] == ["cap-m-3", "cap-m-250"]
    assert all(isinstance(o[0], TimeoutError) for i, o in outcomes.items() if i not in (3, 250))
    assert sender.relay.store.relayed_commands(0) == []
    assert len(commits) <= 8, f"{len(commits)} transactions for 300 relayed commands and 2 results"


def test_a_replica_reads_only_the_relayed_commands_of_its_own_nodes_oldest_first(relay_only, monkeypatch):
    from rasd.controller.store import relay as relay_store

    monkeypatch.setattr(relay_store, "RELAYED_NODES_PER_QUERY", 2)  # several queries, merged in time order
    records = relay_only("ctl-b", election="static").relay.store
    now = time.time_ns()
    rows = [(f"cap-{i}", f"n{i % 5}", b"c", "ctl-a", now + (10 - i), now + 10**10) for i in range(10)]
    rows.append(("cap-old", "n1", b"c", "ctl-a", now - 10**10, now - 1))  # expired: nobody sends it
    records.relay_commands(rows)

    mine = records.relayed_commands(now, ["n1", "n3", "n4"])

    assert [(command_id, node) for command_id, node, _payload in mine] == [
        ("cap-9", "n4"), ("cap-8", "n3"), ("cap-6", "n1"), ("cap-4", "n4"), ("cap-3", "n3"), ("cap-1", "n1"),
    ]  # fmt: skip
    assert len(records.relayed_commands(now)) == 10
    assert records.relayed_commands(now, []) == []
