"""Several replicas, one controller: commands out through the outbox, events and results in to the leader.

With `election = "lease"` each replica runs a `Courier` (the ladder's command outlet) and a `Relay`
(the ingest's consumer), given to the ladder and the ingest at construction:

- **Courier** (every replica): the leader marks agent commands `dispatched` in the outbox
  (`commands`); each replica looks for dispatched commands of the nodes whose streams it holds and
  sends them, once per stream (a new stream of the node gets them again with the same ids: the agent
  answers a repeat from its journal and never runs it twice, DESIGN.md invariant 2). The leader sends
  to its own streams at once and the others find theirs within `relay_poll_s`.
- **Results** (every replica): a command result is stored (`command_results`) by the replica that
  received it; the leader applies stored results in arrival order and then forgets them. Applying a
  result twice is harmless: the ladder calls a result nobody waits for stale.
- **Relayed commands** (any replica): `Courier.send_command` is `Ingest.send_command` for a node on
  any replica. A loop outside the ladder's outbox (the power loop's caps) calls it on the leader;
  when the stream is elsewhere the command goes through `relayed_commands`, the replica holding the
  stream sends it, and its result comes back through `command_results` to the waiting sender. A
  period's caps go together (`Courier.send_many`: written in groups, one deadline, each result
  handed over as it comes).
- **Intake** (the leader): events are stored by whichever replica holds the stream; the leader reads
  each node's new, gap-free events past the ladder's watermark and decides them. It is the only way
  events reach the ladder in this mode, so no event is decided twice, whichever replica received it.
- **Straggler effects** (any replica → the leader): each replica's straggler watch judges the GPUs
  whose streams it holds; its effects (notify, raise a cap, validate, quarantine) are kept in the
  store in order (`take_straggler_effects`) and the leader carries each out once
  (`remediation.stragglers.StragglerActions.carry_out`: the audit row, the power loop's floor, the
  ladder's STRAGGLER event), then forgets it. A failover loses none: the next leader finds them kept.

Replicas find work by polling the store every `relay_poll_s` (cheap queries: dispatched commands,
kept results, and per node its acked position against the ladder's watermark); a replica's own
streams are served at once. PostgreSQL LISTEN/NOTIFY could replace the polling; it is not needed
for correctness, only for latency.

Every write the leader's ladder makes carries its fencing token (`Leadership.fence` on the
remediation store), so once another replica has taken over, a late write of this one is refused.
Results and relayed commands cross replicas as serialized rasd.api.v1 messages (`wire.commands`).
"""

from __future__ import annotations

import asyncio
import functools
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import structlog

from rasd.common import aio
from rasd.controller.core import agent_messages as msgs
from rasd.controller.core import straggler_actions
from rasd.controller.core.remediation import actions
from rasd.controller.core.remediation import policy as policy_mod
from rasd.controller.ingest import consumer as consumer_mod
from rasd.controller.ingest import group_commit
from rasd.controller.ingest import streams as streams_mod
from rasd.controller.remediation import service as remediation_mod
from rasd.controller.replication import leader as leader_mod
from rasd.controller.store import relay as relay_store
from rasd.controller.store import remediation as rstore
from rasd.controller.store import repo
from rasd.controller.store import thread as store_thread
from rasd.controller.wire import commands as wire_commands

log = structlog.get_logger("rasd.controller")

MAX_RELAY_GROUP = 512
"""Relayed commands written (or withdrawn) in one transaction at most."""
RESULTS_PER_COMMIT = 512
"""Stored results the leader's ladder applies in one transaction at most (the decider's own passes group as many)."""
RESULTS_PER_READ = 1_000
"""Stored results read from the store at once."""
RESULTS_PER_INTAKE = 8_000
"""Stored results one intake round applies at most; then it decides the events waiting, and the next round
goes on (at once if events woke it, else after `relay_poll_s`)."""
INVENTORY_REFRESH_S = 10.0
"""How often the leader re-reads which nodes other replicas hold, with their labels and GPUs."""
ABANDONED_AFTER_S = 60.0
"""A relayed command this long past its expiry is dropped with its result by the leader (its sender is gone)."""
EFFECT_ATTEMPTS = 3
"""A kept straggler effect whose carrying out failed this many times is dropped (logged), so that one bad
effect cannot hold back every later one."""


class Courier:
    """Sends commands to this replica's streams from the outbox and from other replicas (the ladder's outlet)."""

    def __init__(
        self,
        agent_streams: streams_mod.AgentStreams,
        thread: store_thread.StoreThread,
        relay_records: relay_store.RelayStore,
        replica_id: str,
        *,
        poll_s: float,
        outbox: rstore.RemediationStore | None,
        policy: policy_mod.EscalationPolicy,
    ) -> None:
        """Send on agent_streams; read relayed commands from relay_records and dispatched ones from outbox.

        outbox: the ladder's store (None: this replica runs no ladder, and only relays commands).
        policy: the ladder's, for each command's deadline (`wire.commands.agent_command`).
        """
        self._streams = agent_streams
        self._thread = thread
        self.store = relay_records
        self._replica_id = replica_id
        self._poll_s = poll_s
        self._outbox = outbox
        self._policy = policy
        self._sent: dict[str, str] = {}
        """command id → the session it went out on (a new session of the node gets it again)."""
        self.relayed_sent: set[str] = set()
        """Ids of the relayed commands this replica delivered and has not seen withdrawn or expired:
        their results are their senders' (`Relay.result` marks them), not the ladder's."""
        self._awaiting: dict[str, asyncio.Future[msgs.AgentResult]] = {}
        """Relayed commands this replica sent and waits for, by command id."""
        self._wake = asyncio.Event()
        self.commands_sent = 0
        store = relay_records
        # A power period relays one command per node at once: one transaction for all that wait then.
        self._relays: group_commit.GroupCommit[None] = group_commit.GroupCommit(
            "rasd-relay-commands", thread.run, store.relay_commands, lambda *row: store.relay_commands([row])[0],
            MAX_RELAY_GROUP,
        )  # fmt: skip
        self._withdrawals: group_commit.GroupCommit[None] = group_commit.GroupCommit(
            "rasd-relay-withdrawals", thread.run, store.forget_relayed_groups, store.forget_relayed, MAX_RELAY_GROUP
        )

    def wake(self) -> None:
        """Look for commands to deliver now (a node's stream opened here)."""
        self._wake.set()

    # -- the ladder's outlet -----------------------------------------------------------------------------
    def send(self, action: actions.Action, *, deadline_unix_ns: int | None = None) -> bool:
        """The ladder dispatched an agent command: send it now if the stream is here, else a courier will.

        deadline_unix_ns is not used: a late delivery gets what is left of the ladder's wait, counted
        from the dispatch (`_deliver`). Always True: the command is in the outbox either way, and
        whichever replica holds the stream delivers it.
        """
        if action.node_id in self._streams.sessions:
            self._deliver(action)
        else:
            self._wake.set()
        return True

    async def validate(self, node_id: str, run: msgs.ValidationRun, *, timeout_s: float) -> msgs.AgentResult:
        """An operator's validation run, to the node on any replica (`send_command`)."""
        return await self.send_command(node_id, wire_commands.validation_command(run), timeout_s=timeout_s)

    async def reachable(self, node_id: str) -> bool:
        """Whether this or another replica holds the node's stream (another's: its connected row)."""
        if node_id in self._streams.sessions:
            return True
        return bool(await self._thread.run(self.store.node_connected, node_id))

    # -- relayed commands --------------------------------------------------------------------------------
    async def send_command(
        self, node_id: str, command: wire_commands.Command, *, timeout_s: float = 30.0
    ) -> msgs.AgentResult:
        """Send a command to a node on any replica and wait for its result (`Ingest.send_command` semantics).

        Raises:
            TimeoutError: no result within timeout_s (no replica holds the node's stream, or the agent
                did not answer); the command is withdrawn.
            ConnectionError: the node's stream on this replica closed before the result came back.
        """
        if node_id in self._streams.sessions:
            return await self._streams.send_command(node_id, command, timeout_s=timeout_s)
        if not command.command_id:
            command.command_id = uuid.uuid4().hex
        now = time.time_ns()
        future: asyncio.Future[msgs.AgentResult] = asyncio.get_running_loop().create_future()
        self._awaiting[command.command_id] = future
        try:
            payload = wire_commands.command_to_bytes(command)
            expires = now + int(timeout_s * 1e9)
            await self._relays.submit(command.command_id, node_id, payload, self._replica_id, now, expires)
            # The row's expiry is the sender's deadline: no courier delivers it after, so a slow
            # write leaves only what is left of timeout_s to wait (none: it was written too late).
            left_s = (expires - time.time_ns()) / 1e9
            if left_s <= 0:
                raise TimeoutError(
                    f"relayed command {command.command_id} to node {node_id} was stored after its deadline"
                )
            return await asyncio.wait_for(future, timeout=left_s)
        finally:
            self._awaiting.pop(command.command_id, None)
            await self._withdrawals.submit((command.command_id,))

    async def send_many(
        self,
        commands: Sequence[tuple[str, wire_commands.Command]],
        *,
        timeout_s: float,
        on_result: Callable[[int, msgs.AgentResult | BaseException], None],
    ) -> None:
        """`send_command` for many (node, command) pairs at once; each outcome to on_result(index, result or error).

        A power period sends one SetPowerCap per node. Sent one by one, each relayed command took a
        task, a timer and two store round trips of its own, ~100 µs of the leader's event loop: a
        wave of 18,000 caps kept the loop from the next period's reads for seconds. Here the relayed
        ones are written `MAX_RELAY_GROUP` to a transaction, wait for one deadline together, and are
        withdrawn together; each result is handed over as it comes. The errors are `send_command`'s
        (TimeoutError, ConnectionError, the store's). Returns when every outcome has been given.
        """
        local = [(i, node_id, command) for i, (node_id, command) in enumerate(commands)
                 if node_id in self._streams.sessions]  # fmt: skip
        local_sends = asyncio.create_task(
            aio.send_each(self._streams.send_command, local, timeout_s=timeout_s, on_result=on_result)
        )
        held = {i for i, _node_id, _command in local}
        remote = [(i, node_id, command) for i, (node_id, command) in enumerate(commands) if i not in held]
        try:
            if remote:
                await self._relay_many(remote, timeout_s, on_result)
        finally:
            await local_sends

    async def _relay_many(
        self,
        remote: Sequence[tuple[int, str, wire_commands.Command]],
        timeout_s: float,
        on_result: Callable[[int, msgs.AgentResult | BaseException], None],
    ) -> None:
        """The relayed part of `send_many`: rows written in groups, one deadline, withdrawn together."""
        loop = asyncio.get_running_loop()
        now = time.time_ns()
        expires = now + int(timeout_s * 1e9)
        waiting: dict[str, tuple[int, asyncio.Future[msgs.AgentResult]]] = {}
        rows = []
        for index, node_id, command in remote:
            if not command.command_id:
                command.command_id = uuid.uuid4().hex
            future: asyncio.Future[msgs.AgentResult] = loop.create_future()
            self._awaiting[command.command_id] = future
            waiting[command.command_id] = (index, future)
            payload = wire_commands.command_to_bytes(command)
            rows.append((command.command_id, node_id, payload, self._replica_id, now, expires))
        try:
            for start in range(0, len(rows), MAX_RELAY_GROUP):
                group = rows[start : start + MAX_RELAY_GROUP]
                try:
                    await self._thread.run(self.store.relay_commands, group)
                except Exception as exc:  # as `send_command`: a command the store did not take fails with its error
                    for row in group:
                        waiting[row[0]][1].set_exception(exc)
            for index, future in waiting.values():
                future.add_done_callback(functools.partial(_hand_over, on_result, index))
            # The rows' expiry is the senders' deadline: no courier delivers one after it.
            left_s = (expires - time.time_ns()) / 1e9
            open_futures = [future for _index, future in waiting.values() if not future.done()]
            if open_futures and left_s > 0:
                await asyncio.wait(open_futures, timeout=left_s)
            for command_id, (_index, future) in waiting.items():
                if not future.done():
                    future.set_exception(
                        TimeoutError(f"no result for relayed command {command_id} within {timeout_s:g} s")
                    )
        finally:
            for command_id in waiting:
                self._awaiting.pop(command_id, None)
            await self._withdrawals.submit(tuple(waiting))

    async def collect_awaited(self) -> None:
        """Pass the stored results of relayed commands to their waiting senders."""
        if not self._awaiting:
            return
        found = await self._thread.run(self.store.results_for, self._replica_id)
        for command_id, payload in found.items():
            future = self._awaiting.get(command_id)
            if future is not None and not future.done():
                future.set_result(wire_commands.result_from_bytes(payload))

    # -- courier -----------------------------------------------------------------------------------------
    def _deliver(self, action: actions.Action, dispatched_unix_ns: int | None = None) -> bool:
        session = self._streams.sessions.get(action.node_id)
        if session is None or self._sent.get(action.command_id) == session.session_id:
            return False
        command = wire_commands.agent_command(
            action,
            self._policy,
            self._streams.node_gpus(action.node_id),
            time.time_ns(),
            # The ladder's wait counts from the dispatch: a late delivery gets only what is left of it.
            deadline_unix_ns=None
            if dispatched_unix_ns is None
            else dispatched_unix_ns + int(self._policy.timeout_s(action.kind) * 1e9),
        )
        if not self._streams.dispatch(action.node_id, command):
            return False
        self._sent[action.command_id] = session.session_id
        self.commands_sent += 1
        log.info("relay_command_sent", node=action.node_id, command_id=action.command_id, action=action.kind,
                 replica=self._replica_id)  # fmt: skip
        return True

    async def deliver_pending(self) -> int:
        """Send outbox and relayed commands of this replica's streams not yet sent on them; returns how many."""
        sessions = self._streams.sessions
        if not sessions:
            self._sent.clear()
            return 0
        outbox = self._outbox
        # This replica's nodes only, and all of them: a cap of 10,000 rows across the fleet held the newest
        # commands back from their streams in a large storm until older ones had finished.
        mine = list(sessions)
        rows = (
            []
            if outbox is None
            else await self._thread.run(lambda: outbox.commands(statuses=("dispatched",), node_ids=mine, limit=None))
        )
        relayed = await self._thread.run(self.store.relayed_commands, time.time_ns(), list(sessions))
        outstanding = {r.command_id for r in rows} | {command_id for command_id, _node, _payload in relayed}
        for command_id in [c for c in self._sent if c not in outstanding]:
            del self._sent[command_id]  # answered, cancelled or given up: never sent again
            self.relayed_sent.discard(command_id)
        sent = 0
        for record in rows:
            if record.kind in remediation_mod.AGENT_KINDS and record.node_id in sessions:
                sent += self._deliver(actions.from_dict(record.payload), record.dispatched_unix_ns)
        for command_id, node_id, payload in relayed:
            session = sessions.get(node_id)
            if session is None or self._sent.get(command_id) == session.session_id:
                continue
            if self._streams.dispatch(node_id, wire_commands.command_from_bytes(payload)):
                self._sent[command_id] = session.session_id
                self.relayed_sent.add(command_id)
                self.commands_sent += 1
                sent += 1
                log.info("relay_command_sent", node=node_id, command_id=command_id, action="relayed",
                         replica=self._replica_id)  # fmt: skip
        return sent

    async def deliver_forever(self) -> None:
        """Deliver what waits, every poll or at once when woken."""
        while True:
            await aio.wait_event(self._wake, self._poll_s)
            self._wake.clear()
            try:
                await self.deliver_pending()
            except Exception as exc:  # the store may be briefly unavailable; the next round retries
                log.warning("relay_courier_failed", error=str(exc), error_type=type(exc).__name__)


def _hand_over(
    on_result: Callable[[int, msgs.AgentResult | BaseException], None],
    index: int,
    future: asyncio.Future[msgs.AgentResult],
) -> None:
    """A relayed command's outcome to its sender (`Courier.send_many`); none for one cancelled with its sender."""
    if future.cancelled():
        return
    error = future.exception()
    on_result(index, error if error is not None else future.result())


class Relay:
    """The result store and the leader's intake of one replica: the ingest's consumer with lease election."""

    def __init__(
        self,
        courier: Courier,
        event_log: consumer_mod.EventLog,
        leadership: leader_mod.Leadership,
        ladder: remediation_mod.RemediationService | None,
        *,
        agent_streams: streams_mod.AgentStreams,
        thread: store_thread.StoreThread,
        poll_s: float,
    ) -> None:
        """Store events through event_log; run the ladder (None: none on this replica) while this replica leads.

        The ladder's terms follow the leadership (`Leadership.on_elected` / `on_deposed`); agent_streams
        learns the inventory of other replicas' nodes; store calls run on thread.
        """
        self.courier = courier
        self.store = courier.store
        self._event_log = event_log
        self._streams = agent_streams
        self._thread = thread
        self.leadership = leadership
        self.ladder = ladder
        self.poll_s = poll_s
        store = courier.store
        # A power period's caps come back from every node here at once: one transaction for all then.
        self._results: group_commit.GroupCommit[bool] = group_commit.GroupCommit(
            "rasd-relay-results", thread.run, store.save_results,
            lambda command_id, node_id, result, replica_id, now_unix_ns, relayed: store.save_result(
                command_id=command_id, node_id=node_id, result=result, replica_id=replica_id, now_unix_ns=now_unix_ns,
                relayed=relayed,
            ),
            MAX_RELAY_GROUP,
        )  # fmt: skip
        self._intake_wake = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self.on_fresh: Callable[[list[repo.StoredEvent]], None] | None = None
        """Told of the events the leader takes from the store to decide, every replica's (the watchers'
        fan-out, `rasd.controller.changes.Changes.publish_events`): it must not block."""
        self._leading = False
        self._inventory_at = 0.0
        self._swept_at = 0.0
        self.results_relayed = 0
        self.abandoned_dropped = 0
        self._effects_unkept: list[straggler_actions.Effect] = []
        """The straggler watch's effects not in the store yet, in order (retried each poll after a store failure)."""
        self._keeping = asyncio.Lock()
        self._effect_tasks: set[asyncio.Task[None]] = set()
        self._effect_failures: dict[int, int] = {}
        self.straggler_effects_carried = 0
        if ladder is not None:
            leadership.on_elected(self._elected)
            leadership.on_deposed(self._deposed)

    async def start(self) -> None:
        """Start the courier (every replica) and the intake loop (acts only while this replica leads)."""
        self._tasks = [
            asyncio.create_task(self.courier.deliver_forever(), name="rasd-relay-courier"),
            asyncio.create_task(self._intake_forever(), name="rasd-relay-intake"),
        ]

    async def stop(self) -> None:
        """Stop both loops (and any keeping of straggler effects under way)."""
        tasks = [*self._tasks, *self._effect_tasks]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._tasks = []

    async def send_command(
        self, node_id: str, command: wire_commands.Command, *, timeout_s: float = 30.0
    ) -> msgs.AgentResult:
        """`Courier.send_command`: to a node on any replica."""
        return await self.courier.send_command(node_id, command, timeout_s=timeout_s)

    # -- the ingest's consumer -------------------------------------------------------------------------
    async def events(self, batch: consumer_mod.EventBatch) -> consumer_mod.TakenEvents:
        """Store a batch apart: the leader reads new events from the store and decides them (this one, if it leads).

        Never stored with a decision here: events are stored by the replica that holds their stream.
        """
        taken = await self._event_log.store_apart(batch)
        if taken.fresh and self.ladder is not None:
            self._intake_wake.set()
        return taken

    async def result(self, node_id: str, result: msgs.AgentResult) -> None:
        """Store a result for the leader (it applies stored results in arrival order).

        A relayed command's result this replica delivered is marked for its sender (`results_for`).
        """
        payload = wire_commands.result_to_bytes(result)
        relayed = result.command_id in self.courier.relayed_sent
        await self._results.submit(
            result.command_id, node_id, payload, self.leadership.replica_id, time.time_ns(), relayed
        )
        self.results_relayed += 1
        self._intake_wake.set()

    # -- straggler effects (every replica → the leader) ---------------------------------------------------
    def take_straggler_effects(self, effects: Sequence[straggler_actions.Effect]) -> None:
        """The straggler watch's actuator with several replicas: its effects kept for the leader (from the loop)."""
        if not effects:
            return
        self._effects_unkept.extend(effects)
        task = asyncio.get_running_loop().create_task(self.keep_straggler_effects(), name="rasd-relay-effects")
        self._effect_tasks.add(task)
        task.add_done_callback(self._effect_tasks.discard)

    async def keep_straggler_effects(self) -> int:
        """Store the effects not kept yet, in order, in one transaction; how many (0 after a failure: tried again)."""
        async with self._keeping:
            batch = list(self._effects_unkept)
            if not batch:
                return 0
            replica_id, now_ns = self.leadership.replica_id, time.time_ns()
            try:
                await self._thread.run(
                    lambda: self.store.keep_straggler_effects(batch, replica_id=replica_id, now_unix_ns=now_ns)
                )
            except Exception as exc:  # the store is down: kept in memory, tried again at the next poll
                log.warning("straggler_effects_not_kept", effects=len(batch), error=str(exc))
                return 0
            del self._effects_unkept[: len(batch)]
        self._intake_wake.set()
        return len(batch)

    async def _carry_out_straggler_effects(self, ladder: remediation_mod.RemediationService) -> int:
        """Carry out the kept effects in order, forgetting each that is done; how many.

        One that fails stops the round (the store may be down: the rest wait, in order), and is dropped
        after `EFFECT_ATTEMPTS` tries.
        """
        done: list[int] = []
        try:
            for effect_id, effect in await self._thread.run(self.store.straggler_effects):
                try:
                    await ladder.stragglers.carry_out(effect)
                except Exception:
                    tries = self._effect_failures[effect_id] = self._effect_failures.get(effect_id, 0) + 1
                    log.exception("straggler_effect_failed", kind=effect.kind, node=effect.node_id, tries=tries)
                    if tries < EFFECT_ATTEMPTS:
                        break
                    self._effect_failures.pop(effect_id)
                done.append(effect_id)
        finally:
            if done:
                await self._thread.run(self.store.forget_straggler_effects, done)
        self.straggler_effects_carried += len(done)
        return len(done)

    async def connected(self, node_id: str) -> None:
        """A node's stream opened here: deliver its commands now."""
        self.courier.wake()

    # -- terms -------------------------------------------------------------------------------------------
    async def _elected(self, token: int) -> None:
        assert self.ladder is not None
        await self.ladder.start()
        self._leading = True
        self._intake_wake.set()

    async def _deposed(self) -> None:
        self._leading = False
        if self.ladder is not None:
            await self.ladder.stop()

    # -- intake (leader) ----------------------------------------------------------------------------------
    async def take_in(self) -> dict[str, Any]:
        """Pass relayed commands' results to their senders; on the leader, apply results and effects, decide events.

        Returns what the leader handled (stored results applied, straggler effects carried out, events decided).
        """
        handled: dict[str, Any] = {"results": 0, "events": 0, "straggler_effects": 0}
        await self.courier.collect_awaited()
        if self._effects_unkept:
            await self.keep_straggler_effects()
        if self.leadership.is_leader() and time.monotonic() - self._swept_at >= ABANDONED_AFTER_S:
            await self.drop_abandoned()
        ladder = self.ladder
        if ladder is None or not (self._leading and self.leadership.is_leader()):
            return handled
        if time.monotonic() - self._inventory_at >= INVENTORY_REFRESH_S:
            await self.refresh_inventory()
        handled["results"] = await self._apply_results(ladder)
        handled["straggler_effects"] = await self._carry_out_straggler_effects(ladder)
        handled["events"] = await self._decide_events(ladder)
        return handled

    async def _apply_results(self, ladder: remediation_mod.RemediationService) -> int:
        """Apply the stored results in order, `RESULTS_PER_COMMIT` to a transaction; how many.

        Each group is forgotten only once its commit returned: a result applied in memory only would
        be lost with this term. One transaction (and one withdrawal) a result held the leader to a few
        hundred results a second, behind a storm on the other replicas' streams. Reads go on while
        they come back full, up to `RESULTS_PER_INTAKE`: one read a poll bounded the intake at
        `RESULTS_PER_READ` a poll.
        """
        applied = 0
        while applied < RESULTS_PER_INTAKE:
            stored = await self._thread.run(self.store.results, RESULTS_PER_READ)
            for first in range(0, len(stored), RESULTS_PER_COMMIT):
                group = stored[first : first + RESULTS_PER_COMMIT]
                results = [(node_id, wire_commands.result_from_bytes(payload)) for _id, node_id, payload in group]
                if not await ladder.commit_results(results):
                    return applied  # the store is down: the rest next round, in order
                await self._thread.run(self.store.forget_results, [command_id for command_id, _n, _p in group])
                applied += len(group)
            if len(stored) < RESULTS_PER_READ:
                break
        return applied

    async def _decide_events(self, ladder: remediation_mod.RemediationService) -> int:
        """Decide each node's new, gap-free events past the ladder's watermark; how many."""
        dirty = await self._thread.run(self.store.nodes_with_new_events)
        if not dirty:
            return 0
        fresh = await self._thread.run(self.store.new_events, dirty)
        streams = self._streams
        if set(fresh) - set(streams.sessions) - set(streams.node_labels):
            await self.refresh_inventory()  # a node the leader has not heard of yet
        for node_id, (labels, _events) in fresh.items():  # blast radius needs every node's topology
            streams.remember_remote_node(node_id, labels, streams.node_gpus(node_id))
        if self.on_fresh is not None:
            self.on_fresh([event for _labels, events in fresh.values() for event in events])
        await asyncio.gather(
            *(ladder.on_events(node_id, events, labels) for node_id, (labels, events) in fresh.items())
        )
        return sum(len(events) for _labels, events in fresh.values())

    async def drop_abandoned(self) -> int:
        """Drop relayed commands long past their expiry, and their results (their senders are gone); how many."""
        self._swept_at = time.monotonic()
        before = time.time_ns() - int(ABANDONED_AFTER_S * 1e9)
        dropped = await self._thread.run(self.store.forget_expired, before)
        if dropped:
            self.abandoned_dropped += dropped
            log.info("relay_abandoned_commands_dropped", commands=dropped)
        return dropped

    async def refresh_inventory(self) -> None:
        """Learn the labels and GPUs of nodes on other replicas: blast radius and validation need them."""
        self._inventory_at = time.monotonic()
        inventory = await self._thread.run(self.store.connected_inventory)
        for node_id, (labels, gpu_uuids) in inventory.items():
            self._streams.remember_remote_node(node_id, labels, gpu_uuids)

    async def _intake_forever(self) -> None:
        while True:
            await aio.wait_event(self._intake_wake, self.poll_s)
            self._intake_wake.clear()
            try:
                await self.take_in()
            except Exception as exc:  # e.g. NotLeaderError after a takeover; the election loop steps down
                log.warning("relay_intake_failed", error=str(exc), error_type=type(exc).__name__)
