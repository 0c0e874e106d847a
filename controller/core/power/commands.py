"""The power period's effects as data: what the loop must send, and what it should log.

This module owns the value types `core.power.period.step` returns for the edge to carry out: one
SetPowerCap per node (`SetCaps`), the power-smoothing profiles (`SetSmoothing`, of the detected-swing
plan or a job-start profile), the trough-filler hook (`SetTroughFiller`), the node power limits a BMC
is asked for (`SetNodeLimit`), and the log lines a decision produced (`Note`). The edge turns the
commands into wire messages (`rasd.controller.wire.power`) and gives each one its id and issue time;
the core never sees a wire type.

Pure: no I/O, no logging, no clock reads.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from rasd.controller.core.power import apply as power_apply


@dataclasses.dataclass(frozen=True)
class SetCaps:
    """One node's share of a period's cap plan: a single SetPowerCap, decreases first."""

    node_id: str
    limits: tuple[power_apply.CapCommand, ...]
    """The GPUs' new limits; the first one's id and deadline name the whole command."""
    reason: str


@dataclasses.dataclass(frozen=True)
class SetSmoothing:
    """A GPU power-smoothing profile on (floor, ramp rates) or off, on some of a node's GPUs."""

    node_id: str
    gpu_uuids: tuple[str, ...]
    enabled: bool
    floor_pct: float = 0.0
    ramp_up_w_per_s: float = 0.0
    ramp_down_w_per_s: float = 0.0
    reason: str = ""
    deadline_s: float = 0.0
    """The agent refuses it after this, controller time (s)."""
    job_start: bool = False
    """A job-start profile (`core.power.start_smoothing`) rather than the detected-swing plan's."""


@dataclasses.dataclass(frozen=True)
class SetTroughFiller:
    """The node-side trough-filler hook on (hold `floor_w`) or off (ramp down at `ramp_down_w_per_s`)."""

    node_id: str
    gpu_uuids: tuple[str, ...]
    enabled: bool
    floor_w: float
    ramp_down_w_per_s: float
    reason: str
    deadline_s: float


@dataclasses.dataclass(frozen=True)
class SetNodeLimit:
    """A node power limit to ask the node's BMC for (None: lift it)."""

    node_id: str
    limit_w: int | None
    targets_w: Mapping[str, int]
    """The GPU targets the limit covers (they sum to it); empty when lifting."""


@dataclasses.dataclass(frozen=True)
class Note:
    """A log line a decision produced; the edge logs it (the core never logs)."""

    level: str
    """"info", "warning" or "error"."""
    event: str
    """snake_case past tense, as the edge's other log events."""
    fields: Mapping[str, Any] = dataclasses.field(default_factory=dict)


NodeCommand = SetSmoothing | SetTroughFiller
"""A smoothing command for one node."""


@dataclasses.dataclass(frozen=True)
class Commands:
    """Everything one period (or an operator's change) asks the edge to do, in the order to do it."""

    caps: power_apply.CapPlan | None = None
    """The period's cap plan (None: no GPUs to manage); `cap_commands` carries it per node."""
    cap_commands: tuple[SetCaps, ...] = ()
    smoothing: tuple[NodeCommand, ...] = ()
    """The detected-swing plan's commands (on, resent, or off)."""
    start_profiles: tuple[SetSmoothing, ...] = ()
    """Job-start profiles on and off."""
    node_limits: tuple[SetNodeLimit, ...] = ()
    track_gpus: frozenset[str] | None = None
    """The GPUs the power window sums on their own from now on (the canaries); None: no change."""
    notes: tuple[Note, ...] = ()


def cap_commands(plan: power_apply.CapPlan) -> tuple[SetCaps, ...]:
    """A cap plan as one SetCaps per node, each with its decreases first (they were admitted first)."""
    groups: dict[str, list[power_apply.CapCommand]] = {}
    for command in (*plan.decreases, *plan.increases):
        groups.setdefault(command.node_id, []).append(command)
    return tuple(SetCaps(node_id, tuple(limits), plan.reason) for node_id, limits in groups.items())
