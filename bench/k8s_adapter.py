"""What the Kubernetes adapter's calls take from the decider's interpreter: in the controller's process, or its own.

One command: ``.venv/bin/python bench/k8s_adapter.py``. Writes the "Kubernetes adapter and the
decider's interpreter" section of bench/RESULTS.md.

The remediation burst (`bench/remediation.py --quarantine kubernetes`) measures decision latency
end to end, which on a shared, loaded machine moves with everyone else's load. This isolates the
one thing the adapter's placement changes: the main thread runs a stand-in for the decider (units
of pure-Python work, ``--unit-ms`` each, back to back) while ``--threads`` threads make
``quarantine_gpu`` calls at ``--rate`` a second, as the remediation service's adapter threads do, to
the fake API server of tests/fakes/kube_api.py in a process of its own (every answer
``--latency-ms`` late). Modes, interleaved in each round (the order alternates), so every ratio
compares runs seconds apart under the same load:

- ``none``: no calls (the decider's own rate);
- ``in-process``: `KubernetesQuarantine` in this process (``own_process = false``);
- ``own-process``: `KubernetesProcess`, the client in a child (rasd-controller's default).

Figures per mode: the decider's units a second as a share of ``none``'s in the same round, its
slowest units (p99, max: a unit that waited for the GIL), the calls' latency p50/p99, and the CPU
seconds of this process's threads other than the decider's (the adapter's work in the decider's
interpreter) and of the adapter's child. Every call quarantines a GPU not quarantined
before (a read, a patch; the Event before the answer in-process, after it in the child).

Goal (issue 38 item 6: keep the API client's work off the decider's interpreter): in every round, the
adapter's CPU left in the decider's process is ≤ 10 % of what it is with the client in that process.
The decider's rate and its slowest units are shown too; on a loaded machine they move with the load.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import os
import pathlib
import resource
import sys
import tempfile
import threading
import time

import remediation as burst_bench
import results

from rasd.controller.executors import quarantine

SECTION = "## Kubernetes adapter and the decider's interpreter"
GOAL_LEFT = 0.10
MODES = ("none", "in-process", "own-process")


def _unit(additions: int) -> int:
    total = 0
    for i in range(additions):
        total += i
    return total


def _additions_per_ms() -> int:
    started = time.perf_counter()
    _unit(200_000)
    return max(1, int(200_000 / ((time.perf_counter() - started) * 1000)))


class _Calls:
    """Paced ``quarantine_gpu`` calls through an adapter from a thread pool; their latencies."""

    def __init__(self, adapter: object, rate: float, threads: int, first: int, nodes: int) -> None:
        self._adapter = adapter
        self._nodes = nodes
        self._interval_s = 1.0 / rate
        self._pool = concurrent.futures.ThreadPoolExecutor(threads, "bench-adapter")
        self._next = first
        self._stop = threading.Event()
        self.latency_ms: list[float] = []
        self.failed = 0
        self._pacer = threading.Thread(target=self._pace, name="bench-pacer", daemon=True)

    @property
    def next_gpu(self) -> int:
        return self._next

    def start(self) -> None:
        self._pacer.start()

    def stop(self) -> None:
        self._stop.set()
        self._pacer.join()
        self._pool.shutdown(wait=True)

    def _pace(self) -> None:
        due = time.perf_counter()
        while not self._stop.is_set():
            due += self._interval_s
            delay = due - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            gpu, self._next = self._next, self._next + 1
            self._pool.submit(self._one, gpu)

    def _one(self, gpu: int) -> None:
        # Consecutive calls on different nodes: the service calls one node's adapter in turn, never at once.
        index, node = divmod(gpu, self._nodes)
        started = time.perf_counter()
        try:
            self._adapter.quarantine_gpu(  # type: ignore[attr-defined]
                burst_bench.node_name(node), burst_bench.gpu_uuid(node, index), reason="bench", ticket_id=f"t{gpu}"
            )
        except quarantine.QuarantineError:
            self.failed += 1
            return
        self.latency_ms.append((time.perf_counter() - started) * 1000)


def _cpu_s(pid: int | None) -> tuple[float, float]:
    """CPU seconds so far of this process and of the adapter's child (0 without one)."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    child = burst_bench._proc_cpu_s(pathlib.Path(f"/proc/{pid}")) if pid is not None else 0.0
    return own.ru_utime + own.ru_stime, child


def run_mode(
    mode: str, url: str, args: argparse.Namespace, first_gpu: int, additions: int, nodes: int
) -> tuple[dict, int]:
    """One mode for args.seconds; its figures and the next unused GPU number."""
    adapter = None
    if mode != "none":
        settings = {"host": url, "request_timeout_s": 30, "own_process": mode == "own-process"}
        adapter = quarantine.open_quarantine({"adapter": "kubernetes", "kubernetes": settings})
        adapter.quarantine_gpu(burst_bench.node_name(nodes), "GPU-warm", reason="warm", ticket_id="warm")
    pid = getattr(adapter, "pid", None)
    calls = _Calls(adapter, args.rate, args.threads, first_gpu, nodes) if adapter is not None else None
    units_ms: list[float] = []
    try:
        cpu0, main0 = _cpu_s(pid), time.thread_time()
        if calls is not None:
            calls.start()
        started = time.perf_counter()
        while (now := time.perf_counter()) - started < args.seconds:
            _unit(additions)
            units_ms.append((time.perf_counter() - now) * 1000)
        wall_s = time.perf_counter() - started
        if calls is not None:
            calls.stop()
        cpu1, main_cpu_s = _cpu_s(pid), time.thread_time() - main0
    finally:
        if adapter is not None:
            adapter.close()
    latency = calls.latency_ms if calls is not None else []
    figures = {
        "mode": mode,
        "units_per_s": len(units_ms) / wall_s,
        "unit_p99_ms": burst_bench._pct(units_ms, 99),
        "unit_max_ms": max(units_ms),
        "calls": len(latency),
        "failed": calls.failed if calls is not None else 0,
        "call_p50_ms": burst_bench._pct(latency, 50) if latency else float("nan"),
        "call_p99_ms": burst_bench._pct(latency, 99) if latency else float("nan"),
        "cpu_s": cpu1[0] - cpu0[0] - main_cpu_s,
        "child_cpu_s": cpu1[1] - cpu0[1],
    }
    return figures, calls.next_gpu if calls is not None else first_gpu


def _section(args: argparse.Namespace, header: str, started: str, rows: list[dict], argv_text: str) -> tuple[str, bool]:
    lines = [
        SECTION,
        "",
        f"Command: `.venv/bin/python bench/k8s_adapter.py{(' ' + argv_text) if argv_text else ''}`  ",
        f"Machine: {header}, {load_text()} at the end  ",
        f"Run: {started}; {args.rounds} rounds, {args.seconds:g} s per mode, decider units of {args.unit_ms:g} ms, "
        f"`quarantine_gpu` calls at {args.rate:g}/s from {args.threads} threads, every API answer "
        f"{args.latency_ms:g} ms late (a read and a patch per call, an Event each).",
        "",
        "| round | mode | decider units/s | share of `none` | unit p99 ms | unit max ms | calls | failed "
        "| call p50 ms | call p99 ms | CPU s (this process's other threads) | CPU s (adapter child) |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    left = [own["cpu_s"] / inproc["cpu_s"] for own, inproc in _pairs(rows)]
    met = bool(left) and all(share <= GOAL_LEFT for share in left)
    for row in rows:
        share = row["share"]
        lines.append(
            f"| {row['round']} | {row['mode']} | {row['units_per_s']:,.0f} | {share:.0%} | {row['unit_p99_ms']:.1f} "
            f"| {row['unit_max_ms']:.1f} | {row['calls']:,} | {row['failed']} | {row['call_p50_ms']:.1f} "
            f"| {row['call_p99_ms']:.1f} | {row['cpu_s']:.2f} | {row['child_cpu_s']:.2f} |"
        )
    own = [f"{r['share']:.0%}" for r in rows if r["mode"] == "own-process"]
    inproc = [f"{r['share']:.0%}" for r in rows if r["mode"] == "in-process"]
    lines += [
        "",
        f"The decider's share of its own rate with the calls running: in-process {', '.join(inproc)}; "
        f"own process {', '.join(own)}.",
        "",
        "The adapter's CPU left in the decider's process, own process / in-process: "
        + ", ".join(f"{share:.0%}" for share in left)
        + ".",
        "",
        f"Goal: the adapter's CPU left in the decider's process ≤ {GOAL_LEFT:.0%} of in-process, every round: "
        f"{'met' if met else 'NOT met'}",
        "",
    ]
    return "\n".join(lines), met


def _pairs(rows: list[dict]) -> list[tuple[dict, dict]]:
    """Each round's (own-process, in-process) rows."""
    by_round: dict[int, dict[str, dict]] = {}
    for row in rows:
        by_round.setdefault(row["round"], {})[row["mode"]] = row
    return [(modes["own-process"], modes["in-process"]) for modes in by_round.values()]


def load_text() -> str:
    """The machine's 1-minute load average, as the header words it."""
    return f"load average {os.getloadavg()[0]:.2f}"


def main(argv: list[str] | None = None) -> int:
    """Run the modes interleaved, print the section, write it to bench/RESULTS.md; exit 1 if the goal is missed."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5.0, help="how long each mode runs")
    parser.add_argument("--rate", type=float, default=200.0, help="quarantine_gpu calls a second")
    parser.add_argument("--threads", type=int, default=16, help="adapter threads (the service's ADAPTER_THREADS)")
    parser.add_argument("--latency-ms", type=float, default=5.0, help="added to every API answer")
    parser.add_argument("--unit-ms", type=float, default=1.0, help="the decider's unit of work")
    parser.add_argument("--no-write", action="store_true", help="print only; leave RESULTS.md alone")
    args = parser.parse_args(argv)
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    header = results.machine()
    additions = int(_additions_per_ms() * args.unit_ms)
    rows: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        nodes = int(args.rate * args.seconds * len(MODES) * args.rounds / burst_bench.GPUS_PER_NODE) + 64
        # One more node than the calls use: the warm-up's.
        url, _server = stack.enter_context(burst_bench.fake_api_server(nodes + 1, args.latency_ms, tmp))
        gpu = 0
        for round_ in range(1, args.rounds + 1):
            order = MODES if round_ % 2 else (MODES[0], *reversed(MODES[1:]))
            got = {}
            for mode in order:
                got[mode], gpu = run_mode(mode, url, args, gpu, additions, nodes)
                print(f"round {round_} {mode}: {got[mode]}", file=sys.stderr)
            for mode in MODES:
                rows.append(
                    {**got[mode], "round": round_, "share": got[mode]["units_per_s"] / got["none"]["units_per_s"]}
                )
    argv_text = " ".join(sys.argv[1:] if argv is None else argv)
    text, met = _section(args, header, started, rows, argv_text)
    print(text)
    if not args.no_write:
        results.write_section(SECTION, text)
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
