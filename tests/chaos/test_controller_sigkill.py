"""Invariant 2 under fire: a real rasd-controller SIGKILLed at random points over 50 repair ladders.

Ten nodes (in-process agents with simulated GPUs, real spools on disk, real simulated repairs)
stream to a `rasd-controller` process on a SQLite file. In five waves, an Xid 48 (double-bit ECC)
hits one GPU on every node: each walks its ladder (quarantine the GPU, reset it, validate, release).
During each wave the controller is SIGKILLed at seeded random moments and started again on the same
database; the agents reconnect by themselves.

Afterwards, from the store and from every agent's executed-command journal: each of the 50 ladders
has exactly one command of each step (none decided twice), every command is final, every agent
command is in exactly one node's journal (none lost, none run twice), no GPU stays quarantined, and
every spooled health event is stored and acked.
"""

from __future__ import annotations

import asyncio
import collections
import json
import random
import sqlite3
import time

import chaoslib
import pytest

from rasd.agent import node_ops, runtime, spool
from rasd.agent import settings as agent_settings
from rasd.agent.gpu import simulated

pytestmark = [pytest.mark.slow, pytest.mark.timeout(480)]

NODES = 10
WAVES = 5  # one GPU per node per wave: NODES * WAVES ladders
KILLS_PER_WAVE = 3
SEED = 9
LADDER = ("quarantine_gpu", "reset_gpu", "run_validation", "release")
AGENT_KINDS = ("reset_gpu", "run_validation")


def _rows(db_path, query: str, *, busy_timeout_s: float = 30.0) -> list[tuple]:
    """Read the controller's SQLite store from outside (the controller may be dead or alive)."""
    connection = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True, timeout=busy_timeout_s)
    try:
        return connection.execute(query).fetchall()
    finally:
        connection.close()


def _ladders_done(db_path, gpu_uuids: set[str]) -> bool:
    """Every GPU's ladder reached release, and nothing is left pending or in flight."""
    try:
        # Polled from the agents' event loop: never wait long on a lock the controller holds.
        commands = _rows(db_path, "SELECT gpu_uuid, kind, status FROM commands", busy_timeout_s=0.2)
    except sqlite3.OperationalError:
        return False
    released = {g for g, kind, status in commands if kind == "release" and status == "succeeded"}
    open_ = [c for c in commands if c[0] in gpu_uuids and c[2] in ("pending", "dispatched")]
    return gpu_uuids <= released and not open_


def _agent(tmp_path, index: int, port: int):
    node_id = f"node-{index:02d}"
    backend = simulated.SimulatedBackend(node_id, WAVES, index, workload=simulated.StepWorkload())
    journal = spool.Spool(str(tmp_path / f"{node_id}-spool.db"))
    agent = runtime.Agent(
        agent_settings.AgentSettings(
            node_id=node_id,
            labels={"rack": f"rack-{index}"},
            link=agent_settings.LinkSettings(
                controller_address=f"127.0.0.1:{port}", reconnect_initial_s=0.05, reconnect_max_s=0.3,
                welcome_timeout_s=5.0,
            ),
            actions=agent_settings.ActionSettings(destructive_enabled=True, kill_poll_s=0.0),
        ),
        backend,
        journal,
        boot_id=f"boot-{index}",
        ops=node_ops.SimulatedNodeOps(backend),
    )  # fmt: skip
    return agent, backend, journal


async def _run(tmp_path, figures):
    rng = random.Random(SEED)
    db_path = tmp_path / "rasd.db"
    port = chaoslib.free_port()
    # Every node faults in every wave: the breaker (it counts GPU resets) is lifted, as in the bench.
    controller = chaoslib.ControllerProcess(
        tmp_path, f"sqlite:///{db_path}", port, config=chaoslib.lifted_breaker_config(tmp_path)
    )
    controller.start()
    await controller.wait_ready()
    fleet = [_agent(tmp_path, i, port) for i in range(NODES)]
    stop = asyncio.Event()
    tasks = [asyncio.create_task(agent.run(stop)) for agent, _, _ in fleet]
    restart_s: list[float] = []
    wave_s: list[float] = []
    try:
        await chaoslib.until(lambda: all(a.stats.connected for a, _, _ in fleet), 60, "agents connected")
        all_gpus: set[str] = set()
        for wave in range(WAVES):
            started = time.monotonic()
            wave_gpus = set()
            for _, backend, _ in fleet:
                fired = backend.fire(simulated.ScriptedFault(at_s=0, kind="xid", gpu=wave, xid=48), time.time_ns())
                wave_gpus.add(fired.gpu_uuid)
            all_gpus |= wave_gpus
            for _kill in range(KILLS_PER_WAVE):
                # A random moment of the ladder: before the events are stored, between any two
                # steps, or while the agents are still reconnecting after the previous kill.
                await asyncio.sleep(rng.uniform(0.0, 1.5))
                controller.kill()
                await asyncio.sleep(rng.uniform(0.0, 0.3))
                controller.start()
                restart_s.append(await controller.wait_ready())
            await chaoslib.until(
                lambda gpus=wave_gpus: chaoslib.agents_alive(tasks) and _ladders_done(db_path, gpus),
                90,
                f"wave {wave} ladders done",
                poll_s=0.2,
            )
            wave_s.append(time.monotonic() - started)
        # Every event the agents spooled is acked (so stored); give the last acks a moment.
        await chaoslib.until(
            lambda: all(j.depth() == 0 for _, _, j in fleet), 30, "every spooled event acked", poll_s=0.2
        )
    finally:
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        controller.close()

    commands = _rows(db_path, "SELECT command_id, gpu_uuid, kind, status, ticket_id FROM commands")
    quarantined = _rows(db_path, "SELECT gpu_uuid FROM quarantines WHERE released_unix_ns IS NULL")
    stored_seqs = collections.defaultdict(set)
    for node_id, seq in _rows(db_path, "SELECT node_id, seq FROM health_events"):
        stored_seqs[node_id].add(seq)
    executed: collections.Counter[str] = collections.Counter()
    spooled = acked = 0
    for agent, _, journal in fleet:
        rows = journal._db.execute("SELECT command_id, result FROM executed_commands").fetchall()
        for command_id, result in rows:
            executed[command_id] += 1
            assert json.loads(result)["outcome"] != 0
        head = journal.head_seq()
        spooled += head
        acked += journal.acked_seq()
        assert stored_seqs[agent.identity.node_id] >= set(range(1, head + 1)), "every spooled event is stored"
        journal.close()

    # A ticket id is node/GPU/fault/seq@n: one ladder. Validation commands name no single GPU.
    per_gpu: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    tickets: dict[str, set[str]] = collections.defaultdict(set)
    for _id, _gpu, kind, _status, ticket in commands:
        gpu_uuid = ticket.split("/")[1]
        per_gpu[gpu_uuid][kind] += 1
        tickets[gpu_uuid].add(ticket)
    duplicates = sum(max(0, n - 1) for counts in per_gpu.values() for n in counts.values())
    duplicates += sum(len(t) - 1 for t in tickets.values())
    lost_steps = sum(1 for g in all_gpus for kind in LADDER if per_gpu[g][kind] == 0)
    unfinished = [(k, s) for _, _, k, s, _ in commands if s in ("pending", "dispatched")]
    agent_commands = [c for c in commands if c[2] in AGENT_KINDS]
    not_executed = [c for c in agent_commands if executed[c[0]] == 0]
    ran_twice = [cid for cid, n in executed.items() if n > 1]
    ladders = sum(1 for g in all_gpus if all(per_gpu[g][k] == 1 for k in LADDER))
    figures(
        f"ladders {len(all_gpus)} (complete {ladders}), kills {controller.kills}, duplicates {duplicates}, "
        f"lost {lost_steps + len(not_executed)}, agent commands executed {sum(executed.values())} "
        f"(run twice {len(ran_twice)}), events spooled {spooled} stored {sum(len(s) for s in stored_seqs.values())} "
        f"acked {acked}; controller restart p50 {chaoslib.percentile(restart_s, 50):.2f} s, "
        f"wave p50 {chaoslib.percentile(wave_s, 50):.1f} s"
    )
    return (
        all_gpus,
        per_gpu,
        tickets,
        duplicates,
        lost_steps,
        unfinished,
        not_executed,
        ran_twice,
        quarantined,
        controller,
    )


def test_sigkill_at_random_points_over_50_ladders_loses_and_repeats_nothing(tmp_path, figures):
    gpus, per_gpu, tickets, duplicates, lost, unfinished, not_executed, ran_twice, quarantined, controller = (
        asyncio.run(_run(tmp_path, figures))
    )
    assert len(gpus) == NODES * WAVES == 50
    assert controller.kills == WAVES * KILLS_PER_WAVE
    assert duplicates == 0, {g: (dict(c), sorted(tickets[g])) for g, c in per_gpu.items() if max(c.values()) > 1}
    assert lost == 0, {g: dict(per_gpu[g]) for g in gpus if set(per_gpu[g]) != set(LADDER)}
    assert unfinished == []
    assert not_executed == [], "an agent command in the outbox never reached its node"
    assert ran_twice == []
    assert quarantined == [], "every GPU is back in service"
