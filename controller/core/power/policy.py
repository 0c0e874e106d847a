"""The power manager's tunables: one frozen `PowerPolicy`, built and validated by `from_mapping`.

This module owns the numbers that shape the power loop (control period, hysteresis bands, step limits,
jitter, apply deadlines) and the swing-smoothing policy (target, ramp limit, floor range). It owns no
behaviour beyond validation.

Pure: no I/O, no logging, no clock reads. The controller's main reads the TOML file and passes the
`[power.policy]` table to `PowerPolicy.from_mapping`, which names the offending key on any error.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

from rasd.common.text import echoed


class PolicyError(ValueError):
    """A power policy mapping is invalid; `key` names the offending entry."""

    def __init__(self, key: str, message: str) -> None:
        named = key if len(key) <= 80 and (key.isidentifier() or key == "<toml>") else echoed(key)  # a caller's key
        super().__init__(f"power policy: {named}: {message}")
        self.key = key


@dataclasses.dataclass(frozen=True)
class PowerPolicy:
    """Tunables of the power allocator, the two-phase apply and the swing smoother.

    Percentages are 0-100. Watts are per GPU unless the name says `aggregate`.
    """

    control_period_s: float = 3.0
    """Seconds between allocator runs (Dynamo's leaf loop is 3 s)."""

    lower_band_pct: float = 90.0
    """A GPU drawing less than this % of its cap is a donor: its cap is lowered towards its draw."""

    capped_threshold_pct: float = 97.0
    """A GPU drawing at least this % of its cap (or reporting SW power cap) is capped and asks for more."""

    donor_target_pct: float = 93.5
    """A donor's new cap puts its draw at this % of the cap: inside the hysteresis band, so it stays put."""

    max_step_pct_of_range: float = 50.0
    """Largest voluntary change of one GPU's cap per period, as % of its (max - min) range.

    Budget enforcement (a cut, a higher-priority claim) is not limited by it.
    """

    min_change_w: float = 10.0
    """Raises and donor releases smaller than this are not made (hysteresis against churn)."""

    raise_jitter_pct: float = 20.0
    """Each raise is scaled by a random factor in [1 - jitter, 1] so raises never move in lock-step."""

    marginal_cap_pct: float = 80.0
    """Marginal GPUs (health says suspect) are capped at this % of their max cap; 100 disables it."""

    command_ttl_s: float = 5.0
    """Deadline of a SetPowerCap command; the agent refuses it after this, which lets the planner settle
    an unacknowledged command once a read-back newer than the deadline arrives."""

    strict_two_phase: bool = False
    """True: send no raise anywhere while any decrease is unconfirmed (Slurm's two passes, plus the
    confirmation Slurm lacks). False: a raise goes out as soon as it fits every domain's slack counted
    with unconfirmed decreases as not applied, which keeps the same invariant without letting one
    unreachable node stall every raise in the cluster."""

    clock_skew_margin_s: float = 1.0
    """Extra seconds added to a deadline before a read-back may settle a command (agent clock skew)."""

    swing_target_pct: float = 25.0
    """Managed aggregate peak-to-peak swing as % of the detected (unmanaged) swing: 25 means -75 %."""

    swing_target_w: float | None = None
    """Optional absolute ceiling on the aggregate peak-to-peak swing, W; the tighter target wins."""

    swing_activation_pct_of_tdp: float = 10.0
    """Smoothing starts only when the per-GPU swing exceeds this % of TDP (saves the firmware's
    lifetime budget on workloads that do not swing)."""

    min_coherence: float = 0.5
    """Smoothing starts only when node swings are at least this coherent (0 = independent, 1 = in step)."""

    band_low_hz: float = 0.1
    """Lower edge of the grid-sensitive band that smoothing must attenuate, Hz."""

    band_high_hz: float = 2.0
    """Upper edge of that band, Hz."""

    floor_min_pct: float = 20.0
    """Smallest power floor the firmware accepts, % of TDP (GB200 MPF: 20-90 %)."""

    floor_max_pct: float = 90.0
    """Largest power floor the firmware accepts, % of TDP."""

    ramp_limit_w_per_s: float = 10_000.0
    """Aggregate ramp-rate limit of the managed cluster, W/s, for job start and end."""

    job_start_ramp_enabled: bool = False
    """Park the caps of idle GPUs at `job_start_cap_w` and, when a job starts on them, raise the caps
    at `ramp_limit_w_per_s` shared by the GPUs starting together (`core.power.ramp`). Off by default:
    the compute under a low cap runs slower until the ramp ends (bench/RESULTS.md has the cost)."""

    job_start_cap_w: float | None = None
    """Cap an idle GPU is parked at, W per GPU; None: the GPU's minimum limit (never below it)."""

    job_start_idle_s: float = 10.0
    """A GPU is parked after reporting no utilisation this long (longer than a training step, so a
    communication phase does not count as idle)."""

    job_start_smoothing_enabled: bool = True
    """With the job-start ramp on: GPUs that start a job get a power-smoothing profile at once (ramp
    rates = their share of `ramp_limit_w_per_s`, the firmware's lowest floor) until the swing plan
    takes over or `job_start_smoothing_release_s` passes (`core.power.start_smoothing`). GPUs without
    smoothing hardware get none."""

    job_start_canary_gpus: float = 8.0
    """GPUs of a job start kept without a start profile (at most half of them, each reserving its
    maximum limit of the ramp limit, at most half the limit in all), so that the swing detector sees
    the unmanaged swing through them; 0: none (the swing plan then waits for the release)."""

    job_start_smoothing_release_s: float = 30.0
    """A start profile is switched off this long after its GPU's cap ramp ended unless the swing plan
    took over (or the canaries show a swing above the ramp limit), s."""

    step_time_cost_max_pct: float = 0.5
    """Step-time cost the smoothing ramp-up rate may add, % of the step period."""

    ramp_down_hysteresis_ms: float = 100.0
    """Firmware ramp-down hysteresis, ms: the GPU holds power this long before ramping down."""

    peak_cap_enabled: bool = False
    """Emulation may cap the compute peak to cut the swing (costs step time, so off by default)."""

    trough_filler_enabled: bool = False
    """Emulation may ask the node-side trough-filler hook to hold the floor (costs energy)."""

    @classmethod
    def from_mapping(cls, mapping: Mapping[str, Any]) -> PowerPolicy:
        """Build a policy from a TOML-style table, validating every entry.

        Args:
            mapping: Keys are field names; missing keys take their defaults.

        Returns:
            The validated policy.

        Raises:
            PolicyError: An unknown key, a value of the wrong type, or a value out of range; the
                error's `key` names it.
        """
        fields = {f.name: f for f in dataclasses.fields(cls)}
        values: dict[str, Any] = {}
        for key, value in mapping.items():
            if key not in fields:
                raise PolicyError(key, "unknown key")
            default = fields[key].default
            if isinstance(default, bool):
                if not isinstance(value, bool):
                    raise PolicyError(key, f"expected true or false, got {echoed(value)}")
                values[key] = value
            elif value is None and default is None:
                values[key] = None
            elif isinstance(value, bool) or not isinstance(value, int | float):
                raise PolicyError(key, f"expected a number, got {echoed(value)}")
            elif not math.isfinite(value):
                raise PolicyError(key, f"expected a finite number, got {echoed(value)}")
            else:
                values[key] = float(value)
        policy = cls(**values)
        policy.validate()
        return policy

    def validate(self) -> None:
        """Check ranges and the relations between fields.

        Raises:
            PolicyError: The first violated rule, naming its key.
        """
        positive = (
            "control_period_s",
            "command_ttl_s",
            "ramp_limit_w_per_s",
            "band_high_hz",
            "job_start_smoothing_release_s",
        )
        for key in positive:
            if getattr(self, key) <= 0:
                raise PolicyError(key, "must be > 0")
        non_negative = (
            "min_change_w",
            "clock_skew_margin_s",
            "ramp_down_hysteresis_ms",
            "band_low_hz",
            "job_start_idle_s",
            "job_start_canary_gpus",
        )
        for key in non_negative:
            if getattr(self, key) < 0:
                raise PolicyError(key, "must be >= 0")
        percents = (
            "lower_band_pct",
            "capped_threshold_pct",
            "donor_target_pct",
            "max_step_pct_of_range",
            "raise_jitter_pct",
            "marginal_cap_pct",
            "swing_target_pct",
            "swing_activation_pct_of_tdp",
            "floor_min_pct",
            "floor_max_pct",
            "step_time_cost_max_pct",
        )
        for key in percents:
            if not 0.0 <= getattr(self, key) <= 100.0:
                raise PolicyError(key, "must be within 0..100")
        if self.max_step_pct_of_range <= 0:
            raise PolicyError("max_step_pct_of_range", "must be > 0")
        if not self.lower_band_pct < self.donor_target_pct < self.capped_threshold_pct:
            raise PolicyError("donor_target_pct", "must lie strictly between lower_band_pct and capped_threshold_pct")
        if self.raise_jitter_pct >= 100.0:
            raise PolicyError("raise_jitter_pct", "must be < 100 (a raise must never be scaled to zero)")
        if self.floor_min_pct > self.floor_max_pct:
            raise PolicyError("floor_min_pct", "must be <= floor_max_pct")
        if self.band_low_hz >= self.band_high_hz:
            raise PolicyError("band_low_hz", "must be < band_high_hz")
        if not 0.0 <= self.min_coherence <= 1.0:
            raise PolicyError("min_coherence", "must be within 0..1")
        if self.swing_target_w is not None and self.swing_target_w < 0:
            raise PolicyError("swing_target_w", "must be >= 0")
        if not float(self.job_start_canary_gpus).is_integer():
            raise PolicyError("job_start_canary_gpus", "must be a whole number of GPUs")
        if self.job_start_cap_w is not None and self.job_start_cap_w <= 0:
            raise PolicyError("job_start_cap_w", "must be > 0 W (a GPU's minimum limit applies when it is lower)")

    def to_mapping(self) -> dict[str, Any]:
        """Return the policy as a plain mapping (`from_mapping` round-trips it); None entries are left out."""
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}
