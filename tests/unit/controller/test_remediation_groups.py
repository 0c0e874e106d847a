"""Group commit: events waiting together are decided in one pass and committed in one transaction.

A burst must not change what is decided: the same events decided in one pass give the same ladder
as one call at a time, and a pass whose commit fails loses no event and dispatches nothing.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
import threading
import time

import pytest
import sqlalchemy as sa
from prometheus_client import CollectorRegistry

from rasd.controller import wiring
from rasd.controller.core import agent_messages as msgs
from rasd.controller.core import fleet
from rasd.controller.core.remediation import actions
from rasd.controller.core.remediation import events as health
from rasd.controller.core.remediation import policy as policy_mod
from rasd.controller.executors import quarantine
from rasd.controller.observability import metrics
from rasd.controller.remediation import decider, passes
from rasd.controller.remediation import outlet as outlet_mod
from rasd.controller.remediation import service as remediation_mod
from rasd.controller.store import remediation as rstore
from rasd.controller.store import repo
from rasd.controller.store import writer as store_writer

NOW_NS = 1_800_000_000 * 10**9
GPUS = [f"GPU-00000000-0000-4000-8000-00000000000{i}" for i in range(2)]


def _hello(node_id: str) -> fleet.NodeHello:
    gpus = tuple(
        fleet.GpuRecord(g, "H100", f"0000:{0x18 + i:02x}:00.0", 200, 700, 700, node_id=node_id)
        for i, g in enumerate(GPUS)
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


class _Outlet:
    """Where the ladder's agent commands go: this replica's streams, or, once `capture` is on, a list (every node
    reachable), as the relay's courier takes them with several replicas."""

    def __init__(self) -> None:
        self.streams = None
        self.sent: list[str] | None = None

    def capture(self) -> list[str]:
        self.sent = []
        return self.sent

    def send(self, action: actions.Action, *, deadline_unix_ns: int | None = None) -> bool:
        if self.sent is None:
            return self.streams.send(action, deadline_unix_ns=deadline_unix_ns)
        self.sent.append(action.command_id)
        return True

    async def validate(self, node_id, run, *, timeout_s):
        return await self.streams.validate(node_id, run, timeout_s=timeout_s)

    async def reachable(self, node_id: str) -> bool:
        return await self.streams.reachable(node_id)


class _Rig:
    def __init__(self, url: str, policy: policy_mod.RemediationPolicy | None = None, *, executors=None, writer=None):
        self.store = repo.Store.open(url)
        self.outlet = _Outlet()
        ladder = wiring.Ladder(policy=policy or policy_mod.RemediationPolicy(), executors=executors or {},
                               writer=writer, outlet=self.outlet)  # fmt: skip
        self.wired = wiring.single_replica(
            self.store, metrics.ControllerMetrics(CollectorRegistry()), ladder=ladder, clock=lambda: NOW_NS
        )
        self.ingest = self.wired.ingest
        self.service = self.wired.remediation
        self.outlet.streams = outlet_mod.LocalStreams(self.wired.streams, self.service.policy.escalation)
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
        await self.wired.stop()
        self.store.close()

    def ladder(self) -> tuple:
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
                assert rig.commits - before <= 2, "one decision commit and one dispatch commit for the whole group"
            else:
                for event in events:
                    await rig.service.on_events("node-1", [event], {"rack": "r1"})
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
        sent = rig.outlet.capture()
        monkeypatch.setattr(decider, "STORE_RETRY_S", 0.05)
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
        assert failures["left"] == 0
        commands = rig.service.store.commands()
        assert len({c.command_id for c in commands}) == len(commands), "each decided command is in the outbox once"
        assert sorted(sent) == sorted(c.command_id for c in commands if c.status == "dispatched" and c.kind in
                                      remediation_mod.AGENT_KINDS)  # fmt: skip
        assert rig.service.stats.events == len(events), "every event decided, and counted once"
        assert rig.service.store.unprocessed_events() == {}, "the replay watermark covers every event"
        await rig.stop()

    asyncio.run(run())


def test_a_quarantine_that_only_records_and_its_repair_leave_with_their_decision_in_one_commit(rig):
    """A quarantine whose adapter waits on nothing (record only, rasd-controller's default) is carried out in
    its decision's own transaction: the record is all it does, so it is as durable as the decision. Its reset is
    dispatched in that commit too and sent once it is done; there is no dispatch round's commit to wait for."""

    async def run() -> None:
        await rig.start()
        rig.service.adapters.executors = dict(quarantine.executors(quarantine.RecordOnlyQuarantine()))
        sent = rig.outlet.capture()
        before = rig.commits
        await rig.service.on_events("node-1", [_event("node-1", 1, 48)], {"rack": "r1"})
        assert rig.commits - before == 1, "one transaction: the decision, the quarantine and the reset's dispatch"
        commands = {c.kind: c for c in rig.service.store.commands()}
        assert sorted(commands) == ["quarantine_gpu", "reset_gpu"]
        assert commands["quarantine_gpu"].status == "succeeded" and commands["reset_gpu"].status == "dispatched"
        assert sent == [commands["reset_gpu"].command_id], "the reset left after the commit; the quarantine ran here"
        assert [(q["node_id"], q["gpu_uuid"]) for q in rig.service.store.quarantines()] == [("node-1", GPUS[0])]
        audit = sorted((a["action"], a["outcome"]) for a in rig.service.store.audit())
        assert audit == [
            ("quarantine_gpu", "ACTION_OUTCOME_SUCCEEDED"),
            ("quarantine_gpu", "dispatched"),
            ("reset_gpu", "dispatched"),
        ]
        assert rig.service.stats.actions_by_kind == {"quarantine_gpu": 1, "reset_gpu": 1}, "each counted once"
        (ticket,) = rig.service.node_states["node-1"].tickets
        assert ticket.pending is not None and ticket.pending.command_id == commands["reset_gpu"].command_id
        await rig.stop()

    asyncio.run(run())


def test_a_decision_on_an_old_spools_events_committed_after_a_new_spool_arrived_leaves_the_new_ones_to_replay(rig):
    """The replay watermark names the spool epoch of the events decided, not the node's epoch at commit time.

    The decision on the old spool's events 1-3 is committing when the agent comes back with a new spool
    (epoch 1) whose events 1-2 are stored and acked. Were the watermark (epoch 1, seq 3), a controller that
    died before deciding them would skip them at its next start (invariant 3).
    """

    async def run() -> None:
        await rig.start()
        commit = rig.service.store.commit
        commit_started, go_on = threading.Event(), threading.Event()

        def gated(change: rstore.Commit) -> list[str]:
            commit_started.set()
            assert go_on.wait(10), "the test let the commit go on"
            return commit(change)

        rig.service.store.commit = gated  # type: ignore[method-assign]
        old = [dataclasses.replace(_event("node-1", seq, 13), spool_epoch=0) for seq in (1, 2, 3)]
        rig.store.append_events("node-1", old)
        deciding = asyncio.ensure_future(rig.service.on_events("node-1", old, {"rack": "r1"}))
        assert await asyncio.to_thread(commit_started.wait, 10), "the old spool's decision commits"
        welcome = rig.store.register_hello(_hello("node-1"), NOW_NS + 1)  # its head, 0, is behind the acked 3
        assert welcome.spool_reset and welcome.spool_epoch == 1
        new = [dataclasses.replace(_event("node-1", seq, 31, GPUS[1]), spool_epoch=1) for seq in (1, 2)]
        assert rig.store.append_events("node-1", new) == (2, [1, 2])
        go_on.set()
        await asyncio.wait_for(deciding, timeout=10)
        (_labels, backlog) = rig.service.store.unprocessed_events()["node-1"]
        assert [(e.spool_epoch, e.seq, e.xid) for e in backlog] == [(1, 1, 31), (1, 2, 31)]
        await rig.stop()

    asyncio.run(run())


def test_a_group_whose_commit_is_refused_leaves_its_events_for_the_replay(rig):
    async def run() -> None:
        await rig.start()
        sent = rig.outlet.capture()

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


def test_a_waiting_command_a_failed_commit_superseded_is_cancelled_when_the_decision_commits(rig, monkeypatch):
    # Automation paused: the Xid 13 restart waits for admission. The Xid 48 on the same GPU supersedes
    # it (a reset); that decision's first commit fails. Decided again, it must still cancel the
    # restart: left pending, the restart would be admitted at the next start or resume.
    monkeypatch.setattr(decider, "STORE_RETRY_S", 0.05)

    async def run() -> None:
        await rig.start()
        await rig.service.set_paused(True, reason="test", actor="test")
        await rig.service.on_events("node-1", [_event("node-1", 1, 13)], {"rack": "r1"})
        (restart,) = [c for c in rig.service.store.commands() if c.kind == "restart_process"]
        assert restart.status == "pending"
        commit = rig.service.store.commit
        failures = {"left": 1}

        def flaky(change: rstore.Commit) -> list[str]:
            if failures["left"]:
                failures["left"] -= 1
                raise sa.exc.OperationalError("COMMIT", {}, Exception("database is locked"))
            return commit(change)

        rig.service.store.commit = flaky  # type: ignore[method-assign]
        await asyncio.wait_for(rig.service.on_events("node-1", [_event("node-1", 2, 48)], {"rack": "r1"}), timeout=10)
        assert failures["left"] == 0
        statuses = {c.command_id: c.status for c in rig.service.store.commands()}
        assert statuses[restart.command_id] == "cancelled", "the superseded restart is cancelled in the outbox"
        assert restart.command_id not in rig.service.state.deferred, "and no longer waits"
        await rig.stop()

    asyncio.run(run())


# -- pipelined passes with the commit writer process ---------------------------------------------------------
NODES = [f"node-{i}" for i in range(12)]
# Per node: a restart, its duplicate, a DBE (quarantine + reset, superseding the restart), its Xid 45
# cleanup, and a fault on the node's other GPU: every kind of pass, including dispatch rounds.
WAVES = [[(node, seq, xid, gpu) for node in NODES] for seq, xid, gpu in EVENTS]


# Every node of the burst gets a GPU reset: at the default 10 % the circuit breaker (which counts GPU
# resets) would hold them all. The burst is about pipelining, so the breaker is lifted, as in the bench.
BURST_POLICY = policy_mod.RemediationPolicy.from_mapping({"disruption": {"breaker_quarantine_pct": 100.0}})


def _burst_rig(url: str, *, writer: bool) -> tuple[_Rig, list[str]]:
    rig = _Rig(url, BURST_POLICY, writer=store_writer.CommitProcess(url) if writer else None)
    for node in NODES:
        rig.store.register_hello(_hello(node), NOW_NS)
        rig.ingest.node_labels[node] = {"rack": "r1"}
    return rig, rig.outlet.capture()


def _left_for_an_agent(command: rstore.CommandRecord) -> bool:
    """An agent command that was dispatched (it may be finished since: superseded ones end "cancelled")."""
    return command.kind in remediation_mod.AGENT_KINDS and command.dispatched_unix_ns is not None


def _outcome(rig: _Rig) -> tuple:
    tickets = sorted(
        (t.ticket_id, t.state, t.rung, t.step, t.history, t.held, t.pending)
        for node in NODES
        for t in rig.service.node_states[node].tickets
    )
    commands = sorted((c.command_id, c.kind, c.status) for c in rig.service.store.commands(limit=10_000))
    return tickets, commands


async def _feed_in_waves(rig: _Rig, pause_s: float) -> None:
    """Each wave's calls arrive together; the next wave while the passes before it may still commit."""
    calls = []
    for wave in WAVES:
        for node, seq, xid, gpu in wave:
            calls.append(
                asyncio.ensure_future(rig.service.on_events(node, [_event(node, seq, xid, gpu)], {"rack": "r1"}))
            )
        await asyncio.sleep(pause_s)
    await asyncio.wait_for(asyncio.gather(*calls), timeout=60)


def test_pipelined_passes_decide_what_one_call_at_a_time_decides(tmp_path):
    async def run(pipelined: bool) -> tuple:
        url = f"sqlite:///{tmp_path / ('pipelined.db' if pipelined else 'serial.db')}"
        rig, sent = _burst_rig(url, writer=pipelined)
        await rig.start()
        try:
            if pipelined:
                await _feed_in_waves(rig, pause_s=0.002)
            else:
                for wave in WAVES:
                    for node, seq, xid, gpu in wave:
                        await rig.service.on_events(node, [_event(node, seq, xid, gpu)], {"rack": "r1"})
            assert rig.service.stats.events == sum(len(w) for w in WAVES), "every event decided once"
            assert rig.service.store.unprocessed_events() == {}
            # Every command that left is sent once: those still awaited, and the restarts that the
            # DBE superseded after they left (finished "cancelled", so a reconnect does not send them again).
            dispatched = [c for c in rig.service.store.commands(limit=10_000) if _left_for_an_agent(c)]
            assert sorted(sent) == sorted(c.command_id for c in dispatched), "sent once each, after its commit"
            assert {c.kind for c in dispatched if c.status == "cancelled"} <= {"restart_process"}
            if pipelined:
                assert rig.service.stats.passes_overlapped > 0, "some pass was decided while another committed"
            else:
                assert rig.service.stats.passes_overlapped == 0
            return _outcome(rig)
        finally:
            await rig.stop()
            if rig.service.store.writer is not None:
                rig.service.store.writer.close()

    serial, pipelined = asyncio.run(run(False)), asyncio.run(run(True))
    assert pipelined == serial
    tickets, commands = pipelined
    assert len(tickets) == 2 * len(NODES) and {kind for _id, kind, _s in commands} >= {"quarantine_gpu", "reset_gpu"}


def test_a_writer_killed_mid_burst_loses_no_event_and_repeats_no_command(tmp_path, monkeypatch):
    monkeypatch.setattr(decider, "STORE_RETRY_S", 0.05)

    async def run() -> None:
        rig, sent = _burst_rig(f"sqlite:///{tmp_path / 'rasd.db'}", writer=True)
        await rig.start()
        writer = rig.service.store.writer
        try:

            async def kill_after_the_first_commit() -> None:
                while rig.service.stats.events == 0:
                    await asyncio.sleep(0.001)
                os.kill(writer.pid, signal.SIGKILL)

            killer = asyncio.ensure_future(kill_after_the_first_commit())
            await _feed_in_waves(rig, pause_s=0.01)
            await killer
            assert writer.started == 2, "the killed writer was replaced"
            assert rig.service.stats.events == sum(len(w) for w in WAVES), "every event decided once"
            assert rig.service.store.unprocessed_events() == {}, "the replay watermark covers every event"
            commands = rig.service.store.commands(limit=10_000)
            assert len({c.command_id for c in commands}) == len(commands)
            dispatched = [c.command_id for c in commands if _left_for_an_agent(c)]
            assert sorted(sent) == sorted(dispatched), "each dispatched command sent once, none undispatched"
            assert {c.status for c in commands} <= {"dispatched", "succeeded", "cancelled"}, "none left pending"
        finally:
            await rig.stop()
            writer.close()

    asyncio.run(run())


def test_a_commit_chain_refuses_every_commit_behind_a_failed_one():
    """Each pipelined pass was decided on the ones before it: none may commit after one failed."""
    ran: list[int] = []

    def commit(change: rstore.Commit) -> list[str]:
        ran.append(change.now_unix_ns)
        if change.now_unix_ns == 2:
            raise sa.exc.OperationalError("COMMIT", {}, Exception("database is locked"))
        return []

    chain = passes.CommitChain(commit)
    assert chain(rstore.Commit(now_unix_ns=1)) == []
    with pytest.raises(sa.exc.OperationalError):
        chain(rstore.Commit(now_unix_ns=2))
    with pytest.raises(RuntimeError, match="an earlier commit of this pipeline failed"):
        chain(rstore.Commit(now_unix_ns=3))
    assert ran == [1, 2], "the commit behind the failed one never ran"


def test_a_tick_refreshes_the_quarantine_gauge_without_waiting_for_the_decision_lock(rig):
    """The gauge reads what is committed: a tick must not stall a burst's pipeline for it."""

    async def run() -> None:
        await rig.start()
        try:
            for seq, xid, gpu in EVENTS:
                await rig.service.on_events("node-1", [_event("node-1", seq, xid, gpu)], {"rack": "r1"})
            gauge = rig.ingest.metrics.quarantined.labels(scope="gpu")
            assert rig.service.state.quarantine_gauge_stale, "the DBE's GPU quarantine left the gauge to the next tick"
            async with rig.service.state.lock:  # a pipeline holds it
                await asyncio.wait_for(rig.service.tick(), timeout=10)
            assert gauge._value.get() == 1, "one GPU quarantined, counted while the lock was held"
            assert not rig.service.state.quarantine_gauge_stale
        finally:
            await rig.stop()

    asyncio.run(run())


async def _until(predicate, what: str, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.005)


def _only_reset(rig: _Rig) -> rstore.CommandRecord:
    (reset,) = [c for c in rig.service.store.commands() if c.kind == "reset_gpu"]
    return reset


def _quarantine_through_a_scheduler(rig: _Rig) -> threading.Event:
    """GPU quarantines through an adapter that waits on a scheduler (no `blocking`), answering once the event is set."""
    scheduler_answers = threading.Event()

    def quarantine_gpu(action: actions.Action) -> str:
        assert scheduler_answers.wait(10), "the test let the scheduler answer"
        return "quarantined"

    rig.service.adapters.executors["quarantine_gpu"] = quarantine_gpu
    return scheduler_answers


def test_an_adapters_outcome_rides_in_the_next_pass_and_one_the_store_refused_is_owed_to_the_tick(rig):
    """A quarantine's outcome is committed by the decider's next pass (with the events waiting, if any). When that
    pass's commit fails for a store outage, the outcome is owed (`Results.owed`) and the tick commits it once the
    store is back: the quarantine command ends succeeded, its call no longer running."""

    async def run() -> None:
        await rig.start()
        scheduler_answers = _quarantine_through_a_scheduler(rig)
        await rig.service.on_events("node-1", [_event("node-1", 1, 48)], {"rack": "r1"})
        (quarantine_cmd,) = [c for c in rig.service.store.commands() if c.kind == "quarantine_gpu"]
        assert quarantine_cmd.command_id in rig.service.state.running, "its adapter was called after the commit"
        commit = rig.service.store.commit
        outage = {"on": True, "refused": 0}

        def down(change: rstore.Commit) -> list[str]:
            if outage["on"]:
                outage["refused"] += 1
                raise sa.exc.OperationalError("COMMIT", {}, ConnectionError("database unreachable"))
            return commit(change)

        rig.service.store.commit = down  # type: ignore[method-assign]
        scheduler_answers.set()
        await _until(lambda: outage["refused"], "the pass with the outcome tried to commit")
        await _until(lambda: rig.service.results.owed, "the refused outcome is owed")
        assert quarantine_cmd.command_id in rig.service.state.running, "not settled while it is not durable"
        outage["on"] = False
        await rig.service.tick()
        finished = {c.command_id: c for c in rig.service.store.commands()}[quarantine_cmd.command_id]
        assert finished.status == "succeeded" and finished.result["message"] == "quarantined"
        assert not rig.service.results.owed and not rig.service.adapters_busy
        # Counted once, under its kind, when its outcome committed (the refused pass counted nothing).
        sample = rig.service.state.metrics.registry.get_sample_value
        assert sample("rasd_remediation_actions_total", {"kind": "quarantine_gpu", "outcome": "succeeded"}) == 1
        assert sample("rasd_remediation_actions_total", {"kind": "unknown", "outcome": "succeeded"}) is None
        commits = rig.commits
        scheduler_answers.clear()
        await rig.service.on_events("node-1", [_event("node-1", 2, 48, GPUS[1])], {"rack": "r1"})
        second = [c for c in rig.service.store.commands() if c.kind == "quarantine_gpu" and c.gpu_uuid == GPUS[1]]
        assert [c.status for c in second] == ["dispatched"] and rig.commits == commits + 1, "one decision commit"
        scheduler_answers.set()
        await _until(lambda: not rig.service.adapters_busy, "the outcome committed")
        assert rig.commits == commits + 2, "the outcome alone: one pass, one commit"
        await rig.stop()

    asyncio.run(run())


def test_a_repair_held_behind_its_quarantines_adapter_and_cancelled_meanwhile_is_never_sent(rig):
    """The Xid 48's quarantine and reset are dispatched in the decision's own commit; the quarantine's adapter
    waits on a scheduler, so the reset is held until it returns. Meanwhile an Xid 79 on the same GPU is decided
    and committed: its reboot supersedes the reset, which must never leave (the agent would run a repair its
    ladder had dropped). The reboot leaves once the quarantine's adapter has returned."""

    async def run() -> None:
        await rig.start()
        scheduler_answers = _quarantine_through_a_scheduler(rig)
        sent = rig.outlet.capture()
        await rig.service.on_events("node-1", [_event("node-1", 1, 48)], {"rack": "r1"})
        reset = _only_reset(rig)
        assert reset.status == "dispatched", "admitted and recorded dispatched with its decision"
        assert reset.command_id in rig.service.state.held_by, "held behind its quarantine's adapter"
        await rig.service.on_events("node-1", [_event("node-1", 2, 79)], {"rack": "r1"})
        assert _only_reset(rig).status == "cancelled", "the reboot superseded the reset"
        scheduler_answers.set()
        await _until(lambda: sent, "the reboot left once the quarantine's adapter returned")
        await _until(lambda: not rig.service.adapters_busy, "the adapter's outcome was committed")
        commands = {c.command_id: c for c in rig.service.store.commands()}
        assert [commands[c].kind for c in sent] == ["reboot_node"], "the reset never left"
        assert reset.command_id not in rig.service.state.unanswered and reset.command_id not in rig.service.state.kinds
        await rig.stop()

    asyncio.run(run())


def test_a_command_a_pass_still_committing_cancels_is_withheld_and_never_sent(store_url):
    """With a commit writer the next pass is decided while one commits. The Xid 48's pass dispatches a
    quarantine and a reset; the Xid 79 arrives while that pass commits, and the pass deciding it, on the state
    the first left, supersedes the reset with a reboot. When the first commit is done the reset is withheld,
    not sent, and once the second has committed it never leaves."""

    async def run() -> None:
        writer = store_writer.CommitProcess(store_url)
        rig = _Rig(store_url, writer=writer)
        try:
            await check(rig)
        finally:
            await rig.stop()
            writer.close()

    async def check(rig: _Rig) -> None:
        await rig.start()
        rig.service.adapters.executors["quarantine_gpu"] = lambda action: "quarantined"  # waits on a scheduler
        sent = rig.outlet.capture()
        commit = rig.service.store.commit
        first_started, release_first = threading.Event(), threading.Event()
        second_started = threading.Event()

        def gated(change: rstore.Commit) -> list[str]:
            if not first_started.is_set():
                first_started.set()
                assert release_first.wait(10), "the test let the first commit go on"
            elif not second_started.is_set():
                second_started.set()
            return commit(change)

        rig.service.store.commit = gated  # type: ignore[method-assign]
        dbe = asyncio.ensure_future(rig.service.on_events("node-1", [_event("node-1", 1, 48)], {"rack": "r1"}))
        assert await asyncio.to_thread(first_started.wait, 10), "the Xid 48's decision commits"
        timed = len(rig.service.state.event_times)  # the actions decided and not yet left, each timed
        fell_off = asyncio.ensure_future(rig.service.on_events("node-1", [_event("node-1", 2, 79)], {"rack": "r1"}))
        decider_ = rig.service.decider
        await _until(lambda: len(rig.service.state.event_times) > timed, "the Xid 79 was decided meanwhile")
        assert not second_started.is_set() and not dbe.done(), "the first pass was still committing"
        release_first.set()
        await asyncio.wait_for(asyncio.gather(dbe, fell_off), timeout=10)
        await _until(lambda: sent, "the reboot left")
        await _until(lambda: not rig.service.adapters_busy, "the quarantine's outcome was committed")
        reset = _only_reset(rig)
        assert reset.status == "cancelled", "the second pass superseded the reset"
        commands = {c.command_id: c for c in rig.service.store.commands()}
        assert [commands[c].kind for c in sent] == ["reboot_node"], "the reset never left"
        assert reset.command_id not in rig.service.state.unanswered and reset.command_id not in rig.service.state.kinds
        assert not decider_._withheld, "nothing left withheld"
        statuses = {c.kind: c.status for c in commands.values()}
        assert statuses["quarantine_gpu"] == "succeeded", "the reset's quarantine, withheld with it, was carried out"

    asyncio.run(run())


def test_events_waiting_when_the_term_ends_are_left_to_the_next_term_and_decided_once(rig, monkeypatch):
    """A group put back by a store outage is not decided by a later term of the same replica.

    It was to be decided on the ended term's state; the next leader (another replica, or this one
    again) decides it from the store (the events its watermark has not covered). Deciding it again
    later on its own decided events twice and moved the watermark back.
    """

    async def run() -> None:
        await rig.start()
        rig.store.append_events("node-1", [_event("node-1", 1, 13)])  # stored and acked, as Ingest does
        monkeypatch.setattr(decider, "STORE_RETRY_S", 0.05)
        commit = rig.service.store.commit
        down = {"store": True}

        def unreachable(change: rstore.Commit) -> list[str]:
            if down["store"]:
                raise sa.exc.OperationalError("COMMIT", {}, ConnectionError("database unreachable"))
            return commit(change)

        rig.service.store.commit = unreachable  # type: ignore[method-assign]
        waiting = asyncio.ensure_future(rig.service.on_events("node-1", [_event("node-1", 1, 13)], {"rack": "r1"}))
        await asyncio.sleep(0.2)
        assert not waiting.done(), "the group waits for the store"
        await rig.service.stop()  # the term ends (deposed)
        with pytest.raises(remediation_mod.TermEnded):
            await waiting
        assert rig.service.decider.inbox == []
        down["store"] = False
        await rig.service.start()  # the next term replays what no term decided: event 1, once
        await asyncio.sleep(0.3)  # a decider of the ended term would have retried by now
        assert [c.kind for c in rig.service.store.commands()] == ["restart_process"]
        assert rig.service.store.unprocessed_events() == {}
        await rig.stop()

    asyncio.run(run())


def test_a_node_whose_gpus_were_all_quarantined_holds_its_place_in_the_disruption_budget(store_url):
    """Every GPU of node-1 quarantined (its reset follows) leaves it as out of service as a quarantined node:
    with one node allowed out, node-2's quarantine and reboot wait until one of node-1's GPUs is released."""
    one_node = policy_mod.DisruptionPolicy(
        max_disrupted_nodes=1, breaker_quarantine_pct=100.0, domain_max_nodes={}, domain_max_pct={}
    )
    rig = _Rig(store_url, policy_mod.RemediationPolicy(disruption=one_node))
    other_gpus = tuple(
        fleet.GpuRecord(f"GPU-00000000-0000-4000-8000-00000000002{i}", "H100", f"0000:{0x18 + i:02x}:00.0",
                        200, 700, 700, node_id="node-2")
        for i in range(2)
    )  # fmt: skip
    rig.store.register_hello(
        fleet.NodeHello("node-2", "boot-1", "0.1.0", "node-2", "simulated", {"rack": "r2"}, other_gpus, 0), NOW_NS
    )

    async def run() -> tuple:
        rig.ingest.remember_remote_node("node-1", {"rack": "r1"}, tuple(GPUS))
        await rig.start()  # node-2, and its GPUs, from the store
        for seq, gpu in enumerate(GPUS, start=1):
            await rig.service.on_events("node-1", [_event("node-1", seq, 48, gpu)], {"rack": "r1"})
        out = rig.service.budget.disrupted_nodes()
        await rig.service.on_events("node-2", [_event("node-2", 1, 79, other_gpus[0].uuid)], {"rack": "r2"})
        node_2 = {c.kind: c.status for c in rig.service.store.commands(node_id="node-2")}
        await rig.service.stop()
        await rig.service.start()  # a new term: the budget from its document, the GPUs from the quarantine rows
        restarted = rig.service.budget.disrupted_nodes()
        await rig.stop()
        return out, node_2, restarted

    out, node_2, restarted = asyncio.run(run())
    assert out == {"node-1"}
    assert node_2 == {"quarantine_node": "pending", "reboot_node": "pending"}, "they wait for the budget"
    assert restarted == {"node-1"}, "the count survives a restart"


def test_the_breakers_demand_is_stored_apart_from_the_budget_document_and_survives_a_restart(rig):
    """The demand, one entry per node needing quarantine, is stored as documents of its own, per first-proposal
    time: in the budget document it was rewritten whole on most commits of a burst. A new term reads it back,
    and a budget document from before (demand inside) is merged in and written out apart at the next commit."""
    earlier_s = NOW_NS / 1e9 - 30

    async def run() -> tuple:
        rig.ingest.remember_remote_node("node-1", {"rack": "r1"}, tuple(GPUS))
        await rig.start()
        await rig.service.on_events("node-1", [_event("node-1", 1, 48)], {"rack": "r1"})  # quarantine + reset
        demand = rig.service.budget.demand
        document = rig.service.store.load_doc("budget")
        documents = rig.service.store.load_docs(remediation_mod.BUDGET_DEMAND_PREFIX)
        await rig.service.stop()
        # As a version that kept the demand in the budget document would have left it: node-0's demand inside.
        rig.service.store.commit(
            rstore.Commit(now_unix_ns=NOW_NS, docs={"budget": {**document, "demand": [["node-0", earlier_s]]}})
        )
        await rig.service.start()
        merged = rig.service.budget.demand
        await rig.service.on_events("node-1", [_event("node-1", 2, 31, GPUS[1])], {"rack": "r1"})
        after = rig.service.store.load_doc("budget"), rig.service.store.load_docs(remediation_mod.BUDGET_DEMAND_PREFIX)
        await rig.stop()
        return demand, document, documents, merged, after

    demand, document, documents, merged, (document_after, documents_after) = asyncio.run(run())
    assert demand == {"node-1": NOW_NS / 1e9}
    assert "demand" not in document
    assert documents == {
        remediation_mod.BUDGET_DEMAND_PREFIX + repr(NOW_NS / 1e9): {"at": NOW_NS / 1e9, "nodes": ["node-1"]}
    }
    assert merged == {"node-0": earlier_s, "node-1": NOW_NS / 1e9}, "the new term counts both"
    assert list(merged) == ["node-0", "node-1"], "oldest first"
    assert "demand" not in document_after, "the next commit rewrote the document without it"
    assert documents_after == {
        **documents,
        remediation_mod.BUDGET_DEMAND_PREFIX + repr(earlier_s): {"at": earlier_s, "nodes": ["node-0"]},
    }


def test_a_tripped_breaker_still_validates_and_releases_the_nodes_it_rebooted_before(store_url):
    """Issue #37: the nodes already rebooted when the breaker tripped were never validated, so they stayed out."""
    pol = policy_mod.RemediationPolicy(
        disruption=policy_mod.DisruptionPolicy(
            breaker_quarantine_pct=20.0,
            breaker_min_nodes=3,
            max_disrupted_nodes_pct=50.0,
            domain_max_nodes={},
            domain_max_pct={},
        )
    )
    rig = _Rig(store_url, pol)
    nodes = [f"node-{i}" for i in range(1, 11)]
    for node in nodes[1:]:
        rig.store.register_hello(_hello(node), NOW_NS)

    async def run() -> tuple:
        sent = rig.outlet.capture()
        await rig.start()
        for node in nodes[:2]:  # 2 of 10 nodes: at the breaker's limit, not over it
            await rig.service.on_events(node, [_event(node, 1, 79)], {"rack": "r1"})
        reboots = {c.node_id: c for c in rig.service.store.commands() if c.kind == "reboot_node"}
        for node in nodes[2:6]:  # 6 of 10: the breaker trips, their reboots wait
            await rig.service.on_events(node, [_event(node, 1, 79)], {"rack": "r1"})
        tripped = rig.service.budget.breaker_tripped
        for node, reboot in reboots.items():
            await rig.service.on_result(node, msgs.AgentResult(reboot.command_id, msgs.Outcome.SUCCEEDED))
        validations = {c.node_id: c for c in rig.service.store.commands() if c.kind == "run_validation"}
        for node, run in validations.items():
            await rig.service.on_result(
                node, msgs.AgentResult(run.command_id, msgs.Outcome.SUCCEEDED, validation_verdict="pass")
            )
        statuses = {(c.node_id, c.kind): c.status for c in rig.service.store.commands()}
        out = rig.service.budget.disrupted_nodes()
        held = rig.service.budget.breaker_tripped
        await rig.stop()
        return reboots, tripped, validations, sent, statuses, out, held

    reboots, tripped, validations, sent, statuses, out, held = asyncio.run(run())
    assert set(reboots) == {"node-1", "node-2"} and tripped
    assert set(validations) == {"node-1", "node-2"}
    assert all(run.command_id in sent for run in validations.values()), "the post-repair runs were sent"
    assert statuses[("node-1", "release")] == statuses[("node-2", "release")] == "succeeded"
    assert not {"node-1", "node-2"} & out, "back in service"
    assert held and all(statuses[(n, "reboot_node")] == "pending" for n in nodes[2:6]), "nothing new leaves"


def test_an_xid94s_remap_is_applied_by_a_reset_once_the_telemetry_shows_the_gpu_idle(rig):
    """Issue #37: Xid 94 restarts the application; the reset that remaps waits for the GPU to drain, never kills."""

    async def run() -> tuple:
        sent = rig.outlet.capture()
        rig.ingest.remember_remote_node("node-1", {"rack": "r1"}, tuple(GPUS))
        await rig.start()
        await rig.service.on_events("node-1", [_event("node-1", 1, 94)], {"rack": "r1"})
        restart = next(c for c in rig.service.store.commands() if c.kind == "restart_process")
        await rig.service.on_result("node-1", msgs.AgentResult(restart.command_id, msgs.Outcome.SUCCEEDED))
        busy = fleet.GpuLatest(power_w=650.0, power_sample_unix_ns=NOW_NS, enforced_power_limit_w=700)
        rig.wired.streams.latest[GPUS[0]] = busy
        await rig.service.tick()
        while_busy = [c.kind for c in rig.service.store.commands()]
        rig.wired.streams.latest[GPUS[0]] = busy._replace(power_w=70.0)
        await rig.service.tick()
        after = [(c.kind, c.status) for c in rig.service.store.commands()]
        await rig.stop()
        return sent, while_busy, after

    sent, while_busy, after = asyncio.run(run())
    assert while_busy == ["restart_process"], "the GPU works: nothing is stopped, nothing is held"
    assert sorted(after) == [
        ("quarantine_gpu", "succeeded"),
        ("reset_gpu", "dispatched"),
        ("restart_process", "succeeded"),
    ]
    assert len(sent) == 2, "the restart, then the reset once idle"


def test_a_gpu_held_at_its_smoothing_floor_drains_when_its_fresh_counters_show_no_kernel(rig):
    """Issue #37: idle means no kernel runs (utilization 0 %), not low power: smoothing holds idle GPUs at a floor."""

    async def run() -> tuple:
        rig.ingest.remember_remote_node("node-1", {"rack": "r1"}, tuple(GPUS))
        await rig.start()
        await rig.service.on_events("node-1", [_event("node-1", 1, 94)], {"rack": "r1"})
        restart = next(c for c in rig.service.store.commands() if c.kind == "restart_process")
        await rig.service.on_result("node-1", msgs.AgentResult(restart.command_id, msgs.Outcome.SUCCEEDED))
        at_floor = fleet.GpuLatest(
            power_w=620.0, power_sample_unix_ns=NOW_NS, enforced_power_limit_w=1000, utilization_gpu_pct=100
        )
        streams = rig.wired.streams
        streams.latest[GPUS[0]] = at_floor
        streams.latest_controller_ns[GPUS[0]] = NOW_NS
        await rig.service.tick()
        while_working = [c.kind for c in rig.service.store.commands()]
        streams.latest[GPUS[0]] = at_floor._replace(utilization_gpu_pct=0)
        streams.latest_controller_ns[GPUS[0]] = NOW_NS - 60 * 10**9
        await rig.service.tick()
        while_stale = [c.kind for c in rig.service.store.commands()]
        streams.latest_controller_ns[GPUS[0]] = NOW_NS
        await rig.service.tick()
        after = sorted(c.kind for c in rig.service.store.commands())
        await rig.stop()
        return while_working, while_stale, after

    while_working, while_stale, after = asyncio.run(run())
    assert while_working == ["restart_process"], "a kernel runs: the GPU works, whatever it draws"
    assert while_stale == ["restart_process"], "counters a minute old say nothing about now"
    assert after == ["quarantine_gpu", "reset_gpu", "restart_process"], "idle at its floor: the remap reset starts"
