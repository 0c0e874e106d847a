"""This replica's agent streams: the open sessions, what each node said (Hello, telemetry), and sending to them.

The ingest opens and closes sessions here; the repair ladder and the relay read the inventory
(labels, GPUs: the budget's fleet view, validation targets) and send commands through it. A
command goes on its node's outbound queue as a wire message (`wire.stream`), which the stream's
writer (`rpc.agent_service`) writes as it is; its result comes back through `settle`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from collections.abc import Callable, Mapping
from typing import Any

from rasd.controller.core import agent_messages as msgs
from rasd.controller.core import fleet
from rasd.controller.wire import commands as wire_commands
from rasd.controller.wire import stream as wire_stream


class LabelsByNode(dict[str, dict[str, str]]):
    """Node id → its labels from its last Hello, with a count of changes.

    The budget's fleet view is rebuilt from these labels only when they changed; comparing 2,000
    nodes' labels on every decision pass cost more than a small pass's own decisions (~0.3 ms a
    pass). `version` moves with every write, so that check is one integer compare. Labels are
    replaced, never edited in place (a node's new Hello brings a new dict).
    """

    version: int = 0

    def __setitem__(self, node_id: str, labels: dict[str, str]) -> None:
        self.version += 1
        super().__setitem__(node_id, labels)

    def __delitem__(self, node_id: str) -> None:
        self.version += 1
        super().__delitem__(node_id)

    def __ior__(self, other: Any) -> LabelsByNode:  # type: ignore[override,misc]
        self.update(other)
        return self

    def pop(self, *args: Any) -> Any:
        """`dict.pop`, counted."""
        self.version += 1
        return super().pop(*args)

    def popitem(self) -> tuple[str, dict[str, str]]:
        """`dict.popitem`, counted."""
        self.version += 1
        return super().popitem()

    def clear(self) -> None:
        """`dict.clear`, counted."""
        self.version += 1
        super().clear()

    def update(self, *args: Any, **kwargs: dict[str, str]) -> None:
        """`dict.update`, counted."""
        self.version += 1
        super().update(*args, **kwargs)

    def setdefault(self, node_id: str, default: dict[str, str]) -> dict[str, str]:  # type: ignore[override]
        """`dict.setdefault`, counted."""
        self.version += 1
        return super().setdefault(node_id, default)


@dataclasses.dataclass(frozen=True)
class PendingCommand:
    """A command sent to an agent whose result someone awaits (`AgentStreams.send_command`)."""

    node_id: str
    action: str
    future: asyncio.Future[msgs.AgentResult]


@dataclasses.dataclass(eq=False)
class Session:
    """One open agent stream."""

    session_id: str
    node_id: str
    known_gpus: frozenset[str]
    outbound: asyncio.Queue[Any]
    """What goes on the stream, in order: wire messages (`wire.stream`), then None to end it."""
    opened_unix_ns: int
    replaced: bool = False
    spool_epoch: int | None = None
    """The epoch of the node's spool this stream's seqs count in (its Hello's `HelloOutcome.spool_epoch`)."""
    acked_seq: int | None = None
    """The node's acked position as this stream last heard it from the store (its Hello's, then each
    stored batch's): the seq its next new event has, if the agent sends in order."""
    summaries: bool = False
    """The stream's telemetry comes as summaries (TELEMETRY_FORMAT_SUMMARY), not every sample."""
    full_rate: frozenset[str] = frozenset()
    """The node's GPUs whose full power series this stream was asked for (`FullRateRequest`)."""
    agent_ahead_ns: int | None = None
    """How far the agent's clock runs ahead of this controller's at least, ns (negative: behind by at
    least that much); None until a stamped message arrived. Each agent stamp (a heartbeat's send
    time, a result's finish, the newest counters of a batch) was taken before the message arrived,
    so the clock offset is at least the stamp minus the arrival time; the largest such difference
    seen on this stream is the bound (`to_controller_ns`)."""

    def note_stamp(self, agent_unix_ns: int, received_unix_ns: int) -> None:
        """Tighten `agent_ahead_ns` with an agent stamp that arrived at received_unix_ns (controller clock)."""
        if agent_unix_ns > 0:
            ahead = agent_unix_ns - received_unix_ns
            if self.agent_ahead_ns is None or ahead > self.agent_ahead_ns:
                self.agent_ahead_ns = ahead

    def to_controller_ns(self, agent_unix_ns: int, received_unix_ns: int) -> int:
        """An agent stamp that arrived at received_unix_ns, in controller time; never later than its arrival.

        Later than the truth by at most the shortest transit seen on the stream (unless the agent's
        clock stepped forward since; still never past the arrival). Taken as it was, a stamp of an
        agent clock running ahead (2 h in the chaos tests) made a read-back taken before a power
        command arrived look newer than the command's deadline, and the power loop settled the
        command as expired before it landed (invariant 1). Too early is the safe side there: a
        command is only settled later.
        """
        corrected = agent_unix_ns - self.agent_ahead_ns if self.agent_ahead_ns is not None else agent_unix_ns
        return min(corrected, received_unix_ns)

    def stamp_agent_deadline(self, command: wire_commands.Command) -> None:
        """Give command its deadline on the agent's clock (``deadline_agent_unix_ns``), once the offset is bounded.

        The deadline plus the least the agent runs ahead: in real time never later than the
        controller's deadline. A read-back the power loop dates after the deadline (`to_controller_ns`)
        was then taken after the agent's clock passed it too, so a command not run by then never
        runs. Counted from its arrival instead (`runtime.on_local_clock` without it), a command
        delivered late ran after the loop had settled it as expired and given its watts away.
        """
        wire_commands.stamp_agent_deadline(command, self.agent_ahead_ns)


class AgentStreams:
    """This replica's sessions, the nodes' inventory and latest telemetry, and the commands awaited on them."""

    def __init__(self, *, clock: Callable[[], int]) -> None:
        """Start with no stream; clock: the controller's clock (unix ns)."""
        self.clock = clock
        self.sessions: dict[str, Session] = {}
        self.node_labels: LabelsByNode = LabelsByNode()
        self.gpu_nodes: dict[str, str] = {}
        """GPU uuid → the node whose last Hello on this replica listed it."""
        self.gpu_records: dict[str, fleet.GpuRecord] = {}
        """Each GPU's inventory record (power-limit constraints) from its node's last Hello."""
        self.boot_ids: dict[str, str] = {}
        """Each node's boot id from its last Hello (a new one means caps reset to default)."""
        self.latest: dict[str, fleet.GpuLatest] = {}
        """GPU uuid → its freshest telemetry (the agent's stamps), as the ingest keeps it."""
        self.latest_controller_ns: dict[str, int] = {}
        """GPU uuid → when its `latest` counters were sampled, in controller time (`Session.to_controller_ns`):
        what the power loop compares with its own clock."""
        self._node_gpus: dict[str, tuple[str, ...]] = {}
        self._pending: dict[str, PendingCommand] = {}

    def open(self, node_hello: fleet.NodeHello, session: Session) -> Session | None:
        """Make session its node's stream, with the node's inventory from its Hello; returns the one it replaced."""
        previous = self.sessions.get(node_hello.node_id)
        if previous is not None:
            previous.replaced = True
            previous.outbound.put_nowait(None)
        self.sessions[session.node_id] = session
        listed = {gpu.uuid for gpu in node_hello.gpus}
        for gpu_uuid in self._node_gpus.get(node_hello.node_id, ()):
            if gpu_uuid not in listed and self.gpu_nodes.get(gpu_uuid) == node_hello.node_id:
                del self.gpu_nodes[gpu_uuid]  # it left the node: another node's Hello may list it now
        for gpu in node_hello.gpus:
            self.gpu_nodes[gpu.uuid] = gpu.node_id
        self.node_labels[session.node_id] = dict(node_hello.labels)
        self._node_gpus[session.node_id] = tuple(g.uuid for g in node_hello.gpus)
        self.gpu_records.update({g.uuid: g for g in node_hello.gpus})
        self.boot_ids[session.node_id] = node_hello.boot_id
        return previous

    def close(self, session: Session) -> bool:
        """Forget a stream; True when it was its node's current one. Results awaited on the node fail."""
        current = self.sessions.get(session.node_id) is session
        if current:
            del self.sessions[session.node_id]
        for command_id, pending in list(self._pending.items()):
            if pending.node_id == session.node_id:
                if not pending.future.done():
                    pending.future.set_exception(
                        ConnectionError(f"stream to {session.node_id} closed before the result came back")
                    )
                del self._pending[command_id]
        return current

    def end_all(self) -> None:
        """End every open stream (its agent reconnects, to another replica if there is one)."""
        for session in list(self.sessions.values()):
            session.outbound.put_nowait(None)

    def forget_gpu_owner(self, gpu_uuid: str, node_id: str) -> None:
        """node_id's GPU left it (an operator said so): it is no node's until a node's Hello lists it."""
        if self.gpu_nodes.get(gpu_uuid) == node_id:
            del self.gpu_nodes[gpu_uuid]
        self._node_gpus[node_id] = tuple(g for g in self._node_gpus.get(node_id, ()) if g != gpu_uuid)

    def node_gpus(self, node_id: str) -> tuple[str, ...]:
        """The GPU UUIDs a node announced in its last Hello."""
        return self._node_gpus.get(node_id, ())

    def remember_remote_node(self, node_id: str, labels: Mapping[str, str], gpu_uuids: tuple[str, ...]) -> None:
        """Know a node whose stream another replica holds (its Hello, from the store): the leader's view."""
        if node_id not in self.sessions:
            self.node_labels[node_id] = dict(labels)
            self._node_gpus[node_id] = gpu_uuids

    def to_controller_ns(self, node_id: str, agent_unix_ns: int) -> int:
        """A stamp from node_id's agent that arrives now, in controller time (`Session.to_controller_ns`)."""
        now = self.clock()
        session = self.sessions.get(node_id)
        return session.to_controller_ns(agent_unix_ns, now) if session is not None else min(agent_unix_ns, now)

    def dispatch(self, node_id: str, command: wire_commands.Command) -> bool:
        """Queue a command on the node's stream without waiting; False when the node has no stream.

        Its result arrives through the ingest's consumer (`IngestConsumer.result`).
        """
        session = self.sessions.get(node_id)
        if session is None:
            return False
        session.stamp_agent_deadline(command)
        try:
            session.outbound.put_nowait(wire_stream.command_message(command))
        except asyncio.QueueFull:
            return False
        return True

    async def send_command(
        self, node_id: str, command: wire_commands.Command, *, timeout_s: float = 30.0
    ) -> msgs.AgentResult:
        """Send a command to a connected node and wait for its result.

        Raises:
            LookupError: the node has no open stream on this replica.
            TimeoutError: no result within timeout_s.
            ConnectionError: the stream closed before the result came back.
        """
        session = self.sessions.get(node_id)
        if session is None:
            raise LookupError(f"node {node_id!r} has no open stream on this replica")
        if not command.command_id:
            command.command_id = uuid.uuid4().hex
        future: asyncio.Future[msgs.AgentResult] = asyncio.get_running_loop().create_future()
        self._pending[command.command_id] = PendingCommand(
            node_id=node_id, action=wire_commands.command_kind(command), future=future
        )
        session.stamp_agent_deadline(command)
        await session.outbound.put(wire_stream.command_message(command))
        try:
            return await asyncio.wait_for(future, timeout=timeout_s)
        finally:
            self._pending.pop(command.command_id, None)

    def settle(self, result: msgs.AgentResult) -> PendingCommand | None:
        """Hand a result to whoever awaits it (`send_command`); the command it settled, or None: nobody waits."""
        pending = self._pending.pop(result.command_id, None)
        if pending is not None and not pending.future.done():
            pending.future.set_result(result)
        return pending
