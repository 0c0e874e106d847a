"""rasctl's start-up: `rasctl --help`, a listing's start, and a whole listing, as an operator's shell runs them.

Run: .venv/bin/python bench/rasctl_startup.py [--runs 20]

Each figure is the wall time of a fresh process (median and p90 of --runs, after 2 warm-up rounds
that fill the bytecode caches; the cases interleaved round by round), next to the interpreter's own
start (``python -c pass``) in the same run, since the shared cores' speed drifts:

- ``import grpc``: what any command that calls the controller pays first, whatever rasctl does.
- ``rasctl --help``: the console script; it imports the parser only.
- listing start: what ``rasctl get nodes`` imports and parses before it dials (``rasd.cli.main``,
  ``rasd.cli.commands``, ``rasd.cli.credentials``; gRPC, protobuf and the generated API among them),
  run as ``python -P -c`` so that, as for the console script, the working directory is not searched.
- whole listing: ``rasctl get nodes -o name`` against a loopback AdminService that answers at once
  (started by this script in its own process, one node), connection and RPC included.

The heaviest imports of a listing (``python -X importtime``) are listed under the table. Goal
(issue #39): ``rasctl --help`` and a listing's start ≤ 0.2 s. Writes "## rasctl start-up" in
bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import socket
import statistics
import subprocess
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import results

GOAL_S = 0.2
ROOT = pathlib.Path(__file__).resolve().parent.parent
BIN = pathlib.Path(sys.executable).parent
LISTING_IMPORTS = "import rasd.cli.main, rasd.cli.commands, rasd.cli.credentials"
LISTING_START = f"{LISTING_IMPORTS}; rasd.cli.main.build_parser().parse_args(['get', 'nodes'])"
SERVER = """
import sys, time
from concurrent import futures
import grpc
from rasd.api.v1 import admin_service_pb2 as pb, admin_service_pb2_grpc as pbg
class Admin(pbg.AdminServiceServicer):
    def ListNodes(self, request, context):
        return pb.ListNodesResponse(nodes=[pb.NodeStatus(node_id="node-0")])
server = grpc.server(futures.ThreadPoolExecutor(2))
pbg.add_AdminServiceServicer_to_server(Admin(), server)
server.add_insecure_port("127.0.0.1:" + sys.argv[1])
server.start()
print("ready", flush=True)
server.wait_for_termination()
"""


def _timed(cases: dict[str, list[str]], runs: int, env: dict[str, str]) -> dict[str, list[float]]:
    """Wall seconds of each case's argv, runs times each (after 2 warm-up rounds), the cases interleaved.

    Round by round, each case once: the shared cores' load drifts over seconds, and interleaving
    spreads the drift over every case instead of loading it onto whichever ran then. A failure
    stops the benchmark.
    """
    seconds: dict[str, list[float]] = {case: [] for case in cases}
    for i in range(runs + 2):
        for case, argv in cases.items():
            started = time.perf_counter()
            done = subprocess.run(argv, capture_output=True, text=True, env=env, check=False)
            elapsed = time.perf_counter() - started
            if done.returncode != 0:
                raise SystemExit(f"{argv}: exit {done.returncode}: {done.stderr[-500:]}")
            if i >= 2:
                seconds[case].append(elapsed)
    return seconds


def _heaviest_imports(env: dict[str, str], top: int = 8) -> list[tuple[str, float]]:
    """The listing's imports (and theirs) with the largest cumulative time (ms), from python -X importtime."""
    done = subprocess.run([sys.executable, "-X", "importtime", "-c", LISTING_IMPORTS], capture_output=True,
                          text=True, env=env, check=True)  # fmt: skip
    found = []
    for line in done.stderr.splitlines():
        parts = line.removeprefix("import time:").split("|")
        if len(parts) == 3 and parts[1].strip().isdigit() and not parts[2].startswith("     "):
            found.append((parts[2].strip(), int(parts[1]) / 1000))
    return sorted(found, key=lambda item: -item[1])[:top]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def run(runs: int) -> tuple[dict[str, list[float]], list[tuple[str, float]]]:
    """The timings per case, and the heaviest imports of a listing."""
    env = {**os.environ, "RASCTL_CONFIG": os.devnull, "PYTHONDONTWRITEBYTECODE": ""}
    env.pop("RASD_CONTROLLER", None)
    port = _free_port()
    with subprocess.Popen([sys.executable, "-c", SERVER, str(port)], stdout=subprocess.PIPE, text=True) as server:
        try:
            assert server.stdout is not None and server.stdout.readline().strip() == "ready"
            timings = _timed(
                {
                    "python -c pass (the interpreter alone)": [sys.executable, "-P", "-c", "pass"],
                    "python -c 'import grpc' (the floor of any gRPC call)": [sys.executable, "-P", "-c", "import grpc"],
                    "rasctl --help": [str(BIN / "rasctl"), "--help"],
                    "listing start (imports and parse of get nodes)": [sys.executable, "-P", "-c", LISTING_START],
                    "whole listing: rasctl get nodes -o name (loopback)": [
                        str(BIN / "rasctl"), "--controller", f"127.0.0.1:{port}", "get", "nodes", "-o", "name"
                    ],
                },
                runs,
                env,
            )  # fmt: skip
        finally:
            server.terminate()
    return timings, _heaviest_imports(env)


def section(timings: dict[str, list[float]], heaviest: list[tuple[str, float]], runs: int, machine: str) -> str:
    """The RESULTS.md section."""
    rows = [
        f"| {case} | {statistics.median(s):.3f} | {statistics.quantiles(s, n=10)[-1]:.3f} |"
        for case, s in timings.items()
    ]
    help_s = statistics.median(timings["rasctl --help"])
    start_s = statistics.median(timings["listing start (imports and parse of get nodes)"])
    met = "met" if max(help_s, start_s) <= GOAL_S else "NOT met"
    imports = ", ".join(f"{name} {ms:.0f} ms" for name, ms in heaviest)
    return "\n".join([
        "## rasctl start-up",
        "",
        "Command: `.venv/bin/python bench/rasctl_startup.py" + (f" --runs {runs}`" if runs != 20 else "`") + "  ",
        f"Machine: {machine}, load average {os.getloadavg()[0]:.2f} at the end  ",
        f"Run: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; wall time of a fresh process, {runs} runs each "
        "after 2 warm-up rounds, the cases interleaved; bytecode caches warm.",
        "",
        "| case | median s | p90 s |",
        "|---|---:|---:|",
        *rows,
        "",
        f"Heaviest imports of a listing (cumulative, one run of python -X importtime): {imports}.",
        "",
        f"Goal: rasctl --help and a listing's start <= {GOAL_S} s: {met} "
        f"(--help {help_s:.3f} s, listing start {start_s:.3f} s, medians).",
        "",
    ])  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    """Measure, print and write the section."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args(argv)
    machine = results.machine()
    timings, heaviest = run(args.runs)
    text = section(timings, heaviest, args.runs, machine)
    print(text)
    results.write_section("## rasctl start-up", text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
