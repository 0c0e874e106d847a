"""What the Kubernetes adapter's calls take from the decider's interpreter: in the controller's process, or its own.

One command: ``.venv/bin/python bench/k8s_adapter.py``. Writes the "Kubernetes adapter and the
decider's interpreter" section of bench/RESULTS.md.

The remediation burst (`bench/remediation.py --quarantine kubernetes`) measures decision latency
end to end, which on a shared, loaded machine moves with everyone else's load. This isolates the
one thing the adapter's placement changes: the main thread's event loop runs a stand-in for the
decider (units of pure-Python work, ``--unit-ms`` each, back to back, yielding to the loop between
them) while the same loop starts ``quarantine_gpu`` actions at ``--rate`` a second through the
executors table and the remediation service's own `adapters.call` (in one of ``--threads`` threads,
or awaited on the loop where the adapter has ``call_async``), to the fake API server of
tests/fakes/kube_api.py in a process of its own (every answer ``--latency-ms`` late). Modes,
interleaved in each round (the order alternates), so every ratio compares runs seconds apart under
the same load:

- ``none``: no calls (the decider's own rate);
- ``in-process``: `KubernetesQuarantine` in this process (``own_process = false``);
- ``own-process``: `KubernetesProcess`, the client in a child (rasd-controller's default).

Figures per mode: the decider's units a second as a share of ``none``'s in the same round, its
slowest units (p99, max: a unit that waited for the GIL), the calls' latency p50/p99, and the CPU
seconds of this process beside the decider's units (all threads', less each unit's own thread time:
the adapter's work in the decider's interpreter, the loop's too) and of the adapter's child. Every
call quarantines a GPU not quarantined before (a read, a patch; the Event before the answer
in-process, after it in the child). Logs as rasd-controller writes them (JSON at info), to /dev/null.

Goal (issue 38 item 6: keep the API client's work off the decider's interpreter): in every round, the
adapter's CPU left in the decider's process is ≤ 10 % of what it is with the client in that process,
each beyond mode ``none``'s (the loop's own cost of yielding between units).
The decider's rate and its slowest units are shown too; on a loaded machine they move with the load.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import contextlib
import os
import pathlib
import sys
import tempfile
import time

import remediation as burst_bench
import results

from rasd.common import logging as rasd_logging
from rasd.controller.core.remediation import actions
from rasd.controller.executors import quarantine
from rasd.controller.remediation import adapters

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
    """Paced ``quarantine_gpu`` actions through the executors table, from the event loop, as the service makes them.

    Each call goes through `adapters.call`, the remediation service's own: awaited on the loop where
    the adapter has ``call_async`` (own process), else in one of ``threads`` threads.
    """

    def __init__(self, adapter: object, rate: float, threads: int, first: int, nodes: int) -> None:
        self._executor = quarantine.executors(adapter)[actions.QuarantineGpu.kind]  # type: ignore[arg-type]
        self._nodes = nodes
        self._interval_s = 1.0 / rate
        self._pool = concurrent.futures.ThreadPoolExecutor(threads, "bench-adapter")
        self._next = first
        self._tasks: set[asyncio.Task[None]] = set()
        self.latency_ms: list[float] = []
        self.failed = 0

    @property
    def next_gpu(self) -> int:
        return self._next

    async def pace(self, seconds: float) -> None:
        """Start a call every interval for seconds, then wait for the calls in flight."""
        started = due = time.perf_counter()
        while due - started < seconds:
            due += self._interval_s
            await asyncio.sleep(max(0.0, due - time.perf_counter()))
            gpu, self._next = self._next, self._next + 1
            task = asyncio.create_task(self._one(gpu))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        await asyncio.gather(*self._tasks)
        self._pool.shutdown(wait=True)

    async def _one(self, gpu: int) -> None:
        # Consecutive calls on different nodes: the service calls one node's adapter in turn, never at once.
        index, node = divmod(gpu, self._nodes)
        action = actions.QuarantineGpu(
            ticket_id=f"t{gpu}", step=1, node_id=burst_bench.node_name(node), reason="bench",
            gpu_uuid=burst_bench.gpu_uuid(node, index),
        )  # fmt: skip
        started = time.perf_counter()
        try:
            await adapters.call(self._executor, action, self._pool)
        except quarantine.QuarantineError:
            self.failed += 1
            return
        self.latency_ms.append((time.perf_counter() - started) * 1000)


async def _decide(seconds: float, additions: int, units_ms: list[float]) -> float:
    """The decider's stand-in: units back to back for seconds, yielding to the loop between them; their CPU s."""
    unit_cpu_s = 0.0
    started = time.perf_counter()
    while (now := time.perf_counter()) - started < seconds:
        cpu = time.thread_time()
        _unit(additions)
        unit_cpu_s += time.thread_time() - cpu
        units_ms.append((time.perf_counter() - now) * 1000)
        await asyncio.sleep(0)
    return unit_cpu_s


def _child_cpu_s(pid: int | None) -> float:
    """CPU seconds so far of the adapter's child (0 without one)."""
    return burst_bench._proc_cpu_s(pathlib.Path(f"/proc/{pid}")) if pid is not None else 0.0


def run_mode(
    mode: str, url: str, args: argparse.Namespace, first_gpu: int, additions: int, nodes: int
) -> tuple[dict, int]:
    """One mode for args.seconds; its figures and the next unused GPU number."""
    adapter = None
    if mode != "none":
        settings = {"host": url, "request_timeout_s": 30, "own_process": mode == "own-process"}
        adapter = quarantine.open_quarantine({"adapter": "kubernetes", "kubernetes": settings})
        with burst_bench.children_log_to_devnull():  # the child starts here, and logs each call
            adapter.quarantine_gpu(burst_bench.node_name(nodes), "GPU-warm", reason="warm", ticket_id="warm")
    pid = getattr(adapter, "pid", None)
    calls = _Calls(adapter, args.rate, args.threads, first_gpu, nodes) if adapter is not None else None
    units_ms: list[float] = []

    async def both() -> tuple[float, float]:
        started = time.perf_counter()
        pacing = asyncio.create_task(calls.pace(args.seconds)) if calls is not None else None
        unit_cpu_s = await _decide(args.seconds, additions, units_ms)
        wall_s = time.perf_counter() - started
        if pacing is not None:
            await pacing
        return unit_cpu_s, wall_s

    try:
        # The controller's logs as it writes them (JSON at info), to /dev/null: the adapter logs each call.
        with open(os.devnull, "w") as devnull, contextlib.redirect_stderr(devnull):
            cpu0, child0 = time.process_time(), _child_cpu_s(pid)
            unit_cpu_s, wall_s = asyncio.run(both())
            cpu1, child1 = time.process_time(), _child_cpu_s(pid)
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
        "cpu_s": cpu1 - cpu0 - unit_cpu_s,
        "child_cpu_s": child1 - child0,
    }
    return figures, calls.next_gpu if calls is not None else first_gpu


def _section(args: argparse.Namespace, header: str, started: str, rows: list[dict], argv_text: str) -> tuple[str, bool]:
    lines = [
        SECTION,
        "",
        f"Command: `.venv/bin/python bench/k8s_adapter.py{(' ' + argv_text) if argv_text else ''}`  ",
        f"Machine: {header}, {load_text()} at the end  ",
        f"Run: {started}; {args.rounds} rounds, {args.seconds:g} s per mode, decider units of {args.unit_ms:g} ms, "
        f"`quarantine_gpu` calls at {args.rate:g}/s started on the event loop as the service starts them (in "
        f"{args.threads} adapter threads in-process, awaited on the loop with the child), every API answer "
        f"{args.latency_ms:g} ms late (a read and a patch per call, an Event each).",
        "",
        "| round | mode | decider units/s | share of `none` | unit p99 ms | unit max ms | calls | failed "
        "| call p50 ms | call p99 ms | CPU s (this process beside the decider's units) | CPU s (adapter child) |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    # The loop's own cost of yielding between units (mode none) is no adapter's.
    left = [(own["cpu_s"] - none["cpu_s"]) / (inproc["cpu_s"] - none["cpu_s"]) for own, inproc, none in _pairs(rows)]
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
        "The adapter's CPU left in the decider's process (beyond mode `none`'s), own process / in-process: "
        + ", ".join(f"{share:.0%}" for share in left)
        + ".",
        "",
        f"Goal: the adapter's CPU left in the decider's process ≤ {GOAL_LEFT:.0%} of in-process, every round: "
        f"{'met' if met else 'NOT met'}",
        "",
    ]
    return "\n".join(lines), met


def _pairs(rows: list[dict]) -> list[tuple[dict, dict, dict]]:
    """Each round's (own-process, in-process, none) rows."""
    by_round: dict[int, dict[str, dict]] = {}
    for row in rows:
        by_round.setdefault(row["round"], {})[row["mode"]] = row
    return [(modes["own-process"], modes["in-process"], modes["none"]) for modes in by_round.values()]


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
    rasd_logging.configure("info", json=True)  # as rasd-controller runs
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
