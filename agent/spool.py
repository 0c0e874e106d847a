"""The agent's durable spool: health events until the controller acks them, and executed commands.

Invariant 3 of DESIGN.md: an event the agent has seen stays on disk until the controller has
acknowledged it, across disconnects and agent restarts. Invariant 2: a command id the agent has
executed is remembered with its result, so a repeated command is answered, not re-run; and a
command that cannot safely run twice is remembered as started before it runs, so one the agent did
not live to finish is answered as interrupted, not started again.

Backed by SQLite (stdlib `sqlite3`) in WAL mode under the agent's state directory, with
`synchronous=FULL` so an acknowledged append survives power loss. Sequence numbers come from
SQLite's AUTOINCREMENT, so they never go backwards, even after every row was acked and deleted.
`:memory:` gives a spool that lives as long as the process (rasd-sim's many in-process agents).
"""

from __future__ import annotations

import json
import math
import sqlite3
import threading
import time
import uuid
from collections.abc import Sequence

from rasd.agent.core import model
from rasd.common import kernel_log
from rasd.common.kernel_log import KernelEvent

_SCHEMA = """
CREATE TABLE IF NOT EXISTS events (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    payload TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS source_cursors (source TEXT PRIMARY KEY, cursor TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS executed_commands (
    command_id TEXT PRIMARY KEY,
    result TEXT NOT NULL,
    finished_unix_ns INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS started_commands (
    command_id TEXT PRIMARY KEY,
    action TEXT NOT NULL,
    started_unix_ns INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS power_caps (
    gpu_uuid TEXT PRIMARY KEY,
    limit_w INTEGER NOT NULL,
    set_unix_ns INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS spool_identity (spool_id TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS pending_reboot (
    boot_id TEXT PRIMARY KEY,
    monotonic_s REAL NOT NULL
);
"""


EXECUTED_RETENTION_S = 2 * 24 * 3600
"""How long a command's result (and a started mark) is kept to answer a resend of its id.

The controller resends a command only while its ladder still waits for it: hours at most (an hour
for a validation, half an hour for a reboot); a power command lives seconds and is never resent.
With a cap command every control period (3 s) a node journals ~29,000 a day: kept for ever, the
spool grew by ~10 MB a day."""

PRUNE_EVERY_S = 3600.0
"""How often recording a result also drops the results older than `EXECUTED_RETENTION_S`."""


def _observation_to_json(obs: model.Observation) -> str:
    return json.dumps(
        {
            "kind": int(obs.kind),
            "observed_unix_ns": obs.observed_unix_ns,
            "message": obs.message,
            "source": obs.source,
            "gpu_uuid": obs.gpu_uuid,
            "xid": obs.xid,
            "severity": int(obs.severity),
            "attributes": dict(obs.attributes),
            "kernel_log": kernel_log.to_attributes(obs.kernel_log) if obs.kernel_log is not None else None,
        },
        separators=(",", ":"),
    )


def _observation_from_json(text: str) -> model.Observation:
    data = json.loads(text)
    return model.Observation(
        kind=model.EventKind(data["kind"]),
        observed_unix_ns=data["observed_unix_ns"],
        message=data["message"],
        source=data["source"],
        gpu_uuid=data["gpu_uuid"],
        xid=data["xid"],
        severity=model.Severity(data["severity"]),
        attributes=data["attributes"],
        kernel_log=_kernel_log_from_json(data),
    )


def _kernel_log_from_json(data: dict) -> KernelEvent | None:
    # Rows spooled by agents before the typed facts have none: their facts are in the attributes.
    facts = data.get("kernel_log")
    if not facts:
        return None
    return kernel_log.from_attributes(facts, message=data["message"], xid=data["xid"], gpu_uuid=data["gpu_uuid"])


def _result_to_json(result: model.ActionResult) -> str:
    return json.dumps(
        {
            "command_id": result.command_id,
            "outcome": int(result.outcome),
            "message": result.message,
            "started_unix_ns": result.started_unix_ns,
            "finished_unix_ns": result.finished_unix_ns,
            "enforced_limits_w": dict(result.enforced_limits_w),
            "slew_targets_w": dict(result.slew_targets_w),
            "validation_verdict": result.validation_verdict,
            "check_verdicts": [list(v) for v in result.check_verdicts],
        },
        separators=(",", ":"),
    )


def _result_from_json(text: str) -> model.ActionResult:
    data = json.loads(text)
    return model.ActionResult(
        command_id=data["command_id"],
        outcome=model.ActionOutcome(data["outcome"]),
        message=data["message"],
        started_unix_ns=data["started_unix_ns"],
        finished_unix_ns=data["finished_unix_ns"],
        enforced_limits_w=data["enforced_limits_w"],
        slew_targets_w=data.get("slew_targets_w", {}),
        validation_verdict=data.get("validation_verdict", ""),
        check_verdicts=tuple(tuple(v) for v in data.get("check_verdicts", [])),  # type: ignore[misc]
    )


class Spool:
    """Durable event spool and executed-command journal for one agent."""

    def __init__(self, path: str) -> None:
        """Open (or create) the spool at path; ":memory:" for a process-lifetime spool."""
        # The agent calls the spool from its event loop and from worker threads (command
        # execution), so one connection is shared under a lock rather than per thread.
        self._lock = threading.Lock()
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        if path != ":memory:":
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")
        self._db.executescript(_SCHEMA)
        self._pruned_monotonic = -math.inf  # the first result recorded prunes
        row = self._db.execute("SELECT spool_id FROM spool_identity").fetchone()
        if row is None:
            self._db.execute("INSERT INTO spool_identity (spool_id) VALUES (?)", (uuid.uuid4().hex,))
            row = self._db.execute("SELECT spool_id FROM spool_identity").fetchone()
        self.spool_id: str = str(row[0])
        """Made with the spool file and kept with it: a wiped or new spool has another (Hello.spool_id).

        The controller starts a new epoch of this node's seqs when it changes; by the head seq alone,
        a new spool that already held more events than the old one had acked was welcomed with the
        old acked position, and `ack` deleted its new events up to it unsent."""

    def append(
        self, observations: Sequence[model.Observation], *, source_cursor: tuple[str, str] | None = None
    ) -> list[model.SpooledEvent]:
        """Durably store observations and return them with their new sequence numbers.

        Args:
            observations: what was seen, in order.
            source_cursor: (source name, position) of the log record these observations came from,
                saved in the same transaction, so a restarted agent resumes exactly after the last
                record whose events are on disk: nothing read twice, nothing skipped.
        """
        spooled = []
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                for obs in observations:
                    cursor = self._db.execute("INSERT INTO events (payload) VALUES (?)", (_observation_to_json(obs),))
                    spooled.append(model.SpooledEvent(int(cursor.lastrowid or 0), obs))
                if source_cursor is not None:
                    self._db.execute(
                        "INSERT INTO source_cursors (source, cursor) VALUES (?, ?) "
                        "ON CONFLICT(source) DO UPDATE SET cursor = excluded.cursor",
                        source_cursor,
                    )
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
        return spooled

    def unacked(self, limit: int = 1000, *, after_seq: int = 0) -> list[model.SpooledEvent]:
        """Up to limit events not yet acked, oldest first; only those above after_seq when given.

        after_seq pages through a spool larger than one read: pass the last seq of the previous page.
        """
        with self._lock:
            rows = self._db.execute(
                "SELECT seq, payload FROM events WHERE seq > ? ORDER BY seq LIMIT ?",
                (max(after_seq, self._acked_seq_locked()), limit),
            ).fetchall()
        return [model.SpooledEvent(seq, _observation_from_json(payload)) for seq, payload in rows]

    def ack(self, acked_seq: int) -> int:
        """Drop every event with seq <= acked_seq; returns how many were dropped.

        Acks are cumulative and may arrive late or twice: an ack below the current position is a
        no-op, so a stale ack can never resurrect or drop the wrong events.
        """
        with self._lock:
            if acked_seq <= self._acked_seq_locked():
                return 0
            self._db.execute("BEGIN IMMEDIATE")
            cursor = self._db.execute("DELETE FROM events WHERE seq <= ?", (acked_seq,))
            self._db.execute(
                "INSERT INTO meta (key, value) VALUES ('acked_seq', ?) "
                "ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                (acked_seq,),
            )
            self._db.execute("COMMIT")
            return cursor.rowcount

    def acked_seq(self) -> int:
        """Highest seq the controller has acknowledged."""
        with self._lock:
            return self._acked_seq_locked()

    def head_seq(self) -> int:
        """Highest seq ever assigned (0 before the first event)."""
        with self._lock:
            row = self._db.execute("SELECT seq FROM sqlite_sequence WHERE name = 'events'").fetchone()
        return int(row[0]) if row else 0

    def depth(self) -> int:
        """Number of events waiting for an ack."""
        with self._lock:
            (count,) = self._db.execute(
                "SELECT COUNT(*) FROM events WHERE seq > ?", (self._acked_seq_locked(),)
            ).fetchone()
        return int(count)

    def source_cursor(self, source: str) -> str | None:
        """The position saved with the last events from source, if any."""
        with self._lock:
            row = self._db.execute("SELECT cursor FROM source_cursors WHERE source = ?", (source,)).fetchone()
        return row[0] if row else None

    def executed_result(self, command_id: str) -> model.ActionResult | None:
        """The stored result of a command this agent already executed, if any."""
        with self._lock:
            row = self._db.execute(
                "SELECT result FROM executed_commands WHERE command_id = ?", (command_id,)
            ).fetchone()
        return _result_from_json(row[0]) if row else None

    def record_result(self, result: model.ActionResult, *, correct: bool = False) -> None:
        """Remember a command's result so that a repeat of its id is answered, not re-run.

        The first result of an id stays, unless correct: a reboot is journaled as started before it
        runs (the agent will not live to write it afterwards), and a reboot that then fails must be
        answered as failed on a replay too. The command's started mark (`record_started`) goes in the
        same transaction.
        """
        verb = "INSERT OR REPLACE" if correct else "INSERT OR IGNORE"
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                self._db.execute(
                    f"{verb} INTO executed_commands (command_id, result, finished_unix_ns) VALUES (?, ?, ?)",
                    (result.command_id, _result_to_json(result), result.finished_unix_ns),
                )
                self._db.execute("DELETE FROM started_commands WHERE command_id = ?", (result.command_id,))
                if time.monotonic() - self._pruned_monotonic >= PRUNE_EVERY_S:
                    self._pruned_monotonic = time.monotonic()
                    # On the agent's clock, as the rows' own times are.
                    before_ns = result.finished_unix_ns - int(EXECUTED_RETENTION_S * 1e9)
                    self._db.execute("DELETE FROM executed_commands WHERE finished_unix_ns < ?", (before_ns,))
                    self._db.execute("DELETE FROM started_commands WHERE started_unix_ns < ?", (before_ns,))
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise

    def record_started(self, command_id: str, action: str, started_unix_ns: int) -> None:
        """Durably mark a command as started, before an action that must not run twice begins.

        If the agent dies before the result is recorded (killed, out of memory, power lost), the
        mark says so after the restart: `started_command` finds it and the resend is answered as
        interrupted instead of resetting a GPU again or signalling the job rescheduled meanwhile.
        """
        with self._lock:
            self._db.execute(
                "INSERT OR IGNORE INTO started_commands (command_id, action, started_unix_ns) VALUES (?, ?, ?)",
                (command_id, action, started_unix_ns),
            )

    def started_command(self, command_id: str) -> tuple[str, int] | None:
        """(what it was, when it started) of a command marked started and never finished, if any."""
        with self._lock:
            row = self._db.execute(
                "SELECT action, started_unix_ns FROM started_commands WHERE command_id = ?", (command_id,)
            ).fetchone()
        return (str(row[0]), int(row[1])) if row else None

    def record_reboot_pending(self, boot_id: str, monotonic_s: float | None) -> None:
        """Durably note that this boot (boot_id) was told to reboot at monotonic_s; None clears it.

        A reboot command returns once the shutdown is queued; an agent restarted in the same boot
        (systemd restarting a crashed agent before the shutdown reaches it) must still hold what
        comes after it for the next boot. CLOCK_MONOTONIC counts from the boot, so the time is
        comparable across the agent's processes of one boot, and a new boot's id never matches.
        """
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                self._db.execute("DELETE FROM pending_reboot")
                if monotonic_s is not None:
                    self._db.execute(
                        "INSERT INTO pending_reboot (boot_id, monotonic_s) VALUES (?, ?)", (boot_id, monotonic_s)
                    )
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise

    def reboot_pending(self, boot_id: str) -> float | None:
        """When (CLOCK_MONOTONIC s) boot boot_id was told to reboot, if it was (`record_reboot_pending`)."""
        with self._lock:
            row = self._db.execute("SELECT monotonic_s FROM pending_reboot WHERE boot_id = ?", (boot_id,)).fetchone()
        return float(row[0]) if row else None

    def record_power_caps(self, limits_w: dict[str, int], set_unix_ns: int) -> None:
        """Remember the caps the controller last had enforced, to put back after a reboot or reset.

        A reboot or GPU reset returns a GPU to its default limit; the controller counts the GPU
        at the cap it confirmed, so the agent restores that cap before anything else runs.
        """
        if not limits_w:
            return
        with self._lock:
            self._db.executemany(
                "INSERT INTO power_caps (gpu_uuid, limit_w, set_unix_ns) VALUES (?, ?, ?) "
                "ON CONFLICT (gpu_uuid) DO UPDATE SET limit_w = excluded.limit_w, set_unix_ns = excluded.set_unix_ns",
                [(gpu_uuid, int(watts), set_unix_ns) for gpu_uuid, watts in limits_w.items()],
            )

    def power_caps(self) -> dict[str, int]:
        """The caps recorded by `record_power_caps`, per GPU."""
        with self._lock:
            return {row[0]: int(row[1]) for row in self._db.execute("SELECT gpu_uuid, limit_w FROM power_caps")}

    def close(self) -> None:
        """Close the database."""
        with self._lock:
            self._db.close()

    def _acked_seq_locked(self) -> int:
        row = self._db.execute("SELECT value FROM meta WHERE key = 'acked_seq'").fetchone()
        return int(row[0]) if row else 0
