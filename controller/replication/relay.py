"""Several replicas, one controller: commands out through the outbox, events and results in to the leader.

With `election = "lease"` each replica runs a `Relay`, which takes over the ingest's hooks:

- **Courier** (every replica): the leader marks agent commands `dispatched` in the outbox
  (`commands`); each replica looks for dispatched commands of the nodes whose streams it holds and
  sends them, once per stream (a new stream of the node gets them again with the same ids: the agent
  answers a repeat from its journal and never runs it twice, DESIGN.md invariant 2). The leader sends
  to its own streams at once and the others find theirs within `relay_poll_s`.
- **Results** (every replica): a command result is stored (`command_results`) by the replica that
  received it; the leader applies stored results in arrival order and then forgets them. Applying a
  result twice is harmless: the ladder calls a result nobody waits for stale.
- **Relayed commands** (any replica): `send_command` is `Ingest.send_command` for a node on any
  replica. A loop outside the ladder's outbox (the power loop's caps) calls it on the leader; when
  the stream is elsewhere the command goes through `relayed_commands`, the replica holding the
  stream sends it, and its result comes back through `command_results` to the waiting sender.
- **Intake** (the leader): events are stored by whichever replica holds the stream; the leader reads
  each node's new, gap-free events past the ladder's watermark and decides them. It is the only way
  events reach the ladder in this mode, so no event is decided twice, whichever replica received it.

Replicas find work by polling the store every `relay_poll_s` (cheap queries: dispatched commands,
kept results, and per node its acked position against the ladder's watermark); a replica's own
streams are served at once. PostgreSQL LISTEN/NOTIFY could replace the polling; it is not needed
for correctness, only for latency.

Every write the leader's ladder makes carries its fencing token (`Leadership.fence` on the
remediation store), so once another replica has taken over, a late write of this one is refused.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Mapping
from typing import Any

import structlog

from rasd.api.v1 import commands_pb2 as commands_pb
from rasd.common import aio
from rasd.controller.core.remediation import actions
from rasd.controller.ingest import service as ingest_mod
from rasd.controller.remediation import service as remediation_mod
from rasd.controller.replication import leader as leader_mod
from rasd.controller.store import relay as relay_store
from rasd.controller.store import repo

log = structlog.get_logger("rasd.controller")

INVENTORY_REFRESH_S = 10.0
"""How often the leader re-reads which nodes other replicas hold, with their labels and GPUs."""


class Relay:
    """The courier, the result store and the leader's intake of one replica."""

    def __init__(
        self,
        ingest: ingest_mod.Ingest,
        remediation: remediation_mod.RemediationService | None,
        leadership: leader_mod.Leadership,
        *,
        poll_s: float,
    ) -> None:
        """Bind to this replica's services; `attach()` wires the hooks, `start()` runs the loops."""
        self.ingest = ingest
        self.remediation = remediation
        self.leadership = leadership
        self.poll_s = poll_s
        self.store = relay_store.RelayStore(ingest.store.engine)
        self._sent: dict[str, str] = {}
        """command id → the session it went out on (a new session of the node gets it again)."""
        self._awaiting: dict[str, asyncio.Future[commands_pb.ActionResult]] = {}
        """Relayed commands this replica sent and waits for, by command id."""
        self._courier_wake = asyncio.Event()
        self._intake_wake = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._leading = False
        self._inventory_at = 0.0
        self.commands_sent = 0
        self.results_relayed = 0

    def attach(self) -> None:
        """Route the ingest's hooks and the ladder's sends through the relay."""
        self.ingest.command_result_hook = self._on_result
        self.ingest.connected_hook = self._on_connected
        if self.remediation is not None:
            self.ingest.events_hook = self._on_events
            # Events are stored by the replica that holds their stream and decided by the leader,
            # which reads them from the store: never stored with a decision here.
            self.ingest.arrivals_hook = None
            self.remediation.send_hook = self._send
            self.leadership.on_elected(self._elected)
            self.leadership.on_deposed(self._deposed)

    async def start(self) -> None:
        """Start the courier (every replica) and the intake loop (acts only while this replica leads)."""
        self._tasks = [
            asyncio.create_task(self._courier_forever(), name="rasd-relay-courier"),
            asyncio.create_task(self._intake_forever(), name="rasd-relay-intake"),
        ]

    async def stop(self) -> None:
        """Stop both loops."""
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []

    # -- hooks -----------------------------------------------------------------------------------------
    async def _on_events(self, node_id: str, events: list[repo.StoredEvent], labels: Mapping[str, str]) -> None:
        # Stored and acked already; the leader reads them from the store (this one, if it leads).
        self._intake_wake.set()

    async def _on_result(self, node_id: str, result: commands_pb.ActionResult) -> None:
        await self.ingest.run_in_store(
            lambda: self.store.save_result(
                command_id=result.command_id,
                node_id=node_id,
                result=result.SerializeToString(),
                replica_id=self.leadership.replica_id,
                now_unix_ns=time.time_ns(),
            )
        )
        self.results_relayed += 1
        self._intake_wake.set()

    async def _on_connected(self, node_id: str) -> None:
        self._courier_wake.set()

    async def _elected(self, token: int) -> None:
        assert self.remediation is not None
        await self.remediation.start()
        self._leading = True
        self._intake_wake.set()

    async def _deposed(self) -> None:
        self._leading = False
        if self.remediation is not None:
            await self.remediation.stop()

    def _send(self, action: actions.Action) -> bool:
        """The ladder dispatched an agent command: send it now if the stream is here, else a courier will."""
        if action.node_id in self.ingest.sessions:
            self._deliver(action)
        else:
            self._courier_wake.set()
        return True  # it is in the outbox either way; whichever replica holds the stream delivers it

    async def node_reachable(self, node_id: str) -> bool:
        """Whether this or another replica holds the node's stream (another's: its connected row)."""
        if node_id in self.ingest.sessions:
            return True
        return bool(await self.ingest.run_in_store(self.store.node_connected, node_id))

    # -- relayed commands --------------------------------------------------------------------------------
    async def send_command(
        self, node_id: str, command: commands_pb.Command, *, timeout_s: float = 30.0
    ) -> commands_pb.ActionResult:
        """Send a command to a node on any replica and wait for its result (`Ingest.send_command` semantics).

        Raises:
            TimeoutError: no result within timeout_s (no replica holds the node's stream, or the agent
                did not answer); the command is withdrawn.
            ConnectionError: the node's stream on this replica closed before the result came back.
        """
        if node_id in self.ingest.sessions:
            return await self.ingest.send_command(node_id, command, timeout_s=timeout_s)
        if not command.command_id:
            command.command_id = uuid.uuid4().hex
        now = time.time_ns()
        future: asyncio.Future[commands_pb.ActionResult] = asyncio.get_running_loop().create_future()
        self._awaiting[command.command_id] = future
        try:
            await self.ingest.run_in_store(
                lambda: self.store.relay_command(
                    command_id=command.command_id,
                    node_id=node_id,
                    command=command.SerializeToString(),
                    replica_id=self.leadership.replica_id,
                    now_unix_ns=now,
                    expires_unix_ns=now + int(timeout_s * 1e9),
                )
            )
            return await asyncio.wait_for(future, timeout=timeout_s)
        finally:
            self._awaiting.pop(command.command_id, None)
            await self.ingest.run_in_store(self.store.forget_relayed, [command.command_id])

    async def _collect_awaited(self) -> None:
        if not self._awaiting:
            return
        found = await self.ingest.run_in_store(self.store.results_of, list(self._awaiting))
        for command_id, payload in found.items():
            future = self._awaiting.get(command_id)
            if future is not None and not future.done():
                future.set_result(commands_pb.ActionResult.FromString(payload))

    # -- courier -----------------------------------------------------------------------------------------
    def _deliver(self, action: actions.Action, dispatched_unix_ns: int | None = None) -> bool:
        session = self.ingest.sessions.get(action.node_id)
        if session is None or self._sent.get(action.command_id) == session.session_id:
            return False
        assert self.remediation is not None
        escalation_policy = self.remediation.policy.escalation
        command = remediation_mod.agent_command(
            action,
            escalation_policy,
            self.ingest.node_gpus(action.node_id),
            time.time_ns(),
            # The ladder's wait counts from the dispatch: a late delivery gets only what is left of it.
            deadline_unix_ns=None
            if dispatched_unix_ns is None
            else dispatched_unix_ns + int(escalation_policy.timeout_s(action.kind) * 1e9),
        )
        if not self.ingest.dispatch(action.node_id, command):
            return False
        self._sent[action.command_id] = session.session_id
        self.commands_sent += 1
        log.info("relay_command_sent", node=action.node_id, command_id=action.command_id, action=action.kind,
                 replica=self.leadership.replica_id)  # fmt: skip
        return True

    async def deliver_pending(self) -> int:
        """Send outbox and relayed commands of this replica's streams not yet sent on them; returns how many."""
        if not self.ingest.sessions:
            self._sent.clear()
            return 0
        ladder = self.remediation
        rows = (
            []
            if ladder is None
            else await self.ingest.run_in_store(lambda: ladder.store.commands(statuses=("dispatched",)))
        )
        relayed = await self.ingest.run_in_store(self.store.relayed_commands, time.time_ns())
        outstanding = {r.command_id for r in rows} | {command_id for command_id, _node, _payload in relayed}
        for command_id in [c for c in self._sent if c not in outstanding]:
            del self._sent[command_id]  # answered, cancelled or given up: never sent again
        sent = 0
        for record in rows:
            if record.kind in remediation_mod.AGENT_KINDS and record.node_id in self.ingest.sessions:
                sent += self._deliver(actions.from_dict(record.payload), record.dispatched_unix_ns)
        for command_id, node_id, payload in relayed:
            session = self.ingest.sessions.get(node_id)
            if session is None or self._sent.get(command_id) == session.session_id:
                continue
            if self.ingest.dispatch(node_id, commands_pb.Command.FromString(payload)):
                self._sent[command_id] = session.session_id
                self.commands_sent += 1
                sent += 1
                log.info("relay_command_sent", node=node_id, command_id=command_id, action="relayed",
                         replica=self.leadership.replica_id)  # fmt: skip
        return sent

    async def _courier_forever(self) -> None:
        while True:
            await aio.wait_event(self._courier_wake, self.poll_s)
            self._courier_wake.clear()
            try:
                await self.deliver_pending()
            except Exception as exc:  # the store may be briefly unavailable; the next round retries
                log.warning("relay_courier_failed", error=str(exc), error_type=type(exc).__name__)

    # -- intake (leader) ----------------------------------------------------------------------------------
    async def take_in(self) -> dict[str, Any]:
        """Pass relayed commands' results to their senders; on the leader, apply results and decide events.

        Returns what the leader handled (stored results applied, events decided).
        """
        handled: dict[str, Any] = {"results": 0, "events": 0}
        await self._collect_awaited()
        if self.remediation is None or not (self._leading and self.leadership.is_leader()):
            return handled
        if time.monotonic() - self._inventory_at >= INVENTORY_REFRESH_S:
            await self.refresh_inventory()
        stored = await self.ingest.run_in_store(self.store.results)
        for command_id, node_id, payload in stored:
            # Forgotten only once its commit returned: a result applied in memory only would be
            # lost with this term.
            if not await self.remediation.commit_result(node_id, commands_pb.ActionResult.FromString(payload)):
                break  # the store is down: the rest next round, in order
            await self.ingest.run_in_store(self.store.forget_results, [command_id])
            handled["results"] += 1
        dirty = await self.ingest.run_in_store(self.store.nodes_with_new_events)
        if dirty:
            fresh = await self.ingest.run_in_store(self.store.new_events, dirty)
            if set(fresh) - set(self.ingest.sessions) - set(self.ingest.node_labels):
                await self.refresh_inventory()  # a node the leader has not heard of yet
            for node_id, (labels, _events) in fresh.items():  # blast radius needs every node's topology
                self.ingest.remember_remote_node(node_id, labels, self.ingest.node_gpus(node_id))
            await asyncio.gather(
                *(self.remediation.on_events(node_id, events, labels) for node_id, (labels, events) in fresh.items())
            )
            handled["events"] = sum(len(events) for _labels, events in fresh.values())
        return handled

    async def refresh_inventory(self) -> None:
        """Learn the labels and GPUs of nodes on other replicas: blast radius and validation need them."""
        self._inventory_at = time.monotonic()
        inventory = await self.ingest.run_in_store(self.store.connected_inventory)
        for node_id, (labels, gpu_uuids) in inventory.items():
            self.ingest.remember_remote_node(node_id, labels, gpu_uuids)

    async def _intake_forever(self) -> None:
        while True:
            await aio.wait_event(self._intake_wake, self.poll_s)
            self._intake_wake.clear()
            try:
                await self.take_in()
            except Exception as exc:  # e.g. NotLeaderError after a takeover; the election loop steps down
                log.warning("relay_intake_failed", error=str(exc), error_type=type(exc).__name__)
