"""Shared by every benchmark: describe the machine and update one section of bench/RESULTS.md."""

from __future__ import annotations

import contextlib
import os
import platform
import re
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "RESULTS.md"


def machine(*extra: str) -> str:
    """One line naming the machine this ran on (CPU, cores, Python, load), plus extra facts."""
    model = "unknown CPU"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    parts = [
        f"nproc {cpus}",
        model,
        f"Python {platform.python_version()}",
        *extra,
        f"load average {load:.2f} at start",
        f"speed gauge {python_speed_s():.2f} s",
    ]
    return ", ".join(parts)


def python_speed_s(additions: int = 2_000_000, tries: int = 3) -> float:
    """Seconds this interpreter takes for 10 million additions in a loop (best of tries, scaled).

    The shared machines' speed drifts from one hour to the next (other tenants), which moves every
    figure near a capacity limit; this puts a number on it, so that runs can be compared.
    """
    best = float("inf")
    for _ in range(tries):
        started = time.perf_counter()
        total = 0
        for i in range(additions):
            total += i
        best = min(best, time.perf_counter() - started)
    return best * 10_000_000 / additions


def _section_span(text: str, heading: str) -> re.Match[str] | None:
    """Where the section that starts with heading stands in text: up to the next ``## `` or the end."""
    return re.compile(rf"^{re.escape(heading)}\n.*?(?=^## |\Z)", re.MULTILINE | re.DOTALL).search(text)


def write_section(heading: str, text: str) -> None:
    """Replace (or append) the section that starts with heading, leaving every other section untouched."""
    old = RESULTS.read_text() if RESULTS.exists() else "# Benchmark results\n"
    found = _section_span(old, heading)
    RESULTS.write_text(old[: found.start()] + text + old[found.end() :] if found else old.rstrip("\n") + "\n\n" + text)


def subsections(heading: str) -> str:
    """The ``### `` subsections of the section that starts with heading, as they stand ("" if none).

    A benchmark that rewrites a section appends these, so another benchmark's subsection survives it.
    """
    old = RESULTS.read_text() if RESULTS.exists() else ""
    section = _section_span(old, heading)
    if section is None:
        return ""
    start = re.search(r"^### ", section.group(0), re.MULTILINE)
    return section.group(0)[start.start() :].rstrip("\n") + "\n" if start else ""


def write_subsection(heading: str, subheading: str, text: str) -> None:
    """Replace (or append) the ``### `` subsection subheading of the section heading; the rest stays as it is."""
    old = RESULTS.read_text() if RESULTS.exists() else "# Benchmark results\n"
    section = _section_span(old, heading)
    if section is None:
        write_section(heading, f"{heading}\n\n{text}")
        return
    body = section.group(0)
    pattern = re.compile(rf"^{re.escape(subheading)}\n.*?(?=^### |\Z)", re.MULTILINE | re.DOTALL)
    found = pattern.search(body)
    ending = "\n" if section.end() == len(old) else "\n\n"
    body = (body[: found.start()] + text + body[found.end() :]) if found else body.rstrip("\n") + "\n\n" + text
    RESULTS.write_text(old[: section.start()] + body.rstrip("\n") + ending + old[section.end() :])
