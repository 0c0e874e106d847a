"""``rasd-validate``: the node-side SDC validation suite's command line.

Parses arguments, builds the optional hooks (health values, golden store, fault injector), runs the
suite and prints a table or one JSON object on stdout; progress, one line as each check starts and
ends (a live bar on a TTY), goes to stderr (``rasd.validation.progress``). torch is imported only
when a suite runs, so ``--help`` works without the ``rasd[validate]`` extra.

Exit codes: 0 pass; 1 fail or suspect; 2 software drift, or a usage error (bad arguments, torch
missing, no CUDA device); 3 incomplete (the time budget ran out before every check finished); 4 internal
error (a bug in the suite, never a GPU verdict).
"""

from __future__ import annotations

import argparse
import json
import sys
import traceback
from collections.abc import Sequence

from rasd.validation import golden as golden_store
from rasd.validation.context import EccCounts, EccProbe, HealthProvider, HealthSnapshot
from rasd.validation.faults import FAULT_CHECKS, FaultInjector, FaultKind
from rasd.validation.progress import ProgressPrinter
from rasd.validation.registry import BUDGET_S, CHECKS, SUITES
from rasd.validation.runner import SuiteReport, goldens_to_record, run_suite
from rasd.validation.runtime import TorchMissing, require_torch, set_determinism_env, visible_gpus

USAGE_ERROR = 2
INTERNAL_ERROR = 4

_EPILOG = """\
exit codes: 0 pass, 1 fail or suspect, 2 software drift or usage error, 3 incomplete (budget),
4 internal error (a bug in the suite)

checks: V0 health gate, V1 known-answer GEMM, V3 ABFT hot stress, V2 bitwise GEMM vs golden/peers,
V4 HBM patterns + ECC watch, V5 transfer integrity, V6 collectives (run in that order).
On --device cpu the "GPUs" are logical slots of the host CPU (default 3): the code paths run, the
hardware is not tested. See validation/README.md for which checks need a GPU to mean anything.

--inject-fault proves the checks can fail: bitflip (V1 V2 V3 V4 V5 V6), stuck-bit, coupling and
alias (V4), drift (V2: the golden differs from every GPU alike -> software_drift, exit 2).
"""


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="rasd-validate",
        description="In-field GPU correctness (SDC) validation suite.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--suite", choices=SUITES, default="quick", help="which suite (default: quick)")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="compute device (default: cuda)")
    p.add_argument("--gpus", help="comma-separated GPU indices (default: all visible; cpu: 0,1,2)")
    p.add_argument("--seed", type=int, default=0, help="seed for every operand and pattern (default: 0)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    p.add_argument(
        "--time-budget-s",
        type=float,
        help="override the suite budget ("
        + ", ".join(f"{s} {int(b)} s" for s, b in BUDGET_S.items())
        + "); work stops and is reported incomplete when it runs out",
    )
    p.add_argument("--checks", help="comma-separated subset of checks to run, e.g. V1,V2")
    p.add_argument("--health-json", metavar="FILE", help='V0 input: {"gpus": {"0": {"row_remap_pending": false, ...}}}')
    p.add_argument(
        "--ecc-json",
        metavar="FILE",
        help='V4 ECC watch: a file kept current by the agent, {"gpus": {"0": {"correctable": n, '
        '"uncorrectable": m}}}, read before and after the memory test',
    )
    p.add_argument("--golden", metavar="FILE", help="V2 golden store (JSON); without it V2 votes among peers only")
    p.add_argument(
        "--record-golden",
        action="store_true",
        help="add this run's unanimous V2 results to --golden (only if V2 passed with >= 2 GPUs per key)",
    )
    inj = p.add_argument_group("fault injection (proves the checks can fail)")
    inj.add_argument("--inject-fault", choices=[k.value for k in FaultKind], help="fault class to inject")
    inj.add_argument("--inject-gpu", type=int, help="GPU to corrupt (default: the last one under test)")
    inj.add_argument("--inject-check", help="comma-separated checks to inject into (default: all of its class)")
    inj.add_argument("--inject-bit", type=int, help="bit to corrupt (default depends on the kind)")
    inj.add_argument("--inject-index", type=int, help="element or word index (default: the middle one)")
    inj.add_argument("--inject-once", action="store_true", help="one-off fault (expect suspect, not fail)")
    return p


def _csv_ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def _csv_ids(text: str) -> list[str]:
    return [x.strip().upper() for x in text.split(",") if x.strip()]


def _health_provider(path: str) -> HealthProvider:
    with open(path) as fh:
        data = json.load(fh)
    snapshots = {int(k): HealthSnapshot.from_json(v) for k, v in data.get("gpus", {}).items()}
    return lambda gpu: snapshots.get(gpu)


def _ecc_file_probe(path: str) -> EccProbe:
    """An ECC watch that re-reads ``path`` on every call (the agent rewrites it as it polls NVML)."""

    def probe(gpu: int) -> EccCounts | None:
        try:
            with open(path) as fh:
                entry = json.load(fh).get("gpus", {}).get(str(gpu))
        except (OSError, ValueError):
            return None  # unreadable now: the watch reports itself unavailable, it does not guess
        if entry is None:
            return None
        return EccCounts(correctable=int(entry["correctable"]), uncorrectable=int(entry["uncorrectable"]))

    return probe


def _table(report: SuiteReport) -> str:
    lines = [
        f"rasd-validate {report.suite} on {report.device} gpus={list(report.gpus)} seed={report.seed}: "
        f"{report.verdict.value.upper()} in {report.duration_s:.1f} s (budget {report.time_budget_s:.0f} s)"
    ]
    for c in report.checks:
        lines.append(f"  {c.check} {c.title:<42} {c.verdict.value:<15} {c.duration_s:7.2f} s  {c.reason}")
        for g in c.failures():
            for e in g.evidence[:3]:
                lines.append(f"      gpu {g.gpu}: {e.case} @ {e.location}: expected {e.expected}, got {e.got} {e.note}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``rasd-validate``; returns the process exit code."""
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        if args.record_golden and not args.golden:
            parser.error("--record-golden needs --golden FILE")
        only = _csv_ids(args.checks) if args.checks else None
        if only:
            unknown = set(only) - set(CHECKS)
            if unknown:
                parser.error(f"unknown check(s) {sorted(unknown)}; known: {', '.join(CHECKS)}")
        set_determinism_env()  # before torch loads cuBLAS; run_suite applies the torch half
        if args.device == "cuda":
            torch = require_torch()
            if not torch.cuda.is_available():
                print("rasd-validate: no CUDA device visible; use --device cpu to exercise the suite", file=sys.stderr)
                return USAGE_ERROR
        gpus = _csv_ints(args.gpus) if args.gpus else visible_gpus(args.device)
        if not gpus:
            parser.error("no GPUs to test")
        if args.device == "cuda":
            missing = [g for g in gpus if not 0 <= g < torch.cuda.device_count()]
            if missing:
                parser.error(f"--gpus {missing} not visible ({torch.cuda.device_count()} CUDA device(s))")
        injector = None
        if args.inject_fault:
            kind = FaultKind(args.inject_fault)
            checks = frozenset(_csv_ids(args.inject_check)) if args.inject_check else None
            if checks is not None and not checks & FAULT_CHECKS[kind]:
                parser.error(f"{kind.value} is caught by {sorted(FAULT_CHECKS[kind])}, not {sorted(checks)}")
            injector = FaultInjector(
                kind=kind,
                gpu=gpus[-1] if args.inject_gpu is None else args.inject_gpu,
                checks=checks,
                bit=args.inject_bit,
                index=args.inject_index,
                occurrences=1 if args.inject_once else None,
            )
            if injector.gpu not in gpus:
                parser.error(f"--inject-gpu {injector.gpu} is not among the GPUs under test {gpus}")
        health = _health_provider(args.health_json) if args.health_json else None
        if args.golden:
            golden_store.load(args.golden)  # a malformed store is a usage error, found before any work
    except (TorchMissing, OSError, ValueError) as exc:
        print(f"rasd-validate: {exc}", file=sys.stderr)
        return USAGE_ERROR
    try:
        with ProgressPrinter(sys.stderr) as progress:
            report = run_suite(
                args.suite,
                args.device,
                gpus,
                seed=args.seed,
                time_budget_s=args.time_budget_s,
                injector=injector,
                health=health,
                ecc_probe=_ecc_file_probe(args.ecc_json) if args.ecc_json else None,
                golden_path=args.golden,
                only=only,
                progress=progress,
            )
    except TorchMissing as exc:
        print(f"rasd-validate: {exc}", file=sys.stderr)
        return USAGE_ERROR
    except Exception:  # a bug in the suite: never let it read as a verdict about a GPU
        traceback.print_exc()
        print("rasd-validate: internal error (a bug in the suite, not a GPU verdict)", file=sys.stderr)
        return INTERNAL_ERROR
    if args.record_golden and injector is None:
        entries = goldens_to_record(report)
        if entries:
            golden_store.save(args.golden, golden_store.merge(golden_store.load(args.golden), entries))
    if args.json:
        print(json.dumps(report.to_json(), indent=2))
    else:
        print(_table(report))
    return report.exit_code


if __name__ == "__main__":
    sys.exit(main())
