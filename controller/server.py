"""Builds and runs one controller replica: gRPC (AgentService, AdminService, health) and metrics.

Used by `rasd-controller`, by `rasd-sim` in-process, and by the integration tests, so every path
runs the same wiring.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping
from typing import Any

import grpc
import structlog
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from prometheus_client import CollectorRegistry, start_http_server

from rasd.api.v1 import admin_service_pb2_grpc as admin_grpc
from rasd.api.v1 import agent_service_pb2_grpc as agent_grpc
from rasd.controller import bmc, ingest, metrics, power_loop, quarantine
from rasd.controller import remediation as remediation_mod
from rasd.controller.core import policy as policy_mod
from rasd.controller.rpc import admin_service, agent_service
from rasd.controller.store import remediation as rstore
from rasd.controller.store import repo

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
    power: Mapping[str, Any] | None = None
    """The `[power]` table (budget tree, policy); None: no power loop."""


class Controller:
    """One running replica. `await start()`, then `await stop()`."""

    def __init__(self, settings: ControllerSettings, *, registry: CollectorRegistry | None = None) -> None:
        """Open the store and build the services; nothing listens until start()."""
        self.settings = settings
        self.registry = registry or CollectorRegistry()
        self.store = repo.Store.open(settings.db_url)
        self.metrics = metrics.ControllerMetrics(self.registry)
        self.ingest = ingest.Ingest(self.store, self.metrics, settings.ingest, clock=time.time_ns)
        self.registry.register(
            metrics.FleetCollector(
                latest=lambda: self.ingest.latest,
                gpu_nodes=lambda: self.ingest.gpu_nodes,
                node_states=self.ingest.node_states,
            )
        )
        self.remediation: remediation_mod.RemediationService | None = None
        if settings.remediation:
            adapter = quarantine.open_quarantine(settings.quarantine)
            executors = dict(quarantine.executors(adapter))
            if settings.bmc is not None:
                journal = rstore.StoredJournal(rstore.RemediationStore(self.store.engine), "bmc_journal")
                executors.update(bmc.executors(bmc.open_power_cycler(settings.bmc, journal)))
            self.remediation = remediation_mod.RemediationService(
                self.store, self.ingest, policy=settings.remediation_policy, executors=executors
            )
            self.ingest.events_hook = self.remediation.on_events
            self.ingest.command_result_hook = self.remediation.on_result
            self.ingest.connected_hook = self.remediation.node_connected
        self.power: power_loop.PowerLoop | None = None
        if settings.power is not None:
            limiter = bmc.open_power_limiter(settings.bmc) if settings.bmc is not None else None
            self.power = power_loop.PowerLoop(
                self.ingest, power_loop.PowerSettings.from_mapping(settings.power), limiter=limiter
            )
        self.port = 0
        self.metrics_port: int | None = None
        self._server: grpc.aio.Server | None = None
        self._metrics_server = None
        self._health = health.aio.HealthServicer()

    async def start(self) -> None:
        """Start ingest, bind gRPC and metrics, and report SERVING."""
        await self.ingest.start()
        if self.remediation is not None:
            await self.remediation.start()
        if self.power is not None:
            await self.power.start()
        server = grpc.aio.server(
            options=[
                ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                # Detect dead agent connections within about a minute.
                ("grpc.keepalive_time_ms", 30_000),
                ("grpc.keepalive_timeout_ms", 10_000),
                ("grpc.http2.min_ping_interval_without_data_ms", 10_000),
                ("grpc.keepalive_permit_without_calls", 1),
            ]
        )
        agent_grpc.add_AgentServiceServicer_to_server(agent_service.AgentService(self.ingest), server)
        admin_grpc.add_AdminServiceServicer_to_server(
            admin_service.AdminService(self.ingest, self.remediation, power=self.power), server
        )
        health_pb2_grpc.add_HealthServicer_to_server(self._health, server)
        self.port = server.add_insecure_port(self.settings.listen)
        if self.port == 0:
            raise OSError(f"could not bind gRPC to {self.settings.listen}")
        await server.start()
        self._server = server
        if self.settings.metrics_port is not None:
            self._metrics_server, _thread = start_http_server(
                self.settings.metrics_port, addr=self.settings.metrics_addr, registry=self.registry
            )
            self.metrics_port = self._metrics_server.server_port
        for service in ("", "rasd.api.v1.AgentService", "rasd.api.v1.AdminService"):
            await self._health.set(service, health_pb2.HealthCheckResponse.SERVING)
        log.info(
            "controller_started",
            listen=self.settings.listen,
            port=self.port,
            metrics_port=self.metrics_port,
            db=repo.redact_url(self.settings.db_url),
        )

    async def stop(self) -> None:
        """Stop taking calls, let in-flight ones finish within the grace, flush the store."""
        await self._health.enter_graceful_shutdown()
        if self.power is not None:
            await self.power.stop()
        if self.remediation is not None:
            await self.remediation.stop()
        await self.ingest.stop()
        if self._server is not None:
            await self._server.stop(self.settings.shutdown_grace_s)
        if self._metrics_server is not None:
            self._metrics_server.shutdown()
            self._metrics_server.server_close()
        self.store.close()
        log.info("controller_stopped")

    @property
    def address(self) -> str:
        """host:port agents and rasctl should dial."""
        host = self.settings.listen.rpartition(":")[0] or "127.0.0.1"
        return f"{host}:{self.port}"
