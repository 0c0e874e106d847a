"""The remediation burst, this tree against an earlier commit, in alternating runs: is a change faster?

Run: .venv/bin/python bench/remediation_ab.py --base REV [--rounds 4] [--backend sqlite]
     [--commit-writer process] [--quarantine record] [--bench own|this] [--no-write]

Why: on these shared 2-core machines the burst p99 of one tree moves by 2× within minutes (other
tenants), so a figure from before a change and one from after it, taken an hour apart, say nothing.
Here each round runs the burst of `bench/remediation.py` once on the base commit and once on this
tree, back to back, so both meet the same machine; the ratio of each pair is the figure to read.

How: the base commit is checked out into a temporary git worktree and imported in place of this
tree (``PYTHONPATH`` names a directory whose ``rasd`` links to it). The generated protobuf modules
(``rasd.api``, build output that git ignores) come from this tree: the wire contract must be the
same for both sides. Each run is `bench/remediation.py --repeat 1 --no-write --throughput-s 0.5`
with the backend and commit writer given, from its own tree; the burst row's decision p50 and p99
are read from its output. Both sides run with the same ``--quarantine`` adapter; a base whose bench
has no such option (before 4ef3bc5) called no adapter, so then both sides run with
``--quarantine none``. With ``--bench this`` both sides run this tree's bench (the base's code
imported as above): for a base whose own bench cannot measure what this one does (an adapter).
Results go to the "## Remediation A/B" section of bench/RESULTS.md (with the adapter named in the
section's title when it is not ``record``).
"""

from __future__ import annotations

import argparse
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

import results

SECTION = "## Remediation A/B"
HERE = pathlib.Path(__file__).resolve().parent
TREE = HERE.parent


def burst_figures(output: str) -> tuple[float, float]:
    """(decision p50 ms, decision p99 ms) of the burst row in `bench/remediation.py`'s tables.

    Columns are found by their headers, so that a version that reorders them still reads right.
    """
    header: list[str] | None = None
    for line in output.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if "decision p99 ms" in cells:
            header = cells
        elif header is not None and len(cells) == len(header) and cells[header.index("run")].startswith("burst"):
            p50, p99 = cells[header.index("decision p50 ms")], cells[header.index("decision p99 ms")]
            return float(p50.replace(",", "")), float(p99.replace(",", ""))
    raise ValueError(f"no burst row in bench/remediation.py's output:\n{output[-2000:]}")


def run_burst(
    tree: pathlib.Path, pythonpath: str | None, args: argparse.Namespace, extra: list[str]
) -> tuple[float, float]:
    """One burst from tree's bench/remediation.py; pythonpath: where its `rasd` is imported from (None: this tree).

    extra: more arguments for that bench.
    """
    env = dict(os.environ)
    if pythonpath is not None:
        env["PYTHONPATH"] = pythonpath
    command = [
        sys.executable, str(tree / "bench" / "remediation.py"), "--repeat", "1", "--no-write",
        "--throughput-s", "0.5", "--backend", args.backend, "--commit-writer", args.commit_writer, *extra,
    ]  # fmt: skip
    done = subprocess.run(command, cwd=tree, env=env, capture_output=True, text=True, check=False)
    if done.returncode not in (0, 1):  # 1: the goal missed, figures printed all the same
        raise RuntimeError(f"{' '.join(command)} failed ({done.returncode}):\n{done.stderr[-2000:]}")
    return burst_figures(done.stdout)


def git(*argv: str) -> str:
    """Run git in this tree; its output, stripped."""
    return subprocess.run(["git", *argv], cwd=TREE, capture_output=True, text=True, check=True).stdout.strip()


def main(argv: list[str] | None = None) -> int:
    """Alternate base and this tree for --rounds pairs; print the table and update bench/RESULTS.md."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", required=True, help="the commit to compare against (any git revision)")
    parser.add_argument("--rounds", type=int, default=4, help="pairs of runs (base, then this tree)")
    parser.add_argument("--backend", choices=("sqlite", "postgresql"), default="sqlite")
    parser.add_argument("--commit-writer", choices=("process", "thread"), default="process")
    parser.add_argument(
        "--quarantine",
        choices=("record", "none", "kubernetes"),
        default="record",
        help="bench/remediation.py's quarantine adapter, on both sides (none where the base's bench has no choice)",
    )
    parser.add_argument(
        "--bench",
        choices=("own", "this"),
        default="own",
        help="whose bench/remediation.py the base runs: its own, or this tree's (its code imported all the same)",
    )
    parser.add_argument("--no-write", action="store_true", help="print only; leave RESULTS.md alone")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error(f"--rounds must be at least 1, got {args.rounds}")
    if args.backend == "postgresql" and not os.environ.get("RASD_TEST_POSTGRES_URL"):
        parser.error("--backend postgresql needs RASD_TEST_POSTGRES_URL (.ci/postgres.sh starts one)")
    try:
        base = git("rev-parse", "--verify", f"{args.base}^{{commit}}")
    except subprocess.CalledProcessError:
        parser.error(f"--base {args.base!r} is not a commit of this repository")
    head = git("rev-parse", "HEAD")
    # The results file is where this run writes: its own edits change nothing that is measured.
    changed = git("status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)bench/RESULTS.md")
    dirty = " plus uncommitted changes" if changed else ""
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    header = results.machine()
    pairs: list[tuple[tuple[float, float], tuple[float, float]]] = []
    with tempfile.TemporaryDirectory(prefix="rasd-ab-") as tmp:
        worktree = pathlib.Path(tmp) / "base"
        git("worktree", "add", "--detach", str(worktree), base)
        try:
            importable = pathlib.Path(tmp) / "import"
            importable.mkdir()
            (importable / "rasd").symlink_to(worktree)
            quarantine = args.quarantine
            base_bench = TREE if args.bench == "this" else worktree
            if "--quarantine" in (base_bench / "bench" / "remediation.py").read_text(encoding="utf-8"):
                base_extra = ["--quarantine", quarantine]
            else:
                quarantine, base_extra = "none", []  # the base's bench called no adapter
            for round_ in range(1, args.rounds + 1):
                before = run_burst(base_bench, str(importable), args, base_extra)
                after = run_burst(TREE, None, args, ["--quarantine", quarantine])
                pairs.append((before, after))
                print(
                    f"round {round_}: base p50 {before[0]:g} p99 {before[1]:g} ms; "
                    f"this tree p50 {after[0]:g} p99 {after[1]:g} ms",
                    file=sys.stderr,
                )
        finally:
            git("worktree", "remove", "--force", str(worktree))
    ratios = [after[1] / before[1] for before, after in pairs]
    rows = [
        f"| {i} | {b[0]:,.1f} | {b[1]:,.1f} | {a[0]:,.1f} | {a[1]:,.1f} | {a[1] / b[1]:.2f} |"
        for i, (b, a) in enumerate(pairs, 1)
    ]
    faster = sum(1 for r in ratios if r < 1)
    section = SECTION if quarantine == "record" else f"{SECTION}, quarantine adapter {quarantine}"
    text = "\n".join(
        [
            section,
            "",
            f"Command: `.venv/bin/python bench/remediation_ab.py {' '.join(sys.argv[1:] if argv is None else argv)}`  ",
            f"Machine: {header}  ",
            f"Run: {started}; base {base[:9]}, this tree {head[:9]}{dirty}; {args.backend}, commits in a "
            f"{args.commit_writer}; quarantine adapter: {quarantine}; each run is "
            f"{'this tree' if args.bench == 'this' else 'its own tree'}'s `bench/remediation.py` burst "
            "(2,000 nodes, 2,000 events/s for 5 s) once, base first.",
            "",
            "| round | base p50 ms | base p99 ms | this tree p50 ms | this tree p99 ms | p99 ratio |",
            "|---:|---:|---:|---:|---:|---:|",
            *rows,
            "",
            f"p99 ratio (this tree / base): median {statistics.median(ratios):.2f}, range {min(ratios):.2f} to "
            f"{max(ratios):.2f}; this tree's p99 lower in {faster} of {len(ratios)} rounds.",
            "",
            "",  # a blank line before the section after it
        ]
    )
    print(text)
    if not args.no_write:
        results.write_section(section, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
