"""Agent CPU and memory per node: 8 GPUs at 10 Hz power and 1 Hz counters, streaming to a real controller.

Measured with the simulated backend and with the NVML backend over the pynvml test double (the real
pynvml.py against a fake libnvidia-ml, whose driver keeps a power-sample buffer as real drivers do).
On a GPU node, `--backends nvml-real` measures the NVML backend against the real driver (all the
node's GPUs; --gpus is then ignored) and writes its own section, "## Agent overhead on a real GPU",
so the two machines' figures never overwrite each other.

Run: .venv/bin/python bench/agent_overhead.py [--duration-s 30] [--gpus 8] [--backends simulated,nvml-double]
     [--baseline-tree DIR --rounds 3] [--profile FILE]

--profile FILE runs one agent of this tree per backend under cProfile on every Python thread (the
event loop and the worker threads NVML calls hop to), writes the merged pstats to FILE and prints
its split by area (ours, the double, pynvml, gRPC, asyncio); CPU figures under the profiler are ~2x
and are not written to RESULTS.md.

Each agent runs alone in a child process so its CPU time (user + system, all threads) and peak RSS
are its own; the controller runs in a third process. With --baseline-tree (another checkout with
its own .venv, e.g. the commit before a change), each round runs that tree's agent and then this
one's on the same backend, alternating, and the table gives the ratio: the machine is shared, so a
ratio within one run says more than two runs' absolute figures. Figures go to the "## Agent
overhead" section of bench/RESULTS.md. Goal (issue 36): ≤ 0.5 % of one core with 8 GPUs on the
double (and on a real GPU when lent), peak RSS ≤ 60 MiB. The simulated backend's row includes its
GPU model (the physics the driver would do), so it is shown but not judged.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import marshal
import os
import pathlib
import pstats
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import results

REPO = pathlib.Path(__file__).resolve().parent.parent
SECTION = "## Agent overhead"
REAL_GPU_SECTION = "## Agent overhead on a real GPU"
BACKENDS = ("simulated", "nvml-double", "nvml-real")
JUDGED = ("nvml-double", "nvml-real")
GOAL_PCT = 0.5
GOAL_RSS_MIB = 60.0


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


_DOUBLE_CPU_S: dict[int, float] = {}
"""CPU seconds spent inside the NVML double's symbols, per thread (nvml-double only)."""


def _open_backend(name: str, gpus: int, power_interval_ms: int):  # type: ignore[no-untyped-def]
    if name == "simulated":
        from rasd.agent.gpu import simulated

        return simulated.SimulatedBackend("bench-node", gpus, 0, workload=simulated.StepWorkload())
    from rasd.agent.gpu import nvml

    if name == "nvml-double":
        sys.path.insert(0, str(REPO / "tests" / "nvml_double"))
        import fake_nvml

        class TimedFake(fake_nvml.FakeNvml):
            """The double, with the CPU time its C symbols take (the driver's share: not the agent's)."""

            def __getattr__(self, name: str):  # type: ignore[no-untyped-def]
                symbol = super().__getattr__(name)

                def timed(*args):  # type: ignore[no-untyped-def]
                    started = time.thread_time()
                    try:
                        return symbol(*args)
                    finally:
                        _DOUBLE_CPU_S[threading.get_ident()] = (
                            _DOUBLE_CPU_S.get(threading.get_ident(), 0.0) + time.thread_time() - started
                        )

                timed.__name__ = name
                return timed

        # The wall clock: the driver's power buffer fills in real time, as on a node. The call log
        # is bounded so that the double's own memory does not grow with the run.
        fake = TimedFake([fake_nvml.h100_sxm5(i) for i in range(gpus)], wall_clock=True, call_log_limit=1000)
        fake_nvml.install(fake)
    # As rasd-agent opens it: the driver's power buffer where it samples at least as often as the agent.
    return nvml.open_nvml_backend(power_buffer_max_spacing_ms=power_interval_ms)


class _EveryThreadProfile:
    """cProfile on CPU time (not wall time: idle waits cost nothing) of every thread, from `start()` on.

    Installed before the agent starts its threads (the event loop's worker threads start lazily,
    during warm-up): each new thread gets a hook that turns into a profiler of its own once the
    window opens.
    """

    def __init__(self) -> None:
        """Hook every thread started from now on."""
        self.profiles: list[cProfile.Profile] = []
        self._open = threading.Event()
        self._lock = threading.Lock()
        threading.setprofile(self._hook)

    def _hook(self, *_: object) -> None:
        if not self._open.is_set():
            return
        # Enabling replaces this hook as the thread's own profile function.
        profile = cProfile.Profile(time.thread_time)
        with self._lock:
            self.profiles.append(profile)
        profile.enable()

    def start(self) -> None:
        """Open the window: this thread now, every other thread at its next Python call."""
        self._open.set()
        self._hook()

    def dump(self, path: str) -> None:
        """Merge the threads' profiles into one pstats file.

        Only completed calls count: `disable()` would close the calls still in progress in other
        threads (an idle worker's wait) with this thread's clock, a made-up figure.
        """
        threading.setprofile(None)
        with tempfile.TemporaryDirectory() as tmp:
            files = []
            for i, profile in enumerate(self.profiles):
                profile.snapshot_stats()
                files.append(f"{tmp}/{i}.pstats")
                with open(files[-1], "wb") as f:
                    marshal.dump(profile.stats, f)  # type: ignore[attr-defined]
            pstats.Stats(*files).dump_stats(path)


async def _child(
    backend_name: str, controller: str, gpus: int, duration_s: float, warmup_s: float, profile_to: str | None = None
) -> dict:
    from rasd.agent import runtime, spool
    from rasd.agent import settings as agent_settings

    profiler = _EveryThreadProfile() if profile_to else None
    settings = agent_settings.AgentSettings(
        node_id="bench-node", link=agent_settings.LinkSettings(controller_address=controller)
    )
    backend = _open_backend(backend_name, gpus, settings.sampling.power_sample_interval_ms)
    inventory = backend.inventory()
    agent = runtime.Agent(settings, backend, spool.Spool(":memory:"), boot_id="boot")
    stop = asyncio.Event()
    task = asyncio.create_task(agent.run(stop))
    await asyncio.sleep(warmup_s)
    if profiler:
        profiler.start()
    double0 = sum(_DOUBLE_CPU_S.values())
    cpu0, wall0, samples0, batches0 = (
        _cpu_s(),
        time.monotonic(),
        agent.stats.power_samples,
        agent.stats.telemetry_batches_sent,
    )
    await asyncio.sleep(duration_s)
    cpu1, wall1 = _cpu_s(), time.monotonic()
    double_cpu_s = sum(_DOUBLE_CPU_S.values()) - double0
    if profiler and profile_to:
        profiler.dump(profile_to)
    samples = agent.stats.power_samples - samples0
    batches = agent.stats.telemetry_batches_sent - batches0
    stop.set()
    await task
    backend.close()
    return {
        "backend": backend_name,
        "gpus": len(inventory),
        "models": sorted({info.model for info in inventory}),
        "cpu_s": cpu1 - cpu0,
        "wall_s": wall1 - wall0,
        "power_samples": samples,
        "telemetry_batches": batches,
        "connected": agent.stats.connects > 0,
        "rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "power_buffer": getattr(backend, "power_buffer_note", "none"),
        "double_cpu_s": double_cpu_s if backend_name == "nvml-double" else None,
    }


_AREAS = (
    ("the double", "nvml_double/"),
    ("pynvml", "pynvml.py"),
    ("ours", "/rasd/"),
    ("ours", "/agent/"),
    ("ours", "/common/"),
    ("gRPC", "grpc"),
    ("protobuf", "google/protobuf"),
    ("asyncio", "asyncio/"),
    ("structlog", "structlog"),
)


def _profile_split(path: str, runs: dict[str, dict[str, list[dict]]]) -> str:
    """The profile's own time (tottime) by area, and our code's top functions."""
    stats = pstats.Stats(path)
    by_area: dict[str, float] = {}
    ours: list[tuple[float, str]] = []
    for (filename, line, name), (_cc, _nc, tottime, _ct, _callers) in stats.stats.items():  # type: ignore[attr-defined]
        area = next((a for a, mark in _AREAS if mark in filename), "other (C built-ins, threading, stdlib)")
        by_area[area] = by_area.get(area, 0.0) + tottime
        if area == "ours":
            ours.append((tottime, f"{filename.split('/rasd/')[-1]}:{line} {name}"))
    total = sum(by_area.values()) or 1.0
    lines = [f"profile {path}: {total:.3f} s of CPU (own time) under the profiler"]
    lines += [
        f"  {area:<40} {t:7.3f} s {100 * t / total:5.1f} %" for area, t in sorted(by_area.items(), key=lambda x: -x[1])
    ]
    lines.append("  ours, top 15 by own time:")
    lines += [f"    {t:7.3f} s  {where}" for t, where in sorted(ours, reverse=True)[:15]]
    for backend, both in runs.items():
        r = both["this"][0]
        lines.append(f"  {backend}: {r['pct']:.2f} % of a core under the profiler")
    return "\n".join(lines)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _run_child(tree: pathlib.Path, backend: str, address: str, args: argparse.Namespace) -> dict:
    """One agent of `tree` (its own .venv and this script's child mode) on `backend`; its report."""
    child = subprocess.run(
        [str(tree / ".venv" / "bin" / "python"), str(tree / "bench" / "agent_overhead.py"), "--child", backend,
         "--controller", address, "--gpus", str(args.gpus), "--duration-s", str(args.duration_s),
         "--warmup-s", str(args.warmup_s), *(["--profile-to", args.profile] if args.profile else [])],
        capture_output=True, text=True, check=True, cwd=tree,
    )  # fmt: skip
    report = json.loads(child.stdout.strip().splitlines()[-1])
    report["pct"] = 100 * report["cpu_s"] / report["wall_s"]
    return report


def _measure(args: argparse.Namespace, backends: list[str]) -> dict[str, dict[str, list[dict]]]:
    """backend -> {"this": [report per round], "baseline": [...]}, the two trees alternating."""
    bin_dir = pathlib.Path(sys.executable).parent
    baseline = pathlib.Path(args.baseline_tree).resolve() if args.baseline_tree else None
    runs: dict[str, dict[str, list[dict]]] = {b: {"this": [], "baseline": []} for b in backends}
    with tempfile.TemporaryDirectory() as tmp:
        address = f"127.0.0.1:{_free_port()}"
        controller = subprocess.Popen(
            [str(bin_dir / "rasd-controller"), "--insecure", "--listen", address, "--metrics-port", "-1",
             "--db", f"sqlite:///{tmp}/bench.db", "--log-level", "warning"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            time.sleep(2.0)
            for _ in range(args.rounds):
                for backend in backends:
                    if baseline is not None and backend != "nvml-real":
                        runs[backend]["baseline"].append(_run_child(baseline, backend, address, args))
                    runs[backend]["this"].append(_run_child(REPO, backend, address, args))
        finally:
            controller.terminate()
            controller.wait(timeout=30)
    return runs


def _table(runs: dict[str, dict[str, list[dict]]], baseline: bool) -> tuple[list[str], float, float]:
    """The table's lines, the worst judged CPU % (median over rounds) and the worst judged peak RSS."""
    lines = [
        "| backend | GPUs | connected | CPU % of one core (median) | rounds | of which in the double's symbols "
        "(median) | CPU s per 30 s | peak RSS MiB | power samples/s | telemetry messages/s | power read from |"
        + (" baseline CPU % (median) | this / baseline |" if baseline else ""),
        "|---|---:|---|---:|---|---:|---:|---:|---:|---:|---|" + ("---:|---:|" if baseline else ""),
    ]
    worst_pct = worst_rss = 0.0
    for backend, both in runs.items():
        these = both["this"]
        pct = statistics.median(r["pct"] for r in these)
        rss = max(r["rss_mib"] for r in these)
        if backend in JUDGED:
            worst_pct, worst_rss = max(worst_pct, pct), max(worst_rss, rss)
        last = these[-1]
        rounds = ", ".join(f"{r['pct']:.2f}" for r in these)
        doubles = [100 * r["double_cpu_s"] / r["wall_s"] for r in these if r.get("double_cpu_s") is not None]
        double = f"{statistics.median(doubles):.2f}" if doubles else "–"
        row = (
            f"| {backend} | {last['gpus']} | {all(r['connected'] for r in these)} | {pct:.2f} | {rounds} | {double} | "
            f"{30 * statistics.median(r['cpu_s'] / r['wall_s'] for r in these):.3f} | {rss:.0f} | "
            f"{last['power_samples'] / last['wall_s']:.0f} | {last['telemetry_batches'] / last['wall_s']:.2f} | "
            f"{last.get('power_buffer', 'n/a')} |"
        )
        if baseline and both["baseline"]:
            base_pct = statistics.median(r["pct"] for r in both["baseline"])
            ratios = [t["pct"] / b["pct"] for t, b in zip(these, both["baseline"], strict=False) if b["pct"]]
            row += f" {base_pct:.2f} | {statistics.median(ratios):.2f} |"
        elif baseline:
            row += " – | – |"
        lines.append(row)
    return lines, worst_pct, worst_rss


def _parser() -> argparse.ArgumentParser:
    """The bench's command line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration-s", type=float, default=30.0)
    parser.add_argument("--warmup-s", type=float, default=3.0)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument(
        "--backends",
        default="simulated,nvml-double",
        help=f"comma-separated, from {', '.join(BACKENDS)} (nvml-real needs a GPU node's driver)",
    )
    parser.add_argument("--rounds", type=int, default=1, help="runs per backend (and tree), alternating")
    parser.add_argument("--baseline-tree", help="another checkout (with its .venv) to compare with, round by round")
    parser.add_argument("--no-write", action="store_true", help="print only; leave RESULTS.md alone")
    parser.add_argument("--profile", metavar="FILE", help="profile one agent of this tree (pstats to FILE); no RESULTS")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--profile-to", help=argparse.SUPPRESS)
    parser.add_argument("--controller", help=argparse.SUPPRESS)
    return parser


def _section_text(
    args: argparse.Namespace, backends: list[str], runs: dict[str, dict[str, list[dict]]], started: str
) -> tuple[str, str, bool]:
    """(the RESULTS.md section's title, its text, whether the goal was met) for these runs."""
    section = REAL_GPU_SECTION if "nvml-real" in backends else SECTION
    lines, worst_pct, worst_rss = _table(runs, args.baseline_tree is not None)
    met = worst_pct <= GOAL_PCT and worst_rss <= GOAL_RSS_MIB
    # The real GPUs' models, as the agent measured saw them (no second NVML session here).
    real_models = sorted({m for r in runs.get("nvml-real", {}).get("this", []) for m in r["models"]})
    gpu_names = ", GPUs: " + ", ".join(real_models) if real_models else ""
    baseline_note = (
        f" Each round ran the baseline tree's agent (`{args.baseline_tree}`, its own code and .venv) and then "
        "this tree's on the same backend and controller; the ratio is the median of the rounds' ratios."
        if args.baseline_tree
        else ""
    )
    command = (
        f".venv/bin/python bench/agent_overhead.py --duration-s {args.duration_s:g} --gpus {args.gpus} "
        f"--backends {','.join(backends)} --rounds {args.rounds}"
        + (f" --baseline-tree {args.baseline_tree}" if args.baseline_tree else "")
    )
    text = "\n".join(
        [
            section,
            "",
            f"Command: `{command}`  ",
            f"Machine: {results.machine()}, load average {os.getloadavg()[0]:.2f} at the end{gpu_names}  ",
            f"Run: {started}; each agent alone in its own process for {args.duration_s:g} s after "
            f"{args.warmup_s:g} s warm-up, streaming to a real controller in another process. CPU = user + system "
            "of the agent process, all threads; peak RSS = the agent process's maximum resident set. "
            "`nvml-double` is the NVML backend running the real pynvml.py against the test double's fake "
            "libnvidia-ml (no GPU), so it measures our code, pynvml and the double's Python, not the driver; "
            "`nvml-real` is the same backend against the real driver, on all the node's GPUs. The simulated "
            "backend computes its GPUs' draw in the agent's process, so its row is shown, not judged. "
            "\"In the double's symbols\": the CPU time (thread time) spent inside the fake C library's "
            "functions, the part a real driver would do in C; the rest is the agent's own." + baseline_note,
            "",
            *lines,
            "",
            f"Goal: ≤ {GOAL_PCT:g}% of one core with {args.gpus} GPUs and peak RSS ≤ {GOAL_RSS_MIB:g} MiB "
            f"({', '.join(b for b in backends if b in JUDGED) or 'no judged backend'}): "
            f"{'met' if met else 'NOT met'} (worst {worst_pct:.2f}%, {worst_rss:.0f} MiB).",
            "",
        ]
    )
    return section, text, met


def main(argv: list[str] | None = None) -> int:
    """Run the backends, print the table, update bench/RESULTS.md; exit 1 if the goal is missed."""
    parser = _parser()
    args = parser.parse_args(argv)
    if args.child:  # first: a baseline tree's older parser must not see the newer options
        report = asyncio.run(
            _child(args.child, args.controller, args.gpus, args.duration_s, args.warmup_s, args.profile_to)
        )
        print(json.dumps(report))
        return 0
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    unknown = sorted(set(backends) - set(BACKENDS))
    if unknown or not backends:
        parser.error(f"--backends: unknown {', '.join(unknown) or '(none given)'}; choose from {', '.join(BACKENDS)}")
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    if args.profile:
        args.rounds, args.baseline_tree = 1, None
        runs = _measure(args, backends)
        print(_profile_split(args.profile, runs))
        return 0
    runs = _measure(args, backends)
    section, text, met = _section_text(args, backends, runs, started)
    print(text)
    if not args.no_write:
        results.write_section(section, text)
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
