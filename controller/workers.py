"""Ingest workers: one controller pod serving agent streams from several processes (`--ingest-workers N`).

One Python process spends a core on about 2,048 nodes' streams (bench/RESULTS.md "Scale"). With N
workers, each is a whole replica (`server.Controller`) with an id of its own (`<replica id>-w<i>`),
all listening on the same address with SO_REUSEPORT, so the kernel spreads new agent connections
over them. They share the pod's PostgreSQL store and work together as replicas on separate pods do
(`replication`): one holds the lease and runs the fleet-wide loops (ladder, power, sweeps) over
every node; the others ship it their aggregates and deliver its commands. Nothing new crosses
between workers: the store is their only channel, as between pods, so no hand-off of sockets or
message broker is needed. Each worker also listens on a port of its own (`listen` port + 1 + i),
which it advertises to rasctl: a refusal's hint naming the shared port could land on another worker.

SQLite stays one process (one writer, no lease election): `problem` says so.

The parent only supervises: it starts the workers, starts again one that exits (its agents
reconnect to the others meanwhile), and stops them all on SIGTERM. A worker whose parent died stops
by itself (it checks its parent's pid every `PARENT_CHECK_S`): none goes on serving behind the back
of a pod that is gone.
"""

from __future__ import annotations

import asyncio
import dataclasses
import multiprocessing
import os
import signal
import time
from collections.abc import Callable, Sequence
from typing import Any

import structlog

from rasd.common import gc_policy, net
from rasd.common import logging as rasd_logging
from rasd.controller import server
from rasd.controller.replication import leader as leader_mod

log = structlog.get_logger("rasd.controller")

PARENT_CHECK_S = 1.0
"""How often a worker checks that its parent still runs."""
RESTART_AFTER_S = 1.0
"""How long the parent waits before starting a worker that exited again."""


def problem(settings: server.ControllerSettings, workers: int) -> str | None:
    """Why these settings cannot run `workers` ingest workers; None when they can (or when workers is 1)."""
    if workers < 1:
        return f"--ingest-workers: {workers} is not a number of processes (at least 1)"
    if workers == 1:
        return None
    if not settings.db_url.startswith("postgresql"):
        return (
            "--ingest-workers needs a PostgreSQL store: workers are replicas that elect a leader through it; "
            "SQLite keeps one process"
        )
    if settings.leader.resolved_election(settings.db_url) != "lease":
        return '--ingest-workers needs lease election ([leader] election = "lease" or "auto")'
    if settings.record_path is not None:
        return "--ingest-workers cannot --record: the workers would write one file at once"
    _host, port = net.split_host_port(settings.listen)
    if port == 0:
        return "--ingest-workers needs a fixed --listen port (every worker binds the same one)"
    if port + workers > 65535:
        return f"--ingest-workers: the workers' own ports {port + 1}..{port + workers} are not ports"
    return None


def worker_settings(settings: server.ControllerSettings, index: int) -> server.ControllerSettings:
    """Worker index's settings: its own replica id, own port and metrics port; the shared listen address."""
    host, port = net.split_host_port(settings.listen)
    base_id = settings.leader.replica_id or leader_mod.default_replica_id()
    metrics_port = settings.metrics_port
    if metrics_port:  # None: off; 0: a free one each
        metrics_port += index
    own_host = f"[{host}]" if ":" in host else host
    return dataclasses.replace(
        settings,
        leader=dataclasses.replace(settings.leader, replica_id=f"{base_id}-w{index}"),
        metrics_port=metrics_port,
        reuse_port=True,
        own_listen=f"{own_host}:{port + 1 + index}",
    )


async def serve(settings: server.ControllerSettings, *, parent_pid: int | None = None) -> int:
    """Run one controller until SIGTERM or SIGINT, or (parent_pid given) until that process is gone."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    controller = server.Controller(settings)
    await controller.start()
    gc_policy.freeze_startup_heap()  # modules, compiled statements, loaded state: never walked again
    watch = asyncio.create_task(_watch_parent(parent_pid, stop)) if parent_pid is not None else None
    try:
        await stop.wait()
    finally:
        if watch is not None:
            watch.cancel()
        await controller.stop()
    return 0


async def _watch_parent(parent_pid: int, stop: asyncio.Event) -> None:
    """Set stop once this process's parent is no longer parent_pid (it died: we were handed to init)."""
    while os.getppid() == parent_pid:
        await asyncio.sleep(PARENT_CHECK_S)
    log.warning("ingest_worker_parent_gone", parent_pid=parent_pid)
    stop.set()


Build = tuple[Callable[[Sequence[str]], server.ControllerSettings], Sequence[str]]
"""(a function, the command line) that gives the controller's settings: a worker builds its own (settings
hold what does not pickle)."""


def _worker_main(build: Build, index: int, log_level: str, parent_pid: int) -> None:
    """A worker process: its settings and logging, then `serve` until told to stop or the parent is gone."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C reaches the parent, which stops us
    settings_of, argv = build
    settings = worker_settings(settings_of(argv), index)
    rasd_logging.configure(log_level)
    gc_policy.configure()
    asyncio.run(serve(settings, parent_pid=parent_pid))


def run(settings: server.ControllerSettings, workers: int, *, log_level: str, build: Build) -> int:
    """Start `workers` worker processes and supervise them until SIGTERM or SIGINT; 0 once all stopped.

    Each worker builds its settings with build (the parent's command line), then `worker_settings`.
    """
    ctx = multiprocessing.get_context("spawn")
    stopping = False

    def on_signal(_signum: int, _frame: Any) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    processes: dict[int, Any] = {}
    started_at: dict[int, float] = {}

    def start(index: int) -> None:
        process = ctx.Process(
            target=_worker_main,
            args=(build, index, log_level, os.getpid()),
            name=f"rasd-ingest-worker-{index}",
        )
        process.start()
        processes[index], started_at[index] = process, time.monotonic()
        log.info("ingest_worker_started", worker=index, pid=process.pid)

    for index in range(workers):
        start(index)
    while not stopping:
        time.sleep(0.2)
        for index, process in list(processes.items()):
            if not process.is_alive() and time.monotonic() - started_at[index] >= RESTART_AFTER_S:
                log.error("ingest_worker_exited", worker=index, pid=process.pid, exitcode=process.exitcode)
                start(index)
    for process in processes.values():
        if process.is_alive():
            process.terminate()  # SIGTERM: each stops as a replica does (streams ended, lease released)
    for process in processes.values():
        process.join(timeout=settings.shutdown_grace_s + 25.0)
        if process.is_alive():
            process.kill()
    log.info("ingest_workers_stopped", workers=workers)
    return 0
