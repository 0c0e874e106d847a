"""Job-start smoothing: a GPU power-smoothing profile from a job's first moment until the swing plan takes over.

The job-start cap ramp (`core.power.ramp`) only shapes the envelope: under the rising cap the step's
own compute/communication swing (675 W <-> 125 W per GPU, all ranks in phase) still moves the
aggregate by the whole swing within 0.1 s, and the swing plan (`core.power.swing.plan_smoothing`) engages
only once the detector has seen that swing for a window. This module owns one decision per control
period that closes the gap, with the GPUs' power-smoothing firmware (GB200-class):

- **Engage.** A GPU the cap ramp saw start (parked, now busy) that has smoothing hardware gets the
  *start profile* at once: ramp-up and ramp-down rate = its share of the aggregate ramp limit, and
  the lowest floor the firmware takes (`floor_min_pct`). The floor needs no more: a draw that may
  fall no faster than its share cannot drop through the trough in one step, so the ramp-down rate
  alone fills the trough as deep as the ramp limit requires (the draw falls r x t over a
  communication phase of t seconds), and a higher floor would only add energy.
- **Share.** Every GPU's draw moves no faster than max(its cap's slew, its firmware rate), so with
  N GPUs under a start profile each gets `(ramp_limit_w_per_s - reserve) / N`, and the cap ramp is
  told to keep its own raises within the same share (`reserved_w_per_s`). When more GPUs start, N
  grows and every start profile is sent again at the lower rate.
- **Canaries.** A profile masks the swing the detector needs to size the swing plan (the draw no
  longer reaches the trough). So among the GPUs starting together `job_start_canary_gpus`, spread
  evenly over the given order (sorted by node: one per node first), keep no profile: their draw is
  the unmanaged swing, and the detector reads their sum, scaled to the whole job. A canary's draw
  can move by at most its maximum limit in any window, so each reserves `max_w` of the limit (at
  most half the limit is reserved; fewer canaries when that does not fit).
- **Hand-over.** Once the detected-swing plan is active, every start profile is forgotten without a
  command: the plan's profile (sent to every GPU with the hardware, canaries included) replaces it
  on the GPU, so there is no moment without a profile and no command that switches one off.
- **Release.** A GPU whose cap ramp has ended gets its profile switched off after
  `job_start_smoothing_release_s` with no plan taking over (a steady job does not pay for a floor
  and ramps forever), unless the canaries show an unmanaged swing larger than the ramp limit allows
  in one window: then the start profile is what holds the limit, and it stays until the job ends.
  A GPU parked again (its job ended: idle for `job_start_idle_s`) is released too; until then its
  ramp-down rate softens the end of the job.

A profile never raises a cap: the firmware's floor is clamped by the enforced limit, so every
budget the caps keep still holds (DESIGN.md §2.1).

**Without smoothing hardware** (H100-class, emulated smoothing) no start profile engages, and the
swing under the rising cap is not held until the detected plan's trough filler is in force. The
node-side trough-filler hook holds a floor but has no ramp rate, so every compute phase still
starts with a step change; to keep that within a GPU's share the floor would have to sit within
share x 1 s of the step's peak, and the peak is not known at the start (under the cap ramp it is the
rising cap; after it, the job's demand, which only the detector measures). A floor tracking the cap
would also move with every raise, adding its own rise to the cap's in the same window.

Pure: no I/O, no logging, no clock reads; `now_s` comes in, commands go out as data.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from rasd.controller.core.power import policy as power_policy

RAMP_WINDOW_S = 1.0
"""The window the aggregate ramp is measured over (`power_ramp.RAMP_WINDOW_S`)."""

MAX_CANARY_RESERVE = 0.5
"""At most this share of the ramp limit is reserved for canaries."""

RESEND_GROWTH = 0.1
"""A start profile is sent again at a higher rate only when the share grew by at least this fraction."""


@dataclasses.dataclass(frozen=True)
class StartState:
    """What the start smoothing remembers between periods (in memory)."""

    rate_w_per_s: Mapping[str, float] = dataclasses.field(default_factory=dict)
    """GPU -> the ramp rate of the start profile it carries (as sent)."""
    settled_since_s: Mapping[str, float] = dataclasses.field(default_factory=dict)
    """GPU under a start profile -> the first period its cap ramp was seen over (the release timer)."""
    canaries: frozenset[str] = frozenset()
    """GPUs of the current start kept without a profile, so the detector sees the unmanaged swing."""
    canary_reserve_w_per_s: float = 0.0
    """Their summed maximum limits: the part of the ramp limit their free draw may use, W/s."""

    def active(self) -> bool:
        """True while any GPU carries a start profile."""
        return bool(self.rate_w_per_s)

    def to_mapping(self) -> dict[str, Any]:
        """A JSON-friendly form (the power loop persists it: a restarted controller knows the profiles it left on)."""
        return {
            "rate_w_per_s": {gpu: float(rate) for gpu, rate in self.rate_w_per_s.items()},
            "settled_since_s": {gpu: float(at) for gpu, at in self.settled_since_s.items()},
            "canaries": sorted(self.canaries),
            "canary_reserve_w_per_s": float(self.canary_reserve_w_per_s),
        }

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> StartState:
        """Rebuild from `to_mapping` output.

        Raises:
            ValueError: a field is missing or not of its type (naming the field).
        """

        def rates(name: str) -> dict[str, float]:
            value = data.get(name, {})
            if not isinstance(value, Mapping):
                raise ValueError(f"start smoothing state: {name} is not a mapping")
            try:
                return {str(gpu): float(rate) for gpu, rate in value.items()}
            except (TypeError, ValueError):
                raise ValueError(f"start smoothing state: {name} holds a value that is not a number") from None

        canaries = data.get("canaries", [])
        if not isinstance(canaries, list | tuple):
            raise ValueError("start smoothing state: canaries is not a list")
        try:
            reserve = float(data.get("canary_reserve_w_per_s", 0.0))
        except (TypeError, ValueError):
            raise ValueError("start smoothing state: canary_reserve_w_per_s is not a number") from None
        return cls(
            rate_w_per_s=rates("rate_w_per_s"),
            settled_since_s=rates("settled_since_s"),
            canaries=frozenset(str(gpu) for gpu in canaries),
            canary_reserve_w_per_s=reserve,
        )


@dataclasses.dataclass(frozen=True)
class StartDecision:
    """One period's result: the new state and the commands (as data) the loop sends."""

    state: StartState
    apply_w_per_s: Mapping[str, float]
    """GPU -> the ramp rate of the start profile to send now (new, or a rate that changed)."""
    release: tuple[str, ...]
    """GPUs whose start profile is switched off now."""
    handed_over: int = 0
    """GPUs whose start profile the detected-swing plan replaced this period (no command)."""
    reason: str = ""


def reserved_w_per_s(state: StartState, ramping: frozenset[str] | set[str]) -> float:
    """What the cap ramp must leave of the aggregate limit, W/s.

    The canaries' reserve, and the rates of the start profiles on GPUs whose cap ramp is over (their
    draw still moves at that rate).
    """
    steady = sum(rate for gpu, rate in state.rate_w_per_s.items() if gpu not in ramping)
    return state.canary_reserve_w_per_s + steady


def _pick_canaries(candidates: Sequence[int], count: int) -> list[int]:
    """`count` of the candidate indices, evenly spread over them (the order is by node)."""
    m = len(candidates)
    count = min(count, m)
    return [candidates[int((j + 0.5) * m / count)] for j in range(count)] if count else []


def decide(
    state: StartState,
    *,
    gpu_uuids: Sequence[str],
    supported: np.ndarray,
    started: np.ndarray,
    starting: np.ndarray,
    parked: np.ndarray,
    max_w: np.ndarray,
    detected_active: bool,
    unmanaged_p2p_w: float | None,
    now_s: float,
    policy: power_policy.PowerPolicy,
) -> StartDecision:
    """The start profiles for one period.

    Example: 1,024 GPUs with smoothing hardware (1,000 W maximum) start together, ramp limit
    150,000 W/s, 8 canaries: the canaries reserve 8,000 W/s, and the other 1,016 GPUs get a profile
    with ramp-up and ramp-down rates of 142,000 / 1,016 = 139.8 W/s and a 20 % floor.

    Args:
        state: The previous period's state.
        gpu_uuids: The GPUs, in a stable order sorted by node (canaries are spread over it).
        supported: True where the GPU has power-smoothing hardware (read only where `started` is).
        started: True where the cap ramp saw the GPU start its job this period (parked, now busy).
        starting: True where the GPU is busy and still under a job-start ceiling (its cap ramp runs).
        parked: True where the GPU is parked again (idle for `job_start_idle_s`: its job ended).
        max_w: Each GPU's maximum power limit, W (a canary's reserve).
        detected_active: The detected-swing plan is in force (it replaces the start profiles).
        unmanaged_p2p_w: The unmanaged aggregate peak-to-peak swing the detector last estimated from
            the canaries, W; None when it has not measured one.
        now_s: The period's time.
        policy: `ramp_limit_w_per_s`, `job_start_ramp_enabled`, `job_start_smoothing_enabled`,
            `job_start_canary_gpus`, `job_start_smoothing_release_s`.

    Returns:
        The decision. The rates of all start profiles after it sum to at most
        `ramp_limit_w_per_s - canary reserve`.
    """
    index = {gpu: i for i, gpu in enumerate(gpu_uuids)}
    held = {g: r for g, r in state.rate_w_per_s.items() if g in index}  # GPUs gone from the inventory drop out
    if not (policy.job_start_ramp_enabled and policy.job_start_smoothing_enabled):
        return StartDecision(StartState(), {}, tuple(held), reason="start smoothing is off")
    if detected_active:
        return StartDecision(StartState(), {}, (), handed_over=len(held), reason="the swing plan took over")
    limit = policy.ramp_limit_w_per_s
    release, settled = _releases(state, held, index, parked, starting, unmanaged_p2p_w, now_s, policy)
    for gpu in release:
        held.pop(gpu, None)
        settled.pop(gpu, None)
    canaries = frozenset(g for g in state.canaries if g in index and not parked[index[g]])
    reserve = sum(float(max_w[index[g]]) for g in canaries)
    new = [i for i in np.flatnonzero(np.asarray(started, dtype=bool) & np.asarray(supported, dtype=bool))
           if gpu_uuids[i] not in held and gpu_uuids[i] not in canaries]  # fmt: skip
    if new and not canaries:
        canaries, reserve = _new_canaries(new, gpu_uuids, max_w, reserve, policy)
        new = [i for i in new if gpu_uuids[i] not in canaries]
    profiled = list(held) + [gpu_uuids[i] for i in new]
    if not profiled:
        return StartDecision(StartState(), {}, tuple(release), reason="no GPU under a start profile")
    share = max(limit - reserve, 0.0) / len(profiled)
    # A rate above the share must come down now; one below it may stay (the sum only gets smaller)
    # unless the share has grown by a tenth (a release left more to share): no command for a crumb.
    rates = {
        gpu: share if gpu not in held or held[gpu] > share or held[gpu] < share / (1.0 + RESEND_GROWTH) else held[gpu]
        for gpu in profiled
    }
    apply = {gpu: rate for gpu, rate in rates.items() if held.get(gpu) != rate}
    return StartDecision(
        StartState(
            rate_w_per_s=rates,
            settled_since_s=settled,
            canaries=canaries,
            canary_reserve_w_per_s=reserve,
        ),
        apply,
        tuple(release),
        reason=f"{len(profiled)} GPU(s) under a start profile at {share:.1f} W/s, {len(canaries)} canary GPU(s)",
    )


def _releases(
    state: StartState,
    held: Mapping[str, float],
    index: Mapping[str, int],
    parked: np.ndarray,
    starting: np.ndarray,
    unmanaged_p2p_w: float | None,
    now_s: float,
    policy: power_policy.PowerPolicy,
) -> tuple[list[str], dict[str, float]]:
    """(the held GPUs whose start profile goes off now, GPU -> since when its cap ramp is over).

    A GPU parked again is released at once; one whose cap ramp has been over for
    `job_start_smoothing_release_s` too, unless the canaries show a swing larger than the ramp limit
    allows in one window (the start profile is then what holds the limit).
    """
    release = []
    settled = {}
    timed_out = []
    for gpu in held:
        i = index[gpu]
        if parked[i]:
            release.append(gpu)
            continue
        if starting[i]:
            continue
        since = state.settled_since_s.get(gpu, now_s)
        settled[gpu] = since
        if now_s - since >= policy.job_start_smoothing_release_s:
            timed_out.append(gpu)
    swing_too_big = unmanaged_p2p_w is not None and unmanaged_p2p_w > policy.ramp_limit_w_per_s * RAMP_WINDOW_S
    if not swing_too_big:
        release.extend(timed_out)
    return release, settled


def _new_canaries(
    new: Sequence[int], gpu_uuids: Sequence[str], max_w: np.ndarray, reserve: float, policy: power_policy.PowerPolicy
) -> tuple[frozenset[str], float]:
    """(the canaries among the GPUs starting together, the reserve with theirs), W/s.

    At most half the GPUs starting together, and at most half the limit (`MAX_CANARY_RESERVE`).
    """
    wanted = min(int(policy.job_start_canary_gpus), len(new) // 2)
    picked = []
    for i in _pick_canaries(new, wanted):
        if reserve + float(max_w[i]) > MAX_CANARY_RESERVE * policy.ramp_limit_w_per_s:
            break
        picked.append(i)
        reserve += float(max_w[i])
    return frozenset(gpu_uuids[i] for i in picked), reserve
