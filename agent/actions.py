"""Carries out controller commands on this node, idempotently by command id.

Every command is answered with an ActionResult. A command id seen before is answered with the
stored result (`replayed=True`) and never run twice (DESIGN.md invariant 2). A command past its
deadline is not started. Power caps go through the GPU backend and are confirmed by reading the
enforced limit back, which the controller's two-phase power apply relies on.

A raise that comes with a rate (`SetPowerCap.max_raise_w_per_s`, the GPU's share of the aggregate
ramp limit) is slewed (`rasd.agent.power_actions` keeps the raise) and `step_slews`, called
about every `cap_slew_step_s` by the agent, moves the limit up no faster than the rate. What
"confirmed" means for such a raise: the result answers at once, with the limit read back now and
the raise's target in `slew_targets_w`, and telemetry carries the target too
(`GpuCounters.power_limit_slew_target_w`) until the limit gets there. The controller counts the GPU
at the higher of the two: the target is the most that may come into force from what the agent has
accepted, so the budget holds (DESIGN.md §2.1), and the raise is settled, not resent. A later
command for the same GPU replaces the slew in progress; a decrease is set at once. A slew in
progress is dropped when the agent falls back to its safe cap or restores caps after a reboot or
reset: the agent never raises on its own (invariant 6).

Destructive actions (restart process, reset GPU, reboot, validation) need `destructive_enabled`;
by default the agent answers DRY_RUN with what it would have done. When enabled:

| action | how | refused / failed when |
|---|---|---|
| restart process | restart the unit, or SIGTERM the GPU's processes, SIGKILL after grace_s | restart fails |
| reset GPU | the node's reset command (nvidia-smi --gpu-reset) | compute processes still run (REFUSED) |
| reboot | the node's reboot command; the result is journaled *before* it runs | the command fails |
| run validation | rasd-validate; the verdicts ride on the result | it gives no report in time |

A reboot's result is written first because the agent will not live to write it afterwards, and a
replay after the reboot must not reboot again; a reboot command that fails corrects it to FAILED.
On a host, the reboot command returns once the shutdown is queued: a repair or a validation that
arrives afterwards (the ladder validates once the reboot is answered) waits for the node to go down,
unanswered, and the next boot's agent gets it again; a node still up after `reboot_grace_s` did not
reboot, and what waited is answered FAILED. The wait is journaled with the boot's id, so an agent
restarted within the same boot keeps waiting.

A restart or a reset is marked started in the journal, durably, before it begins. If the agent dies
before its result is written (killed, out of memory, the node's power lost), the resend after the
restart is answered FAILED as interrupted: its outcome is unknown, and running it again could reset
a GPU twice or signal the job the scheduler put on the GPU meanwhile. The controller's ladder takes
an interrupted repair as a failed one. A validation is not marked: running it again changes nothing.
A second delivery of an id while its first one still runs (a resend on a new stream while the old
stream's worker is still inside a reset) waits for the first and gets its result, replayed.
"""

from __future__ import annotations

import dataclasses
import math
import signal
import threading
import time
from collections.abc import Callable

from rasd.agent import gpu, node_ops, power_actions, spool
from rasd.agent import settings as agent_settings
from rasd.agent.core import model

Clock = Callable[[], int]
Outcome = power_actions.Outcome


BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"


def read_boot_id() -> str:
    """This boot's id (a fresh UUID each boot, from the kernel); "" where it cannot be read."""
    try:
        with open(BOOT_ID_PATH) as f:
            return f.read().strip()
    except OSError:
        return ""


class CommandDeferred(Exception):
    """Not run and not answered: the node is going down for the reboot it was told to do.

    Nothing is journaled; the controller sends the command again to the next boot's agent.
    """


class ActionExecutor:
    """Executes commands against one node's GPU backend and node operations."""

    def __init__(
        self,
        backend: gpu.GpuBackend,
        journal: spool.Spool,
        clock: Clock,
        *,
        ops: node_ops.NodeOps | None = None,
        settings: agent_settings.ActionSettings | None = None,
        sleep: Callable[[float], None] = time.sleep,
        boot_id: str | None = None,
    ) -> None:
        """Bind the executor to its backend, the executed-command journal, a unix-ns clock and node ops.

        boot_id: this boot's id (default: the kernel's, `read_boot_id`); "" where unknown, and then
        a reboot wait is not carried over to a restarted agent (it cannot tell the boots apart).
        """
        self._backend = backend
        self._journal = journal
        self._clock = clock
        self._ops = ops
        self.settings = settings or agent_settings.ActionSettings()
        self._sleep = sleep
        self._power = power_actions.PowerActions(backend, journal, clock)
        # Command id → set when its run ended: a second delivery waits for the first.
        self._in_flight: dict[str, threading.Event] = {}
        self._in_flight_lock = threading.Lock()
        self._boot_id = read_boot_id() if boot_id is None else boot_id
        # A reboot this boot was told to do before the agent restarted: what comes now still waits.
        self._reboot_started_monotonic = journal.reboot_pending(self._boot_id) if self._boot_id else None
        self._stopping = threading.Event()

    def execute(self, command: model.Command) -> model.ActionResult:
        """Run a command once; a repeated id returns the stored result marked replayed.

        A delivery of an id that is running now waits until that run ended, then is answered from
        the journal like any repeat.
        """
        while True:
            with self._in_flight_lock:
                running = self._in_flight.get(command.command_id)
                if running is None:
                    self._in_flight[command.command_id] = done = threading.Event()
                    break
            running.wait()
        try:
            return self._execute_once(command)
        finally:
            with self._in_flight_lock:
                del self._in_flight[command.command_id]
            done.set()

    def wait_idle(self, timeout_s: float) -> bool:
        """Wait up to timeout_s for the commands running now to end; False if one still runs.

        The agent's stop calls this before it closes the journal, so a reset that is under way when
        systemd stops the agent still gets its result written.
        """
        self._stopping.set()  # commands waiting for a reboot give up (`CommandDeferred`)
        deadline = time.monotonic() + timeout_s
        while True:
            with self._in_flight_lock:
                running = list(self._in_flight.values())
            if not running:
                return True
            left_s = deadline - time.monotonic()
            if left_s <= 0 or not running[0].wait(left_s):
                return False

    def _execute_once(self, command: model.Command) -> model.ActionResult:
        previous = self._journal.executed_result(command.command_id)
        if previous is not None:
            return dataclasses.replace(previous, replayed=True)
        started = self._clock()
        refusal = self._refusal(command, started)
        if refusal is not None:
            return self._finish(command, started, refusal)
        action = command.action
        if isinstance(action, model.SetPowerCap):
            outcome, slewing = self._power.set_power_cap(action)
            # The slews' targets are the caps the controller counts: restored after a reboot, they
            # only ever lower a limit.
            self._journal.record_power_caps({**outcome[2], **slewing}, started)
            return self._finish(command, started, outcome, slew_targets_w=slewing)
        if isinstance(action, model.SetPowerSmoothing):
            return self._finish(command, started, self._power.set_power_smoothing(action))
        if isinstance(action, model.SetTroughFiller):
            # Not destructive (it only adds load in the troughs), so it runs without destructive_enabled.
            return self._finish(command, started, self._set_trough_filler(action))
        return self._execute_destructive(command, started)

    def _refusal(self, command: model.Command, started: int) -> Outcome | None:
        """Why a command is not run at all: its earlier delivery was interrupted, or it came too late."""
        interrupted = self._journal.started_command(command.command_id)
        if interrupted is not None:
            what, since_unix_ns = interrupted
            message = (
                f"interrupted: the agent stopped while it ran this command ({what}, started at "
                f"{since_unix_ns} ns); its outcome is unknown, and it is not run again"
            )
            return model.ActionOutcome.FAILED, message, {}
        if command.deadline_unix_ns and started > command.deadline_unix_ns:
            late_s = (started - command.deadline_unix_ns) / 1e9
            return model.ActionOutcome.TIMED_OUT, f"deadline passed {late_s:.3f} s before start", {}
        return None

    def _execute_destructive(self, command: model.Command, started: int) -> model.ActionResult:
        """A restart, reset, reboot or validation: dry-run unless enabled, held while a reboot is due."""
        action = command.action
        if not self.settings.destructive_enabled or self._ops is None:
            return self._finish(
                command, started, (model.ActionOutcome.DRY_RUN, f"dry-run: would {_describe(action)}", {})
            )
        if self._reboot_started_monotonic is not None:
            # A repair or a validation sent after the reboot command (the ladder validates once the
            # reboot is answered) must run in the next boot: a verdict from this one would release
            # a GPU the reboot never repaired.
            self._wait_for_the_reboot(command)
            return self._finish(
                command,
                started,
                (
                    model.ActionOutcome.FAILED,
                    f"the node did not go down within {self.settings.reboot_grace_s:g} s of its reboot command; "
                    f"not run: would {_describe(action)}",
                    {},
                ),
            )
        if isinstance(action, model.RebootNode):
            return self._reboot(command, started)
        if isinstance(action, model.RunValidation):
            return self._validate(command, started, action)
        if isinstance(action, (model.RestartProcess, model.ResetGpu)):
            self._journal.record_started(command.command_id, _describe(action), started)
        try:
            if isinstance(action, model.RestartProcess):
                outcome = self._restart(action)
            elif isinstance(action, model.ResetGpu):
                outcome = self._reset(action)
            else:
                outcome = (model.ActionOutcome.NOT_SUPPORTED, f"unknown action {type(action).__name__}", {})
        except node_ops.NodeOpError as exc:
            outcome = (model.ActionOutcome.FAILED, str(exc), {})
        return self._finish(command, started, outcome)

    def _reboot(self, command: model.Command, started: int) -> model.ActionResult:
        """Journal the reboot as started, then start it; a failure corrects the journal to FAILED."""
        assert self._ops is not None
        result = self._finish(command, started, (model.ActionOutcome.SUCCEEDED, "reboot started", {}))
        queued_only = not self._ops.reboot_done_on_return
        if queued_only and self._boot_id:
            # Journaled first, as the result is: the agent may be gone before the call returns.
            self._journal.record_reboot_pending(self._boot_id, time.monotonic())
        try:
            self._ops.reboot()
        except node_ops.NodeOpError as exc:
            if queued_only and self._boot_id:
                self._journal.record_reboot_pending(self._boot_id, None)
            # The journal said "started": corrected, so that a replay (the answer lost with its
            # stream) also says FAILED, and the ladder does not wait for a boot that never comes.
            # A replay does not try again: a failed reboot needs a person or the BMC rung.
            failed = dataclasses.replace(
                result, outcome=model.ActionOutcome.FAILED, message=str(exc), finished_unix_ns=self._clock()
            )
            self._journal.record_result(failed, correct=True)
            return failed
        if queued_only:
            # systemctl reboot returns once the shutdown is queued: this boot's agent lives on
            # for seconds. What comes now waits for the next boot (`_wait_for_the_reboot`).
            self._reboot_started_monotonic = self._journal.reboot_pending(self._boot_id) or time.monotonic()
            return result
        # A reboot that returns once done (simulated) is a new boot: put the caps back.
        self.restore_power_caps()
        return result

    def _wait_for_the_reboot(self, command: model.Command) -> None:
        """Hold a command until this agent stops for the reboot (`CommandDeferred`) or the grace ends."""
        assert self._reboot_started_monotonic is not None
        until = self._reboot_started_monotonic + self.settings.reboot_grace_s
        while (left_s := until - time.monotonic()) > 0:
            if self._stopping.wait(min(left_s, 1.0)):
                raise CommandDeferred(f"{command.command_id}: the node is going down for its reboot")

    def _finish(self, command: model.Command, started: int, outcome: Outcome, **extra: object) -> model.ActionResult:
        status, message, limits = outcome
        result = model.ActionResult(
            command_id=command.command_id,
            outcome=status,
            message=message,
            started_unix_ns=started,
            finished_unix_ns=self._clock(),
            enforced_limits_w=limits,
            **extra,  # type: ignore[arg-type]
        )
        self._journal.record_result(result)
        return result

    # -- power caps (`power_actions`); the agent's sampler and fail-safe call these ---------------------
    def restore_power_caps(self, gpu_uuids: list[str] | None = None) -> dict[str, int]:
        """Put back the controller's last confirmed caps where a GPU now runs above them (`PowerActions`)."""
        return self._power.restore_power_caps(gpu_uuids)

    def step_slews(self) -> list[str]:
        """Move every slewing raise to where its rate allows now; returns the failures (`PowerActions`)."""
        return self._power.step_slews()

    def slewing(self) -> bool:
        """Whether a raise is in progress (`PowerActions.slewing`): the sampler steps slews only then."""
        return self._power.slewing()

    def slew_targets(self) -> dict[str, int]:
        """GPU -> the target of its raise in progress."""
        return self._power.slew_targets()

    def cancel_slews(self, gpu_uuids: list[str] | None = None) -> None:
        """Stop raises in progress where they are (all, or the listed GPUs')."""
        self._power.cancel_slews(gpu_uuids)

    def read_counters(self, now_unix_ns: int) -> list[model.GpuCounters]:
        """The backend's counters, each slewing GPU's with the target of its raise in progress."""
        return self._power.read_counters(now_unix_ns)

    def _set_trough_filler(self, action: model.SetTroughFiller) -> Outcome:
        """Run the node's trough-filler hook; NOT_SUPPORTED where the node has none configured."""
        for name in ("floor_w", "ramp_down_w_per_s"):
            value = getattr(action, name)
            if not math.isfinite(value) or value < 0:
                message = f"set_trough_filler.{name}: must be a finite number >= 0, got {value}"
                return model.ActionOutcome.FAILED, message, {}
        if self._ops is None:
            return model.ActionOutcome.NOT_SUPPORTED, "no node operations: no trough-filler hook", {}
        targets = action.gpu_uuids or tuple(g.uuid for g in self._backend.inventory())
        floor_w = action.floor_w if action.enabled else 0.0
        try:
            self._ops.fill_troughs(targets, floor_w, action.ramp_down_w_per_s)
        except node_ops.NotConfigured as exc:
            return model.ActionOutcome.NOT_SUPPORTED, str(exc), {}
        except node_ops.NodeOpError as exc:
            return model.ActionOutcome.FAILED, str(exc), {}
        state = f"holding {floor_w:.0f} W" if action.enabled else "off"
        return model.ActionOutcome.SUCCEEDED, f"trough filler {state} on {len(targets)} GPU(s)", {}

    def _restart(self, action: model.RestartProcess) -> Outcome:
        assert self._ops is not None
        if action.systemd_unit:
            self._ops.restart_unit(action.systemd_unit)
            return model.ActionOutcome.SUCCEEDED, f"restarted unit {action.systemd_unit}", {}
        pids = list(action.pids) or self._ops.compute_pids(action.gpu_uuid)
        if not pids:
            return model.ActionOutcome.SUCCEEDED, f"no compute process on {action.gpu_uuid}: nothing to restart", {}
        for pid in pids:
            self._ops.signal(pid, signal.SIGTERM)
        waited_s = 0.0
        while waited_s < action.grace_s and any(self._ops.pid_alive(pid) for pid in pids):
            self._sleep(self.settings.kill_poll_s)
            waited_s += self.settings.kill_poll_s
        killed = [pid for pid in pids if self._ops.pid_alive(pid)]
        for pid in killed:
            self._ops.signal(pid, signal.SIGKILL)
        message = f"SIGTERM to {pids}" + (f", SIGKILL to {killed} after {action.grace_s:g} s" if killed else "")
        return model.ActionOutcome.SUCCEEDED, message, {}

    def _reset(self, action: model.ResetGpu) -> Outcome:
        assert self._ops is not None
        running = self._ops.compute_pids(action.gpu_uuid)
        if running:
            return (
                model.ActionOutcome.REFUSED,
                f"{len(running)} compute process(es) still run on {action.gpu_uuid}: {running}",
                {},
            )
        self._ops.reset_gpu(action.gpu_uuid)
        restored = self.restore_power_caps([action.gpu_uuid])  # a reset returns the default limit
        return model.ActionOutcome.SUCCEEDED, f"reset {action.gpu_uuid}", restored

    def _validate(self, command: model.Command, started: int, action: model.RunValidation) -> model.ActionResult:
        assert self._ops is not None
        try:
            run = self._ops.run_validation(
                action.suite, action.gpu_uuids, action.seed, self.settings.validation_timeout_s
            )
        except node_ops.NodeOpError as exc:
            return self._finish(command, started, (model.ActionOutcome.FAILED, str(exc), {}))
        return self._finish(
            command,
            started,
            (model.ActionOutcome.SUCCEEDED, run.message, {}),
            validation_verdict=run.verdict,
            check_verdicts=run.checks,
        )


def _describe(action: model.Action) -> str:
    if isinstance(action, model.RestartProcess):
        target = action.systemd_unit or (f"pids {list(action.pids)}" if action.pids else "all processes")
        return f"restart {target} on {action.gpu_uuid} (grace {action.grace_s:g} s)"
    if isinstance(action, model.ResetGpu):
        return f"reset GPU {action.gpu_uuid}"
    if isinstance(action, model.RebootNode):
        return "reboot the node"
    if isinstance(action, model.RunValidation):
        gpus = ", ".join(action.gpu_uuids) or "all GPUs"
        return f"run rasd-validate --suite {action.suite} on {gpus} (seed {action.seed})"
    return repr(action)
