"""The agent's runtime: samples the GPU backend, keeps the controller stream up, runs commands.

Two things run for the agent's whole life:

1. The sampler (`rasd.agent.sampler`) reads power at 10 Hz (or the driver's own sample buffer)
   and counters at 1 Hz into bounded buffers, and polls the backend for health observations, which
   go straight into the durable spool. It keeps running while the controller is unreachable, so no
   event is missed during an outage, and checks the power fail-safe (`rasd.agent.failsafe`) every cycle.
2. The link keeps one bidirectional stream to the controller, reconnecting with exponential backoff
   and full jitter. Per stream: Hello → Welcome (with the controller's acked spool position) →
   resend every unacked event → then telemetry (per-second summaries, or every sample to a
   controller before summaries: the Welcome's `telemetry_format`), new events and heartbeats go out
   through a single writer task (gRPC streams must not be written concurrently), while acks and commands come
   in. Commands run in a worker thread so a slow action never stalls telemetry.

Telemetry is not spooled: it is high-rate and only its freshness matters. Buffers are bounded and
drop the oldest samples during an outage.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import random
import threading
import time
from collections.abc import Callable, Mapping

import grpc
import structlog

from rasd.agent import actions, failsafe, gpu, kmsg_source, node_ops, sampler, sources, spool, wire
from rasd.agent import settings as agent_settings
from rasd.agent.core import model
from rasd.api.v1 import agent_service_pb2 as agent_pb
from rasd.api.v1 import agent_service_pb2_grpc as agent_grpc
from rasd.common import VERSION, aio, tls

log = structlog.get_logger("rasd.agent")

Clock = Callable[[], int]


@dataclasses.dataclass(frozen=True)
class NodeIdentity:
    """Who this agent speaks for."""

    node_id: str
    boot_id: str
    hostname: str
    labels: Mapping[str, str] = dataclasses.field(default_factory=dict)


SESSION_CLEANUP_S = 5.0
"""How long a stream's tasks get to finish after it ends before the agent moves on without them."""

LONG_ACTIONS = (model.RunValidation, model.ResetGpu, model.RestartProcess, model.RebootNode)
"""Commands that may run for minutes: run beside the stream's reader, not in it."""

EVENT_WAIT_S = 1.0
"""How long one wait of the GPU-events thread lasts (`Agent._watch_gpu_events`): the most it delays stopping."""

COMMAND_DRAIN_S = 20.0
"""How long a stopping agent waits for a command under way (a reset) to end and write its result.

Below the unit's TimeoutStopSec (30 s): after it, systemd kills the agent, and the command's started
mark answers its resend as interrupted."""


@dataclasses.dataclass
class AgentStats:
    """Counters the agent keeps about itself (exported as metrics and used by tests)."""

    power_samples: int = 0
    telemetry_batches_sent: int = 0
    events_spooled: int = 0
    events_sent: int = 0
    commands_executed: int = 0
    connects: int = 0
    connect_failures: int = 0
    connected: bool = False
    stream_lost_by_code: dict[str, int] = dataclasses.field(default_factory=dict)
    """Why streams ended, by gRPC status code (or exception type): UNAVAILABLE means retry, UNKNOWN a bug."""
    failsafe_applied: int = 0
    last_cycle_ok_monotonic: float = 0.0


class Agent:
    """One node's agent: sampler + controller link + command executor."""

    def __init__(
        self,
        settings: agent_settings.AgentSettings,
        backend: gpu.GpuBackend,
        journal: spool.Spool,
        *,
        boot_id: str,
        hostname: str | None = None,
        clock: Clock = time.time_ns,
        rng: random.Random | None = None,
        ops: node_ops.NodeOps | None = None,
    ) -> None:
        """Wire the agent together; nothing runs until `run()`.

        boot_id and hostname (default: the node id) are announced in every Hello. ops and
        settings.actions.destructive_enabled enable destructive repairs; without both those answer
        DRY_RUN.
        """
        identity = NodeIdentity(settings.node_id, boot_id, hostname or settings.node_id, settings.labels)
        self.identity = identity
        self.backend = backend
        self.spool = journal
        self.settings = settings
        self.stats = AgentStats()
        self._clock = clock
        self._rng = rng or random.Random()
        self._executor = actions.ActionExecutor(backend, journal, clock, ops=ops, settings=settings.actions)
        self._inventory = tuple(backend.inventory())
        # What every Hello announces; an event about any other GPU goes out node-level (wire.events).
        self._known_gpus = frozenset(g.uuid for g in self._inventory)
        self._send_interval_ms = settings.link.telemetry_send_interval_ms
        self._heartbeat_interval_ms = settings.link.heartbeat_interval_ms
        self._event_counts: collections.Counter[tuple[str, str]] = collections.Counter()
        self._events_ready = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread = threading.get_ident()
        self._command_tasks: set[asyncio.Task[None]] = set()
        self._threads: list[tuple[str, Callable[[threading.Event], None]]] = []
        self._ib_poller: sources.IbPoller | None = None
        self.kernel_log: sources.KernelLogPump | None = None
        # Simulated backends answer instantly; NVML calls can block for milliseconds per GPU and
        # must not stall the event loop.
        self._blocking = getattr(backend, "blocking", backend.name != "simulated")
        # A backend whose event poll blocks until an event comes (NVML's event set) gets a thread of
        # its own that waits there: events are spooled as they happen, and the sampler does not
        # hand a poll to a worker thread five times a second (bench/RESULTS.md "Agent overhead").
        self._events_thread = bool(getattr(backend, "event_wait_blocks", False))
        if self._events_thread:
            self._threads.append(("gpu-events", self._watch_gpu_events))
        self._log = log.bind(node=identity.node_id)
        self.failsafe = failsafe.FailSafe(
            settings.failsafe,
            backend,
            self._executor,
            self._inventory,
            self.stats,
            clock=clock,
            call=self._call,
            node_id=identity.node_id,
        )
        self._sampler = sampler.Sampler(
            settings,
            backend,
            self._executor,
            self.stats,
            self.failsafe,
            observe=self.observe,
            clock=clock,
            call=self._call,
            poll_events=not self._events_thread,
        )

    def attach_kernel_log(
        self, follower: kmsg_source.KmsgFollower | kmsg_source.JournalFollower, *, source_name: str
    ) -> sources.KernelLogPump:
        """Follow the kernel log in a worker thread while the agent runs."""
        pump = sources.KernelLogPump(
            follower,
            source_name=source_name,
            inventory=self._inventory,
            deliver=self.observe,
            clock=self._clock,
            saved_cursor=self.spool.source_cursor(source_name),
        )
        self.kernel_log = pump
        self._threads.append((f"kernel-log-{source_name}", pump.run))
        return pump

    def attach_ib_poller(self, poller: sources.IbPoller) -> None:
        """Read InfiniBand port counters every ib_poll_interval_s while the agent runs."""
        self._ib_poller = poller

    async def run(self, stop: asyncio.Event) -> None:
        """Sample and stay connected until stop is set; then close the stream cleanly."""
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        # A boot returns every GPU to its default limit; the controller counts them at the caps it
        # confirmed. Put those back before anything else (the agent only ever lowers on its own).
        restored = await self._call(self._executor.restore_power_caps)
        if restored:
            self._log.warning("power_caps_restored", gpus=len(restored), limits_w=sorted(set(restored.values())))
        thread_stop = threading.Event()
        threads = [
            threading.Thread(target=self._keep_running, args=(name, target, thread_stop), name=name, daemon=True)
            for name, target in self._threads
        ]
        for thread in threads:
            thread.start()
        tasks = [asyncio.create_task(self._sampler.run(stop), name=f"sampler-{self.identity.node_id}")]
        if self._ib_poller is not None:
            tasks.append(asyncio.create_task(self._poll_ib_forever(stop, self._ib_poller)))
        try:
            await self._link_forever(stop)
        finally:
            thread_stop.set()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            for thread in threads:
                await asyncio.to_thread(thread.join, 5.0)
            # A command's worker thread outlives its stream's task: let it write its result before
            # the journal closes, or the resend finds it started and never finished.
            if not await asyncio.to_thread(self._executor.wait_idle, COMMAND_DRAIN_S):
                self._log.warning("commands_still_running_at_stop", waited_s=COMMAND_DRAIN_S)
            for task in list(self._command_tasks):  # their results are journaled; a stream gone
                task.cancel()
            await asyncio.gather(*self._command_tasks, return_exceptions=True)

    # -- backend calls and sources -------------------------------------------------------------
    async def _call(self, fn, *args):  # type: ignore[no-untyped-def]
        return await asyncio.to_thread(fn, *args) if self._blocking else fn(*args)

    def _watch_gpu_events(self, stop: threading.Event) -> None:
        """Wait in the backend's event poll (it blocks, the GIL released) and spool what it reports at once.

        Runs in its own thread until stop is set; the wait is cut into EVENT_WAIT_S slices so that
        the agent stops within one, before the backend is closed (a close must not race a wait).
        """
        while not stop.is_set():
            try:
                observations = self.backend.poll_events(self._clock(), EVENT_WAIT_S)
            except gpu.BackendError as exc:
                # A failing poll must not end event watching; lost GPUs also surface through reads.
                self._log.warning("gpu_event_wait_failed", error=str(exc), error_type=type(exc).__name__)
                stop.wait(EVENT_WAIT_S)
                continue
            if observations:
                self.observe(list(observations))

    def _keep_running(self, name: str, target: Callable[[threading.Event], None], stop: threading.Event) -> None:
        """Run a source thread; if it fails (e.g. /dev/kmsg unreadable), log it and start it again."""
        while not stop.is_set():
            try:
                target(stop)
            except Exception:
                self._log.exception("source_failed", source=name)
                stop.wait(5.0)

    async def _poll_ib_forever(self, stop: asyncio.Event, poller: sources.IbPoller) -> None:
        while not stop.is_set():
            try:
                observations = await asyncio.to_thread(poller.poll)
            except OSError as exc:
                self._log.warning("ib_sysfs_read_failed", error=str(exc))
            else:
                if observations:
                    self.observe(list(observations))
            await asyncio.sleep(self.settings.ib.poll_interval_s)

    def observe(
        self,
        observations: list[model.Observation] | tuple[model.Observation, ...],
        source_cursor: tuple[str, str] | None = None,
    ) -> None:
        """Spool observations durably (with their source's cursor) and wake the sender.

        Safe to call from any thread: kernel-log pumps call it from their worker threads.
        """
        spooled = self.spool.append(list(observations), source_cursor=source_cursor)
        self.stats.events_spooled += len(spooled)
        for event in spooled:
            xid = event.observation.xid
            self._event_counts[(event.observation.kind.name, "" if xid is None else str(xid))] += 1
            self._log.info(
                "health_event_spooled",
                seq=event.seq,
                kind=event.observation.kind.name,
                gpu_uuid=event.observation.gpu_uuid,
                xid=event.observation.xid,
            )
        loop = self._loop
        if loop is not None and threading.get_ident() != self._loop_thread:
            loop.call_soon_threadsafe(self._events_ready.set)
        else:
            self._events_ready.set()

    # -- views for the metrics exporter (read at scrape time from the exporter's thread) ----------
    def latest_power(self) -> dict[str, model.PowerReading]:
        """The newest power reading per GPU."""
        return self._sampler.latest_power()

    def latest_counters(self) -> dict[str, model.GpuCounters]:
        """The newest counters per GPU."""
        return self._sampler.latest_counters()

    def event_counts(self) -> dict[tuple[str, str], int]:
        """Events spooled by this process, by (kind, xid)."""
        return dict(self._event_counts)

    def metric_stats(self) -> dict[str, float]:
        """The agent's own figures for the exporter."""
        return {
            "spool_depth": self.spool.depth(),
            "connected": 1.0 if self.stats.connected else 0.0,
            "power_samples": self.stats.power_samples,
            "failsafe_applied": self.stats.failsafe_applied,
        }

    # -- the controller link ---------------------------------------------------------------------
    async def _link_forever(self, stop: asyncio.Event) -> None:
        attempt = 0
        while not stop.is_set():
            try:
                channel = tls.aio_channel(
                    self.settings.link.controller_address,
                    self.settings.tls.files,
                    server_name=self.settings.tls.server_name,
                    keepalive_time_ms=round(self.settings.link.keepalive_time_s * 1000),
                    keepalive_timeout_ms=round(self.settings.link.keepalive_timeout_s * 1000),
                )
            except (OSError, ValueError) as exc:
                # Unreadable or mismatched certificate files (a renewal in progress): retry with backoff.
                self.stats.connect_failures += 1
                self._log.error("tls_files_unusable", error=str(exc))
                channel = None
            try:
                if channel is not None and await self._session(channel, stop):
                    attempt = 0
            except (grpc.aio.AioRpcError, TimeoutError, ConnectionError, asyncio.InvalidStateError) as exc:
                # InvalidStateError: grpc.aio's answer to a write on a call that has already ended
                # (the controller died between our last read and this write). The stream is lost
                # like any other: reconnect, never let it end the link for good.
                self.stats.connect_failures += 1
                code = exc.code().name if isinstance(exc, grpc.aio.AioRpcError) else type(exc).__name__
                self.stats.stream_lost_by_code[code] = self.stats.stream_lost_by_code.get(code, 0) + 1
                self._log.warning("controller_stream_lost", code=code, detail=_detail(exc))
            finally:
                if self.stats.connected:
                    self.failsafe.stream_lost()
                self.stats.connected = False
                # A raise still moving was ordered by a controller this agent no longer hears: stop it
                # where it is (DESIGN.md invariant 6: the agent never raises a cap on its own). The
                # controller that takes over counts the limit it reads, not a target it never sent.
                self._executor.cancel_slews()
                if channel is not None:
                    await channel.close(grace=None)
            if stop.is_set():
                break
            attempt += 1
            link = self.settings.link
            ceiling = min(link.reconnect_max_s, link.reconnect_initial_s * 2 ** min(attempt, 16))
            # Full jitter: thousands of agents losing one controller must not reconnect in step.
            delay = self._rng.uniform(0, ceiling)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=delay)

    async def _session(self, channel: grpc.aio.Channel, stop: asyncio.Event) -> bool:
        """One stream's life. Returns True when the stream got as far as Welcome."""
        stub = agent_grpc.AgentServiceStub(channel)
        call = stub.Connect()
        await call.write(
            wire.hello(
                node_id=self.identity.node_id,
                boot_id=self.identity.boot_id,
                agent_version=VERSION,
                hostname=self.identity.hostname,
                backend=self.backend.name,
                gpus=self._inventory,
                labels=self.identity.labels,
                spool_head_seq=self.spool.head_seq(),
                sent_unix_ns=self._clock(),
                spool_id=self.spool.spool_id,
                spool_acked_seq=self.spool.acked_seq(),
                summaries=self.settings.link.telemetry_summaries,
            )
        )
        first = await asyncio.wait_for(call.read(), timeout=self.settings.link.welcome_timeout_s)
        if first is grpc.aio.EOF or not first.HasField("welcome"):
            raise ConnectionError("controller did not answer Hello with Welcome")
        welcome = first.welcome
        self._apply_config(welcome.config)
        self._sampler.stream_started(summaries=wire.summaries_chosen(welcome.config))
        self.spool.ack(welcome.acked_seq)
        self.stats.connects += 1
        self.stats.connected = True
        self.failsafe.stream_up()
        self._log.info("controller_connected", session=welcome.session_id, acked_seq=welcome.acked_seq)

        outbox: asyncio.Queue[agent_pb.AgentMessage | None] = asyncio.Queue(maxsize=1000)
        sent_through = [welcome.acked_seq]  # highest event seq written on this stream
        session_over = asyncio.Event()
        self._events_ready.set()  # resend whatever is unacked right away
        tasks = [
            asyncio.create_task(self._writer(call, outbox)),
            asyncio.create_task(self._reader(call, outbox, sent_through)),
            asyncio.create_task(self._producer(outbox, sent_through, session_over)),
            asyncio.create_task(stop.wait()),
        ]
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                if task.exception() is not None:
                    raise task.exception()  # type: ignore[misc]
            if stop.is_set():
                # Flush what is queued, then half-close so the controller sees a clean end.
                await outbox.put(None)
                await asyncio.wait_for(tasks[0], timeout=5.0)
            return True
        finally:
            # End the RPC first, so a read or write still blocked on it returns; then stop the tasks.
            # A task that survives its cancel (grpc.aio can turn a cancelled write into a normal
            # return, and the writer then waits on its queue forever) must not hold this stream's
            # clean-up, or the agent never reconnects and never sees stop: bounded wait.
            session_over.set()
            call.cancel()
            for task in tasks:
                task.cancel()
            done, stuck = await asyncio.wait(tasks, timeout=SESSION_CLEANUP_S)
            for task in done:
                if not task.cancelled():
                    task.exception()  # retrieved: the stream's end was reported above
            if stuck:
                self._log.warning("session_tasks_stuck", tasks=len(stuck))

    def _apply_config(self, config: agent_pb.AgentConfig) -> None:
        # Zero means "controller has no opinion": keep the local setting.
        self._send_interval_ms = config.telemetry_send_interval_ms or self._send_interval_ms
        self._heartbeat_interval_ms = config.heartbeat_interval_ms or self._heartbeat_interval_ms
        self._sampler.counter_interval_ms = config.counter_interval_ms or self._sampler.counter_interval_ms
        self._sampler.power_interval_ms = config.power_sample_interval_ms or self._sampler.power_interval_ms

    async def _writer(self, call, outbox: asyncio.Queue) -> None:  # type: ignore[no-untyped-def]
        while True:
            message = await outbox.get()
            if message is None:
                await call.done_writing()
                return
            await call.write(message)

    async def _producer(  # type: ignore[no-untyped-def]
        self, outbox: asyncio.Queue, sent_through: list[int], session_over: asyncio.Event
    ) -> None:
        loop = asyncio.get_running_loop()
        next_send = loop.time() + self._send_interval_ms / 1000
        last_write = loop.time()
        # Python 3.11's wait_for can swallow a cancel that lands as the event fires (gh-86296): seen in
        # the SIGKILL chaos test, an old stream's producer lived on and took the agent-wide
        # _events_ready from the new stream's, whose spooled events then never went out. So the loop
        # also ends on the stream's own flag, checked before it takes the event.
        while not session_over.is_set():
            await aio.wait_event(self._events_ready, next_send - loop.time())
            if session_over.is_set():
                return
            if self._events_ready.is_set():
                self._events_ready.clear()
                # Page by page up to the spool's head: read once, a backlog larger than one read (a
                # storm during an outage) left its newest events, often the fatal one that ended the
                # storm, unsent until some later observation woke the producer again.
                while not session_over.is_set() and (
                    page := self.spool.unacked(self.settings.spool.read_page_events, after_seq=sent_through[0])
                ):
                    for start in range(0, len(page), self.settings.link.max_events_per_message):
                        chunk = page[start : start + self.settings.link.max_events_per_message]
                        await outbox.put(wire.events(chunk, self._known_gpus))
                        sent_through[0] = chunk[-1].seq
                        self.stats.events_sent += len(chunk)
                        last_write = loop.time()
            if loop.time() >= next_send:
                next_send = sampler.next_tick(next_send, self._send_interval_ms, loop.time())
                batch = await self._sampler.drain_telemetry()
                if batch is not None:
                    await outbox.put(batch)
                    self.stats.telemetry_batches_sent += 1
                    last_write = loop.time()
                elif loop.time() - last_write >= self._heartbeat_interval_ms / 1000:
                    await outbox.put(wire.heartbeat(self._clock(), self.spool.depth()))
                    last_write = loop.time()

    async def _reader(self, call, outbox: asyncio.Queue, sent_through: list[int]) -> None:  # type: ignore[no-untyped-def]
        while True:
            message = await call.read()
            if message is grpc.aio.EOF:
                raise ConnectionError("controller closed the stream")
            which = message.WhichOneof("payload")
            if which == "ack":
                self.spool.ack(message.ack.acked_seq)
                # The producer reads the spool only when woken. An event spooled without observe()'s
                # wake-up (written to the spool directly) goes out now, not with the next observation.
                if self.spool.unacked(1, after_seq=sent_through[0]):
                    self._events_ready.set()
            elif which == "command":
                try:
                    command = wire.command_from_wire(message.command)
                except wire.UnknownCommand as exc:
                    self._log.warning("command_unknown", command_id=message.command.command_id, error=str(exc))
                    await outbox.put(
                        wire.action_result(
                            model.ActionResult(
                                command_id=message.command.command_id,
                                outcome=model.ActionOutcome.NOT_SUPPORTED,
                                message=str(exc),
                                started_unix_ns=self._clock(),
                                finished_unix_ns=self._clock(),
                            )
                        )
                    )
                    continue
                command = on_local_clock(command, self._clock())
                if isinstance(command.action, LONG_ACTIONS):
                    # Minutes long (a validation, a reset): run aside, so that the commands behind it
                    # (power caps) are read and run now. Read late, a cap command ran late, after the
                    # controller had settled it as expired and given its watts to another GPU.
                    task = asyncio.create_task(self._run_command(command, outbox), name=f"command-{command.command_id}")
                    self._command_tasks.add(task)
                    task.add_done_callback(self._command_tasks.discard)
                else:
                    await self._run_command(command, outbox)
            elif which == "full_rate":
                self._sampler.full_rate = wire.full_rate_from_wire(message.full_rate, self._known_gpus)
            else:
                self._log.warning("controller_message_unexpected", payload=which)

    async def _run_command(self, command: model.Command, outbox: asyncio.Queue) -> None:  # type: ignore[type-arg]
        try:
            result = await asyncio.to_thread(self._executor.execute, command)
        except actions.CommandDeferred as deferred:  # the node goes down: the next boot gets it again
            self._log.info("command_deferred_to_next_boot", command_id=command.command_id, reason=str(deferred))
            return
        self.stats.commands_executed += 1
        self._log.info(
            "command_executed",
            command_id=command.command_id,
            action=type(command.action).__name__,
            outcome=result.outcome.name,
            replayed=result.replayed,
            reason=command.reason,
            message=result.message,
        )
        # A stream that ended meanwhile drops it: the journal answers the controller's resend.
        await outbox.put(wire.action_result(result))


def on_local_clock(command: model.Command, received_unix_ns: int) -> model.Command:
    """command with its deadline on this node's clock.

    The controller stamps issued and deadline times with its own clock, and a node's clock may be
    off by any amount: compared with the local clock, a node running ahead would refuse every
    command as late, and one running behind would run a long-stale one.

    The controller converts the deadline itself once the stream's stamps bound the offset
    (``deadline_agent_unix_ns``); it is kept as given. The controller settles a power command it
    never heard back from as expired once a read-back is newer than its deadline: counted from a
    late arrival instead, the command ran after its watts had gone to another GPU. Without that
    bound (an older controller, or a command sent before the stream carried a stamp), what a
    command grants is the span between the two stamps, counted from when it reaches the agent.
    """
    if command.deadline_agent_unix_ns:
        return dataclasses.replace(command, deadline_unix_ns=command.deadline_agent_unix_ns)
    if not command.deadline_unix_ns or not command.issued_unix_ns:
        return command
    span_ns = max(0, command.deadline_unix_ns - command.issued_unix_ns)
    return dataclasses.replace(command, deadline_unix_ns=received_unix_ns + span_ns)


def _detail(exc: BaseException) -> str:
    if isinstance(exc, grpc.aio.AioRpcError):
        return exc.details() or ""
    return str(exc)
