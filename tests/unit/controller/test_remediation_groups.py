"""Group commit: events waiting together are decided in one pass and committed in one transaction.

A burst must not change what is decided: the same events decided in one pass give the same ladder
as one call at a time, and a pass whose commit fails loses no event and dispatches nothing.
"""

from __future__ import annotations

import asyncio
import time

import pytest
import sqlalchemy as sa
from prometheus_client import CollectorRegistry

from rasd.controller import ingest as ingest_mod
from rasd.controller import metrics
from rasd.controller import remediation as remediation_mod
from rasd.controller.core import fleet, health
from rasd.controller.store import remediation as rstore
from rasd.controller.store import repo

NOW_NS = 1_800_000_000 * 10**9
GPUS = [f"GPU-00000000-0000-4000-8000-00000000000{i}" for i in range(2)]


def _hello(node_id: str) -> fleet.NodeHello:
    gpus = tuple(
        fleet.GpuRecord(g, node_id, "H100", f"0000:{0x18 + i:02x}:00.0", 200, 700, 700) for i, g in enumerate(GPUS)
    )
    return fleet.NodeHello(node_id, "boot-1", "0.1.0", node_id, "simulated", {"rack": "r1"}, gpus, 0)


def _event(node_id: str, seq: int, xid: int, gpu: str = GPUS[0]) -> repo.StoredEvent:
    return repo.StoredEvent(
        node_id=node_id, seq=seq, observed_unix_ns=NOW_NS - 10**6, received_unix_ns=NOW_NS,
        kind=int(health.EventKind.XID), severity=int(health.Severity.ERROR), gpu_uuid=gpu, xid=xid,
        message=f"NVRM: Xid (PCI:0000:18:00): {xid}", source="kmsg", attributes={},
    )  # fmt: skip


# The same GPU: a restart, its duplicate, a DBE that needs a reset (supersedes the restart), its
# Xid 45 cleanup (secondary), and a fault on the node's other GPU.
EVENTS = [(1, 13, GPUS[0]), (2, 13, GPUS[0]), (3, 48, GPUS[0]), (4, 45, GPUS[0]), (5, 31, GPUS[1])]


class _Rig:
    def __init__(self, url: str) -> None:
        self.store = repo.Store.open(url)
        self.ingest = ingest_mod.Ingest(
            self.store, metrics.ControllerMetrics(CollectorRegistry()), clock=lambda: NOW_NS
        )
        self.service = remediation_mod.RemediationService(self.store, self.ingest, clock=lambda: NOW_NS)
        self.store.register_hello(_hello("node-1"), NOW_NS)
        self.ingest.node_labels["node-1"] = {"rack": "r1"}
        self.commits = 0
        commit = self.service.store.commit

        def counting(change: rstore.Commit) -> list[str]:
            self.commits += 1
            return commit(change)

        self.service.store.commit = counting  # type: ignore[method-assign]

    async def start(self) -> None:
        await self.ingest.start()
        await self.service.start()

    async def stop(self) -> None:
        await self.service.stop()
        await self.ingest.stop()
        self.store.close()

    def ladder(self) -> tuple:  # after `service.settled()`
        """What was decided: tickets (ids, state, rung, step, history, reason, held, pending command) and the outbox."""
        state = self.service.node_states["node-1"]
        tickets = [
            (t.ticket_id, t.state, t.rung, t.step, t.history, t.reason, t.held, t.pending) for t in state.tickets
        ]
        commands = [(c.command_id, c.kind, c.reason) for c in self.service.store.commands()]
        incidents = sorted((i["incident_id"], i["data"]["event_count"]) for i in self.service.store.incidents())
        return tickets, sorted(commands), incidents


@pytest.fixture
def rig(store_url):
    return _Rig(store_url)


def test_a_pass_of_one_gpus_events_decides_the_ladder_that_one_call_at_a_time_decides(tmp_path):
    async def run(together: bool) -> tuple:
        rig = _Rig(f"sqlite:///{tmp_path / ('together.db' if together else 'apart.db')}")
        await rig.start()
        try:
            events = [_event("node-1", seq, xid, gpu) for seq, xid, gpu in EVENTS]
            if together:  # all waiting before the decider runs: one pass
                before = rig.commits
                await asyncio.gather(*(rig.service.on_events("node-1", [e], {"rack": "r1"}) for e in events))
                await rig.service.settled()
                assert rig.commits - before <= 2, "one decision commit and one dispatch commit for the whole group"
            else:
                for event in events:
                    await rig.service.on_events("node-1", [event], {"rack": "r1"})
                    await rig.service.settled()
            return rig.ladder()
        finally:
            await rig.stop()

    apart, together = asyncio.run(run(False)), asyncio.run(run(True))
    assert together == apart
    tickets, commands, incidents = together
    assert len(tickets) == 2 and len(commands) >= 3, "both GPUs got a ticket; restart, quarantine and reset decided"
    assert [count for _id, count in incidents if "xid:13" in _id] == [2], "the duplicate folded into its incident"


def test_a_failed_group_commit_loses_no_event_and_dispatches_nothing(rig, monkeypatch):
    async def run() -> None:
        await rig.start()
        sent: list[str] = []
        rig.service.send_hook = lambda action: sent.append(action.command_id) or True
        monkeypatch.setattr(remediation_mod, "STORE_RETRY_S", 0.05)
        commit = rig.service.store.commit
        failures = {"left": 2}

        def flaky(change: rstore.Commit) -> list[str]:
            if failures["left"]:
                failures["left"] -= 1
                assert not sent, "nothing is dispatched before its decision is durable"
                raise sa.exc.OperationalError("COMMIT", {}, Exception("database is locked"))
            return commit(change)

        rig.service.store.commit = flaky  # type: ignore[method-assign]
        events = [_event("node-1", seq, xid, gpu) for seq, xid, gpu in EVENTS]
        await asyncio.wait_for(
            asyncio.gather(*(rig.service.on_events("node-1", [e], {"rack": "r1"}) for e in events)), timeout=10
        )
        await rig.service.settled()
        assert failures["left"] == 0
        commands = rig.service.store.commands()
        assert len({c.command_id for c in commands}) == len(commands), "each decided command is in the outbox once"
        assert sorted(sent) == sorted(c.command_id for c in commands if c.status == "dispatched" and c.kind in
                                      remediation_mod.AGENT_KINDS)  # fmt: skip
        assert rig.service.stats.events == len(events), "every event decided, and counted once"
        assert rig.service.store.unprocessed_events() == {}, "the replay watermark covers every event"
        await rig.stop()

    asyncio.run(run())


def test_a_group_whose_commit_is_refused_leaves_its_events_for_the_replay(rig):
    async def run() -> None:
        await rig.start()
        sent: list[str] = []
        rig.service.send_hook = lambda action: sent.append(action.command_id) or True

        def refused(change: rstore.Commit) -> list[str]:
            raise RuntimeError("fenced: another replica leads")

        rig.service.store.commit = refused  # type: ignore[method-assign]
        stored = [_event("node-1", seq, xid, gpu) for seq, xid, gpu in EVENTS]
        rig.store.append_events("node-1", stored)
        results = await asyncio.gather(
            *(rig.service.on_events("node-1", [e], {"rack": "r1"}) for e in stored), return_exceptions=True
        )
        assert all(isinstance(r, RuntimeError) for r in results), "every caller of the group hears of the failure"
        assert sent == [] and rig.service.store.commands() == []
        assert rig.service.node_states == {} and rig.service.correlation.incidents == {}, "memory follows the store"
        backlog = rig.service.store.unprocessed_events()
        assert [e.seq for e in backlog["node-1"][1]] == [seq for seq, _xid, _gpu in EVENTS]
        await rig.stop()

    asyncio.run(run())


class _CommitWatch:
    """Watches the service's commits: slows each, fails the first few, counts groups decided while one is in flight."""

    def __init__(self, rig: _Rig, *, fail_first: int = 0) -> None:
        self.in_flight = 0
        self.decided_during_commit = 0
        self.fail_left = fail_first
        commit = rig.service.store.commit

        def slow(change: rstore.Commit) -> list[str]:
            time.sleep(0.03)  # long enough that the next group is decided while this one commits
            if self.fail_left:
                self.fail_left -= 1
                raise sa.exc.OperationalError("COMMIT", {}, Exception("database is locked"))
            return commit(change)

        rig.service.store.commit = slow  # type: ignore[method-assign]
        submit = rig.ingest.submit_to_store

        def submitted(fn, *args):  # type: ignore[no-untyped-def]
            future = submit(fn, *args)
            self.in_flight += 1
            future.add_done_callback(lambda _f: setattr(self, "in_flight", self.in_flight - 1))
            return future

        rig.ingest.submit_to_store = submitted  # type: ignore[method-assign]
        decide = rig.service._decide_pass

        def counting(group, base):  # type: ignore[no-untyped-def]
            if self.in_flight:
                self.decided_during_commit += 1
            return decide(group, base)

        rig.service._decide_pass = counting  # type: ignore[method-assign]


def test_groups_decided_during_the_commit_before_them_decide_what_one_call_at_a_time_decides(tmp_path, monkeypatch):
    # One call per group: five groups, each decided while the one before it commits.
    monkeypatch.setattr(remediation_mod, "MAX_GROUP_EVENTS", 1)

    async def run(pipelined: bool) -> tuple:
        rig = _Rig(f"sqlite:///{tmp_path / ('pipelined.db' if pipelined else 'apart.db')}")
        await rig.start()
        try:
            events = [_event("node-1", seq, xid, gpu) for seq, xid, gpu in EVENTS]
            if pipelined:
                watch = _CommitWatch(rig)
                await asyncio.gather(*(rig.service.on_events("node-1", [e], {"rack": "r1"}) for e in events))
                await rig.service.settled()
                assert watch.decided_during_commit >= 2, "the next group was decided while a commit ran"
            else:
                for event in events:
                    await rig.service.on_events("node-1", [event], {"rack": "r1"})
                    await rig.service.settled()
            assert rig.service.stats.events == len(events)
            return rig.ladder()
        finally:
            await rig.stop()

    assert asyncio.run(run(True)) == asyncio.run(run(False))


def test_a_failed_commit_discards_the_group_decided_during_it_and_loses_no_event(rig, monkeypatch):
    monkeypatch.setattr(remediation_mod, "MAX_GROUP_EVENTS", 1)
    monkeypatch.setattr(remediation_mod, "STORE_RETRY_S", 0.05)

    async def run() -> None:
        await rig.start()
        sent: list[str] = []
        rig.service.send_hook = lambda action: sent.append(action.command_id) or True
        watch = _CommitWatch(rig, fail_first=1)
        events = [_event("node-1", seq, xid, gpu) for seq, xid, gpu in EVENTS]
        await asyncio.wait_for(
            asyncio.gather(*(rig.service.on_events("node-1", [e], {"rack": "r1"}) for e in events)), timeout=10
        )
        await rig.service.settled()
        assert watch.fail_left == 0 and watch.decided_during_commit >= 1, "a group was decided during the failed commit"
        commands = rig.service.store.commands()
        assert len({c.command_id for c in commands}) == len(commands), "each decided command is in the outbox once"
        assert sorted(sent) == sorted(c.command_id for c in commands if c.status == "dispatched" and c.kind in
                                      remediation_mod.AGENT_KINDS)  # fmt: skip
        assert rig.service.stats.events == len(events), "every event decided, and counted once"
        assert rig.service.store.unprocessed_events() == {}, "the replay watermark covers every event"
        incidents = {i["incident_id"]: i["data"]["event_count"] for i in rig.service.store.incidents()}
        assert [n for i, n in incidents.items() if "xid:13" in i] == [2], "no event counted twice in its incident"
        await rig.stop()

    asyncio.run(run())


def test_waiting_actions_are_admitted_between_groups_and_decide_what_one_call_at_a_time_decides(tmp_path, monkeypatch):
    # Xid 48 first: its quarantine and reset wait for admission (two steps) while later groups are
    # decided, so a dispatch pass runs inside the pipeline, during the commit of the group before it.
    events_spec = [(1, 48, GPUS[0]), (2, 45, GPUS[0]), (3, 13, GPUS[1]), (4, 13, GPUS[1]), (5, 31, GPUS[1])]
    monkeypatch.setattr(remediation_mod, "MAX_GROUP_EVENTS", 1)

    async def run(pipelined: bool) -> tuple:
        rig = _Rig(f"sqlite:///{tmp_path / ('pipelined.db' if pipelined else 'apart.db')}")
        await rig.start()
        dispatch_passes: list[int] = []
        decide_dispatch = rig.service._decide_dispatch

        async def counting(base):  # type: ignore[no-untyped-def]
            dispatch = await decide_dispatch(base)
            if dispatch is not None:
                dispatch_passes.append(len(dispatch.admitted))
            return dispatch

        rig.service._decide_dispatch = counting  # type: ignore[method-assign]
        try:
            events = [_event("node-1", seq, xid, gpu) for seq, xid, gpu in events_spec]
            if pipelined:
                _CommitWatch(rig)
                await asyncio.gather(*(rig.service.on_events("node-1", [e], {"rack": "r1"}) for e in events))
                await rig.service.settled()
                assert dispatch_passes and dispatch_passes[0] >= 2, "the quarantine and reset went in a dispatch pass"
            else:
                for event in events:
                    await rig.service.on_events("node-1", [event], {"rack": "r1"})
                    await rig.service.settled()
            quarantined = rig.service.store.quarantines(node_id="node-1")
            return rig.ladder(), sorted((q["gpu_uuid"], q["reason"]) for q in quarantined)
        finally:
            await rig.stop()

    assert asyncio.run(run(True)) == asyncio.run(run(False))
