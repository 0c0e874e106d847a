"""Fleet remote path: what a power period spends on the other replicas' aggregates at 100,000 GPUs, uncontended.

Run: `.venv/bin/python bench/fleet_path.py` (`--nodes 12500 --replicas 6 --rounds 9`; `--no-write`
leaves bench/RESULTS.md alone).

bench/fleet.py measures the leader's whole period under a cap wave, where the remote read shares the
core with the relay's results and its figures move with the wave's size. This one times, on one
idle core and with nothing else running, the pure steps that period's remote read and view take,
each on the real code with the aggregates bench/fleet.py's replicas ship:

1. **decode**: every replica's encoded aggregate (`core.aggregates.decode`), its inventory and node
   streams already decoded once, as `replication.aggregates.FleetReader` keeps them;
2. **merge**: the decoded aggregates into one (`core.aggregates.merge`), the streams and inventory
   merged once before, as `FleetReader`'s `MergeMemo` keeps them;
3. **fleet view**: the leader's own view with the others' laid over it (`core.power.remote.fleet_view`);
4. **window view**: the same for the power window's peaks and series (`core.power.remote.window_view`);
5. **columns**: the period's first read of every GPU's reading (`core.power.views.latest_columns`).

Two layouts: the leader holding no stream (bench/fleet.py's), and the leader holding its share of
the nodes as one more replica would (its own view built as the ingest builds it), which is how a
deployment behind one Service spreads the agents; each in every aggregate format of `--formats`
(`core.aggregates.FORMAT_VERSION`: a leader of this version is shipped the newest). Figures: the
median over `--rounds` of each step.

The goal: the whole path in at most a quarter of the 1 s control period. Under a cap wave,
bench/fleet.py has seen the remote read take 2-4 times its uncontended time; a quarter leaves the
period its three quarters of the second with that.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import fleet as fleet_bench
import results

from rasd.common import gc_policy
from rasd.controller.core import aggregates
from rasd.controller.core.power import apply as power_apply
from rasd.controller.core.power import inputs as period_inputs
from rasd.controller.core.power import remote, views

SECTION = "## Fleet remote path"
GOAL_MS = 250.0
"""A quarter of the 1 s control period (see the module docstring)."""
STEPS = ("decode", "merge", "fleet view", "window view", "columns")


def _local_view(share: fleet_bench.Replica | None, reads: aggregates.AggregateReads) -> period_inputs.FleetView:
    """The leader's own view: empty, or its share's nodes as the ingest holds them."""
    if share is None:
        return period_inputs.FleetView(
            records={}, known_records={}, gpu_nodes={}, node_gpus={}, boot_ids={}, sessions={},
            node_labels={}, latest={}, latest_controller_ns={},
        )  # fmt: skip
    own = aggregates.decode(share.aggregate(reads), records=share.records)
    return period_inputs.FleetView(
        records=dict(share.records),
        known_records={},
        gpu_nodes={g: s.node_id for s in own.nodes.values() for g in s.gpu_uuids},
        node_gpus={n: s.gpu_uuids for n, s in own.nodes.items()},
        boot_ids={n: s.boot_id for n, s in own.nodes.items()},
        sessions={n: s.session_id for n, s in own.nodes.items()},
        node_labels={n: dict(s.labels) for n, s in own.nodes.items()},
        latest=dict(own.latest),
        latest_controller_ns=dict(own.latest_controller_ns),
    )


def _timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    started = time.perf_counter()
    value = fn()
    return value, (time.perf_counter() - started) * 1000


def measure(nodes: int, replicas: int, rounds: int, *, leader_holds_share: bool, version: int) -> dict[str, Any]:
    """Each step's median ms over rounds, with the leader holding no stream or its share, aggregates in version."""
    reads = aggregates.AggregateReads(interval_s=0.5, draw_window_s=2.0, detect_window_s=20.0, formats=(version,))
    parts = replicas + 1 if leader_holds_share else replicas
    per = -(-nodes // parts)
    shares = [fleet_bench.Replica(f"replica-{k}", range(k * per, min(nodes, (k + 1) * per))) for k in range(parts)]
    local = _local_view(shares[0] if leader_holds_share else None, reads)
    others = shares[1:] if leader_holds_share else shares
    payloads = [replica.aggregate(reads) for replica in others]
    inventories = [aggregates.decode_records(aggregates.split(p)[0]) for p in payloads]
    memos = [aggregates.DecodeMemo() for _ in payloads]
    merge_memo = aggregates.MergeMemo()
    aggregates.merge(  # the streams decoded, and merged with the inventory, once
        [aggregates.decode(p, records=r, memo=m) for p, r, m in zip(payloads, inventories, memos, strict=True)],
        memo=merge_memo,
    )
    window = period_inputs.WindowView(sample_hz=10.0, draw_peaks_w={}, status_rows=(), straggler_peaks_w={})
    window_reads = period_inputs.WindowReads(
        draw_since_unix_ns=0, detect_since_unix_ns=0, swing_tracked=False, status_since_unix_ns=0
    )
    gpus = [
        power_apply.GpuLimits(gpu_uuid=uuid, node_id=record.node_id, min_w=200, max_w=700)
        for share in shares
        for uuid, record in share.records.items()
    ]
    times: dict[str, list[float]] = {step: [] for step in STEPS}
    for _ in range(rounds):
        gc.collect()  # each round from the same heap: what the last round left is not this one's pause
        decoded, ms = _timed(
            lambda: [
                aggregates.decode(p, records=r, memo=m) for p, r, m in zip(payloads, inventories, memos, strict=True)
            ]
        )
        times["decode"].append(ms)
        merged, ms = _timed(lambda d=decoded: aggregates.merge(d, memo=merge_memo))
        times["merge"].append(ms)
        view, ms = _timed(lambda m=merged: remote.fleet_view(local, m))
        times["fleet view"].append(ms)
        _, ms = _timed(lambda m=merged: remote.window_view(window, m, window_reads))
        times["window view"].append(ms)
        columns, ms = _timed(lambda v=view: views.latest_columns(gpus, v))
        times["columns"].append(ms)
        if int(columns.present.sum()) != len(gpus):
            raise SystemExit(f"the view lacks readings: {int(columns.present.sum())} of {len(gpus)} GPUs")
    medians = {step: statistics.median(ms) for step, ms in times.items()}
    return {
        "layout": f"leader holds 1/{parts} of the nodes" if leader_holds_share else "leader holds no stream",
        "format": version,
        "kib": sum(len(p) for p in payloads) / len(payloads) / 1024,
        "gpus": len(gpus),
        "aggregates": len(payloads),
        "steps_ms": medians,
        "total_ms": sum(medians.values()),
    }


def render(rows: list[dict[str, Any]], args: argparse.Namespace, machine: str, when: str) -> str:
    """The RESULTS.md section."""
    command = (
        f".venv/bin/python bench/fleet_path.py --nodes {args.nodes} --replicas {args.replicas}"
        f" --rounds {args.rounds} --formats {args.formats}"
    )
    lines = [
        SECTION,
        "",
        f"Command: `{command}`  ",
        f"Machine: {machine}  ",
        f"Run: {when}; {args.nodes:,} nodes × 8 GPUs, bench/fleet.py's replicas' aggregates (every GPU's reading,"
        " peaks and series, its inventory and streams decoded once before); each step on the real code, one after"
        " the other on this process's one thread, nothing else running; the collector as rasd-controller sets it."
        f" Median of {args.rounds} rounds, ms.",
        "",
        "| layout | format | KiB an aggregate | GPUs | aggregates decoded | " + " | ".join(STEPS) + " | total |",
        "|---|---:|---:|---:|---:|" + "---:|" * (len(STEPS) + 1),
    ]
    for row in rows:
        steps = " | ".join(f"{row['steps_ms'][s]:,.1f}" for s in STEPS)
        lines.append(
            f"| {row['layout']} | {row['format']} | {row['kib']:,.0f} | {row['gpus']:,} | {row['aggregates']} | {steps}"
            f" | {row['total_ms']:,.1f} |"
        )
    newest = aggregates.FORMAT_VERSION
    totals = [row["total_ms"] for row in rows if row["format"] == newest]
    worst = f"worst layout {max(totals):,.1f} ms" if totals else "not measured"
    verdict = "met" if totals and max(totals) <= GOAL_MS else "NOT met"
    lines += [
        "",
        f"Goal: the remote path at {args.nodes:,} nodes in ≤ {GOAL_MS:.0f} ms uncontended (a quarter of the"
        f" control period), in the format a leader of this version is shipped ({newest}), {worst}: {verdict}",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Measure both layouts, print the section and write it to bench/RESULTS.md."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=12_500)
    parser.add_argument("--replicas", type=int, default=6, help="other replicas shipping aggregates")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument(
        "--formats",
        default=",".join(map(str, aggregates.READ_FORMATS)),
        help="aggregate encodings to measure (core.aggregates)",
    )
    parser.add_argument("--no-write", action="store_true", help="print only; leave bench/RESULTS.md alone")
    args = parser.parse_args(argv)
    if args.nodes < 1 or args.replicas < 1 or args.rounds < 1:
        parser.error("--nodes, --replicas and --rounds must each be at least 1")
    try:
        versions = sorted({int(v) for v in args.formats.split(",")})
    except ValueError:
        parser.error(f"--formats: comma-separated format versions, not {args.formats!r}")
    if not versions or not set(versions) <= set(aggregates.READ_FORMATS):
        parser.error(f"--formats: this tree reads {aggregates.READ_FORMATS}, not {args.formats!r}")
    gc_policy.configure()
    machine = results.machine()
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    rows = [
        measure(args.nodes, args.replicas, args.rounds, leader_holds_share=share, version=version)
        for share in (False, True)
        for version in versions
    ]
    text = render(rows, args, machine, when)
    print(text)
    if not args.no_write:
        results.write_section(SECTION, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
