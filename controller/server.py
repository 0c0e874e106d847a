"""Builds and runs one controller replica: gRPC (AgentService, AdminService, health) and metrics.

Used by `rasd-controller`, by `rasd-sim` in-process, and by the integration tests, so every path
runs the same wiring.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import pathlib
import time
from collections.abc import Mapping
from typing import Any

import grpc
import structlog
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client import CollectorRegistry, start_http_server

from rasd.common import gc_policy, tls
from rasd.controller import wiring
from rasd.controller.core import agent_messages as msgs
from rasd.controller.core import aggregates
from rasd.controller.core.remediation import policy as policy_mod
from rasd.controller.executors import bmc, quarantine
from rasd.controller.ingest import service as ingest
from rasd.controller.observability import audit, metrics, recording
from rasd.controller.power import loop as power_loop
from rasd.controller.power import repair_gate
from rasd.controller.remediation import adapters
from rasd.controller.remediation import outlet as outlet_mod
from rasd.controller.remediation import service as remediation_service
from rasd.controller.replication import aggregates as aggregates_mod
from rasd.controller.replication import leader as leader_mod
from rasd.controller.rpc import (
    admin_service,
    agent_service,
    authn,
    authz,
    health_watch,
    leader_gate,
    services,
    store_outage,
)
from rasd.controller.store import remediation as rstore
from rasd.controller.store import repo
from rasd.controller.store import writer as store_writer
from rasd.controller.wire import commands as wire_commands

log = structlog.get_logger("rasd.controller")

MAX_MESSAGE_BYTES = 16 * 1024 * 1024


@dataclasses.dataclass(frozen=True)
class ControllerSettings:
    """What a controller replica needs to start."""

    listen: str = "127.0.0.1:7443"
    """gRPC listen address host:port (port 0 picks a free one)."""
    db_url: str = "sqlite:///rasd.db"
    """Any SQLAlchemy URL."""
    metrics_port: int | None = 9464
    """Prometheus exposition port on all interfaces; None disables it, 0 picks a free one."""
    metrics_addr: str = "0.0.0.0"
    """Address the metrics endpoint binds."""
    ingest: ingest.IngestSettings = dataclasses.field(default_factory=ingest.IngestSettings)
    """Ingest pacing and agent config."""
    shutdown_grace_s: float = 5.0
    """How long in-flight RPCs get on SIGTERM."""
    remediation: bool = True
    """Run the repair ladder on incoming health events (False: record events only)."""
    remediation_policy: policy_mod.RemediationPolicy = dataclasses.field(default_factory=policy_mod.RemediationPolicy)
    """Classification, correlation, ladder and disruption-budget settings."""
    quarantine: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    """The `[quarantine]` table: adapter ("record", "kubernetes", "slurm") and its settings."""
    bmc: Mapping[str, Any] | None = None
    """The `[bmc]` table (Redfish endpoints per node); None: no out-of-band power-cycle rung."""
    power_cycler: bmc.BmcPowerCycler | None = None
    """An out-of-band power cycler given in code instead of `[bmc]` (rasd-sim's simulated BMC)."""
    security: authn.SecuritySettings = dataclasses.field(default_factory=authn.SecuritySettings)
    """mTLS files, bearer tokens, the plaintext role and per-stream input limits."""
    health_listen: str | None = None
    """Extra plaintext address serving only grpc.health.v1 (kubelet probes cannot present a client
    certificate); None: health is served on `listen` only."""
    health_watch: health_watch.WatchLimits = dataclasses.field(default_factory=health_watch.WatchLimits)
    """How many health Watch streams are held at once, and for how long each (no credentials needed)."""
    record_path: pathlib.Path | None = None
    """Record inbound agent streams, sent commands and decisions to this file (observability/recording.py)."""
    leader: leader_mod.LeaderSettings = dataclasses.field(default_factory=leader_mod.LeaderSettings)
    """The `[leader]` table: election (lease on PostgreSQL), lease and renewal times, replica id."""
    power: Mapping[str, Any] | None = None
    """The `[power]` table (budget tree, policy); None: no power loop."""
    store_check_interval_s: float = 1.0
    """How often the store's SQLite file is checked to still be the one opened (deleted, replaced)."""
    reuse_port: bool = False
    """Share `listen` with other processes (SO_REUSEPORT: the kernel spreads new connections over them),
    as ingest workers do (`rasd.controller.workers`). False: binding a port another process serves
    fails, rather than silently taking half of its new connections (gRPC's own default shares it)."""
    own_listen: str | None = None
    """A second address served by this process alone, advertised to rasctl instead of `listen` (an
    ingest worker's: `listen` is shared, so a hint to it could land on another worker)."""
    store_probe_interval_s: float = 5.0
    """How often a PostgreSQL store is write-probed (`store.write_probe`): a store that refuses writes
    is reported within about this long."""
    commit_writer: str = "thread"
    """Where the repair ladder's commits run: "process" (a writer process, `store.writer`: deciding
    and committing use two cores; what `rasd-controller` runs) or "thread" (the store thread)."""


def _store_url(settings: ControllerSettings) -> str:
    """The store URL, with a replica's stalled transactions ended within its lease (lease election).

    A leader stopped inside a transaction (SIGSTOP, a VM paused, a partition: its socket stays open)
    keeps the lease row's shared lock that every fenced commit takes, and the next leader's takeover
    waits until the server ends the transaction (``idle_in_transaction_session_timeout``, 10 s by
    default). With a lease shorter than that, the takeover took the 10 s, not the lease: ended within
    two thirds of the lease (at least 1 s, at most the 10 s), it stays within it.
    """
    if settings.leader.resolved_election(settings.db_url) != "lease":
        return settings.db_url
    timeout_ms = int(min(10.0, max(1.0, settings.leader.lease_s * 2 / 3)) * 1000)
    return repo.with_session_setting(settings.db_url, "idle_in_transaction_session_timeout", f"{timeout_ms}ms")


def _commit_writer(
    settings: ControllerSettings, leadership: leader_mod.Leadership
) -> store_writer.CommitProcess | None:
    """The ladder's commit writer process ("process"), or None: commits on the store thread ("thread")."""
    if not settings.remediation:
        return None
    if settings.commit_writer == "process":
        return store_writer.CommitProcess(settings.db_url, fence=leadership.current_fence)
    if settings.commit_writer != "thread":
        raise ValueError(f"commit_writer must be process or thread, got {settings.commit_writer!r}")
    return None


def _executors(
    settings: ControllerSettings,
    store: repo.Store,
    leadership: leader_mod.Leadership,
    adapter: quarantine.QuarantineAdapter,
) -> dict[str, adapters.Executor]:
    """The controller-side adapters: quarantine through the configured scheduler, BMC power cycles if configured."""
    executors = dict(quarantine.executors(adapter))
    if settings.bmc is not None:
        # A deposed replica's adapter thread may still run: its journal write is refused before it
        # asks the BMC.
        journal_store = rstore.RemediationStore(store.engine, fence=leadership.fence)
        journal = rstore.StoredJournal(journal_store, "bmc_journal")
        executors.update(bmc.executors(bmc.open_power_cycler(settings.bmc, journal)))
    elif settings.power_cycler is not None:
        executors.update(bmc.executors(settings.power_cycler))
    return executors


def _wire_services(
    settings: ControllerSettings,
    store: repo.Store,
    controller_metrics: metrics.ControllerMetrics,
    leadership: leader_mod.Leadership,
    ladder: wiring.Ladder | None,
) -> wiring.Wired:
    """The ingest, the ladder and (with lease election) the relay and the aggregates' path, connected (`wiring`)."""
    ingest_settings = settings.ingest
    if leadership.election != "lease":
        return wiring.single_replica(store, controller_metrics, ladder=ladder, settings=ingest_settings)
    # Other replicas hold streams too: their nodes stay connected while this one starts.
    ingest_settings = dataclasses.replace(ingest_settings, mark_all_disconnected_at_start=False)
    return wiring.replicated(
        store, controller_metrics, leadership, ladder=ladder, settings=ingest_settings,
        poll_s=settings.leader.relay_poll_s, aggregate_reads=_aggregate_reads(settings),
    )  # fmt: skip


def _aggregate_reads(settings: ControllerSettings) -> aggregates.AggregateReads | None:
    """What a replica ships the leader until the leader asks (None: no fleet-wide loop needs aggregates).

    The power loop's windows and half its control period (from controller.toml, the same on every
    replica; the leader asks for what its period reads now); otherwise the sweeps' idleness, slowly.
    """
    if settings.power is not None:
        power = power_loop.PowerSettings.from_mapping(settings.power)
        return aggregates.AggregateReads(
            interval_s=power.policy.control_period_s / 2,
            draw_window_s=power.draw_window_s,
            detect_window_s=power.detect_window_s,
        )
    if settings.remediation and settings.remediation_policy.sdc.sweep_enabled:
        return aggregates.AggregateReads(
            interval_s=aggregates_mod.IDLE_INTERVAL_S, draw_window_s=1.0, detect_window_s=1.0
        )
    return None


def _power_loop(
    settings: ControllerSettings,
    wired: wiring.Wired,
    leadership: leader_mod.Leadership,
    send_command: power_loop.CommandSender,
) -> power_loop.PowerLoop | None:
    """The power loop, run by the leader ([power] configured), or None.

    With several replicas it runs on the leader over every node: it reads the other replicas'
    aggregates (`wired.fleet`) and its commands reach their nodes through the relay (send_command;
    a period's caps all at once, `Courier.send_many`).
    """
    if settings.power is None:
        return None
    limiter = bmc.open_power_limiter(settings.bmc) if settings.bmc is not None else None
    power = power_loop.PowerLoop(
        wired.ingest,
        power_loop.PowerSettings.from_mapping(settings.power),
        limiter=limiter,
        send_command=send_command,
        send_many=wired.relay.courier.send_many if wired.relay is not None else None,
        remote=wired.fleet,
    )
    leadership.on_elected(lambda _token: power.start())
    leadership.on_deposed(power.stop)
    return power


def advertised_address(listen: str, port: int, environ: Mapping[str, str]) -> str:
    """Where rasctl reaches this replica, advertised to the others for their refusals' hint.

    $RASD_ADVERTISE_ADDRESS, else the listen host (the pod's IP, $POD_IP, for a wildcard) with the
    bound port; "" when neither says.
    """
    explicit = environ.get("RASD_ADVERTISE_ADDRESS", "")
    if explicit:
        return explicit
    host = listen.rpartition(":")[0].strip("[]")
    if host in ("", "0.0.0.0", "::"):
        host = environ.get("POD_IP", "")
    if not host:
        return ""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _pending_rmas(remediation: remediation_service.RemediationService) -> int | None:
    """RMA tickets awaiting approval, read at scrape time; None while the store is unreachable.

    A store outage must not fail the whole scrape: every other series still tells the operator what happens.
    """
    try:
        return len(remediation.store.rmas(pending_only=True))
    except repo.STORE_UNAVAILABLE:
        return None


class Controller:
    """One running replica. `await start()`, then `await stop()`."""

    def __init__(self, settings: ControllerSettings, *, registry: CollectorRegistry | None = None) -> None:
        """Open the store and build the services; nothing listens until start()."""
        self.registry = registry or CollectorRegistry()
        settings = dataclasses.replace(settings, db_url=_store_url(settings))
        self.settings = settings
        self.store = repo.Store.open(settings.db_url)
        self.metrics = metrics.ControllerMetrics(self.registry)
        # One leader runs the fleet-wide loops (DESIGN.md §8); its writes carry the fencing token.
        self.leadership = leader_mod.Leadership(
            self.store.engine, settings.leader, election=settings.leader.resolved_election(settings.db_url)
        )
        self.leadership.register_metrics(self.registry)
        self.recorder: recording.Recorder | None = None
        if settings.record_path is not None:
            self.recorder = recording.Recorder(settings.record_path, policy=settings.remediation_policy)
        self.commit_writer = _commit_writer(settings, self.leadership)
        self.repair_gate: repair_gate.RepairGate | None = None
        """The ladder's outlet when a power loop runs: resets and reboots wait for power headroom."""
        self._quarantine_adapter: quarantine.QuarantineAdapter | None = None
        """The ladder's scheduler adapter (`_ladder`), closed on stop (the Kubernetes child posts its queued Events)."""
        self.wired = _wire_services(settings, self.store, self.metrics, self.leadership, self._ladder())
        self.ingest = self.wired.ingest
        self.remediation = self.wired.remediation
        self.relay = self.wired.relay
        """With several replicas: the outbox courier, the result relay and `relay.send_command` (any replica's node)."""
        if self.remediation is not None and self.relay is None:
            remediation = self.remediation  # with a relay, the relay starts and stops it with the terms
            self.leadership.on_elected(lambda _token: remediation.start())
            self.leadership.on_deposed(remediation.stop)
        self.power = _power_loop(settings, self.wired, self.leadership, self.send_command)  # started after remediation
        if self.power is not None and self.repair_gate is not None:
            self.repair_gate.attach(self.power)
        if self.power is not None:  # a straggler's raise is sized to the loop's headroom and served as a floor (#40)
            self.ingest.stragglers.room = self.power.power_room
            if self.remediation is not None:
                self.remediation.stragglers.floors = self.power
        self._register_collectors()
        self.tokens = authn.TokenStore(settings.security.tokens_file)
        self.audit = audit.AuditLog(self.ingest, clock=time.time_ns, registry=self.registry)
        self.security = authz.SecurityMetrics(self.registry)
        self.tls: tls.ReloadingServerCredentials | None = None
        if settings.security.tls is not None:
            self.tls = tls.ReloadingServerCredentials(settings.security.tls)
        remediation_or_none = self.remediation
        self.collector = gc_policy.QuietCollector(
            (lambda: remediation_or_none.quiet) if remediation_or_none is not None else (lambda: True),
            observe=self._observe_gc_pause,
        )
        """Runs the garbage collector while no decision waits (`gc_policy`), and times every pause."""
        self.port = 0
        self.metrics_port: int | None = None
        self._server: grpc.aio.Server | None = None
        self._health_server: grpc.aio.Server | None = None
        self.health_port: int | None = None
        self._metrics_server = None
        self._health = health_watch.BoundedHealthServicer(settings.health_watch)
        self._store_watch: asyncio.Task[None] | None = None
        self._store_unwritable = False
        """Whether the last write probe failed (`_watch_store`)."""

    def _ladder(self) -> wiring.Ladder | None:
        """What the repair ladder is built with (None: no remediation): adapters, recording, fence, writer."""
        settings = self.settings
        if not settings.remediation:
            return None
        adapter = quarantine.open_quarantine(settings.quarantine)
        self._quarantine_adapter = adapter
        return wiring.Ladder(
            policy=settings.remediation_policy,
            executors=_executors(settings, self.store, self.leadership, adapter),
            # The Kubernetes adapter reads the Nodes' topology and keeps RasdHealthy's heartbeat.
            node_sync=getattr(adapter, "sync_nodes", None),
            node_sync_s=getattr(adapter, "sync_period_s", 0.0),
            recorder=self.recorder,
            fence=self.leadership.fence,
            writer=self.commit_writer,
            wrap_outlet=self._gate_repairs if settings.power is not None else None,
        )

    def _gate_repairs(self, outlet: outlet_mod.CommandOutlet) -> outlet_mod.CommandOutlet:
        """The ladder's outlet behind the power loop's repair gate (attached once the loop is built)."""
        self.repair_gate = repair_gate.RepairGate(outlet)
        return self.repair_gate

    def _register_collectors(self) -> None:
        """The fleet's and the power loop's metrics, read from the services at each scrape."""
        ingest = self.ingest
        self.registry.register(
            metrics.FleetCollector(
                latest=lambda: ingest.latest, gpu_nodes=lambda: ingest.gpu_nodes, node_states=ingest.node_states
            )
        )
        self.registry.register(metrics.PowerCollector(lambda: self.power.status if self.power is not None else None))
        if self.remediation is not None:
            remediation = self.remediation
            self.registry.register(
                metrics.RemediationCollector(
                    self.leadership.is_leader,
                    rma_pending=lambda: _pending_rmas(remediation),
                    sdc_records=remediation.sdc_records,
                )
            )

    async def start(self) -> None:
        """Start ingest, bind gRPC and metrics, and report SERVING."""
        await self.ingest.start()
        if self.relay is not None:
            await self.relay.start()
        if self.wired.shipper is not None:
            self.wired.shipper.start()
        await self.leadership.start()
        server = grpc.aio.server(
            # Authenticate first, then the leader gate: a refused caller learns nothing about leadership.
            interceptors=[
                # Outermost, so a store outage met by the audit write of an authorized call maps too.
                store_outage.StoreOutageInterceptor(),
                authz.AuthInterceptor(self.settings.security, self.tokens, self.audit, self.security),
                leader_gate.LeaderGate(
                    self.leadership.is_leader,
                    lambda: f"leader: {self.leadership.leader_id or 'unknown'}",
                    lambda: (self.leadership.leader_id, self.leadership.leader_address),
                ),
            ],
            options=[
                ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                # Detect dead agent connections within about a minute.
                ("grpc.keepalive_time_ms", 30_000),
                ("grpc.keepalive_timeout_ms", 10_000),
                # The ping's own timeout (default 60 s) bounds an unanswered keepalive; see tls.channel_options.
                ("grpc.http2.ping_timeout_ms", 10_000),
                ("grpc.http2.min_ping_interval_without_data_ms", tls.SERVER_MIN_PING_INTERVAL_MS),
                ("grpc.keepalive_permit_without_calls", 1),
                ("grpc.so_reuseport", int(self.settings.reuse_port)),
            ],
        )
        agents = agent_service.AgentService(
            self.ingest,
            limits=self.settings.security.limits,
            security_metrics=self.security,
            audit_log=self.audit,
            recorder=self.recorder,
        )
        admin = admin_service.AdminService(self.ingest, self.remediation, power=self.power, changes=self.wired.changes)
        services.add_services(server, agents, admin)
        health_pb2_grpc.add_HealthServicer_to_server(self._health, server)
        self.port = self._bind(server, self.settings.listen)
        advertised = advertised_address(self.settings.listen, self.port, os.environ)
        if self.settings.own_listen is not None:
            own_port = self._bind(server, self.settings.own_listen)
            shared = {k: v for k, v in os.environ.items() if k != "RASD_ADVERTISE_ADDRESS"}  # names the shared port
            advertised = advertised_address(self.settings.own_listen, own_port, shared)
        await server.start()
        self._server = server
        await self.leadership.advertise(advertised)
        if self.settings.health_listen is not None:
            # Health only, no rasd service: safe in plaintext on the pod IP, and reachable by probes.
            health_server = grpc.aio.server()
            health_pb2_grpc.add_HealthServicer_to_server(self._health, health_server)
            self.health_port = health_server.add_insecure_port(self.settings.health_listen)
            if self.health_port == 0:
                raise OSError(f"could not bind the health port to {self.settings.health_listen}")
            await health_server.start()
            self._health_server = health_server
        if self.settings.metrics_port is not None:
            self._metrics_server, _thread = start_http_server(
                self.settings.metrics_port, addr=self.settings.metrics_addr, registry=self.registry
            )
            self.metrics_port = self._metrics_server.server_port
        self.collector.start()  # last: a start that failed above leaves no task and no gc callback behind
        await self._set_health(health_pb2.HealthCheckResponse.SERVING)
        self._store_watch = asyncio.create_task(self._watch_store(), name="rasd-store-watch")
        log.info(
            "controller_started",
            listen=self.settings.listen,
            port=self.port,
            tls=self.tls is not None,
            metrics_port=self.metrics_port,
            db=repo.redact_url(self.settings.db_url),
        )

    def _bind(self, server: grpc.aio.Server, address: str) -> int:
        """Add address to server (TLS unless plaintext); the bound port."""
        if self.tls is not None:
            port = server.add_secure_port(address, self.tls.credentials)
        else:
            port = server.add_insecure_port(address)
        if port == 0:
            raise OSError(f"could not bind gRPC to {address}")
        return port

    async def stop(self) -> None:
        """Stop taking calls, let in-flight ones finish within the grace, flush the store.

        The order matters: the agents' streams end first (so the grace is not spent waiting on
        streams that never end by themselves), then the server refuses new calls and lets the
        in-flight ones finish, and only then does the ingest flush and stop its store thread. Stopped
        the other way round, a call that arrived in between found the store thread gone and failed
        with an internal error instead of UNAVAILABLE (an agent reconnecting at that moment saw
        "cannot schedule new futures after shutdown").
        """
        await self._health.enter_graceful_shutdown()
        if self._store_watch is not None:
            self._store_watch.cancel()
            await asyncio.gather(self._store_watch, return_exceptions=True)
        await self.collector.stop()
        await self.leadership.stop()  # stops the leader's loops and hands the lease over at once
        if self.wired.shipper is not None:
            await self.wired.shipper.stop()
        if self.relay is not None:
            await self.relay.stop()
        self.ingest.end_sessions()
        if self._server is not None:
            await self._server.stop(self.settings.shutdown_grace_s)
        if self._health_server is not None:
            await self._health_server.stop(None)
        await self.ingest.stop()
        close_adapter = getattr(self._quarantine_adapter, "close", None)
        if close_adapter is not None:
            await asyncio.to_thread(close_adapter)
        self.wired.thread.close()
        if self.commit_writer is not None:
            await asyncio.to_thread(self.commit_writer.close)
        if self._metrics_server is not None:
            self._metrics_server.shutdown()
            self._metrics_server.server_close()
        self.store.close()
        if self.recorder is not None:
            self.recorder.close()
        log.info("controller_stopped")

    async def _set_health(self, status: health_pb2.HealthCheckResponse.ServingStatus.ValueType) -> None:
        for service in ("", "rasd.api.v1.AgentService", "rasd.api.v1.AdminService"):
            await self._health.set(service, status)

    async def _watch_store(self) -> None:
        """Report a store that cannot take writes: a SQLite file lost, a PostgreSQL refusing writes.

        A SQLite file deleted or replaced under this replica (`store.file_identity`) is checked every
        `store_check_interval_s`; its transactions are refused by then, so nothing is acked; this makes
        it seen (log, `rasd_store_file_lost`, NOT_SERVING) until restarted: the file it had is gone.
        A PostgreSQL store is write-probed every `store_probe_interval_s` (`store.write_probe`): while
        the probe fails, `rasd_store_unwritable` is 1 and health NOT_SERVING; it recovers by itself.
        """
        probe = repo.write_probe_of(self.store.engine)
        probing: asyncio.Task[str | None] | None = None
        started_s = due_s = 0.0
        while True:
            await asyncio.sleep(self.settings.store_check_interval_s)
            problem = repo.file_problem(self.store.engine)
            if problem is not None:
                log.error("store_file_lost", problem=problem, acking=False, health="NOT_SERVING")
                self.metrics.store_file_lost.set(1)
                await self._set_health(health_pb2.HealthCheckResponse.NOT_SERVING)
                return
            if probe is None:
                continue
            now_s = time.monotonic()
            if probing is not None and probing.done():
                await self._note_write_probe(probing.result())
                probing = None
            elif probing is not None and now_s - started_s > 2 * probe.timeout_s:
                # A write that hangs (a commit waiting for a synchronous standby that is gone) is no write.
                probe.record(f"store write probe has not committed after {now_s - started_s:.0f} s")
                await self._note_write_probe(probe.problem)
            if probing is None and now_s >= due_s:
                # While it fails, probed every check: acks resume within a second of writes working.
                settings = self.settings
                every_s = settings.store_check_interval_s if self._store_unwritable else settings.store_probe_interval_s
                started_s, due_s = now_s, now_s + every_s
                probing = asyncio.ensure_future(asyncio.to_thread(probe.run))

    async def _note_write_probe(self, problem: str | None) -> None:
        """Log, count and report a write probe's outcome when it changes the store's writability."""
        if (problem is not None) == self._store_unwritable:
            return
        self._store_unwritable = problem is not None
        if problem is not None:
            log.error("store_unwritable", problem=problem, acking=False, health="NOT_SERVING")
            self.metrics.store_unwritable.set(1)
            await self._set_health(health_pb2.HealthCheckResponse.NOT_SERVING)
        else:
            log.warning("store_writable_again", acking=True, health="SERVING")
            self.metrics.store_unwritable.set(0)
            await self._set_health(health_pb2.HealthCheckResponse.SERVING)

    async def send_command(
        self, node_id: str, command: wire_commands.Command, *, timeout_s: float = 30.0
    ) -> msgs.AgentResult:
        """Send a rasd.api.v1.Command to a node on any replica and wait for its result.

        For fleet-wide loops outside the ladder's outbox (power caps): with several replicas the
        command goes through the store to the replica holding the node's stream; otherwise it is
        `Ingest.send_command` on this replica's stream. Raises as `Ingest.send_command` does.
        """
        if self.relay is not None:
            return await self.relay.send_command(node_id, command, timeout_s=timeout_s)
        return await self.ingest.send_command(node_id, command, timeout_s=timeout_s)

    def _observe_gc_pause(self, generation: int, trigger: str, seconds: float) -> None:
        self.metrics.gc_pause_seconds.labels(str(generation), trigger).observe(seconds)

    @property
    def address(self) -> str:
        """host:port agents and rasctl should dial."""
        host = self.settings.listen.rpartition(":")[0] or "127.0.0.1"
        return f"{host}:{self.port}"
