"""Where the ladder's commands go, and who hears of its decisions: the service's collaborators at its edge.

`CommandOutlet` takes a dispatched agent command on its way to the node (and an operator's
validation run, whose result it awaits). On a single replica it is `LocalStreams`, this replica's
agent streams; with lease election, the relay's courier (`rasd.controller.replication.relay.Courier`),
which reaches a node whichever replica holds its stream. `DecisionRecorder` is told of every
decision put in the outbox and every SDC accusation (`rasd.controller.observability.recording`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from rasd.controller.core import agent_messages as msgs
from rasd.controller.core.remediation import actions
from rasd.controller.core.remediation import policy as policy_mod
from rasd.controller.ingest import streams as streams_mod
from rasd.controller.wire import commands as wire_commands


class CommandOutlet(Protocol):
    """Takes the ladder's agent commands to their nodes."""

    def send(self, action: actions.Action, *, deadline_unix_ns: int | None = None) -> bool:
        """Put a dispatched agent command on its way; False when it cannot go now (the node has no stream).

        deadline_unix_ns: when the ladder stops waiting for it (None: its kind's timeout from now).
        """
        ...

    async def validate(self, node_id: str, run: msgs.ValidationRun, *, timeout_s: float) -> msgs.AgentResult:
        """Send an operator's validation run and wait for its result.

        Raises:
            TimeoutError: no result within timeout_s.
            ConnectionError: the node's stream closed before the result came back.
            LookupError: the node has no stream to send it on.
        """
        ...

    async def reachable(self, node_id: str) -> bool:
        """Whether a stream of the node is open (on any replica this outlet reaches)."""
        ...


class DecisionRecorder(Protocol):
    """Hears of the ladder's decisions and what entered it besides events (the controller's recording)."""

    def decisions(self, decided: Sequence[actions.Action], at_unix_ns: int) -> None:
        """Actions a commit newly put in the outbox, decided at controller time at_unix_ns."""
        ...

    def accusation(self, node_id: str, gpu_uuid: str, *, reason: str, accuser: str, at_unix_ns: int) -> None:
        """An SDC accusation entered the ladder."""
        ...

    def node_lost(self, node_id: str, *, message: str, last_seen_unix_ns: int, at_unix_ns: int) -> None:
        """The lost-node watch's NODE_LOST event entered the ladder."""
        ...

    def operator_action(
        self, node_id: str, gpu_uuid: str, *, action: str, reason: str, actor: str, force: bool, at_unix_ns: int
    ) -> None:
        """An operator's quarantine, release, pause or resume was taken (node_id empty for pause and resume)."""
        ...


class NoRecorder:
    """A `DecisionRecorder` that keeps nothing (no recording configured)."""

    def decisions(self, decided: Sequence[actions.Action], at_unix_ns: int) -> None:
        """Nothing to record."""

    def accusation(self, node_id: str, gpu_uuid: str, *, reason: str, accuser: str, at_unix_ns: int) -> None:
        """Nothing to record."""

    def node_lost(self, node_id: str, *, message: str, last_seen_unix_ns: int, at_unix_ns: int) -> None:
        """Nothing to record."""

    def operator_action(
        self, node_id: str, gpu_uuid: str, *, action: str, reason: str, actor: str, force: bool, at_unix_ns: int
    ) -> None:
        """Nothing to record."""


class LocalStreams:
    """The `CommandOutlet` of a single replica: this replica's agent streams."""

    def __init__(self, agent_streams: streams_mod.AgentStreams, policy: policy_mod.EscalationPolicy) -> None:
        """Send on agent_streams; policy: the ladder's, for each command's deadline (`wire.commands.agent_command`)."""
        self._streams = agent_streams
        self._policy = policy

    def send(self, action: actions.Action, *, deadline_unix_ns: int | None = None) -> bool:
        """Queue the command on its node's stream here; False when the node has none (or it is stuck)."""
        command = wire_commands.agent_command(
            action,
            self._policy,
            self._streams.node_gpus(action.node_id),
            self._streams.clock(),
            deadline_unix_ns=deadline_unix_ns,
        )
        return self._streams.dispatch(action.node_id, command)

    async def validate(self, node_id: str, run: msgs.ValidationRun, *, timeout_s: float) -> msgs.AgentResult:
        """`AgentStreams.send_command` of the run's command."""
        return await self._streams.send_command(node_id, wire_commands.validation_command(run), timeout_s=timeout_s)

    async def reachable(self, node_id: str) -> bool:
        """Whether the node's stream is open on this replica."""
        return node_id in self._streams.sessions
