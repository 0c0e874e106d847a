"""The SQLite store's WAL file size after a write-heavy run with readers, with and without truncation.

Run: .venv/bin/python bench/wal_size.py [--events 120000] [--no-write]

Why (issue #37 item 18): the controller's WAL grew to 373 MB and stayed so while it ran. Its
checkpointer's PASSIVE checkpoints copy the log into the database, but a reader that holds an old
snapshot (an operator's paged listing read beside the store thread) keeps them from catching up, so
the log grows during a burst; once they catch up the next commit writes the log from its start, and
the file keeps its largest size. `WalCheckpointer` now empties a file past `WAL_TRUNCATE_ABOVE_BYTES`
with a TRUNCATE checkpoint.

How: a `Store` on a fresh SQLite file (the controller's own checkpointer), 500 nodes registered,
then --events health events (1 KiB messages) appended in batches of 50 nodes x 4 events, while a
reader thread loops over a read transaction held 0.5 s each (a snapshot the checkpoints cannot pass).
Then the reader stops and the store idles `SETTLE_S`; the WAL file's size is read at the end of the
writes (peak) and after the settle. Run twice: with truncation as shipped and with it off (the
threshold set past any size, the behaviour before). Results go to the "## SQLite WAL size" section
of bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time

import results
import sqlalchemy as sa

from rasd.controller.core import fleet
from rasd.controller.store import repo

SECTION = "## SQLite WAL size"
NODES = 500
SETTLE_S = repo.WAL_TRUNCATE_EVERY_S + 2.0
"""Long enough for the checkpointer to try a truncation again after one that met the reader."""
WAL_TRUNCATE_ABOVE_BYTES = repo.WAL_TRUNCATE_ABOVE_BYTES
"""The shipped threshold (`run_once` sets the module's for its run and puts this back)."""


def _hello(node: int) -> fleet.NodeHello:
    return fleet.NodeHello(
        node_id=f"node-{node:04d}", boot_id="boot", agent_version="bench", hostname=f"host-{node}",
        backend="simulated", labels={}, gpus=(), spool_head_seq=0,
    )  # fmt: skip


def _event(node_id: str, seq: int) -> repo.StoredEvent:
    return repo.StoredEvent(
        node_id=node_id, seq=seq, observed_unix_ns=seq, received_unix_ns=seq, kind=1, severity=2, gpu_uuid="",
        xid=13, message="x" * 1024, source="kmsg", attributes={},
    )  # fmt: skip


def _hold_snapshots(engine: sa.Engine, stop: threading.Event) -> None:
    """Read in a transaction held 0.5 s at a time, as a slow paged listing does, until stop."""
    while not stop.is_set():
        with engine.connect() as connection, connection.begin():
            connection.exec_driver_sql("SELECT count(*) FROM health_events").scalar()
            stop.wait(0.5)


def run_once(events: int, truncate: bool) -> dict[str, float]:
    """One write-heavy run in a fresh directory; the WAL's sizes (MiB) and the write time."""
    repo.WAL_TRUNCATE_ABOVE_BYTES = WAL_TRUNCATE_ABOVE_BYTES if truncate else 1 << 62
    with tempfile.TemporaryDirectory(prefix="rasd-wal-") as folder:
        path = os.path.join(folder, "rasd.db")
        store = repo.Store.open(f"sqlite:///{path}")
        store.register_hellos([(_hello(node), 0) for node in range(NODES)])
        reader_engine = repo.create_engine(f"sqlite:///{path}")
        stop = threading.Event()
        reader = threading.Thread(target=_hold_snapshots, args=(reader_engine, stop), daemon=True)
        reader.start()
        started = time.perf_counter()
        seq = 0
        while seq * NODES < events:
            for first in range(0, NODES, 50):
                nodes = [f"node-{n:04d}" for n in range(first, first + 50)]
                store.append_events_many([(node, [_event(node, seq + k + 1) for k in range(4)]) for node in nodes])
            seq += 4
        write_s = time.perf_counter() - started
        peak = os.path.getsize(path + "-wal")
        stop.set()
        reader.join()
        reader_engine.dispose()
        time.sleep(SETTLE_S)
        settled = os.path.getsize(path + "-wal") if os.path.exists(path + "-wal") else 0
        store.close()
    repo.WAL_TRUNCATE_ABOVE_BYTES = WAL_TRUNCATE_ABOVE_BYTES
    return {"events": seq * NODES, "write_s": write_s, "peak_mib": peak / 2**20, "settled_mib": settled / 2**20}


def section(runs: list[tuple[str, dict[str, float]]], events: int) -> str:
    """The RESULTS.md section for these runs."""
    bound_mib = WAL_TRUNCATE_ABOVE_BYTES / 2**20
    rows = [
        f"| {name} | {run['events']:,.0f} | {run['write_s']:.1f} | {run['peak_mib']:.1f} | {run['settled_mib']:.1f} |"
        for name, run in runs
    ]
    by_name = dict(runs)
    met = by_name["truncation on (shipped)"]["settled_mib"] <= bound_mib
    return "\n".join(
        [
            SECTION,
            "",
            f"Command: `.venv/bin/python bench/wal_size.py --events {events}`  ",
            f"Machine: {results.machine()}  ",
            f"Run: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {NODES} nodes' health events (1 KiB "
            "messages) appended in batches of 200 while a reader holds a snapshot 0.5 s at a time; the WAL file "
            f"read when the writes end (peak) and after {SETTLE_S:.0f} s idle with the reader gone (settled). "
            f"Truncation off is the behaviour before: PASSIVE checkpoints only.",
            "",
            "| WAL | events | write s | peak MiB | settled MiB |",
            "|---|---:|---:|---:|---:|",
            *rows,
            "",
            f"Goal: the WAL file is back under {bound_mib:.0f} MiB (WAL_TRUNCATE_ABOVE_BYTES) while the store "
            f"runs: {'met' if met else 'NOT met'}",
            "",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    """Run both ways and write the section (unless --no-write)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=120_000, help="health events to append (default 120,000)")
    parser.add_argument("--no-write", action="store_true", help="print the section; leave RESULTS.md alone")
    args = parser.parse_args(argv)
    ways = [("truncation off (before)", False), ("truncation on (shipped)", True)]
    runs = [(name, run_once(args.events, truncate)) for name, truncate in ways]
    text = section(runs, args.events)
    print(text)
    if not args.no_write:
        results.write_section(SECTION, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
