"""The commit writer process: the same commit as in-process, its errors, its fence, and its death.

A real child interpreter (`rasd.controller.store.writer`) on SQLite and on the test PostgreSQL.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import threading
import time

import pytest
import sqlalchemy as sa

from rasd.controller.store import lease, repo, writer
from rasd.controller.store import remediation as rstore

NOW_NS = 1_800_000_000 * 10**9


def _change(command_id: str = "cmd-1", node_id: str = "node-1") -> rstore.Commit:
    change = rstore.Commit(now_unix_ns=NOW_NS)
    change.new_commands.append(
        rstore.CommandRecord(
            command_id=command_id, node_id=node_id, gpu_uuid="GPU-0", ticket_id="t-1", kind="reset_gpu",
            payload={"kind": "reset_gpu"}, status="dispatched", reason="test", created_unix_ns=NOW_NS,
            dispatched_unix_ns=NOW_NS, finished_unix_ns=None, result=None,
        )
    )  # fmt: skip
    change.docs[f"test/{command_id}"] = {"written_by": "writer"}
    change.audit.append(
        {"at_unix_ns": NOW_NS, "actor": "test", "action": "reset_gpu", "node_id": node_id, "gpu_uuid": "GPU-0",
         "reason": "test", "outcome": "dispatched", "details": {}}
    )  # fmt: skip
    return change


@pytest.fixture
def store(store_url):
    opened = repo.Store.open(store_url)
    yield opened
    opened.close()


@pytest.fixture
def commit_process(store_url, store):
    process = writer.CommitProcess(store_url)
    yield process
    process.close()


def test_a_commit_in_the_writer_is_the_store_commit(store, commit_process):
    commit_process.start()
    assert commit_process.pid is not None and commit_process.pid != os.getpid()
    assert commit_process.commit(_change()) == ["cmd-1"], "a new command is reported new"
    assert commit_process.commit(_change()) == [], "the same decision again inserts nothing (idempotent)"
    ours = rstore.RemediationStore(store.engine)
    assert [(c.command_id, c.status) for c in ours.commands()] == [("cmd-1", "dispatched")]
    assert ours.load_doc("test/cmd-1") == {"written_by": "writer"}
    assert commit_process.started == 1


def test_the_store_delegates_to_its_writer(store, commit_process):
    ours = rstore.RemediationStore(store.engine)
    ours.writer = commit_process
    assert ours.commit(_change("cmd-2")) == ["cmd-2"]
    assert commit_process.started == 1, "the commit ran in the child"
    assert [c.command_id for c in ours.commands()] == ["cmd-2"]


def test_a_fenced_commit_is_refused_in_the_child_and_writes_nothing(store_url, store):
    process = writer.CommitProcess(store_url, fence=lambda: lease.Fence(None))
    try:
        with pytest.raises(lease.NotLeaderError, match="not the leader"):
            process.commit(_change())
        assert rstore.RemediationStore(store.engine).commands() == []
        assert process.pid is not None, "a refused commit leaves the child running"
    finally:
        process.close()


def test_a_writer_starts_on_a_store_whose_lease_refuses_its_warm_up_fence(store_url, store):
    """The child warms its fence check up with a term-0 fence: refused where a lease was taken, and it starts anyway."""
    term = lease.LeaseStore(store.engine).take("replica-a").fencing_token
    assert term > 0
    process = writer.CommitProcess(store_url, fence=lambda: lease.Fence(term))
    try:
        process.start()
        assert process.commit(_change("cmd-fenced")) == ["cmd-fenced"], "the real term's commit is accepted"
        assert [c.command_id for c in rstore.RemediationStore(store.engine).commands()] == ["cmd-fenced"]
    finally:
        process.close()


def test_a_writer_killed_during_a_commit_is_a_store_outage_and_the_next_commit_starts_another(tmp_path):
    url = f"sqlite:///{tmp_path / 'rasd.db'}"
    store = repo.Store.open(url)
    process = writer.CommitProcess(url)
    try:
        process.start()
        # Hold SQLite's write lock so that the child's commit waits inside its transaction.
        blocker = sqlite3.connect(tmp_path / "rasd.db", isolation_level=None)
        blocker.execute("BEGIN IMMEDIATE")
        outcome: dict[str, BaseException | list[str]] = {}

        def commit() -> None:
            try:
                outcome["value"] = process.commit(_change("cmd-lost"))
            except BaseException as exc:
                outcome["value"] = exc

        sender = threading.Thread(target=commit)
        sender.start()
        time.sleep(0.5)  # the child is now waiting for the lock (busy timeout 30 s)
        assert "value" not in outcome
        os.kill(process.pid, signal.SIGKILL)
        sender.join(10)
        blocker.execute("ROLLBACK")
        blocker.close()
        assert isinstance(outcome["value"], repo.STORE_UNAVAILABLE), outcome
        assert "died during a commit" in str(outcome["value"])
        assert rstore.RemediationStore(store.engine).commands() == [], "the killed commit wrote nothing"
        assert process.commit(_change("cmd-next")) == ["cmd-next"], "the next commit starts a new child"
        assert process.started == 2
    finally:
        process.close()
        store.close()


def test_an_in_memory_store_cannot_have_a_writer_process():
    with pytest.raises(ValueError, match="in-memory SQLite store cannot be written from another process"):
        writer.CommitProcess("sqlite://")


def test_a_writer_that_cannot_reach_its_database_reports_the_store_error(tmp_path):
    process = writer.CommitProcess(f"sqlite:///{tmp_path / 'missing-dir' / 'rasd.db'}")
    try:
        with pytest.raises(repo.STORE_UNAVAILABLE, match="unable to open database file"):
            process.start()
        assert process.pid is None
    finally:
        process.close()


def test_starting_the_writer_shortens_the_thread_switch_interval(commit_process):
    import sys

    before = sys.getswitchinterval()
    try:
        sys.setswitchinterval(0.005)
        commit_process.start()
        assert sys.getswitchinterval() == pytest.approx(writer.SWITCH_INTERVAL_S)
    finally:
        sys.setswitchinterval(before)


def _row_counts(store: repo.Store) -> dict[str, int]:
    tables = ("commands", "incidents", "repair_tickets", "remediation_states", "controller_states")
    with store.engine.connect() as connection:
        return {t: connection.execute(sa.text(f"SELECT count(*) FROM {t}")).scalar_one() for t in tables}


def test_warming_up_runs_the_write_path_and_writes_nothing(store):
    ours = rstore.RemediationStore(store.engine)
    ours.commit(_change())
    before = _row_counts(store)
    assert before["commands"] == 1 and before["controller_states"] == 1, "the commit before it is there"
    ours.warm_up()
    ours.warm_up()  # and again: its made-up rows were rolled back, so nothing conflicts
    assert _row_counts(store) == before, "the made-up rows were rolled back"
    assert ours.commit(_change("cmd-2")) == ["cmd-2"], "a commit after it works as before"


def test_the_writer_warms_up_before_it_answers_ready_and_writes_nothing(store, commit_process):
    commit_process.start()  # a warm-up that raised would fail the start (the child reports the error)
    assert _row_counts(store) == dict.fromkeys(_row_counts(store), 0), "its warm-up wrote nothing"
    assert commit_process.commit(_change()) == ["cmd-1"]
