"""Incident and repair-ticket rows close when the ladder lets go of them; ids stay unique across spool resets.

Operators read open incidents and open repairs from these rows (`rasctl incidents --open`,
`rasctl repairs --open`): a row that never closes lists a fault for ever. And an agent whose spool
was reset numbers its events from 1 again, which must not give a new fault an old fault's ids.
"""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client import CollectorRegistry

from rasd.api.v1 import agent_service_pb2 as agent_pb
from rasd.api.v1 import commands_pb2 as commands_pb
from rasd.api.v1 import health_pb2 as health_pb
from rasd.controller import wiring
from rasd.controller.core import agent_messages as msgs
from rasd.controller.core import fleet
from rasd.controller.core.remediation import actions
from rasd.controller.core.remediation import events as health
from rasd.controller.observability import metrics
from rasd.controller.remediation import state as state_mod
from rasd.controller.store import lease as lease_store
from rasd.controller.store import repo
from rasd.controller.wire import agent as wire

T0_NS = 1_800_000_000 * 10**9
GPU = "GPU-00000000-0000-4000-8000-000000000001"
NODE = "node-1"


def _hello() -> fleet.NodeHello:
    gpus = (fleet.GpuRecord(GPU, "H100", "0000:18:00.0", 200, 700, 700, node_id=NODE),)
    return fleet.NodeHello(NODE, "boot-1", "0.1.0", NODE, "simulated", {"rack": "r1"}, gpus, 0)


def _xid(seq: int, xid: int, at_ns: int) -> repo.StoredEvent:
    return repo.StoredEvent(
        node_id=NODE, seq=seq, observed_unix_ns=at_ns - 10**6, received_unix_ns=at_ns,
        kind=int(health.EventKind.XID), severity=int(health.Severity.ERROR), gpu_uuid=GPU, xid=xid,
        message=f"NVRM: Xid (PCI:0000:18:00): {xid}", source="kmsg", attributes={},
    )  # fmt: skip


class _Rig:
    def __init__(self, url: str, *, recorder=None) -> None:
        self.now_ns = T0_NS
        self.store = repo.Store.open(url)
        self.wire_services(recorder=recorder)
        self.store.register_hello(_hello(), T0_NS)
        self.ingest.node_labels[NODE] = {"rack": "r1"}

    def wire_services(self, *, recorder=None) -> None:
        """A fresh ingest and ladder on the rig's store, wired as one replica (a new controller process)."""
        self.wired = wiring.single_replica(
            self.store,
            metrics.ControllerMetrics(CollectorRegistry()),
            ladder=wiring.Ladder(recorder=recorder),
            clock=self.clock,
        )
        self.ingest = self.wired.ingest
        self.service = self.wired.remediation

    def run(self, scenario) -> None:
        """Run scenario() with the ingest started and stopped in the same event loop."""

        async def whole() -> None:
            await self.ingest.start()
            try:
                await scenario()
            finally:
                await self.ingest.stop()

        asyncio.run(whole())

    def clock(self) -> int:
        return self.now_ns

    async def event(self, seq: int, xid: int) -> None:
        await self.service.on_events(NODE, [_xid(seq, xid, self.now_ns)], {"rack": "r1"})

    async def succeed(self, kind: str) -> None:
        command = next(
            c for c in self.service.store.commands(node_id=NODE) if c.kind == kind and c.status != "succeeded"
        )
        await self.service.on_result(
            NODE, msgs.AgentResult(command_id=command.command_id, outcome=msgs.Outcome.SUCCEEDED)
        )


@pytest.fixture
def rig(tmp_path):
    rig = _Rig(f"sqlite:///{tmp_path / 'rasd.db'}")
    yield rig
    rig.store.close()


def test_an_incident_row_closes_on_the_tick_after_its_window_ends(rig):
    store = rig.service.store

    async def scenario() -> None:
        await rig.event(1, 13)
        assert [i["state"] for i in store.incidents(open_only=True)] == ["open"]
        rig.now_ns += 179 * 10**9  # still inside the 180 s dedupe window
        await rig.service.tick()
        assert len(store.incidents(open_only=True)) == 1
        rig.now_ns += 2 * 10**9
        await rig.service.tick()

    rig.run(scenario)
    assert store.incidents(open_only=True) == []
    (row,) = store.incidents()
    assert row["state"] == "closed"
    assert row["closed_unix_ns"] == rig.now_ns
    assert rig.service.correlation.open_incidents() == ()


def test_a_ticket_row_closes_when_its_watch_window_ends(rig):
    store = rig.service.store
    watch_s = rig.service.policy.escalation.recurrence_window_s

    async def scenario() -> None:
        await rig.event(1, 13)
        await rig.succeed("restart_process")
        (ticket,) = store.tickets(open_only=True)
        assert ticket["state"] == "watching"
        rig.now_ns += int((watch_s + 1) * 1e9)
        await rig.service.tick()

    rig.run(scenario)
    assert store.tickets(open_only=True) == []
    (row,) = store.tickets()
    assert row["closed"] is True
    assert row["updated_unix_ns"] == rig.now_ns
    assert row["steps"][-1].endswith("ticket closed")
    assert rig.service.node_states[NODE].tickets == ()


def test_a_fault_after_a_spool_reset_gets_its_own_incident_ticket_and_command(rig):
    """Seq 1 again, 8 days later (past every window): a new repair, not the old one's command id."""
    store = rig.service.store

    async def scenario() -> None:
        await rig.event(1, 13)
        await rig.succeed("restart_process")
        rig.now_ns += 8 * 86400 * 10**9
        await rig.service.tick()
        await rig.event(1, 13)  # the agent's spool was reset: its events are numbered from 1 again

    rig.run(scenario)
    restarts = [c for c in store.commands(node_id=NODE) if c.kind == "restart_process"]
    assert len({c.command_id for c in restarts}) == 2
    assert [c.status for c in restarts] == ["succeeded", "dispatched"]
    incidents = store.incidents()
    assert len({i["incident_id"] for i in incidents}) == 2
    assert sorted(i["state"] for i in incidents) == ["closed", "open"]


def test_a_tick_takes_the_decision_lock_only_for_work_there_is(rig):
    """Each hold of the lock ends a burst's pipeline: a tick with nothing due must not take it.

    The lock is held here by someone else: a tick that finds nothing due finishes regardless, and
    one with a timeout due waits for the lock and climbs once it is free.
    """
    service = rig.service

    async def scenario() -> None:
        await rig.event(1, 13)  # a restart, dispatched: the ticket waits for its result
        assert [c.kind for c in service.store.commands(node_id=NODE)] == ["restart_process"]
        lock = service.state.lock
        async with lock:
            await asyncio.wait_for(service.tick(), timeout=5)  # nothing due: done without the lock
            rig.now_ns += 3600 * 10**9  # the restart's result is long overdue
            late = asyncio.ensure_future(service.tick())
            await asyncio.sleep(0.05)
            assert not late.done() and lock.waiting == 1, "a tick with work waits for the lock"
        await asyncio.wait_for(late, timeout=5)
        assert lock.waiting == 0
        kinds = [c.kind for c in service.store.commands(node_id=NODE)]
        assert kinds[0] == "restart_process" and "reset_gpu" in kinds, "the overdue restart climbed to a reset"

    rig.run(scenario)


def test_the_decision_lock_counts_who_waits_for_it():
    async def scenario() -> None:
        lock = state_mod.DecisionLock()
        order: list[str] = []

        async def take(name: str) -> None:
            async with lock:
                order.append(name)

        async with lock:
            assert lock.locked() and lock.waiting == 0, "the holder is not waiting"
            waiters = [asyncio.ensure_future(take(name)) for name in ("tick", "result")]
            await asyncio.sleep(0)
            assert lock.waiting == 2
        await asyncio.gather(*waiters)
        assert order == ["tick", "result"] and lock.waiting == 0 and not lock.locked()

    asyncio.run(scenario())


def test_a_tick_climbs_the_overdue_nodes_of_a_chunk_in_one_transaction(rig):
    """After a partition every node's command times out at once: one commit per chunk, not per node."""
    service = rig.service
    gpus = {NODE: GPU}
    for n in (2, 3):
        node, gpu = f"node-{n}", f"GPU-00000000-0000-4000-8000-00000000000{n}"
        gpus[node] = gpu
        record = fleet.GpuRecord(gpu, "H100", "0000:18:00.0", 200, 700, 700, node_id=node)
        hello = fleet.NodeHello(node, "boot-1", "0.1.0", node, "simulated", {"rack": "r1"}, (record,), 0)
        rig.store.register_hello(hello, T0_NS)
        rig.ingest.node_labels[node] = {"rack": "r1"}
    commits: list = []
    commit = service.store.commit
    service.store.commit = lambda change: commits.append(change) or commit(change)  # type: ignore[method-assign]

    async def scenario() -> None:
        for node, gpu in gpus.items():
            event = repo.StoredEvent(
                node_id=node, seq=1, observed_unix_ns=rig.now_ns - 10**6, received_unix_ns=rig.now_ns,
                kind=int(health.EventKind.XID), severity=int(health.Severity.ERROR), gpu_uuid=gpu, xid=13,
                message="NVRM: Xid (PCI:0000:18:00): 13", source="kmsg", attributes={},
            )  # fmt: skip
            await service.on_events(node, [event], {"rack": "r1"})
        rig.now_ns += 3600 * 10**9  # every restart's result is long overdue
        before = len(commits)
        await service.tick()
        first_ladder_commit = next(c for c in commits[before:] if c.node_states)
        assert set(first_ladder_commit.node_states) == set(gpus), "the three nodes climbed in one transaction"
        for node in gpus:
            kinds = [c.kind for c in service.store.commands(node_id=node)]
            assert kinds[0] == "restart_process" and "reset_gpu" in kinds, f"{node} climbed to a reset"

    rig.run(scenario)


async def _open_stream(rig: _Rig) -> asyncio.Queue:
    """The node's agent says Hello and its stream opens; returns the queue the node's commands go out on."""
    info = health_pb.GpuInfo(uuid=GPU, model="H100", power_limit_min_w=200, power_limit_max_w=700)
    hello = wire.hello_from_wire(agent_pb.Hello(node_id=NODE, boot_id="boot-1", gpus=[info]))
    session, _welcome = await rig.ingest.open_session(hello)  # its ladder hears of it: unanswered commands go
    return session.outbound


def _sent_commands(queue: asyncio.Queue) -> list[commands_pb.Command]:
    commands = []
    while not queue.empty():
        message = queue.get_nowait()
        if message is not None and message.HasField("command"):
            commands.append(message.command)
    return commands


def _sent_kinds(queue: asyncio.Queue) -> list[str]:
    return [command.WhichOneof("action") for command in _sent_commands(queue)]


def test_a_command_to_a_node_without_a_stream_counts_its_latency_when_it_is_sent(rig):
    """The decision latency ends when the command leaves; one that waits for its node has not left."""
    service = rig.service

    async def scenario() -> None:
        await rig.event(1, 13)
        assert [(c.kind, c.status) for c in service.store.commands(node_id=NODE)] == [("restart_process", "dispatched")]
        assert list(service.stats.decision_latency_s) == [], "no stream: the restart has not left"
        rig.now_ns += 5 * 10**9  # the node reconnects 5 s later
        queue = await _open_stream(rig)
        (restart,) = _sent_commands(queue)
        assert restart.WhichOneof("action") == "restart_process"
        timeout_ns = int(service.policy.escalation.restart_process_timeout_s * 1e9)
        assert restart.deadline_unix_ns - restart.issued_unix_ns == timeout_ns - 5 * 10**9, (
            "what is left of the ladder's wait, not a new one"
        )
        assert list(service.stats.decision_latency_s) == [pytest.approx(5.0)]
        assert list(service.stats.decision_latency_kinds) == ["restart_process"]
        await service.node_connected(NODE)  # a second reconnect re-sends it, but it left once
        assert _sent_kinds(queue) == ["restart_process"]
        assert list(service.stats.decision_latency_s) == [pytest.approx(5.0)]

    rig.run(scenario)


def test_a_command_that_timed_out_is_never_sent_again(rig):
    """After a partition the ladder climbs past an unanswered restart: the reconnect sends only the reset.

    The restart's row is finished as timed out, so neither the reconnect nor the next controller
    term sends it: a restart (or a reboot) that the ladder gave up on would otherwise run after
    the rung above it.
    """
    service = rig.service

    async def scenario() -> None:
        await rig.event(1, 13)  # restart dispatched; the node has no stream
        rig.now_ns += 3600 * 10**9
        await service.tick()  # the restart timed out: climb to a reset
        rows = {c.kind: c for c in service.store.commands(node_id=NODE)}
        assert rows["restart_process"].status == "timed_out"
        assert rows["restart_process"].result["outcome"] == "ACTION_OUTCOME_TIMED_OUT"
        assert rows["reset_gpu"].status == "dispatched"
        queue = await _open_stream(rig)
        assert _sent_kinds(queue) == ["reset_gpu"]
        timed_out = rig.ingest.metrics.remediation_actions.labels(kind="restart_process", outcome="timed_out")
        assert timed_out._value.get() == 1

    rig.run(scenario)
    rig.wire_services()

    async def next_term() -> None:
        await rig.service.start()
        await rig.service.stop()
        assert _sent_kinds(await _open_stream(rig)) == ["reset_gpu"], "the next term re-sends only the reset"

    rig.run(next_term)


def test_a_command_whose_wait_ran_out_while_its_node_was_away_is_not_sent_on_reconnect(rig):
    """The node returns before the tick has timed its restart out: the restart stays unsent, the tick climbs."""
    service = rig.service

    async def scenario() -> None:
        await rig.event(1, 13)  # restart dispatched; the node has no stream
        rig.now_ns += 3600 * 10**9
        queue = await _open_stream(rig)  # before any tick
        assert _sent_kinds(queue) == [], "the restart's wait ran out: not sent again"
        await service.tick()
        assert _sent_kinds(queue) == ["reset_gpu"], "the tick climbed, and the reset goes out on the open stream"
        rows = {c.kind: c.status for c in service.store.commands(node_id=NODE)}
        assert rows["restart_process"] == "timed_out" and rows["reset_gpu"] == "dispatched"

    rig.run(scenario)


def test_a_dispatch_round_leaves_alone_what_a_pass_still_committing_cancels(rig):
    """The pipeline stages a dispatch round while later passes commit: a command one of them cancels waits.

    It leaves the waiting list once that commit is done; admitted meanwhile, it would be sent
    although its outbox row ends cancelled.
    """
    service = rig.service
    restart = actions.RestartProcess(ticket_id="t1", step=0, node_id=NODE, reason="test", gpu_uuid=GPU)

    async def scenario() -> None:
        service.state.deferred[restart.command_id] = restart
        async with service.state.lock:
            held = await service.dispatcher.stage_dispatch(closing={restart.command_id})
            assert held.admitted == [] and restart.command_id in service.state.deferred
            admitted = await service.dispatcher.stage_dispatch()
            assert [a.command_id for a in admitted.admitted] == [restart.command_id]

    rig.run(scenario)


def test_the_stats_keep_the_latest_decision_latencies_only(monkeypatch):
    """A controller runs for months: its in-memory record is bounded (Prometheus keeps the histogram)."""
    monkeypatch.setattr(state_mod, "DECISION_LATENCIES_KEPT", 3)
    stats = state_mod.RemediationStats()
    for n in range(5):
        stats.decision_latency_s.append(float(n))
        stats.decision_latency_kinds.append(f"kind-{n}")
        stats.commit_s.append(float(n))
    assert list(stats.decision_latency_s) == [2.0, 3.0, 4.0]
    assert list(stats.decision_latency_kinds) == ["kind-2", "kind-3", "kind-4"]
    assert list(stats.commit_s) == [2.0, 3.0, 4.0]


def test_every_remediation_transaction_is_timed_and_a_refused_one_is_not(rig):
    """``rasd_remediation_commit_seconds`` is the database's share of the decision latency.

    Each durable transaction is counted once (the decision pass, the agent's result); a commit the
    store refused made nothing durable and is not counted.
    """
    service = rig.service
    registry = rig.ingest.metrics.registry

    def counted() -> float:
        return registry.get_sample_value("rasd_remediation_commit_seconds_count") or 0.0

    async def scenario() -> None:
        await _open_stream(rig)
        await rig.event(1, 13)
        assert counted() == len(service.stats.commit_s) == 1
        await rig.succeed("restart_process")
        assert counted() == len(service.stats.commit_s) == 2
        assert all(seconds > 0 for seconds in service.stats.commit_s)
        total = registry.get_sample_value("rasd_remediation_commit_seconds_sum")
        assert total == pytest.approx(sum(service.stats.commit_s))
        service.store.fence = lambda session: lease_store.check_fence(session, None)  # a deposed leader
        with pytest.raises(lease_store.NotLeaderError):
            await rig.event(2, 13)
        assert counted() == len(service.stats.commit_s) == 2

    rig.run(scenario)


def test_the_time_between_a_nodes_incidents_is_observed_and_survives_a_restart(rig):
    """Each new incident on a node observes the time since the node's previous one opened.

    A node's first incident has no interval; one that opened before the node's latest (a clock
    stepped back) is not an interval and moves nothing back; a new leader term reads each node's
    latest incident from the store, so the first incident after a restart still has its interval.
    """

    def observed(registry) -> tuple[float, float]:
        count = registry.get_sample_value("rasd_time_between_incidents_seconds_count") or 0.0
        return count, registry.get_sample_value("rasd_time_between_incidents_seconds_sum") or 0.0

    registry = rig.ingest.metrics.registry

    async def scenario() -> None:
        await _open_stream(rig)
        await rig.event(1, 13)
        assert observed(registry) == (0, 0)
        rig.now_ns += 3600 * 10**9
        await rig.event(2, 31)
        assert observed(registry) == (1, 3600)
        rig.now_ns -= 10 * 10**9  # the controller's clock stepped back
        await rig.event(3, 119)
        assert len(rig.service.store.incidents()) == 3
        assert observed(registry) == (1, 3600)

    rig.run(scenario)

    rig.wire_services()
    ingest, service = rig.ingest, rig.service

    async def next_term() -> None:
        await ingest.start()
        try:
            await service.start()
            rig.now_ns += 7210 * 10**9  # two hours after the latest incident (the one at +3600 s)
            await service.on_events(NODE, [_xid(4, 13, rig.now_ns)], {"rack": "r1"})
        finally:
            await service.stop()
            await ingest.stop()

    asyncio.run(next_term())
    assert len(rig.service.store.incidents()) == 4
    assert observed(ingest.metrics.registry) == (1, 7200)


def test_time_to_first_action_is_observed_once_per_event_however_many_commands_it_led_to(rig):
    """Xid 48 quarantines the GPU, then resets it: two commands leave, one event's first action is timed.

    The per-command decision latency (what `bench/remediation.py` reports) has both; the histogram
    operators alert on (``rasd_time_to_first_action_seconds``) counts the event once.
    """
    service = rig.service

    async def scenario() -> None:
        queue = await _open_stream(rig)
        await rig.event(1, 48)
        kinds = {c.kind: c.status for c in service.store.commands(node_id=NODE)}
        assert kinds == {"quarantine_gpu": "succeeded", "reset_gpu": "dispatched"}
        assert _sent_kinds(queue) == ["reset_gpu"]
        assert sorted(service.stats.decision_latency_kinds) == ["quarantine_gpu", "reset_gpu"]
        assert rig.ingest.metrics.registry.get_sample_value("rasd_time_to_first_action_seconds_count") == 1

    rig.run(scenario)


def test_an_event_the_policy_held_back_is_timed_apart_from_the_decisions(rig):
    """A reset held while automation is paused waits for the operator, not the decider: not a decision latency."""
    service = rig.service

    async def scenario() -> None:
        queue = await _open_stream(rig)
        await service.set_paused(True, reason="maintenance", actor="ops")
        await rig.event(1, 48)
        assert _sent_kinds(queue) == [] and not service.stats.policy_held_s
        rig.now_ns += 30 * 10**9  # the operator resumes 30 s later ...
        await service.set_paused(False, reason="done", actor="ops")
        # ... which starts a cooldown, and the quarantine empties the one-GPU node: it waits that out too.
        waited_s = 30.0 + service.policy.disruption.storm_cooldown_s + 1
        rig.now_ns += int((service.policy.disruption.storm_cooldown_s + 1) * 1e9)
        await service.tick()
        assert _sent_kinds(queue) == ["reset_gpu"]
        assert list(service.stats.policy_held_s) == [pytest.approx(waited_s), pytest.approx(waited_s)]
        assert list(service.stats.decision_latency_s) == []
        # Time to first action (what operators alert on) still sees the whole wait.
        registry = rig.ingest.metrics.registry
        assert registry.get_sample_value("rasd_time_to_first_action_seconds_sum") == pytest.approx(waited_s)

    rig.run(scenario)


class _QuietSeen:
    """Hears of each decision and asks the service, then, whether it is quiet."""

    def __init__(self) -> None:
        self.service = None
        self.seen: list[bool] = []

    def decisions(self, decided, at_unix_ns: int) -> None:
        self.seen.append(self.service.quiet)

    def accusation(self, node_id, gpu_uuid, *, reason, accuser, at_unix_ns) -> None:
        pass


def test_the_service_is_quiet_only_while_no_decision_waits(tmp_path):
    """What `gc_policy.QuietCollector` asks before it collects: never while an event's decision is pending."""
    recorder = _QuietSeen()
    rig = _Rig(f"sqlite:///{tmp_path / 'rasd.db'}", recorder=recorder)
    recorder.service = rig.service
    seen_in_pass = recorder.seen

    async def scenario() -> None:
        assert rig.service.quiet
        pending = asyncio.ensure_future(rig.event(1, 13))
        await asyncio.sleep(0)  # the event waits in the inbox
        assert not rig.service.quiet
        await pending
        assert rig.service.quiet

    rig.run(scenario)
    rig.store.close()
    assert seen_in_pass == [False]  # inside the decision pass


def test_a_new_term_resumes_every_unfinished_command_beyond_ten_thousand(rig):
    """A storm left 10,005 restarts in the outbox (5 not admitted yet): a new leader takes up all of them."""
    from rasd.controller.store import remediation as rstore

    now = rig.now_ns
    restarts = [
        actions.RestartProcess(ticket_id=f"t{i}", step=1, node_id=NODE, reason="Xid 13", gpu_uuid=GPU)
        for i in range(10_005)
    ]
    rig.service.store.commit(
        rstore.Commit(
            now_unix_ns=now,
            new_commands=[
                rstore.CommandRecord(
                    command_id=a.command_id, node_id=NODE, gpu_uuid=GPU, ticket_id=a.ticket_id, kind=a.kind,
                    payload=a.to_dict(), status="pending" if i >= 10_000 else "dispatched", reason=a.reason,
                    created_unix_ns=now + i, dispatched_unix_ns=None if i >= 10_000 else now + i,
                    finished_unix_ns=None, result=None,
                )
                for i, a in enumerate(restarts)
            ],
        )
    )  # fmt: skip
    rig.wire_services()  # a new controller process: its term starts from the store alone
    seen = {}

    async def scenario():
        await rig.service.start()
        state = rig.service.state
        seen["tracked"] = set(state.unanswered) | set(state.deferred)
        await rig.service.stop()

    rig.run(scenario)

    # Each awaits its answer (sent when the node's stream opens), or its admission: none is forgotten.
    assert seen["tracked"] == {a.command_id for a in restarts}
