"""rasd-sim entry point: a real controller and N simulated agents on loopback, then a report."""

from __future__ import annotations

import argparse
import asyncio
import pathlib
import sys
from collections.abc import Sequence

from rasd.common import VERSION, gc_policy
from rasd.common import logging as rasd_logging
from rasd.controller.observability import recording
from rasd.sim import fleet, goodput_cli, plots, replay, report, scenario


def build_parser() -> argparse.ArgumentParser:
    """rasd-sim's command line."""
    parser = argparse.ArgumentParser(
        prog="rasd-sim",
        description="Run rasd end to end on loopback: a real controller and N agents with simulated GPUs "
        "running a scripted workload and fault scenario. Writes report.json and report.md.",
        epilog="rasd-sim goodput --help: a training job under Llama 3's fault rates, ETTR with rasd and by hand.",
    )
    parser.add_argument("--nodes", type=int, default=8, help="simulated nodes (default %(default)s)")
    parser.add_argument("--gpus-per-node", type=int, default=8, help="GPUs per node (default %(default)s)")
    parser.add_argument(
        "--scenario",
        default="demo",
        help=f"built-in name ({', '.join(scenario.builtin_names())}; ladder/..., stragglers/...) or a TOML file",
    )
    parser.add_argument("--duration-s", type=float, default=30.0, help="how long to run (default %(default)s)")
    parser.add_argument("--seed", type=int, default=0, help="seed for the simulated GPUs (default %(default)s)")
    parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path("sim-out"), help="output directory")
    parser.add_argument("--report", type=pathlib.Path, help="report.json path (default OUT/report.json)")
    parser.add_argument("--table-interval-s", type=float, default=5.0, help="live fleet table period; 0 = off")
    parser.add_argument(
        "--insecure", action="store_true", help="plaintext gRPC on loopback instead of mutual TLS with dev certs"
    )
    parser.add_argument("--log-level", default="warning", help="debug|info|warning|error (default %(default)s)")
    parser.add_argument(
        "--record", type=pathlib.Path, metavar="PATH", help="record the controller's inbound streams and decisions"
    )
    parser.add_argument(
        "--replay",
        type=pathlib.Path,
        metavar="PATH",
        help="replay a recording into a fresh controller and report every decision that differs "
        "(writes OUT/replay.json and OUT/replay.md); no fleet is simulated",
    )
    parser.add_argument(
        "--policy",
        type=pathlib.Path,
        metavar="FILE",
        help="with --replay: a TOML file whose [remediation] table is laid over the recorded policy",
    )
    parser.add_argument("--version", action="version", version=f"rasd-sim {VERSION}")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one simulation and write its report (``rasd-sim goodput …``: the goodput simulation)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["goodput"]:
        return goodput_cli.main(argv[1:])
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.replay is not None:
        return _replay(parser, args)
    if args.policy is not None:
        parser.error("--policy: only with --replay")
    if not 1 <= args.nodes <= 5000:
        parser.error(f"--nodes: {args.nodes} is outside 1..5000")
    if not 1 <= args.gpus_per_node <= 64:
        parser.error(f"--gpus-per-node: {args.gpus_per_node} is outside 1..64")
    if not 0 < args.duration_s <= 86_400:
        parser.error(f"--duration-s: {args.duration_s} is outside (0, 86400]")
    try:
        chosen = scenario.load(args.scenario)
    except scenario.ScenarioError as exc:
        parser.error(str(exc))
    rasd_logging.configure(args.log_level)
    gc_policy.configure()  # the simulated fleet hosts a controller: same collector settings
    settings = fleet.SimSettings(
        nodes=args.nodes,
        gpus_per_node=args.gpus_per_node,
        duration_s=args.duration_s,
        seed=args.seed,
        scenario=chosen,
        out_dir=args.out,
        table_interval_s=args.table_interval_s,
        tls=not args.insecure,
        record_path=args.record,
    )
    result = asyncio.run(fleet.run(settings))
    built = report.build(result)
    json_path = args.report or args.out / "report.json"
    report.write(built, json_path, json_path.with_suffix(".md"))
    if plots.available():
        plots.power_png(result, args.out / "power.png")
        plots.incidents_png(result, built, args.out / "incidents.png")
        print(f"rasd-sim: wrote {args.out / 'power.png'} and {args.out / 'incidents.png'}")
    else:
        print("rasd-sim: pictures skipped: install the extra rasd[plots] (matplotlib)")
    print(f"\n{report.markdown(built)}")
    print(f"rasd-sim: wrote {json_path} and {json_path.with_suffix('.md')}")
    complete = (
        built["fleet"]["nodes_seen"] == built["run"]["nodes"]
        and built["fleet"]["gpus_seen"] == built["run"]["gpus"]
        and built["events_lost"] == 0
        and built["faults"]["missed"] == 0
    )
    if not complete:
        print("rasd-sim: FAILED: a node or GPU never reported, or a fault was missed or an event lost", file=sys.stderr)
    met = built.get("expectations", {"met": True})["met"]
    if not met:
        print("rasd-sim: FAILED: the scenario's [expect] was not met (see report.md)", file=sys.stderr)
    return 0 if complete and met else 1


def _replay(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """rasd-sim --replay: feed a recording to a fresh controller and print the decision diff."""
    if args.record is not None:
        parser.error("--record: not with --replay (a replay records nothing)")
    rasd_logging.configure(args.log_level)
    try:
        built = asyncio.run(replay.run_replay(args.replay, policy_file=args.policy, out_dir=args.out, out=sys.stdout))
    except (OSError, recording.RecordingError) as exc:
        parser.error(f"--replay {args.replay}: {exc}")
    except replay.PolicyFileError as exc:
        parser.error(f"--policy {exc}")
    print(
        f"rasd-sim: wrote {args.out / 'replay.json'} and {args.out / 'replay.md'} ({built['differences']} differences)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
