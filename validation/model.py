"""The validation suite's value types: verdicts, evidence and per-check results.

Everything here is plain data with no torch dependency, so judges, the report writer and the CLI's
``--help`` work on a machine without the ``rasd[validate]`` extra.

Verdicts, worst first (``Verdict.rank``; a check's and a suite's verdict is the worst of its parts):

- ``fail``: a hardware fault was observed reproducibly (or a hard RMA flag is set).
- ``suspect``: a one-off deviation, or a deviation that cannot be attributed (two peers disagree and
  there is no golden to break the tie). The controller retests longer and sets a watch flag.
- ``software_drift``: every GPU of the node agrees with its peers and disagrees with the golden in the
  same way: the software stack or the golden changed. Alert; do not quarantine.
- ``incomplete``: the suite's time budget ran out before the check finished what it planned, and
  nothing bad was seen in the part that ran.
- ``pass``: the check ran and saw nothing wrong.
- ``skipped``: the check could not mean anything here (no telemetry source, a single rank for a
  collective); ``reason`` says why. A skip does not turn a passing suite into a failing one.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Iterable, Mapping, Sequence
from typing import Any


class Verdict(enum.StrEnum):
    """Outcome of a check on one GPU, of a whole check, or of a suite."""

    PASS = "pass"
    FAIL = "fail"
    SUSPECT = "suspect"
    SOFTWARE_DRIFT = "software_drift"
    INCOMPLETE = "incomplete"
    SKIPPED = "skipped"

    @property
    def rank(self) -> int:
        """Severity order used to combine verdicts; higher is worse."""
        return _RANK[self]


_RANK = {
    Verdict.SKIPPED: 0,
    Verdict.PASS: 1,
    Verdict.INCOMPLETE: 2,
    Verdict.SOFTWARE_DRIFT: 3,
    Verdict.SUSPECT: 4,
    Verdict.FAIL: 5,
}


def worst(verdicts: Iterable[Verdict]) -> Verdict:
    """The most severe verdict of ``verdicts``; ``skipped`` for an empty sequence."""
    return max(verdicts, key=lambda v: v.rank, default=Verdict.SKIPPED)


def classify_deviations(events: int, *, persistent: bool) -> Verdict:
    """Turn "how often did the repeated work deviate" into a verdict.

    The escalation policy in DESIGN §5: a reproducible deviation is a hardware failure; a one-off is a
    suspect that the controller retests longer and watches. Reproducible means two or more deviating
    runs, or a case that deviated in every one of its repeats (``persistent``).

    Example: 0 events → pass; 1 of 3 repeats → suspect; 2 events → fail; 1 of 1 repeat → fail.

    Args:
        events: number of deviating runs (a run = one repeat of one case, or one stress iteration).
        persistent: some case deviated in every repeat it had.
    """
    if events <= 0:
        return Verdict.PASS
    if persistent or events >= 2:
        return Verdict.FAIL
    return Verdict.SUSPECT


@dataclasses.dataclass(frozen=True)
class Evidence:
    """One observed deviation, precise enough to find it again.

    Attributes:
        case: what was being computed, e.g. ``"fp32 64x48x80 repeat 1"`` or ``"address-in-address"``.
        location: where, e.g. ``"element (3, 17) bit 22"`` or ``"word 1234 (byte offset 0x2690) bit 5"``.
        expected: the value or bit pattern that should have been there.
        got: what was there.
        note: a short interpretation ("value is the address of word 7: address aliasing").
    """

    case: str
    location: str
    expected: str
    got: str
    note: str = ""

    def to_json(self) -> dict[str, str]:
        """Plain-dict form for the JSON report."""
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class GpuResult:
    """A check's verdict for one GPU (or one logical CPU slot)."""

    gpu: int
    verdict: Verdict
    reason: str
    evidence: tuple[Evidence, ...] = ()
    duration_s: float = 0.0

    def to_json(self) -> dict[str, Any]:
        """Plain-dict form for the JSON report."""
        return {
            "gpu": self.gpu,
            "verdict": self.verdict.value,
            "reason": self.reason,
            "duration_s": round(self.duration_s, 4),
            "evidence": [e.to_json() for e in self.evidence],
        }


@dataclasses.dataclass(frozen=True)
class CheckResult:
    """What ``judge(raw, spec)`` returns: one check's verdict over all GPUs it covered.

    ``verdict`` is the worst per-GPU verdict unless the check's verdict is node-wide (a V0 skip, a
    budget cut before any GPU ran).
    """

    check: str
    title: str
    verdict: Verdict
    reason: str
    gpus: tuple[GpuResult, ...] = ()
    duration_s: float = 0.0
    details: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def failures(self) -> tuple[GpuResult, ...]:
        """Per-GPU results that are not pass or skipped."""
        return tuple(g for g in self.gpus if g.verdict.rank > Verdict.PASS.rank)

    def to_json(self) -> dict[str, Any]:
        """Plain-dict form for the JSON report."""
        return {
            "check": self.check,
            "title": self.title,
            "verdict": self.verdict.value,
            "reason": self.reason,
            "duration_s": round(self.duration_s, 4),
            "details": dict(self.details),
            "gpus": [g.to_json() for g in self.gpus],
        }


def combine(
    check: str,
    title: str,
    per_gpu: Sequence[GpuResult],
    *,
    incomplete: str | None = None,
    duration_s: float = 0.0,
    details: Mapping[str, Any] | None = None,
) -> CheckResult:
    """Build a check's result from per-GPU results.

    Args:
        check: check id, e.g. ``"V1"``.
        title: human name of the check.
        per_gpu: one result per GPU covered.
        incomplete: why the check stopped early (e.g. ``"budget"``), or None if it finished. A check
            that stopped early and saw nothing worse than pass is ``incomplete``, never ``pass``.
        duration_s: wall time of the whole check, as measured by run().
        details: extra JSON-able facts for the report (sizes, key, thresholds).
    """
    verdict = worst(g.verdict for g in per_gpu)
    if incomplete is not None and verdict.rank < Verdict.INCOMPLETE.rank:
        verdict = Verdict.INCOMPLETE
    bad = [g for g in per_gpu if g.verdict.rank > Verdict.INCOMPLETE.rank]
    if bad:
        reason = "; ".join(f"gpu {g.gpu}: {g.reason}" for g in bad)
    elif incomplete is not None:
        reason = f"incomplete: {incomplete}"
    elif not per_gpu:
        reason = "no GPU was checked"
    else:
        reason = per_gpu[0].reason if len({g.reason for g in per_gpu}) == 1 else "all GPUs passed"
    return CheckResult(
        check=check,
        title=title,
        verdict=verdict,
        reason=reason,
        gpus=tuple(per_gpu),
        duration_s=duration_s,
        details=dict(details or {}),
    )
