"""The remediation burst, this tree against an earlier commit, in alternating runs: is a change faster?

Run: .venv/bin/python bench/remediation_ab.py --base REV [--rounds 4] [--backend sqlite]
     [--commit-writer process] [--quarantine record] [--bench own|this] [--rate 2000]
     [--duration-s 5] [--no-write]

Why: on these shared 2-core machines the burst p99 of one tree moves by 2× within minutes (other
tenants), so a figure from before a change and one from after it, taken an hour apart, say nothing.
Here each round runs the burst of `bench/remediation.py` once on the base commit and once on this
tree, back to back, so both meet the same machine; the ratio of each pair is the figure to read.

How: the base commit is checked out into a temporary git worktree and imported in place of this
tree (``PYTHONPATH`` names a directory whose ``rasd`` links to it). The generated protobuf modules
(``rasd.api``, build output that git ignores) come from this tree: the wire contract must be the
same for both sides. Each run is `bench/remediation.py --repeat 1 --no-write --throughput-s 0.5`
with the backend, commit writer, rate and duration given, from its own tree; the burst row's
decision p50 and p99, the controller's CPU seconds, the event loop thread's busy seconds and the
longest garbage-collector pause of the burst are read from its output. The CPU figures move less
with the machine than p99 does: at a rate near what the machine sustains, p99 is mostly queueing,
and a few per cent more or less work per event moves it by 2×; a lower ``--rate`` shows what a
change does to the latency of a machine that keeps up. Both sides run with the same
``--quarantine`` adapter; a base whose bench has no such option (before 4ef3bc5) called no
adapter, so then both sides run with ``--quarantine none``. With ``--bench this`` both sides run
this tree's bench (the base's code imported as above): for a base whose own bench cannot measure
what this one does (an adapter). Results go to the "## Remediation A/B" section of
bench/RESULTS.md (with the adapter named in the section's title when it is not ``record``).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import pathlib
import re
import statistics
import subprocess
import sys
import tempfile
import time

import results

SECTION = "## Remediation A/B"
HERE = pathlib.Path(__file__).resolve().parent
TREE = HERE.parent


@dataclasses.dataclass(frozen=True)
class Burst:
    """One run's burst, as `bench/remediation.py` printed it."""

    p50_ms: float
    p99_ms: float
    cpu_s: float
    """The controller process's CPU seconds (its writer process included)."""
    loop_s: float | None
    """The event loop thread's busy seconds (None: a bench that does not print them)."""
    gc_longest_ms: float | None
    """The longest collector pause (0: none; None: a bench that does not print them)."""


def _number(text: str) -> float:
    return float(text.replace(",", ""))


def burst_figures(output: str) -> Burst:
    """The burst row of `bench/remediation.py`'s tables and its notes line.

    Columns are found by their headers, so that a version that reorders them still reads right.
    """
    header: list[str] | None = None
    for line in output.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if "decision p99 ms" in cells:
            header = cells
        elif header is not None and len(cells) == len(header) and cells[header.index("run")].startswith("burst"):
            notes = next((n for n in output.splitlines() if n.startswith("- round") and ": burst " in n), "")
            loop = re.search(r"thread was busy ([\d.,]+) s", notes)
            pause = re.search(r"garbage collector: [^;]*?longest ([\d.,]+) ms", notes)
            gc_longest = _number(pause.group(1)) if pause else (0.0 if "no pause in the burst" in notes else None)
            return Burst(
                p50_ms=_number(cells[header.index("decision p50 ms")]),
                p99_ms=_number(cells[header.index("decision p99 ms")]),
                cpu_s=_number(cells[header.index("CPU s (controller)")]),
                loop_s=_number(loop.group(1)) if loop else None,
                gc_longest_ms=gc_longest,
            )
    raise ValueError(f"no burst row in bench/remediation.py's output:\n{output[-2000:]}")


def run_burst(tree: pathlib.Path, pythonpath: str | None, args: argparse.Namespace, extra: list[str]) -> Burst:
    """One burst from tree's bench/remediation.py; pythonpath: where its `rasd` is imported from (None: this tree).

    extra: more arguments for that bench.
    """
    env = dict(os.environ)
    if pythonpath is not None:
        env["PYTHONPATH"] = pythonpath
    command = [
        sys.executable, str(tree / "bench" / "remediation.py"), "--repeat", "1", "--no-write",
        "--throughput-s", "0.5", "--backend", args.backend, "--commit-writer", args.commit_writer,
        "--rate", f"{args.rate:g}", "--duration-s", f"{args.duration_s:g}", *extra,
    ]  # fmt: skip
    done = subprocess.run(command, cwd=tree, env=env, capture_output=True, text=True, check=False)
    if done.returncode not in (0, 1):  # 1: the goal missed, figures printed all the same
        raise RuntimeError(f"{' '.join(command)} failed ({done.returncode}):\n{done.stderr[-2000:]}")
    return burst_figures(done.stdout)


def git(*argv: str) -> str:
    """Run git in this tree; its output, stripped."""
    return subprocess.run(["git", *argv], cwd=TREE, capture_output=True, text=True, check=True).stdout.strip()


def this_tree() -> str:
    """This tree's commit, and whether files git tracks differ from it (what a results line names)."""
    head = git("rev-parse", "--short=9", "HEAD")
    # The results file is where a run writes: its own edits change nothing that is measured.
    changed = git("status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)bench/RESULTS.md")
    return f"{head} plus uncommitted changes" if changed else head


def _parser() -> argparse.ArgumentParser:
    """The command line."""
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
    parser.add_argument("--rate", type=float, default=2000.0, help="burst events/s, on both sides")
    parser.add_argument("--duration-s", type=float, default=5.0, help="burst length, on both sides")
    parser.add_argument("--no-write", action="store_true", help="print only; leave RESULTS.md alone")
    return parser


def _alternate(args: argparse.Namespace, base: str) -> tuple[list[tuple[Burst, Burst]], str]:
    """--rounds pairs of bursts, base then this tree; the pairs and the quarantine adapter both ran with."""
    pairs: list[tuple[Burst, Burst]] = []
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
                    f"round {round_}: base p50 {before.p50_ms:g} p99 {before.p99_ms:g} ms CPU {before.cpu_s:g} s; "
                    f"this tree p50 {after.p50_ms:g} p99 {after.p99_ms:g} ms CPU {after.cpu_s:g} s",
                    file=sys.stderr,
                )
        finally:
            git("worktree", "remove", "--force", str(worktree))
    return pairs, quarantine


def _report(
    args: argparse.Namespace,
    argv: list[str] | None,
    pairs: list[tuple[Burst, Burst]],
    quarantine: str,
    run: tuple[str, str, str, str],
) -> tuple[str, str]:
    """The results section's title and text; run: (base commit, this tree, start time, machine)."""
    base, tree, started, header = run
    ratios = [after.p99_ms / before.p99_ms for before, after in pairs]
    cpu_ratios = [after.cpu_s / before.cpu_s for before, after in pairs]
    loop_ratios = [a.loop_s / b.loop_s for b, a in pairs if a.loop_s and b.loop_s]

    def optional(value: float | None) -> str:
        return "–" if value is None else f"{value:,.1f}"

    rows = [
        f"| {i} | {b.p50_ms:,.1f} | {b.p99_ms:,.1f} | {a.p50_ms:,.1f} | {a.p99_ms:,.1f} | {a.p99_ms / b.p99_ms:.2f} | "
        f"{b.cpu_s:.1f} / {a.cpu_s:.1f} | {optional(b.loop_s)} / {optional(a.loop_s)} | "
        f"{optional(b.gc_longest_ms)} / {optional(a.gc_longest_ms)} |"
        for i, (b, a) in enumerate(pairs, 1)
    ]
    faster = sum(1 for r in ratios if r < 1)
    loop_line = (
        f" Event loop busy ratio: median {statistics.median(loop_ratios):.2f}, range {min(loop_ratios):.2f} to "
        f"{max(loop_ratios):.2f}."
        if loop_ratios
        else ""
    )
    section = SECTION if quarantine == "record" else f"{SECTION}, quarantine adapter {quarantine}"
    text = "\n".join(
        [
            section,
            "",
            f"Command: `.venv/bin/python bench/remediation_ab.py {' '.join(sys.argv[1:] if argv is None else argv)}`  ",
            f"Machine: {header}  ",
            f"Run: {started}; base {base[:9]}, this tree {tree}; {args.backend}, commits in a "
            f"{args.commit_writer}; quarantine adapter: {quarantine}; each run is "
            f"{'this tree' if args.bench == 'this' else 'its own tree'}'s `bench/remediation.py` burst "
            f"(2,000 nodes, {args.rate:,.0f} events/s for {args.duration_s:g} s) once, base first. CPU: the "
            "controller's in the burst (writer process included); loop: the event loop thread's busy seconds; "
            "GC: the longest collector pause in the burst.",
            "",
            "| round | base p50 ms | base p99 ms | this tree p50 ms | this tree p99 ms | p99 ratio | "
            "CPU s base / this | loop s base / this | GC longest ms base / this |",
            "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
            *rows,
            "",
            f"p99 ratio (this tree / base): median {statistics.median(ratios):.2f}, range {min(ratios):.2f} to "
            f"{max(ratios):.2f}; this tree's p99 lower in {faster} of {len(ratios)} rounds. CPU ratio: median "
            f"{statistics.median(cpu_ratios):.2f}, range {min(cpu_ratios):.2f} to {max(cpu_ratios):.2f}.{loop_line}",
            "",
            "",  # a blank line before the section after it
        ]
    )
    return section, text


def main(argv: list[str] | None = None) -> int:
    """Alternate base and this tree for --rounds pairs; print the table and update bench/RESULTS.md."""
    parser = _parser()
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error(f"--rounds must be at least 1, got {args.rounds}")
    if args.rate <= 0 or args.duration_s <= 0:
        parser.error(f"--rate and --duration-s must be positive, got {args.rate:g} and {args.duration_s:g}")
    if args.backend == "postgresql" and not os.environ.get("RASD_TEST_POSTGRES_URL"):
        parser.error("--backend postgresql needs RASD_TEST_POSTGRES_URL (.ci/postgres.sh starts one)")
    try:
        base = git("rev-parse", "--verify", f"{args.base}^{{commit}}")
    except subprocess.CalledProcessError:
        parser.error(f"--base {args.base!r} is not a commit of this repository")
    tree = this_tree()
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    header = results.machine()
    pairs, quarantine = _alternate(args, base)
    section, text = _report(args, argv, pairs, quarantine, (base, tree, started, header))
    print(text)
    if not args.no_write:
        results.write_section(section, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
