"""What a replica's courier pays to find the relayed commands of its own streams during a cap wave.

Run: .venv/bin/python bench/relay_read.py [--nodes 12500] [--replicas 6] [--no-write]
     (RASD_TEST_POSTGRES_URL set: PostgreSQL too; .ci/postgres.sh starts one)

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
of one replica's nodes (every --replicas-th node: `relayed_commands(now, node_ids)`). Results go to
the "## Relayed command reads" section of bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable

import results
import sqlalchemy as sa
from sqlalchemy.orm import sessionmaker

from rasd.controller.store import relay as relay_store
from rasd.controller.store import repo, schema

SECTION = "## Relayed command reads"
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
        f"Command: `.venv/bin/python bench/relay_read.py --nodes {args.nodes} --replicas {args.replicas}`"
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


def main(argv: list[str] | None = None) -> int:
    """Measure on SQLite (and PostgreSQL if its URL is set); write the section (unless --no-write)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=12_500, help="live relayed rows, one per node (12,500)")
    parser.add_argument("--replicas", type=int, default=6, help="replicas sharing the nodes (6)")
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
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
