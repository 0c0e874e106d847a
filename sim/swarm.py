"""A swarm of lightweight simulated agents: thousands of nodes in one process, each with its own stream.

`rasd.agent.runtime.Agent` is the real agent (simulated GPUs, a SQLite spool, a sampler loop at
10 Hz, actions in worker threads); it costs about 1 % of a core per node (bench/RESULTS.md "Agent
overhead"), so 2,048 of them do not fit on a laptop next to the controller they are meant to load.
A `SwarmAgent` speaks the same wire protocol with far less work, for the scale benchmark
(bench/scale.py) and for tests that need many agents at once (mass reconnects):

- each agent has its **own gRPC channel and TCP connection** (a local subchannel pool, so gRPC does
  not share one connection between agents of a process) and its own ``AgentService.Connect``
  stream: Hello → Welcome (acked position) → resend unacked events → telemetry, events and action
  results, with acks and commands coming back, as `Agent` does;
- each keeps its own state: node id, boot id, 8 (or N) GPUs with UUIDs as the simulated backend
  makes them, its event sequence and spool, its connection state and counters;
- telemetry is what a real agent sends at the default rates, in the format the Welcome chose: every
  ``send_interval_ms`` one ``TelemetrySummary`` (per GPU its draw over the interval and its limit;
  the node's summed draw per 100 ms bucket; whole counters only on the counters heartbeat, since a
  swarm's counters never change), or, from a controller before summaries (or with
  ``telemetry_summaries`` off), one ``TelemetryBatch`` with a ``PowerSeries`` per GPU (10 Hz → 10
  samples per second) and one ``GpuCounters`` per GPU per counter interval. Power values come from
  one precomputed step-synchronous waveform shared by the swarm (so building a message is cheap),
  not from a per-GPU model;
- health events are injected by the caller (`SwarmAgent.inject`), get the next seq and stay in the
  agent's spool until acked. **The spool is in memory** (a dict), not on disk: the swarm never
  restarts an agent process, so durability across agent restarts is not what it exercises;
- commands are answered at once: SUCCEEDED, and ``run_validation`` with the verdict "pass". A
  reboot is answered, not performed (the stream stays up and the boot id is unchanged);
- when the stream breaks, the agent reconnects with exponential backoff and full jitter
  (``reconnect_initial_s`` doubling up to ``reconnect_max_s``), as `Agent` does.

Agents of a swarm share the process's event loop; sends are spread over the interval by a
per-agent phase so a swarm does not send in lockstep. Use `Swarm` to run many: ``await
swarm.run(stop)`` until the ``stop`` event is set, `Swarm.connected` to count live streams.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import math
import random
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import grpc

from rasd.agent import settings as agent_settings
from rasd.agent.gpu import simulated
from rasd.api.v1 import agent_service_pb2 as agent_pb
from rasd.api.v1 import agent_service_pb2_grpc as agent_grpc
from rasd.api.v1 import commands_pb2 as commands_pb
from rasd.api.v1 import health_pb2 as health_pb
from rasd.common import VERSION, tls

Clock = Callable[[], int]


@dataclasses.dataclass(frozen=True)
class SwarmSettings:
    """What every agent of a swarm does, and how fast."""

    controller_address: str
    """host:port of the controller's gRPC endpoint."""
    gpus_per_node: int = 8
    # The rates and the backoff default to a real agent's (rasd.agent.settings), so a swarm offers
    # the load a fleet of rasd-agents would.
    power_sample_interval_ms: int = agent_settings.SamplingSettings.power_sample_interval_ms
    """Power samples per series are send_interval_ms / power_sample_interval_ms (10 Hz: 10 per second)."""
    counter_interval_ms: int = agent_settings.SamplingSettings.counter_interval_ms
    """One GpuCounters per GPU per counter interval."""
    send_interval_ms: int = agent_settings.LinkSettings.telemetry_send_interval_ms
    """How often each agent sends a telemetry batch."""
    heartbeat_interval_ms: int = agent_settings.LinkSettings.heartbeat_interval_ms
    """Heartbeat when telemetry is off (send_interval_ms = 0)."""
    telemetry_summaries: bool = agent_settings.LinkSettings.telemetry_summaries
    """Offer TelemetrySummary in Hello, as a real agent does; False: raw batches only."""
    counters_heartbeat_s: float = agent_settings.SamplingSettings.counters_heartbeat_s
    """With summaries: every GPU's whole counters go out this often (they never change in a swarm)."""
    seed: int = 0
    """GPU UUIDs and phases derive from it (the same seed gives the same fleet)."""
    reconnect_initial_s: float = agent_settings.LinkSettings.reconnect_initial_s
    reconnect_max_s: float = agent_settings.LinkSettings.reconnect_max_s
    welcome_timeout_s: float = 30.0
    """How long to wait for Welcome after Hello before giving up on the attempt."""
    channel_options: Sequence[tuple[str, Any]] = ()
    """Extra gRPC channel options (e.g. ``grpc.ssl_target_name_override`` with TLS)."""
    channel_credentials: grpc.ChannelCredentials | None = None
    """TLS credentials (``grpc.ssl_channel_credentials``); None: plaintext, loopback only."""


@dataclasses.dataclass
class SwarmAgentStats:
    """What one agent did."""

    connects: int = 0
    connect_failures: int = 0
    connected: bool = False
    first_connected_unix_ns: int = 0
    """When the first Welcome arrived (0: never)."""
    last_connected_unix_ns: int = 0
    """When the latest Welcome arrived."""
    telemetry_batches: int = 0
    power_samples_sent: int = 0
    events_sent: int = 0
    acked_seq: int = 0
    commands: list[tuple[int, str, str]] = dataclasses.field(default_factory=list)
    """(received unix ns, command id, action kind) per command received (repeats included)."""


class _Waveform:
    """One step-synchronous power waveform (10 Hz) shared by a swarm: compute high, communication low."""

    def __init__(self, rng: random.Random, *, period_s: float = 2.0, sample_interval_ms: int = 100) -> None:
        samples = max(1, round(period_s * 1000 / sample_interval_ms))
        self.values = [(680.0 if i < 0.7 * samples else 130.0) + rng.uniform(-15.0, 15.0) for i in range(samples * 7)]

    def window(self, start: int, count: int) -> list[float]:
        n = len(self.values)
        return [self.values[(start + i) % n] for i in range(count)]


class SwarmAgent:
    """One simulated node: its own stream, spool, sequence and counters."""

    def __init__(
        self,
        node_id: str,
        settings: SwarmSettings,
        *,
        labels: Mapping[str, str] | None = None,
        waveform: _Waveform | None = None,
        clock: Clock = time.time_ns,
        rng: random.Random | None = None,
    ) -> None:
        """Build the node's identity and inventory; nothing runs until `run()`."""
        self.node_id = node_id
        self.settings = settings
        self.labels = dict(labels or {})
        self.stats = SwarmAgentStats()
        self._clock = clock
        self._rng = rng or random.Random(f"{settings.seed}/{node_id}")
        self._waveform = waveform or _Waveform(self._rng, sample_interval_ms=settings.power_sample_interval_ms)
        self.boot_id = str(uuid.UUID(int=self._rng.getrandbits(128), version=4))
        self.gpus = tuple(
            health_pb.GpuInfo(
                uuid=simulated.simulated_gpu_uuid(settings.seed, node_id, index),
                model="NVIDIA H100 80GB HBM3",
                pci_bus_id=f"00000000:{0x18 + index:02X}:00.0",
                serial=f"SWARM{index:02d}",
                memory_total_mib=81559,
                power_limit_min_w=200,
                power_limit_max_w=700,
                power_limit_default_w=700,
            )
            for index in range(settings.gpus_per_node)
        )
        self._phase = self._rng.randrange(len(self._waveform.values))
        self._spool: dict[int, health_pb.HealthEvent] = {}
        self._seq = 0
        self._events_ready = asyncio.Event()
        self._outbox: asyncio.Queue[agent_pb.AgentMessage | None] | None = None
        self._connected = asyncio.Event()
        self._summaries = False
        """The stream's Welcome chose TelemetrySummary."""
        self._counters_sent_unix_ns = 0
        """When whole counters last went out in a summary (0: due)."""

    # -- what callers do ---------------------------------------------------------------------
    def inject(
        self,
        kind: int,
        *,
        gpu_index: int | None = None,
        xid: int | None = None,
        severity: int = health_pb.SEVERITY_ERROR,
        message: str = "",
        attributes: Mapping[str, str] | None = None,
    ) -> health_pb.HealthEvent:
        """Observe a health event now: it gets the next seq and stays spooled until acked."""
        self._seq += 1
        event = health_pb.HealthEvent(
            seq=self._seq,
            observed_unix_ns=self._clock(),
            kind=kind,
            gpu_uuid=self.gpus[gpu_index].uuid if gpu_index is not None else "",
            severity=severity,
            message=message,
            source="simulated",
            attributes=dict(attributes or {}),
        )
        if xid is not None:
            event.xid = xid
        self._spool[event.seq] = event
        self._events_ready.set()
        return event

    @property
    def spool_depth(self) -> int:
        """Events not yet acked."""
        return len(self._spool)

    async def wait_connected(self) -> None:
        """Return once a stream is up (Welcome received)."""
        await self._connected.wait()

    # -- the link --------------------------------------------------------------------------------
    async def run(self, stop: asyncio.Event) -> None:
        """Stay connected (reconnecting with backoff and full jitter) until stop is set."""
        attempt = 0
        # The same client options as a real agent (message bounds, keepalive), each on its own subchannel.
        options = [("grpc.use_local_subchannel_pool", 1), *tls.channel_options(), *self.settings.channel_options]
        while not stop.is_set():
            address = self.settings.controller_address
            channel = (
                grpc.aio.secure_channel(address, self.settings.channel_credentials, options=options)
                if self.settings.channel_credentials is not None
                else grpc.aio.insecure_channel(address, options=options)
            )
            try:
                if await self._session(channel, stop):
                    attempt = 0
            except Exception:
                # A simulated node never dies of a broken stream: it counts it and reconnects.
                self.stats.connect_failures += 1
            finally:
                self.stats.connected = False
                self._connected.clear()
                await channel.close(grace=None)
            if stop.is_set():
                break
            attempt += 1
            ceiling = min(self.settings.reconnect_max_s, self.settings.reconnect_initial_s * 2 ** min(attempt, 16))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=self._rng.uniform(0, ceiling))

    async def _session(self, channel: grpc.aio.Channel, stop: asyncio.Event) -> bool:
        call = agent_grpc.AgentServiceStub(channel).Connect()
        await call.write(
            agent_pb.AgentMessage(
                hello=agent_pb.Hello(
                    node_id=self.node_id,
                    boot_id=self.boot_id,
                    agent_version=VERSION,
                    hostname=self.node_id,
                    backend="simulated",
                    gpus=self.gpus,
                    labels=self.labels,
                    spool_head_seq=self._seq,
                    telemetry_formats=(
                        (health_pb.TELEMETRY_FORMAT_RAW, health_pb.TELEMETRY_FORMAT_SUMMARY)
                        if self.settings.telemetry_summaries
                        else (health_pb.TELEMETRY_FORMAT_RAW,)
                    ),
                )
            )
        )
        first = await asyncio.wait_for(call.read(), timeout=self.settings.welcome_timeout_s)
        if first is grpc.aio.EOF or not first.HasField("welcome"):
            raise ConnectionError("controller did not answer Hello with Welcome")
        self._ack(first.welcome.acked_seq)
        self._summaries = first.welcome.config.telemetry_format == health_pb.TELEMETRY_FORMAT_SUMMARY
        self._counters_sent_unix_ns = 0  # whole counters in a new stream's first summary, as `Agent` does
        now = self._clock()
        self.stats.connects += 1
        self.stats.connected = True
        self.stats.first_connected_unix_ns = self.stats.first_connected_unix_ns or now
        self.stats.last_connected_unix_ns = now
        self._connected.set()
        outbox: asyncio.Queue[agent_pb.AgentMessage | None] = asyncio.Queue(maxsize=1000)
        self._events_ready.set()  # resend whatever is unacked
        tasks = [
            asyncio.create_task(self._writer(call, outbox)),
            asyncio.create_task(self._reader(call, outbox)),
            asyncio.create_task(self._producer(outbox)),
            asyncio.create_task(stop.wait()),
        ]
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                if task.exception() is not None:
                    raise task.exception()  # type: ignore[misc]
            if stop.is_set():
                await outbox.put(None)
                with contextlib.suppress(Exception):  # the stream may already be gone
                    await asyncio.wait_for(tasks[0], timeout=5.0)
            return True
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            call.cancel()

    def _ack(self, acked_seq: int) -> None:
        self.stats.acked_seq = max(self.stats.acked_seq, acked_seq)
        for seq in [s for s in self._spool if s <= acked_seq]:
            del self._spool[seq]

    async def _writer(self, call, outbox: asyncio.Queue) -> None:  # type: ignore[no-untyped-def]
        while True:
            message = await outbox.get()
            if message is None:
                await call.done_writing()
                return
            await call.write(message)

    async def _producer(self, outbox: asyncio.Queue) -> None:  # type: ignore[no-untyped-def]
        loop = asyncio.get_running_loop()
        interval_s = (self.settings.send_interval_ms or self.settings.heartbeat_interval_ms) / 1000
        # A per-agent phase spreads a swarm's sends over the interval.
        next_send = loop.time() + self._rng.uniform(0, interval_s)
        sent_through = self.stats.acked_seq  # everything after the Welcome's position is (re)sent
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._events_ready.wait(), timeout=max(0.0, next_send - loop.time()))
            if self._events_ready.is_set():
                self._events_ready.clear()
                pending = [self._spool[seq] for seq in sorted(self._spool) if seq > sent_through]
                if pending:
                    await outbox.put(agent_pb.AgentMessage(events=agent_pb.HealthEventBatch(events=pending)))
                    sent_through = max(sent_through, pending[-1].seq)
                    self.stats.events_sent += len(pending)
            if loop.time() >= next_send:
                next_send += interval_s
                if next_send < loop.time():  # fell behind (an overloaded loop): skip, never burst
                    next_send = loop.time() + interval_s
                if self.settings.send_interval_ms and self._summaries:
                    await outbox.put(agent_pb.AgentMessage(summary=self._summary()))
                elif self.settings.send_interval_ms:
                    await outbox.put(agent_pb.AgentMessage(telemetry=self._telemetry()))
                else:
                    await outbox.put(
                        agent_pb.AgentMessage(
                            heartbeat=agent_pb.Heartbeat(sent_unix_ns=self._clock(), spool_depth=len(self._spool))
                        )
                    )

    def _telemetry(self) -> health_pb.TelemetryBatch:
        interval_ms = self.settings.power_sample_interval_ms
        count = max(1, self.settings.send_interval_ms // interval_ms)
        now = self._clock()
        first_ns = now - (count - 1) * interval_ms * 1_000_000
        samples = self._waveform.window(self._phase, count)
        self._phase += count
        batch = health_pb.TelemetryBatch(
            power=[
                health_pb.PowerSeries(
                    gpu_uuid=gpu.uuid, first_sample_unix_ns=first_ns, sample_interval_ms=interval_ms, power_w=samples
                )
                for gpu in self.gpus
            ]
        )
        counters = max(1, math.ceil(self.settings.send_interval_ms / self.settings.counter_interval_ms))
        for k in range(counters):
            at = now - k * self.settings.counter_interval_ms * 1_000_000
            for gpu in self.gpus:
                batch.counters.add(
                    gpu_uuid=gpu.uuid,
                    sample_unix_ns=at,
                    enforced_power_limit_w=700,
                    temperature_c=62,
                    utilization_gpu_pct=97,
                    ecc_dbe_volatile=0,
                    remapped_rows_uncorrectable=0,
                )
        self.stats.telemetry_batches += 1
        self.stats.power_samples_sent += count * len(self.gpus)
        return batch

    def _summary(self) -> health_pb.TelemetrySummary:
        """What `rasd.agent.core.summary` makes of the interval's samples, built straight from the waveform.

        Every GPU of a swarm node draws the same waveform, so the node's sum per bucket is that
        sample times the GPU count; the grid is the last `count` complete 100 ms buckets.
        """
        interval_ms = self.settings.power_sample_interval_ms
        step_ns = interval_ms * 1_000_000
        count = max(1, self.settings.send_interval_ms // interval_ms)
        now = self._clock()
        first_ns = (now // step_ns - count) * step_ns
        last_ns = first_ns + (count - 1) * step_ns
        samples = self._waveform.window(self._phase, count)
        self._phase += count
        gpus = len(self.gpus)
        mean_w, min_w, max_w, last_w = sum(samples) / count, min(samples), max(samples), samples[-1]
        summary = health_pb.TelemetrySummary()
        for gpu in self.gpus:
            summary.gpus.add(
                gpu_uuid=gpu.uuid, samples=count, mean_w=mean_w, min_w=min_w, max_w=max_w, last_w=last_w,
                last_sample_unix_ns=last_ns, counters_sample_unix_ns=now, enforced_power_limit_w=700,
                utilization_gpu_pct=97,
            )  # fmt: skip
        node = summary.node_power
        node.first_sample_unix_ns = first_ns
        node.sample_interval_ms = interval_ms
        node.power_w.extend(w * gpus for w in samples)
        node.gpus.extend([gpus] * count)
        if now - self._counters_sent_unix_ns >= self.settings.counters_heartbeat_s * 1e9:
            self._counters_sent_unix_ns = now
            for gpu in self.gpus:
                summary.counters.add(
                    gpu_uuid=gpu.uuid, sample_unix_ns=now, enforced_power_limit_w=700, temperature_c=62,
                    utilization_gpu_pct=97, ecc_dbe_volatile=0, remapped_rows_uncorrectable=0,
                )  # fmt: skip
        self.stats.telemetry_batches += 1
        self.stats.power_samples_sent += count * gpus
        return summary

    async def _reader(self, call, outbox: asyncio.Queue) -> None:  # type: ignore[no-untyped-def]
        while True:
            message = await call.read()
            if message is grpc.aio.EOF:
                raise ConnectionError("controller closed the stream")
            which = message.WhichOneof("payload")
            if which == "ack":
                self._ack(message.ack.acked_seq)
            elif which == "command":
                await outbox.put(agent_pb.AgentMessage(action_result=self._answer(message.command)))

    def _answer(self, command: commands_pb.Command) -> commands_pb.ActionResult:
        now = self._clock()
        kind = command.WhichOneof("action") or ""
        self.stats.commands.append((now, command.command_id, kind))
        result = commands_pb.ActionResult(
            command_id=command.command_id,
            outcome=commands_pb.ACTION_OUTCOME_SUCCEEDED,
            message=f"swarm agent: {kind} answered without doing it",
            started_unix_ns=now,
            finished_unix_ns=now,
        )
        if kind == "run_validation":
            result.validation_verdict = "pass"
        elif kind == "set_power_cap":
            result.enforced_limits.extend(command.set_power_cap.limits)
        return result


class Swarm:
    """Many `SwarmAgent`s in one event loop."""

    def __init__(
        self,
        node_ids: Sequence[str],
        settings: SwarmSettings,
        *,
        labels: Callable[[int], Mapping[str, str]] | None = None,
        clock: Clock = time.time_ns,
    ) -> None:
        """One agent per node id; labels(i) gives node i's topology labels."""
        waveform = _Waveform(random.Random(settings.seed), sample_interval_ms=settings.power_sample_interval_ms)
        self.settings = settings
        self.agents = [
            SwarmAgent(node_id, settings, labels=labels(i) if labels else None, waveform=waveform, clock=clock)
            for i, node_id in enumerate(node_ids)
        ]

    async def run(self, stop: asyncio.Event, *, connect_spread_s: float = 0.0) -> None:
        """Run every agent until stop is set; agent i starts after i/len * connect_spread_s (0: all at once)."""

        async def start(agent: SwarmAgent, delay_s: float) -> None:
            if delay_s > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), timeout=delay_s)
            await agent.run(stop)

        n = len(self.agents)
        await asyncio.gather(*(start(a, connect_spread_s * i / n) for i, a in enumerate(self.agents)))

    @property
    def connected(self) -> int:
        """Agents whose stream is up now."""
        return sum(1 for a in self.agents if a.stats.connected)
