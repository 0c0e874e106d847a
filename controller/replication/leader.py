"""Which replica runs the fleet-wide loops: leader election through a lease row in the store.

Every replica serves agents and admin calls; exactly one, the leader, runs escalation and remediation
dispatch, blast radius, validation scheduling and power control. `Leadership` is the gate those loops
use:

- `is_leader()` before acting, `fencing_token` on what they write (or `fence` as the store's check,
  see `rasd.controller.store.lease.check_fence`), so a deposed leader's late writes are refused;
- `on_elected(callback)` / `on_deposed(callback)` to start and stop a loop with the term.

On PostgreSQL the replicas elect through `leader_lease` (`election = "lease"`): the leader renews
every `renew_s`, and when it stops (SIGKILL, partition, a hung database call) another replica takes
the lease once it has expired, within `lease_s` of the last renewal, with the next fencing token. A
leader that cannot renew in time steps down on its own first. On SQLite (one replica by
construction) the replica takes a new term at start and keeps it (`election = "static"`).

The election step itself is pure (`rasd.controller.core.lease`); this module owns the timing.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import socket
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Annotated, Any, Literal

import prometheus_client
import pydantic
import sqlalchemy as sa
import structlog
from sqlalchemy.orm import Session

from rasd.common import settings as settings_mod
from rasd.controller.core import lease as lease_core
from rasd.controller.store import lease as lease_store

log = structlog.get_logger("rasd.controller")


class LeaderSettingsError(ValueError):
    """A bad [leader] setting; the message names the key."""


def default_replica_id() -> str:
    """This replica's id: $POD_NAME (the Helm chart sets it from the downward API), else the hostname."""
    return os.environ.get("POD_NAME", "") or socket.gethostname()


@dataclasses.dataclass(frozen=True)
class LeaderSettings:
    """The `[leader]` table of controller.toml."""

    election: Literal["auto", "lease", "static"] = "auto"
    """auto: lease on PostgreSQL, static on SQLite; lease; static (this replica always leads: one replica only)."""
    lease_s: Annotated[float, pydantic.Field(ge=0.5, le=3600)] = 15.0
    """How long a lease lasts without renewal: the longest the fleet-wide loops stand still after a leader dies."""
    renew_s: Annotated[float, pydantic.Field(ge=0.1)] = 5.0
    """How often the leader renews (and a follower looks); well under lease_s, so one slow renewal is survived."""
    replica_id: Annotated[str, pydantic.Field(max_length=253)] = ""
    """This replica's id in the lease; empty: $POD_NAME, else the hostname."""
    relay_poll_s: Annotated[float, pydantic.Field(ge=0.01, le=60)] = 0.5
    """How often each replica looks for outbox commands of its streams, and the leader for others' events."""

    def __post_init__(self) -> None:
        # The ranges of single keys are in the hints (the settings layer and the chart's schema check them).
        settings_mod.require(self.renew_s <= self.lease_s / 2, "leader.renew_s", "must be at most lease_s / 2",
                             self.renew_s, LeaderSettingsError)  # fmt: skip

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], *, prefix: str = "leader.") -> LeaderSettings:
        """Build from a parsed `[leader]` table; an unknown key or a wrong type names the key."""
        return cls(**settings_mod.typed_values(cls, data, prefix, LeaderSettingsError))

    def resolved_election(self, db_url: str) -> str:
        """The election for a store URL: "lease" or "static"."""
        if self.election != "auto":
            return self.election
        return "lease" if sa.engine.make_url(db_url).get_backend_name() == "postgresql" else "static"


Elected = Callable[[int], Awaitable[None]]
Deposed = Callable[[], Awaitable[None]]


class Leadership:
    """This replica's part in the election, and the gate of the fleet-wide loops."""

    def __init__(self, engine: sa.Engine, settings: LeaderSettings, *, election: str) -> None:
        """Bind to the store's engine; nothing happens until `start()`.

        Args:
            engine: the store's engine (schema at head).
            settings: timing and replica id.
            election: "lease" or "static" (see `LeaderSettings.resolved_election`).
        """
        if election not in ("lease", "static"):
            raise ValueError(f"election must be lease or static, got {election!r}")
        self.settings = settings
        self.election = election
        self.replica_id = settings.replica_id or default_replica_id()
        self.store = lease_store.LeaseStore(engine)
        self.leader_id = ""
        """The replica that held the lease at the last look ("" when unknown)."""
        self.leader_address = ""
        """Where that replica serves rasctl, as it advertised (`advertise`); "" when unknown."""
        self._address_of = ""
        """The replica leader_address belongs to."""
        self._token: int | None = None
        self._holds_until = 0.0
        self._elected: list[Elected] = []
        self._deposed: list[Deposed] = []
        self._loop_task: asyncio.Task[None] | None = None
        self._term_task: asyncio.Task[None] | None = None
        self._changed = asyncio.Event()
        self._abdicate = False
        self._looking = asyncio.Lock()
        self.terms = 0
        """Terms this replica has started (for tests and metrics)."""

    # -- the gate --------------------------------------------------------------------------------------
    def is_leader(self) -> bool:
        """Whether this replica leads now: it holds a term and its last renewal still covers now."""
        if self._token is None:
            return False
        return self.election == "static" or time.monotonic() < self._holds_until

    @property
    def fencing_token(self) -> int | None:
        """The current term's token while this replica leads; None otherwise."""
        return self._token if self.is_leader() else None

    def fence(self, session: Session) -> None:
        """Refuse session's transaction unless this replica's term is still the lease's (store hook)."""
        self.current_fence()(session)

    def current_fence(self) -> lease_store.Fence:
        """The fence of this replica's term now, as a value (for a store writer process)."""
        return lease_store.Fence(self.fencing_token, role=self.store.role)

    def register_metrics(self, registry: prometheus_client.CollectorRegistry) -> None:
        """Export whether this replica leads and its term (the fencing token; 0 while it follows)."""
        prometheus_client.Gauge(
            "rasd_controller_leader",
            "1 while this replica is the leader and runs the fleet-wide loops",
            registry=registry,
        ).set_function(lambda: 1.0 if self.is_leader() else 0.0)
        prometheus_client.Gauge(
            "rasd_controller_leader_term",
            "Fencing token of this replica's term as leader; 0 while it follows",
            registry=registry,
        ).set_function(lambda: float(self.fencing_token or 0))

    def on_elected(self, callback: Elected) -> None:
        """Run callback(fencing_token) when a term starts (in registration order)."""
        self._elected.append(callback)

    def on_deposed(self, callback: Deposed) -> None:
        """Run callback() when a term ends (in reverse registration order)."""
        self._deposed.append(callback)

    # -- lifecycle -------------------------------------------------------------------------------------
    async def start(self) -> None:
        """Take part in the election; the first look happens before this returns.

        When the first look elects this replica, the elected callbacks have run when this returns,
        so a lone replica is fully up before it serves.
        """
        if self.election == "static":
            lease = await asyncio.to_thread(self.store.take, self.replica_id)
            self.leader_id = self.replica_id
            await self._begin(lease.fencing_token, "single replica (static election)")
            return
        await self._look()
        # Renewals run while the elected callbacks start the leader's loops: those can take longer
        # than the lease (a commit writer process to start on a busy host), and a term whose first
        # renewal waited for them would lapse as soon as it began.
        self._loop_task = asyncio.create_task(self._run(), name="rasd-leader-election")
        if self._term_task is not None:
            await asyncio.shield(self._term_task)

    async def stop(self) -> None:
        """End this replica's term (deposed callbacks) and release the lease so a follower takes over at once."""
        async with self._looking:  # a look in flight finishes first: it must not renew after the release
            if self._loop_task is not None:
                self._loop_task.cancel()
                await asyncio.gather(self._loop_task, return_exceptions=True)
        was_leader = self._token is not None
        await self._end("shutting down")
        if was_leader and self.election == "lease":
            try:
                await asyncio.to_thread(self.store.release, self.replica_id)
            except Exception as exc:  # the lease then simply expires
                log.warning("leader_release_failed", error=str(exc), error_type=type(exc).__name__)

    async def advertise(self, address: str) -> None:
        """Publish where this replica serves rasctl; a follower names it when it refuses a leader's call."""
        await asyncio.to_thread(self.store.advertise, self.replica_id, address)
        if self.leader_id == self.replica_id:
            self.leader_address, self._address_of = address, self.replica_id

    async def _learn_leader_address(self) -> None:
        """Read the leader's advertised address when the leader changed, or until it has advertised one."""
        holder = self.leader_id
        if not holder or (holder == self._address_of and self.leader_address):
            return
        try:
            address = await asyncio.to_thread(self.store.address_of, holder)
        except Exception as exc:  # only the hint in a follower's refusal is missing; the next look retries
            log.warning("leader_address_unread", replica=self.replica_id, error=str(exc))
            return
        self.leader_address, self._address_of = address, holder

    async def wait_changed(self) -> None:
        """Wait until this replica starts or ends a term (tests, tools)."""
        self._changed.clear()
        await self._changed.wait()

    # -- internals -------------------------------------------------------------------------------------
    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._next_wait_s)
            async with self._looking:
                await self._look()

    _next_wait_s: float = 0.0

    async def _look(self) -> None:
        if self._abdicate:
            self._abdicate = False
            await self._end("the leader's loops failed to start")
            await asyncio.to_thread(self.store.release, self.replica_id)
            self._next_wait_s = self.settings.renew_s
            return
        started = time.monotonic()
        lease_s, renew_s = self.settings.lease_s, self.settings.renew_s
        try:
            look = asyncio.to_thread(self.store.look, self.replica_id, lease_s=lease_s)
            if self._token is not None:
                # A renewal that hangs (packets to the database dropped) must not hold the term's end
                # back: the term ends when the last renewal stops covering it, and the deposed
                # callbacks run then, not when the call finally returns (another replica may lead by
                # then). The call runs on in its thread; its answer is not used.
                decision, lease, now = await asyncio.wait_for(look, max(0.0, self._holds_until - started))
            else:
                decision, lease, now = await look
        except Exception as exc:  # the database is unreachable: lead only while the last renewal covers
            log.warning("leader_look_failed", replica=self.replica_id, error=str(exc), error_type=type(exc).__name__)
            if self._token is not None and time.monotonic() >= self._holds_until:
                await self._end("could not renew the lease in time")
            wait = renew_s if self._token is None else max(0.05, min(renew_s, self._holds_until - time.monotonic()))
            self._next_wait_s = wait
            return
        self.leader_id = lease.holder
        if not decision.leader:
            await self._learn_leader_address()
        margin_s = min(1.0, lease_s / 10)
        if decision.leader:
            if decision.verdict is lease_core.Verdict.ACQUIRED and self._token is not None:
                await self._end("own term lapsed")
            self._holds_until = lease_core.holds_until(started, lease_s, margin_s=margin_s)
            if self._token is None:
                await self._begin(lease.fencing_token, decision.reason)
        elif self._token is not None:
            await self._end(decision.reason)
        self._next_wait_s = lease_core.next_look_s(lease, leader=decision.leader, now_unix_ns=now, renew_s=renew_s)

    async def _begin(self, token: int, reason: str) -> None:
        self._token = token
        self.terms += 1
        log.info("leader_elected", replica=self.replica_id, fencing_token=token, reason=reason)
        if self.election == "static":  # start-up itself: a failing loop fails the controller's start
            for callback in self._elected:
                await callback(token)
        else:
            self._term_task = asyncio.create_task(self._run_elected(token), name="rasd-leader-term")
        self._changed.set()

    async def _run_elected(self, token: int) -> None:
        for callback in self._elected:
            try:
                await callback(token)
            except Exception:
                # A leader whose loops did not start must not sit on the lease: the next look hands it over.
                log.exception("leader_elected_callback_failed", replica=self.replica_id, fencing_token=token)
                self._abdicate = True
                return

    async def _end(self, reason: str) -> None:
        if self._token is None:
            return
        token, self._token = self._token, None
        if self._term_task is not None and not self._term_task.done():
            self._term_task.cancel()
            await asyncio.gather(self._term_task, return_exceptions=True)
        self._term_task = None
        log.warning("leader_deposed", replica=self.replica_id, fencing_token=token, reason=reason)
        for callback in reversed(self._deposed):
            try:
                await callback()
            except Exception:
                log.exception("leader_deposed_callback_failed", replica=self.replica_id)
        self._changed.set()
