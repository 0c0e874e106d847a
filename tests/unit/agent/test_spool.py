"""The spool keeps every event until acked, across restarts, and remembers executed commands."""

from __future__ import annotations

from rasd.agent import spool
from rasd.agent.core import kmsg, model


def _obs(i: int) -> model.Observation:
    return model.Observation(
        kind=model.EventKind.XID,
        observed_unix_ns=1000 + i,
        message=f"xid {i}",
        source="kmsg",
        gpu_uuid="GPU-00000000-0000-0000-0000-000000000001",
        xid=13,
        severity=model.Severity.ERROR,
        attributes={"pid": str(i)},
    )


def test_events_survive_a_restart_until_acked(tmp_path):
    path = str(tmp_path / "spool.db")
    first = spool.Spool(path)
    spooled = first.append([_obs(1), _obs(2), _obs(3)])
    assert [e.seq for e in spooled] == [1, 2, 3]
    first.ack(1)
    first.close()

    reopened = spool.Spool(path)
    assert [(e.seq, e.observation) for e in reopened.unacked()] == [(2, _obs(2)), (3, _obs(3))]
    assert reopened.depth() == 2
    assert reopened.acked_seq() == 1


def test_seq_never_goes_back_even_after_everything_was_acked(tmp_path):
    path = str(tmp_path / "spool.db")
    journal = spool.Spool(path)
    journal.append([_obs(1), _obs(2)])
    journal.ack(2)
    journal.close()
    journal = spool.Spool(path)
    assert journal.head_seq() == 2
    assert journal.append([_obs(3)])[0].seq == 3


def test_stale_or_repeated_ack_changes_nothing():
    journal = spool.Spool(":memory:")
    journal.append([_obs(i) for i in range(5)])
    assert journal.ack(3) == 3
    assert journal.ack(2) == 0
    assert journal.ack(3) == 0
    assert [e.seq for e in journal.unacked()] == [4, 5]


def test_executed_command_result_is_remembered(tmp_path):
    path = str(tmp_path / "spool.db")
    journal = spool.Spool(path)
    result = model.ActionResult(
        command_id="c-1",
        outcome=model.ActionOutcome.SUCCEEDED,
        message="ok",
        started_unix_ns=1,
        finished_unix_ns=2,
        enforced_limits_w={"GPU-a": 500},
    )
    journal.record_result(result)
    journal.close()
    assert spool.Spool(path).executed_result("c-1") == result
    assert spool.Spool(path).executed_result("c-2") is None


def test_results_older_than_the_retention_are_dropped_as_new_ones_are_recorded(tmp_path, monkeypatch):
    """A cap command every period journaled for ever grew the spool by ~10 MB a day."""
    day_ns = 24 * 3600 * 10**9
    journal = spool.Spool(str(tmp_path / "spool.db"))

    def result(command_id: str, finished_unix_ns: int) -> model.ActionResult:
        return model.ActionResult(command_id, model.ActionOutcome.SUCCEEDED, "ok", finished_unix_ns, finished_unix_ns)

    now_ns = 10 * day_ns
    journal.record_result(result("old", now_ns - 3 * day_ns))  # the first one prunes: nothing older yet
    journal.record_started("started-long-ago", "reset GPU GPU-a", now_ns - 3 * day_ns)
    journal.record_result(result("recent", now_ns - day_ns))
    assert journal.executed_result("old") is not None  # pruned at most once an hour
    monkeypatch.setattr(spool, "PRUNE_EVERY_S", 0.0)
    journal.record_result(result("new", now_ns))
    assert journal.executed_result("old") is None and journal.started_command("started-long-ago") is None
    assert journal.executed_result("recent") is not None and journal.executed_result("new") is not None


def test_unacked_pages_after_a_seq_and_never_below_the_acked_position():
    journal = spool.Spool(":memory:")
    journal.append([_obs(i) for i in range(10)])
    journal.ack(2)

    assert [e.seq for e in journal.unacked(3, after_seq=4)] == [5, 6, 7]
    assert [e.seq for e in journal.unacked(3, after_seq=7)] == [8, 9, 10]
    assert journal.unacked(3, after_seq=10) == []
    assert [e.seq for e in journal.unacked(2, after_seq=1)] == [3, 4]  # acked events are gone


def test_a_spool_keeps_its_identity_and_a_new_file_gets_another(tmp_path):
    first = spool.Spool(str(tmp_path / "a.db"))
    spool_id = first.spool_id
    first.close()
    assert spool.Spool(str(tmp_path / "a.db")).spool_id == spool_id  # the agent restarted
    assert spool.Spool(str(tmp_path / "b.db")).spool_id not in ("", spool_id)  # the state dir was wiped


def test_kernel_log_facts_survive_a_restart_and_an_older_agents_rows_read_without_them(tmp_path):
    (event,) = kmsg.KmsgParser().feed(
        "NVRM: Xid (PCI:0000:18:00): 149, NETIR_LINK_EVT Fatal XC0 i0 Link 00 (0x025001c6 0x00000000 0x00000000)"
    )
    path = str(tmp_path / "spool.db")
    first = spool.Spool(path)
    first.append([kmsg.to_observation(event, 5)])
    # A row as an agent before the typed facts spooled it: the facts only in its attributes.
    first._db.execute(
        "INSERT INTO events (payload) VALUES (?)",
        ('{"kind":1,"observed_unix_ns":6,"message":"m","source":"kmsg","gpu_uuid":"","xid":13,"severity":3,'
         '"attributes":{"kernel_event":"xid","pid":"7"}}',),
    )  # fmt: skip
    first._db.commit()
    first.close()

    new, old = (e.observation for e in spool.Spool(path).unacked())
    assert new.kernel_log == event
    assert (old.kernel_log, old.attributes["pid"]) == (None, "7")  # sent as it was; the controller reads it
