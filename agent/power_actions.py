"""Power commands on this node: caps confirmed by reading them back, slewed raises, smoothing profiles.

The executor (`rasd.agent.actions`) hands its power commands here. A cap is set at once and read
back; a raise that comes with a rate (`SetPowerCap.max_raise_w_per_s`) is slewed instead: kept as a
`core.cap_slew.Slew` and moved up by `step_slews`, which the agent calls about every
`cap_slew_step_s`, no faster than the rate. Until a slew arrives, counters read through
`read_counters` carry its target (`GpuCounters.power_limit_slew_target_w`), which the controller
counts the GPU at. A new command for a GPU replaces its slew; the fail-safe and a cap restore after
a reboot or reset cancel slews, since the agent never raises on its own (DESIGN.md invariant 6).

Commands run in a worker thread while the sampler steps the slews and reads the limits: one lock
makes a command, a step and a read of limits with their slew targets atomic.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable

from rasd.agent import gpu, spool
from rasd.agent.core import cap_slew, model

Clock = Callable[[], int]
Outcome = tuple[model.ActionOutcome, str, dict[str, int]]
"""What a command came to: its outcome, the message, and the limits enforced (W) by GPU."""


class PowerActions:
    """Power caps (with slewed raises) and power-smoothing profiles on one node's GPUs."""

    def __init__(self, backend: gpu.GpuBackend, journal: spool.Spool, clock: Clock) -> None:
        """Bind to the backend, the journal of confirmed caps and a unix-ns clock."""
        self._backend = backend
        self._journal = journal
        self._clock = clock
        self._slews: dict[str, cap_slew.Slew] = {}
        self._constraints: dict[str, tuple[int, int]] | None = None
        self._slew_lock = threading.Lock()

    def restore_power_caps(self, gpu_uuids: list[str] | None = None) -> dict[str, int]:
        """Put back the controller's last confirmed caps where a GPU now runs above them.

        Called at agent start and after a reboot or reset (which return GPUs to their default
        limit). It only ever lowers a limit: a cap the controller later raised is recorded too, and
        the agent never raises on its own. Returns the limits now enforced on the GPUs it touched.
        """
        self.cancel_slews(gpu_uuids)
        caps = self._journal.power_caps()
        if gpu_uuids is not None:
            caps = {uuid: watts for uuid, watts in caps.items() if uuid in gpu_uuids}
        if not caps:
            return {}
        try:
            current = {c.gpu_uuid: c.enforced_power_limit_w for c in self._backend.read_counters(self._clock())}
        except gpu.BackendError:
            current = {}
        enforced: dict[str, int] = {}
        for gpu_uuid, cap_w in caps.items():
            now_w = current.get(gpu_uuid)
            if now_w is not None and now_w <= cap_w:
                continue
            try:
                enforced[gpu_uuid] = self._backend.set_power_limit(gpu_uuid, cap_w)
            except gpu.BackendError:
                continue  # a GPU that cannot be reached now is counted at its cap by the controller
        return enforced

    # -- slewing raises ----------------------------------------------------------------------------
    def step_slews(self) -> list[str]:
        """Move every slewing raise to where its rate allows now; returns the failures (slew dropped).

        A GPU whose set fails keeps the limit it had: lower than the target the controller counts,
        so the budget still holds, and its read-back shows where it stopped.
        """
        with self._slew_lock:
            if not self._slews:
                return []
            self._slews, to_set = cap_slew.step(self._slews, self._clock() / 1e9)
            failures = []
            for gpu_uuid, watts in to_set.items():
                try:
                    self._backend.set_power_limit(gpu_uuid, watts)
                except gpu.BackendError as exc:
                    self._slews.pop(gpu_uuid, None)
                    failures.append(f"{gpu_uuid}: {type(exc).__name__}: {exc}")
            return failures

    def slewing(self) -> bool:
        """Whether a raise is in progress; read without the lock (one that begins just after is stepped next tick)."""
        return bool(self._slews)

    def slew_targets(self) -> dict[str, int]:
        """GPU -> the target of its raise in progress."""
        with self._slew_lock:
            return {gpu_uuid: slew.target_w for gpu_uuid, slew in self._slews.items()}

    def cancel_slews(self, gpu_uuids: list[str] | None = None) -> None:
        """Stop raises in progress where they are (all, or the listed GPUs')."""
        with self._slew_lock:
            for gpu_uuid in list(self._slews) if gpu_uuids is None else gpu_uuids:
                self._slews.pop(gpu_uuid, None)

    def read_counters(self, now_unix_ns: int) -> list[model.GpuCounters]:
        """The backend's counters, each slewing GPU's with the target of its raise in progress.

        Read under the slew lock, so a read-back never misses the target of a raise it could be
        overtaken by: a command that starts a slew either finished before (the target is here) or
        starts after (and answers with a later time).
        """
        with self._slew_lock:
            counters = self._backend.read_counters(now_unix_ns)
            targets = {gpu_uuid: slew.target_w for gpu_uuid, slew in self._slews.items()}
        if not targets:
            return list(counters)
        return [
            dataclasses.replace(c, power_limit_slew_target_w=targets[c.gpu_uuid]) if c.gpu_uuid in targets else c
            for c in counters
        ]

    def set_power_cap(self, action: model.SetPowerCap) -> tuple[Outcome, dict[str, int]]:
        """Set the caps (a raise with a rate starts a slew); returns the outcome and the slews' targets."""
        enforced: dict[str, int] = {}
        slewing: dict[str, int] = {}
        failures: list[str] = []
        not_supported = False
        with self._slew_lock:
            rates = {g: r for g, r in action.max_raise_w_per_s.items() if r > 0 and g in action.limits_w}
            current = self._limits_now() if rates else {}
            now_s = self._clock() / 1e9
            for gpu_uuid, watts in action.limits_w.items():
                self._slews.pop(gpu_uuid, None)  # a new command replaces the raise in progress
                now_w = current.get(gpu_uuid)
                slew = None
                if now_w is not None and self._within_constraints(gpu_uuid, watts):
                    slew = cap_slew.begin(now_w, watts, rates.get(gpu_uuid, 0.0), now_s)
                if slew is not None:
                    self._slews[gpu_uuid] = slew
                    enforced[gpu_uuid] = now_w  # type: ignore[assignment]  # not None: a slew began
                    slewing[gpu_uuid] = slew.target_w
                    continue
                try:
                    enforced[gpu_uuid] = self._backend.set_power_limit(gpu_uuid, watts)
                except gpu.NotSupported as exc:
                    not_supported = True
                    failures.append(f"{gpu_uuid}: {exc}")
                except gpu.BackendError as exc:
                    failures.append(f"{gpu_uuid}: {type(exc).__name__}: {exc}")
        if not failures:
            message = f"set {len(enforced) - len(slewing)} power limit(s)"
            if slewing:
                message += f", raising {len(slewing)} at their rate"
            return (model.ActionOutcome.SUCCEEDED, message, enforced), slewing
        outcome = model.ActionOutcome.NOT_SUPPORTED if not_supported and not enforced else model.ActionOutcome.FAILED
        # Partial success still reports what was enforced: the controller must know which caps
        # are in force to keep the budget invariant.
        return (outcome, "; ".join(failures), enforced), slewing

    def _limits_now(self) -> dict[str, int]:
        """GPU -> its enforced limit read back now; empty when the backend cannot say (set at once)."""
        try:
            counters = self._backend.read_counters(self._clock())
        except gpu.BackendError:
            return {}
        return {c.gpu_uuid: c.enforced_power_limit_w for c in counters if c.enforced_power_limit_w is not None}

    def _within_constraints(self, gpu_uuid: str, watts: int) -> bool:
        """Whether the backend would take `watts` for this GPU (otherwise the set at once reports why)."""
        if self._constraints is None:
            self._constraints = {g.uuid: (g.power_limit_min_w, g.power_limit_max_w) for g in self._backend.inventory()}
        limits = self._constraints.get(gpu_uuid)
        return limits is not None and limits[0] <= watts <= limits[1]

    def set_power_smoothing(self, action: model.SetPowerSmoothing) -> Outcome:
        """Apply the profile GPU by GPU; NOT_SUPPORTED only when no listed GPU has the hardware."""
        applied: list[str] = []
        failures: list[str] = []
        unsupported = 0
        targets = action.gpu_uuids or tuple(g.uuid for g in self._backend.inventory())
        for gpu_uuid in targets:
            try:
                self._backend.set_power_smoothing(
                    gpu_uuid,
                    enabled=action.enabled,
                    floor_pct=action.floor_pct,
                    ramp_up_w_per_s=action.ramp_up_w_per_s,
                    ramp_down_w_per_s=action.ramp_down_w_per_s,
                )
                applied.append(gpu_uuid)
            except gpu.NotSupported as exc:
                unsupported += 1
                failures.append(f"{gpu_uuid}: {exc}")
            except gpu.BackendError as exc:
                failures.append(f"{gpu_uuid}: {type(exc).__name__}: {exc}")
        if not failures:
            state = "enabled" if action.enabled else "disabled"
            return model.ActionOutcome.SUCCEEDED, f"power smoothing {state} on {len(applied)} GPU(s)", {}
        if unsupported == len(targets):
            return model.ActionOutcome.NOT_SUPPORTED, "; ".join(failures), {}
        return model.ActionOutcome.FAILED, "; ".join(failures), {}
