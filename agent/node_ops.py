"""Node operations behind destructive repairs: signal processes, reset a GPU, reboot, validate.

`HostNodeOps` does them on a real node through configurable commands (nvidia-smi, systemctl,
rasd-validate, or site hooks). `SimulatedNodeOps` does them to a `SimulatedBackend`, so rasd-sim and
the tests exercise the same executor code paths as production. Commands come from the agent's
configuration (an operator), never from the wire: the controller names an action, not a command line.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

from rasd.agent import settings as agent_settings

if TYPE_CHECKING:  # numpy comes with it: an NVML agent never loads the simulated backend
    from rasd.agent.gpu import simulated


class NodeOpError(Exception):
    """A node operation failed; the message says what ran and what it answered."""


class NotConfigured(NodeOpError):
    """The node has no command for this operation (an optional hook the operator did not set up)."""


@dataclasses.dataclass(frozen=True)
class ValidationRun:
    """What a rasd-validate run concluded."""

    verdict: str
    """Overall: "pass", "fail", "suspect" or "software_drift"."""
    checks: tuple[tuple[str, str, str, str], ...] = ()
    """(check, gpu_uuid, verdict, evidence) per check and GPU."""
    message: str = ""


class NodeOps(Protocol):
    """What the executor needs from the node."""

    reboot_done_on_return: bool
    """Whether `reboot` returns once the node has booted again (simulated), not once it started."""

    def compute_pids(self, gpu_uuid: str) -> list[int]:
        """PIDs of compute processes on the GPU."""
        ...

    def signal(self, pid: int, signum: int) -> None:
        """Send a signal; a process that is already gone is not an error."""
        ...

    def pid_alive(self, pid: int) -> bool:
        """Whether the process still exists."""
        ...

    def restart_unit(self, unit: str) -> None:
        """Restart a systemd unit (or run the configured restart hook)."""
        ...

    def reset_gpu(self, gpu_uuid: str) -> None:
        """Reset one GPU."""
        ...

    def reboot(self) -> None:
        """Start a reboot of the node (returns before the node goes down)."""
        ...

    def run_validation(self, suite: str, gpu_uuids: Sequence[str], seed: int, timeout_s: float) -> ValidationRun:
        """Run the validation suite and report its verdict."""
        ...

    def fill_troughs(self, gpu_uuids: Sequence[str], floor_w: float, ramp_down_w_per_s: float) -> None:
        """Hold the GPUs' draw at floor_w while the job communicates.

        0 W stops it, lowering the floor at ramp_down_w_per_s (0 W/s: at once). Raises NotConfigured
        where the node has no such hook.
        """
        ...


def _run(argv: Sequence[str], timeout_s: float) -> str:
    try:
        done = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout_s, check=False)
    except FileNotFoundError:
        raise NodeOpError(f"{argv[0]}: not found") from None
    except subprocess.TimeoutExpired:
        raise NodeOpError(f"{' '.join(argv)}: no answer within {timeout_s:g} s") from None
    if done.returncode != 0:
        detail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["(no output)"]
        raise NodeOpError(f"{' '.join(argv)}: exit {done.returncode}: {detail[0][:300]}")
    return done.stdout


class HostNodeOps:
    """Node operations on a real host."""

    reboot_done_on_return = False  # systemctl reboot returns once the shutdown is queued

    def __init__(self, commands: agent_settings.CommandSettings | None = None) -> None:
        """Use the given command lines (default: `CommandSettings()`)."""
        self.commands = commands or agent_settings.CommandSettings()

    def compute_pids(self, gpu_uuid: str) -> list[int]:
        """Ask nvidia-smi which processes run on the GPU."""
        out = _run(self.commands.list_compute_apps, self.commands.timeout_s)
        pids = []
        for line in out.splitlines():
            parts = [p.strip() for p in line.split(",")]
            if len(parts) == 2 and parts[0] == gpu_uuid and parts[1].isdigit():
                pids.append(int(parts[1]))
        return pids

    def signal(self, pid: int, signum: int) -> None:
        """os.kill, ignoring a process that already exited."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)

    def pid_alive(self, pid: int) -> bool:
        """Signal 0 probes existence."""
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True

    def restart_unit(self, unit: str) -> None:
        """systemctl restart UNIT."""
        _run([a.format(unit=unit) for a in self.commands.restart_unit], self.commands.timeout_s)

    def reset_gpu(self, gpu_uuid: str) -> None:
        """nvidia-smi --gpu-reset -i UUID (or the configured hook)."""
        _run([a.format(gpu_uuid=gpu_uuid) for a in self.commands.reset_gpu], self.commands.timeout_s)

    def reboot(self) -> None:
        """systemctl reboot (or the configured command)."""
        _run(self.commands.reboot, self.commands.timeout_s)

    def fill_troughs(self, gpu_uuids: Sequence[str], floor_w: float, ramp_down_w_per_s: float) -> None:
        """Run the configured trough-filler hook."""
        if not self.commands.trough_filler:
            raise NotConfigured("no trough-filler hook configured (commands.trough_filler in agent.toml)")
        argv = _fill_troughs_argv(self.commands.trough_filler, gpu_uuids, floor_w, ramp_down_w_per_s)
        _run(argv, self.commands.timeout_s)

    def run_validation(self, suite: str, gpu_uuids: Sequence[str], seed: int, timeout_s: float) -> ValidationRun:
        """Run rasd-validate and read its JSON report (exit 1 and 2 still carry a report)."""
        argv = [*self.commands.validate, "--suite", suite, "--seed", str(seed)]
        if gpu_uuids:
            argv += ["--gpus", ",".join(gpu_uuids)]
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False)
        except FileNotFoundError:
            raise NodeOpError(f"{argv[0]}: not found") from None
        except subprocess.TimeoutExpired:
            raise NodeOpError(f"rasd-validate --suite {suite}: no verdict within {timeout_s:g} s") from None
        try:
            report = json.loads(done.stdout)
        except ValueError:
            raise NodeOpError(
                f"rasd-validate exit {done.returncode} without a JSON report: {done.stderr[-300:]}"
            ) from None
        return parse_validation_report(report)


def _fill_troughs_argv(argv: Sequence[str], gpu_uuids: Sequence[str], floor_w: float, ramp_w_per_s: float) -> list[str]:
    values = {"gpu_uuids": ",".join(gpu_uuids), "floor_w": f"{floor_w:.0f}", "ramp_down_w_per_s": f"{ramp_w_per_s:.1f}"}
    return [a.format(**values) for a in argv]


def parse_validation_report(report: dict) -> ValidationRun:
    """The verdicts in a rasd-validate --json report (schema rasd.validation.report/v1)."""
    checks = []
    for check in report.get("checks", []):
        for per_gpu in check.get("gpus", []):
            checks.append(
                (
                    str(check.get("check", "")),
                    str(per_gpu.get("gpu", "")),
                    str(per_gpu.get("verdict", "")),
                    json.dumps(per_gpu.get("evidence") or per_gpu.get("reason", ""))[:1000],
                )
            )
    summary = (
        f"rasd-validate {report.get('suite', '')}: {report.get('verdict', '')} in {report.get('duration_s', '?')} s"
    )
    return ValidationRun(verdict=str(report.get("verdict", "")), checks=tuple(checks), message=summary)


class SimulatedNodeOps:
    """Node operations on a simulated node: each GPU runs one workload process until it is killed.

    A GPU whose process is gone (killed, or dead of an uncorrectable fault) draws its idle power
    (`SimulatedBackend.set_workload`) until a reboot starts the workload again. Scripted action
    faults (`simulated.ActionFault`, a scenario's ``[[action_faults]]``) make an operation fail,
    hang past its deadline, leave processes that survive every signal, fail its validation, or take
    the node down for a reboot that never comes back until `power_cycle` (rasd-sim's BMC). `close`
    ends every hang, so that a simulation can stop.
    """

    reboot_done_on_return = True  # the simulated node is back when `reboot` returns

    def __init__(
        self, backend: simulated.SimulatedBackend, action_faults: Sequence[simulated.ActionFault] = ()
    ) -> None:
        """Operate on backend's GPUs; action_faults say what goes wrong with which operation."""
        self.backend = backend
        self._gpus = [gpu.uuid for gpu in backend.inventory()]
        self._pids = {gpu_uuid: 100_000 + index for index, gpu_uuid in enumerate(self._gpus)}
        self._gpu_of = {pid: gpu_uuid for gpu_uuid, pid in self._pids.items()}
        self._alive = set(self._pids.values())
        self._stuck: set[int] = set()
        """Processes that survive SIGTERM and SIGKILL (a `stuck` restart fault)."""
        self.reboots = 0
        self.power_cycles = 0
        self.unit_restarts: list[str] = []
        self._faults = list(action_faults)
        self._hits = [0] * len(self._faults)
        self._skips = [f.skip for f in self._faults]
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._up = threading.Event()
        self._up.set()

    def close(self) -> None:
        """End every operation that hangs (or waits for a power cycle) now: the simulation stops."""
        self._closed.set()

    @property
    def down(self) -> bool:
        """Whether the node went down for a reboot that has not come back (until `power_cycle`)."""
        return not self._up.is_set()

    def _fault(self, action: str, gpu_uuid: str = "") -> simulated.ActionFault | None:
        """The scripted fault that hits this action now (counted), or None."""
        with self._lock:
            for index, fault in enumerate(self._faults):
                if fault.action != action or (fault.times and self._hits[index] >= fault.times):
                    continue
                if fault.gpu is not None and gpu_uuid and self._gpus.index(gpu_uuid) != fault.gpu % len(self._gpus):
                    continue
                if self._skips[index]:
                    self._skips[index] -= 1
                    return None
                self._hits[index] += 1
                return fault
        return None

    def _misbehave(self, fault: simulated.ActionFault) -> None:
        """A fail, hang or slow fault: raise at once, raise after hang_s, or return after it (or at `close`)."""
        if fault.outcome in ("hang", "slow"):
            self._closed.wait(fault.hang_s)
            if fault.outcome == "slow":
                return
            raise NodeOpError(f"{fault.describe()}: no answer within {fault.hang_s:g} s")
        raise NodeOpError(fault.describe())

    def _wait_up(self) -> None:
        """A node that is down answers nothing: block until the BMC boots it (or the simulation stops)."""
        while not self._up.wait(0.05):
            if self._closed.is_set():
                raise NodeOpError("the node is down: it went down for a reboot and never came back")

    def _end(self, pid: int) -> None:
        """The process is gone: its GPU's share of the job stops."""
        self._alive.discard(pid)
        self.backend.set_workload(self._gpu_of[pid], running=False)

    def _start_all(self) -> None:
        """A boot: every GPU's workload process runs again."""
        self._alive = set(self._pids.values())
        self._stuck.clear()
        for gpu_uuid in self._gpus:
            self.backend.set_workload(gpu_uuid, running=True)

    def compute_pids(self, gpu_uuid: str) -> list[int]:
        """The GPU's workload process while it lives (it dies with an uncorrectable GPU fault)."""
        pid = self._pids.get(gpu_uuid)
        if pid in self._alive and pid not in self._stuck and self.backend.workload_crashed(gpu_uuid):
            self._end(pid)
        return [pid] if pid in self._alive else []

    def signal(self, pid: int, signum: int) -> None:
        """SIGTERM and SIGKILL end a simulated process (the scheduler moves the job elsewhere)."""
        if signum not in (signal.SIGTERM, signal.SIGKILL) or pid not in self._alive:
            return
        self._wait_up()
        if signum == signal.SIGTERM:
            fault = self._fault("restart_process", self._gpu_of.get(pid, ""))
            if fault is not None and fault.outcome == "stuck":
                self._stuck.add(pid)
            elif fault is not None:
                self._misbehave(fault)
        if pid not in self._stuck:
            self._end(pid)

    def pid_alive(self, pid: int) -> bool:
        """Whether the simulated process lives."""
        return pid in self._alive

    def restart_unit(self, unit: str) -> None:
        """Record the restart."""
        self.unit_restarts.append(unit)

    def reset_gpu(self, gpu_uuid: str) -> None:
        """Reset the simulated GPU (a lost GPU cannot be reset)."""
        self._wait_up()
        fault = self._fault("reset_gpu", gpu_uuid)
        if fault is not None:
            self._misbehave(fault)
        try:
            self.backend.reset_gpu(gpu_uuid)
        except Exception as exc:
            raise NodeOpError(str(exc)) from None

    def reboot(self) -> None:
        """Reboot the simulated node: GPUs come back, the workload restarts.

        A ``never_returns`` fault takes the node down instead (no GPU answers) until `power_cycle`,
        and the call returns only then (or raises when the simulation stops first).
        """
        self._wait_up()
        fault = self._fault("reboot_node")
        if fault is not None and fault.outcome != "never_returns":
            self._misbehave(fault)
        elif fault is not None:
            self._up.clear()
            self.backend.power_off()
            for pid in list(self._alive):
                self._end(pid)
            self._wait_up()
            return  # powered on again by the BMC, which booted it
        self.backend.reboot()
        self._start_all()
        self.reboots += 1

    def power_cycle(self) -> None:
        """An out-of-band power cycle (rasd-sim's BMC): the node boots, whatever state it was in."""
        self.backend.reboot()
        self._start_all()
        self.power_cycles += 1
        self._up.set()

    def fill_troughs(self, gpu_uuids: Sequence[str], floor_w: float, ramp_down_w_per_s: float) -> None:
        """The simulated hook: each GPU's draw is held at floor_w during communication phases."""
        try:
            for gpu_uuid in gpu_uuids:
                self.backend.fill_troughs(gpu_uuid, floor_w, ramp_down_w_per_s)
        except Exception as exc:
            raise NodeOpError(str(exc)) from None

    def run_validation(self, suite: str, gpu_uuids: Sequence[str], seed: int, timeout_s: float) -> ValidationRun:
        """A simulated GPU with silent data corruption fails the known-answer GEMM; others pass.

        A ``verdict_fail`` fault fails every GPU the run checks; ``fail`` and ``hang`` faults make the
        run itself go wrong.
        """
        self._wait_up()
        targets = list(gpu_uuids) or [g.uuid for g in self.backend.inventory()]
        fault = self._fault("run_validation", targets[0] if len(targets) == 1 else "")
        if fault is not None and fault.outcome != "verdict_fail":
            self._misbehave(fault)
            fault = None  # slow: it ran after all
        bad = set(targets) if fault is not None else self.backend.sdc_gpus()
        evidence = fault.describe() if fault is not None else "simulated SDC: result differs from the int64 reference"
        checks = tuple(
            ("v1_known_answer_gemm", uuid, "fail" if uuid in bad else "pass", evidence if uuid in bad else "")
            for uuid in targets
        )
        verdict = "fail" if any(c[2] == "fail" for c in checks) else "pass"
        return ValidationRun(
            verdict=verdict, checks=checks, message=f"simulated {suite} suite on {len(targets)} GPU(s)"
        )
