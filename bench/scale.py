"""Scale: one controller against 256 / 1,024 / 2,048 simulated nodes × 8 GPUs on loopback.

Run: .venv/bin/python bench/scale.py [--sizes 256,1024,2048] [--measure-s 30] [--agent-procs 2] [--no-write]

Per fleet size, in fresh processes:

1. **Controller**: a real `rasd.controller.server.Controller` in its own process (gRPC on
   127.0.0.1, SQLite file store in WAL mode, remediation on with the default production policy,
   JSON logs at info to /dev/null as ``rasd-controller`` would write them). Its CPU seconds and
   peak RSS are that process's own (``getrusage``), so the agents' cost is not in them.
2. **Agents**: `rasd.sim.swarm` agents spread over ``--agent-procs`` processes. Every node has its
   own gRPC channel, TCP connection and ``AgentService.Connect`` stream, 8 GPUs, and sends what a
   real agent sends at the default rates: one telemetry batch per second with 10 power samples
   per GPU (10 Hz) and one counter sample per GPU (1 Hz). The swarm's spool is in memory (see
   sim/swarm.py). All agents start at once (a connect storm); "all connected" is the time from
   their start to the last agent's first Welcome.
3. **Steady window** (``--measure-s``, after ``--warmup-s``): telemetry samples ingested per second
   (the controller's own count of power samples it kept), controller CPU seconds in the window.
4. **Fault burst** in the middle of the window: ``max(16, nodes / 16)`` faults over
   ``--burst-s`` seconds, each on a different random node, drawn from a mix shaped like the Llama 3
   interruption causes (application Xid 13/31, HBM Xid 48 and ECC DBE, NVLink errors, GPUs off the
   bus, row-remap failures). They travel the real path: agent spool → stream → store → ack →
   classify → ladder → outbox → dispatch → command on the agent's stream.

"event→dispatch" is the controller's own `RemediationStats.decision_latency_s`: event stored →
the action leaving the decision path (put on the node's stream after its commit, or handed to
its adapter), per action the event's decision dispatched (a reset is two: quarantine the GPU, reset
it), for events that led to a dispatch. The actions of an event the blast-radius policy held back (a
rack's or NVLink domain's cap, the cluster's) wait for the policy, not the decision: they are counted
on their own (`RemediationStats.policy_held_s`).
"event→command at agent" is measured end to end on the agent side: the event's observed time → the
first command that node receives after it (one clock: all processes share the host's). Its p99 is
the ladder's counter hold, not a delay: an ECC DBE the burst injects as a counter waits
``counter_hold_s`` (5 s) for the Xid that names it, then the tick after that resets the GPU.

Also reported: how long flushing the latest telemetry took, in chunks between the store thread's
other calls (``rasd_store_flush_seconds``), the mean health-event batch receive → ack time
(``rasd_event_persist_seconds``), the ladder's commit p99 and the slowest decisions with their
kinds; from the store after the run (`disruption`), the nodes whose node-level repair was asked,
sent and still waiting for the budget at the end, and the most nodes out of service at once.
``--profile PATH`` writes a cProfile of the controller's event loop; ``--heap-census objects``
prints after warm-up the objects the controller's collector walks, by type (``bytes``: also the top
allocation sites, traced). ``--controller-cpu N`` pins the controller (and the commit writer it
starts) to one CPU, ``--agents-cpu M`` the agents to another, as `taskset -c` would.

Figures go to the "## Scale" section of bench/RESULTS.md. The goals (issue #36, "One core",
"Memory" and connect storms): one replica on one core carries 2,048 nodes × 8 GPUs, all connected
within 60 s, no telemetry dropped, CPU ≤ 100 % of the core, event → dispatch p99 ≤ 50 ms through
the burst; ≤ 0.15 MB of controller memory (peak RSS) per node.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import cProfile
import gc
import multiprocessing
import multiprocessing.connection
import os
import pathlib
import random
import resource
import sys
import tempfile
import time
import tracemalloc
from typing import Any

import results

SECTION = "## Scale"
GPUS_PER_NODE = 8
NODES_PER_RACK = 16
NODES_PER_NVLINK_DOMAIN = 8
GOAL_P99_MS = 50.0
GOAL_CONNECTED_S = 60.0
GOAL_MB_PER_NODE = 0.15
# (weight, label, EventKind name, xid, attributes): the fault mix of the burst.
MIX: tuple[tuple[float, str, str, int | None, dict[str, str]], ...] = (
    (0.30, "xid13", "EVENT_KIND_XID", 13, {}),
    (0.10, "xid31", "EVENT_KIND_XID", 31, {}),
    (0.17, "xid48", "EVENT_KIND_XID", 48, {}),
    (0.08, "ecc_dbe", "EVENT_KIND_ECC_DBE", None, {"remapped_rows_uncorrectable": "2"}),
    (0.15, "nvlink_errors", "EVENT_KIND_NVLINK_ERRORS", None, {"link": "3", "nvlink_errors_per_s": "5000"}),
    (0.15, "xid79", "EVENT_KIND_XID", 79, {}),
    (0.05, "row_remap_failure", "EVENT_KIND_ROW_REMAP_FAILURE", None, {}),
)


def node_name(i: int) -> str:
    """Node i's id."""
    return f"node-{i:05d}"


def labels(i: int) -> dict[str, str]:
    """Node i's topology labels (16 nodes a rack, 8 an NVLink domain)."""
    return {"rack": f"rack-{i // NODES_PER_RACK:04d}", "nvlink_domain": f"nvl-{i // NODES_PER_NVLINK_DOMAIN:04d}"}


def _raise_fd_limit() -> None:
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def _pin(cpu: int | None) -> None:
    """Pin this process to one CPU (what `taskset -c cpu` does); None: leave it where it is."""
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})


def _usage() -> tuple[float, float]:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024


# -- the controller process -----------------------------------------------------------------------
def controller_process(
    conn: multiprocessing.connection.Connection,
    db_path: str,
    profile_path: str = "",
    cpu: int | None = None,
    commit_writer: str = "process",
    census: str | None = None,
) -> None:
    """Run one controller until told to stop; answer status requests on conn (profile_path: cProfile its loop).

    census: answer ``census`` requests (`_heap_census`); ``"bytes"``: trace allocations from the start.
    """
    _pin(cpu)
    _raise_fd_limit()
    if census == "bytes":
        tracemalloc.start()
    from rasd.common import gc_policy
    from rasd.common import logging as rasd_logging
    from rasd.controller import server

    rasd_logging.configure("info", json=True)
    gc_policy.configure()  # as rasd-controller's main does
    # The controller's JSON logs are written (their cost is part of the controller's), to /dev/null.
    sys.stdout = sys.stderr = open(os.devnull, "w")  # noqa: SIM115 (the process's lifetime)

    async def main() -> None:
        controller = server.Controller(
            server.ControllerSettings(
                listen="127.0.0.1:0", db_url=f"sqlite:///{db_path}", metrics_port=None, commit_writer=commit_writer
            )
        )
        await controller.start()
        gc_policy.freeze_startup_heap()  # as rasd-controller does after start (`workers.serve`)
        conn.send(("ready", controller.port))
        profiler = cProfile.Profile() if profile_path else None
        if profiler is not None:
            profiler.enable()  # the event-loop thread only (the store thread is not in it)
        try:
            while True:
                request = await asyncio.to_thread(conn.recv)
                if request == "status":
                    conn.send(_status(controller))
                elif request == "census":
                    conn.send(_heap_census())
                elif request == "stop":
                    break
        finally:
            if profiler is not None:
                profiler.disable()
                profiler.dump_stats(profile_path)
            stats = controller.remediation.stats if controller.remediation else None
            await controller.stop()
            cpu_s, rss = _usage()
            conn.send(
                {
                    "decision_latency_s": list(stats.decision_latency_s) if stats else [],
                    "decision_latency_kinds": list(stats.decision_latency_kinds) if stats else [],
                    "policy_held_s": list(stats.policy_held_s) if stats else [],
                    "commit_s": list(stats.commit_s) if stats else [],
                    "actions_by_kind": dict(stats.actions_by_kind) if stats else {},
                    "events_decided": stats.events if stats else 0,
                    "cpu_s": cpu_s,
                    "peak_rss_mib": rss,
                }
            )

    asyncio.run(main())


def _status(controller: Any) -> dict[str, Any]:
    """The controller's counters now, for the driver's window."""
    cpu_s, rss = _usage()
    return {
        "at_ns": time.time_ns(),
        "sessions": len(controller.ingest.sessions),
        "samples": controller.ingest.samples_ingested,
        "events": controller.ingest.events_stored,
        "decisions": len(controller.remediation.stats.decision_latency_s) if controller.remediation else 0,
        "cpu_s": cpu_s,
        "rss_mib": rss,
        # The single store thread: time spent writing the latest telemetry.
        "flush_s": controller.registry.get_sample_value("rasd_store_flush_seconds_sum") or 0.0,
        "flushes": controller.registry.get_sample_value("rasd_store_flush_seconds_count") or 0.0,
        "persist_s": controller.registry.get_sample_value("rasd_event_persist_seconds_sum") or 0.0,
        "persists": controller.registry.get_sample_value("rasd_event_persist_seconds_count") or 0.0,
        **_gc_pauses(controller.metrics.gc_pause_seconds),
    }


CENSUS_TOP = 25
"""How many object types and allocation sites a heap census lists."""


def _heap_census() -> str:
    """What a full collection that thaws walks (tracked objects by type) and where the traced bytes are.

    The frozen heap is counted too: unfrozen for the census, then frozen again as a thaw would leave it.
    """
    gc.collect()
    by_generation = [len(gc.get_objects(generation=g)) for g in range(3)]
    frozen = gc.get_freeze_count()
    gc.unfreeze()
    types = collections.Counter(type(o).__qualname__ for o in gc.get_objects())
    gc.freeze()
    lines = [
        f"tracked objects by generation {by_generation}, frozen {frozen:,}; all of them by type:",
        *(f"  {n:>10,}  {name}" for name, n in types.most_common(CENSUS_TOP)),
    ]
    if tracemalloc.is_tracing():
        snapshot = tracemalloc.take_snapshot().filter_traces([tracemalloc.Filter(False, tracemalloc.__file__)])
        stats = snapshot.statistics("lineno")
        lines.append(f"traced {sum(s.size for s in stats) / 2**20:,.1f} MiB; top sites:")
        lines += [f"  {s.size / 2**20:>8.2f} MiB {s.count:>9,}  {s.traceback[0]}" for s in stats[:CENSUS_TOP]]
    return "\n".join(lines)


# -- an agent process -------------------------------------------------------------------------------
def swarm_process(
    conn: multiprocessing.connection.Connection,
    address: str,
    first: int,
    count: int,
    seed: int,
    spread_s: float,
    cpu: int | None = None,
) -> None:
    """Run agents first..first+count-1 until told to stop; inject faults when told."""
    _pin(cpu)
    _raise_fd_limit()
    from rasd.api.v1 import health_pb2 as health_pb
    from rasd.sim import swarm

    async def main() -> None:
        started_ns = time.time_ns()
        fleet = swarm.Swarm(
            [node_name(first + i) for i in range(count)],
            swarm.SwarmSettings(controller_address=address, gpus_per_node=GPUS_PER_NODE, seed=seed),
            labels=lambda i: labels(first + i),
        )
        stop = asyncio.Event()
        runner = asyncio.create_task(fleet.run(stop, connect_spread_s=spread_s))
        injected: dict[int, int] = {}  # local index -> event observed ns
        pending: set[asyncio.Task[None]] = set()

        async def inject_later(index: int, delay_s: float, kind: str, xid: int | None, attrs: dict[str, str]) -> None:
            await asyncio.sleep(delay_s)
            agent = fleet.agents[index]
            event = agent.inject(
                health_pb.EventKind.Value(kind),
                gpu_index=random.Random(index).randrange(GPUS_PER_NODE),
                xid=xid,
                message=f"bench fault {kind} {xid or ''}",
                attributes=attrs,
            )
            injected[index] = event.observed_unix_ns

        while True:
            request = await asyncio.to_thread(conn.recv)
            if request == "status":
                conn.send({"connected": fleet.connected})
            elif isinstance(request, tuple) and request[0] == "burst":
                for index, delay_s, kind, xid, attrs in request[1]:
                    task = asyncio.create_task(inject_later(index, delay_s, kind, xid, attrs))
                    pending.add(task)
                    task.add_done_callback(pending.discard)
                conn.send("ok")
            elif request == "stop":
                break
        connected_at_stop = fleet.connected
        stop.set()
        await runner
        latencies = []
        for index, observed_ns in injected.items():
            after = [at for at, _cid, _kind in fleet.agents[index].stats.commands if at >= observed_ns]
            if after:
                latencies.append((min(after) - observed_ns) / 1e9)
        conn.send(
            {
                "started_ns": started_ns,
                "first_connected_ns": [a.stats.first_connected_unix_ns for a in fleet.agents],
                "connect_failures": sum(a.stats.connect_failures for a in fleet.agents),
                "connected_at_stop": connected_at_stop,
                "samples_sent": sum(a.stats.power_samples_sent for a in fleet.agents),
                "injected": len(injected),
                "e2e_latency_s": latencies,
                "unacked": sum(a.spool_depth for a in fleet.agents),
                "cpu_s": _usage()[0],
            }
        )

    asyncio.run(main())


# -- the driver ---------------------------------------------------------------------------------------
def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered) + 0.5) - 1))]


def _ask(conn: multiprocessing.connection.Connection, request: Any, timeout_s: float = 60.0) -> Any:
    conn.send(request)
    if not conn.poll(timeout_s):
        raise TimeoutError(f"no answer to {request!r} within {timeout_s:g} s")
    return conn.recv()


def _start_swarms(ctx: Any, address: str, nodes: int, args: argparse.Namespace) -> list[tuple[Any, Any, int, int]]:
    """Start the agent processes, the fleet split evenly; each entry is (process, pipe, first node, count)."""
    procs = max(1, min(args.agent_procs, nodes))
    per = [nodes // procs + (1 if i < nodes % procs else 0) for i in range(procs)]
    spread_s = nodes / args.connect_rate if args.connect_rate > 0 else 0.0
    swarms = []
    first = 0
    for count in per:
        a, b = ctx.Pipe()
        p = ctx.Process(
            target=swarm_process, args=(b, address, first, count, args.seed, spread_s, args.agents_cpu), daemon=True
        )
        p.start()
        swarms.append((p, a, first, count))
        first += count
    return swarms


def _plan_burst(
    nodes: int, swarms: list[tuple[Any, Any, int, int]], args: argparse.Namespace
) -> tuple[int, dict[str, int], list[list[tuple[int, float, str, int | None, dict[str, str]]]]]:
    """The burst's faults drawn from MIX, spread over `burst_s`: (count, count per kind, each swarm's plan)."""
    rng = random.Random(args.seed * 7919 + nodes)
    faults = max(16, nodes // 16)
    targets = rng.sample(range(nodes), faults)
    plans: list[list[tuple[int, float, str, int | None, dict[str, str]]]] = [[] for _ in swarms]
    mix_counts: dict[str, int] = {}
    for k, node in enumerate(targets):
        _w, label, kind, xid, attrs = rng.choices(MIX, [m[0] for m in MIX])[0]
        mix_counts[label] = mix_counts.get(label, 0) + 1
        owner = next(i for i, (_p, _c, f, c) in enumerate(swarms) if f <= node < f + c)
        plans[owner].append((node - swarms[owner][2], args.burst_s * k / faults, kind, xid, attrs))
    return faults, mix_counts, plans


def _drive(
    parent: Any, nodes: int, swarms: list[tuple[Any, Any, int, int]], args: argparse.Namespace
) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any], list[dict[str, Any]], int, dict[str, int]]:
    """Wait for the agents, measure a window with the fault burst in its middle, stop everything.

    Returns (status before, status after, the controller's final report, the swarms' reports, faults,
    faults per kind).
    """
    arrivals_s = nodes / args.connect_rate if args.connect_rate > 0 else 0.0
    deadline = time.monotonic() + arrivals_s + args.connect_timeout_s
    while time.monotonic() < deadline:
        if _ask(parent, "status")["sessions"] >= nodes:
            break
        time.sleep(0.5)
    time.sleep(args.warmup_s)
    if args.heap_census:
        print(f"{nodes} nodes, heap census after warm-up:\n{_ask(parent, 'census', timeout_s=300)}", flush=True)
    before = _ask(parent, "status")
    faults, mix_counts, plans = _plan_burst(nodes, swarms, args)
    time.sleep(args.measure_s / 3)
    for (_p, conn, _f, _c), plan in zip(swarms, plans, strict=True):
        _ask(conn, ("burst", plan))
    time.sleep(args.measure_s * 2 / 3)
    after = _ask(parent, "status")
    time.sleep(args.drain_s)
    agent_stats = [_ask(conn, "stop", timeout_s=120) for _p, conn, _f, _c in swarms]
    final = _ask(parent, "stop", timeout_s=120)
    return before, after, final, agent_stats, faults, mix_counts


NODE_KINDS = ("quarantine_node", "reboot_node")
"""The node-level repairs the disruption budget admits (an Xid 79 asks for both)."""


def disruption(db_url: str, nodes: int) -> dict[str, Any]:
    """The run's store on the disruption budget: node repairs asked, sent and still waiting; most nodes out at once.

    Read from the controller's own records after it stopped: the outbox (a node repair still pending
    was never admitted) and the node quarantines with their releases (nodes out of service at once,
    against the default policy's cluster cap, min(8, 5 % of the fleet)).
    """
    from rasd.controller.core.remediation import policy
    from rasd.controller.store import remediation as rstore
    from rasd.controller.store import repo

    store = repo.Store.open(db_url)
    try:
        records = rstore.RemediationStore(store.engine)
        commands = [c for c in records.commands() if c.kind in NODE_KINDS]
        quarantines = [q for q in records.quarantines(active_only=False) if not q["gpu_uuid"] and not q["port"]]
    finally:
        store.close()
    edges = sorted(
        [(q["since_unix_ns"], 1) for q in quarantines]
        + [(q["released_unix_ns"], -1) for q in quarantines if q["released_unix_ns"] is not None]
    )
    out = most_out = 0
    for _at_ns, step in edges:
        out += step
        most_out = max(most_out, out)
    limits = policy.DisruptionPolicy()
    return {
        "node_repairs": len({c.node_id for c in commands}),
        "node_repairs_sent": len({c.node_id for c in commands if c.status != "pending"}),
        "node_repairs_waiting": len({c.node_id for c in commands if c.status == "pending"}),
        "most_nodes_out": most_out,
        "cluster_cap": min(limits.max_disrupted_nodes, max(1, int(limits.max_disrupted_nodes_pct * nodes / 100))),
    }


def run_size(nodes: int, args: argparse.Namespace, work: pathlib.Path) -> dict[str, Any]:
    """Measure one fleet size; returns its row."""
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe()
    profile = str(args.profile.with_suffix(f".{nodes}.pstats")) if args.profile else ""
    db = work / f"scale-{nodes}.db"
    controller = ctx.Process(
        target=controller_process,
        args=(
            child,
            str(db),
            profile,
            args.controller_cpu,
            args.commit_writer,
            args.heap_census,
        ),
        daemon=True,
    )
    controller.start()
    tag, port = parent.recv()
    assert tag == "ready"
    swarms = _start_swarms(ctx, f"127.0.0.1:{port}", nodes, args)
    try:
        before, after, final, agent_stats, faults, mix_counts = _drive(parent, nodes, swarms, args)
    finally:
        for p, *_ in swarms:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
        controller.join(timeout=30)
        if controller.is_alive():
            controller.kill()
    row = _row(nodes, before, after, final, agent_stats, faults, mix_counts)
    return {**row, **disruption(f"sqlite:///{db}", nodes)}


def _row(
    nodes: int,
    before: dict[str, Any],
    after: dict[str, Any],
    final: dict[str, Any],
    agent_stats: list[dict[str, Any]],
    faults: int,
    mix_counts: dict[str, int],
) -> dict[str, Any]:
    """One fleet size's figures from the controller's and the swarms' reports."""
    window_s = (after["at_ns"] - before["at_ns"]) / 1e9
    started = min(s["started_ns"] for s in agent_stats)
    firsts = [t for s in agent_stats for t in s["first_connected_ns"]]
    latency = final["decision_latency_s"]
    e2e = [x for s in agent_stats for x in s["e2e_latency_s"]]
    return {
        "nodes": nodes,
        "gpus": nodes * GPUS_PER_NODE,
        "agents_connected": after["sessions"],
        "all_connected_s": (max(firsts) - started) / 1e9 if firsts and all(firsts) else float("nan"),
        "never_connected": sum(1 for t in firsts if not t),
        "connect_failures": sum(s["connect_failures"] for s in agent_stats),
        "window_s": window_s,
        "samples_per_s": (after["samples"] - before["samples"]) / window_s,
        "samples_offered_per_s": nodes * GPUS_PER_NODE * 1000 / 100,
        "cpu_s_window": after["cpu_s"] - before["cpu_s"],
        "cpu_s_total": final["cpu_s"],
        "peak_rss_mib": final["peak_rss_mib"],
        "faults": faults,
        "mix": mix_counts,
        "events_decided": final["events_decided"],
        "decisions": len(latency),
        "decision_p50_ms": _pct(latency, 50) * 1000,
        "decision_p99_ms": _pct(latency, 99) * 1000,
        "slowest": sorted(zip(latency, final["decision_latency_kinds"], strict=True), reverse=True)[:5],
        "commit_p99_ms": _pct(final["commit_s"], 99) * 1000,
        "policy_held": len(final["policy_held_s"]),
        "policy_held_max_ms": max(final["policy_held_s"], default=float("nan")) * 1000,
        "e2e_n": len(e2e),
        "e2e_p50_ms": _pct(e2e, 50) * 1000,
        "e2e_p99_ms": _pct(e2e, 99) * 1000,
        "actions": final["actions_by_kind"],
        "unacked_events": sum(s["unacked"] for s in agent_stats),
        "agent_cpu_s": sum(s["cpu_s"] for s in agent_stats),
        "flush_busy_pct": 100 * (after["flush_s"] - before["flush_s"]) / window_s,
        "flush_mean_s": (after["flush_s"] - before["flush_s"]) / max(1.0, after["flushes"] - before["flushes"]),
        "persist_mean_ms": 1000
        * (after["persist_s"] - before["persist_s"])
        / max(1.0, after["persists"] - before["persists"]),
        "gc_pause_s": after["gc_pause_s"] - before["gc_pause_s"],
        "gc_long_pauses": after["gc_long_pauses"] - before["gc_long_pauses"],
        "gc_long_by_generation": {
            key[-1]: after[key] - before.get(key, 0.0)
            for key in sorted(after)
            if key.startswith("gc_long_pauses_gen") and after[key] - before.get(key, 0.0)
        },
    }


GC_LONG_PAUSE_S = "0.1"
"""A garbage-collector pause longer than this (a bucket bound of ``rasd_gc_pause_seconds``) is counted as long."""


def _gc_pauses(histogram: Any) -> dict[str, float]:
    """The controller's garbage-collector pauses so far: their total seconds, and how many were long by generation.

    Read from ``rasd_gc_pause_seconds`` alone, not through the registry's every collector.
    """
    pauses: dict[str, float] = {"gc_pause_s": 0.0, "gc_long_pauses": 0.0}
    for metric in histogram.collect():
        for sample in metric.samples:
            long_key = f"gc_long_pauses_gen{sample.labels.get('generation')}"
            if sample.name.endswith("_sum"):
                pauses["gc_pause_s"] += sample.value
            elif sample.name.endswith("_count"):
                pauses["gc_long_pauses"] += sample.value
                pauses[long_key] = pauses.get(long_key, 0.0) + sample.value
            elif sample.name.endswith("_bucket") and sample.labels.get("le") == GC_LONG_PAUSE_S:
                pauses["gc_long_pauses"] -= sample.value
                pauses[long_key] = pauses.get(long_key, 0.0) - sample.value
    return pauses


def _fmt(value: float, digits: int = 1) -> str:
    return "–" if value != value else f"{value:,.{digits}f}"


def render(rows: list[dict[str, Any]], args: argparse.Namespace, machine: str, when: str) -> str:
    """The RESULTS.md section."""
    lines = [
        SECTION,
        "",
        f"Command: `.venv/bin/python bench/scale.py --sizes {','.join(str(r['nodes']) for r in rows)} "
        f"--measure-s {args.measure_s:g} --agent-procs {args.agent_procs} --connect-rate {args.connect_rate:g} "
        f"--connect-timeout-s {args.connect_timeout_s:g}"
        + (f" --controller-cpu {args.controller_cpu}" if args.controller_cpu is not None else "")
        + (f" --agents-cpu {args.agents_cpu}" if args.agents_cpu is not None else "")
        + f" --commit-writer {args.commit_writer}`  ",
        f"Machine: {machine}  ",
        f"Run: {when}; per size a fresh controller process (SQLite WAL store, remediation on, default policy, "
        f"JSON logs at info to /dev/null, the ladder's commits in a {args.commit_writer}) and {args.agent_procs} "
        "agent processes of `rasd.sim.swarm` agents (each its own gRPC channel, TCP connection and stream; "
        "in-memory spool; commands answered at once). "
        + (
            f"The controller (and its commit writer) pinned to CPU {args.controller_cpu}, the agents to CPU "
            f"{args.agents_cpu}. "
            if args.controller_cpu is not None
            else "The agents share the machine's cores with the controller. "
        )
        + "Every node sends what a real agent sends at the default rates: one telemetry summary a second "
        "(each GPU's draw over its 10 Hz samples and its limit, the node's 10 Hz summed draw, whole counters "
        "on change or every heartbeat); samples/s counts the 10 Hz samples the summaries stand for. "
        + (
            f"Agents start at {args.connect_rate:g} per second (all connected = first start → last Welcome); "
            if args.connect_rate > 0
            else "All agents start at once (all connected = start → last Welcome); "
        )
        + f"then {args.warmup_s:g} s warm-up and a {args.measure_s:g} s window with a fault burst "
        f"(max(16, nodes/16) faults over {args.burst_s:g} s, one per node) at a third of it.",
        "",
        "| nodes | GPUs | agents connected | all connected s | samples/s ingested (offered) | "
        "event→dispatch p50 ms | p99 ms | actions timed | event→command at agent p50 ms | p99 ms | "
        "controller CPU s in window | CPU % of one core | peak RSS MiB | MB per node |",
        "|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['nodes']:,} | {r['gpus']:,} | {r['agents_connected']:,} | {_fmt(r['all_connected_s'])} | "
            f"{r['samples_per_s']:,.0f} ({r['samples_offered_per_s']:,.0f}) | {_fmt(r['decision_p50_ms'])} | "
            f"{_fmt(r['decision_p99_ms'])} | {r['decisions']} ({r['faults']} faults) | {_fmt(r['e2e_p50_ms'])} | "
            f"{_fmt(r['e2e_p99_ms'])} | {r['cpu_s_window']:.1f} of {r['window_s']:.0f} s | "
            f"{100 * r['cpu_s_window'] / r['window_s']:.0f} | {r['peak_rss_mib']:,.0f} | "
            f"{r['peak_rss_mib'] * 1.048576 / r['nodes']:.3f} |"
        )
    lines.append("")
    for r in rows:
        mix = ", ".join(f"{k} {v}" for k, v in sorted(r["mix"].items()))
        actions = ", ".join(f"{k} {v}" for k, v in sorted(r["actions"].items())) or "none"
        lines.append(
            f"- {r['nodes']:,} nodes: faults {mix}; dispatched {actions}; events decided {r['events_decided']}; "
            f"events unacked at the end {r['unacked_events']}; agents never connected {r['never_connected']}, "
            f"connect failures {r['connect_failures']}; controller CPU {r['cpu_s_total']:.1f} s over its whole life "
            f"(connect storm included); agent processes CPU {r['agent_cpu_s']:.1f} s; flushing the latest "
            f"telemetry took {r['flush_busy_pct']:.0f} % of the window (mean flush {r['flush_mean_s']:.2f} s, in "
            "chunks between the store thread's other calls); health-event batch receive → ack mean "
            f"{r['persist_mean_ms']:.0f} ms; garbage-collector pauses {r['gc_pause_s']:.2f} s in the window, "
            f"{r['gc_long_pauses']:.0f} over {float(GC_LONG_PAUSE_S) * 1000:.0f} ms"
            + "".join(f", generation {g}: {n:.0f}" for g, n in r["gc_long_by_generation"].items())
            + "; "
            f"node repairs (quarantine and reboot): {r['node_repairs']} nodes, sent {r['node_repairs_sent']}, "
            f"still waiting at the end {r['node_repairs_waiting']}, most nodes out of service at once "
            f"{r['most_nodes_out']} (cluster cap {r['cluster_cap']}); actions of events the blast-radius policy "
            f"held back (not in event → dispatch) {r['policy_held']}, the longest "
            f"{_fmt(r['policy_held_max_ms'], 0)} ms; "
            f"remediation commit p99 {_fmt(r['commit_p99_ms'])} ms; slowest event → dispatch "
            + ", ".join(f"{1000 * s:,.0f} ms ({kind})" for s, kind in r["slowest"])
            + "."
        )
    return "\n".join([*lines, "", *_goals(max(rows, key=lambda r: r["nodes"]), args), ""])


def _goals(worst: dict[str, Any], args: argparse.Namespace) -> list[str]:
    """The Goal lines, from the largest fleet's row."""
    one_core = 100 * worst["cpu_s_window"] / worst["window_s"]
    kept = worst["samples_per_s"] / worst["samples_offered_per_s"]
    checks = {
        f"all connected ≤ {GOAL_CONNECTED_S:g} s": worst["all_connected_s"] <= GOAL_CONNECTED_S,
        "no telemetry dropped": kept >= 0.99 and worst["agents_connected"] == worst["nodes"],
        "CPU ≤ 100 % of one core": one_core <= 100,
        f"event → dispatch p99 ≤ {GOAL_P99_MS:g} ms": worst["decision_p99_ms"] <= GOAL_P99_MS,
    }
    missed = [name for name, ok in checks.items() if not ok]
    met = worst["nodes"] >= 2048 and not missed and args.controller_cpu is not None
    mb_per_node = worst["peak_rss_mib"] * 1.048576 / worst["nodes"]
    return [
        f"Goal: one core carries 2,048 nodes × 8 GPUs ({', '.join(checks)}): " + ("met" if met else "NOT met")
        + f" ({worst['nodes']:,} nodes: all connected in {_fmt(worst['all_connected_s'])} s, "
        f"{worst['samples_per_s']:,.0f} of {worst['samples_offered_per_s']:,.0f} samples/s, CPU {one_core:.0f} % of "
        f"one core, event → dispatch p99 {_fmt(worst['decision_p99_ms'])} ms"
        + (f"; missed: {', '.join(missed)}" if missed else "") + ").",
        "",
        f"Goal: controller memory ≤ {GOAL_MB_PER_NODE:g} MB per node at 2,048 nodes: "
        + ("met" if worst["nodes"] >= 2048 and mb_per_node <= GOAL_MB_PER_NODE else "NOT met")
        + f" ({mb_per_node:.3f} MB per node: peak RSS {worst['peak_rss_mib']:,.0f} MiB at {worst['nodes']:,} nodes).",
    ]  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    """Run every size and write the section."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="256,1024,2048", help="node counts, comma-separated")
    parser.add_argument("--measure-s", type=float, default=30.0)
    parser.add_argument("--warmup-s", type=float, default=5.0)
    parser.add_argument("--burst-s", type=float, default=5.0)
    parser.add_argument("--drain-s", type=float, default=3.0)
    parser.add_argument(
        "--connect-rate", type=float, default=25.0, help="agents starting per second (0: all at once, a storm)"
    )
    parser.add_argument(
        "--connect-timeout-s", type=float, default=120.0, help="how long after the last start to wait for all"
    )
    parser.add_argument("--agent-procs", type=int, default=2)
    parser.add_argument("--controller-cpu", type=int, help="pin the controller to this CPU (as `taskset -c N`)")
    parser.add_argument(
        "--commit-writer",
        choices=("process", "thread"),
        default="process",
        help="where the ladder commits (rasd-controller's default: a writer process, pinned with the controller)",
    )
    parser.add_argument("--agents-cpu", type=int, help="pin every agent process to this CPU")
    parser.add_argument("--seed", type=int, default=9)
    parser.add_argument("--no-write", action="store_true", help="print the section, leave RESULTS.md alone")
    parser.add_argument(
        "--profile", type=pathlib.Path, help="cProfile the controller's event loop to PROFILE.<nodes>.pstats (slower)"
    )
    parser.add_argument(
        "--heap-census",
        choices=("objects", "bytes"),
        help="print after warm-up what the controller's collector walks (objects), and with bytes where the "
        "traced bytes are (tracemalloc: far slower, a storm of 2,048 connects does not finish; figures not "
        "comparable)",
    )
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    machine = results.machine(f"agent processes {args.agent_procs}")
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    rows = []
    with tempfile.TemporaryDirectory(prefix="rasd-scale-") as scratch:
        for nodes in sizes:
            started = time.monotonic()
            row = run_size(nodes, args, pathlib.Path(scratch))
            rows.append(row)
            print(
                f"{nodes} nodes: connected {row['agents_connected']} in {_fmt(row['all_connected_s'])} s, "
                f"{row['samples_per_s']:,.0f} samples/s, decision p50/p99 {_fmt(row['decision_p50_ms'])}/"
                f"{_fmt(row['decision_p99_ms'])} ms ({row['decisions']}), CPU {row['cpu_s_window']:.1f} s "
                f"in {row['window_s']:.0f} s, RSS {row['peak_rss_mib']:.0f} MiB ({time.monotonic() - started:.0f} s)",
                flush=True,
            )
    text = render(rows, args, machine, when)
    print(text)
    if not args.no_write:
        results.write_section(SECTION, text)
        print(f"wrote the {SECTION!r} section of {results.RESULTS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
