"""The store's server restarted mid-run: the controller recovers by itself, losing no event or decision.

A private PostgreSQL (never the shared one) backs a controller; three in-process agents stream
health events to it continuously, and a repair ladder is in flight. PostgreSQL is then stopped
(immediate: every connection is cut as by a crash), stays down for a few seconds, and comes back.
Nobody touches the controller. Afterwards every spooled event is stored once and acked, the ladder
decided on every stored event (the remediation watermark reached each node's last seq), a ladder
started after the restart completes, and no command is left pending or in flight.
"""

from __future__ import annotations

import asyncio
import time

import chaoslib
import pytest
import sqlalchemy as sa

from rasd.agent import node_ops, runtime, spool
from rasd.agent import settings as agent_settings
from rasd.agent.core import model
from rasd.agent.gpu import simulated
from rasd.controller import server
from rasd.controller.core.remediation import policy as policy_mod
from rasd.controller.store import remediation as rstore
from rasd.controller.store import schema

pytestmark = pytest.mark.slow

AGENTS = 3
GPUS = 5  # GPUs 0-3 of every node get a ladder; GPU 4 carries the steady trickle
LADDER_GPUS = 4
LADDER_SPACING_S = 0.25  # 12 ladders started 0.25 s apart, the outage beginning in the middle of them
DOWN_S = 4.0
EVENT_PERIOD_S = 0.25


def _agent(tmp_path, index: int, port: int):
    node_id = f"node-pg{index}"
    backend = simulated.SimulatedBackend(node_id, GPUS, index, workload=simulated.StepWorkload())
    journal = spool.Spool(str(tmp_path / f"{node_id}-spool.db"))
    agent = runtime.Agent(
        agent_settings.AgentSettings(
            node_id=node_id,
            labels={"rack": f"rack-{index}"},
            link=agent_settings.LinkSettings(
                controller_address=f"127.0.0.1:{port}", reconnect_initial_s=0.05, reconnect_max_s=0.5,
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


def _ladder_done(controller: server.Controller, gpu_uuid: str) -> bool:
    assert controller.remediation is not None
    mine = [c for c in controller.remediation.store.commands() if c.gpu_uuid == gpu_uuid]
    return any(c.kind == "release" and c.status == "succeeded" for c in mine) and all(
        c.status in rstore.FINAL_STATUSES for c in mine
    )


async def _run(pg: chaoslib.PrivatePostgres, tmp_path, figures):
    # All three nodes fault at once: the breaker (it counts GPU resets) is lifted, as in the bench.
    settings = server.ControllerSettings(
        listen="127.0.0.1:0",
        db_url=pg.url,
        metrics_port=None,
        remediation_policy=policy_mod.RemediationPolicy.from_mapping(chaoslib.LIFTED_BREAKER),
    )
    controller = server.Controller(settings)
    await controller.start()
    assert controller.remediation is not None
    fleet = [_agent(tmp_path, i, controller.port) for i in range(AGENTS)]
    stop = asyncio.Event()
    tasks = [asyncio.create_task(a.run(stop)) for a, _, _ in fleet]
    produced = {"n": 0}
    producing = asyncio.Event()
    producing.set()

    async def produce() -> None:
        # A steady trickle of health events on every node, through the agents' real spool path. Xid 63
        # (a row-remapping record) is decided and asks for nothing: an actionable Xid repeating every
        # 0.25 s would, rightly, climb its own ladder after each repair (restart, reset, reboot) and
        # hold the disruption budget that the Xid 48 ladders under test need.
        while producing.is_set():
            for agent, backend, _ in fleet:
                gpu = backend.inventory()[GPUS - 1].uuid
                agent.observe(
                    [model.Observation(model.EventKind.XID, time.time_ns(), "NVRM: Xid 63 (chaos)", "kmsg", gpu, 63)]
                )
                produced["n"] += 1
            await asyncio.sleep(EVENT_PERIOD_S)

    producer = asyncio.create_task(produce())
    try:
        await chaoslib.until(lambda: all(a.stats.connected for a, _, _ in fleet), 30, "agents connected")
        # Ladders in flight across the outage, one started every LADDER_SPACING_S: some decided
        # before it, some with commands or results in flight when the database goes, some after.
        fired: list[str] = []

        async def start_ladders() -> None:
            for gpu in range(LADDER_GPUS):
                for _, backend, _ in fleet:
                    xid48 = simulated.ScriptedFault(at_s=0, kind="xid", gpu=gpu, xid=48)
                    fired.append(backend.fire(xid48, time.time_ns()).gpu_uuid)
                    await asyncio.sleep(LADDER_SPACING_S)

        ladders = asyncio.create_task(start_ladders())
        await asyncio.sleep(LADDER_SPACING_S * AGENTS * LADDER_GPUS / 2)
        outage_started = time.monotonic()
        await asyncio.to_thread(pg.restart, down_s=DOWN_S)
        restarted_at = time.monotonic()
        await ladders
        await asyncio.sleep(2.0)
        producing.clear()
        await producer
        recovered_s = await chaoslib.until(
            lambda: chaoslib.agents_alive(tasks) and all(j.depth() == 0 for _, _, j in fleet),
            60,
            "every spooled event acked after the restart",
        )
        try:
            await chaoslib.until(
                lambda: all(_ladder_done(controller, g) for g in fired), 60, "every ladder released", poll_s=0.5
            )
        except AssertionError as exc:
            stuck = {
                g: [(c.kind, c.status, c.ticket_id.rsplit("/", 2)[-2:]) for c in controller.remediation.store.commands()
                    if c.gpu_uuid == g or c.ticket_id.split("/")[1:2] == [g]]
                for g in fired if not _ladder_done(controller, g)
            }  # fmt: skip
            raise AssertionError(f"{exc}; unfinished ladders: {stuck}") from None
        # An ack goes out before the ladder decides the batch; give the last decisions a moment.
        backlog: dict = {}
        for _attempt in range(60):
            backlog = await controller.ingest.store_calls.run_in_store(controller.remediation.store.unprocessed_events)
            if not backlog:
                break
            await asyncio.sleep(0.5)
        outbox = await controller.ingest.store_calls.run_in_store(controller.remediation.store.commands)
        with controller.store.engine.connect() as connection:
            rows = connection.execute(sa.select(schema.HealthEventRow.node_id, schema.HealthEventRow.seq)).all()
        heads = {a.identity.node_id: j.head_seq() for a, _, j in fleet}
        stream_ends: dict[str, int] = {}
        for agent, _, _ in fleet:
            for code, count in agent.stats.stream_lost_by_code.items():
                stream_ends[code] = stream_ends.get(code, 0) + count
    finally:
        producing.clear()
        stop.set()
        await asyncio.gather(producer, *tasks, return_exceptions=True)
        await controller.stop()
        for _, _, journal in fleet:
            journal.close()

    per_node: dict[str, list[int]] = {}
    for node_id, seq in rows:
        per_node.setdefault(node_id, []).append(seq)
    duplicates = sum(len(s) - len(set(s)) for s in per_node.values())
    lost = sum(len(set(range(1, heads[n] + 1)) - set(per_node.get(n, []))) for n in heads)
    unfinished = [(c.kind, c.status) for c in outbox if c.status not in rstore.FINAL_STATUSES]
    figures(
        f"postgres restarts {pg.restarts} (down {DOWN_S:g} s), events spooled {sum(heads.values())} "
        f"stored {len(rows)}, lost {lost}, duplicates {duplicates}, "
        f"undecided {sum(len(e) for _, e in backlog.values())}, ladders {len(fired)} released, "
        f"commands {len(outbox)} unfinished {len(unfinished)}, "
        f"all acked {recovered_s + restarted_at - outage_started:.1f} s after the outage began; "
        f"controller never restarted; agents' streams ended {stream_ends or 'never'}"
    )
    return lost, duplicates, backlog, unfinished, fired, stream_ends


def test_postgres_restart_mid_run_the_controller_recovers_by_itself(private_postgres, tmp_path, figures):
    lost, duplicates, backlog, unfinished, fired, stream_ends = asyncio.run(_run(private_postgres, tmp_path, figures))
    # A stream the outage ends must say "retry" (UNAVAILABLE), never UNKNOWN with the database's error text.
    assert "UNKNOWN" not in stream_ends, stream_ends
    assert len(set(fired)) == AGENTS * LADDER_GPUS
    assert lost == 0
    assert duplicates == 0
    assert backlog == {}, "every stored event went through the ladder"
    assert unfinished == []
