"""A controller killed at any step of a repair ladder resumes it: no command lost, none run twice.

A real controller (gRPC on loopback, store on SQLite and on PostgreSQL) and one agent with simulated
GPUs and real (simulated) repairs. An Xid 48 on a GPU walks the ladder: quarantine the GPU, reset it,
validate, release. The quarantine adapter is the default (record only), called with the decision
(or in its dispatch round), or the same adapter called as one that blocks is (in a thread, after the
round's commit).
The controller "dies" at its Nth store commit, either just before the commit (the transaction never
happens) or just after it (nothing after it in memory happens). A new controller then starts on the
same database and port; the agent reconnects. Every case must end with the GPU back in service,
every outbox command final, and the agent having executed each command id at most once.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import socket

import pytest

from rasd.agent import node_ops, runtime, spool
from rasd.agent import settings as agent_settings
from rasd.agent.gpu import simulated
from rasd.controller import server
from rasd.controller.store import remediation as rstore

LADDER_COMMITS = {"inline": 5, "threaded": 7}
"""Commits the happy path takes for one Xid 48 (checked by the test without a crash), by how the quarantine
adapter runs. Either way the quarantine and the reset are admitted, recorded and dispatched in the
decision's own commit. Record only: the quarantine is carried out in that commit and the release in its
dispatch round. One that waits on a scheduler: called in a thread once the decision has committed, the
reset held until it returns, and its outcome and the release's each committed after them (two more commits)."""
RESTART_COMMITS = 2  # for one Xid 13: the decision with its dispatch, then the result


class Crash(Exception):
    """Stands in for SIGKILL at one commit."""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


async def _until(predicate, timeout_s=20.0):
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not predicate():
        if loop.time() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.05)


def _controller(settings: server.ControllerSettings, adapters: str) -> server.Controller:
    controller = server.Controller(settings)
    if adapters == "threaded":
        # The same adapter, as the service calls one that waits on another system: a plain callable
        # says nothing of blocking, so it is taken to block.
        adapters = controller.remediation.adapters
        adapters.executors = {kind: functools.partial(run) for kind, run in adapters.executors.items()}
    return controller


async def _run_ladder(
    store_url: str,
    tmp_path,
    crash_at: int | None,
    when: str,
    *,
    xid: int = 48,
    commit_writer: str = "thread",
    adapters: str = "inline",
):
    port = _free_port()
    settings = server.ControllerSettings(
        listen=f"127.0.0.1:{port}", db_url=store_url, metrics_port=None, commit_writer=commit_writer
    )
    backend = simulated.SimulatedBackend("node-d", 2, 0, workload=simulated.StepWorkload())
    ops = node_ops.SimulatedNodeOps(backend)
    journal = spool.Spool(str(tmp_path / "agent-spool.db"))
    agent = runtime.Agent(
        agent_settings.AgentSettings(
            node_id="node-d",
            labels={"rack": "r1"},
            link=agent_settings.LinkSettings(
                controller_address=f"127.0.0.1:{port}", reconnect_initial_s=0.05, reconnect_max_s=0.2,
                telemetry_send_interval_ms=200,
            ),
            actions=agent_settings.ActionSettings(destructive_enabled=True, kill_poll_s=0.0),
        ),
        backend,
        journal,
        boot_id="boot",
        ops=ops,
    )  # fmt: skip
    executed: list[str] = []
    original_execute = agent._executor.execute

    def counting_execute(command):
        result = original_execute(command)
        if not result.replayed:
            executed.append(command.command_id)
        return result

    agent._executor.execute = counting_execute

    commits = {"n": 0}
    dead = {"now": False}
    original_commit = rstore.RemediationStore.commit

    def crashing_commit(self, change):
        if dead["now"]:
            raise Crash("the process is gone: nothing it does reaches the database")
        commits["n"] += 1
        if crash_at is not None and commits["n"] == crash_at:
            dead["now"] = True
            if when == "before":
                raise Crash(f"killed before commit {crash_at}")
            original_commit(self, change)
            raise Crash(f"killed after commit {crash_at}")
        return original_commit(self, change)

    rstore.RemediationStore.commit = crashing_commit
    controller = _controller(settings, adapters)
    stop = asyncio.Event()
    agent_task = None
    try:
        await controller.start()
        agent_task = asyncio.create_task(agent.run(stop))
        await _until(lambda: "node-d" in controller.ingest.sessions)
        backend.fire(simulated.ScriptedFault(at_s=0, kind="xid", gpu=0, xid=xid), backend._epoch_ns or 0)

        def finished(c: server.Controller) -> bool:
            state = c.remediation.node_states.get("node-d") if c.remediation else None
            if not (state and state.tickets and all(t.state.value == "watching" for t in state.tickets)):
                return False
            # The release is decided with the WATCHING state and carried out right after it.
            return all(r.status in rstore.FINAL_STATUSES for r in c.remediation.store.commands())

        with contextlib.suppress(AssertionError):
            await _until(lambda: finished(controller) or commits["n"] >= (crash_at or 10**9), timeout_s=20)
        if crash_at is not None and commits["n"] >= crash_at:
            # The process died: nothing of it survives but the database. Start a new one.
            await asyncio.sleep(0.2)
            await controller.stop()
            rstore.RemediationStore.commit = original_commit
            controller = _controller(settings, adapters)
            await controller.start()
        await _until(lambda: finished(controller), timeout_s=30)
        outbox = await controller.ingest.store_calls.run_in_store(controller.remediation.store.commands)
        quarantined = await controller.ingest.store_calls.run_in_store(controller.remediation.store.quarantines)
        return executed, outbox, quarantined, commits["n"], dead["now"]
    finally:
        rstore.RemediationStore.commit = original_commit
        stop.set()
        if agent_task is not None:
            await agent_task
        await controller.stop()
        journal.close()


@pytest.mark.parametrize(
    ("adapters", "commit_writer"), [("inline", "thread"), ("inline", "process"), ("threaded", "process")]
)
def test_the_ladder_completes_without_a_crash(store_url, tmp_path, adapters, commit_writer):
    executed, outbox, quarantined, commits, _ = asyncio.run(
        _run_ladder(store_url, tmp_path, None, "before", commit_writer=commit_writer, adapters=adapters)
    )
    # An Xid 48 comes with its ECC DBE counter event. With group commit the two are decided in one
    # pass or in two, depending on when each reaches the controller (seen: 7 commits in a CI run, 6 in
    # most). The extra commit is another event decision, the same kind as the commits tested below.
    assert LADDER_COMMITS[adapters] <= commits <= LADDER_COMMITS[adapters] + 1, (
        f"{commits} commits: update LADDER_COMMITS so every commit of the ladder gets a crash case"
    )
    kinds = sorted(c.kind for c in outbox)
    assert kinds == ["quarantine_gpu", "release", "reset_gpu", "run_validation"]
    assert all(c.status in rstore.FINAL_STATUSES for c in outbox)
    assert quarantined == []
    assert len(executed) == len(set(executed)) == sum(1 for c in outbox if c.kind in ("reset_gpu", "run_validation"))


LADDERS = [("inline", "thread"), ("inline", "process"), ("threaded", "process")]


def _crash_case(adapters: str, commit_writer: str, crash_at: int, when: str):
    """One crash case; `make test` runs a sample of them, `make test-all` (CI) every one.

    The sample: every commit of the store-thread ladder (cheap), once each, before and after
    alternating; one case on each writer-process ladder (each run starts two writer processes): the
    inline adapters' last commit killed after it happened, the threaded adapters' first killed before.
    """
    if commit_writer == "thread":
        sampled = when == ("before" if crash_at % 2 else "after")
    elif adapters == "inline":
        sampled = (crash_at, when) == (LADDER_COMMITS[adapters], "after")
    else:
        sampled = (crash_at, when) == (1, "before")
    return pytest.param(adapters, commit_writer, crash_at, when, marks=() if sampled else pytest.mark.slow)


CRASH_CASES = [
    _crash_case(adapters, writer, n, when)
    for adapters, writer in LADDERS
    for n in range(1, LADDER_COMMITS[adapters] + 1)
    for when in ("before", "after")
]


@pytest.mark.parametrize(("adapters", "commit_writer", "crash_at", "when"), CRASH_CASES)
def test_a_crash_at_any_commit_loses_and_repeats_nothing(store_url, tmp_path, adapters, commit_writer, crash_at, when):
    """With commits in the store thread or in the writer process (a crash kills both)."""
    executed, outbox, quarantined, _, crashed = asyncio.run(
        _run_ladder(store_url, tmp_path, crash_at, when, commit_writer=commit_writer, adapters=adapters)
    )
    assert crashed, f"commit {crash_at} never happened: the crash case tested nothing"
    ids = [c.command_id for c in outbox]
    assert len(ids) == len(set(ids)), "no command decided twice"
    assert all(c.status in rstore.FINAL_STATUSES for c in outbox), [(c.kind, c.status) for c in outbox]
    assert len(executed) == len(set(executed)), f"a command ran twice on the node: {executed}"
    assert {c.kind for c in outbox} >= {"quarantine_gpu", "reset_gpu", "run_validation", "release"}
    assert quarantined == [], "the GPU is back in service"
    print(f"\ncrash {when} commit {crash_at}: commands {len(ids)}, executed on node {len(executed)}, duplicates 0")


def test_an_agent_only_repair_is_dispatched_in_its_decision_commit(store_url, tmp_path):
    """Xid 13 → restart_process: the decision and its dispatch are one transaction, the result another."""
    executed, outbox, quarantined, commits, _ = asyncio.run(_run_ladder(store_url, tmp_path, None, "before", xid=13))
    assert commits == RESTART_COMMITS
    assert [(c.kind, c.status) for c in outbox] == [("restart_process", "succeeded")]
    assert outbox[0].dispatched_unix_ns == outbox[0].created_unix_ns
    assert executed == [outbox[0].command_id]
    assert quarantined == []


@pytest.mark.parametrize("when", ["before", "after"])
@pytest.mark.parametrize("crash_at", range(1, RESTART_COMMITS + 1))
def test_a_crash_at_any_commit_of_an_agent_only_repair_loses_and_repeats_nothing(store_url, tmp_path, crash_at, when):
    executed, outbox, _, _, crashed = asyncio.run(_run_ladder(store_url, tmp_path, crash_at, when, xid=13))
    assert crashed, f"commit {crash_at} never happened: the crash case tested nothing"
    assert [(c.kind, c.status) for c in outbox] == [("restart_process", "succeeded")]
    assert executed == [outbox[0].command_id], f"the restart ran {len(executed)} times on the node"
