"""`rasd-sim goodput …`: its command line, and the report (goodput.json, goodput.md) of one run.

The simulation is `goodput` (the job and the baseline) and `goodput_rasd` (the real core); this module
reads the parameters, runs both arms on the same faults and writes what they cost.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

from rasd.common import xid_catalog
from rasd.controller.core.remediation import policy as policy_mod
from rasd.sim import goodput, goodput_faults, goodput_rasd, replay

GOAL_ETTR = 0.97
"""Issue #40: ETTR at Llama 3 rates on 16,384 GPUs with rasd's policy (ByteRobust reports 97 % on 9,600)."""

_FLOAT_PARAMS = (
    "days",
    "rate_scale",
    "checkpoint_interval_s",
    "restart_s",
    "detect_s",
    "crash_detect_s",
    "nccl_timeout_s",
    "step_s",
    "not_ready_s",
    "lost_node_detect_s",
    "manual_delay_s",
    "manual_repair_s",
    "validation_s",
    "rma_s",
)
_INT_PARAMS = ("gpus", "gpus_per_node", "spare_nodes", "nodes_per_rack", "seed")


def build_parser() -> argparse.ArgumentParser:
    """The goodput subcommand's options: every `goodput.Params` field, a policy file and the output."""
    defaults = goodput.Params()
    parser = argparse.ArgumentParser(
        prog="rasd-sim goodput",
        description="Simulate a training job under Llama 3's interruption rate and mix, with rasd's real "
        "decision core and with manual repair; report the effective training time ratio (ETTR) of each.",
    )
    for name in _INT_PARAMS:
        parser.add_argument(f"--{name.replace('_', '-')}", type=int, default=getattr(defaults, name))
    for name in _FLOAT_PARAMS:
        parser.add_argument(f"--{name.replace('_', '-')}", type=float, default=getattr(defaults, name))
    parser.add_argument(
        "--stall-detect-s",
        type=float,
        default=None,
        help="rasd's time from a hung collective to its stall verdict (default: the straggler watch's rule "
        f"over --step-s steps, {defaults.hang_detect_s:.1f} s at the defaults)",
    )
    parser.add_argument(
        "--repair-s",
        action="append",
        default=[],
        metavar="RUNG=SECONDS",
        help=f"a rung's repair time (defaults: {', '.join(f'{k}={v:g}' for k, v in defaults.repair_s.items())})",
    )
    parser.add_argument("--policy", type=pathlib.Path, metavar="FILE", help="a TOML file with a [remediation] table")
    parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path("sim-out"), help="output directory")
    return parser


def params_from(args: argparse.Namespace) -> goodput.Params:
    """The parameters the options name.

    Raises:
        ValueError: a bad value, named (``--repair-s`` of an unknown rung, a negative time, ...).
    """
    repair_s = dict(goodput.Params().repair_s)
    for item in args.repair_s:
        rung, sep, seconds = item.partition("=")
        try:
            if not sep or rung not in repair_s:
                raise ValueError(rung)
            repair_s[rung] = float(seconds)
        except ValueError:
            raise ValueError(
                f"--repair-s {item!r}: expected RUNG=SECONDS with RUNG one of {', '.join(repair_s)}"
            ) from None
    values = {name: getattr(args, name) for name in (*_INT_PARAMS, *_FLOAT_PARAMS)}
    return goodput.Params(**values, repair_s=repair_s, stall_detect_s=args.stall_detect_s)


def run(params: goodput.Params, pol: policy_mod.RemediationPolicy) -> dict[str, Any]:
    """Both arms on the same faults; the report as a JSON-friendly dict."""
    started = time.perf_counter()
    faults = goodput.draw_faults(params)
    catalog = xid_catalog.load_catalog()
    rasd = goodput.simulate(params, faults, lambda world: goodput_rasd.RasdArm(world, pol, catalog))
    baseline = goodput.simulate(params, faults, goodput.BaselineArm)
    injected: dict[str, int] = {}
    for fault in faults:
        injected[fault.cause] = injected.get(fault.cause, 0) + 1
    return {
        "params": {**dataclasses.asdict(params), "job_nodes": params.job_nodes},
        "hang_detect_s": round(params.hang_detect_s, 3),
        "faults_injected": len(faults),
        "faults_by_cause": dict(sorted(injected.items(), key=lambda kv: -kv[1])),
        "arms": {arm.name: _arm(arm) for arm in (rasd, baseline)},
        "goal": {"ettr_min": GOAL_ETTR, "met": rasd.ettr >= GOAL_ETTR},
        "elapsed_s": round(time.perf_counter() - started, 3),
    }


def _arm(result: goodput.ArmResult) -> dict[str, Any]:
    return {
        "ettr": round(result.ettr, 5),
        "time_lost_h": {k: round(v, 3) for k, v in result.time_lost_h.items()},
        "progress_h": round(result.progress_h, 3),
        "wall_h": round(result.wall_h, 3),
        "interruptions": sum(result.interruptions.values()),
        "interruptions_by_cause": dict(sorted(result.interruptions.items(), key=lambda kv: -kv[1])),
        "faults_while_down": result.faults_while_down,
        "repairs_by_a_person": result.people,
        **result.detail,
    }


def markdown(report: Mapping[str, Any]) -> str:
    """The report as a page: ETTR side by side, time lost by reason, interruptions by cause."""
    p, arms = report["params"], report["arms"]
    rasd, base = arms["rasd"], arms["baseline"]
    lines = [
        "# rasd-sim goodput",
        "",
        f"{p['gpus']:,} GPUs ({p['job_nodes']:,} nodes, {p['spare_nodes']} spares), {p['days']:g} days, seed "
        f"{p['seed']}, {report['faults_injected']} faults (Llama 3's rate per GPU, {goodput_faults.LLAMA3_UNEXPECTED} "
        f"in {goodput_faults.LLAMA3_DAYS:g} days on {goodput_faults.LLAMA3_GPUS:,} GPUs, × {p['rate_scale']:g}); "
        f"checkpoint every {p['checkpoint_interval_s']:g} s, restart {p['restart_s']:g} s, a person after "
        f"{p['manual_delay_s']:g} s; a hung collective: rasd names it {report['hang_detect_s']:.1f} s after "
        f"({p['step_s']:g} s steps), the watchdog {p['nccl_timeout_s']:g} s. "
        f"Simulated in {report['elapsed_s']:.1f} s.",
        "",
        "| | rasd | baseline (manual) |",
        "|---|---:|---:|",
        f"| ETTR | {rasd['ettr']:.2%} | {base['ettr']:.2%} |",
        *(
            f"| time lost to {reason}, h | {rasd['time_lost_h'][reason]:.1f} | {base['time_lost_h'][reason]:.1f} |"
            for reason in ("detection", "repair", "restart", "lost_work")
        ),
        f"| interruptions (faults while already down) | {rasd['interruptions']} ({rasd['faults_while_down']}) | "
        f"{base['interruptions']} ({base['faults_while_down']}) |",
        f"| repairs by a person | {rasd['repairs_by_a_person']} | {base['repairs_by_a_person']} |",
        "",
        f"rasd's commands: {', '.join(f'{k} {v}' for k, v in rasd['commands'].items())}; deferred by the "
        f"disruption budget: {rasd['commands_deferred_by_budget']}; left to a person: {rasd['left_to_person']}; "
        f"breaker trips: {rasd['breaker_trips']}.",
        "",
        "| cause | injected | interrupted (rasd) |",
        "|---|---:|---:|",
        *(
            f"| {cause} | {count} | {rasd['interruptions_by_cause'].get(cause, 0)} |"
            for cause, count in report["faults_by_cause"].items()
        ),
        "",
        f"Goal: ETTR ≥ {report['goal']['ettr_min']:.0%} with rasd's policy: "
        + ("met" if report["goal"]["met"] else "NOT met"),
    ]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    """Run `rasd-sim goodput` and write OUT/goodput.json and OUT/goodput.md."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        params = params_from(args)
    except ValueError as exc:
        parser.error(str(exc))
    pol = policy_mod.RemediationPolicy()
    if args.policy is not None:
        try:
            pol = policy_mod.RemediationPolicy.from_mapping(replay.load_policy_overrides(args.policy))
        except replay.PolicyFileError as exc:
            parser.error(f"--policy {exc}")
    report = run(params, pol)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "goodput.json").write_text(json.dumps(report, indent=2) + "\n")
    page = markdown(report)
    (args.out / "goodput.md").write_text(page)
    print(page)
    print(f"rasd-sim: wrote {args.out / 'goodput.json'} and {args.out / 'goodput.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
