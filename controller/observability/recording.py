"""Recording of a controller's inbound agent streams, for replay against policy changes.

Owns the recording file: the `Recorder` that the agent stream servicer and the remediation
service call at the ingest edge (``rasd-controller --record PATH``, ``rasd-sim --record PATH``),
and `read` that gives a recording back to the replayer (``rasd-sim --replay PATH``).

What is recorded, each with the controller clock at that moment and the stream it belongs to:

- every inbound ``AgentMessage`` (Hello, telemetry, health events, action results, heartbeats),
  with the node and the controller's session id of its stream, when it arrived;
- the end of every stream;
- every outbound ``Command`` sent on a stream (so the replayer knows when each recorded command
  went out and how long its result took);
- every action the repair ladder put in its outbox (``RecordedDecision``): the recorded run's
  decisions, the baseline a replay is compared against;
- SDC accusations made through the admin API (they enter the ladder like health events);
- the lost-node watch's verdicts (a node no replica has heard from: its NODE_LOST event);
- operators' quarantines and releases by hand, and automation paused or resumed (the lost-node
  watch's release of a node that came back is one of them). Not recorded: manual validation runs
  and RMA approvals (a replay cannot send the one, and the other changes no decision).

File format, version 1::

    offset 0   8 bytes   magic: the ASCII bytes RASDREC and one zero byte
    offset 8   varint    n = length of the header message
               n bytes   rasd.api.v1.RecordingHeader (format_version = 1, controller version,
                         started_unix_ns, the remediation policy as JSON of its [remediation]
                         TOML table, recorder name)
    then, until end of file, repeated:
               varint    n = length of the entry message
               n bytes   rasd.api.v1.RecordedEntry (at_unix_ns, node_id, session_id, one of
                         inbound | outbound_command | closed | decision | accusation | node_lost |
                         operator_action)

The varint is protobuf's base-128 varint (7 bits per byte, low group first, high bit = more),
so the file is a stream of length-delimited protobuf messages (what protobuf's
``writeDelimitedTo`` writes) behind an 8-byte magic. A reader refuses an unknown magic or a
``format_version`` it does not know; new fields may be added to the messages without a version
bump (protobuf ignores unknown fields). A recording cut short (controller killed mid-write) reads
up to its last whole entry and says where it was cut.

Writes are buffered and flushed about once a second and on close; a write error (disk full)
stops the recording, logs it once, and never disturbs the ingest. A file already at the path (a
controller that restarted with the same ``--record``) is moved aside to ``PATH.<its mtime>``, never
overwritten. Size: about 4 KB per node per second, almost all of it telemetry (the 30 s, 8-node demo
records 0.9 MB), so record hours, not weeks.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import pathlib
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, BinaryIO

import structlog

from rasd.api.v1 import agent_service_pb2 as agent_pb
from rasd.api.v1 import commands_pb2 as commands_pb
from rasd.api.v1 import recording_pb2 as recording_pb
from rasd.common import VERSION
from rasd.controller.core.remediation import actions
from rasd.controller.core.remediation import policy as policy_mod

log = structlog.get_logger("rasd.controller")

MAGIC = b"RASDREC\x00"
FORMAT_VERSION = 1
MAX_RECORD_BYTES = 64 * 1024 * 1024
"""Largest header or entry a reader accepts (the gRPC limit is 16 MiB; anything bigger is corruption)."""


class RecordingError(ValueError):
    """A recording file is not one, or is of a version this reader does not know."""


def policy_to_mapping(policy: policy_mod.RemediationPolicy) -> dict[str, Any]:
    """The policy as its `[remediation]` TOML table (what `RemediationPolicy.from_mapping` reads back)."""

    def plain(value: Any) -> Any:
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
        if isinstance(value, Mapping):
            # TOML table keys are strings ("79" names Xid 79); from_mapping converts them back.
            return {str(k): plain(v) for k, v in value.items()}
        if isinstance(value, tuple | list):
            return [plain(v) for v in value]
        return value

    return plain(policy)


def policy_from_json(text: str) -> policy_mod.RemediationPolicy:
    """Rebuild the policy a header carries (the same loader as controller.toml's `[remediation]`)."""
    if not text:
        return policy_mod.RemediationPolicy()
    return policy_mod.RemediationPolicy.from_mapping(json.loads(text), prefix="remediation.")


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _read_varint(stream: BinaryIO) -> int | None:
    """The next varint; None at a clean end of file. Raises EOFError when cut inside one."""
    shift = 0
    value = 0
    first = True
    while True:
        raw = stream.read(1)
        if not raw:
            if first:
                return None
            raise EOFError("file ends inside a length prefix")
        first = False
        value |= (raw[0] & 0x7F) << shift
        if not raw[0] & 0x80:
            return value
        shift += 7
        if shift > 63:
            raise RecordingError("length prefix longer than 9 bytes: not a recording, or corrupt")


class Recorder:
    """Appends one controller's inbound streams, outbound commands and decisions to a recording file."""

    def __init__(
        self,
        path: pathlib.Path,
        *,
        policy: policy_mod.RemediationPolicy,
        recorder: str = "rasd-controller",
        clock: Callable[[], int] = time.time_ns,
        flush_interval_s: float = 1.0,
    ) -> None:
        """Create the file (moving an existing one aside) and write its header.

        Raises:
            OSError: the file cannot be created.
        """
        self.path = path
        if path.exists() and path.is_file():
            aside = path.with_name(f"{path.name}.{int(path.stat().st_mtime)}")
            path.rename(aside)
            log.warning("recording_moved_aside", path=str(path), to=str(aside))
        self._clock = clock
        self._flush_interval_ns = int(flush_interval_s * 1e9)
        self._file: io.BufferedWriter | None = open(path, "wb", buffering=1 << 20)  # noqa: SIM115 (closed in close())
        self.started_unix_ns = clock()
        self.entries = 0
        header = recording_pb.RecordingHeader(
            format_version=FORMAT_VERSION,
            controller_version=VERSION,
            started_unix_ns=self.started_unix_ns,
            remediation_policy_json=json.dumps(policy_to_mapping(policy), sort_keys=True),
            recorder=recorder,
        )
        self._write_bytes(MAGIC)
        self._write_message(header)
        self._last_flush_ns = self.started_unix_ns
        log.info("recording_started", path=str(path), recorder=recorder)

    # -- what the edges call -------------------------------------------------------------------
    def inbound(self, session_id: str, node_id: str, message: agent_pb.AgentMessage) -> None:
        """An AgentMessage arrived on a stream."""
        self._entry(recording_pb.RecordedEntry(node_id=node_id, session_id=session_id, inbound=message))

    def outbound_command(self, session_id: str, node_id: str, command: commands_pb.Command) -> None:
        """A Command was written to a stream."""
        self._entry(recording_pb.RecordedEntry(node_id=node_id, session_id=session_id, outbound_command=command))

    def closed(self, session_id: str, node_id: str) -> None:
        """A stream ended."""
        self._entry(
            recording_pb.RecordedEntry(
                node_id=node_id, session_id=session_id, closed=recording_pb.RecordedStreamClosed()
            )
        )

    def decisions(self, decided: Iterable[actions.Action], at_unix_ns: int) -> None:
        """Actions the ladder put in its outbox, decided at controller time at_unix_ns."""
        for action in decided:
            self._entry(
                recording_pb.RecordedEntry(node_id=action.node_id, decision=decision_message(action)),
                at_unix_ns=at_unix_ns,
            )

    def accusation(self, node_id: str, gpu_uuid: str, *, reason: str, accuser: str, at_unix_ns: int) -> None:
        """An SDC accusation entered the ladder."""
        self._entry(
            recording_pb.RecordedEntry(
                node_id=node_id,
                accusation=recording_pb.RecordedAccusation(gpu_uuid=gpu_uuid, reason=reason, accuser=accuser),
            ),
            at_unix_ns=at_unix_ns,
        )

    def node_lost(self, node_id: str, *, message: str, last_seen_unix_ns: int, at_unix_ns: int) -> None:
        """The lost-node watch's NODE_LOST event entered the ladder."""
        self._entry(
            recording_pb.RecordedEntry(
                node_id=node_id,
                node_lost=recording_pb.RecordedNodeLost(message=message, last_seen_unix_ns=last_seen_unix_ns),
            ),
            at_unix_ns=at_unix_ns,
        )

    def operator_action(
        self, node_id: str, gpu_uuid: str, *, action: str, reason: str, actor: str, force: bool, at_unix_ns: int
    ) -> None:
        """An operator's quarantine, release, pause or resume was taken (see `RecordedOperatorAction`)."""
        self._entry(
            recording_pb.RecordedEntry(
                node_id=node_id,
                operator_action=recording_pb.RecordedOperatorAction(
                    action=action, gpu_uuid=gpu_uuid, reason=reason, actor=actor, force=force
                ),
            ),
            at_unix_ns=at_unix_ns,
        )

    def close(self) -> None:
        """Flush and close the file (idempotent)."""
        if self._file is None:
            return
        try:
            self._file.close()
        except OSError as exc:
            log.error("recording_failed", path=str(self.path), error=str(exc))
        self._file = None
        log.info("recording_closed", path=str(self.path), entries=self.entries)

    # -- writing -------------------------------------------------------------------------------
    def _entry(self, entry: recording_pb.RecordedEntry, *, at_unix_ns: int | None = None) -> None:
        if self._file is None:
            return
        now = self._clock()
        entry.at_unix_ns = now if at_unix_ns is None else at_unix_ns
        self._write_message(entry)
        self.entries += 1
        if now - self._last_flush_ns >= self._flush_interval_ns:
            self._last_flush_ns = now
            self._guarded(self._file.flush)

    def _write_message(self, message: Any) -> None:
        data = message.SerializeToString()
        self._write_bytes(_varint(len(data)) + data)

    def _write_bytes(self, data: bytes) -> None:
        if self._file is not None:
            self._guarded(self._file.write, data)

    def _guarded(self, fn: Callable[..., Any], *args: Any) -> None:
        try:
            fn(*args)
        except OSError as exc:
            # Losing the recording must never cost the fleet its controller.
            log.error("recording_failed", path=str(self.path), error=str(exc), entries=self.entries)
            file, self._file = self._file, None
            if file is not None:
                with contextlib.suppress(OSError):
                    file.close()


def decision_message(action: actions.Action) -> recording_pb.RecordedDecision:
    """The recorded form of one outbox action."""
    return recording_pb.RecordedDecision(
        command_id=action.command_id,
        ticket_id=action.ticket_id,
        step=action.step,
        kind=action.kind,
        gpu_uuid=getattr(action, "gpu_uuid", ""),
        reason=action.reason,
        action_json=json.dumps(action.to_dict(), sort_keys=True, default=list),
    )


@dataclasses.dataclass
class Recording:
    """A recording read back: its header and its entries in file order."""

    path: pathlib.Path
    header: recording_pb.RecordingHeader
    entries: list[recording_pb.RecordedEntry]
    truncated_at: int | None = None
    """Byte offset where a cut-short file ends inside an entry (None: the file ends cleanly)."""

    @property
    def policy(self) -> policy_mod.RemediationPolicy:
        """The remediation policy the recorded controller ran."""
        return policy_from_json(self.header.remediation_policy_json)

    @property
    def ended_unix_ns(self) -> int:
        """Controller time of the last entry (the header's start when there is none)."""
        return max((e.at_unix_ns for e in self.entries), default=self.header.started_unix_ns)


def read(path: pathlib.Path) -> Recording:
    """Read a whole recording.

    Raises:
        OSError: the file cannot be read.
        RecordingError: not a recording (bad magic), an unknown format version, or a corrupt
            header or entry; the message says which and where.
    """
    with open(path, "rb") as stream:
        header = _read_header(stream, path)
        entries, truncated_at = [], None
        for item in _iter_entries(stream, path):
            if isinstance(item, int):
                truncated_at = item
                break
            entries.append(item)
    if truncated_at is not None:
        log.warning("recording_truncated", path=str(path), at_byte=truncated_at, entries=len(entries))
    return Recording(path=path, header=header, entries=entries, truncated_at=truncated_at)


def _read_header(stream: BinaryIO, path: pathlib.Path) -> recording_pb.RecordingHeader:
    magic = stream.read(len(MAGIC))
    if magic != MAGIC:
        raise RecordingError(f"{path}: not a rasd recording (magic {magic!r}, expected {MAGIC!r})")
    try:
        size = _read_varint(stream)
    except EOFError:
        size = None
    if size is None or size > MAX_RECORD_BYTES:
        raise RecordingError(f"{path}: header missing or corrupt (length {size!r})")
    data = stream.read(size)
    header = recording_pb.RecordingHeader()
    try:
        if len(data) != size:
            raise EOFError
        header.ParseFromString(data)
    except Exception as exc:
        raise RecordingError(f"{path}: header is corrupt ({type(exc).__name__})") from None
    if header.format_version != FORMAT_VERSION:
        raise RecordingError(
            f"{path}: format_version {header.format_version} is not supported (this reader knows {FORMAT_VERSION})"
        )
    return header


def _iter_entries(stream: BinaryIO, path: pathlib.Path) -> Iterator[recording_pb.RecordedEntry | int]:
    """Entries in order; yields the byte offset (an int) and stops where a cut-short file ends."""
    while True:
        offset = stream.tell()
        try:
            size = _read_varint(stream)
        except EOFError:
            yield offset
            return
        if size is None:
            return
        if size > MAX_RECORD_BYTES:
            raise RecordingError(f"{path}: entry at byte {offset} claims {size} bytes: corrupt")
        data = stream.read(size)
        if len(data) != size:
            yield offset
            return
        entry = recording_pb.RecordedEntry()
        try:
            entry.ParseFromString(data)
        except Exception as exc:
            raise RecordingError(f"{path}: entry at byte {offset} is corrupt ({type(exc).__name__})") from None
        yield entry
