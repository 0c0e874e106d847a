"""Benchmark of the power manager end to end: simulated GPUs, real agents, real controller, loopback gRPC.

Run: `.venv/bin/python bench/power.py [--nodes 16 --gpus-per-node 64 --duration-s 60]`

Five `rasd-sim` runs of one step-synchronous job (B200-class simulated GPUs, which have power-smoothing
hardware; 650-700 W compute for 70 % of a 2 s step, 100-150 W communication; 5-20 ms jitter per rank
and step), each with an unmanaged twin of the same seed evaluated over the same instants:

1. **swing and cuts**: a cluster budget that does not bind (1,000 W per GPU); the controller detects
   the swing and applies a power-smoothing profile (target: 10 % of the unmanaged swing). Swing,
   in-band attenuation, step-time cost and energy overhead are measured from smoothing + 3 s up to
   the first budget cut; then a node's budget and a rack's budget are cut through AdminService and
   the time until the limits on the GPUs are within the new budget is measured (polled every 10 ms).
2. **emulated**: the same job on H100-class GPUs (no smoothing hardware) with the trough filler
   allowed: swing, attenuation, step-time and energy cost of emulated smoothing (the node-side
   trough-filler hook holds the floor).
3. **sloshing**: a binding cluster budget (585 W per GPU against ~675 W of compute demand); at
   `--load-change-s` the job stops on 2 nodes (a load change). Stranded power (the allocator's
   headroom held by uncapped GPUs while some are capped) is sampled every control period: steady
   state before the change, and how many periods after it until it is <= 5 % of the budget again
   (watts a raise granted and the draw cannot show yet, `settling` in `rasd.controller.core.power.allocate`,
   are reported beside it, and the convergence counting them as stranded too).
4. **job start**: the same job starts 15 s into the run on GPUs that idled until then, with the
   job-start cap ramp on (`job_start_ramp_enabled`): the controller parks the idle GPUs at their
   minimum limit (200 W) and raises their caps at the aggregate ramp limit when the job starts: each
   ramping GPU's raise carries its share of the limit as a rate, and its agent slews the limit at
   it, so the limits that land rise at most at the limit however the commands are delivered. The
   limit is 150 kW/s: the smallest a cap ramp can honour here, since the jump from idle draw (70 W)
   to the minimum limit is 1,024 x 130 W = 133 kW within the first second and no cap goes lower
   (the ramp waits 1 s after the controller sees the start, so the jump's window holds no raise).
   The cap ramp shapes only the envelope: the step's own swing (all ranks in phase) rides under the
   rising cap. So the GPUs that start also get a power-smoothing profile at once (policy
   `job_start_smoothing_enabled`, `rasd.controller.core.power.start_smoothing`): ramp-up and ramp-down
   rate = their share of the limit, the firmware's lowest floor; 8 canary GPUs keep no profile so
   the detector sees the unmanaged swing through them, and once it has, the swing plan's profile
   replaces the start profiles. Reported: the 1 s aggregate ramp of the draw over the start, jump
   included (raw, and over the one-step average), managed and unmanaged, and the raw one from the
   start to the end of the run (the hand-over included); the 1 s rise of the summed limits the GPUs
   enforce (the landed cap changes alone); and what the start costs in step time
   (`power_sim.job_start_section`).
5. **job start, steady load**: run 4 with a job that draws its compute power in the communication
   phase too (no step swing), so the 1 s figure measures the start alone; no swing shows up, so the
   start profiles are released `job_start_smoothing_release_s` (8 s) after the cap ramp.

Writes the `## Power manager` section of bench/RESULTS.md. Every figure is measured; a goal not met
is printed as NOT met.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import pathlib
import sys
import tempfile
import time
from typing import Any

import results

from rasd.common import logging as rasd_logging
from rasd.sim import fleet, power_sim, scenario

SECTION = "## Power manager"
GOALS = {
    "swing_reduction_pct": 70.0,
    "band_power_attenuation_db": 20.0,
    "step_time_cost_pct": 1.0,
    "energy_ratio_to_min": 1.1,
    "stranded_pct": 5.0,
    "converge_periods": 3,
    "node_cut_s": 1.0,
    "rack_cut_s": 3.0,
}
JOB_START_AT_S = 15.0
JOB_START_RAMP_W_PER_S = 150_000.0
JOB_START_RELEASE_S = 8.0


def _scenario(name: str, power: dict[str, Any], **workload: float) -> scenario.Scenario:
    data = {
        "name": name,
        "workload": {
            "period_s": 2.0,
            "compute_fraction": 0.7,
            "compute_w": [650.0, 700.0],
            "comm_w": [100.0, 150.0],
            **workload,
        },
        "power": {"gpu_model": "b200", "detect_window_s": 10.0, "draw_window_s": 6.0, **power},
    }
    return scenario.parse(data, source=name)


def _run(
    scen: scenario.Scenario, args: argparse.Namespace, out_dir: pathlib.Path, duration_s: float | None = None
) -> fleet.SimResult:
    settings = fleet.SimSettings(
        nodes=args.nodes,
        gpus_per_node=args.gpus_per_node,
        duration_s=duration_s or args.duration_s,
        seed=args.seed,
        scenario=scen,
        out_dir=out_dir,
        table_interval_s=0,
    )
    with open("/dev/null", "w") as sink:
        return asyncio.run(fleet.run(settings, out=sink))


def swing_and_cuts(args: argparse.Namespace, tmp: pathlib.Path) -> dict[str, Any]:
    """Run 1: swing, attenuation, step-time and energy cost, then a node and a rack budget cut."""
    gpus = args.nodes * args.gpus_per_node
    cut_at = args.duration_s - 14.0
    node_budget = int(args.gpus_per_node * 450)
    rack_budget = int(args.gpus_per_node * 4 * 500)
    scen = _scenario(
        "power-swing",
        {
            "cluster_budget_w": gpus * 1000,
            "policy": {"control_period_s": 2.0, "command_ttl_s": 3.0, "swing_target_pct": 10.0},
            "budget_changes": [
                {"at_s": cut_at, "domain": "node-000", "budget_w": node_budget},
                {"at_s": cut_at + 5.0, "domain": "rack-01", "budget_w": rack_budget},
            ],
        },
    )
    result = _run(scen, args, tmp / "swing")
    assert result.power_trace is not None and scen.power is not None
    figures = power_sim.report_section(result.power_trace, scen.power.policy, measure_until_s=cut_at)
    figures["wall_s"] = round((result.finished_unix_ns - result.started_unix_ns) / 1e9, 1)
    figures["cpu_s"] = round(result.cpu_s, 1)
    return figures


def emulated(args: argparse.Namespace, tmp: pathlib.Path) -> dict[str, Any]:
    """Run 2: the same job on H100-class GPUs (no smoothing hardware): emulated smoothing.

    The policy allows the node-side trough filler (the simulated hook holds each GPU's draw at the
    floor during communication phases); the cluster budget does not bind.
    """
    gpus = args.nodes * args.gpus_per_node
    scen = _scenario(
        "power-emulated",
        {
            "gpu_model": "h100",
            "cluster_budget_w": gpus * 700,
            "policy": {
                "control_period_s": 2.0,
                "command_ttl_s": 3.0,
                "swing_target_pct": 10.0,
                "trough_filler_enabled": True,
            },
        },
    )
    result = _run(scen, args, tmp / "emulated")
    assert result.power_trace is not None and scen.power is not None
    figures = power_sim.report_section(result.power_trace, scen.power.policy)
    figures["wall_s"] = round((result.finished_unix_ns - result.started_unix_ns) / 1e9, 1)
    return figures


def sloshing(args: argparse.Namespace, tmp: pathlib.Path) -> dict[str, Any]:
    """Run 3: stranded power under a binding budget, before and after the job stops on 2 nodes."""
    gpus = args.nodes * args.gpus_per_node
    budget = gpus * 585
    period = 2.0
    scen = _scenario(
        "power-sloshing",
        {
            "cluster_budget_w": budget,
            "policy": {"control_period_s": period, "command_ttl_s": 3.0, "swing_target_pct": 10.0},
            "load_changes": [{"at_s": args.load_change_s, "nodes": 2, "running": False}],
        },
    )
    result = _run(scen, args, tmp / "slosh")
    trace = result.power_trace
    assert trace is not None
    change = trace.load_changes_s[0] if trace.load_changes_s else args.load_change_s
    before = [w for t, w in trace.stranded_w if change - 10.0 <= t < change]
    after = [(t, w) for t, w in trace.stranded_w if t >= change]
    # The same, counting as stranded the watts a raise granted that the draw does not show yet.
    in_transit = dict(trace.settling_w)
    after_raw = [(t, w + in_transit.get(t, 0.0)) for t, w in after]

    def converged(series: list[tuple[float, float]]) -> tuple[int | None, float | None]:
        """The first period (1-based) from which stranded power stays <= 5 % of the budget, and its time."""
        first = None
        for i in range(len(series), 0, -1):
            if series[i - 1][1] > 0.05 * budget:
                break
            first = i
        return first, (round(series[first - 1][0] - change, 2) if first else None)

    periods, seconds = converged(after)
    periods_raw, seconds_raw = converged(after_raw)
    steady = [w for t, w in after if t >= change + 4 * period]
    return {
        "budget_w": budget,
        "stranded_pct_before": round(100 * sum(before) / len(before) / budget, 2) if before else None,
        "stranded_pct_after_peak": round(100 * max(w for _, w in after) / budget, 2) if after else None,
        "stranded_pct_steady_after": round(100 * sum(steady) / len(steady) / budget, 2) if steady else None,
        "control_period_s": period,
        # The goal counts control periods, a time (control_period_s each); the loop also runs early
        # when acks let waiting raises go, and `converge_periods` counts those runs too (stricter).
        "converge_control_periods": None if seconds is None else max(1, math.ceil(seconds / period - 1e-9)),
        "converge_periods": periods,
        "converge_s": seconds,
        "converge_periods_with_in_transit": periods_raw,
        "converge_s_with_in_transit": seconds_raw,
        "in_transit_pct_peak": round(100 * max((in_transit.get(t, 0.0) for t, _ in after), default=0.0) / budget, 2),
        "budget_violations": trace.violations,
        "wall_s": round((result.finished_unix_ns - result.started_unix_ns) / 1e9, 1),
    }


def job_start(args: argparse.Namespace, tmp: pathlib.Path, *, steady: bool = False) -> dict[str, Any]:
    """Runs 4 and 5: the job starts on parked GPUs; the 1 s aggregate ramp over the start and its cost.

    steady: the job draws its compute power in the communication phase too (no step swing), so the
    1 s figure measures the start alone.
    """
    gpus = args.nodes * args.gpus_per_node
    workload: dict[str, Any] = {"start_after_s": JOB_START_AT_S}
    if steady:
        workload["comm_w"] = [650.0, 700.0]
    scen = _scenario(
        "power-job-start-steady" if steady else "power-job-start",
        {
            "cluster_budget_w": gpus * 1000,
            "policy": {
                "control_period_s": 1.0,
                "command_ttl_s": 3.0,
                "swing_target_pct": 10.0,
                "job_start_ramp_enabled": True,
                "job_start_idle_s": 5.0,
                "ramp_limit_w_per_s": JOB_START_RAMP_W_PER_S,
                "job_start_smoothing_release_s": JOB_START_RELEASE_S,
            },
        },
        **workload,
    )
    result = _run(scen, args, tmp / scen.name, duration_s=min(args.duration_s, JOB_START_AT_S + 25.0))
    trace = result.power_trace
    assert trace is not None
    figures = power_sim.job_start_section(trace, period_s=2.0)
    figures["budget_violations"] = trace.violations
    figures["wall_s"] = round((result.finished_unix_ns - result.started_unix_ns) / 1e9, 1)
    return figures


def _verdict(ok: bool | None) -> str:
    return "met" if ok else ("not measured" if ok is None else "NOT met")


def _le(value: float | None, goal: float) -> bool | None:
    return None if value is None or (isinstance(value, float) and math.isnan(value)) else value <= goal


def _ge(value: float | None, goal: float) -> bool | None:
    return None if value is None else value >= goal


def _smoothing_rows(figures: dict, labels: tuple[str, str, str, str]) -> list[tuple]:
    """The four smoothing goal rows (swing, band, step cost, energy) of one run, under its own labels."""
    swing_label, band_label, step_label, energy_label = labels
    return [
        (swing_label, f"{figures.get('swing_reduction_pct')} %", ">= 70 %",
         _ge(figures.get("swing_reduction_pct"), GOALS["swing_reduction_pct"])),
        (band_label, f"{figures.get('band_power_attenuation_db')} dB", ">= 20 dB",
         _ge(figures.get("band_power_attenuation_db"), GOALS["band_power_attenuation_db"])),
        (step_label, f"{figures.get('step_time_cost_pct')} %", "<= 1 %",
         _le(figures.get("step_time_cost_pct"), GOALS["step_time_cost_pct"])),
        (energy_label,
         f"{figures.get('energy_overhead_pct')} % / {figures.get('energy_overhead_analytic_min_pct')} % "
         f"(ratio {figures.get('energy_overhead_ratio_to_min')})", "ratio <= 1.1",
         _le(figures.get("energy_overhead_ratio_to_min"), GOALS["energy_ratio_to_min"])),
    ]  # fmt: skip


def _checks(swing: dict, emu: dict, slosh: dict, start: dict, steady: dict) -> list[tuple]:
    """The goal table's rows (figure, measured, goal, met): a data table."""
    cuts = {c["level"]: c for c in swing.get("budget_cuts", [])}
    node_cut = cuts.get("node", {}).get("enforced_s")
    rack_cut = cuts.get("rack", {}).get("enforced_s")
    return [
        *_smoothing_rows(
            swing,
            ("peak-to-peak swing reduced", "0.1-2 Hz band power attenuation", "step-time cost (floors and ramps)",
             "energy overhead / analytic minimum for the floor"),
        ),
        *_smoothing_rows(
            emu,
            ("emulated (H100-class, trough filler): swing reduced", "emulated: 0.1-2 Hz band power attenuation",
             "emulated: step-time cost", "emulated: energy overhead / analytic minimum for the floor"),
        ),
        ("stranded power at steady state (sloshing run, before the change)",
         f"{slosh['stranded_pct_before']} % of budget", "<= 5 %",
         _le(slosh["stranded_pct_before"], GOALS["stranded_pct"])),
        (f"control periods ({slosh['control_period_s']:g} s) until stranded <= 5 % after the load change",
         f"{slosh['converge_control_periods']} ({slosh['converge_s']} s; {slosh['converge_periods']} runs of the "
         "loop, counting its early runs)", "<= 3",
         _le(slosh["converge_control_periods"], GOALS["converge_periods"])),
        ("node budget cut enforced on the GPUs", f"{node_cut} s", "<= 1 s", _le(node_cut, GOALS["node_cut_s"])),
        ("rack budget cut enforced on the GPUs", f"{rack_cut} s", "<= 3 s", _le(rack_cut, GOALS["rack_cut_s"])),
        ("aggregate ramp over 1 s at job start, step swing (job-start run, raw 10 Hz aggregate, start "
         "jump and the swing under the rising cap included)",
         f"{start.get('job_start_ramp_1s_w_per_s_managed')} W/s (unmanaged "
         f"{start.get('job_start_ramp_1s_w_per_s_unmanaged')} W/s)", f"<= ramp_limit {JOB_START_RAMP_W_PER_S:,.0f} W/s",
         _le(start.get("job_start_ramp_1s_w_per_s_managed"), JOB_START_RAMP_W_PER_S)),
        ("the same from the start to the end of the run (hand-over to the swing plan included)",
         f"{start.get('job_start_ramp_1s_w_per_s_to_end_managed')} W/s",
         f"<= ramp_limit {JOB_START_RAMP_W_PER_S:,.0f} W/s",
         _le(start.get("job_start_ramp_1s_w_per_s_to_end_managed"), JOB_START_RAMP_W_PER_S)),
        ("aggregate ramp over 1 s at job start, steady load (no step swing: the start alone)",
         f"{steady.get('job_start_ramp_1s_w_per_s_managed')} W/s (unmanaged "
         f"{steady.get('job_start_ramp_1s_w_per_s_unmanaged')} W/s)",
         f"<= ramp_limit {JOB_START_RAMP_W_PER_S:,.0f} W/s",
         _le(steady.get("job_start_ramp_1s_w_per_s_managed"), JOB_START_RAMP_W_PER_S)),
        ("limits landed on the GPUs at job start, steady load: largest 1 s rise of their sum",
         f"{steady.get('job_start_cap_ramp_1s_w_per_s')} W/s", f"<= ramp_limit {JOB_START_RAMP_W_PER_S:,.0f} W/s",
         _le(steady.get("job_start_cap_ramp_1s_w_per_s"), JOB_START_RAMP_W_PER_S)),
        ("budget violations (limits in force over a budget, outside cut windows)",
         f"{swing.get('budget_violations')} + {emu.get('budget_violations')} + {slosh['budget_violations']} + "
         f"{start.get('budget_violations')} + {steady.get('budget_violations')}", "0",
         (swing.get("budget_violations") == 0 and emu.get("budget_violations") == 0
          and slosh["budget_violations"] == 0 and start.get("budget_violations") == 0
          and steady.get("budget_violations") == 0)),
    ]  # fmt: skip


def _swing_prose(swing: dict, emu: dict, gpus: int) -> str:
    """The swing and emulated runs, in words."""
    return (
        f"Swing run: unmanaged p2p {swing.get('swing_p2p_w_unmanaged')} W, managed {swing.get('swing_p2p_w_managed')} "
        f"W over t = {swing.get('window_s')} s; smoothing {swing.get('smoothing_mode')} from "
        f"{swing.get('smoothing_from_s')} s, floor {swing.get('floor_w_per_gpu')} W per GPU; step "
        f"{swing.get('step_s_unmanaged')} s -> {swing.get('step_s_managed')} s; max ramp (1 s) managed "
        f"{swing.get('max_ramp_w_per_s')} W/s, unmanaged {swing.get('max_ramp_w_per_s_unmanaged')} W/s over the "
        "whole run: the GPUs boot into the running job (it starts with the run, so the controller never "
        "sees them parked and no start profile engages: start profiles need the job-start ramp and a start "
        "it can see), and until the detector has seen the swing and the plan's profile has landed the swing "
        "runs unmanaged; over the measurement window, with the plan in force, "
        f"{swing.get('max_ramp_w_per_s_window')} W/s; budgets first held at {swing.get('budgets_first_enforced_s')} s "
        f"(GPUs boot at their 1,000 W default limits); control period p99 {swing.get('control_period_ms_p99')} ms.  \n"
        f"Emulated run: the same job on {gpus:,} H100-class GPUs (no smoothing hardware; cluster budget 700 W "
        "per GPU, not binding; policy `trough_filler_enabled = true`): the controller sends SetTroughFiller and "
        "each node's trough-filler hook (simulated: filler work holds the draw at the floor during communication "
        f"phases) holds it; unmanaged p2p {emu.get('swing_p2p_w_unmanaged')} W, managed "
        f"{emu.get('swing_p2p_w_managed')} W over t = {emu.get('window_s')} s; smoothing {emu.get('smoothing_mode')} "
        f"from {emu.get('smoothing_from_s')} s, floor {emu.get('floor_w_per_gpu')} W per GPU; step "
        f"{emu.get('step_s_unmanaged')} s -> {emu.get('step_s_managed')} s; run wall {emu.get('wall_s')} s.  \n"
    )


def _sloshing_prose(slosh: dict) -> str:
    """The sloshing run, in words."""
    return (
        f"Sloshing run: budget {slosh['budget_w']:,} W; stranded {slosh['stranded_pct_before']} % before the load "
        f"change, peak {slosh['stranded_pct_after_peak']} % after it, {slosh['stranded_pct_steady_after']} % from the "
        f"4th period on; converged {slosh['converge_s']} s after the change: {slosh['converge_control_periods']} "
        f"control periods of {slosh['control_period_s']:g} s (the goal's unit), {slosh['converge_periods']} runs of "
        "the loop (it also runs early when acks let raises that wait go). Watts a raise granted "
        "but the draw does not show yet (the GPU is *settling*: no step has run under its new cap) are not "
        f"counted as stranded; they peaked at {slosh['in_transit_pct_peak']} % of the budget, and counted as "
        f"stranded the run converges in {slosh['converge_periods_with_in_transit']} runs of the loop "
        f"({slosh['converge_s_with_in_transit']} s). Stranded power cannot fall below (minimum cap - idle draw) x "
        "the idle GPUs: here (200 - 70) W on each GPU of the 2 stopped nodes.  \n"
    )


def _job_start_prose(start: dict, steady: dict) -> str:
    """The job-start runs, in words."""
    return (
        f"Job-start run: the same job starts at {start.get('job_start_s')} s on {start.get('job_start_parked_gpus')} "
        f"GPUs parked at their 200 W minimum (policy `job_start_ramp_enabled = true`, `ramp_limit_w_per_s = "
        f"{JOB_START_RAMP_W_PER_S:g}`, control period 1 s; each raise slewed by its agent at the GPU's share of "
        f"the limit); measured over t = {start.get('job_start_window_s')} s, 1 s before the start included "
        f"(the last ceiling rise at {start.get('job_start_ramp_end_s')} s, plus 2 s). The first second jumps "
        f"{start.get('job_start_jump_w')} W (idle draw to the minimum limit: no cap goes lower, so no ramp limit "
        "below that jump per second can hold at job start). The raw 1 s figure holds the step's own "
        "compute/communication swing under the rising cap: start profiles on "
        f"{start.get('job_start_smoothing_gpus')} GPUs from {start.get('job_start_smoothing_from_s')} s (ramp "
        "rates = each GPU's share of the limit less the canaries' reserve, floor the firmware's lowest: the "
        "ramp-down rate alone fills the trough) hold it, the canaries show the detector the unmanaged swing, "
        f"and the swing plan's profile replaced the start profiles at {start.get('swing_plan_from_s')} s (the "
        f"last start profile seen at {start.get('job_start_smoothing_until_s')} s). Over the one-step (2 s) average, "
        f"which removes the step's swing, the start ramps {start.get('job_start_envelope_ramp_1s_w_per_s_managed')} "
        f"W/s (unmanaged {start.get('job_start_envelope_ramp_1s_w_per_s_unmanaged')} W/s; a 2 s average of rises "
        "that each fit 1 s can still show up to 1.5 x the limit, so this is a picture, not a goal). Cost: "
        f"full speed (a step no more than 1 % longer than its unmanaged twin) from {start.get('full_speed_after_s')} s "
        f"after the start, {start.get('job_start_delay_s')} s behind the unmanaged job from then on (steps under "
        "a start profile lose the rise from where their ramp-down got to, about 2 % here, so full speed comes "
        "with the hand-over); run wall "
        f"{start.get('wall_s')} s.  \n"
        f"Job-start run, steady load: the same, but the job draws 650-700 W in its communication phase too; "
        f"{steady.get('job_start_parked_gpus')} GPUs parked, ramp until {steady.get('job_start_ramp_end_s')} s, start "
        f"profiles on {steady.get('job_start_smoothing_gpus')} GPUs from {steady.get('job_start_smoothing_from_s')} s "
        f"until {steady.get('job_start_smoothing_until_s')} s (released: no swing showed up), start "
        f"jump {steady.get('job_start_jump_w')} W, the limits the GPUs enforce rose at most "
        f"{steady.get('job_start_cap_ramp_1s_w_per_s')} W in any 1 s of the times they were read (the job-start "
        f"run: {start.get('job_start_cap_ramp_1s_w_per_s')} W). The draw's 1 s figure can read a little above the "
        "caps': each 10 Hz grid instant is evaluated with the limits read at the sampler's wake-up, which a busy "
        "event loop delays (by up to ~0.25 s here), so a grid second can hold a little more than 1 s of landed "
        "raises; full speed "
        f"{steady.get('full_speed_after_s')} s after the start, "
        f"{steady.get('job_start_delay_s')} s behind the unmanaged job; run wall {steady.get('wall_s')} s.\n"
    )


def main(argv: list[str] | None = None) -> int:
    """Run both, print the section, write it to bench/RESULTS.md."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=16)
    parser.add_argument("--gpus-per-node", type=int, default=64)
    parser.add_argument("--duration-s", type=float, default=60.0)
    parser.add_argument("--load-change-s", type=float, default=35.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--no-write", action="store_true", help="print only; leave bench/RESULTS.md alone")
    args = parser.parse_args(argv)
    rasd_logging.configure("warning")
    info = results.machine()
    gpus = args.nodes * args.gpus_per_node
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = pathlib.Path(tmp_name)
        swing = swing_and_cuts(args, tmp)
        emu = emulated(args, tmp)
        slosh = sloshing(args, tmp)
        start = job_start(args, tmp)
        steady = job_start(args, tmp, steady=True)
    checks = _checks(swing, emu, slosh, start, steady)
    table = "\n".join(
        [
            "| figure | measured | goal | |",
            "|---|---|---|---|",
            *(f"| {name} | {value} | {goal} | {_verdict(ok)} |" for name, value, goal, ok in checks),
        ]
    )
    section = (
        f"{SECTION}\n\n"
        f"Command: `.venv/bin/python bench/power.py --nodes {args.nodes} --gpus-per-node {args.gpus_per_node} "
        f"--duration-s {args.duration_s:g} --load-change-s {args.load_change_s:g} --seed {args.seed}`  \n"
        f"Machine: {info}  \n"
        f"Run: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {gpus:,} simulated B200-class GPUs "
        f"({args.nodes} nodes x {args.gpus_per_node}, 4 nodes per rack), one synchronous job (2 s step, 70 % "
        "compute at 650-700 W, 100-150 W communication, 5-20 ms jitter per rank and step); real agents and "
        "controller over loopback gRPC in one process; ground truth sampled from the simulated GPUs at 10 Hz; "
        "the unmanaged figures from the same seeded job with no caps or smoothing, over the same instants "
        f"(`rasd.sim.power_sim`). Swing run wall {swing.get('wall_s')} s (CPU {swing.get('cpu_s')} s); "
        f"sloshing run wall {slosh['wall_s']} s.\n\n"
        f"{table}\n\n"
        f"{_swing_prose(swing, emu, gpus)}"
        f"{_sloshing_prose(slosh)}"
        f"{_job_start_prose(start, steady)}"
    )
    print(section)
    if not args.no_write:
        results.write_section(SECTION, section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
