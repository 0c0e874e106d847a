"""Silent data corruption: accusation verdicts, suspicion scores and rolling sweeps.

Owns three pure decisions of in-field SDC validation (DESIGN §5, sdc-anchors.md):

1. **What an accusation's validation runs mean** (`judge_accusation`). SDCs are often
   unreproducible, so one failed run proves little and one passing run clears little:

   | runs so far (accusation suite, then the hot retest)  | step                                    |
   |------------------------------------------------------|-----------------------------------------|
   | ≥ ``confirm_fails`` fails among the confirmation runs | REPRODUCIBLE → quarantine, RMA candidate|
   | first conclusive run passes                          | CLEARED: release, watch the GPU         |
   | a fail/suspect, quorum still reachable in            | RERUN the accusation suite              |
   | ``confirm_runs``                                     |                                         |
   | a fail/suspect, quorum out of reach (a one-off)      | HOT_RETEST: the longer hot suite        |
   | hot retest fails                                     | REPRODUCIBLE (a second failure)         |
   | hot retest passes                                    | CLEARED: release, watch the GPU         |
   | hot retest suspect (deviated once more)              | OPERATOR: keep it held, ask a person    |
   | software drift (whole node disagrees the same way)   | DRIFT: release, tell a person           |
   | more unfinished runs than ``retries`` allow           | OPERATOR: keep it held, ask a person    |

   With the defaults (2 of 3): fail, fail → RMA; fail, pass, fail → RMA; fail, pass, pass →
   hot retest; suspect, pass → hot retest (two fails are out of reach in three runs).

   A hot retest that is only suspect is no clearing: the GPU deviated again, once more under the
   longer suite, after a confirmation run that failed or was suspect. That is short of the quorum
   for an RMA, but a GPU that deviates in run after run is what silently corrupts training (the
   field's practice is to over-evict suspects: sdc-anchors.md), so it stays quarantined and a person
   decides, with the runs' verdicts on the ticket.

   A *watch* follows every clearing: for ``watch_s`` (days) a second accusation of the same GPU
   quarantines it at once as an RMA candidate, without another chance to pass.

2. **How suspicious a GPU is** (`suspicion_score`): a decayed sum of its SDC history, so a
   fleet view can rank GPUs for attention. Weights: accusation 1, failed run 3, suspect run 1,
   passing run −0.5 (a pass lowers suspicion but never below zero), drift 0; each decays with
   ``half_life_s``. The score is a ranking aid, not a decision input: decisions follow the table.

3. **Which idle nodes the rolling sweep validates next** (`plan_sweep`): least recently swept
   first, at most ``share_pct`` of the idle nodes per pass and never more than the free disruption
   slots allow (the sweep always leaves room for repairs), with seeds rotated every
   ``seed_rotation_s`` so that repeated sweeps do not test the same data.

Pure: no I/O, no logging, no clock reads; ``now`` is float Unix seconds.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from rasd.controller.core.remediation import policy as policy_mod

VERDICTS = ("pass", "fail", "suspect", "software_drift", "error")
"""What one validation run can say; "error" is a run that did not finish (timeout, refused)."""
HOT_PREFIX = "hot:"
"""Marks a verdict of the hot retest in a ticket's verdict list ("hot:pass")."""
_CONCLUSIVE = frozenset({"pass", "fail", "suspect"})
_WEIGHTS = {"accusation": 1.0, "fail": 3.0, "suspect": 1.0, "pass": -0.5, "software_drift": 0.0, "error": 0.0}


class AccusationStep(enum.StrEnum):
    """What to do after an accusation's latest validation run."""

    RERUN = "rerun"
    HOT_RETEST = "hot_retest"
    REPRODUCIBLE = "reproducible"
    CLEARED = "cleared"
    DRIFT = "drift"
    OPERATOR = "operator"


@dataclasses.dataclass(frozen=True)
class AccusationRules:
    """The numbers `judge_accusation` uses (from ``EscalationPolicy``)."""

    confirm_runs: int = 3
    confirm_fails: int = 2
    retries: int = 1
    """Unfinished runs tolerated (each is re-run) before a person is asked."""


def judge_accusation(verdicts: Sequence[str], rules: AccusationRules) -> tuple[AccusationStep, str]:
    """The next step for an accused GPU, from its runs' verdicts in order (hot ones prefixed). Pure.

    Examples (2 of 3): ``["fail"]`` → RERUN; ``["fail", "fail"]`` → REPRODUCIBLE;
    ``["pass"]`` → CLEARED; ``["fail", "pass", "pass"]`` → HOT_RETEST;
    ``["fail", "pass", "pass", "hot:fail"]`` → REPRODUCIBLE; ``["suspect", "pass"]`` → HOT_RETEST.

    Returns:
        The step and a one-line explanation naming the counts.
    """
    confirm = [v for v in verdicts if not v.startswith(HOT_PREFIX)]
    hot = [v.removeprefix(HOT_PREFIX) for v in verdicts if v.startswith(HOT_PREFIX)]
    for v in (*confirm, *hot):
        if v not in VERDICTS:
            raise ValueError(f"unknown validation verdict {v!r} (known: {', '.join(VERDICTS)})")
    errors = sum(1 for v in (*confirm, *hot) if v == "error")
    if (confirm and confirm[-1] == "software_drift") or (hot and hot[-1] == "software_drift"):
        return AccusationStep.DRIFT, "the whole node disagrees the same way: software drift, not this GPU"
    conclusive = [v for v in confirm if v in _CONCLUSIVE]
    fails = conclusive.count("fail")
    tally = f"{fails} of {len(conclusive)} runs failed"
    if fails >= rules.confirm_fails:
        return AccusationStep.REPRODUCIBLE, f"reproducible: {tally} (needs {rules.confirm_fails})"
    if errors > rules.retries:
        return AccusationStep.OPERATOR, f"{errors} validation runs did not finish: a person decides"
    if hot:
        last = hot[-1]
        if last == "fail":
            return AccusationStep.REPRODUCIBLE, f"failed again under the hot retest after {tally}"
        if last == "pass":
            return AccusationStep.CLEARED, f"one-off: {tally}, hot retest pass"
        if last == "suspect":
            return AccusationStep.OPERATOR, f"deviated again: {tally}, hot retest suspect; a person decides"
        return AccusationStep.HOT_RETEST, "the hot retest did not finish: run it again"
    if not conclusive:
        return AccusationStep.RERUN, "no run finished yet"
    if len(conclusive) == 1 and conclusive[0] == "pass":
        return AccusationStep.CLEARED, "the accusation did not reproduce: the first run passed"
    if fails + (rules.confirm_runs - len(conclusive)) >= rules.confirm_fails:
        return AccusationStep.RERUN, f"{tally}; rerun to confirm ({rules.confirm_fails} of {rules.confirm_runs})"
    return AccusationStep.HOT_RETEST, f"one-off so far: {tally}; a longer hot retest decides"


def watched_until(watch: Mapping[str, float], gpu_uuid: str, *, now_s: float) -> float | None:
    """When the GPU's post-clearing watch ends, or None when it is not watched now."""
    until = watch.get(gpu_uuid)
    return until if until is not None and until > now_s else None


# ------------------------------------------------------------------------------------------------
# Suspicion


@dataclasses.dataclass(frozen=True)
class SdcMark:
    """One thing that happened to a GPU: an accusation or a validation verdict, at a time."""

    kind: str
    """"accusation" or a verdict ("pass", "fail", "suspect", "software_drift", "error")."""
    at: float


def suspicion_score(marks: Iterable[SdcMark], *, now_s: float, half_life_s: float) -> float:
    """A GPU's decayed SDC suspicion, ≥ 0, rounded to 3 places (weights in the module docstring). Pure.

    Example (half-life 30 days): an accusation and a failed run today → 4.0; the same 30 days
    later → 2.0; a single passing run → 0.0.
    """
    if half_life_s <= 0:
        raise ValueError(f"half_life_s must be > 0, got {half_life_s}")
    total = 0.0
    for mark in marks:
        age_s = max(0.0, now_s - mark.at)
        total += _WEIGHTS.get(mark.kind, 0.0) * math.exp(-math.log(2) * age_s / half_life_s)
    return round(max(0.0, total), 3)


# ------------------------------------------------------------------------------------------------
# Rolling sweeps


@dataclasses.dataclass(frozen=True)
class SweepCandidate:
    """A node as the sweep planner sees it."""

    node_id: str
    idle: bool
    """Connected, every GPU idle, no ticket or quarantine, no command in flight."""
    last_swept_at: float | None = None


@dataclasses.dataclass(frozen=True)
class SweepPick:
    """A node to sweep now, with its suite and seed."""

    node_id: str
    sweep_id: str
    """``sweep/<node>/<epoch>``: deterministic, so the run's command id is too."""
    suite: str
    seed: int


def node_is_idle(gpu_draws: Sequence[tuple[float | None, float]], *, idle_power_pct: float) -> bool:
    """True when every GPU (draw W or None when unknown, limit W) draws under ``idle_power_pct``.

    A GPU with no recent sample is not idle: we do not take a node we cannot see.
    """
    if not gpu_draws:
        return False
    return all(draw is not None and limit > 0 and draw < idle_power_pct / 100.0 * limit for draw, limit in gpu_draws)


def sweep_seed(node_id: str, epoch: int) -> int:
    """A 31-bit seed from the node and the rotation epoch (stable across restarts and replicas)."""
    digest = hashlib.sha256(f"{node_id}/{epoch}".encode()).digest()
    return int.from_bytes(digest[:4], "big") & 0x7FFF_FFFF


def plan_sweep(
    candidates: Sequence[SweepCandidate],
    *,
    now_s: float,
    policy: policy_mod.SdcPolicy,
    in_flight: int,
    free_disruption_slots: int,
) -> tuple[SweepPick, ...]:
    """The nodes to sweep in this pass. Pure.

    Example: 100 idle nodes never swept, share 2 %, max 2 concurrent, 8 free slots, reserve 1 →
    the two nodes with the smallest ids (all equally overdue) with seeds of this day's epoch.

    Args:
        candidates: every node, idle or not, with when it was last swept.
        now_s: current time, Unix seconds.
        policy: the sweep settings.
        in_flight: sweeps running now.
        free_disruption_slots: nodes the disruption budget could still take out of service.
    """
    if not policy.sweep_enabled:
        return ()
    idle = [c for c in candidates if c.idle]
    due = [c for c in idle if c.last_swept_at is None or now_s - c.last_swept_at >= policy.sweep_min_interval_s]
    if not due:
        return ()
    share = max(1, math.floor(policy.sweep_share_pct / 100.0 * len(idle)))
    room = min(
        share,
        policy.sweep_max_concurrent - in_flight,
        free_disruption_slots - policy.sweep_reserve_slots,
    )
    if room <= 0:
        return ()
    due.sort(key=lambda c: (-math.inf if c.last_swept_at is None else c.last_swept_at, c.node_id))
    epoch = int(now_s // policy.seed_rotation_s)
    return tuple(
        SweepPick(c.node_id, f"sweep/{c.node_id}/{epoch}", policy.sweep_suite, sweep_seed(c.node_id, epoch))
        for c in due[:room]
    )


def gpu_record(
    marks: Sequence[SdcMark], *, now_s: float, half_life_s: float, watch_until: float | None
) -> dict[str, Any]:
    """The stored per-GPU SDC summary: counts, last verdict, watch and suspicion score."""
    verdicts = [m for m in marks if m.kind != "accusation"]
    return {
        "accusations": sum(1 for m in marks if m.kind == "accusation"),
        "runs": len(verdicts),
        "fails": sum(1 for m in verdicts if m.kind == "fail"),
        "suspects": sum(1 for m in verdicts if m.kind == "suspect"),
        "passes": sum(1 for m in verdicts if m.kind == "pass"),
        "last_verdict": verdicts[-1].kind if verdicts else "",
        "last_at": max((m.at for m in marks), default=None),
        "watch_until": watch_until,
        "suspicion": suspicion_score(marks, now_s=now_s, half_life_s=half_life_s),
        "marks": [[m.kind, m.at] for m in marks],
    }
