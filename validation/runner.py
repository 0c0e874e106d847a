"""Runs one suite: determinism once, then each check's run() and judge() within the suite's budget.

The runner is the edge that owns the clocks: it stamps start and finish times, gives each check the
remaining budget, and shortens V3's stress phases when the remaining budget cannot hold them (the
report says so).

A check whose run() raises ``RuntimeError`` (how torch surfaces CUDA, cuBLAS, NCCL and driver errors)
is reported ``suspect`` with the error as the reason: a crash while driving a GPU is not a pass, and
the controller's suspect path retests it. Any other exception is a bug in the suite and propagates, so
it can never be mistaken for a verdict about a GPU. A check that could not start because the budget
was spent is ``incomplete`` with reason ``budget``.

Progress: ``run_suite(progress=...)`` is told as each check starts (``CheckStarted``) and ends
(``CheckFinished``), so the CLI can show where a suite of several minutes is; the report is the same
with or without it.

Exit codes (``SuiteReport.exit_code``): 0 pass, 1 fail or suspect, 2 software drift (and usage errors,
raised by the CLI), 3 incomplete (budget ran out; nothing worse seen). The CLI adds 4 for an internal
error (a bug in the suite).
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from rasd.validation import registry
from rasd.validation.checks import v2_bitwise
from rasd.validation.context import EccProbe, HealthProvider, RunContext
from rasd.validation.faults import FaultInjector
from rasd.validation.model import CheckResult, GpuResult, Verdict, worst
from rasd.validation.runtime import Budget, TorchMissing, devices_from, setup_determinism

EXIT_CODES = {
    Verdict.PASS: 0,
    Verdict.SKIPPED: 0,
    Verdict.FAIL: 1,
    Verdict.SUSPECT: 1,
    Verdict.SOFTWARE_DRIFT: 2,
    Verdict.INCOMPLETE: 3,
}
# Kept back from the budget for judging, report writing and process exit.
_MARGIN_S = 1.0


@dataclasses.dataclass(frozen=True)
class CheckStarted:
    """A check is about to run."""

    check: str
    title: str
    position: int
    """1-based place of the check in this run."""
    total: int
    """How many checks this run has."""


@dataclasses.dataclass(frozen=True)
class CheckFinished:
    """A check has its verdict (or could not start: ``incomplete``, budget)."""

    result: CheckResult
    position: int
    total: int
    elapsed_s: float
    """Wall time of its run() and judge() by the suite's clock; 0 when it did not start."""


ProgressEvent = CheckStarted | CheckFinished
Progress = Callable[[ProgressEvent], None]
"""Called on the suite's thread as each check starts and ends; it must return promptly."""


@dataclasses.dataclass(frozen=True)
class SuiteReport:
    """Everything ``--json`` prints: one object for the whole run."""

    suite: str
    device: str
    seed: int
    gpus: tuple[int, ...]
    started: datetime.datetime
    finished: datetime.datetime
    duration_s: float
    time_budget_s: float
    checks: tuple[CheckResult, ...]
    fault_injection: dict[str, Any] | None = None
    raw: dict[str, Any] = dataclasses.field(default_factory=dict, repr=False)

    @property
    def verdict(self) -> Verdict:
        """The worst check verdict; ``pass`` when every check passed or was skipped."""
        v = worst(c.verdict for c in self.checks)
        return Verdict.PASS if v is Verdict.SKIPPED else v

    @property
    def exit_code(self) -> int:
        """Process exit code for this report (see the module docstring)."""
        return EXIT_CODES[self.verdict]

    def to_json(self) -> dict[str, Any]:
        """The documented JSON object."""
        return {
            "schema": "rasd.validation.report/v1",
            "suite": self.suite,
            "device": self.device,
            "seed": self.seed,
            "gpus": list(self.gpus),
            "started": self.started.isoformat(),
            "finished": self.finished.isoformat(),
            "duration_s": round(self.duration_s, 3),
            "time_budget_s": self.time_budget_s,
            "verdict": self.verdict.value,
            "exit_code": self.exit_code,
            "fault_injection": self.fault_injection,
            "checks": [c.to_json() for c in self.checks],
        }


def run_suite(
    suite: str,
    device: str,
    gpus: Sequence[int],
    *,
    seed: int = 0,
    time_budget_s: float | None = None,
    injector: FaultInjector | None = None,
    health: HealthProvider | None = None,
    ecc_probe: EccProbe | None = None,
    golden_path: str | None = None,
    only: Sequence[str] | None = None,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
    progress: Progress | None = None,
) -> SuiteReport:
    """Run ``suite`` on ``gpus`` of kind ``device`` and return the judged report.

    Args:
        suite: "quick", "accusation" or "post-repair".
        device: "cuda" or "cpu".
        gpus: GPU indices (CPU: logical slot numbers).
        seed: suite seed; sweeps rotate it to vary operands.
        time_budget_s: override of the suite's budget.
        injector: fault injection hook (``--inject-fault``); None on real runs.
        health: V0 telemetry source; None = unknown (V0 skipped).
        ecc_probe: V4 ECC watch; None = unavailable.
        golden_path: V2 golden store; None = peers only.
        only: run just these check ids (tests, targeted retests); None = the whole suite.
        sleep: idle wait used by V3's pulsed phase.
        clock: monotonic clock for the budget.
        progress: told as each check starts and ends (``CheckStarted``, ``CheckFinished``); None: nobody.

    Raises:
        TorchMissing: torch is not installed.
        ValueError: unknown suite, device or check id.
    """
    specs = registry.profile(suite, device)
    wanted = _wanted(specs, only)
    budget_s = registry.BUDGET_S[suite] if time_budget_s is None else float(time_budget_s)
    started_wall = datetime.datetime.now(datetime.UTC)
    budget = Budget(max(0.0, budget_s - _MARGIN_S), clock)
    t0 = clock()
    setup_determinism(seed)
    devices = devices_from(gpus, device)
    new_context = functools.partial(
        RunContext,
        devices=devices,
        seed=seed,
        budget=budget,
        injector=injector,
        health=health,
        ecc_probe=ecc_probe,
        golden_path=golden_path,
        sleep=sleep,
    )
    results, raws = _run_checks(wanted, specs, new_context, clock, concurrent=device == "cuda", progress=progress)
    return SuiteReport(
        suite=suite,
        device=device,
        seed=seed,
        gpus=tuple(gpus),
        started=started_wall,
        finished=datetime.datetime.now(datetime.UTC),
        duration_s=clock() - t0,
        time_budget_s=budget_s,
        checks=tuple(results),
        fault_injection=injector.describe() if injector is not None else None,
        raw=raws,
    )


def _run_checks(
    wanted: Sequence[str],
    specs: Mapping[str, Any],
    new_context: Callable[[], RunContext],
    clock: Callable[[], float],
    *,
    concurrent: bool,
    progress: Progress | None,
) -> tuple[list[CheckResult], dict[str, Any]]:
    """Run and judge the wanted checks in order within the budget; (their results, their raw outputs).

    Each check gets a fresh RunContext from new_context; progress is told as each starts and ends.
    """
    tell = progress or (lambda _event: None)
    results: list[CheckResult] = []
    raws: dict[str, Any] = {}
    total = len(wanted)
    for position, check_id in enumerate(wanted, start=1):
        check = registry.CHECKS[check_id]
        ctx = new_context()
        if ctx.budget.exhausted():
            results.append(_not_started(check, ctx.devices))
            tell(CheckFinished(results[-1], position, total, elapsed_s=0.0))
            continue
        tell(CheckStarted(check.id, check.title, position, total))
        started = clock()
        runs = 1 if concurrent else len(ctx.devices)
        spec = _fit_stress(specs[check_id], ctx.budget, runs=runs, later_checks=total - position)
        result, raw = _run_check(check, spec, ctx, clock, scaled=spec is not specs[check_id])
        if raw is not None:
            raws[check_id] = raw
        results.append(result)
        tell(CheckFinished(result, position, total, elapsed_s=clock() - started))
    return results, raws


def _wanted(specs: Mapping[str, Any], only: Sequence[str] | None) -> list[str]:
    """The suite's check ids to run, in suite order: all, or those in only (ValueError naming any unknown)."""
    wanted = list(specs) if only is None else [c for c in specs if c in set(only)]
    unknown = set(only or ()) - set(specs)
    if unknown:
        raise ValueError(f"unknown check(s) {sorted(unknown)}; known: {', '.join(specs)}")
    return wanted


def _fit_stress(spec: Any, budget: Budget, *, runs: int, later_checks: int) -> Any:
    """spec, or a copy with its stress phases shortened to fit the budget left (V3), sharing it with later checks.

    Args:
        spec: the check's spec from the suite's profile.
        budget: the suite's budget.
        runs: how many times the stress runs back to back (1 when the devices run concurrently).
        later_checks: how many checks of the suite come after this one.
    """
    planned = registry.stress_seconds(spec) * runs
    if planned > 0:
        # Leave the later checks a share of what is left: V3 fills, it must not starve them.
        room = budget.remaining_s() * (1.0 - 0.08 * later_checks)
        if planned > room:
            return registry.scale_stress(spec, max(0.0, room) / planned)
    return spec


def _run_check(
    check: registry.Check, spec: Any, ctx: RunContext, clock: Callable[[], float], *, scaled: bool
) -> tuple[CheckResult, dict[str, Any] | None]:
    """Run and judge one check; (its result, its raw output, or None when run() crashed)."""
    t_check = clock()
    try:
        raw = check.run(spec, ctx)
    except TorchMissing:
        raise
    except RuntimeError as exc:  # CUDA, cuBLAS, NCCL, driver errors: see the module docstring
        return _crashed(check, ctx.devices, exc, clock() - t_check), None
    result = check.judge(raw, spec)
    if scaled:
        result = dataclasses.replace(
            result, details={**result.details, "scaled_to_budget": registry.stress_seconds(spec)}
        )
    return result, raw


def _not_started(check: registry.Check, devices: Sequence[Any]) -> CheckResult:
    return CheckResult(
        check.id,
        check.title,
        Verdict.INCOMPLETE,
        "incomplete: budget (not started)",
        tuple(GpuResult(d.gpu, Verdict.INCOMPLETE, "not started: budget") for d in devices),
    )


def _crashed(check: registry.Check, devices: Sequence[Any], exc: Exception, duration_s: float) -> CheckResult:
    reason = f"run() raised {type(exc).__name__}: {exc}"
    return CheckResult(
        check.id,
        check.title,
        Verdict.SUSPECT,
        reason,
        tuple(GpuResult(d.gpu, Verdict.SUSPECT, reason) for d in devices),
        duration_s=duration_s,
    )


def goldens_to_record(report: SuiteReport) -> dict[str, dict[str, dict[str, Any]]]:
    """V2 golden entries this run may record: only from a V2 that passed with unanimous peers."""
    v2 = next((c for c in report.checks if c.check == "V2"), None)
    raw = report.raw.get("V2")
    if v2 is None or raw is None or v2.verdict is not Verdict.PASS:
        return {}
    return v2_bitwise.unanimous_goldens(raw)
