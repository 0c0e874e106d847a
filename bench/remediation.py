"""Remediation decision path: classify → decide → persist (outbox) → dispatch, on SQLite and PostgreSQL.

Run: .venv/bin/python bench/remediation.py [--quick] [--no-write] [--duration-s 5] [--profile FILE]

What is timed, per backend (SQLite file in WAL mode; PostgreSQL when RASD_TEST_POSTGRES_URL is set,
in a fresh schema dropped afterwards) and per commit writer (``--commit-writer``: a writer process,
as ``rasd-controller`` runs, with the next pass decided while one commits; or the store thread, one
pass at a time), in this order on one database:

1. **Sustained throughput**: events fed one by one, as fast as the controller takes them, with a
   real ``Store`` and ``Ingest``: once to ``RemediationService.on_events`` alone (the decision path;
   the event is not stored), once to ``Ingest.take_events``, rasd-controller's path after wire
   validation (``rpc.agent_service.deliver`` without the protobuf decoding): the event is stored in the
   transaction of the decision on it (its ``health_events`` row and the node's ack position with
   the ladder's rows), then acked on its stream. The gRPC stream and wire validation are outside.
2. **Paced run** well below capacity (default 10 events/s): the per-event latency without a queue.
3. **Burst**: events arrive on a fixed schedule (default 2,000 events/s across 2,000 nodes for
   5 s). Each arrival starts its own task and its own call, as concurrent agent streams do, a
   node's after its last one returned (its stream is read a message at a time); calls that
   arrive while a pass runs wait and are decided together in the next pass (group commit: one
   transaction per group of at most ``MAX_GROUP_EVENTS`` calls, which also carries the dispatch
   of the waiting actions the pass before it left). An event's arrival time is its scheduled
   time, so a service that falls behind pays for the queue (no coordinated omission); what is
   still queued when the drain timeout ends is cut off and counted as at least that old.
   ``--path`` picks how the paced run's and the burst's events arrive (`PATHS`; default
   ``ingest``, rasd-controller's).

``decision latency`` is the service's own ``stats.decision_latency_s``: arrival → each command
the event led to leaving the decision path (an agent command queued on its node's stream, after
the commit that records it dispatched; a quarantine as its adapter is called); ``arrival →
return`` is measured here for every event (arrival → the call returned: decided, and acked).

Nodes are registered with ``Store.register_hello`` (8 GPUs, labels rack and nvlink_domain) and
each gets what ``Ingest.open_session`` leaves for a connected agent: its labels and an
``ingest.Session`` whose outbound queue a task per node empties, serializing each message as the
stream's writer (``AgentService._write``) does before ``context.write``. The events of a burst come
from connected agents, so their commands are queued on those streams (``Ingest.dispatch``); no
agent answers, so agent commands stay ``dispatched`` in the outbox. The controller's logging
is configured as ``rasd-controller`` configures it (JSON at ``--log-level``, default info) and
written to /dev/null, so its cost is included; so is the garbage collector (``rasd.common.gc_policy``:
its thresholds, the start-up heap frozen once the service has started, and the collector that runs
while no decision waits, as ``rasd-controller`` runs them). Every phase's arrival schedule is built
before the start, so the load generator's own objects are frozen with the start-up heap: an agent's
events come from another machine, and the controller's collector should not walk them.

Disruption policy (so the burst is admitted, not held by the budget): breaker_quarantine_pct 100,
max_disrupted_nodes_pct 100, max_disrupted_nodes 100000, rack and nvlink_domain caps 100000
nodes and 100 %, storm_cooldown_s 0. Everything else is the default policy.

Quarantines and releases go through the adapter rasd-controller is configured with
(``--quarantine``): ``record`` (its default, `RecordOnlyQuarantine`: nothing changes on a cluster,
and since its calls wait on nothing the service makes them in the dispatch round); ``kubernetes``:
`KubernetesQuarantine` and the real ``kubernetes`` client in the adapter's own process
(`KubernetesProcess`, as rasd-controller runs it), over HTTP to the fake API server of
``tests/fakes/kube_api.py`` in a process of its own, every answer ``--api-latency-ms`` late (a read
and a patch per quarantine, a node's adds its status patch, then an Event after the call has
returned), figures in their own section, the server's CPU shown apart (a real API server runs
elsewhere) and the adapter process's too; ``none``: no adapter, the
quarantine is its record (as this bench ran before 59c13c6). A burst ends when every event's call
has returned, every adapter call's outcome is committed and
every repair that waited for its quarantine has been sent.

CPU seconds are the controller's: this process (the service, its store thread, the event generator)
and its commit writer process if it has one; for
PostgreSQL the server processes' CPU is read from /proc and shown separately. The goal from the
remediation issue: p99 decision latency ≤ 50 ms at 2,000 events/s; the process exits 1 when it
is missed on SQLite. Figures go to the "## Remediation" section of bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import dataclasses
import gc
import json
import math
import os
import pathlib
import pstats
import random
import resource
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from typing import Any

import results
import sqlalchemy as sa
from prometheus_client import CollectorRegistry

from rasd.api.v1 import agent_service_pb2 as agent_pb
from rasd.api.v1 import health_pb2 as health_pb
from rasd.common import gc_policy
from rasd.common import logging as rasd_logging
from rasd.controller.core import fleet
from rasd.controller.core.remediation import events as health
from rasd.controller.core.remediation import policy as policy_mod
from rasd.controller.executors import quarantine
from rasd.controller.ingest import service as ingest_mod
from rasd.controller.observability import metrics
from rasd.controller.remediation import service as remediation_mod
from rasd.controller.store import repo
from rasd.controller.store import writer as store_writer

try:
    from rasd.controller import wiring
except ImportError:  # a tree before the services were wired in one place (remediation_ab.py --bench this)
    wiring = None  # type: ignore[assignment]

SECTION = "## Remediation"
PATHS = {
    "ingest": "Ingest.take_events",
    "decide": "RemediationService.on_events only",
    "store-then-decide": "Ingest.store_events, then RemediationService.on_events",
}
"""How an event reaches the controller (`Rig.deliver`): ``ingest``, rasd-controller's path after wire
validation (the event stored in the transaction of the decision on it, then acked; where the stream
cannot tell that it is new, stored first); ``decide``, the decision path alone (the event not stored);
``store-then-decide``, the path before 2026-12-03 (the event stored and acked in a transaction of
its own, then decided in another)."""
KUBERNETES_SECTION = "## Remediation, quarantines through the Kubernetes API"
WAITING_SECTION = "## Remediation, a quarantine adapter that only waits (diagnostic)"
KUBE_API = pathlib.Path(__file__).resolve().parents[1] / "tests" / "fakes" / "kube_api.py"
GOAL_P99_MS = 50.0
GPUS_PER_NODE = 8
NODES_PER_RACK = 16
NODES_PER_NVLINK_DOMAIN = 8
POLICY = {
    "disruption": {
        "breaker_quarantine_pct": 100,
        "max_disrupted_nodes_pct": 100,
        "max_disrupted_nodes": 100000,
        "domain_max_nodes": {"rack": 100000, "nvlink_domain": 100000, "power_feed": 100000},
        "domain_max_pct": {"rack": 100, "nvlink_domain": 100, "power_feed": 100},
        "storm_cooldown_s": 0,
    },
    # The bench's nodes send only the events it schedules, no summaries or heartbeats: the lost-node
    # watch would take every quiet one for a dead host and add quarantines nobody scheduled.
    "lost_nodes": {"enabled": False},
}
NVSENTINEL = "NVSentinel: observed production peak 2,033 events/s; its quarantine module takes ~370 ms per event"

# (weight, label, kind, xid, gpu-level, repeats of the same fault within the dedupe window)
MIX: tuple[tuple[float, str, health.EventKind, int | None, bool, int], ...] = (
    (0.20, "xid13", health.EventKind.XID, 13, True, 3),
    (0.18, "xid31", health.EventKind.XID, 31, True, 3),
    (0.07, "xid43", health.EventKind.XID, 43, True, 2),
    (0.07, "xid45", health.EventKind.XID, 45, True, 2),
    (0.03, "xid48", health.EventKind.XID, 48, True, 1),
    (0.01, "xid79", health.EventKind.XID, 79, True, 1),
    (0.04, "xid94", health.EventKind.XID, 94, True, 2),
    (0.03, "xid119", health.EventKind.XID, 119, True, 1),
    (0.03, "ecc_dbe", health.EventKind.ECC_DBE, None, True, 1),
    (0.04, "row_remap_pending", health.EventKind.ROW_REMAP_PENDING, None, True, 1),
    (0.12, "nvlink_errors", health.EventKind.NVLINK_ERRORS, None, True, 2),
    (0.18, "ib_link_state", health.EventKind.IB_LINK_STATE, None, False, 2),
)
FLAPPING_NODE_FRACTION = 0.005  # these nodes' IB port flaps (DOWN/ACTIVE) until it is a storm: node quarantine


@dataclasses.dataclass(frozen=True)
class Arrival:
    """One scheduled event before it gets its node's seq and its arrival time."""

    offset_s: float
    node_id: str
    kind: health.EventKind
    gpu_uuid: str
    xid: int | None
    message: str
    attributes: dict[str, str]
    label: str


def node_name(i: int) -> str:
    """A realistic node name (long ids are part of what the store must hold)."""
    return f"gpu-node-{i:05d}.cluster-a.example.internal"


def gpu_uuid(node: int, index: int) -> str:
    """A UUID-shaped GPU id, stable per (node, index)."""
    return f"GPU-{uuid.UUID(int=(node << 8) | index + 1)}"


def hello(i: int) -> fleet.NodeHello:
    """The Hello of node i: 8 GPUs, labels rack and nvlink_domain."""
    node_id = node_name(i)
    labels = {"rack": f"rack-{i // NODES_PER_RACK:04d}", "nvlink_domain": f"nvl-{i // NODES_PER_NVLINK_DOMAIN:04d}"}
    gpus = tuple(
        fleet.GpuRecord(
            uuid=gpu_uuid(i, g), node_id=node_id, model="NVIDIA H100 80GB HBM3", pci_bus_id=f"0000:{0x18 + g:02x}:00.0",
            power_limit_min_w=200, power_limit_max_w=700, power_limit_default_w=700, serial=f"S{i:05d}{g}",
            memory_total_mib=81559, labels={"nvlink_domain": labels["nvlink_domain"]},
        )
        for g in range(GPUS_PER_NODE)
    )  # fmt: skip
    return fleet.NodeHello(node_id, "boot-1", "bench", node_id, "nvml", labels, gpus, 0)


def _fault(rng: random.Random, node: int, label: str, kind: health.EventKind, xid: int | None, gpu: int) -> tuple:
    uuid_ = gpu_uuid(node, gpu)
    pci = f"0000:{0x18 + gpu:02x}:00.0"
    attributes = {"pci": pci}
    message = f"{label} on {pci}"
    if kind is health.EventKind.XID:
        message = f"NVRM: Xid (PCI:{pci}): {xid}, pid=4242, name=python3, Ch 00000008"
        attributes["pid"] = "4242"
    elif kind is health.EventKind.ECC_DBE:
        attributes["remapped_rows_uncorrectable"] = str(rng.randint(1, 8))
    elif kind is health.EventKind.ROW_REMAP_PENDING:
        attributes["remapped_rows_correctable"] = str(rng.randint(0, 4))
    elif kind is health.EventKind.NVLINK_ERRORS:
        # Mostly below the CRC-rate limit (watched), one in five above it (a reset retrains the link).
        attributes["link"] = str(rng.randint(0, 17))
        attributes["nvlink_errors_per_s"] = str(rng.choice([0.5, 2.0, 5.0, 20.0, 5000.0]))
    elif kind is health.EventKind.IB_LINK_STATE:
        uuid_ = ""
        state = rng.choice(["DOWN", "ACTIVE", "INIT", "ARMED"])
        attributes = {"ib_device": f"mlx5_{gpu % 4}", "ib_port": "1", "ib_state": state}
        message = f"mlx5_core 0000:c1:00.0 mlx5_{gpu % 4}: Port 1 Link {state}"
    return uuid_, message, attributes


def schedule(seed: int, nodes: int, rate: float, duration_s: float) -> list[Arrival]:
    """A fixed arrival schedule at `rate` events/s (Poisson-free: evenly spaced) with the event mix.

    New faults land on random nodes; most repeat within the dedupe window (duplicates); a few
    nodes' IB ports flap until the flap detector quarantines the node.
    """
    rng = random.Random(seed)
    total = max(1, int(rate * duration_s))
    weights = [m[0] for m in MIX]
    flapping = rng.sample(range(nodes), max(1, int(nodes * FLAPPING_NODE_FRACTION)))
    out: list[Arrival] = []
    repeats: list[tuple[int, str, health.EventKind, int | None, int]] = []  # faults still to repeat
    for i in range(total):
        offset = i / rate
        roll = rng.random()
        if roll < 0.02:
            node = rng.choice(flapping)
            state = "DOWN" if rng.random() < 0.5 else "ACTIVE"
            attrs = {"ib_device": "mlx5_0", "ib_port": "1", "ib_state": state}
            out.append(Arrival(offset, node_name(node), health.EventKind.IB_LINK_STATE, "", None,
                               f"mlx5_core 0000:c1:00.0 mlx5_0: Port 1 Link {state}", attrs, "ib_flap"))  # fmt: skip
            continue
        if repeats and roll < 0.45:
            node, label, kind, xid, gpu = repeats.pop(rng.randrange(len(repeats)))
        else:
            _w, label, kind, xid, _gpu_level, times = rng.choices(MIX, weights)[0]
            node, gpu = rng.randrange(nodes), rng.randrange(GPUS_PER_NODE)
            repeats.extend([(node, label, kind, xid, gpu)] * (times - 1))
        uuid_, message, attrs = _fault(rng, node, label, kind, xid, gpu)
        out.append(Arrival(offset, node_name(node), kind, uuid_, xid, message, attrs, label))
    return out


def stored(arrival: Arrival, seq: int, received_unix_ns: int) -> repo.StoredEvent:
    """The event as wire validation leaves it (`wire.events_from_wire`; every node's spool in epoch 0)."""
    return repo.StoredEvent(
        node_id=arrival.node_id, seq=seq, observed_unix_ns=received_unix_ns - 2_000_000,
        received_unix_ns=received_unix_ns, kind=int(arrival.kind),
        severity=int(health.Severity.ERROR if arrival.kind is not health.EventKind.IB_LINK_STATE
                     else health.Severity.WARNING),
        gpu_uuid=arrival.gpu_uuid, xid=arrival.xid, message=arrival.message, source="kmsg",
        attributes=arrival.attributes, spool_epoch=0,
    )  # fmt: skip


def _cpu_s(rig: Rig) -> float:
    """CPU seconds of this process and of its commit writer process, if it has one."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    writer_pid = rig.writer.pid if rig.writer is not None else None
    writer_s = _proc_cpu_s(pathlib.Path(f"/proc/{writer_pid}")) if writer_pid is not None else 0.0
    return usage.ru_utime + usage.ru_stime + writer_s


def _postgres_cpu_s() -> float:
    """CPU seconds of every live process named postgres (the server and its backends), from /proc."""
    return sum(_proc_cpu_s(proc) for proc in pathlib.Path("/proc").iterdir() if _proc_named(proc, "postgres"))


def _proc_named(proc: pathlib.Path, prefix: str) -> bool:
    with contextlib.suppress(OSError):
        stat = (proc / "stat").read_text()
        return proc.name.isdigit() and stat[stat.index("(") + 1 : stat.rindex(")")].startswith(prefix)
    return False


def _proc_cpu_s(proc: pathlib.Path) -> float:
    """User + system CPU seconds of a live process (/proc/PID), 0 if it is gone."""
    with contextlib.suppress(OSError):
        stat = (proc / "stat").read_text()
        fields = stat[stat.rindex(")") + 2 :].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return 0.0


def _pct(values: list[float], q: float) -> float:
    """Nearest-rank percentile (inf entries, events cut off, sort last)."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


@contextlib.contextmanager
def fake_api_server(nodes: int, latency_ms: float, tmp: str) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    """The fake Kubernetes API server of tests/fakes/kube_api.py in a process of its own; yields its URL and process."""
    names = pathlib.Path(tmp) / f"nodes-{uuid.uuid4().hex[:8]}.txt"
    names.write_text("".join(f"{node_name(i)}\n" for i in range(nodes)))
    server = subprocess.Popen(
        [sys.executable, str(KUBE_API), "--nodes", str(names), "--gpus", str(GPUS_PER_NODE),
         "--latency-ms", str(latency_ms)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert server.stdout is not None and server.stdin is not None
        url = server.stdout.readline().strip()
        if not url.startswith("http://"):
            raise RuntimeError(f"the fake API server did not start: {url!r}")
        yield url, server
    finally:
        if server.stdin is not None:
            server.stdin.close()
        server.wait(timeout=30)


class WaitingQuarantine(quarantine.RecordOnlyQuarantine):
    """`--quarantine waiting`: each call waits as a scheduler's API would, a read and a patch, using no CPU.

    The Kubernetes path's shape (a call in an adapter thread once its decision is durable, the repair
    held until it returns, its outcome committed by a later pass) without the client's and the API
    server's CPU on this machine's cores: what is left between it and the record adapter is the path's
    structure. A diagnostic: rasd never runs it.
    """

    blocking = True

    def __init__(self, api_latency_ms: float) -> None:
        super().__init__()
        self._wait_s = 2 * api_latency_ms / 1000

    def _quarantine(self, scope: str, node_id: str, target: str, reason: str, ticket_id: str) -> Any:
        time.sleep(self._wait_s)
        return super()._quarantine(scope, node_id, target, reason, ticket_id)

    def _release(self, scope: str, node_id: str, target: str, reason: str, ticket_id: str) -> Any:
        time.sleep(self._wait_s)
        return super()._release(scope, node_id, target, reason, ticket_id)


@contextlib.contextmanager
def children_log_to_devnull() -> Iterator[None]:
    """Helper processes started inside inherit /dev/null as their stderr, as this process's logs go there.

    The Kubernetes adapter's child logs each call it carries out; the bench measures that, not reads it.
    """
    saved = os.dup(2)
    with open(os.devnull, "w") as devnull:
        os.dup2(devnull.fileno(), 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


@contextlib.contextmanager
def kubernetes_adapter(
    nodes: int, latency_ms: float, tmp: str, *, own_process: bool = True
) -> Iterator[tuple[dict, pathlib.Path, pathlib.Path | None]]:
    """Quarantine executors through the Kubernetes adapter and a fake API server process.

    Yields them, the server's /proc and the adapter's own process's /proc (None: it runs in this one).
    """
    with fake_api_server(nodes, latency_ms, tmp) as (url, server):
        # As rasd-controller builds it from its [quarantine] table.
        adapter = quarantine.open_quarantine(
            {"adapter": "kubernetes", "kubernetes": {"host": url, "request_timeout_s": 30, "own_process": own_process}}
        )
        start = getattr(adapter, "start", None)
        if start is not None:
            with children_log_to_devnull():
                start()  # as rasd-controller's first node sync does: the child is up before the storm
        pid = getattr(adapter, "pid", None)
        try:
            yield (
                dict(quarantine.executors(adapter)),
                pathlib.Path(f"/proc/{server.pid}"),
                pathlib.Path(f"/proc/{pid}") if pid is not None else None,
            )
        finally:
            adapter.close()


@contextlib.contextmanager
def database(backend: str, tmp: str, *, pg_settings: str = "") -> Iterator[str]:
    """A URL of an empty database: a SQLite file, or a fresh PostgreSQL schema (dropped afterwards).

    pg_settings: more server settings for the URL's sessions, as in ``-c name=value`` (a diagnostic).
    """
    if backend == "sqlite":
        yield f"sqlite:///{tmp}/bench-{uuid.uuid4().hex[:8]}.db"
        return
    server = os.environ["RASD_TEST_POSTGRES_URL"]
    schema = f"rasd_bench_{uuid.uuid4().hex[:12]}"
    admin = sa.create_engine(server, poolclass=sa.pool.NullPool)
    with admin.begin() as connection:
        connection.execute(sa.text(f'CREATE SCHEMA "{schema}"'))
    try:
        url = sa.engine.make_url(server)
        options = f"-csearch_path={schema}" + (f" {pg_settings}" if pg_settings else "")
        yield url.update_query_dict({"options": options}).render_as_string(hide_password=False)
    finally:
        with admin.begin() as connection:
            connection.execute(sa.text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()


class Rig:
    """A real Store, Ingest and RemediationService on one database, with the nodes registered."""

    def __init__(self, url: str, nodes: int, *, commit_writer: str = "process", executors: dict | None = None) -> None:
        """Open the store and register `nodes` nodes (not timed).

        commit_writer: "process" (a `CommitProcess`, as `rasd-controller` runs) or "thread".
        executors: the controller-side adapters (None: none, the quarantines are recorded only).
        """
        self.store = repo.Store.open(url)
        policy = policy_mod.RemediationPolicy.from_mapping(POLICY)
        self.writer = store_writer.CommitProcess(url) if commit_writer == "process" else None
        self.wired: Any = None
        """The services as `rasd.controller.wiring` builds them (None: a tree before it, wired here)."""
        if wiring is not None:  # as rasd-controller wires them (one replica)
            ladder = wiring.Ladder(policy=policy, executors=executors or {}, writer=self.writer)
            registry = metrics.ControllerMetrics(CollectorRegistry())
            self.wired = wiring.single_replica(self.store, registry, ladder=ladder)
            self.ingest, self.service = self.wired.ingest, self.wired.remediation
            self._store_events = self.wired.event_log.append
        else:
            self._wire_before_the_split(policy, executors)
        now = time.time_ns()
        self.hellos = [hello(i) for i in range(nodes)]
        for node_hello in self.hellos:
            self.store.register_hello(node_hello, now)
            self.ingest.node_labels[node_hello.node_id] = dict(node_hello.labels)  # what open_session records
        self.seq: dict[str, int] = {}
        """Node → the seq of its last event sent through the ingest (its spool's)."""
        self.unstored_seq: dict[str, int] = {}
        """Node → the seq of its last event decided without the ingest (``decide``): from 10⁹ on, so
        that the spool's own seqs stay gap-free for the ingest."""
        self.collector: Any = None
        """The quiet collector (`gc_policy.QuietCollector`) once started."""
        self.commands_sent = 0
        self._stream_writers: list[asyncio.Task[None]] = []
        self._streams: dict[str, asyncio.Lock] = {}
        """Node → its stream's reader: one message of a node at a time (`deliver`)."""

    def _wire_before_the_split(self, policy: policy_mod.RemediationPolicy, executors: dict | None) -> None:
        """A tree before `rasd.controller.wiring` (remediation_ab.py --bench this): hooks assigned, as it did."""
        self.ingest = ingest_mod.Ingest(self.store, metrics.ControllerMetrics(CollectorRegistry()))
        self.service = remediation_mod.RemediationService(self.store, self.ingest, policy=policy, executors=executors)
        if self.writer is not None:
            self.service.use_writer(self.writer)
        self.ingest.events_hook = self.service.on_events
        if hasattr(self.service, "on_arrivals"):  # a tree before it: none
            self.ingest.arrivals_hook = self.service.on_arrivals
        self._store_events = self.ingest.store_events

    async def start(self) -> None:
        """Start the ingest and the service (its tick loop runs during the measurement, as in production).

        Then freeze the start-up heap, as `rasd-controller` does once it has started (rasd.common.gc_policy).
        """
        await self.ingest.start()
        # A tree before Session.acked_seq (remediation_ab.py --bench this) has none.
        fields = {f.name for f in dataclasses.fields(ingest_mod.Session)}
        position = {"acked_seq": 0} if "acked_seq" in fields else {}
        for node_hello in self.hellos:
            node_id = node_hello.node_id
            session = ingest_mod.Session(
                session_id=uuid.uuid4().hex,
                node_id=node_id,
                known_gpus=frozenset(g.uuid for g in node_hello.gpus),
                outbound=asyncio.Queue(maxsize=self.ingest.settings.outbound_queue_size),
                opened_unix_ns=time.time_ns(),
                spool_epoch=0,  # what open_session leaves for a node's first Hello
                **position,
            )
            self.ingest.sessions[node_id] = session
            self._stream_writers.append(asyncio.create_task(self._write(session)))
        await self.service.start()
        gc_policy.freeze_startup_heap()
        # A tree before the quiet collector (remediation_ab.py --bench this): the thresholds alone.
        collector = getattr(gc_policy, "QuietCollector", None)
        if collector is not None and hasattr(type(self.service), "quiet"):
            service = self.service
            self.collector = collector(lambda: service.quiet)
            self.collector.start()

    async def _write(self, session: ingest_mod.Session) -> None:
        """The stream's writer, up to the socket: take each message and serialize it."""
        while (message := await session.outbound.get()) is not None:
            message.SerializeToString()
            self.commands_sent += 1

    async def stop(self) -> None:
        """Stop both and close the store."""
        if self.collector is not None:
            await self.collector.stop()
        await self.service.stop()
        for writer in self._stream_writers:
            writer.cancel()
        await asyncio.gather(*self._stream_writers, return_exceptions=True)
        await self.ingest.stop()
        if self.wired is not None:
            self.wired.thread.close()
        if self.writer is not None:
            self.writer.close()
        self.store.close()

    async def deliver(self, arrival: Arrival, received_unix_ns: int, *, path: str) -> None:
        """Hand one event to the controller by path (`PATHS`), after the node's earlier events.

        A node's events come over its one stream, which the controller reads a message at a time,
        the next once the last is decided (`Ingest.take_events`): an event that arrives while its
        node's last one is still being decided waits for it (its latency counts from its arrival).
        """
        lock = self._streams.setdefault(arrival.node_id, asyncio.Lock())
        async with lock:
            await self._deliver(arrival, received_unix_ns, path=path)

    async def _deliver(self, arrival: Arrival, received_unix_ns: int, *, path: str) -> None:
        node_id = arrival.node_id
        if path == "decide":
            seq = self.unstored_seq.get(node_id, 10**9) + 1
            self.unstored_seq[node_id] = seq
            event = stored(arrival, seq, received_unix_ns)
            await self.service.on_events(node_id, [event], self.ingest.node_labels[node_id])
            return
        seq = self.seq.get(node_id, 0) + 1
        self.seq[node_id] = seq
        event = stored(arrival, seq, received_unix_ns)
        if path == "ingest":
            session = self.ingest.sessions[node_id]
            if hasattr(self.ingest, "take_events"):
                await self.ingest.take_events(session, [event], started=time.perf_counter())
            else:
                await _take_events_before(self.ingest, session, [event])
            return
        _acked, new = await self._store_events(node_id, [event])  # "store-then-decide"
        if new:
            await self.service.on_events(node_id, [event], self.ingest.node_labels[node_id])


async def _take_events_before(ingest: ingest_mod.Ingest, session: ingest_mod.Session, events: list) -> None:
    """`Ingest.on_events` after wire validation in a tree before `Ingest.take_events` (2026-12-03).

    For `remediation_ab.py --bench this` against such a base: its own on_events, step by step
    (store and hand over, count and log each event, queue the ack, wait for the decision).
    """
    acked_seq, decided = await asyncio.shield(asyncio.ensure_future(ingest._store_and_hand_over(session, events)))
    for event in events:
        kind = health_pb.EventKind.Name(event.kind)
        ingest.metrics.health_events.labels(kind=kind).inc()
        ingest_mod.log.info(
            "health_event_received", node=session.node_id, seq=event.seq, kind=kind, gpu_uuid=event.gpu_uuid,
            xid=event.xid, message=event.message[:200],
        )  # fmt: skip
    await session.outbound.put(agent_pb.ControllerMessage(ack=agent_pb.EventAck(acked_seq=acked_seq)))
    if decided is not None:
        await decided


@dataclasses.dataclass
class Row:
    """One measured backend."""

    backend: str
    nodes: int
    phase: str = ""
    writer: str = "process"
    """Where the commits ran: "process" (a `CommitProcess`) or "thread" (the store thread)."""
    round: int = 1
    """Which of the --repeat rounds measured it (each on a fresh database)."""
    throughput_events: int = 0
    throughput_wall_s: float = 0.0
    throughput_cpu_s: float = 0.0
    throughput_db_cpu_s: float | None = None
    burst_offered: int = 0
    burst_rate: float = 0.0
    burst_done: int = 0
    burst_wall_s: float = 0.0
    burst_cpu_s: float = 0.0
    burst_db_cpu_s: float | None = None
    decision_ms: list[float] = dataclasses.field(default_factory=list)
    decision_ms_by_kind: dict[str, list[float]] = dataclasses.field(default_factory=dict)
    commit_ms: list[float] = dataclasses.field(default_factory=list)
    """How long each remediation transaction of the burst took the store (`RemediationStats.commit_s`)."""
    return_ms: list[float] = dataclasses.field(default_factory=list)
    max_backlog: int = 0
    dispatched: dict[str, int] = dataclasses.field(default_factory=dict)
    deferred_left: int = 0
    policy_held: int = 0
    """Actions of events the blast-radius policy held back: not in decision_ms (`RemediationStats.policy_held_s`)."""
    commands_sent: int = 0
    """Agent commands the burst queued on the nodes' streams (and their writers serialized)."""
    drained: bool = True
    doc_bytes: dict[str, int] = dataclasses.field(default_factory=dict)
    undone_bound_ms: float = float("inf")
    """Events still waiting when the drain timed out had waited at least this long (inf: none)."""
    loop_cpu_s: float = 0.0
    """CPU seconds of the event loop's thread (the decider's) during the burst: how busy it was."""
    gc_pauses_ms: list[float] = dataclasses.field(default_factory=list)
    """Every pause of this process for the garbage collector during the burst (its drain included)."""
    gc_quiet: int | None = None
    """How many of them the quiet collector ran (None: a tree without one)."""
    adapters_unsettled: int = 0
    """Adapter calls (and the repairs waiting for them) not done when the burst's drain timeout ended."""
    api_cpu_s: float | None = None
    """CPU seconds of the fake Kubernetes API server during the burst (``--quarantine kubernetes``)."""
    adapter_cpu_s: float | None = None
    """CPU seconds of the Kubernetes adapter's own process during the burst (``KubernetesProcess``)."""
    events_stored: int | None = None
    """Burst events the ingest stored (None: the path stores none, or a tree without the count)."""
    events_stored_with_decision: int | None = None
    """Of those, stored in the transaction of the decision on them (`Ingest.events_stored_with_decision`)."""

    def censored(self, values: list[float], fraction: float) -> list[float]:
        """values plus +inf for the events not done (times `fraction`: the share of them it would hold)."""
        missing = round((self.burst_offered - self.burst_done) * fraction)
        return values + [float("inf")] * missing

    def percentile(self, values: list[float], q: float, fraction: float = 1.0) -> str:
        """The q-th percentile in ms; "≥ N" when it falls on an event the drain timeout cut off."""
        value = _pct(self.censored(values, fraction), q)
        return f"≥ {self.undone_bound_ms:,.0f} (cut off)" if value == float("inf") else f"{value:,.1f}"

    @property
    def decision_share(self) -> float:
        """Dispatching decisions per finished burst event (applied to the events not finished)."""
        return len(self.decision_ms) / max(1, self.burst_done)


async def throughput(rig: Rig, arrivals: list[Arrival], seconds: float, row: Row, *, path: str) -> None:
    """Feed events back to back for `seconds` (or until the list ends) and count them."""
    cpu0, db0, wall0 = _cpu_s(rig), _db_cpu(row.backend), time.perf_counter()
    done = 0
    for arrival in arrivals:
        await rig.deliver(arrival, time.time_ns(), path=path)
        done += 1
        if time.perf_counter() - wall0 >= seconds:
            break
    row.throughput_wall_s = time.perf_counter() - wall0
    row.throughput_cpu_s = _cpu_s(rig) - cpu0
    row.throughput_db_cpu_s = _db_delta(row.backend, db0)
    row.throughput_events = done


class _GcPauses:
    """Times every collection of this process from now until `stop()`."""

    def __init__(self) -> None:
        self.pauses_ms: list[float] = []
        self._started = 0.0
        gc.callbacks.append(self._timed)

    def _timed(self, phase: str, _info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.pauses_ms.append((time.perf_counter() - self._started) * 1000)

    def stop(self) -> list[float]:
        """Stop timing; the pauses timed, in ms."""
        gc.callbacks.remove(self._timed)
        return self.pauses_ms


async def burst(rig: Rig, arrivals: list[Arrival], rate: float, drain_timeout_s: float, row: Row, *, path: str) -> None:
    """Release each event at its scheduled time as its own task; wait for all to finish."""
    pending: set[asyncio.Task[None]] = set()
    return_s: list[float] = []

    async def one(arrival: Arrival, due_ns: int) -> None:
        await rig.deliver(arrival, due_ns, path=path)
        return_s.append((time.time_ns() - due_ns) / 1e9)

    stats = rig.service.stats
    commit_s, policy_held_s = _cleared(stats)
    pauses = _GcPauses()
    loop_cpu0 = time.thread_time()  # this coroutine runs on the event loop's thread
    quiet_before = sum(rig.collector.collections) if rig.collector is not None else None
    kinds_before = dict(rig.service.stats.actions_by_kind)
    stored_before = rig.ingest.events_stored
    with_decision_before = getattr(rig.ingest, "events_stored_with_decision", None)
    sent_before = rig.commands_sent
    cpu0, db0 = _cpu_s(rig), _db_cpu(row.backend)
    start_ns = time.time_ns() + 50_000_000
    index = 0
    while index < len(arrivals):
        now_ns = time.time_ns()
        while index < len(arrivals) and start_ns + int(arrivals[index].offset_s * 1e9) <= now_ns:
            due = start_ns + int(arrivals[index].offset_s * 1e9)
            task = asyncio.create_task(one(arrivals[index], due))
            pending.add(task)
            task.add_done_callback(pending.discard)
            index += 1
        row.max_backlog = max(row.max_backlog, len(pending))
        await asyncio.sleep(0.002)
    undone_bound_ms = float("inf")
    if pending:
        _done, still = await asyncio.wait(set(pending), timeout=drain_timeout_s)
        row.drained = not still
        if still:
            last_due_ns = start_ns + int(arrivals[-1].offset_s * 1e9)
            undone_bound_ms = (time.time_ns() - last_due_ns) / 1e6
        for task in still:
            task.cancel()
        await asyncio.gather(*still, return_exceptions=True)
    # Quarantines are timed as their adapter is called and repairs as they leave after them: both
    # can come after the event's call returned.
    settle_by = time.monotonic() + drain_timeout_s
    # A service before 6f3efaf (remediation_ab.py --bench this) called its adapters in the round: none pending.
    busy = getattr(type(rig.service), "adapters_busy", None)
    while busy is not None and busy.fget(rig.service) and time.monotonic() < settle_by:
        await asyncio.sleep(0.005)
    row.adapters_unsettled = busy.fget(rig.service) if busy is not None else 0
    row.gc_pauses_ms = pauses.stop()
    row.loop_cpu_s = time.thread_time() - loop_cpu0
    if quiet_before is not None and rig.collector is not None:
        row.gc_quiet = sum(rig.collector.collections) - quiet_before
    row.burst_wall_s = (time.time_ns() - start_ns) / 1e9
    row.burst_cpu_s = _cpu_s(rig) - cpu0
    row.burst_db_cpu_s = _db_delta(row.backend, db0)
    row.burst_offered, row.burst_rate, row.burst_done = len(arrivals), rate, len(return_s)
    row.return_ms = [1000 * s for s in return_s]
    row.decision_ms = [1000 * s for s in stats.decision_latency_s]
    row.commit_ms = [1000 * s for s in commit_s or ()]
    row.policy_held = len(policy_held_s or ())
    for kind, seconds in zip(stats.decision_latency_kinds, stats.decision_latency_s, strict=True):
        row.decision_ms_by_kind.setdefault(kind, []).append(1000 * seconds)
    row.undone_bound_ms = undone_bound_ms
    row.dispatched = {
        kind: count - kinds_before.get(kind, 0)
        for kind, count in rig.service.stats.actions_by_kind.items()
        if count > kinds_before.get(kind, 0)
    }
    row.commands_sent = rig.commands_sent - sent_before
    if path != "decide":
        row.events_stored = rig.ingest.events_stored - stored_before
        if with_decision_before is not None:
            row.events_stored_with_decision = rig.ingest.events_stored_with_decision - with_decision_before
    # A read-only look at what still waits (the shared state since the split; the service's before it).
    shared = getattr(rig.service, "state", None)
    row.deferred_left = len(shared.deferred if shared is not None else rig.service._deferred)


def _cleared(stats: Any) -> tuple[Any, Any]:
    """Empty the service's timings (bounded deques: this run's entries alone); its (commit_s, policy_held_s).

    None for one the service does not have (`remediation_ab.py --bench this` runs older trees).
    """
    stats.decision_latency_s.clear()
    stats.decision_latency_kinds.clear()
    kept = (getattr(stats, "commit_s", None), getattr(stats, "policy_held_s", None))
    for timings in kept:
        if timings is not None:
            timings.clear()
    return kept


def _db_cpu(backend: str) -> float | None:
    return _postgres_cpu_s() if backend == "postgresql" else None


def _db_delta(backend: str, before: float | None) -> float | None:
    after = _db_cpu(backend)
    return None if after is None or before is None else after - before


async def measure(
    backend: str, writer: str, args: argparse.Namespace, tmp: str, profiler: cProfile.Profile | None, round_: int
) -> tuple[list[Row], list[Row]]:
    """Throughput (the decision path alone, then the ingest's), a light paced run, then the burst, on one database.

    Every node is registered first (not timed). Later phases start with the earlier phases'
    incidents and tickets open, as a controller that has been running would.
    """
    feeds: list[Row] = []
    bursts: list[Row] = []
    with contextlib.ExitStack() as stack:
        no_flush_wait = "-csynchronous_commit=off" if args.pg_no_flush_wait else ""
        url = stack.enter_context(database(backend, tmp, pg_settings=no_flush_wait))
        executors, api_proc, adapter_proc = None, None, None
        if args.quarantine == "kubernetes":
            executors, api_proc, adapter_proc = stack.enter_context(
                kubernetes_adapter(args.nodes, args.api_latency_ms, tmp, own_process=not args.kubernetes_in_process)
            )
            if args.aside_cpu is not None:
                for proc in (api_proc, adapter_proc):
                    if proc is not None:
                        os.sched_setaffinity(int(proc.name), {args.aside_cpu})
        elif args.quarantine == "record":
            executors = dict(quarantine.executors(quarantine.open_quarantine({})))  # rasd-controller's default
        elif args.quarantine == "waiting":
            executors = dict(quarantine.executors(WaitingQuarantine(args.api_latency_ms)))
        # Built before the start: frozen with the start-up heap (the load generator's, not the controller's).
        events = schedule(args.seed + 1, args.nodes, 2000.0, args.throughput_s * 8 + 1)
        paced = schedule(args.seed + 2, args.nodes, args.light_rate, args.duration_s)
        arrivals = schedule(args.seed, args.nodes, args.rate, args.duration_s)
        rig = Rig(url, args.nodes, commit_writer=writer, executors=executors)
        await rig.start()
        try:
            half = len(events) // 2
            for path, chunk in (("decide", events[:half]), ("ingest", events[half:])):
                row = Row(backend, args.nodes, PATHS[path], writer, round_)
                await throughput(rig, chunk, args.throughput_s, row, path=path)
                feeds.append(row)
            light = Row(backend, args.nodes, f"paced {args.light_rate:g}/s ({PATHS[args.path]})", writer, round_)
            await burst(rig, paced, args.light_rate, args.drain_timeout_s, light, path=args.path)
            heavy = Row(backend, args.nodes, f"burst {args.rate:,.0f}/s ({PATHS[args.path]})", writer, round_)
            store_profiler = cProfile.Profile() if profiler is not None else None
            if profiler is not None and store_profiler is not None:
                await rig.ingest.store_calls.run_in_store(store_profiler.enable)  # the store thread has its own profile
                profiler.enable()
            api_cpu0 = _proc_cpu_s(api_proc) if api_proc is not None else None
            adapter_cpu0 = _proc_cpu_s(adapter_proc) if adapter_proc is not None else None
            await burst(rig, arrivals, args.rate, args.drain_timeout_s, heavy, path=args.path)
            if api_proc is not None and api_cpu0 is not None:
                heavy.api_cpu_s = _proc_cpu_s(api_proc) - api_cpu0
            if adapter_proc is not None and adapter_cpu0 is not None:
                heavy.adapter_cpu_s = _proc_cpu_s(adapter_proc) - adapter_cpu0
            if profiler is not None and store_profiler is not None:
                profiler.disable()
                await rig.ingest.store_calls.run_in_store(store_profiler.disable)
                store_profiler.dump_stats(f"{args.profile}.store")
            heavy.doc_bytes = {
                "correlation": len(json.dumps(rig.service.correlation.to_dict())),  # in memory; stored per scope
                "budget": len(json.dumps(rig.service.budget.to_dict())),
                "open incidents": len(rig.service.correlation.open_incidents()),
            }
            bursts += [light, heavy]
        finally:
            await rig.stop()
    return feeds, bursts


def _fmt(value: float | None, spec: str = ".1f") -> str:
    return "–" if value is None else format(value, spec)


def _commit_spread(row: Row) -> str:
    """The store's commit time in the burst, p50/p99/max ms ("–" when not measured)."""
    ms = row.commit_ms
    return f"{_pct(ms, 50):,.1f}/{_pct(ms, 99):,.1f}/{max(ms):,.1f}" if ms else "–"


def table(feeds: list[Row], bursts: list[Row]) -> str:
    """The markdown tables for RESULTS.md and stdout."""
    lines = [
        "Sustained throughput (events fed back to back, one per call):",
        "",
        "| round | backend | commits | path | events | wall s | events/s | ms/event | CPU s (controller) "
        "| CPU s (PostgreSQL) |",
        "|---:|---|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in feeds:
        lines.append(
            f"| {r.round} | {r.backend} | {r.writer} | {r.phase} | {r.throughput_events:,} | "
            f"{r.throughput_wall_s:.1f} | "
            f"{r.throughput_events / max(r.throughput_wall_s, 1e-9):,.0f} | "
            f"{1000 * r.throughput_wall_s / max(r.throughput_events, 1):.1f} | {r.throughput_cpu_s:.1f} | "
            f"{_fmt(r.throughput_db_cpu_s)} |"
        )
    lines += [
        "",
        "Scheduled arrivals (latency from the scheduled arrival; events still queued when the drain timeout "
        "ends are counted as cut off, at least that old):",
        "",
        "| round | backend | commits | run | offered | done | events/s achieved | decision p50 ms "
        "| decision p99 ms | decisions | arrival→return p50 ms | arrival→return p99 ms | max in flight "
        "| transactions | commit p50/p99/max ms | CPU s (controller) | CPU s (PostgreSQL) |",
        "|---:|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in bursts:
        lines.append(
            f"| {r.round} | {r.backend} | {r.writer} | {r.phase} | {r.burst_offered:,} | {r.burst_done:,}"
            f"{'' if r.drained else ' (drain timed out)'} | {r.burst_done / max(r.burst_wall_s, 1e-9):,.0f} | "
            f"{r.percentile(r.decision_ms, 50, r.decision_share)} | "
            f"{r.percentile(r.decision_ms, 99, r.decision_share)} | {len(r.decision_ms):,} | "
            f"{r.percentile(r.return_ms, 50)} | {r.percentile(r.return_ms, 99)} | "
            f"{r.max_backlog:,} | {len(r.commit_ms):,} | {_commit_spread(r)} | {r.burst_cpu_s:.1f} | "
            f"{_fmt(r.burst_db_cpu_s)} |"
        )
    lines.append("")
    for r in bursts:
        if not r.doc_bytes:
            continue
        kinds = ", ".join(f"{k} {v:,}" for k, v in sorted(r.dispatched.items()))
        by_kind = "; ".join(
            f"{kind} {_pct(ms, 50):,.1f}/{_pct(ms, 99):,.1f}"
            for kind, ms in sorted(r.decision_ms_by_kind.items(), key=lambda item: -len(item[1]))
        )
        lines.append(
            f"- round {r.round}, {r.backend}, commits in a {r.writer}: burst dispatched {kinds or 'nothing'} "
            f"(agent commands written to streams: {r.commands_sent:,}); "
            f"still deferred at the end: {r.deferred_left}; actions held by the blast-radius policy (not in the "
            f"decision figures): {r.policy_held}; adapter calls unsettled: {r.adapters_unsettled}; "
            f"state after the burst: {r.doc_bytes.get('open incidents', 0):,} open incidents, correlation "
            f"state {r.doc_bytes.get('correlation', 0):,} bytes in all (stored as one id list per scope, written "
            "when an incident opens or expires, and each changed incident's row), budget document "
            f"{r.doc_bytes.get('budget', 0):,} bytes (written only when it changed); "
            f"decision p50/p99 ms by command: {by_kind or 'none'} (a reset or reboot follows its quarantine: "
            "both are dispatched in the decision's own commit; with an adapter that waits on another system, the "
            "repair leaves once that adapter has returned)"
            + ("" if r.api_cpu_s is None else f"; the fake API server's CPU in the burst: {r.api_cpu_s:.1f} s")
            + (
                ""
                if r.adapter_cpu_s is None
                else f"; the Kubernetes adapter process's CPU in the burst: {r.adapter_cpu_s:.1f} s"
            )
            + (
                ""
                if r.events_stored is None
                else f"; events stored {r.events_stored:,}"
                + (
                    ""
                    if r.events_stored_with_decision is None
                    else f", {r.events_stored_with_decision:,} of them in the transaction of their decision"
                )
            )
            + f"; the event loop's thread was busy {r.loop_cpu_s:.1f} s of the burst's {r.burst_wall_s:.1f} s"
            + f"; garbage collector: {_gc_pauses(r)}"
        )
    return "\n".join(lines)


def _gc_pauses(row: Row) -> str:
    """The collector's pauses in a burst, in words."""
    if not row.gc_pauses_ms:
        return "no pause in the burst"
    quiet = "" if row.gc_quiet is None else f", {row.gc_quiet} of them in quiet moments (no decision waiting)"
    return (
        f"{len(row.gc_pauses_ms)} pause(s) in the burst{quiet}, longest {max(row.gc_pauses_ms):.1f} ms, "
        f"{sum(row.gc_pauses_ms):.1f} ms in all"
    )


def goal_verdict(bursts: list[Row], backend: str, writer: str, rate: float) -> tuple[bool, str]:
    """Whether every round's burst on backend with writer met p99 ≤ GOAL_P99_MS, and a line saying so."""
    rows = [r for r in bursts if r.backend == backend and r.writer == writer and r.doc_bytes]
    if not rows:
        return False, f"{backend} (commits in a {writer}): not measured"
    met = [r.drained and _pct(r.censored(r.decision_ms, r.decision_share), 99) <= GOAL_P99_MS for r in rows]
    p99s = ", ".join(r.percentile(r.decision_ms, 99, r.decision_share) for r in rows)
    word = "met" if all(met) else "NOT met"
    # The slowest commit says how much of a round's tail was the database's: no decision of a pass
    # leaves before its commit, nor any of the passes queued behind it.
    slowest = ", ".join(f"{max(r.commit_ms):,.1f}" if r.commit_ms else "–" for r in rows)
    return all(met), (
        f"{backend} (commits in a {writer}): {word}, in {sum(met)} of {len(rows)} rounds "
        f"(p99 {p99s} ms; slowest commit {slowest} ms)"
    )


def _parser() -> argparse.ArgumentParser:
    """The command line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: 200 nodes, 200 events/s for 1 s")
    parser.add_argument("--nodes", type=int, default=2000)
    parser.add_argument("--rate", type=float, default=2000.0, help="burst events/s")
    parser.add_argument("--duration-s", type=float, default=5.0, help="burst length")
    parser.add_argument("--throughput-s", type=float, default=4.0, help="how long the back-to-back feed runs")
    parser.add_argument("--drain-timeout-s", type=float, default=15.0, help="then unfinished events are cut off")
    parser.add_argument("--seed", type=int, default=4)
    parser.add_argument("--light-rate", type=float, default=10.0, help="paced run well below capacity (events/s)")
    parser.add_argument(
        "--path",
        choices=tuple(PATHS),
        default="ingest",
        help="how the paced run's and the burst's events reach the controller: "
        + "; ".join(f"{name}: {text}" for name, text in PATHS.items()),
    )
    parser.add_argument("--backend", choices=("sqlite", "postgresql", "both"), default="both")
    parser.add_argument(
        "--commit-writer",
        choices=("process", "thread", "both"),
        default="both",
        help="where the commits run: a writer process (as rasd-controller runs), the store thread, or each in turn",
    )
    parser.add_argument("--log-level", default="info", help="the controller's log level (output to /dev/null)")
    parser.add_argument("--profile", help="cProfile the SQLite burst into this file and print the top functions")
    parser.add_argument(
        "--repeat",
        type=int,
        default=3,
        help="rounds of every measurement, interleaved (the machine's speed drifts; one run can mislead)",
    )
    parser.add_argument(
        "--quarantine",
        choices=("record", "kubernetes", "none", "waiting"),
        default="record",
        help="the quarantine adapter: record (rasd-controller's default), kubernetes (against a fake API server), "
        "none (no adapter call at all), or waiting (diagnostic: each call sleeps a read's and a patch's "
        "--api-latency-ms in an adapter thread, then records)",
    )
    parser.add_argument(
        "--api-latency-ms",
        type=float,
        default=5.0,
        help="with --quarantine kubernetes: added to every API answer (waiting: waits twice this per call)",
    )
    parser.add_argument(
        "--kubernetes-in-process",
        action="store_true",
        help="with --quarantine kubernetes: the client in the controller's process (own_process = false), to compare",
    )
    parser.add_argument(
        "--pg-no-flush-wait",
        action="store_true",
        help="diagnostic, never how rasd runs: PostgreSQL commits return before their WAL is flushed "
        "(synchronous_commit=off), to show what the disk's flush costs; results go to their own section",
    )
    parser.add_argument(
        "--decider-cpu",
        type=int,
        help="pin this process (the decider, the load generator) and its commit writer to this CPU (as `taskset -c N`)",
    )
    parser.add_argument(
        "--aside-cpu",
        type=int,
        help="with --quarantine kubernetes: pin the adapter's own process and the fake API server to this CPU "
        "(in production they run beside the decider, not on its core; the API server on other machines)",
    )
    parser.add_argument("--no-write", action="store_true", help="print only; leave RESULTS.md alone")
    return parser


def _run_rounds(args: argparse.Namespace, backends: list[str], writers: list[str]) -> tuple[list[Row], list[Row]]:
    """Every measurement of every round, interleaved; the throughput feeds and the bursts."""
    default_switch_interval_s = sys.getswitchinterval()
    profiled = ("sqlite", writers[0])
    real_stderr = sys.stderr
    feeds: list[Row] = []
    bursts: list[Row] = []
    profiler = cProfile.Profile() if args.profile else None
    with tempfile.TemporaryDirectory() as tmp, open(os.devnull, "w") as devnull:
        # Rounds interleave the backends and writers, so a drift in the machine's speed touches each alike.
        plan = [(r, b, w) for r in range(1, args.repeat + 1) for b in backends for w in writers]
        for round_, backend, writer in plan:
            sys.stderr = devnull
            # Each measurement starts as its own controller would: a writer process shortens the
            # switch interval when it starts (rasd.controller.store.writer), the store thread does not.
            sys.setswitchinterval(default_switch_interval_s)
            try:
                backend_feeds, backend_bursts = asyncio.run(
                    measure(
                        backend,
                        writer,
                        args,
                        tmp,
                        profiler if (round_, backend, writer) == (1, *profiled) else None,
                        round_,
                    )
                )
                feeds += backend_feeds
                bursts += backend_bursts
            finally:
                sys.stderr = real_stderr
    if profiler is not None:
        profiler.dump_stats(args.profile)
        for path in (args.profile, f"{args.profile}.store"):
            print(f"--- {path} (top by internal time)")
            pstats.Stats(path).sort_stats("tottime").print_stats(25)
    return feeds, bursts


def _report(
    args: argparse.Namespace,
    argv: list[str] | None,
    rounds: tuple[list[Row], list[Row]],
    backends: list[str],
    writers: list[str],
    started: str,
    header: str,
) -> tuple[str, str, bool]:
    """The results section's title and text, and whether the goal was met; header: the machine, read at the start."""
    feeds, bursts = rounds
    load_end = os.getloadavg()[0]  # the machine is shared: the load says what else ran
    body = table(feeds, bursts)
    verdicts = [goal_verdict(bursts, backend, writer, args.rate) for backend in backends for writer in writers]
    met = verdicts[0][0]  # the goal's own case: SQLite (the embedded default), rasd-controller's writer
    argv_text = " ".join(sys.argv[1:] if argv is None else argv)
    verdict = f"Goal: decision latency p99 ≤ {GOAL_P99_MS:g} ms at {args.rate:,.0f} events/s:\n" + "\n".join(
        f"- {text}" for _met, text in verdicts
    )
    section = {"kubernetes": KUBERNETES_SECTION, "waiting": WAITING_SECTION}.get(args.quarantine, SECTION)
    if args.pg_no_flush_wait:
        section = f"{section}, PostgreSQL without waiting for the WAL flush (diagnostic)"
    adapters = {
        "record": "Quarantines go through `RecordOnlyQuarantine`, rasd-controller's default adapter (its calls "
        "wait on nothing: made with the decision, in its transaction, the repair that follows dispatched in it too).",
        "none": "Quarantines call no adapter (`--quarantine none`): each is its record.",
        "waiting": "Quarantines and releases go through `WaitingQuarantine` (`--quarantine waiting`, a diagnostic): "
        f"each call waits {2 * args.api_latency_ms:g} ms in an adapter thread, as a scheduler's read and patch "
        "would, using no CPU, then records; called, held and settled as the Kubernetes adapter is.",
        "kubernetes": "Quarantines go through `KubernetesQuarantine` (the real `kubernetes` client) in the adapter's "
        "own process (`KubernetesProcess`, its Events posted after each call returns) to the fake API "
        f"server of tests/fakes/kube_api.py in its own process, each answer {args.api_latency_ms:g} ms late.",
    }[args.quarantine]
    text = "\n".join(
        [
            section,
            "",
            f"Command: `.venv/bin/python bench/remediation.py{' ' + argv_text if argv_text else ''}`  ",
            f"Machine: {header}, {load_end:.2f} at the end  ",
            f"Run: {started}; {args.nodes:,} nodes × {GPUS_PER_NODE} GPUs (labels rack, nvlink_domain), burst "
            f"{args.rate:,.0f} events/s for {args.duration_s:g} s (drain timeout {args.drain_timeout_s:g} s), "
            f"paced run {args.light_rate:g} events/s for {args.duration_s:g} s, each throughput feed "
            f"{args.throughput_s:g} s, seed {args.seed}. Phases run in this order on one database, so later "
            "phases start with earlier phases' incidents open.",
            "",
            _path_text(args, adapters),
            "",
            body,
            "",
            f"Comparison: {NVSENTINEL}.",
            "",
            verdict,
            "",
        ]
    )
    return section, text, met


def _pinning_text(args: argparse.Namespace) -> str:
    """Which CPUs the processes were pinned to (`--decider-cpu`, `--aside-cpu`), or nothing."""
    text = ""
    if args.decider_cpu is not None:
        text += f" The decider's process (the load generator in it) and its commit writer on CPU {args.decider_cpu}."
    if args.aside_cpu is not None and args.quarantine == "kubernetes":
        text += f" The adapter's own process and the fake API server pinned to CPU {args.aside_cpu}."
    return text


def _path_text(args: argparse.Namespace, adapters: str) -> str:
    """What was measured, and how (the section's long paragraph)."""
    return (
        "Path: a real `Store`, `Ingest` and `RemediationService` (classify → correlate → "
        "escalate → blast-radius admission → outbox transaction → `Ingest.dispatch`; a decision's "
        "actions are admitted and recorded dispatched in its own transaction where nothing waits for "
        "admission, and otherwise dispatched by a round committed with the next pass; adapters' "
        "outcomes are committed with the next pass). `Ingest.take_events` is rasd-controller's path "
        "after wire validation: the "
        "event is stored in the transaction of the decision on it (its `health_events` row and its "
        "node's ack position with the ladder's rows, one sync of the disk), then acked on its stream; "
        "`RemediationService.on_events only` is the decision path alone (the event is not stored). "
        "Commits: `process` runs them in a `CommitProcess` (rasd-controller's "
        "default) while the next pass is decided; `thread` runs them on the store thread, one pass at "
        "a time. Outside: the gRPC stream and wire validation. Each scheduled event is its own task and its "
        "own call (concurrent streams), one message of a node at a time, as its stream is read (the next "
        "once the last is decided: an event whose node's last one is still being decided waits for it); "
        "calls that wait while a pass runs are decided together in "
        f"the next pass (group commit: at most {remediation_mod.MAX_GROUP_EVENTS} calls, one correlation and "
        "escalation pass, one transaction). "
        "Every node has an open stream (an `ingest.Session` whose queue a task empties, serializing each "
        "message as the stream's writer does), so agent commands are queued on it; no agent answers, so "
        "they stay `dispatched`. "
        "Transactions and commit p50/p99/max: each remediation transaction of the burst and how long the "
        "store took to make it durable, from the store thread's call to its return (with a writer process, "
        "the hand-off both ways included), as `rasd_remediation_commit_seconds` measures it; no decision "
        "of a pass leaves before its commit, nor any of the passes queued behind it. "
        "Controller logs: JSON at info, to /dev/null. The garbage collector as rasd-controller runs it "
        "(`rasd.common.gc_policy`: its thresholds, the start-up heap frozen, collections while no decision "
        "waits); the arrival schedules are built before the start and frozen with it. "
        "Disruption policy lifted so the burst is admitted: "
        "breaker 100 %, cluster 100 % / 100,000 nodes, rack and nvlink_domain 100 % / 100,000, storm "
        "cooldown 0; the lost-node watch off (the nodes send no heartbeats). Event mix: Xid "
        "13/31/43/45/48/79/94/119, ECC DBE, row-remap pending, NVLink errors, "
        "IB link state; ~45 % repeats of an open fault (duplicates), 2 % IB flaps on 0.5 % of nodes "
        f"(node quarantine). {adapters}"
        + _pinning_text(args)
        + (
            " Diagnostic (`--pg-no-flush-wait`): PostgreSQL sessions run with synchronous_commit=off, so a "
            "commit returns before its WAL reaches the disk. rasd never runs so (a dispatched command must be "
            "durable first); the difference from the Remediation section is what waiting for this machine's "
            "disk costs."
            if args.pg_no_flush_wait
            else ""
        )
    )


def main(argv: list[str] | None = None) -> int:
    """Measure each backend, print the tables, update bench/RESULTS.md; exit 1 if a SQLite round misses p99 ≤ 50 ms."""
    parser = _parser()
    args = parser.parse_args(argv)
    if args.repeat < 1:
        parser.error(f"--repeat must be at least 1, got {args.repeat}")
    if args.quick:
        args.nodes, args.rate, args.duration_s, args.throughput_s, args.drain_timeout_s = 200, 200.0, 1.0, 1.0, 5.0
    backends = ["sqlite", "postgresql"] if args.backend == "both" else [args.backend]
    if "postgresql" in backends and not os.environ.get("RASD_TEST_POSTGRES_URL"):
        print("RASD_TEST_POSTGRES_URL is unset: PostgreSQL skipped (.ci/postgres.sh starts one)", file=sys.stderr)
        backends.remove("postgresql")
    writers = ["process", "thread"] if args.commit_writer == "both" else [args.commit_writer]
    if args.decider_cpu is not None:
        os.sched_setaffinity(0, {args.decider_cpu})  # before the commit writer starts: it inherits the CPU
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    header = results.machine(f"SQLAlchemy {sa.__version__}")
    rasd_logging.configure(args.log_level, json=True)
    gc_policy.configure()  # as rasd-controller does
    rounds = _run_rounds(args, backends, writers)
    section, text, met = _report(args, argv, rounds, backends, writers, started, header)
    print(text)
    if not args.no_write:
        results.write_section(section, text)
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
