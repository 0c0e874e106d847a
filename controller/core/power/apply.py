"""Two-phase application of power caps: decreases first, confirmed by read-back, then increases.

This module owns what the controller believes about the caps in force and which SetPowerCap
commands are in flight, and it decides which commands to send next. It keeps invariant 1 of
DESIGN.md §2: at every level of the budget tree, the sum of caps that *may be in force* never
exceeds the budget, through lost and reordered acks, node loss and controller restarts.

Per GPU the state holds the last *confirmed* enforced limit (read back by the agent, with the time
it was read) and at most one *pending* command (target, id, issue time, deadline). From these:

    may_be_in_force = max(confirmed, pending target)     # unknown confirmed counts as max_w

So an unacknowledged decrease counts as not applied, and an unacknowledged raise counts as applied.
An unreachable node keeps its GPUs at that bound until a read-back arrives, so its watts are never
handed to anyone else.

Transitions of one GPU (sample times are in controller time; the edge converts agent clocks):

    | event                                             | confirmed        | pending  |
    |---------------------------------------------------|------------------|----------|
    | plan: target < bound, nothing pending (phase 1)   | -                | target   |
    | plan: target > bound, fits every domain's slack   | -                | target   |
    |   (phase 2; counts bounds, so waits for phase 1)  |                  |          |
    | read-back (v, t), t newer than confirmed          | v                | -        |
    | ack of the pending id with read-back (v, t)       | v if t newer     | cleared  |
    | ack of the pending id, "not executed" (refused)   | -                | cleared  |
    | read-back with t >= issue and v == target         | v                | cleared  |
    | read-back with t > deadline + clock skew margin   | v                | cleared  |
    | ack of an older id (reordered or replayed)        | v if t newer     | -        |

The agent refuses a command after its deadline and executes each id once, which is what lets a
read-back newer than the deadline settle a command whose ack was lost.

A raise may carry a rate (`plan(..., raise_rates_w_per_s=)`, the job-start ramp's per-GPU share of
the aggregate limit): the agent then moves the limit up no faster than that (`rasd.agent.core.
cap_slew`) and answers at once with the limit read back now *and* the raise's target, which
telemetry repeats until the limit gets there. The edge hands this module max(read-back, slew
target) as the read-back: the most that may be in force from what the agent has accepted. So a
slewing raise is confirmed (and settled, not resent) as soon as the agent has taken it, at its
target, exactly as a raise set at once; the budget counted that target from the moment it was
sent, so the invariant does not depend on when the limit gets there. After a controller restart
the persisted state (`to_mapping`/`from_mapping`, plain data with packed columns) continues as before; if it was lost,
`ApplyState.unknown` starts every GPU at its maximum with a synthetic pending entry that only a
read-back newer than one command lifetime can settle, which covers commands sent before the crash.

Pure: no I/O, no logging, no clock reads. `now` comes in as an argument.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import json
import zlib
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

from rasd.controller.core.power import allocate as power
from rasd.controller.core.power import policy as power_policy
from rasd.controller.core.power import tree as power_tree

_COLUMNS = ("confirmed_w", "confirmed_at_s", "pending_w", "pending_seq", "pending_issued_s", "pending_deadline_s")

NO_COMMAND = -1
"""`pending_seq` of a GPU with nothing in flight."""

UNKNOWN_COMMAND = -2
"""`pending_seq` of the synthetic entry of a GPU whose state was lost (see `ApplyState.unknown`)."""


@dataclasses.dataclass(frozen=True)
class GpuLimits:
    """A GPU's identity and NVML power-limit constraints, W."""

    gpu_uuid: str
    node_id: str
    min_w: int
    max_w: int


@dataclasses.dataclass(frozen=True)
class CapReadback:
    """An enforced power limit read back from a GPU (telemetry, or in a SetPowerCap result)."""

    gpu_uuid: str
    enforced_w: float
    sample_s: float
    """When the agent read it, in controller time (seconds)."""
    settles_commands: bool = True
    """False for a value that bounds the GPU without being what it enforces (the share of a limit a
    BMC holds on the whole node): it counts as the GPU's cap, but says nothing of whether a command
    to the GPU landed or expired, so pending commands stay pending."""


@dataclasses.dataclass(frozen=True)
class CapAck:
    """The result of one GPU's part of a SetPowerCap command."""

    command_id: str
    gpu_uuid: str
    enforced_w: float | None
    """The enforced limit read back after the set; None when the agent did not and will not execute
    it (refused, or past its deadline). A failure that may have changed the limit must carry the
    read-back, or be left unanswered so that a later read-back settles it."""
    sample_s: float
    """When the read-back was taken, controller time (seconds)."""


class CapCommand(NamedTuple):
    """One GPU's new limit; the edge groups these per node into SetPowerCap commands.

    A NamedTuple rather than a frozen dataclass: a plan can hold one per GPU (16k), and tuples are
    several times cheaper to build.
    """

    command_id: str
    node_id: str
    gpu_uuid: str
    limit_w: int
    deadline_s: float
    phase: int
    """1 for a decrease, 2 for an increase."""
    max_raise_w_per_s: float = 0.0
    """For an increase: the fastest the agent may move the limit up to `limit_w`, W/s (0: at once)."""


@dataclasses.dataclass(frozen=True)
class CapPlan:
    """What to send now."""

    decreases: tuple[CapCommand, ...]
    """Phase 1: safe to send at once."""
    increases: tuple[CapCommand, ...]
    """Phase 2: each fits every domain's slack counting unconfirmed decreases as not applied."""
    waiting: int
    """GPUs whose target differs from their bound but got no command (in flight, or no slack yet)."""
    over_budget: tuple[str, ...]
    """Domains whose may-be-in-force sum exceeds the budget (only after a budget cut, until the
    decreases are confirmed)."""
    reason: str

    def by_node(self) -> dict[str, dict[str, int]]:
        """Group every command's limit per node: node id -> {gpu uuid: limit W}."""
        out: dict[str, dict[str, int]] = {}
        for c in (*self.decreases, *self.increases):
            out.setdefault(c.node_id, {})[c.gpu_uuid] = c.limit_w
        return out


@dataclasses.dataclass(frozen=True, eq=False)
class ApplyState:
    """The planner's state: plain arrays aligned by GPU position, persisted as a mapping."""

    epoch: str
    """Prefix of command ids, unique per state lineage (a fresh `unknown` state needs a new one, so its
    ids never collide with ids an agent already executed)."""
    next_seq: int
    gpus: tuple[GpuLimits, ...]
    confirmed_w: np.ndarray
    """Last enforced limit read back, W; NaN when never read."""
    confirmed_at_s: np.ndarray
    """Sample time of confirmed_w; -inf when never read."""
    pending_w: np.ndarray
    """Target of the command in flight, W; NaN when none."""
    pending_seq: np.ndarray
    """Sequence number of the command in flight; NO_COMMAND or UNKNOWN_COMMAND."""
    pending_issued_s: np.ndarray
    pending_deadline_s: np.ndarray

    min_w: np.ndarray = dataclasses.field(init=False, repr=False)
    """Each GPU's NVML minimum, W (derived from `gpus`)."""
    max_w: np.ndarray = dataclasses.field(init=False, repr=False)
    """Each GPU's NVML maximum, W (derived from `gpus`)."""
    _position: Mapping[str, int] = dataclasses.field(init=False, repr=False)
    _inventory: str | None = dataclasses.field(init=False, repr=False)
    """`gpus` packed for `to_mapping`, once (None until then)."""

    def __post_init__(self) -> None:
        n = len(self.gpus)
        for name in _COLUMNS:
            if np.shape(getattr(self, name)) != (n,):
                raise ValueError(f"ApplyState.{name} must have shape ({n},)")
        object.__setattr__(self, "min_w", np.array([g.min_w for g in self.gpus], dtype=np.float64))
        object.__setattr__(self, "max_w", np.array([g.max_w for g in self.gpus], dtype=np.float64))
        object.__setattr__(self, "_position", {g.gpu_uuid: i for i, g in enumerate(self.gpus)})
        object.__setattr__(self, "_inventory", None)

    def position(self) -> Mapping[str, int]:
        """GPU uuid -> position in the arrays."""
        return self._position

    def _replace(self, **columns: Any) -> ApplyState:
        """A copy with some columns (or next_seq) replaced, reusing the derived fields."""
        new = object.__new__(ApplyState)
        for f in dataclasses.fields(self):
            object.__setattr__(new, f.name, columns.get(f.name, getattr(self, f.name)))
        return new

    def command_id(self, seq: int) -> str:
        """The id of command number `seq` of this lineage."""
        return f"cap-{self.epoch}-{seq}"

    # Construction and persistence --------------------------------------------------------------

    @classmethod
    def unknown(
        cls, gpus: Sequence[GpuLimits], *, now_s: float, policy: power_policy.PowerPolicy, epoch: str
    ) -> ApplyState:
        """A state that knows nothing: first start, or a restart that lost its persisted state.

        Every GPU may be anywhere up to its maximum, and a command sent before the restart may still
        land until one command lifetime has passed, so each GPU gets a synthetic pending entry at its
        maximum that only a read-back newer than that lifetime settles.

        Args:
            gpus: The GPUs to manage.
            now_s: Controller time, seconds.
            policy: For the command lifetime and clock skew margin.
            epoch: A prefix no earlier lineage used (e.g. the controller's start time and replica).

        Returns:
            The state.
        """
        n = len(gpus)
        return cls(
            epoch=epoch,
            next_seq=0,
            gpus=tuple(gpus),
            confirmed_w=np.full(n, np.nan),
            confirmed_at_s=np.full(n, -np.inf),
            pending_w=np.array([g.max_w for g in gpus], dtype=np.float64),
            pending_seq=np.full(n, UNKNOWN_COMMAND, dtype=np.int64),
            pending_issued_s=np.full(n, now_s, dtype=np.float64),
            pending_deadline_s=np.full(n, now_s + policy.command_ttl_s, dtype=np.float64),
        )

    def with_gpus(self, gpus: Sequence[GpuLimits], *, now_s: float, policy: power_policy.PowerPolicy) -> ApplyState:
        """Return a state for a new GPU inventory: known GPUs keep their state, new ones start unknown."""
        pos = self.position()
        fresh = ApplyState.unknown(gpus, now_s=now_s, policy=policy, epoch=self.epoch)
        take = [(i, pos[g.gpu_uuid]) for i, g in enumerate(gpus) if g.gpu_uuid in pos]
        arrays = {}
        for name in _COLUMNS:
            a = getattr(fresh, name).copy()
            old = getattr(self, name)
            for new_i, old_i in take:
                a[new_i] = old[old_i]
            arrays[name] = a
        return dataclasses.replace(fresh, next_seq=self.next_seq, **arrays)

    def to_mapping(self) -> dict[str, Any]:
        """Plain data (JSON-safe) for the store; `from_mapping` rebuilds the same state.

        Packed (`STATE_FORMAT`): each column's bytes compressed, the GPU inventory one compressed
        document. A cap wave over 100,000 GPUs saves this before any command leaves, and a JSON
        object per GPU (28 MB) took the leader 0.4 s to write where the packed state (under 1 MB)
        takes a few tens of milliseconds.
        """
        if self._inventory is None:  # encoded once per inventory: `_replace` hands it on
            object.__setattr__(self, "_inventory", _packed_inventory(self.gpus))
        return {
            "format": STATE_FORMAT,
            "epoch": self.epoch,
            "next_seq": self.next_seq,
            "gpus": self._inventory,
            "columns": {name: _pack(getattr(self, name)) for name in _COLUMNS},
        }

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> ApplyState:
        """Rebuild a state persisted with `to_mapping` (or by a controller that wrote a JSON object per GPU).

        Raises:
            KeyError: A field is missing.
            ValueError: A field cannot be read (damaged bytes, a column of the wrong length); the
                message names it.
        """
        if data.get("format") != STATE_FORMAT:
            return cls._from_rows(data)
        gpus = _unpacked_inventory(data["gpus"])
        columns = {
            name: _unpack(data["columns"][name], name, np.int64 if name == "pending_seq" else np.float64, len(gpus))
            for name in _COLUMNS
        }
        return cls(epoch=str(data["epoch"]), next_seq=int(data["next_seq"]), gpus=gpus, **columns)

    @classmethod
    def _from_rows(cls, data: Mapping[str, Any]) -> ApplyState:
        """The format before `STATE_FORMAT`: one JSON object per GPU."""
        rows = data["gpus"]

        def col(key: str, missing: float) -> np.ndarray:
            return np.array([missing if r[key] is None else r[key] for r in rows], dtype=np.float64)

        return cls(
            epoch=str(data["epoch"]),
            next_seq=int(data["next_seq"]),
            gpus=tuple(GpuLimits(r["gpu_uuid"], r["node_id"], int(r["min_w"]), int(r["max_w"])) for r in rows),
            confirmed_w=col("confirmed_w", np.nan),
            confirmed_at_s=col("confirmed_at_s", -np.inf),
            pending_w=col("pending_w", np.nan),
            pending_seq=np.array([int(r["pending_seq"]) for r in rows], dtype=np.int64),
            pending_issued_s=col("pending_issued_s", np.nan),
            pending_deadline_s=col("pending_deadline_s", np.nan),
        )


STATE_FORMAT = 2
"""`ApplyState.to_mapping`'s layout: 2 packs the columns; documents without "format" hold a JSON object per GPU."""


def _to_text(raw: bytes) -> str:
    """Bytes as JSON-safe text: compressed (fast), base64."""
    return base64.b64encode(zlib.compress(raw, 1)).decode("ascii")


def _from_text(text: str) -> bytes:
    """`_to_text` undone. Raises binascii.Error or zlib.error on damaged text."""
    return zlib.decompress(base64.b64decode(text, validate=True))


def _pack(values: np.ndarray) -> str:
    """A column as text: its little-endian bytes (NaN and infinities as they are), compressed, base64."""
    return _to_text(np.ascontiguousarray(values, dtype=values.dtype.newbyteorder("<")).tobytes())


def _unpack(text: str, name: str, dtype: type, count: int) -> np.ndarray:
    try:
        values = np.frombuffer(_from_text(text), dtype=np.dtype(dtype).newbyteorder("<"))
    except (binascii.Error, zlib.error, ValueError, TypeError) as exc:
        raise ValueError(f"apply state column {name}: not a packed column ({exc})") from None
    if len(values) != count:
        raise ValueError(f"apply state column {name}: {len(values)} values for {count} GPUs")
    return values.astype(dtype)  # a writable copy in native order


def _packed_inventory(gpus: Sequence[GpuLimits]) -> str:
    doc = {
        "gpu_uuid": [g.gpu_uuid for g in gpus],
        "node_id": [g.node_id for g in gpus],
        "min_w": [g.min_w for g in gpus],
        "max_w": [g.max_w for g in gpus],
    }
    return _to_text(json.dumps(doc, separators=(",", ":")).encode())


def _unpacked_inventory(text: str) -> tuple[GpuLimits, ...]:
    try:
        doc = json.loads(_from_text(text))
        rows = zip(doc["gpu_uuid"], doc["node_id"], doc["min_w"], doc["max_w"], strict=True)
        return tuple(GpuLimits(str(uuid), str(node), int(lo), int(hi)) for uuid, node, lo, hi in rows)
    except (binascii.Error, zlib.error, KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"apply state GPU inventory: not a packed inventory ({exc!r})") from None


def forget_node(state: ApplyState, node_id: str, *, now_s: float, policy: power_policy.PowerPolicy) -> ApplyState:
    """Treat one node's GPUs as unknown again, e.g. when its agent reconnects with a new boot id.

    NVML limits do not survive a reboot or driver reload, so whatever was confirmed before may no
    longer hold: each GPU of the node may be anywhere up to its maximum until a read-back newer than
    one command lifetime settles it (as in `ApplyState.unknown`). Commands in flight to the node are
    forgotten with it; their targets are below the maximum assumed now.
    """
    on_node = np.array([g.node_id == node_id for g in state.gpus], dtype=bool)
    return forget_gpus(state, on_node, now_s=now_s, policy=policy)


def forget_gpus(state: ApplyState, which: np.ndarray, *, now_s: float, policy: power_policy.PowerPolicy) -> ApplyState:
    """Treat the GPUs marked in `which` as unknown again from now_s (see `forget_node`).

    Each counts at its maximum, gets no command (its synthetic pending entry is not one to settle by
    an ack), and is known again only from a read-back taken more than one command lifetime after
    now_s. Forgetting a GPU every period while a reset or reboot may return it to its default limit
    keeps it counted at that limit until one command lifetime after the last period that did.
    """
    which = np.asarray(which, dtype=bool)
    if not which.any():
        return state
    return state._replace(
        confirmed_w=np.where(which, np.nan, state.confirmed_w),
        confirmed_at_s=np.where(which, now_s, state.confirmed_at_s),
        pending_w=np.where(which, state.max_w, state.pending_w),
        pending_seq=np.where(which, UNKNOWN_COMMAND, state.pending_seq),
        pending_issued_s=np.where(which, now_s, state.pending_issued_s),
        pending_deadline_s=np.where(which, now_s + policy.command_ttl_s, state.pending_deadline_s),
    )


def in_force_w(enforced_w: float, slew_target_w: float | None) -> float:
    """The read-back to record for a GPU whose agent may be slewing a raise, W.

    The higher of the limit read back now and the target of the raise the agent is still moving
    (None or 0: none): the limit gets to that target without another command, so it is the most
    that may be in force. A slewing raise is thus confirmed at its target, like a raise set at once.
    """
    return max(float(enforced_w), float(slew_target_w or 0.0))


def may_be_in_force_w(state: ApplyState) -> np.ndarray:
    """Upper bound of each GPU's enforced limit, W: max(confirmed or max_w if unknown, pending target)."""
    confirmed = np.where(np.isnan(state.confirmed_w), state.max_w, state.confirmed_w)
    return np.fmax(confirmed, state.pending_w)


def unconfirmed_decreases(state: ApplyState) -> int:
    """GPUs with a decrease in flight that no ack or read-back has confirmed yet.

    They count at the higher, confirmed value until one does.
    """
    confirmed = np.where(np.isnan(state.confirmed_w), state.max_w, state.confirmed_w)
    return int(np.count_nonzero(~np.isnan(state.pending_w) & (state.pending_w < confirmed)))


def may_be_in_force(state: ApplyState, gpu_uuid: str) -> float:
    """The may-be-in-force bound of one GPU, W (see `may_be_in_force_w`)."""
    i = state.position()[gpu_uuid]
    return float(may_be_in_force_w(state)[i])


def record(
    state: ApplyState,
    *,
    acks: Iterable[CapAck] = (),
    readbacks: Iterable[CapReadback] = (),
    policy: power_policy.PowerPolicy,
) -> ApplyState:
    """Fold acks and read-backs into the state, in any order they arrived.

    Unknown GPUs are ignored (their inventory update has not reached the state yet). A read-back only
    replaces an older one, so reordered telemetry never rolls the state back.

    Args:
        state: Current state.
        acks: SetPowerCap results, per GPU.
        readbacks: Enforced-limit read-backs from telemetry.
        policy: For the clock skew margin.

    Returns:
        The new state.
    """
    pos = state.position()
    confirmed = state.confirmed_w.copy()
    confirmed_at = state.confirmed_at_s.copy()
    pending_w = state.pending_w.copy()
    pending_seq = state.pending_seq.copy()
    prefix = f"cap-{state.epoch}-"

    def observe(i: int, value: float, t: float, settles: bool = True) -> None:
        if t >= confirmed_at[i]:
            confirmed[i] = value
            confirmed_at[i] = t
        if pending_seq[i] == NO_COMMAND or not settles:
            return
        landed = t >= state.pending_issued_s[i] and value == pending_w[i]
        expired = t > state.pending_deadline_s[i] + policy.clock_skew_margin_s
        if (landed and pending_seq[i] != UNKNOWN_COMMAND) or expired:
            pending_w[i] = np.nan
            pending_seq[i] = NO_COMMAND

    for ack in acks:
        i = pos.get(ack.gpu_uuid)
        if i is None:
            continue
        is_current = (
            pending_seq[i] >= 0
            and ack.command_id.startswith(prefix)
            and ack.command_id[len(prefix) :] == str(int(pending_seq[i]))
        )
        if ack.enforced_w is not None:
            observe(i, float(ack.enforced_w), ack.sample_s)
            if is_current and ack.sample_s < confirmed_at[i]:
                # The answer to the newest command, dated before a read-back already folded in:
                # only a clock step (the agent's stepped back) dates them so. Dropped, the value in
                # force went uncounted once the command cleared below; the larger of the two is
                # counted until a later read-back settles it.
                confirmed[i] = max(confirmed[i], float(ack.enforced_w))
        if is_current:
            pending_w[i] = np.nan
            pending_seq[i] = NO_COMMAND
    for rb in readbacks:
        i = pos.get(rb.gpu_uuid)
        if i is not None:
            observe(i, float(rb.enforced_w), rb.sample_s, rb.settles_commands)
    return state._replace(
        confirmed_w=confirmed, confirmed_at_s=confirmed_at, pending_w=pending_w, pending_seq=pending_seq
    )


class AlignedReadbacks(NamedTuple):
    """At most one read-back per GPU, aligned with a state's `gpus` (each settles commands)."""

    has: np.ndarray
    """True where the GPU has a read-back."""
    enforced_w: np.ndarray
    sample_s: np.ndarray
    """In controller time, seconds (any value where `has` is False)."""


def record_aligned(state: ApplyState, readbacks: AlignedReadbacks, *, policy: power_policy.PowerPolicy) -> ApplyState:
    """`record` of one read-back per GPU at most, over the arrays at once (the period's telemetry).

    The same decisions as `record(state, readbacks=...)` with those read-backs, one per GPU: each
    GPU's read-back is folded in on its own, so the per-GPU steps of `record` become array steps.
    """
    has, value, t = readbacks
    newer = has & (t >= state.confirmed_at_s)
    confirmed = np.where(newer, value, state.confirmed_w)
    confirmed_at = np.where(newer, t, state.confirmed_at_s)
    pending_seq, pending_w = state.pending_seq, state.pending_w
    with np.errstate(invalid="ignore"):
        landed = (t >= state.pending_issued_s) & (value == pending_w) & (pending_seq != UNKNOWN_COMMAND)
        expired = t > state.pending_deadline_s + policy.clock_skew_margin_s
    settled = has & (pending_seq != NO_COMMAND) & (landed | expired)
    return state._replace(
        confirmed_w=confirmed,
        confirmed_at_s=confirmed_at,
        pending_w=np.where(settled, np.nan, pending_w),
        pending_seq=np.where(settled, NO_COMMAND, pending_seq),
    )


def plan(
    state: ApplyState,
    targets_w: np.ndarray,
    tree: power_tree.PowerTree,
    *,
    now_s: float,
    policy: power_policy.PowerPolicy,
    raise_rates_w_per_s: np.ndarray | None = None,
) -> tuple[ApplyState, CapPlan]:
    """Choose the commands to send now towards `targets_w`, keeping every budget.

    Example: rack budget 1,000 W, GPUs a and b confirmed at 600 W and 400 W (sum 1,000), new targets
    a = 400, b = 600. Plan 1 sends a -> 400 (phase 1); b's raise needs 200 W of slack, and the rack has
    none while a's decrease is unconfirmed (it counts as 600), so b waits. The agent acks a at 400;
    after `record`, plan 2 sees slack 200 and sends b -> 600 (phase 2). Had the ack been lost, a's
    bound would stay 600 until a read-back showed 400 (or any value after the deadline).

    Args:
        state: Current state (after `record` of everything received).
        targets_w: Target cap per GPU, aligned with `state.gpus` (e.g. `power.allocate(...).caps_w`).
        tree: The budget tree in force.
        now_s: Controller time, seconds; commands get deadline now + `policy.command_ttl_s`.
        policy: Command lifetime and hysteresis step.
        raise_rates_w_per_s: Per GPU, the rate an increase may land at (0: at once); decreases are
            always sent without one. None: every increase at once.

    Returns:
        (new state with the sent commands pending, the plan).
    """
    n = len(state.gpus)
    target = np.minimum(np.maximum(np.floor(np.asarray(targets_w, dtype=np.float64)), state.min_w), state.max_w)
    node_of = tree.index.node_of_name
    node_idx = np.array([node_of[g.node_id] for g in state.gpus], dtype=np.intp)
    bound = may_be_in_force_w(state)
    free = state.pending_seq == NO_COMMAND
    # Phase 1: decreases never raise a bound, so they always go out.
    lower = free & (target < bound)
    raise_ok, granted, over = _raises(state, target, bound, lower, free, tree, node_idx, policy)
    new_limit = np.where(lower, target, np.where(raise_ok, np.floor(bound + granted), np.nan))
    send = lower | raise_ok
    seqs = np.full(n, NO_COMMAND, dtype=np.int64)
    seqs[send] = state.next_seq + np.arange(int(send.sum()))
    deadline = now_s + policy.command_ttl_s
    rates = np.zeros(n) if raise_rates_w_per_s is None else np.asarray(raise_rates_w_per_s, dtype=np.float64)
    commands = _commands(state, send, seqs, new_limit, lower, np.where(lower, 0.0, rates), deadline)
    new_state = state._replace(
        next_seq=state.next_seq + int(send.sum()),
        pending_w=np.where(send, new_limit, state.pending_w),
        pending_seq=np.where(send, seqs, state.pending_seq),
        pending_issued_s=np.where(send, now_s, state.pending_issued_s),
        pending_deadline_s=np.where(send, deadline, state.pending_deadline_s),
    )
    decreases = tuple(c for c in commands if c.phase == 1)
    increases = tuple(c for c in commands if c.phase == 2)
    waiting = int(((target != bound) & ~send).sum())
    reason = f"{len(decreases)} decreases, {len(increases)} increases sent; {waiting} waiting"
    if over:
        reason += f"; over budget until decreases are confirmed: {', '.join(over)}"
    return new_state, CapPlan(
        decreases=decreases, increases=increases, waiting=waiting, over_budget=tuple(over), reason=reason
    )


def _raises(
    state: ApplyState,
    target: np.ndarray,
    bound: np.ndarray,
    lower: np.ndarray,
    free: np.ndarray,
    tree: power_tree.PowerTree,
    node_idx: np.ndarray,
    policy: power_policy.PowerPolicy,
) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """Phase 2: (which GPUs get a raise, the watts each is granted, the domains over budget now).

    Raises go only into slack computed from the bounds, in which every unconfirmed decrease
    (including the ones sent just now) still counts at its old value.
    """
    n = len(state.gpus)
    budgets = tree.index.level_budgets()
    sums = tree.index.sums(node_idx, bound)
    over: list[str] = []
    if any(np.any(s > b) for s, b in zip(sums, budgets, strict=True)):
        over = tree.index.over_budget(node_idx, bound)
    wanted = np.where(free & (target > bound), target - bound, 0.0)
    if policy.strict_two_phase:
        confirmed = np.where(np.isnan(state.confirmed_w), state.max_w, state.confirmed_w)
        if lower.any() or np.any((state.pending_seq != NO_COMMAND) & (state.pending_w < confirmed)):
            wanted = np.zeros(n)
    granted = np.zeros(n)
    if wanted.any():
        slack = [np.maximum(b - s, 0.0) for b, s in zip(budgets, sums, strict=True)]
        granted = power.hierarchical_grant(wanted, slack, node_idx, tree.index)
    # A partial raise is still a raise; skip only the ones too small to matter.
    raise_ok = (wanted > 0) & ((granted >= wanted) | (granted >= policy.min_change_w))
    return raise_ok, granted, over


def _commands(
    state: ApplyState,
    send: np.ndarray,
    seqs: np.ndarray,
    new_limit: np.ndarray,
    lower: np.ndarray,
    rates: np.ndarray,
    deadline_s: float,
) -> list[CapCommand]:
    """One `CapCommand` per GPU to send, in GPU order."""
    # Plain Python lists: indexing numpy scalars one by one would dominate at 16k GPUs.
    sent = np.flatnonzero(send)
    prefix = state.command_id(0)[:-1]
    gpus = state.gpus
    return [
        CapCommand(
            command_id=f"{prefix}{seq}",
            node_id=gpus[i].node_id,
            gpu_uuid=gpus[i].gpu_uuid,
            limit_w=limit,
            deadline_s=deadline_s,
            phase=1 if is_decrease else 2,
            max_raise_w_per_s=rate,
        )
        for i, seq, limit, is_decrease, rate in zip(
            sent.tolist(),
            seqs[sent].tolist(),
            new_limit[sent].astype(np.int64).tolist(),
            lower[sent].tolist(),
            rates[sent].tolist(),
            strict=True,
        )
    ]
