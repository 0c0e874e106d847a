"""What to do about a straggler: notify, raise its cap, validate it, quarantine it, by policy (issue #40 item 3).

A GPU named a straggler (`rasd.controller.core.straggler`) opens a *case* that climbs these rungs, one at
a time, while the GPU keeps lagging:

=============  ==========================================================  ============================
rung           entered when                                                effect
=============  ==========================================================  ============================
NOTIFIED       the verdict (always)                                        Notify
CAP_RAISED     the verdict, if its evidence says power-throttled and the   Notify + RaiseCap
               power budget has headroom for the GPU (else a refusal in
               the Notify's reason, and the case stays NOTIFIED)
VALIDATING     ``steps_per_rung`` steps later, still lagging (mean lag on   Validate
               the rung at least the scorer's allowance)
QUARANTINED    ``steps_per_rung`` steps after validation, still lagging    Quarantine
=============  ==========================================================  ============================

A rung turned off in the policy is skipped; with none left above, the case stays where it is and does
nothing more. Steps count only where the GPU took part (a quarantined GPU sends no edges: its case
waits). A case *clears* (``Clear``: the shell resets its score and removes its metric series) when the
GPU's lag stays under the allowance for ``clear_after_quiet_steps`` steps in a row, or when the ladder
releases it (`on_released`).

A whole job that slows down is never named (the verdict compares each GPU with the job's median), so
it opens no case and gets no action: nothing here acts without a verdict.

Validate and Quarantine go through the repair ladder (the shell hands them in as health events), so
the disruption budget, the audit trail and the ladder's idempotency apply to them; RaiseCap must go
through the power loop's budget (`PowerRoom.headroom_w` is what the budget allows for this GPU; the
loop serves the raise as a floor within every budget, `rasd.controller.core.power.floors`).

Pure: values in, values out; ``now_s`` is passed in.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping

from rasd.controller.core import straggler

POWER_THROTTLED = ("clock event: hardware power brake",)
"""Evidence words that say the GPU is held back by power (the verdict's `straggler.clock_signals`)."""


class Rung(enum.StrEnum):
    """Where a straggler's case is (table in the module docstring)."""

    NOTIFIED = "notified"
    CAP_RAISED = "cap_raised"
    VALIDATING = "validating"
    QUARANTINED = "quarantined"


@dataclasses.dataclass(frozen=True)
class ActionPolicy:
    """Which rungs run and how many steps lie between them (controller.toml's ``[stragglers.actions]``)."""

    raise_cap: bool = True
    """Raise a power-throttled straggler's cap when the budget allows."""
    validate: bool = True
    """Run the validation suite on a straggler that still lags after ``steps_per_rung`` steps."""
    quarantine: bool = True
    """Quarantine a straggler that still lags ``steps_per_rung`` steps after its validation."""
    steps_per_rung: int = 5
    """Steps the GPU takes part in on one rung before the next (about 10 s at a 2 s step)."""
    clear_after_quiet_steps: int = 10
    """Steps in a row with its lag under the allowance that clear a case."""
    raise_cap_w: float = 50.0
    """The most one raise adds to the GPU's cap, W (less when the budget has less headroom)."""
    min_raise_w: float = 10.0
    """A raise smaller than this is no raise: the budget refuses it."""

    def __post_init__(self) -> None:
        """Reject values that cannot mean anything, naming the field."""
        for name in ("steps_per_rung", "clear_after_quiet_steps"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}: must be >= 1, got {getattr(self, name)}")
        for name in ("raise_cap_w", "min_raise_w"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name}: must be > 0, got {getattr(self, name)}")


@dataclasses.dataclass(frozen=True)
class PowerRoom:
    """What the power loop says about one GPU: its cap, its maximum, and the headroom its budget allows."""

    cap_w: float
    max_w: float
    headroom_w: float
    """Watts the GPU's budget domains could give it now without exceeding any budget."""
    capped: bool = False
    """The power loop judged it capped (SW power cap clock reason, or drawing within a few % of its cap)."""


@dataclasses.dataclass(frozen=True)
class Case:
    """One straggler's case: its rung and what the steps on that rung showed."""

    gpu_uuid: str
    node_id: str
    rung: Rung
    opened_s: float
    rung_s: float
    """When it reached its rung."""
    steps_on_rung: int = 0
    lag_sum_on_rung_s: float = 0.0
    quiet_steps: int = 0
    """Steps in a row with its lag under the allowance."""
    last_action: str = ""
    """The last effect's reason, one sentence (what `rasctl get stragglers` shows)."""


@dataclasses.dataclass(frozen=True)
class Effect:
    """Something the shell does for a case; `kind` says what."""

    kind: str
    """"notify", "raise_cap", "validate", "quarantine" or "clear"; a hung job's (`core.stall`): "stall", "restart"."""
    gpu_uuid: str
    node_id: str
    reason: str
    to_w: float | None = None
    """The new cap of a "raise_cap", W."""


Cases = Mapping[str, Case]


def open_case(
    cases: Cases,
    verdict: straggler.Verdict,
    node_id: str,
    *,
    now_s: float,
    policy: ActionPolicy,
    power: PowerRoom | None = None,
) -> tuple[dict[str, Case], tuple[Effect, ...]]:
    """A new suspect: notify, and raise its cap when its evidence says power-throttled and the budget allows.

    Example: a verdict naming "clock event: hardware power brake", power headroom 30 W, cap 600 W of
    700 W → Notify and RaiseCap to 630 W, rung CAP_RAISED; with 5 W of headroom → a Notify that says the
    budget refused the raise, rung NOTIFIED. A GPU with an open case is not opened again.
    """
    out = dict(cases)
    if verdict.gpu_uuid in out:
        return out, ()
    gpu = verdict.gpu_uuid
    rung, raise_to_w, why = Rung.NOTIFIED, None, ""
    throttled = any(word in verdict.reason for word in POWER_THROTTLED) or (power is not None and power.capped)
    if policy.raise_cap and throttled:
        raise_to_w, why = _raise_to(power, policy)
        if raise_to_w is not None:
            rung = Rung.CAP_RAISED
    reason = f"straggler named: {verdict.reason}" + (f"; {why}" if why else "")
    effects = [Effect("notify", gpu, node_id, reason)]
    if raise_to_w is not None:
        effects.append(Effect("raise_cap", gpu, node_id, why, to_w=raise_to_w))
    out[gpu] = Case(gpu, node_id, rung, now_s, now_s, last_action=reason)
    return out, tuple(effects)


def _raise_to(power: PowerRoom | None, policy: ActionPolicy) -> tuple[float | None, str]:
    """The cap to raise to, or None with the budget's refusal."""
    if power is None:
        return None, "cap not raised: the power budget's headroom for this GPU is not known here"
    room_w = min(policy.raise_cap_w, power.headroom_w, power.max_w - power.cap_w)
    if room_w < policy.min_raise_w:
        return None, (
            f"cap not raised: the budget allows {max(0.0, room_w):.0f} W (cap {power.cap_w:.0f} W of "
            f"{power.max_w:.0f} W, headroom {power.headroom_w:.0f} W), under {policy.min_raise_w:.0f} W"
        )
    to_w = power.cap_w + room_w
    return to_w, f"power-throttled: cap raised {power.cap_w:.0f} → {to_w:.0f} W within the budget"


def on_step(
    cases: Cases,
    lags_s: Mapping[str, float],
    *,
    now_s: float,
    policy: ActionPolicy,
    allowance_s: float,
) -> tuple[dict[str, Case], tuple[Effect, ...]]:
    """One judged step's lags (GPU → lag behind the job's median edge, s): climb, clear, or wait.

    A case whose GPU is absent from the step (quarantined, idle) is unchanged.
    """
    out = dict(cases)
    effects: list[Effect] = []
    for gpu, case in cases.items():
        if gpu not in lags_s:
            continue
        lag = lags_s[gpu]
        quiet = case.quiet_steps + 1 if lag < allowance_s else 0
        case = dataclasses.replace(
            case,
            steps_on_rung=case.steps_on_rung + 1,
            lag_sum_on_rung_s=case.lag_sum_on_rung_s + lag,
            quiet_steps=quiet,
        )
        if quiet >= policy.clear_after_quiet_steps:
            del out[gpu]
            effects.append(Effect("clear", gpu, case.node_id, f"its lag stayed under the allowance for {quiet} steps"))
            continue
        out[gpu], climbed = _climb(case, now_s=now_s, policy=policy, allowance_s=allowance_s)
        effects.extend(climbed)
    return out, tuple(effects)


def _climb(case: Case, *, now_s: float, policy: ActionPolicy, allowance_s: float) -> tuple[Case, tuple[Effect, ...]]:
    """The case's next rung when it has spent its steps on this one and still lags."""
    if case.rung is Rung.QUARANTINED or case.steps_on_rung < policy.steps_per_rung:
        return case, ()
    mean_lag_s = case.lag_sum_on_rung_s / case.steps_on_rung
    if mean_lag_s < allowance_s:
        return case, ()
    ladder = [Rung.VALIDATING] if policy.validate and case.rung in (Rung.NOTIFIED, Rung.CAP_RAISED) else []
    if policy.quarantine:
        ladder.append(Rung.QUARANTINED)
    if not ladder:
        return case, ()
    rung = ladder[0]
    after = {Rung.NOTIFIED: "naming", Rung.CAP_RAISED: "its cap was raised", Rung.VALIDATING: "its validation"}
    reason = f"still lags {mean_lag_s * 1000:.0f} ms over {case.steps_on_rung} steps after {after[case.rung]}: " + (
        "run the validation suite" if rung is Rung.VALIDATING else "quarantine it so the scheduler replaces it"
    )
    kind = "validate" if rung is Rung.VALIDATING else "quarantine"
    moved = dataclasses.replace(
        case, rung=rung, rung_s=now_s, steps_on_rung=0, lag_sum_on_rung_s=0.0, quiet_steps=0, last_action=reason
    )
    return moved, (Effect(kind, case.gpu_uuid, case.node_id, reason),)


def on_released(cases: Cases, gpu_uuid: str, *, why: str) -> tuple[dict[str, Case], tuple[Effect, ...]]:
    """The ladder released or repaired the GPU: its case clears (its score starts again)."""
    out = dict(cases)
    case = out.pop(gpu_uuid, None)
    if case is None:
        return out, ()
    return out, (Effect("clear", gpu_uuid, case.node_id, why),)
