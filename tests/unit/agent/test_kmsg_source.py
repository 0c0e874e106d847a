"""The /dev/kmsg and journald followers, with fixture files, a FIFO and a stand-in journalctl."""

from __future__ import annotations

import json
import os
import sys
import threading
from pathlib import Path

import pytest

from rasd.agent.core.kmsg import KmsgParser
from rasd.agent.kmsg_source import CursorFile, JournalFollower, KernelLogRecord, KmsgFollower
from rasd.common.kernel_log import KernelEventKind

FIXTURES = Path(__file__).parents[2] / "fixtures" / "kmsg"
KMSG = FIXTURES / "kmsg_records.txt"
FAKE_JOURNALCTL = [sys.executable, str(FIXTURES / "fake_journalctl.py"), str(FIXTURES / "journal_kernel.jsonl")]


@pytest.fixture
def boot_id(tmp_path: Path) -> Path:
    path = tmp_path / "boot_id"
    path.write_text("0f5e2c1a-1111-4222-8333-944455556666\n")
    return path


def kmsg_follower(tmp_path: Path, boot_id: Path, path: Path = KMSG) -> KmsgFollower:
    return KmsgFollower(tmp_path / "state" / "kmsg.cursor", path=path, boot_id_path=boot_id, poll_s=0.05)


# --- /dev/kmsg ---------------------------------------------------------------------------------------


def test_kmsg_records_skip_dictionary_lines(tmp_path, boot_id):
    records = list(kmsg_follower(tmp_path, boot_id).records())
    assert [r.cursor for r in records] == [str(s) for s in range(1201, 1210)]
    assert records[0].line.startswith("6,1201,2201000000,-;NVRM: GPU at PCI:0008:01:00")
    assert not any(r.line.startswith(" ") for r in records)


def test_kmsg_records_feed_the_parser(tmp_path, boot_id):
    parser = KmsgParser()
    events = [e for r in kmsg_follower(tmp_path, boot_id).records() for e in parser.feed(r.line)]
    assert [e.xid for e in events] == [144, 149, 145, 149, 154, 154, None]
    assert events[-1].kind is KernelEventKind.FALLEN_OFF_BUS


def test_kmsg_cursor_resumes_after_the_committed_record(tmp_path, boot_id):
    first = kmsg_follower(tmp_path, boot_id)
    records = list(first.records())
    first.commit(records[4])  # seq 1205 handled; the agent dies before committing more

    again = kmsg_follower(tmp_path, boot_id)
    assert again.resume_after() == 1205
    assert [r.cursor for r in again.records()] == ["1206", "1207", "1208", "1209"]


def test_kmsg_cursor_is_ignored_after_a_reboot(tmp_path, boot_id):
    first = kmsg_follower(tmp_path, boot_id)
    first.commit(list(first.records())[-1])
    boot_id.write_text("a-new-boot\n")  # sequence numbers restart at 0 on every boot
    again = kmsg_follower(tmp_path, boot_id)
    assert again.resume_after() is None
    assert len(list(again.records())) == 9


def test_kmsg_cursor_file_contents(tmp_path, boot_id):
    follower = kmsg_follower(tmp_path, boot_id)
    follower.commit(KernelLogRecord(line="x", cursor="1203"))
    follower.commit(KernelLogRecord(line="no header", cursor=""))  # nothing to remember
    saved = json.loads((tmp_path / "state" / "kmsg.cursor").read_text())
    assert saved == {"source": "kmsg", "boot_id": "0f5e2c1a-1111-4222-8333-944455556666", "seq": "1203"}
    assert not (tmp_path / "state" / "kmsg.cursor.tmp").exists()


def test_kmsg_counts_sequence_gaps_as_lost(tmp_path, boot_id):
    path = tmp_path / "kmsg"
    path.write_text("4,10,1,-;a\n4,11,2,-;b\n4,15,3,-;c\n4,16,4,-;d")  # no newline at the end
    follower = kmsg_follower(tmp_path, boot_id, path)
    first = list(follower.records())
    for record in first:
        follower.commit(record)  # as the pump does, so that the next pass resumes after "c"
    # "d" is unterminated, so it may be half written: held back until a pass finds the file unchanged.
    assert [r.line for r in first] == ["4,10,1,-;a", "4,11,2,-;b", "4,15,3,-;c"]
    assert follower.lost_records == 3  # 12 to 14
    assert [r.line for r in follower.records()] == ["4,16,4,-;d"]
    assert follower.lost_records == 3  # 16 follows 15: holding it back made no gap


def test_kmsg_file_record_half_written_at_end_of_file_is_read_once_complete(tmp_path, boot_id):
    # A writer appending to a kmsg-format file can be caught half way through a record. Its seq must
    # not be committed for the half, or the complete line is skipped as already handled.
    path = tmp_path / "kmsg"
    full = "3,5,5000,-;NVRM: Xid (PCI:0000:18:00): 79, pid=1234, name=python, GPU has fallen off the bus.\n"
    follower = kmsg_follower(tmp_path, boot_id, path)
    parser = KmsgParser()
    events = []

    def one_pass() -> None:  # one reopen of the file, as KernelLogPump.run makes every reopen_s
        for record in follower.records():
            events.extend(parser.feed(record.line))
            follower.commit(record)

    path.write_text(full[:40])  # "...: 7": the half would parse as Xid 7
    one_pass()
    path.write_text(full)
    one_pass()
    assert [(e.kind, e.xid, e.message) for e in events] == [(KernelEventKind.XID, 79, "GPU has fallen off the bus.")]
    assert CursorFile(tmp_path / "state" / "kmsg.cursor").load()["seq"] == "5"


def test_kmsg_plain_text_lines_resume_after_the_last_committed_by_byte_offset(tmp_path, boot_id):
    """A plain text file (a saved dmesg, a syslog kern.log) has no seq: read again from its start at each
    reopen, every line of it was spooled again every second. Its cursor is the inode and the byte offset."""
    path = tmp_path / "dmesg.txt"
    first = "[   12.3] NVRM: Xid (PCI:0000:01:00): 79, GPU has fallen off the bus.\n"
    path.write_text(first + "\n[   12.4] second line\n")
    follower = kmsg_follower(tmp_path, boot_id, path)
    records = list(follower.records())
    assert [r.line for r in records] == [first.rstrip("\n"), "[   12.4] second line"]
    assert KmsgParser().feed(records[0].line)[0].xid == 79
    assert records[0].cursor == f"text:{path.stat().st_ino}:{len(first)}"
    follower.commit(records[0])
    assert [r.line for r in follower.records()] == ["[   12.4] second line"], "the reopen reads on after the commit"
    follower.commit(records[1])
    assert list(follower.records()) == [], "nothing new"
    with path.open("a") as f:
        f.write("[   12.5] third line\n")
    restarted = kmsg_follower(tmp_path, boot_id, path)  # the cursor file, as a restarted agent reads it
    (third,) = restarted.records()
    assert third.line == "[   12.5] third line" and third.cursor == f"text:{path.stat().st_ino}:{path.stat().st_size}"
    restarted.commit(third)
    path.write_text("[    1.0] after a truncation\n")  # shorter than the offset (copytruncate): from the start
    assert [r.line for r in restarted.records()] == ["[    1.0] after a truncation"]
    rotated = tmp_path / "dmesg.new"
    rotated.write_text(first * 4)  # a new file in its place (rotated): another inode, from the start
    os.replace(rotated, path)
    assert len(list(restarted.records())) == 4


def test_kmsg_plain_text_cursor_keeps_the_seq_cursor_beside_it(tmp_path, boot_id):
    follower = kmsg_follower(tmp_path, boot_id)
    *_, last = follower.records()
    follower.commit(last)
    follower.commit(KernelLogRecord(line="plain", cursor="text:12:34"))
    saved = CursorFile(tmp_path / "state" / "kmsg.cursor").load()
    assert saved == {
        "source": "kmsg",
        "boot_id": follower.boot_id,
        "seq": "1209",
        "text_inode": "12",
        "text_offset": "34",
    }
    assert follower.resume_after() == 1209


def test_kmsg_from_a_fifo(tmp_path, boot_id):
    fifo = tmp_path / "kmsg.fifo"
    os.mkfifo(fifo)
    data = KMSG.read_bytes()
    opened = threading.Event()

    def writer() -> None:
        with open(fifo, "wb") as f:  # returns once a reader (the holder below) has the FIFO open
            opened.set()
            for i in range(0, len(data), 7):  # odd chunk sizes split records across writes
                f.write(data[i : i + 7])
                f.flush()

    thread = threading.Thread(target=writer)
    thread.start()
    holder = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    try:
        # Without a connected writer a FIFO reads as end of file, so wait until the writer is in.
        # It may finish and close before the follower opens: the data waits in the pipe.
        assert opened.wait(timeout=10)
        records = list(kmsg_follower(tmp_path, boot_id, fifo).records())
    finally:
        os.close(holder)
        thread.join(timeout=10)
    assert [r.cursor for r in records] == [str(s) for s in range(1201, 1210)]


def test_kmsg_fifo_whose_writer_left_before_we_opened_it_ends(tmp_path, boot_id):
    fifo = tmp_path / "gone.fifo"
    os.mkfifo(fifo)
    holder = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    writer = os.open(fifo, os.O_WRONLY)
    os.write(writer, b"4,1,1,-;first\n4,2,2,-;second\n")
    os.close(writer)  # gone before the follower opens: poll() never reports a hang-up here
    try:
        assert [r.line for r in kmsg_follower(tmp_path, boot_id, fifo).records()] == ["4,1,1,-;first", "4,2,2,-;second"]
    finally:
        os.close(holder)


def test_kmsg_stop_ends_the_iteration(tmp_path, boot_id):
    fifo = tmp_path / "idle.fifo"
    os.mkfifo(fifo)
    keep_open = os.open(fifo, os.O_RDWR)  # a writer that never writes: reads would wait forever
    try:
        stop = threading.Event()
        stop.set()
        assert list(kmsg_follower(tmp_path, boot_id, fifo).records(stop)) == []
    finally:
        os.close(keep_open)


def test_missing_boot_id_still_allows_a_cursor(tmp_path):
    follower = KmsgFollower(tmp_path / "c", path=KMSG, boot_id_path=tmp_path / "absent", poll_s=0.05)
    follower.commit(KernelLogRecord(line="", cursor="1208"))
    assert [r.cursor for r in follower.records()] == ["1209"]


# --- journald ----------------------------------------------------------------------------------------


def journal_follower(tmp_path: Path, *extra: str) -> JournalFollower:
    return JournalFollower(tmp_path / "journal.cursor", command=[*FAKE_JOURNALCTL, *extra], poll_s=0.05)


def test_journal_command_line():
    follower = JournalFollower("/nonexistent/cursor")
    assert follower.build_command() == ["journalctl", "-k", "-f", "-o", "json", "--lines=all"]


def test_journal_records(tmp_path):
    follower = journal_follower(tmp_path)
    records = list(follower.records())
    assert [r.cursor[-4:] for r in records] == ["x=11", "x=12", "x=13", "x=14"]
    assert records[1].line.startswith("NVRM: Xid (PCI:0000:91:00): 79")
    assert records[1].realtime_unix_us == 1732944800000002
    assert records[2].line.count("\n") == 2  # a multi-line kernel message is one journal entry
    assert records[3].line == "mlx5_core 0000:ab:00.0 mlx5_5: Port: 1 Link DOWN\ufffd"  # byte-array MESSAGE
    assert follower.bad_lines == 2  # the entry without MESSAGE and the "-- Logs begin" banner
    assert follower.returncode == 0


def test_journal_records_feed_the_parser(tmp_path):
    parser = KmsgParser()
    events = [e for r in journal_follower(tmp_path).records() for e in parser.feed(r.line)]
    assert [(e.kind.value, e.pci) for e in events] == [
        ("xid", "0000:91:00.0"),
        ("fallen_off_bus", "0000:b3:00.0"),
        ("ib_link", "0000:ab:00.0"),
    ]
    assert events[0].gpu_uuid == "GPU-b6c3b2be-c55b-d076-fa0e-d464e4c7e08b"


def test_journal_resumes_after_cursor(tmp_path):
    first = journal_follower(tmp_path)
    records = list(first.records())
    first.commit(records[1])
    again = journal_follower(tmp_path)
    assert again.build_command()[-1] == f"--after-cursor={records[1].cursor}"
    assert [r.cursor for r in again.records()] == [records[2].cursor, records[3].cursor]
    assert CursorFile(tmp_path / "journal.cursor").load() == {"source": "journal", "cursor": records[1].cursor}


def test_journal_stop_terminates_journalctl(tmp_path):
    follower = journal_follower(tmp_path, "--hang")
    stop = threading.Event()
    seen = []
    for record in follower.records(stop):
        seen.append(record)
        stop.set()  # first record handled; shut down while journalctl is still running
    assert len(seen) == 1
    assert follower.returncode is not None and follower.returncode != 0  # terminated, not finished


def test_cursor_file_tolerates_garbage(tmp_path):
    path = tmp_path / "cursor"
    path.write_text("{not json")
    assert CursorFile(path).load() == {}
    path.write_text("[1, 2]")
    assert CursorFile(path).load() == {}
    assert CursorFile(tmp_path / "missing").load() == {}
