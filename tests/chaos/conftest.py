"""The fault-injection suite's fixtures, and its figures in pytest's terminal summary.

Each chaos test reports what it measured through the `figures` fixture ("ladders 50, kills 12,
duplicates 0, lost 0"). Output capture hides prints, so the lines are collected here and printed in
a "chaos figures" section at the end of every run (CI logs included), with each test's runtime.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import sys
import tempfile
import time

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import chaoslib

POSTGRES_REQUIRED_ENV = "RASD_TEST_POSTGRES_REQUIRED"

_FIGURES: list[tuple[str, str, float]] = []


@pytest.fixture
def figures(request: pytest.FixtureRequest):
    """`figures(text)` records a line of this test's measured figures for the summary."""
    started = time.monotonic()
    lines: list[str] = []
    yield lines.append
    elapsed_s = time.monotonic() - started
    for line in lines or ["(no figures: the test did not get that far)"]:
        _FIGURES.append((request.node.name, line, elapsed_s))


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:  # type: ignore[no-untyped-def]
    if not _FIGURES:
        return
    terminalreporter.section("chaos figures")
    for name, line, elapsed_s in _FIGURES:
        terminalreporter.write_line(f"{name} [{elapsed_s:.1f} s]: {line}")


@pytest.fixture
def private_postgres():
    """A throwaway PostgreSQL cluster this test may restart (skipped without the server binaries)."""
    bin_dir = chaoslib.postgres_bin_dir()
    if bin_dir is None:
        message = "PostgreSQL server binaries (initdb, pg_ctl) not found: install Debian's postgresql"
        if os.environ.get(POSTGRES_REQUIRED_ENV) == "1":
            pytest.fail(message)
        pytest.skip(message)
    workdir = pathlib.Path(tempfile.mkdtemp(prefix="rasd-chaos-pg-"))
    server = chaoslib.PrivatePostgres(bin_dir, workdir)
    try:
        server.init()
        yield server
    finally:
        server.close()
        shutil.rmtree(workdir, ignore_errors=True)
