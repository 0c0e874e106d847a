"""Carries out controller commands on this node, idempotently by command id.

Every command is answered with an ActionResult. A command id seen before is answered with the
stored result (`replayed=True`) and never run twice (DESIGN.md invariant 2). A command past its
deadline is not started. Power caps are applied through the GPU backend and confirmed by reading
the enforced limit back, which is what the controller's two-phase power apply relies on.

Destructive actions (restart process, reset GPU, reboot, validation runs) run in dry-run mode in this
build: the agent logs and answers what it would do, and does nothing. Their real executors arrive
with the agent issue (#3) behind an explicit enablement switch.
"""

from __future__ import annotations

from collections.abc import Callable

from rasd.agent import gpu, spool
from rasd.agent.core import model

Clock = Callable[[], int]


class ActionExecutor:
    """Executes commands against one node's GPU backend."""

    def __init__(self, backend: gpu.GpuBackend, journal: spool.Spool, clock: Clock) -> None:
        """Bind the executor to its backend, the executed-command journal and a unix-ns clock."""
        self._backend = backend
        self._journal = journal
        self._clock = clock

    def execute(self, command: model.Command) -> model.ActionResult:
        """Run a command once; a repeated id returns the stored result marked replayed."""
        previous = self._journal.executed_result(command.command_id)
        if previous is not None:
            return model.ActionResult(
                command_id=previous.command_id,
                outcome=previous.outcome,
                message=previous.message,
                started_unix_ns=previous.started_unix_ns,
                finished_unix_ns=previous.finished_unix_ns,
                enforced_limits_w=previous.enforced_limits_w,
                replayed=True,
            )
        started = self._clock()
        if command.deadline_unix_ns and started > command.deadline_unix_ns:
            outcome, message, limits = (
                model.ActionOutcome.TIMED_OUT,
                f"deadline passed {(started - command.deadline_unix_ns) / 1e9:.3f} s before start",
                {},
            )
        else:
            outcome, message, limits = self._run(command.action)
        result = model.ActionResult(
            command_id=command.command_id,
            outcome=outcome,
            message=message,
            started_unix_ns=started,
            finished_unix_ns=self._clock(),
            enforced_limits_w=limits,
        )
        self._journal.record_result(result)
        return result

    def _run(self, action: model.Action) -> tuple[model.ActionOutcome, str, dict[str, int]]:
        if isinstance(action, model.SetPowerCap):
            return self._set_power_cap(action)
        if isinstance(action, model.SetPowerSmoothing):
            return (
                model.ActionOutcome.NOT_SUPPORTED,
                f"backend {self._backend.name!r} has no power-smoothing control",
                {},
            )
        return model.ActionOutcome.DRY_RUN, f"dry-run: would {_describe(action)}", {}

    def _set_power_cap(self, action: model.SetPowerCap) -> tuple[model.ActionOutcome, str, dict[str, int]]:
        enforced: dict[str, int] = {}
        failures: list[str] = []
        not_supported = False
        for gpu_uuid, watts in action.limits_w.items():
            try:
                enforced[gpu_uuid] = self._backend.set_power_limit(gpu_uuid, watts)
            except gpu.NotSupported as exc:
                not_supported = True
                failures.append(f"{gpu_uuid}: {exc}")
            except gpu.BackendError as exc:
                failures.append(f"{gpu_uuid}: {type(exc).__name__}: {exc}")
        if not failures:
            return model.ActionOutcome.SUCCEEDED, f"set {len(enforced)} power limit(s)", enforced
        outcome = model.ActionOutcome.NOT_SUPPORTED if not_supported and not enforced else model.ActionOutcome.FAILED
        # Partial success still reports what was enforced: the controller must know which caps
        # are in force to keep the budget invariant.
        return outcome, "; ".join(failures), enforced


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
