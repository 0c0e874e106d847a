"""Shared fixtures: free loopback ports, the venv's console scripts, the test PostgreSQL, and promtool's
check of an exposition.

PostgreSQL comes from RASD_TEST_POSTGRES_URL (`.ci/postgres.sh` starts one and prints the line to
export). Unset or unreachable: tests that need it are skipped with a message saying so, unless
RASD_TEST_POSTGRES_REQUIRED=1 (CI), where they fail instead. Each test gets its own schema
(search_path set through the URL), dropped afterwards, so tests never see each other's rows, also
when pytest-xdist runs them in parallel (`make test`).

Also how pytest-xdist hands the tests to its workers (`make test` runs them in parallel), and the
fuzzing summary (tests/fuzz): the inputs each run tried, added up from the tests' reports.
"""

from __future__ import annotations

import fcntl
import logging
import os
import pathlib
import re
import shutil
import socket
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator

import pytest
import sqlalchemy as sa
import structlog

from rasd.controller.store import repo

REPO_ROOT = pathlib.Path(__file__).resolve().parent.parent
VENV_BIN = pathlib.Path(sys.executable).parent


@pytest.fixture
def debug_logs() -> Iterator[None]:
    """Log at debug for the test: another test in the same worker may have configured a higher level
    (as rasd-controller's `configure` does), and `structlog.testing.capture_logs` sees only what passes it."""
    saved = structlog.get_config()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.DEBUG))
    try:
        yield
    finally:
        structlog.configure(**saved)


@pytest.fixture
def restore_logging() -> Iterator[None]:
    """`rasd_logging.configure` replaces the root logger's handlers and level, structlog's configuration and
    the level helper processes start at; put all of them back after the test."""
    from rasd.common import logging as rasd_logging

    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    saved, child_level = structlog.get_config(), rasd_logging.configured_level()
    try:
        yield
    finally:
        rasd_logging.configure(child_level, json=True)  # for the level only: the rest is put back below
        for handler in list(root.handlers):
            root.removeHandler(handler)
        for handler in handlers:
            root.addHandler(handler)
        root.setLevel(level)
        structlog.configure(**saved)


@pytest.fixture
def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def free_ports():
    """`free_ports(n)`: n distinct TCP ports on 127.0.0.1 that were free a moment ago."""

    def take(n: int) -> list[int]:
        sockets = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(n)]
        try:
            for sock in sockets:  # all bound at once: the kernel hands out n different ports
                sock.bind(("127.0.0.1", 0))
            return [sock.getsockname()[1] for sock in sockets]
        finally:
            for sock in sockets:
                sock.close()

    return take


@pytest.fixture
def venv_bin() -> pathlib.Path:
    """Folder of the running interpreter's console scripts (rasd-agent, rasctl, ...)."""
    return VENV_BIN


DCGM_CAMEL_CASE_LABELS = {"UUID": "uuid", "Hostname": "hostname", "modelName": "model_name"}
"""dcgm-exporter's label names that promtool's lint calls camelCase: rasd's per-GPU series share them
so the two exporters' series join (docs/metrics.md), and accept that one lint finding."""


@pytest.fixture
def check_metrics() -> Callable[[str], None]:
    """`promtool check metrics` on an exposition (skipped without promtool): it must parse, and lint
    clean except for dcgm-exporter's camelCase label names (clean once those are renamed)."""
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (Debian package prometheus; .ci/run installs it)")

    def run(text: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=30)

    def check(text: str) -> None:
        result = run(text)
        if result.returncode == 0:
            return
        assert result.returncode == 3, result.stdout + result.stderr  # 3: lint findings only; 1: unparsable
        snake = re.sub(r"\b(UUID|Hostname|modelName)=", lambda m: DCGM_CAMEL_CASE_LABELS[m[1]] + "=", text)
        renamed = run(snake)
        assert renamed.returncode == 0, "lint beyond dcgm-exporter's label names: " + renamed.stdout + renamed.stderr

    return check


@pytest.fixture
def repo_root() -> pathlib.Path:
    """The repository checkout."""
    return REPO_ROOT


POSTGRES_URL_ENV = "RASD_TEST_POSTGRES_URL"
POSTGRES_REQUIRED_ENV = "RASD_TEST_POSTGRES_REQUIRED"


def _postgres_url_with(url: str, schema: str | None = None, **settings: str) -> str:
    """url with `-c name=value` server settings (search_path first when schema is given)."""
    parsed = sa.engine.make_url(url)
    options = [parsed.query.get("options", "")] if parsed.query.get("options") else []
    if schema is not None:
        options.append(f"-csearch_path={schema}")
    options += [f"-c{name}={value}" for name, value in settings.items()]
    return parsed.update_query_dict({"options": " ".join(options)}).render_as_string(hide_password=False)


@pytest.fixture(scope="session")
def postgres_server_url() -> str:
    """The PostgreSQL URL from the environment, checked once per session (skip or fail when unusable)."""
    url = os.environ.get(POSTGRES_URL_ENV, "")
    problem = "" if url else f"{POSTGRES_URL_ENV} is unset"
    if url:
        engine = sa.create_engine(url, poolclass=sa.pool.NullPool, connect_args={"connect_timeout": 5})
        try:
            with engine.connect() as connection:
                connection.execute(sa.text("SELECT 1"))
        except (sa.exc.SQLAlchemyError, ValueError) as exc:
            problem = " ".join(str(getattr(exc, "orig", None) or exc).split())[:300]
        finally:
            engine.dispose()
    if problem:
        where = repo.redact_url(url) if url else "(no URL)"
        message = (
            f"PostgreSQL not reachable at {where}: set {POSTGRES_URL_ENV} (.ci/postgres.sh starts one) [{problem}]"
        )
        if os.environ.get(POSTGRES_REQUIRED_ENV) == "1":
            pytest.fail(message)
        pytest.skip(message)
    return url


@pytest.fixture
def postgres_schema_url(postgres_server_url):
    """The URL of a fresh, empty schema in the test PostgreSQL, dropped after the test."""
    schema = f"rasd_test_{uuid.uuid4().hex[:16]}"
    admin = sa.create_engine(postgres_server_url, poolclass=sa.pool.NullPool)
    with admin.begin() as connection:
        connection.execute(sa.text(f'CREATE SCHEMA "{schema}"'))
    try:
        yield _postgres_url_with(postgres_server_url, schema)
    finally:
        with admin.begin() as connection:
            # A connection a failed test left in a transaction must not hang the session.
            connection.execute(sa.text("SET LOCAL lock_timeout = '10s'"))
            connection.execute(sa.text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()


@pytest.fixture
def postgres_url_with():
    """`(url, schema=None, **settings) -> url` adding PostgreSQL server settings, e.g. lock_timeout="200ms"."""
    return _postgres_url_with


# -- pytest-xdist scheduling ---------------------------------------------------------------------------
# Each test is its own unit of work, handed to the next free worker, so that the long end-to-end tests
# spread over the workers (xdist's default `load` sends consecutive chunks: every test in
# tests/integration landed on one worker). These modules run whole on one worker, in file order:
ONE_WORKER_MODULES = {
    "tests/fuzz/test_fuzz_admin.py",  # the count test reads what the fuzz test did in this process
    "tests/fuzz/test_fuzz_agent_messages.py",  # the same
    "tests/fuzz/test_fuzz_kmsg.py",  # the same
    "tests/integration/test_record_replay.py",  # one recorded run (~10 s) serves every test
    "tests/unit/controller/test_bmc.py",  # one Redfish emulator serves every test
}
# (xdist's own `xdist_group` mark would say this in the test files, but with pytest >= 9.2 it is
# silently ignored: https://github.com/pytest-dev/pytest-xdist/issues/1386.)


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist: without it, never called
def pytest_xdist_make_scheduler(config, log):  # type: ignore[no-untyped-def]
    from xdist.scheduler import LoadScopeScheduling

    class OneTestOrOneModule(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            return module if module in ONE_WORKER_MODULES else nodeid

    return OneTestOrOneModule(config, log)


# -- fuzzing summary ---------------------------------------------------------------------------------
# Fuzz tests report their counts with `record_property("fuzz:<what>", n)`. Added up here, not in
# tests/fuzz/conftest.py: under pytest-xdist the controller process, which prints the summary, loads
# only this conftest, and the workers' reports carry the properties to it.
_fuzz_counts: dict[str, int] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when != "call":
        return
    for name, value in report.user_properties:
        if isinstance(name, str) and name.startswith("fuzz:"):
            what = name.removeprefix("fuzz:")
            _fuzz_counts[what] = _fuzz_counts.get(what, 0) + int(value)


def pytest_terminal_summary(terminalreporter) -> None:  # type: ignore[no-untyped-def]
    if not _fuzz_counts:
        return
    terminalreporter.section("fuzzing: inputs tried")
    for name in sorted(_fuzz_counts):
        terminalreporter.write_line(f"{name}: {_fuzz_counts[name]:,}")


@pytest.fixture(scope="session")
def build_wheel() -> Callable[[pathlib.Path], pathlib.Path]:
    """Build rasd's wheel into a folder and return it, one build at a time across the xdist workers.

    setuptools builds in the repository's own build/ folder, and two builds at once there trip over
    each other's files (a wheel test failed with "No such file or directory: build/bdist...").
    """

    def build(out_dir: pathlib.Path) -> pathlib.Path:
        (REPO_ROOT / "build").mkdir(exist_ok=True)
        with open(REPO_ROOT / "build" / ".wheel-build.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
            built = subprocess.run(
                [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                 str(out_dir), str(REPO_ROOT)],
                capture_output=True, text=True, timeout=180, check=False,
            )  # fmt: skip
        assert built.returncode == 0, built.stderr
        (wheel,) = out_dir.glob("rasd-*.whl")
        return wheel

    return build
