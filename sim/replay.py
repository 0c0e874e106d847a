"""Replay of a controller recording against a (changed) remediation policy, and the diff report.

``rasd-sim --replay PATH [--policy FILE]`` feeds a recording (controller/observability/recording.py) into a fresh
controller: a new SQLite store in a scratch directory, the real `Ingest` and `RemediationService`,
no gRPC and no executors, and a fake clock that the recorded arrival times drive, so every
decision is a deterministic function of the recording and the policy. It then compares every
decision (an action the repair ladder put in its outbox) with the recorded run's decisions, which
the recording carries, and reports each one that differs.

How inputs are fed, in recorded order:

- Hello, telemetry, health events, heartbeats and stream ends go to the ingest of the fresh
  controller exactly as the stream servicer hands them over (events are stored, acked and decided);
- SDC accusations go to ``RemediationService.accuse``, and the lost-node watch's verdicts (NODE_LOST) to
  ``LostNodeWatch.take_recorded``: the replay does not judge silence itself (the live watch reads
  last-seen times the replicas write in real time), so a changed ``[remediation.lost_nodes]`` table
  changes nothing here;
- operators' quarantines and releases by hand, pauses and resumes of automation (and the lost-node
  watch's release of a node that came back, which asks as an operator does) go to the service's
  operator commands, at their recorded time, whatever came of them in the recording: a release the
  replayed ladder refuses (no passing validation there) is listed as skipped;
- the ladder's periodic ``tick`` (timeouts, watch windows) runs every ``tick_interval_s`` of
  recorded time, as the live ticker does every 2 s;
- recorded action results are **not** fed as they stand: a result belongs to a command, and the
  replayed controller may issue other commands. Results follow these rules instead.

Command results during replay (the agent's side, made deterministic):

1. A command the replayed controller sends that the recorded controller also sent (same command
   id: ids derive from ticket, step and kind, so the same decision has the same id) gets the
   recorded result, delivered after the recorded dispatch-to-result delay.
2. A command that was sent in the recording but got no result there (still running when the
   recording ended, or lost) gets none in the replay either: the ladder's timeout handles it.
3. A command the recording never sent gets a **synthesized** result: SUCCEEDED, and for
   ``run_validation`` the verdict "pass" with no failed GPU, after the median recorded delay of
   commands of the same kind in this recording (or `DEFAULT_SYNTH_DELAY_S` when it has none).
   Every synthesized result is listed in the report, and every differing decision on a ticket
   that got one before it is flagged ``depends_on_synthesized``: the new policy's outcome there
   rests on an assumption, not on history.
4. Results due after the recording's last entry are not delivered (the recorded run never saw
   that far), nor are decisions after it compared.

Controller-side actions (quarantine, release, RMA, notify, BMC power cycle) run no adapter in a
replay and count as succeeded. What the recording cannot show is what the fleet would have done
differently under the new policy (a GPU that was never reset still reports what it reported):
the replay answers "what would the controller have decided on this history", not "what would
have happened".

Not recorded, so not replayed: manual validation runs (``rasctl validate``: a non-forced release
that rests on one is refused in the replay, and listed), RMA approvals (they change no decision) and
power commands.

Decisions are compared per repair ticket, in step order: the two action sequences are aligned
(difflib), and each differing position is one row: ``changed`` (recorded action → replayed
action), ``only_recorded`` or ``only_replayed``. Within a differing stretch a repair pairs with
a repair (restart → reset → reboot → power cycle → RMA) and a hold with a hold (quarantines), so
"restart_process became reset_gpu" reads as one changed decision. An action is the same when its
kind, GPU, IB port, validation suite and forced flag are.
"""

from __future__ import annotations

import dataclasses
import difflib
import heapq
import json
import pathlib
import statistics
import tempfile
import time
import tomllib
from collections.abc import Mapping, Sequence
from typing import Any, TextIO

from prometheus_client import CollectorRegistry

from rasd.api.v1 import agent_service_pb2 as agent_pb
from rasd.api.v1 import commands_pb2 as commands_pb
from rasd.api.v1 import recording_pb2 as recording_pb
from rasd.controller import wiring
from rasd.controller.core.remediation import actions
from rasd.controller.core.remediation import policy as policy_mod
from rasd.controller.ingest import service as ingest_mod
from rasd.controller.observability import metrics, recording
from rasd.controller.remediation import service as remediation_mod
from rasd.controller.store import repo
from rasd.controller.wire import agent as wire
from rasd.controller.wire import commands as wire_commands
from rasd.controller.wire import stream as wire_stream

DEFAULT_TICK_INTERVAL_S = 2.0
"""The live remediation ticker's period (RemediationService's default)."""
DEFAULT_SYNTH_DELAY_S = {"restart_process": 1.0, "reset_gpu": 2.0, "reboot_node": 10.0, "run_validation": 5.0}
"""Dispatch-to-result delay of a synthesized result when the recording has no command of that kind."""
_SIGNATURE_FIELDS = ("kind", "gpu_uuid", "ib_port", "suite", "forced")
_CATEGORIES = {
    "restart_process": "repair",
    "reset_gpu": "repair",
    "reboot_node": "repair",
    "power_cycle_bmc": "repair",
    "open_rma": "repair",
    "quarantine_gpu": "hold",
    "quarantine_node": "hold",
    "quarantine_port": "hold",
}
"""Which actions answer the same question, so a changed decision pairs them (restart → reset)."""


class PolicyFileError(ValueError):
    """A --policy file is unreadable or its [remediation] table is invalid; the message names the key."""


def load_policy_overrides(path: pathlib.Path) -> dict[str, Any]:
    """The `[remediation]` table of a TOML file (controller.toml or a scenario), checked by the policy loader.

    Raises:
        PolicyFileError: unreadable file, no `[remediation]` table, or a bad key or value (named).
    """
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise PolicyFileError(f"{path}: {exc}") from None
    table = data.get("remediation")
    if not isinstance(table, Mapping):
        raise PolicyFileError(f"{path}: no [remediation] table (the policy table of controller.toml or a scenario)")
    try:
        policy_mod.RemediationPolicy.from_mapping(table, prefix="remediation.")
    except policy_mod.PolicyError as exc:
        raise PolicyFileError(f"{path}: {exc}") from None
    return dict(table)


def overlay_policy(
    recorded: policy_mod.RemediationPolicy, overrides: Mapping[str, Any]
) -> policy_mod.RemediationPolicy:
    """The recorded policy with a `[remediation]` table laid over it: keys it names replace the recorded values.

    Example: recorded demo policy (disruption relaxed) + ``{"escalation": {"max_attempts_reset_gpu": 0}}``
    keeps the relaxed disruption budget and changes only the reset budget.
    """
    merged = recording.policy_to_mapping(recorded)
    for group, table in overrides.items():
        merged.setdefault(group, {})
        merged[group] = {**merged[group], **dict(table)}
    return policy_mod.RemediationPolicy.from_mapping(merged, prefix="remediation.")


@dataclasses.dataclass(frozen=True)
class DecisionRecord:
    """One action a ladder put in its outbox (recorded or replayed)."""

    at_unix_ns: int
    command_id: str
    ticket_id: str
    step: int
    kind: str
    node_id: str
    gpu_uuid: str
    reason: str
    fields: Mapping[str, Any]

    @property
    def signature(self) -> tuple[Any, ...]:
        """What makes two actions the same action."""
        return tuple(self.fields.get(name, "") for name in _SIGNATURE_FIELDS)

    @property
    def label(self) -> str:
        """Short human form: kind, and its suite or scope where that says more."""
        extra = self.fields.get("suite") or ""
        if self.kind == "release":
            port = self.fields.get("ib_port")
            extra = f"port {port}" if port else "gpu" if self.fields.get("gpu_uuid") else "node"
        elif self.kind == "quarantine_port":
            extra = self.fields.get("ib_port") or ""
        return f"{self.kind}({extra})" if extra else self.kind

    @classmethod
    def from_entry(cls, entry: recording_pb.RecordedEntry) -> DecisionRecord:
        """From a recording's decision entry."""
        d = entry.decision
        try:
            fields = json.loads(d.action_json) if d.action_json else {}
        except json.JSONDecodeError:
            fields = {}
        fields.setdefault("kind", d.kind)
        fields.setdefault("gpu_uuid", d.gpu_uuid)
        return cls(
            entry.at_unix_ns, d.command_id, d.ticket_id, d.step, d.kind, entry.node_id, _gpus(fields), d.reason, fields
        )

    @classmethod
    def from_action(cls, action: actions.Action, at_unix_ns: int) -> DecisionRecord:
        """From an action the replayed ladder decided."""
        fields = action.to_dict()
        return cls(
            at_unix_ns,
            action.command_id,
            action.ticket_id,
            action.step,
            action.kind,
            action.node_id,
            _gpus(fields),
            action.reason,
            fields,
        )


def _gpus(fields: Mapping[str, Any]) -> str:
    """The GPU an action acts on, or the GPUs a validation covers ("" for the whole node)."""
    return str(fields.get("gpu_uuid") or ",".join(fields.get("gpu_uuids") or ()))


@dataclasses.dataclass
class ReplayRun:
    """What one replay fed and decided."""

    decisions: list[DecisionRecord]
    inputs: dict[str, int]
    """Inbound entries fed, by kind (hello, telemetry, events, heartbeat, closed, accusation, ...)."""
    skipped: list[str]
    """Entries that could not be fed, each with why."""
    results_recorded: int = 0
    """Commands answered with their recorded result."""
    results_withheld: int = 0
    """Commands sent in the recording that got no result there, so none here either."""
    synthesized: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    """Commands the recording never sent, answered by the synthesis rule."""
    undelivered_after_end: int = 0
    """Results due after the recording's last entry (not delivered)."""
    synthesized_due_ns: dict[str, int] = dataclasses.field(default_factory=dict)
    """command id -> when its synthesized result is delivered (replay clock)."""
    held_at_end: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    """Decided actions the disruption budget (or the breaker) still held back when the recording ended."""
    breaker: dict[str, Any] = dataclasses.field(default_factory=dict)
    """The replayed circuit breaker at the end: tripped_at_s (None: never), reason, trips."""


class _FakeClock:
    """The controller clock during a replay: the recorded arrival times, never going back."""

    def __init__(self, start_ns: int) -> None:
        self.now_ns = start_ns

    def __call__(self) -> int:
        return self.now_ns

    def advance(self, to_ns: int) -> None:
        self.now_ns = max(self.now_ns, to_ns)


@dataclasses.dataclass(frozen=True)
class _Baseline:
    """What the recorded agents answered, and when the recorded controller sent each command."""

    results: Mapping[str, tuple[int, commands_pb.ActionResult]]
    """command id -> (arrival, the first result for it)."""
    sent_unix_ns: Mapping[str, int]
    """command id -> when it was first sent."""
    median_delay_s: Mapping[str, float]
    """action kind -> median send-to-result delay."""


def _baseline(rec: recording.Recording) -> _Baseline:
    results: dict[str, tuple[int, commands_pb.ActionResult]] = {}
    sent: dict[str, tuple[int, str]] = {}
    for entry in rec.entries:
        which = entry.WhichOneof("entry")
        if which == "outbound_command":
            sent.setdefault(
                entry.outbound_command.command_id, (entry.at_unix_ns, entry.outbound_command.WhichOneof("action") or "")
            )
        elif which == "inbound" and entry.inbound.WhichOneof("payload") == "action_result":
            result = entry.inbound.action_result
            results.setdefault(result.command_id, (entry.at_unix_ns, result))
    by_kind: dict[str, list[float]] = {}
    for command_id, (at, _result) in results.items():
        if command_id in sent:
            sent_at, kind = sent[command_id]
            by_kind.setdefault(kind, []).append(max(0.0, (at - sent_at) / 1e9))
    return _Baseline(
        results=results,
        sent_unix_ns={cid: at for cid, (at, _kind) in sent.items()},
        median_delay_s={kind: statistics.median(delays) for kind, delays in by_kind.items()},
    )


class _Decisions:
    """The replayed ladder's recorder: every action it puts in its outbox becomes a `DecisionRecord`."""

    def __init__(self, run: ReplayRun) -> None:
        self._run = run

    def decisions(self, decided: Sequence[actions.Action], at_unix_ns: int) -> None:
        self._run.decisions.extend(DecisionRecord.from_action(a, at_unix_ns) for a in decided)

    def accusation(self, node_id: str, gpu_uuid: str, *, reason: str, accuser: str, at_unix_ns: int) -> None:
        """Accusations are inputs here, not decisions."""

    def node_lost(self, node_id: str, *, message: str, last_seen_unix_ns: int, at_unix_ns: int) -> None:
        """Lost-node verdicts are inputs here, not decisions."""

    def operator_action(
        self, node_id: str, gpu_uuid: str, *, action: str, reason: str, actor: str, force: bool, at_unix_ns: int
    ) -> None:
        """Operators' actions are inputs here, not decisions."""


class _Replayer:
    """A fresh controller's ingest and ladder on a scratch store, fed a recording on its recorded clock."""

    def __init__(
        self, rec: recording.Recording, policy: policy_mod.RemediationPolicy, work_dir: pathlib.Path, tick_ns: int
    ) -> None:
        self.rec = rec
        self.baseline = _baseline(rec)
        self.clock = _FakeClock(rec.header.started_unix_ns)
        self.run = ReplayRun(decisions=[], inputs={}, skipped=[])
        self.store = repo.Store.open(f"sqlite:///{work_dir / 'replay.db'}")
        # Wired as rasd-controller wires one replica: events stored with their decision. No executors:
        # controller-side actions count as succeeded. The live ticker sleeps in real time; the
        # replay calls tick() itself on recorded time. The lost-node watch judges no silence here
        # (its checks run on real time); the recorded verdicts are fed instead.
        ladder = wiring.Ladder(
            policy=policy, recorder=_Decisions(self.run), tick_interval_s=1e9, lost_node_checks=False
        )
        self.wired = wiring.single_replica(
            self.store, metrics.ControllerMetrics(CollectorRegistry()), ladder=ladder, clock=self.clock
        )
        assert self.wired.remediation is not None
        self.ingest = self.wired.ingest
        self.service = self.wired.remediation
        self.sessions: dict[str, ingest_mod.Session] = {}
        self.dispatched: set[str] = set()
        self.due: list[tuple[int, int, str, commands_pb.ActionResult]] = []
        self.tick_ns = tick_ns
        self.next_tick = rec.header.started_unix_ns + tick_ns
        self.order = 0

    def collect_dispatches(self) -> None:
        """Answer each command the replayed controller sent (once per id) by the rules of the module docstring."""
        for session in list(self.sessions.values()):
            while not session.outbound.empty():
                message = session.outbound.get_nowait()
                if message is None or not message.HasField("command"):
                    continue
                command = message.command
                if command.command_id in self.dispatched:
                    continue  # a re-send of the same id (reconnect): the agent answers once
                self.dispatched.add(command.command_id)
                self._answer(session.node_id, command)

    def _answer(self, node_id: str, command: commands_pb.Command) -> None:
        """Schedule a command's result: the recorded one, none (withheld), or a synthesized one."""
        baseline, clock = self.baseline, self.clock
        kind = command.WhichOneof("action") or ""
        if command.command_id in baseline.results:
            at, result = baseline.results[command.command_id]
            delay_ns = max(0, at - baseline.sent_unix_ns.get(command.command_id, at))
            self.run.results_recorded += 1
        elif command.command_id in baseline.sent_unix_ns:
            self.run.results_withheld += 1
            return
        else:
            delay_s = baseline.median_delay_s.get(kind, DEFAULT_SYNTH_DELAY_S.get(kind, 1.0))
            delay_ns = int(delay_s * 1e9)
            result = synthesized_result(command, finished_unix_ns=clock() + delay_ns)
            self.run.synthesized.append(
                {
                    "command_id": command.command_id,
                    "node_id": node_id,
                    "kind": kind,
                    "dispatched_s": round((clock() - self.rec.header.started_unix_ns) / 1e9, 3),
                    "delay_s": round(delay_s, 3),
                    "outcome": "SUCCEEDED" + (", verdict pass" if kind == "run_validation" else ""),
                }
            )
            self.run.synthesized_due_ns[command.command_id] = clock() + delay_ns
        self.order += 1
        heapq.heappush(self.due, (clock() + delay_ns, self.order, node_id, result))

    async def advance(self, to_ns: int) -> None:
        """Deliver the results and run the ticks due up to to_ns, in time order, then move the clock there."""
        while True:
            next_result = self.due[0][0] if self.due else None
            if next_result is not None and next_result <= min(self.next_tick, to_ns):
                at, _order, node_id, result = heapq.heappop(self.due)
                self.clock.advance(at)
                await self.service.on_result(node_id, wire_commands.result_from_wire(result))
            elif self.next_tick <= to_ns:
                self.clock.advance(self.next_tick)
                self.next_tick += self.tick_ns
                await self.service.tick()
            else:
                break
            self.collect_dispatches()
        self.clock.advance(to_ns)

    async def feed_all(self) -> None:
        """Every entry in recorded order, then the time up to the recording's end."""
        for entry in self.rec.entries:
            await self.advance(entry.at_unix_ns)
            await _feed(entry, self.ingest, self.service, self.sessions, self.run)
            self.collect_dispatches()
        await self.advance(self.rec.ended_unix_ns)

    async def note_end(self) -> None:
        """What was still held or undelivered when the recording ended, and the breaker's state."""
        run = self.run
        run.undelivered_after_end = len(self.due)
        held = await self.ingest.store_calls.run_in_store(lambda: self.service.store.commands(statuses=("pending",)))
        run.held_at_end = [
            {"node_id": c.node_id, "gpu_uuid": c.gpu_uuid, "ticket_id": c.ticket_id, "kind": c.kind} for c in held
        ]
        budget = self.service.budget
        run.breaker = {
            "tripped_at_s": None
            if budget.breaker_tripped_at is None
            else round(budget.breaker_tripped_at - self.rec.header.started_unix_ns / 1e9, 3),
            "reason": budget.breaker_reason,
            "trips": budget.trips,
        }


async def replay(
    rec: recording.Recording,
    policy: policy_mod.RemediationPolicy,
    *,
    work_dir: pathlib.Path,
    tick_interval_s: float = DEFAULT_TICK_INTERVAL_S,
) -> ReplayRun:
    """Feed a recording to a fresh controller running policy; return its decisions and what was fed."""
    replayer = _Replayer(rec, policy, work_dir, int(tick_interval_s * 1e9))
    await replayer.service.start()
    try:
        await replayer.feed_all()
        await replayer.note_end()
    finally:
        await replayer.wired.stop()
        replayer.store.close()
    run = replayer.run
    run.decisions = [d for d in run.decisions if d.at_unix_ns <= rec.ended_unix_ns]
    return run


async def _feed(
    entry: recording_pb.RecordedEntry,
    ingest: ingest_mod.Ingest,
    service: remediation_mod.RemediationService,
    sessions: dict[str, ingest_mod.Session],
    run: ReplayRun,
) -> None:
    """Hand one recorded entry to the fresh controller as the live edge would."""
    which = entry.WhichOneof("entry")
    if which in ("decision", "outbound_command"):
        return  # the recorded run's outputs: the baseline, not an input
    if which == "accusation":
        run.inputs["accusation"] = run.inputs.get("accusation", 0) + 1
        accusation = entry.accusation
        await service.accuse(
            entry.node_id, accusation.gpu_uuid, reason=accusation.reason, accuser=accusation.accuser,
            at_unix_ns=entry.at_unix_ns,  # its ticket's id holds the recorded time, not the replay clock's
        )  # fmt: skip
        return
    if which == "node_lost":
        run.inputs["node_lost"] = run.inputs.get("node_lost", 0) + 1
        lost = entry.node_lost
        labels = ingest.node_labels.get(entry.node_id, {})
        await service.lost_nodes.take_recorded(
            entry.node_id, lost.message, lost.last_seen_unix_ns, entry.at_unix_ns, labels
        )
        return
    if which == "operator_action":
        run.inputs["operator_action"] = run.inputs.get("operator_action", 0) + 1
        await _feed_operator_action(entry, service, run)
        return
    if which == "closed":
        session = sessions.pop(entry.session_id, None)
        if session is not None:
            run.inputs["closed"] = run.inputs.get("closed", 0) + 1
            await ingest.close_session(session)
        return
    if which != "inbound":
        run.skipped.append(f"entry at {entry.at_unix_ns}: unknown kind {which!r}")
        return
    message = entry.inbound
    kind = message.WhichOneof("payload") or "empty"
    if kind == "action_result":
        return  # delivered by command id (see the module docstring), never as it stands
    try:
        fed = await _feed_inbound(entry, message, ingest, sessions, run)
    except wire.WireError as exc:
        # The live controller rejected it the same way (and ended that stream); keep going.
        run.skipped.append(f"{entry.node_id} {kind} at {entry.at_unix_ns}: rejected: {exc}")
        return
    if fed:
        run.inputs[kind] = run.inputs.get(kind, 0) + 1


async def _feed_operator_action(
    entry: recording_pb.RecordedEntry, service: remediation_mod.RemediationService, run: ReplayRun
) -> None:
    """An operator's quarantine, release, pause or resume, asked of the replayed ladder at its recorded time.

    Asked whatever came of it in the recording: a release refused there (no passing validation) may
    be allowed under the replayed policy, and the other way round; a refusal here is noted, not fatal.
    """
    op, node_id, at_ns = entry.operator_action, entry.node_id, entry.at_unix_ns
    if op.action in ("pause", "resume"):
        await service.set_paused(op.action == "pause", reason=op.reason, actor=op.actor, at_unix_ns=at_ns)
    elif op.action == "quarantine":
        await service.operator_quarantine(node_id, op.gpu_uuid, reason=op.reason, actor=op.actor, at_unix_ns=at_ns)
    elif op.action == "release":
        try:
            await service.operator_release(
                node_id, op.gpu_uuid, reason=op.reason, force=op.force, actor=op.actor, at_unix_ns=at_ns
            )
        except (LookupError, PermissionError) as exc:
            run.skipped.append(f"{node_id} release by {op.actor} at {at_ns}: refused in the replay: {exc}")
    else:
        run.skipped.append(f"{node_id} operator action at {at_ns}: unknown action {op.action!r}")


async def _feed_inbound(
    entry: recording_pb.RecordedEntry,
    message: agent_pb.AgentMessage,
    ingest: ingest_mod.Ingest,
    sessions: dict[str, ingest_mod.Session],
    run: ReplayRun,
) -> bool:
    """An inbound stream message, converted at the edge as the stream's servicer does; False: not fed."""
    kind = message.WhichOneof("payload") or "empty"
    if kind == "hello":
        node_hello = wire.hello_from_wire(message.hello)
        session, _welcome = await ingest.open_session(node_hello, sent_unix_ns=message.hello.sent_unix_ns)
        sessions[entry.session_id] = session
        return True
    session = sessions.get(entry.session_id)
    if session is None:
        run.skipped.append(f"{entry.node_id} {kind} at {entry.at_unix_ns}: its stream has no recorded Hello")
        return False
    if kind == "telemetry":
        ingest.on_telemetry(session, wire_stream.telemetry_from_wire(message.telemetry, session.known_gpus))
    elif kind == "summary":
        ingest.on_summary(session, wire_stream.summary_from_wire(message.summary, session.node_id, session.known_gpus))
    elif kind == "events":
        events = wire.events_from_wire(
            message.events, session.known_gpus, ingest.clock(), session.node_id, spool_epoch=session.spool_epoch
        )
        await ingest.take_events(session, events, started=time.perf_counter())
    elif kind == "heartbeat":
        ingest.on_heartbeat(session, message.heartbeat.sent_unix_ns)
    else:
        run.skipped.append(f"{entry.node_id} at {entry.at_unix_ns}: empty or unknown payload")
        return False
    return True


def synthesized_result(command: commands_pb.Command, *, finished_unix_ns: int) -> commands_pb.ActionResult:
    """The rule-3 result for a command the recording never sent: it worked (validation: pass)."""
    result = commands_pb.ActionResult(
        command_id=command.command_id,
        outcome=commands_pb.ACTION_OUTCOME_SUCCEEDED,
        message="synthesized by rasd-sim --replay: this command was never sent in the recording",
        finished_unix_ns=finished_unix_ns,
    )
    if command.WhichOneof("action") == "run_validation":
        result.validation_verdict = "pass"
    return result


# -- the diff --------------------------------------------------------------------------------------


def diff(
    recorded: Sequence[DecisionRecord],
    replayed: Sequence[DecisionRecord],
    *,
    started_unix_ns: int,
    synthesized_tickets: Mapping[str, int] | None = None,
) -> list[dict[str, Any]]:
    """Every decision that differs, per ticket in step order (see the module docstring).

    Args:
        recorded: the recording's decisions.
        replayed: the replay's decisions.
        started_unix_ns: the recording's start (row times are seconds after it).
        synthesized_tickets: ticket id -> when its first synthesized result was delivered; replayed
            rows on such a ticket at or after that time are flagged ``depends_on_synthesized``.
    """
    synthesized_tickets = synthesized_tickets or {}
    by_ticket: dict[str, tuple[list[DecisionRecord], list[DecisionRecord]]] = {}
    for d in recorded:
        by_ticket.setdefault(d.ticket_id, ([], []))[0].append(d)
    for d in replayed:
        by_ticket.setdefault(d.ticket_id, ([], []))[1].append(d)
    rows: list[dict[str, Any]] = []
    for ticket_id, (rec, rep) in by_ticket.items():
        rec = sorted(rec, key=lambda d: d.step)
        rep = sorted(rep, key=lambda d: d.step)
        matcher = difflib.SequenceMatcher(a=[d.signature for d in rec], b=[d.signature for d in rep], autojunk=False)
        for tag, i1, i2, j1, j2 in matcher.get_opcodes():
            if tag == "equal":
                continue
            for a, b in _pair(rec[i1:i2], rep[j1:j2]):
                rows.append(_row(ticket_id, a, b, started_unix_ns, synthesized_tickets))
    rows.sort(key=lambda r: (r["at_s"], r["node_id"], r["ticket_id"], r["replayed_step"] or r["recorded_step"] or 0))
    return rows


def _category(kind: str) -> str:
    return _CATEGORIES.get(kind, kind)


def _pair(
    left: Sequence[DecisionRecord], right: Sequence[DecisionRecord]
) -> list[tuple[DecisionRecord | None, DecisionRecord | None]]:
    """Pair a differing stretch: a repair with a repair, a hold with a hold, ...; the rest stand alone."""
    pairs: list[tuple[DecisionRecord | None, DecisionRecord | None]] = []
    free = list(right)
    for a in left:
        b = next((x for x in free if _category(x.kind) == _category(a.kind)), None)
        if b is not None:
            free.remove(b)
        pairs.append((a, b))
    pairs += [(None, b) for b in free]
    return pairs


def _row(
    ticket_id: str,
    a: DecisionRecord | None,
    b: DecisionRecord | None,
    started_unix_ns: int,
    synthesized_tickets: Mapping[str, int],
) -> dict[str, Any]:
    either = b or a
    assert either is not None
    change = "changed" if a and b else "only_recorded" if a else "only_replayed"
    synth_at = synthesized_tickets.get(ticket_id)
    return {
        "change": change,
        "ticket_id": ticket_id,
        "node_id": either.node_id,
        "gpu_uuid": either.gpu_uuid,
        "at_s": round((min(d.at_unix_ns for d in (a, b) if d) - started_unix_ns) / 1e9, 3),
        "recorded_action": a.label if a else "",
        "replayed_action": b.label if b else "",
        "recorded_step": a.step if a else None,
        "replayed_step": b.step if b else None,
        "reason": b.reason if b else "",
        "recorded_reason": a.reason if a else "",
        "depends_on_synthesized": bool(b and synth_at is not None and b.at_unix_ns >= synth_at),
    }


def build_report(
    rec: recording.Recording,
    policy: policy_mod.RemediationPolicy,
    run: ReplayRun,
    *,
    policy_source: str,
    synthesized_tickets: Mapping[str, int],
) -> dict[str, Any]:
    """report.json of a replay: what was fed, how results were answered, and every differing decision."""
    recorded = [DecisionRecord.from_entry(e) for e in rec.entries if e.WhichOneof("entry") == "decision"]
    rows = diff(
        recorded, run.decisions, started_unix_ns=rec.header.started_unix_ns, synthesized_tickets=synthesized_tickets
    )
    recorded_policy = recording.policy_to_mapping(rec.policy)
    replayed_policy = recording.policy_to_mapping(policy)
    changed = {
        f"{group}.{key}": {"recorded": value, "replayed": replayed_policy[group][key]}
        for group, table in recorded_policy.items()
        for key, value in table.items()
        if replayed_policy[group][key] != value
    }
    counts: dict[str, int] = {}
    for row in rows:
        counts[row["change"]] = counts.get(row["change"], 0) + 1
    return {
        "recording": {
            "path": str(rec.path),
            "format_version": rec.header.format_version,
            "controller_version": rec.header.controller_version,
            "recorder": rec.header.recorder,
            "entries": len(rec.entries),
            "duration_s": round((rec.ended_unix_ns - rec.header.started_unix_ns) / 1e9, 3),
            "truncated_at_byte": rec.truncated_at,
        },
        "policy": {"source": policy_source, "changed": changed},
        "inputs": dict(sorted(run.inputs.items())),
        "skipped": run.skipped,
        "results": {
            "recorded": run.results_recorded,
            "withheld_no_recorded_result": run.results_withheld,
            "synthesized": len(run.synthesized),
            "undelivered_after_end": run.undelivered_after_end,
        },
        "synthesized_results": run.synthesized,
        "held_at_end": run.held_at_end,
        "breaker": run.breaker,
        "decisions": {"recorded": len(recorded), "replayed": len(run.decisions)},
        "differences": len(rows),
        "differences_by_change": counts,
        "diff": rows,
    }


def markdown(report: Mapping[str, Any]) -> str:
    """The report as a human table."""
    rec = report["recording"]
    lines = [
        f"# rasd-sim --replay {rec['path']}",
        "",
        f"Recording: {rec['entries']} entries over {rec['duration_s']:g} s (format {rec['format_version']}, "
        f"controller {rec['controller_version']})"
        + (f"; cut short at byte {rec['truncated_at_byte']}" if rec["truncated_at_byte"] else ""),
        f"Policy: {report['policy']['source']}; changed: "
        + (
            ", ".join(f"{k} {v['recorded']} → {v['replayed']}" for k, v in report["policy"]["changed"].items())
            or "nothing"
        ),
        f"Decisions: recorded {report['decisions']['recorded']}, replayed {report['decisions']['replayed']}; "
        f"results: recorded {report['results']['recorded']}, synthesized {report['results']['synthesized']}, "
        f"withheld {report['results']['withheld_no_recorded_result']}",
        "",
        f"**{report['differences']} decision(s) differ.**",
    ]
    if report["diff"]:
        lines += [
            "",
            "| t s | node | GPU | ticket | change | recorded | replayed | reason |",
            "|---:|---|---|---|---|---|---|---|",
        ]
        for row in report["diff"]:
            flag = " (after a synthesized result)" if row["depends_on_synthesized"] else ""
            reason = (row["reason"] or f"recorded: {row['recorded_reason']}").replace("|", "/")
            lines.append(
                f"| {row['at_s']:.1f} | {row['node_id']} | {row['gpu_uuid'] or '-'} | {row['ticket_id']} | "
                f"{row['change']} | {row['recorded_action'] or '-'} | {row['replayed_action'] or '-'} | "
                f"{reason}{flag} |"
            )
    if report["synthesized_results"]:
        lines += ["", "Synthesized results (commands the recording never sent):", ""]
        lines += [
            f"- {s['node_id']} {s['kind']} {s['command_id']} at {s['dispatched_s']:g} s: {s['outcome']} "
            f"after {s['delay_s']:g} s"
            for s in report["synthesized_results"]
        ]
    if report["breaker"].get("tripped_at_s") is not None:
        lines += [
            "",
            f"The replayed circuit breaker tripped at {report['breaker']['tripped_at_s']:g} s: "
            f"{report['breaker']['reason']}",
        ]
    if report["held_at_end"]:
        lines += ["", "Decided but still held by the disruption budget when the recording ended:", ""]
        lines += [f"- {h['node_id']} {h['kind']} ({h['ticket_id']})" for h in report["held_at_end"]]
    if report["skipped"]:
        lines += ["", f"Skipped entries ({len(report['skipped'])}):", ""] + [f"- {s}" for s in report["skipped"][:20]]
    return "\n".join(lines) + "\n"


def synthesized_tickets(run: ReplayRun) -> dict[str, int]:
    """Ticket id -> when its first synthesized result was delivered (replay clock)."""
    tickets_by_command = {d.command_id: d.ticket_id for d in run.decisions}
    out: dict[str, int] = {}
    for command_id, at in run.synthesized_due_ns.items():
        ticket = tickets_by_command.get(command_id)
        if ticket is not None:
            out[ticket] = min(at, out.get(ticket, at))
    return out


async def run_replay(
    path: pathlib.Path,
    *,
    policy_file: pathlib.Path | None = None,
    out_dir: pathlib.Path | None = None,
    tick_interval_s: float = DEFAULT_TICK_INTERVAL_S,
    out: TextIO | None = None,
) -> dict[str, Any]:
    """Read a recording, replay it under the recorded policy or policy_file laid over it, and report.

    Writes OUT/replay.json and OUT/replay.md when out_dir is given.

    Raises:
        recording.RecordingError, OSError: the recording cannot be read.
        PolicyFileError: the policy file is bad.
    """
    rec = recording.read(path)
    policy = rec.policy
    source = "as recorded"
    if policy_file is not None:
        policy = overlay_policy(policy, load_policy_overrides(policy_file))
        source = f"{policy_file} over the recorded policy"
    with tempfile.TemporaryDirectory(prefix="rasd-replay-") as scratch:
        run = await replay(rec, policy, work_dir=pathlib.Path(scratch), tick_interval_s=tick_interval_s)
    report = build_report(rec, policy, run, policy_source=source, synthesized_tickets=synthesized_tickets(run))
    text = markdown(report)
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "replay.json").write_text(json.dumps(report, indent=2) + "\n")
        (out_dir / "replay.md").write_text(text)
    if out is not None:
        print(text, file=out)
    return report
