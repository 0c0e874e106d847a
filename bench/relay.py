"""The relay between replicas at fleet scale: a courier's read of its relayed commands, the leader's stored results.

Run: .venv/bin/python bench/relay.py [--nodes 12500] [--replicas 6] [--results 1000] [--no-write]
     (RASD_TEST_POSTGRES_URL set: PostgreSQL too, and the results part, which needs it; .ci/postgres.sh starts one)

Two parts, two sections of bench/RESULTS.md.

**Relayed command reads** ("## Relayed command reads").

Why: every `relay_poll_s` (0.5 s) each replica's courier (`replication.relay.Courier.deliver_pending`)
reads the live rows of `relayed_commands` to send those of its own streams. A power period relays
one SetPowerCap per node held elsewhere, so in a wave at 12,500 nodes the table holds about 12,500
rows until they are answered. The courier read every one of them, each as an ORM object, on every
replica, and kept the sixth that was its own. `RelayStore.relayed_commands(now, node_ids)` now reads
only the rows of the nodes named, as plain rows.

How: a fresh store (SQLite file; PostgreSQL's test database too when its URL is set) with --nodes
relayed rows (one per node, a 420-byte command each: a SetPowerCap of 8 GPUs), then each read seven
times, its median CPU time: the read as it was before (every live row, ORM objects; the query is
kept here for the comparison), today's read of every row (`relayed_commands(now)`), and today's read
of one replica's nodes (every --replicas-th node: `relayed_commands(now, node_ids)`).

**Stored results applied by the leader** ("## Relayed results applied by the leader"). An agent's
answer to a ladder command arrives on the replica that holds its stream, which stores it; the
leader's intake (`replication.relay.Relay.take_in`) applies the stored results to its ladder. It
committed each in a transaction of its own and withdrew each in another; it now applies
`RESULTS_PER_COMMIT` (512) to a transaction. How: two replicas wired as rasd-controller wires them
(lease election) on a fresh PostgreSQL schema; the leader decides an Xid 13 on each of --results
nodes (a restart each), the other replica stores each restart's answer, then the leader's intake
runs until nothing is left; its wall time, with groups of 1 (the behaviour before) and of 512,
alternated twice.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable

import results
import sqlalchemy as sa
from prometheus_client import CollectorRegistry
from sqlalchemy.orm import sessionmaker

from rasd.api.v1 import commands_pb2 as commands_pb
from rasd.controller import wiring
from rasd.controller.core import fleet
from rasd.controller.core.remediation import events as health
from rasd.controller.ingest import service as ingest_mod
from rasd.controller.observability import metrics
from rasd.controller.replication import leader
from rasd.controller.replication import relay as relay_mod
from rasd.controller.store import relay as relay_store
from rasd.controller.store import repo, schema

SECTION = "## Relayed command reads"
RESULTS_SECTION = "## Relayed results applied by the leader"
RESULTS_GOAL_RATIO = 5.0
"""The grouped intake must apply stored results at least this many times faster than one a transaction."""
COMMAND_BYTES = 420
TRIES = 7
GOAL_RATIO = 1 / 3


def _read_before(engine: sa.Engine, now_ns: int) -> list[tuple[str, str, bytes]]:
    """The courier's read before: every live row as an ORM object, oldest first."""
    table = schema.RelayedCommandRow
    with sessionmaker(engine)() as session:
        rows = session.scalars(sa.select(table).where(table.expires_unix_ns > now_ns).order_by(table.created_unix_ns))
        return [(r.command_id, r.node_id, r.command) for r in rows]


def _median_cpu_ms(read: Callable[[], list]) -> tuple[float, int]:
    read()  # warm: the first read pays for the query's compilation
    times, count = [], 0
    for _ in range(TRIES):
        started = time.process_time()
        count = len(read())
        times.append(time.process_time() - started)
    return statistics.median(times) * 1000, count


def measure(url: str, nodes: int, replicas: int) -> dict[str, tuple[float, int]]:
    """The three reads' median CPU ms and rows, on a store at url whose relayed rows this run owns."""
    store = repo.Store.open(url)
    records = relay_store.RelayStore(store.engine)
    table = schema.RelayedCommandRow.__table__
    with store.engine.begin() as connection:
        connection.execute(sa.delete(table))
    now = time.time_ns()
    rows = [(f"cap-{i}", f"node-{i:05d}", b"x" * COMMAND_BYTES, "ctl-a", now + i, now + 10**11) for i in range(nodes)]
    for first in range(0, nodes, 512):
        records.relay_commands(rows[first : first + 512])
    mine = [f"node-{i:05d}" for i in range(0, nodes, replicas)]
    try:
        return {
            "before: every row, ORM objects": _median_cpu_ms(lambda: _read_before(store.engine, now)),
            "now: every row": _median_cpu_ms(lambda: records.relayed_commands(now)),
            "now: one replica's nodes": _median_cpu_ms(lambda: records.relayed_commands(now, mine)),
        }
    finally:
        with store.engine.begin() as connection:
            connection.execute(sa.delete(table))
        store.close()


def section(by_backend: dict[str, dict[str, tuple[float, int]]], args: argparse.Namespace) -> tuple[str, bool]:
    """The RESULTS.md section, and whether the goal is met on every backend."""
    lines = [
        SECTION,
        "",
        f"Command: `.venv/bin/python bench/relay.py --nodes {args.nodes} --replicas {args.replicas}`"
        + (" (RASD_TEST_POSTGRES_URL set)" if "postgresql" in by_backend else "")
        + "  ",
        f"Machine: {results.machine()}  ",
        f"Run: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {args.nodes:,} live relayed rows (one "
        f"SetPowerCap of {COMMAND_BYTES} bytes per node), one replica's nodes every {args.replicas}th; median CPU "
        f"of {TRIES} reads, this process's (PostgreSQL's own is not counted).",
        "",
        "| backend | read | rows | CPU ms | of before |",
        "|---|---|---:|---:|---:|",
    ]
    ratios = []
    for backend, reads in by_backend.items():
        before_ms = reads["before: every row, ORM objects"][0]
        for name, (cpu_ms, count) in reads.items():
            lines.append(f"| {backend} | {name} | {count:,} | {cpu_ms:.1f} | {cpu_ms / before_ms:.2f} |")
        ratios.append(reads["now: one replica's nodes"][0] / before_ms)
    met = all(ratio <= GOAL_RATIO for ratio in ratios)
    lines += [
        "",
        f"Goal: a replica's read of its own relayed commands in a {args.nodes:,}-node cap wave costs ≤ 1/3 of the "
        f"read before, on every backend (here {', '.join(f'{r:.2f}' for r in ratios)}): {'met' if met else 'NOT met'}",
        "",
    ]
    return "\n".join(lines), met


@dataclasses.dataclass
class _Replica:
    store: repo.Store
    leadership: leader.Leadership
    wired: wiring.Wired


def _replica(url: str, name: str) -> _Replica:
    """A replica wired as rasd-controller wires one under lease election (the relay owns the term callbacks)."""
    store = repo.Store.open(url)
    leadership = leader.Leadership(
        store.engine, leader.LeaderSettings(replica_id=name, lease_s=10.0, renew_s=0.5), election="lease"
    )
    wired = wiring.replicated(
        store, metrics.ControllerMetrics(CollectorRegistry()), leadership,
        ladder=wiring.Ladder(fence=leadership.fence),
        settings=ingest_mod.IngestSettings(mark_all_disconnected_at_start=False), poll_s=3600.0,
    )  # fmt: skip
    return _Replica(store, leadership, wired)


def _xid13(node_id: str, gpu_uuid: str) -> repo.StoredEvent:
    at_ns = time.time_ns()
    return repo.StoredEvent(
        node_id=node_id, seq=1, observed_unix_ns=at_ns - 10**6, received_unix_ns=at_ns,
        kind=int(health.EventKind.XID), severity=int(health.Severity.ERROR), gpu_uuid=gpu_uuid, xid=13,
        message="NVRM: Xid (PCI:0000:18:00): 13, Graphics Exception", source="kmsg", attributes={},
    )  # fmt: skip


def apply_results(server_url: str, count: int, group: int) -> tuple[int, float]:
    """Stored results applied by the leader's intake with groups of group: (applied, wall s), on a fresh schema."""
    schema_name = f"rasd_bench_{os.getpid()}_{time.time_ns()}"
    admin = sa.create_engine(server_url, poolclass=sa.pool.NullPool)
    with admin.begin() as connection:
        connection.execute(sa.text(f'CREATE SCHEMA "{schema_name}"'))
    url = sa.make_url(server_url).update_query_dict({"options": f"-csearch_path={schema_name}"})
    leader_side, holder = _replica(url.render_as_string(hide_password=False), "ctl-a"), None
    relay_mod.RESULTS_PER_COMMIT, before = group, relay_mod.RESULTS_PER_COMMIT
    try:
        holder = _replica(url.render_as_string(hide_password=False), "ctl-b")
        nodes = [f"node-{n:05d}" for n in range(count)]
        leader_side.store.register_hellos([
            (fleet.NodeHello(n, "boot", "bench", n, "simulated", {"rack": f"r{i % 64}"},
                             (fleet.GpuRecord(f"GPU-{n}", "H100", "0000:18:00.0", 200, 700, 700, node_id=n),), 0), 1)
            for i, n in enumerate(nodes)
        ])  # fmt: skip

        async def scenario() -> tuple[int, float]:
            await leader_side.wired.ingest.start()
            await leader_side.leadership.start()
            try:
                ladder = leader_side.wired.remediation
                await asyncio.gather(*(ladder.on_events(n, [_xid13(n, f"GPU-{n}")], {}) for n in nodes))
                stored = holder.wired.relay.store
                for command in ladder.store.commands(statuses=("dispatched",), limit=None):
                    answer = commands_pb.ActionResult(
                        command_id=command.command_id, outcome=commands_pb.ACTION_OUTCOME_SUCCEEDED
                    )
                    stored.save_result(
                        command_id=command.command_id, node_id=command.node_id, result=answer.SerializeToString(),
                        replica_id="ctl-b", now_unix_ns=time.time_ns(),
                    )  # fmt: skip
                started, applied = time.perf_counter(), 0
                while taken := (await leader_side.wired.relay.take_in())["results"]:
                    applied += taken
                return applied, time.perf_counter() - started
            finally:
                await leader_side.leadership.stop()
                await leader_side.wired.ingest.stop()

        return asyncio.run(scenario())
    finally:
        relay_mod.RESULTS_PER_COMMIT = before
        leader_side.store.close()
        if holder is not None:
            holder.store.close()
        with admin.begin() as connection:
            connection.execute(sa.text(f'DROP SCHEMA "{schema_name}" CASCADE'))
        admin.dispose()


def results_section(runs: list[tuple[int, int, float]], args: argparse.Namespace) -> tuple[str, bool]:
    """The results part's section: each run's group, results applied, wall s and rate; whether the goal is met."""
    rate = {1: [], relay_mod.RESULTS_PER_COMMIT: []}
    rows = []
    for group, applied, wall_s in runs:
        rate[group].append(applied / wall_s)
        rows.append(f"| {group} | {applied:,} | {wall_s:.2f} | {applied / wall_s:,.0f} |")
    ratio = statistics.median(rate[relay_mod.RESULTS_PER_COMMIT]) / statistics.median(rate[1])
    met = ratio >= RESULTS_GOAL_RATIO
    text = "\n".join([
        RESULTS_SECTION,
        "",
        f"Command: `RASD_TEST_POSTGRES_URL=... .venv/bin/python bench/relay.py --results {args.results}`  ",
        f"Machine: {results.machine()}  ",
        f"Run: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; two replicas (lease election) on a fresh "
        f"PostgreSQL schema; the leader decided an Xid 13 on each of {args.results:,} nodes, the other replica "
        "stored each restart's answer, the leader's intake ran until none was left. Groups of 1 are the behaviour "
        "before (a transaction and a withdrawal a result); the runs alternate.",
        "",
        "| results a transaction | applied | wall s | results/s |",
        "|---:|---:|---:|---:|",
        *rows,
        "",
        f"Goal: the leader applies stored results ≥ {RESULTS_GOAL_RATIO:g}× faster than one a transaction "
        f"(median {ratio:.1f}×): {'met' if met else 'NOT met'}",
        "",
    ])  # fmt: skip
    return text, met


def main(argv: list[str] | None = None) -> int:
    """Measure on SQLite (and PostgreSQL if its URL is set); write the section (unless --no-write)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=12_500, help="live relayed rows, one per node (12,500)")
    parser.add_argument("--replicas", type=int, default=6, help="replicas sharing the nodes (6)")
    parser.add_argument("--results", type=int, default=1_000, help="stored results the leader applies (1,000)")
    parser.add_argument("--no-write", action="store_true", help="print the section; leave RESULTS.md alone")
    args = parser.parse_args(argv)
    by_backend = {}
    with tempfile.TemporaryDirectory(prefix="rasd-relay-") as folder:
        by_backend["sqlite"] = measure(f"sqlite:///{os.path.join(folder, 'rasd.db')}", args.nodes, args.replicas)
    if url := os.environ.get("RASD_TEST_POSTGRES_URL"):
        by_backend["postgresql"] = measure(url, args.nodes, args.replicas)
    text, met = section(by_backend, args)
    print(text)
    if not args.no_write:
        results.write_section(SECTION, text)
    if url := os.environ.get("RASD_TEST_POSTGRES_URL"):
        runs = [(group, *apply_results(url, args.results, group)) for group in (1, relay_mod.RESULTS_PER_COMMIT) * 2]
        text, results_met = results_section(runs, args)
        print(text)
        if not args.no_write:
            results.write_section(RESULTS_SECTION, text)
        met = met and results_met
    else:
        print("RASD_TEST_POSTGRES_URL is unset: the leader's results part skipped (.ci/postgres.sh starts one)")
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
