"""Kernel log followers: /dev/kmsg and ``journalctl -k -f -o json``, each with a persistent cursor.

They own the I/O; the parsing is ``rasd.agent.core.kmsg``. Both yield ``KernelLogRecord`` values whose
``line`` goes to ``KmsgParser.feed``. The caller calls ``commit(record)`` once the record's events are
safely spooled; the cursor file then makes a restarted agent continue after that record, so no
kernel event is lost or reported twice across agent restarts (DESIGN.md invariant 3).

* ``KmsgFollower`` reads a /dev/kmsg-style device, FIFO or file (the path is configurable, so tests
  use fixtures). Each record is ``prio,seq,usec,flags;message`` plus dictionary lines that start
  with a space. The cursor is the last committed ``seq`` together with the boot id, because the
  sequence restarts at 0 on every boot. A regular file's lines without a kmsg header (plain text,
  such as a saved dmesg) have no seq: their cursor is the file's inode and the byte offset after
  the line, so that a reopen (every ``reopen_s``) or a restart reads on from there instead of
  spooling the whole file again.
* ``JournalFollower`` runs a journalctl command (configurable) and reads its JSON lines (MESSAGE,
  __CURSOR, __REALTIME_TIMESTAMP). It resumes with ``--after-cursor``; with no cursor yet it reads
  the whole current boot (``--lines=all``) so faults from before the agent started are seen.

A regular file or a FIFO whose writer closed ends the iteration at end of file; /dev/kmsg and a
running journalctl never do, so ``records`` returns only when ``stop`` is set (checked every
``poll_s``) or the source goes away. A regular file's unterminated last line may be a record its
writer is still writing, so ``KmsgFollower`` holds it back until a later pass proves it complete
(see ``KmsgFollower.records``); /dev/kmsg returns whole records, and a FIFO's data cannot be read
twice, so they yield it at end of file.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import re
import select
import stat
import subprocess
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

DEFAULT_KMSG_PATH = "/dev/kmsg"
DEFAULT_BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"
DEFAULT_JOURNAL_COMMAND = ("journalctl", "-k", "-f", "-o", "json")

# One /dev/kmsg read returns exactly one record and fails with EINVAL if the buffer is too small;
# records are at most about 1 KiB of text plus the dictionary.
_READ_SIZE = 16384
_KMSG_HEADER = re.compile(rb"^(?P<prio>[0-9]{1,4}),(?P<seq>[0-9]{1,20}),(?P<usec>[0-9]{1,20}),[^;]*;")


@dataclasses.dataclass(frozen=True)
class KernelLogRecord:
    """One kernel log record as read, before parsing."""

    line: str  # what to feed the parser (kmsg: the whole record line; journal: MESSAGE)
    cursor: str
    """Position to commit: the kmsg sequence number, ``text:<inode>:<offset>`` for a line without a kmsg
    header in a regular file (the byte offset after it), or the journal cursor; "" for none."""
    realtime_unix_us: int | None = None  # wall-clock time of the record, when the source says


class CursorFile:
    """A small JSON file holding a follower's position, replaced atomically on every save."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)

    def load(self) -> dict[str, str]:
        """The saved position, or {} when there is none or it is unreadable."""
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        if not isinstance(data, dict):
            return {}
        return {str(k): str(v) for k, v in data.items()}

    def save(self, data: dict[str, str]) -> None:
        """Write ``data`` durably: temp file, fsync, rename, so a crash leaves the old or the new one."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        with tmp.open("w", encoding="utf-8") as f:
            json.dump(data, f, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)


def _read_lines(
    fd: int,
    stop: threading.Event | None,
    poll_s: float,
    counters: dict[str, int],
    *,
    release_tail: Callable[[bytes], bool] | None = None,
) -> Iterator[bytes]:
    """Yield complete lines from the non-blocking ``fd`` until EOF or ``stop``.

    A partial last line is yielded at EOF, unless ``release_tail`` is given and says False for it.
    The read comes first and select() only waits after EAGAIN: a FIFO whose writer left before we
    opened it never polls as hung up, but its read returns end of file at once.
    """
    pending = b""
    while stop is None or not stop.is_set():
        try:
            chunk = os.read(fd, _READ_SIZE)
        except BlockingIOError:
            select.select([fd], [], [], poll_s)  # /dev/kmsg or a live pipe with nothing new yet
            continue
        except OSError as e:
            if e.errno != errno.EPIPE:
                raise
            # /dev/kmsg: the ring buffer overwrote records we had not read; the next read
            # continues with the oldest record still there.
            counters["overwritten"] += 1
            continue
        if not chunk:  # end of file, or the FIFO's writer closed
            if pending and (release_tail is None or release_tail(pending)):
                yield pending
            return
        pending += chunk
        *lines, pending = pending.split(b"\n")
        for line in lines:
            if stop is not None and stop.is_set():
                return  # unread lines are not lost: their cursor was never committed
            yield line


class KmsgFollower:
    """Follows /dev/kmsg (or a file/FIFO in the same format) from the committed cursor on.

    ``lost_records`` counts sequence numbers that were skipped (ring buffer overrun) and
    ``overwritten_reads`` the EPIPE answers that announce it.
    """

    def __init__(
        self,
        cursor_path: str | os.PathLike[str],
        *,
        path: str | os.PathLike[str] = DEFAULT_KMSG_PATH,
        boot_id_path: str | os.PathLike[str] = DEFAULT_BOOT_ID_PATH,
        poll_s: float = 1.0,
    ) -> None:
        self.path = Path(path)
        self.cursor = CursorFile(cursor_path)
        self.boot_id = _read_boot_id(Path(boot_id_path))
        self.poll_s = poll_s
        self.lost_records = 0
        self._counters = {"overwritten": 0}
        self._last_seq: int | None = None
        # (file size, unterminated last line) that the previous pass over a regular file held back.
        self._held_tail: tuple[int, bytes] | None = None

    @property
    def overwritten_reads(self) -> int:
        """How many reads failed with EPIPE because the kernel overwrote unread records."""
        return self._counters["overwritten"]

    def resume_after(self) -> int | None:
        """The last committed sequence number of this boot, or None to start from the oldest record."""
        saved = self.cursor.load()
        if saved.get("boot_id") != self.boot_id or not re.fullmatch(r"[0-9]{1,20}", saved.get("seq", "")):
            return None  # first start, or a reboot: every record in the buffer is new
        return int(saved["seq"])

    def records(self, stop: threading.Event | None = None) -> Iterator[KernelLogRecord]:
        """Yield records after the cursor, oldest first.

        Args:
            stop: set it to make the iteration end within ``poll_s``.

        Yields:
            One record per kmsg message; dictionary lines are dropped. Lines without a kmsg header
            (plain text) are yielded with a ``text:`` cursor in a regular file (the reading
            resumes after the last one committed, while the file is the same inode and not
            shorter), with none in a FIFO.

        A regular file's last line without a newline may be a record its writer has only half
        written. Yielding it would get its seq committed, and the complete line would then be
        skipped as already handled (the event lost, or spooled with the half's fields). So it is held
        back, cursor unmoved, until it is terminated, or until the next pass finds the file at the
        same size ending in the same tail: the writer finished it without a newline. The pump calls
        ``records`` again every ``reopen_s`` (``KernelLogPump.run``), so such a record arrives one pass late.
        """
        after = self.resume_after()
        # Only the pass just before can vouch for a tail; one that ended on a newline or at stop forgets it.
        held, self._held_tail = self._held_tail, None
        fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)

        def release_tail(tail: bytes) -> bool:
            self._held_tail = (os.fstat(fd).st_size, tail)
            return self._held_tail == held

        try:
            info = os.fstat(fd)
            is_file = stat.S_ISREG(info.st_mode)
            offset = self._text_resume_offset(info) if is_file else 0
            if offset:
                os.lseek(fd, offset, os.SEEK_SET)
            lines = _read_lines(fd, stop, self.poll_s, self._counters, release_tail=release_tail if is_file else None)
            for raw in lines:
                offset += len(raw) + 1  # its newline too (the one at the end of a released tail is not there)
                if not raw or raw[:1] in (b" ", b"\t"):
                    continue  # dictionary line (" SUBSYSTEM=pci") or blank
                line = raw.decode("utf-8", errors="replace")
                m = _KMSG_HEADER.match(raw)
                if m is None:
                    cursor = f"text:{info.st_ino}:{min(offset, os.fstat(fd).st_size)}" if is_file else ""
                    yield KernelLogRecord(line=line, cursor=cursor)
                    continue
                seq = int(m["seq"])
                if after is not None and seq <= after:
                    continue
                if self._last_seq is not None and seq > self._last_seq + 1:
                    self.lost_records += seq - self._last_seq - 1
                self._last_seq = seq
                yield KernelLogRecord(line=line, cursor=str(seq))
        finally:
            os.close(fd)

    def _text_resume_offset(self, info: os.stat_result) -> int:
        """Where a regular file's plain-text lines resume: after the last committed, if it is the same file."""
        saved = self.cursor.load()
        inode, offset = saved.get("text_inode", ""), saved.get("text_offset", "")
        if inode != str(info.st_ino) or not offset.isdigit() or int(offset) > info.st_size:
            return 0  # none yet, another file (rotated), or cut shorter (truncated): from the start
        return int(offset)

    def position(self, record: KernelLogRecord) -> dict[str, str]:
        """The cursor fields that committing ``record`` sets (merged into those saved)."""
        if record.cursor.startswith("text:"):
            _, inode, offset = record.cursor.split(":")
            return {"source": "kmsg", "text_inode": inode, "text_offset": offset}
        return {"source": "kmsg", "boot_id": self.boot_id, "seq": record.cursor}

    def commit(self, record: KernelLogRecord) -> None:
        """Persist ``record`` as handled; a restart resumes after it. Records without a cursor are ignored."""
        if record.cursor:
            self.cursor.save({**self.cursor.load(), **self.position(record)})


def _read_boot_id(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8").strip()
    except OSError:
        return ""  # no boot id: a cursor is still used within one agent run, and after restarts


class JournalFollower:
    """Follows ``journalctl -k -f -o json`` (the command is configurable) from the committed cursor on.

    ``bad_lines`` counts output lines that were not journal JSON.
    """

    def __init__(
        self,
        cursor_path: str | os.PathLike[str],
        *,
        command: Sequence[str] = DEFAULT_JOURNAL_COMMAND,
        poll_s: float = 1.0,
    ) -> None:
        self.command = tuple(command)
        self.cursor = CursorFile(cursor_path)
        self.poll_s = poll_s
        self.bad_lines = 0
        self.returncode: int | None = None

    def build_command(self) -> list[str]:
        """The command line to run: resume after the saved cursor, or read this boot from its start."""
        saved = self.cursor.load().get("cursor")
        if saved:
            return [*self.command, f"--after-cursor={saved}"]
        return [*self.command, "--lines=all"]

    def records(self, stop: threading.Event | None = None) -> Iterator[KernelLogRecord]:
        """Run journalctl and yield one record per journal entry until it exits or ``stop`` is set.

        Args:
            stop: set it to end the iteration (journalctl is terminated) within ``poll_s``.

        Yields:
            Records whose ``line`` is the entry's MESSAGE (possibly several lines).
        """
        # The command comes from the agent config (an operator), never from log input.
        proc = subprocess.Popen(
            self.build_command(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
        )
        assert proc.stdout is not None
        os.set_blocking(proc.stdout.fileno(), False)  # so that stop is checked while journalctl is quiet
        counters = {"overwritten": 0}
        try:
            for raw in _read_lines(proc.stdout.fileno(), stop, self.poll_s, counters):
                record = self._parse(raw)
                if record is not None:
                    yield record
        finally:
            if proc.poll() is None:
                proc.terminate()
            try:
                self.returncode = proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                self.returncode = proc.wait()
            proc.stdout.close()

    def _parse(self, raw: bytes) -> KernelLogRecord | None:
        if not raw.strip():
            return None
        try:
            entry = json.loads(raw)
        except ValueError:
            self.bad_lines += 1
            return None
        if not isinstance(entry, dict):
            self.bad_lines += 1
            return None
        message = entry.get("MESSAGE")
        if isinstance(message, list):
            # journald's JSON encodes a MESSAGE that is not valid UTF-8 as an array of byte values.
            try:
                message = bytes(message).decode("utf-8", errors="replace")
            except (TypeError, ValueError):
                message = None
        if not isinstance(message, str):
            self.bad_lines += 1
            return None
        realtime = entry.get("__REALTIME_TIMESTAMP")
        return KernelLogRecord(
            line=message,
            cursor=str(entry.get("__CURSOR", "")),
            realtime_unix_us=(
                int(realtime) if isinstance(realtime, str) and re.fullmatch(r"[0-9]{1,20}", realtime) else None
            ),
        )

    def commit(self, record: KernelLogRecord) -> None:
        """Persist ``record`` as handled; the next run passes ``--after-cursor`` with its cursor."""
        if record.cursor:
            self.cursor.save({"source": "journal", "cursor": record.cursor})
