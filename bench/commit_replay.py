"""The remediation commits of one PostgreSQL burst, replayed with and without pipelined writes.

Run: .venv/bin/python bench/commit_replay.py [--rounds 4] [--no-write]   (needs RASD_TEST_POSTGRES_URL)

Why: a decision's commit is about ten statements. Sent one after another, each waits a round trip
and its turn on the server; `repo.pipelined` sends the writes at once (psycopg's pipeline mode)
and reads their answers at the end. In the full burst (`bench/remediation.py`) that gain is one
term among many, under the noise of a shared 2-core machine and its disk's fsync stalls; here the
commit path is measured alone, on identical input, both ways in alternation.

How: one burst of `bench/remediation.py` (2,000 nodes, 2,000 events/s for 5 s, commits on the store
thread) runs on PostgreSQL while every `RemediationStore.commit` it makes is recorded (pickled as
called). Each round then replays those commits, in order, into two fresh schemas, one with
`repo.PIPELINE_WRITES` on and one with it off (which goes first alternates), timing each commit
(wall, from the call to the end of its COMMIT) and the client's CPU. Nothing else runs meanwhile:
this is the commit writer's own cost, the server on the same machine. Results go to the
"## Store commit replay" section of bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import pickle
import statistics
import sys
import time

import remediation as burst_bench
import results

from rasd.controller.store import remediation as rstore
from rasd.controller.store import repo

SECTION = "## Store commit replay"
BURST_NODES = 2000
"""`bench/remediation.py`'s default fleet, which the recorded burst runs on."""


def capture_burst() -> list[bytes]:
    """The commits one PostgreSQL burst makes, each pickled when it is called."""
    recorded: list[bytes] = []
    commit = rstore.RemediationStore.commit

    def recording(self: rstore.RemediationStore, change: rstore.Commit) -> list[str]:
        recorded.append(pickle.dumps(change, protocol=pickle.HIGHEST_PROTOCOL))
        return commit(self, change)

    rstore.RemediationStore.commit = recording  # type: ignore[method-assign]
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            argv = ["--backend", "postgresql", "--commit-writer", "thread", "--repeat", "1", "--no-write"]
            argv += ["--nodes", str(BURST_NODES)]
            burst_bench.main([*argv, "--throughput-s", "0.2"])
    finally:
        rstore.RemediationStore.commit = commit  # type: ignore[method-assign]
    return recorded


def replay(recorded: list[bytes], *, pipelined: bool) -> dict[str, float]:
    """Commit the recorded changes in order into a fresh schema; wall and CPU seconds, per-commit ms."""
    repo.PIPELINE_WRITES = pipelined
    try:
        with burst_bench.database("postgresql", "") as url:
            store = repo.Store.open(url)
            try:
                # The burst's nodes, as its store had them: its commits store the events they decide.
                now = time.time_ns()
                store.register_hellos([(burst_bench.hello(i), now) for i in range(BURST_NODES)])
                writer = rstore.RemediationStore(store.engine)
                writer.warm_up()
                changes = [pickle.loads(data) for data in recorded]
                took: list[float] = []
                cpu_started, started = time.process_time(), time.perf_counter()
                for change in changes:
                    at = time.perf_counter()
                    writer.commit(change)
                    took.append(time.perf_counter() - at)
                wall_s, cpu_s = time.perf_counter() - started, time.process_time() - cpu_started
            finally:
                store.close()
    finally:
        repo.PIPELINE_WRITES = True
    took_ms = [s * 1e3 for s in took]
    return {
        "wall_s": wall_s,
        "cpu_s": cpu_s,
        **{f"p{q}": burst_bench._pct(took_ms, q) for q in (50, 90, 99)},
        "max": max(took_ms),
    }


def main(argv: list[str] | None = None) -> int:
    """Record one burst's commits, replay them both ways per round, print and write the section."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4, help="replays each way, alternating which goes first")
    parser.add_argument("--no-write", action="store_true", help="print only; leave RESULTS.md alone")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error(f"--rounds must be at least 1, got {args.rounds}")
    if not os.environ.get("RASD_TEST_POSTGRES_URL"):
        parser.error("RASD_TEST_POSTGRES_URL is unset (.ci/postgres.sh starts a PostgreSQL and prints it)")
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    header = results.machine()
    recorded = capture_burst()
    changes = [pickle.loads(data) for data in recorded]
    commands = sum(len(change.new_commands) for change in changes)
    states = sum(len(change.node_states) for change in changes)
    print(f"recorded {len(recorded)} commits ({commands} new commands, {states} ladder states)", file=sys.stderr)
    rows, ratios = [], []
    for round_ in range(1, args.rounds + 1):
        order = (True, False) if round_ % 2 else (False, True)
        got = {mode: replay(recorded, pipelined=mode) for mode in order}
        on, off = got[True], got[False]
        ratios.append(on["wall_s"] / off["wall_s"])
        for mode in order:
            r = got[mode]
            rows.append(
                f"| {round_} | {'pipelined' if mode else 'one by one'} | {r['wall_s']:.2f} | {r['cpu_s']:.2f} | "
                f"{r['p50']:.1f} | {r['p90']:.1f} | {r['p99']:.1f} | {r['max']:.1f} |"
            )
        print(f"round {round_}: pipelined {on['wall_s']:.2f} s, one by one {off['wall_s']:.2f} s", file=sys.stderr)
    text = "\n".join(
        [
            SECTION,
            "",
            f"Command: `.venv/bin/python bench/commit_replay.py {' '.join(sys.argv[1:] if argv is None else argv)}`  ",
            f"Machine: {header}  ",
            f"Run: {started}; the {len(recorded):,} commits ({commands:,} new commands, {states:,} ladder states) "
            "of one `bench/remediation.py` PostgreSQL burst (2,000 nodes, 2,000 events/s for 5 s, commits on the "
            "store thread), "
            "replayed in order into fresh schemas (its nodes registered first: the commits store their events), "
            "with `repo.pipelined` on and off (alternating which goes first). "
            "Wall: all the commits; CPU: the client's; per commit: call to end of COMMIT. The server runs on the same "
            "2-core machine and its WAL flush is in every commit (the disk's fsync stalls show in max).",
            "",
            "| round | writes | wall s | client CPU s | commit p50 ms | p90 ms | p99 ms | max ms |",
            "|---:|---|---:|---:|---:|---:|---:|---:|",
            *rows,
            "",
            f"Wall ratio (pipelined / one by one): median {statistics.median(ratios):.2f}, range {min(ratios):.2f} to "
            f"{max(ratios):.2f}; pipelined faster in {sum(1 for r in ratios if r < 1)} of {len(ratios)} rounds.",
            "",
            "",
        ]
    )
    print(text)
    if not args.no_write:
        results.write_section(SECTION, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
