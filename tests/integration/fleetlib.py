"""A live controller and simulated agents on their own event loop in a thread, driven by rasctl.

The operator-facing integration tests (rasctl against a real controller over loopback gRPC) all need
the same harness: start a `server.Controller`, connect agents with simulated GPUs, wait until every
node has a session, then call `rasctl.run` from the test thread and poll for outcomes.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import io
import pathlib
import threading
import time
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any, TypeVar

from rasd.agent import kmsg_source, node_ops, runtime, spool
from rasd.agent import settings as agent_settings
from rasd.agent.gpu import simulated
from rasd.cli import main as rasctl
from rasd.controller import server
from rasd.controller.replication import leader

T = TypeVar("T")


@dataclasses.dataclass
class Node:
    """One simulated node: its backend, labels, and whether destructive actions really run (simulated)."""

    backend: simulated.SimulatedBackend
    labels: Mapping[str, str] = dataclasses.field(default_factory=dict)
    node_ops: bool = True
    kmsg_path: pathlib.Path | None = None
    """A file the agent follows as its kernel log (/dev/kmsg records or plain lines); None: no kernel log."""


class ThreadedFleet:
    """`with ThreadedFleet(settings, nodes) as fleet:` runs a controller and one agent per node."""

    def __init__(self, settings: server.ControllerSettings, nodes: Mapping[str, Node]) -> None:
        self.settings = settings
        self.address = settings.listen
        self.nodes = dict(nodes)
        self.controller: server.Controller
        self.ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._agents: dict[str, asyncio.Task[None]] = {}

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as exc:  # surfaced by __enter__/__exit__, never swallowed
            self._error = exc
            self.ready.set()

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        self.controller = server.Controller(self.settings)
        await self.controller.start()
        tasks = []
        for node_id, node in self.nodes.items():
            agent = runtime.Agent(
                agent_settings.AgentSettings(
                    node_id=node_id,
                    labels=dict(node.labels),
                    link=agent_settings.LinkSettings(controller_address=self.address, telemetry_send_interval_ms=200),
                    actions=agent_settings.ActionSettings(destructive_enabled=True, kill_poll_s=0.0)
                    if node.node_ops
                    else agent_settings.ActionSettings(),
                ),
                node.backend,
                spool.Spool(":memory:"),
                boot_id="boot",
                ops=node_ops.SimulatedNodeOps(node.backend) if node.node_ops else None,
            )
            if node.kmsg_path is not None:
                follower = kmsg_source.KmsgFollower(node.kmsg_path.with_suffix(".cursor"), path=node.kmsg_path)
                agent.attach_kernel_log(follower, source_name="kmsg")
            tasks.append(asyncio.create_task(agent.run(self._stop)))
            self._agents[node_id] = tasks[-1]
        while len(self.controller.ingest.sessions) < len(self.nodes):
            await asyncio.sleep(0.05)
        self.ready.set()
        await self._stop.wait()
        ended = await asyncio.gather(*tasks, return_exceptions=True)  # a killed agent's task ends cancelled
        await self.controller.stop()
        failed = [e for e in ended if isinstance(e, BaseException) and not isinstance(e, asyncio.CancelledError)]
        if failed:
            raise failed[0]

    def __enter__(self) -> ThreadedFleet:
        self._thread.start()
        assert self.ready.wait(30), "agents did not connect within 30 s"
        if self._error is not None:
            raise self._error
        return self

    def __exit__(self, *exc: object) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(30)

    @property
    def backend(self) -> simulated.SimulatedBackend:
        """The only node's backend (for one-node fleets)."""
        (node,) = self.nodes.values()
        return node.backend

    def fire(self, fault: simulated.ScriptedFault, node_id: str | None = None) -> None:
        """Inject a fault on the fleet's event loop (on the only node unless node_id says which)."""
        backend = self.nodes[node_id].backend if node_id is not None else self.backend
        assert self._loop is not None
        self._loop.call_soon_threadsafe(backend.fire, fault, time.time_ns())

    def kill_agent(self, node_id: str) -> None:
        """The node's host dies: its agent stops at once, sending nothing more (no goodbye, no last flush)."""
        assert self._loop is not None
        self._loop.call_soon_threadsafe(self._agents[node_id].cancel)

    def rasctl(self, *argv: str) -> tuple[int, str, str]:
        """Run rasctl against this controller: (exit code, stdout, stderr)."""
        out, err = io.StringIO(), io.StringIO()
        code = rasctl.run(["--controller", self.address, *argv], out, err)
        return code, out.getvalue(), err.getvalue()


def wait_for(predicate: Callable[[], T], timeout_s: float = 20.0, poll_s: float = 0.2) -> T:
    """Poll until predicate() is truthy and return its value; fail after timeout_s."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(poll_s)
    raise AssertionError(f"condition not met within {timeout_s} s")


def sqlite_settings(tmp_path: Any, port: int, **overrides: Any) -> server.ControllerSettings:
    """Controller settings on loopback with a SQLite store in tmp_path and no metrics port."""
    return server.ControllerSettings(
        listen=f"127.0.0.1:{port}", db_url=f"sqlite:///{tmp_path / 'rasd.db'}", metrics_port=None, **overrides
    )


@dataclasses.dataclass
class TwoReplicas:
    """Two controller replicas on one PostgreSQL, `first` leading, and node-r streaming to the follower."""

    first: server.Controller
    second: server.Controller
    backend: simulated.SimulatedBackend


@contextlib.asynccontextmanager
async def two_replicas_a_node_on_the_follower(db_url: str, tmp_path: pathlib.Path) -> AsyncIterator[TwoReplicas]:
    """The chart's default (two replicas behind one Service), started in this event loop.

    Yields once node-r has a session on the follower and the follower knows the leader's address;
    the agent and both replicas stop on the way out.
    """
    first = replica(db_url, "a")
    await first.start()
    second = replica(db_url, "b")
    await second.start()
    backend = simulated.SimulatedBackend("node-r", 2, 0, workload=simulated.StepWorkload())
    agent = runtime.Agent(
        agent_settings.AgentSettings(
            node_id="node-r", link=agent_settings.LinkSettings(controller_address=second.address)
        ),
        backend,
        spool.Spool(str(tmp_path / "spool.db")),
        boot_id="boot-1",
        ops=node_ops.SimulatedNodeOps(backend),
    )
    stop = asyncio.Event()
    task = asyncio.create_task(agent.run(stop))
    try:
        while second.leadership.leader_address != first.address or "node-r" not in second.ingest.sessions:
            await asyncio.sleep(0.05)
        yield TwoReplicas(first, second, backend)
    finally:
        stop.set()
        await task
        await second.stop()
        await first.stop()


def replica(db_url: str, name: str, **overrides: Any) -> server.Controller:
    """A replica on db_url (replica id ctl-<name>, a 3 s lease, a fast relay); overrides: other settings."""
    return server.Controller(
        server.ControllerSettings(
            listen="127.0.0.1:0",
            db_url=db_url,
            metrics_port=None,
            leader=leader.LeaderSettings(replica_id=f"ctl-{name}", lease_s=3.0, renew_s=0.5, relay_poll_s=0.05),
            **overrides,
        )
    )
