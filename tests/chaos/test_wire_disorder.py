"""Duplicated, reordered and late messages, and clock skew between agents and the controller.

A controller (in this process, on SQLite) serves two nodes whose clocks disagree with its own:

- `skew-behind`, a light agent whose clock runs 2 h behind, speaks the protocol by hand: its 24
  health events (an Xid 48, Xid 13s, an InfiniBand flap storm of 6 link state changes) go out shuffled, every
  message twice, and two of them (seqs 4 and 17) only late, on a second stream after the first one
  broke. Every command it gets is answered twice, and every answer is sent once more, late, on the
  second stream.
- `skew-ahead`, a full agent (rasd.agent.runtime) whose clock runs 2 h ahead, takes an Xid 48 and
  must walk the whole ladder: its commands carry the controller's deadlines.

The store must end consistent: each seq stored once, acks never ahead of the gap-free prefix of
what was sent (so the agent never drops what the controller lacks) and never going backwards, the
second Welcome at exactly that prefix, each event decided once (no double counting in the ladder or
the incidents), every incident and ticket timed by the controller's clock, the flap storm detected
despite the skew, and the skewed agent's repairs done rather than refused as late.
"""

from __future__ import annotations

import asyncio
import collections
import random
import time

import chaoslib
import grpc
import pytest

from rasd.agent import node_ops, runtime, spool
from rasd.agent import settings as agent_settings
from rasd.agent.gpu import simulated
from rasd.api.v1 import agent_service_pb2 as agent_pb
from rasd.api.v1 import agent_service_pb2_grpc as agent_grpc
from rasd.api.v1 import health_pb2 as health_pb
from rasd.controller import server
from rasd.controller.store import remediation as rstore

pytestmark = pytest.mark.slow

SKEW_NS = 2 * 3600 * 10**9
EVENTS = 24
LATE = (4, 17)
FLAP_SEQS = range(10, 16)  # six IB link state changes: three down/up flaps, a storm under the default policy


def gap_free_prefix(seqs: set[int]) -> int:
    prefix = 0
    while prefix + 1 in seqs:
        prefix += 1
    return prefix


class HandStream:
    """One AgentService.Connect stream driven message by message, recording every ack against what was sent."""

    def __init__(self, address: str, agent: chaoslib.LightAgent) -> None:
        self.agent = agent
        self.channel = chaoslib.channel(address)
        self.call = agent_grpc.AgentServiceStub(self.channel).Connect()
        self.sent: set[int] = set()
        self.acks: list[tuple[int, int]] = []  # (acked_seq, gap-free prefix of what was sent by then)
        self.welcome: agent_pb.Welcome | None = None
        self.results_sent: list[str] = []
        self._reader: asyncio.Task[None] | None = None
        # One write at a time on the call, as the real agent's single sender does: the reader task
        # answers commands while the test sends batches, and gRPC refuses a second write in flight
        # (GRPC_CALL_ERROR_TOO_MANY_OPERATIONS) when a command lands during a batch.
        self._writing = asyncio.Lock()

    async def write(self, message: agent_pb.AgentMessage) -> None:
        async with self._writing:
            await self.call.write(message)

    async def open(self, already_sent: set[int]) -> None:
        self.sent = set(already_sent)
        await self.write(self.agent.hello())
        first = await asyncio.wait_for(self.call.read(), timeout=10)
        assert first.HasField("welcome"), first
        self.welcome = first.welcome
        self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        while True:
            message = await self.call.read()
            if message is grpc.aio.EOF:
                return
            if message.HasField("ack"):
                self.acks.append((message.ack.acked_seq, gap_free_prefix(self.sent)))
                self.agent.on_ack(message.ack.acked_seq)
            elif message.HasField("command"):
                self.agent.commands.append(message.command)
                result = self.agent.answer(message.command)
                for _duplicate in range(2):
                    await self.write(agent_pb.AgentMessage(action_result=result))
                    self.results_sent.append(result.command_id)

    async def send_events(self, seqs) -> None:  # type: ignore[no-untyped-def]
        self.sent |= set(seqs)
        events = [self.agent.spool[s] for s in seqs]
        await self.write(agent_pb.AgentMessage(events=agent_pb.HealthEventBatch(events=events)))

    async def close(self) -> None:
        self.call.cancel()
        if self._reader is not None:
            self._reader.cancel()
            await asyncio.gather(self._reader, return_exceptions=True)
        await self.channel.close(grace=None)


def _behind_node() -> chaoslib.LightAgent:
    agent = chaoslib.LightAgent(index=7, node_id="skew-behind", gpus=2, clock_skew_ns=-SKEW_NS)
    for seq in range(1, EVENTS + 1):
        if seq in FLAP_SEQS:
            state = "DOWN" if (seq - FLAP_SEQS.start) % 2 == 0 else "ACTIVE"
            agent.spool[seq] = health_pb.HealthEvent(
                seq=seq,
                observed_unix_ns=time.time_ns() - SKEW_NS,
                kind=health_pb.EVENT_KIND_IB_LINK_STATE,
                severity=health_pb.SEVERITY_WARNING,
                message=f"mlx5_core 0000:c1:00.0 mlx5_0: Port 1 Link {state}",
                source="kmsg",
                attributes={"ib_device": "mlx5_0", "ib_port": "1", "ib_state": state},
            )
            agent.next_seq = seq + 1
        elif seq == 2:
            agent.spool_event(xid=48, gpu=0)  # a GPU ladder: commands to answer twice, and late
        else:
            agent.spool_event(xid=13, gpu=1)
    return agent


def _ahead_agent(tmp_path, port: int):
    backend = simulated.SimulatedBackend("skew-ahead", 2, 3, workload=simulated.StepWorkload())

    def clock() -> int:
        return time.time_ns() + SKEW_NS

    journal = spool.Spool(str(tmp_path / "skew-ahead-spool.db"))
    agent = runtime.Agent(
        agent_settings.AgentSettings(
            node_id="skew-ahead",
            labels={"rack": "rack-a"},
            link=agent_settings.LinkSettings(
                controller_address=f"127.0.0.1:{port}", reconnect_initial_s=0.05, reconnect_max_s=0.3
            ),
            actions=agent_settings.ActionSettings(destructive_enabled=True, kill_poll_s=0.0),
        ),
        backend,
        journal,
        boot_id="boot-a",
        clock=clock,
        ops=node_ops.SimulatedNodeOps(backend),
    )
    return agent, backend, journal, clock


async def _run(tmp_path, figures):
    rng = random.Random(4)
    settings = server.ControllerSettings(
        listen="127.0.0.1:0", db_url=f"sqlite:///{tmp_path / 'rasd.db'}", metrics_port=None
    )
    controller = server.Controller(settings)
    started_ns = time.time_ns()
    await controller.start()
    remediation = controller.remediation
    assert remediation is not None
    ahead, ahead_backend, ahead_journal, ahead_clock = _ahead_agent(tmp_path, controller.port)
    stop = asyncio.Event()
    ahead_task = asyncio.create_task(ahead.run(stop))
    behind = _behind_node()
    streams: list[HandStream] = []
    try:
        # First stream: everything but the late seqs, in shuffled batches, each batch twice.
        first = HandStream(controller.address, behind)
        streams.append(first)
        await first.open(set())
        assert first.welcome is not None and first.welcome.acked_seq == 0
        seqs = [s for s in range(1, EVENTS + 1) if s not in LATE]
        rng.shuffle(seqs)
        batches = [seqs[i : i + 3] for i in range(0, len(seqs), 3)]
        for batch in batches:
            await first.send_events(batch)
            await first.send_events(list(reversed(batch)))
        await chaoslib.until(
            lambda: behind.acked_seq == LATE[0] - 1 and len(first.acks) == 2 * len(batches), 20, "first stream acks"
        )
        await asyncio.sleep(0.5)
        await first.close()  # the stream breaks; seqs 4 and 17 were never sent on it

        # Second stream: the controller welcomes at the gap-free prefix; everything again, late ones included.
        second = HandStream(controller.address, behind)
        streams.append(second)
        await chaoslib.until(lambda: "skew-behind" not in controller.ingest.sessions, 10, "first stream closed")
        await second.open(set())
        assert second.welcome is not None
        welcome_acked = second.welcome.acked_seq
        late_results = list(behind.executed.values())
        await second.send_events([LATE[1], LATE[0]])
        await second.send_events(list(range(1, EVENTS + 1)))
        for result in late_results:  # answers the controller already has, arriving once more, late
            await second.write(agent_pb.AgentMessage(action_result=result))
        await chaoslib.until(lambda: behind.acked_seq == EVENTS, 20, "every event acked on the second stream")

        # The skewed full agent's ladder: an Xid 48 on its GPU 0.
        await chaoslib.until(lambda: ahead.stats.connected, 20, "skew-ahead connected")
        fired = ahead_backend.fire(simulated.ScriptedFault(at_s=0, kind="xid", gpu=0, xid=48), ahead_clock())

        def settled() -> bool:
            commands = remediation.store.commands()
            ahead_done = any(c.gpu_uuid == fired.gpu_uuid and c.kind == "release" for c in commands)
            return ahead_done and all(c.status in rstore.FINAL_STATUSES for c in commands)

        await chaoslib.until(settled, 60, "every ladder settled", poll_s=0.2)
        finished_ns = time.time_ns()
        commands = await controller.ingest.store_calls.run_in_store(remediation.store.commands)
        incidents = await controller.ingest.store_calls.run_in_store(remediation.store.incidents)
        tickets = await controller.ingest.store_calls.run_in_store(remediation.store.tickets)
        stored = await controller.ingest.store_calls.run_in_store(lambda: controller.store.list_events(limit=10_000))
        events_stored = controller.ingest.events_stored
        events_decided = remediation.stats.events
    finally:
        for stream in streams:
            await stream.close()
        stop.set()
        await asyncio.gather(ahead_task, return_exceptions=True)
        await controller.stop()
        ahead_journal.close()

    behind_seqs = collections.Counter(e.seq for e in stored if e.node_id == "skew-behind")
    ahead_seqs = collections.Counter(e.seq for e in stored if e.node_id == "skew-ahead")
    acks = [a for s in streams for a, _ in s.acks]
    ahead_of_sent = [(a, p) for s in streams for a, p in s.acks if a > p]
    backwards = sum(1 for s in streams for (a, _), (b, _) in zip(s.acks, s.acks[1:], strict=False) if b < a)
    per_ticket_kind = collections.Counter((c.ticket_id, c.kind) for c in commands)
    duplicate_commands = sum(n - 1 for n in per_ticket_kind.values() if n > 1)
    xid13_incidents = [i for i in incidents if i["node_id"] == "skew-behind" and i["cause"] == "xid:13"]
    flap_incidents = [i for i in incidents if i["node_id"] == "skew-behind" and "ib" in i["cause"]]
    times = [i["opened_unix_ns"] for i in incidents] + [t["opened_unix_ns"] for t in tickets]
    off_clock = [t for t in times if not started_ns <= t <= finished_ns]
    ahead_tickets = {c.ticket_id for c in commands if c.gpu_uuid == fired.gpu_uuid}
    ahead_outcomes = {c.kind: c.status for c in commands if c.ticket_id in ahead_tickets}
    results_sent = sum(len(s.results_sent) for s in streams) + len(late_results)
    figures(
        f"events {EVENTS} + {sum(ahead_seqs.values())} (skew -2 h / +2 h), messages sent twice {2 * len(batches)}, "
        f"late {len(LATE)}, acks {len(acks)} (ahead of sent {len(ahead_of_sent)}, backwards {backwards}), "
        f"second Welcome at {welcome_acked}, stored {sum(behind_seqs.values()) + sum(ahead_seqs.values())} "
        f"(duplicates {sum(n - 1 for n in behind_seqs.values())}), decided {events_decided}, "
        f"results sent {results_sent} for {len(behind.executed)} commands, duplicate commands {duplicate_commands}, "
        f"Xid 13 incidents {len(xid13_incidents)}, flap incidents {len(flap_incidents)}, "
        f"incident/ticket times off the controller clock {len(off_clock)}, skew-ahead ladder {ahead_outcomes}"
    )
    return {
        "behind_seqs": behind_seqs,
        "ahead_seqs": ahead_seqs,
        "ahead_of_sent": ahead_of_sent,
        "backwards": backwards,
        "welcome_acked": welcome_acked,
        "events_stored": events_stored,
        "events_decided": events_decided,
        "duplicate_commands": duplicate_commands,
        "xid13_incidents": xid13_incidents,
        "flap_incidents": flap_incidents,
        "off_clock": off_clock,
        "ahead_outcomes": ahead_outcomes,
        "behind_commands": len(behind.executed),
    }


def test_duplicated_reordered_late_messages_and_clock_skew_leave_the_store_consistent(tmp_path, figures):
    r = asyncio.run(_run(tmp_path, figures))
    assert sorted(r["behind_seqs"]) == list(range(1, EVENTS + 1))
    assert all(n == 1 for n in r["behind_seqs"].values()), "each seq stored once"
    assert all(n == 1 for n in r["ahead_seqs"].values())
    assert r["ahead_of_sent"] == [], "an ack never covers a seq the controller was not sent"
    assert r["backwards"] == 0, "acks never go backwards on a stream"
    assert r["welcome_acked"] == LATE[0] - 1, "the second Welcome acks exactly the gap-free prefix"
    stored_total = len(r["behind_seqs"]) + len(r["ahead_seqs"])
    assert r["events_stored"] == stored_total, "the ingest counted each stored event once"
    assert r["events_decided"] == stored_total, "the ladder saw each stored event once"
    assert r["duplicate_commands"] == 0
    assert r["behind_commands"] >= 1, "the duplicated and late answers had commands to answer"
    assert len(r["xid13_incidents"]) == 1, "a burst of one fault is one incident"
    assert len(r["flap_incidents"]) == 1, "the flap storm is detected on the controller's clock despite the skew"
    assert r["off_clock"] == [], "incidents and tickets are timed by the controller's clock"
    assert r["ahead_outcomes"] == {
        "quarantine_gpu": "succeeded",
        "reset_gpu": "succeeded",
        "run_validation": "succeeded",
        "release": "succeeded",
    }, "a skewed agent clock must not turn the controller's deadlines into refusals"
