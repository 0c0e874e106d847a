"""Kernel-log pump: events reach the spool once, even when the agent dies between spool and cursor."""

from __future__ import annotations

import threading

import pytest

from rasd.agent import kmsg_source, sources, spool
from rasd.agent.core import model
from rasd.agent.gpu import simulated

XID_LINE = "3,{seq},{usec},-;NVRM: Xid (PCI:0000:18:00): 13, pid=42{seq}, name=python, Graphics Exception"


def _write(path, seqs):
    with open(path, "a") as f:
        for seq in seqs:
            f.write(XID_LINE.format(seq=seq, usec=seq * 1000) + "\n")


class Crash(Exception):
    """Stands in for SIGKILL at a chosen instant."""


def _pump(tmp_path, journal, backend, deliver=None):
    follower = kmsg_source.KmsgFollower(
        tmp_path / "kmsg.cursor", path=tmp_path / "kmsg", boot_id_path=tmp_path / "boot_id"
    )
    return sources.KernelLogPump(
        follower,
        source_name="kmsg",
        inventory=backend.inventory(),
        deliver=deliver or (lambda obs, cursor: journal.append(obs, source_cursor=cursor)),
        clock=lambda: 7,
        saved_cursor=journal.source_cursor("kmsg"),
        reopen_s=0.0,
    )


def _run_until(pump, delivered):
    """Run the pump in a thread until it has delivered `delivered` events, then stop it."""
    pump.follower.poll_s = 0.01
    stop = threading.Event()
    thread = threading.Thread(target=pump.run, args=(stop,))
    thread.start()
    while pump.events_delivered < delivered:
        thread.join(0.01)
    stop.set()
    thread.join()


@pytest.fixture
def backend():
    return simulated.SimulatedBackend("n", 2, 0)


def test_events_are_spooled_with_their_gpu_and_facts(tmp_path, backend):
    (tmp_path / "boot_id").write_text("boot-a\n")
    _write(tmp_path / "kmsg", [1, 2])
    journal = spool.Spool(str(tmp_path / "spool.db"))
    pump = _pump(tmp_path, journal, backend)
    _run_until(pump, 2)
    events = journal.unacked()
    assert [e.observation.xid for e in events] == [13, 13]
    assert {e.observation.gpu_uuid for e in events} == {backend.inventory()[0].uuid}  # PCI 18:00 is GPU 0
    assert events[0].observation.kind is model.EventKind.XID
    # The facts survive the spool, and the agent rates nothing: the controller classifies.
    assert [e.observation.kernel_log.pid for e in events] == [421, 422]
    assert (events[0].observation.kernel_log.process, events[0].observation.kernel_log.pci) == (
        "python",
        "0000:18:00.0",
    )
    assert events[0].observation.severity is model.Severity.UNSPECIFIED


def test_a_crash_between_spool_and_cursor_file_neither_loses_nor_repeats(tmp_path, backend):
    (tmp_path / "boot_id").write_text("boot-a\n")
    _write(tmp_path / "kmsg", [1, 2, 3])
    journal = spool.Spool(str(tmp_path / "spool.db"))
    pump = _pump(tmp_path, journal, backend)

    def crash_on_second_commit(record, original=pump.follower.commit):
        if record.cursor == "2":
            raise Crash
        original(record)

    pump.follower.commit = crash_on_second_commit  # the file write never happens for record 2
    with pytest.raises(Crash):
        pump.run(threading.Event())
    assert [e.seq for e in journal.unacked()] == [1, 2]
    assert pump.follower.cursor.load()["seq"] == "1"  # the follower's own file lags the spool
    journal.close()

    # Restart: the spool's cursor wins, so record 2 is not read again and record 3 is.
    journal = spool.Spool(str(tmp_path / "spool.db"))
    restarted = _pump(tmp_path, journal, backend)
    _run_until(restarted, 1)
    messages = [e.observation.kernel_log.pid for e in journal.unacked()]
    assert [e.seq for e in journal.unacked()] == [1, 2, 3]
    assert len(set(messages)) == 3


def test_a_reboot_resets_the_kmsg_sequence_and_everything_is_new(tmp_path, backend):
    (tmp_path / "boot_id").write_text("boot-a\n")
    _write(tmp_path / "kmsg", [5])
    journal = spool.Spool(str(tmp_path / "spool.db"))
    _run_until(_pump(tmp_path, journal, backend), 1)
    # New boot: the kernel numbers records from 0 again.
    (tmp_path / "boot_id").write_text("boot-b\n")
    (tmp_path / "kmsg").write_text("")
    _write(tmp_path / "kmsg", [0, 1])
    _run_until(_pump(tmp_path, journal, backend), 2)
    assert len(journal.unacked()) == 3


def test_a_plain_text_file_is_spooled_once_across_reopens_and_restarts(tmp_path, backend):
    """Lines without a kmsg header: each reopen (every reopen_s) read the file from its start and spooled
    every event in it again; they resume after the last committed line, and so does a restarted pump."""
    (tmp_path / "boot_id").write_text("boot-a\n")
    xid = "[ {n}.0] NVRM: Xid (PCI:0000:18:00): 13, pid={n}, name=python, Graphics Exception\n"
    (tmp_path / "kmsg").write_text(xid.format(n=1) + xid.format(n=2))
    journal = spool.Spool(str(tmp_path / "spool.db"))
    pump = _pump(tmp_path, journal, backend)
    pump.follower.poll_s = 0.01
    stop = threading.Event()
    thread = threading.Thread(target=pump.run, args=(stop,))
    thread.start()
    while pump.records_read < 2:
        thread.join(0.01)
    with open(tmp_path / "kmsg", "a") as f:
        f.write(xid.format(n=3))
    while pump.records_read < 3:
        thread.join(0.01)
    thread.join(0.2)  # reopens (reopen_s 0) that find nothing new
    stop.set()
    thread.join()
    assert pump.events_delivered == 3 and pump.records_read == 3
    again = _pump(tmp_path, journal, backend)  # a restarted agent: from the spool's cursor
    again.follower.poll_s = 0.01
    stop = threading.Event()
    thread = threading.Thread(target=again.run, args=(stop,))
    thread.start()
    thread.join(0.2)
    stop.set()
    thread.join()
    assert again.records_read == 0
    assert [e.observation.xid for e in journal.unacked()] == [13, 13, 13]
