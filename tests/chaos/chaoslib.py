"""Support for the fault-injection suite: the things a chaos test breaks, and the fleets it breaks them under.

- `ControllerProcess`: a real `rasd-controller` process that a test can SIGKILL and measure (RSS).
- `TcpProxy`: a TCP forwarder between agents and the controller that the test can black-hole (a
  network partition: connections stay open, nothing gets through, then everything resumes).
- `PrivatePostgres`: a throwaway PostgreSQL cluster in a temp dir on a free port, which a test may
  restart (never the shared server other tests use).
- `LightFleet`: many agents on one asyncio loop, each with its own channel, TCP connection and
  AgentService.Connect stream, speaking the real protocol (Hello → Welcome → events ↔ acks,
  commands → results) with a minimal spool in memory. The full agent (rasd.agent.runtime) costs
  threads per agent; this is what lets one test process hold 2,000 streams.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import pathlib
import random
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Sequence

import grpc

from rasd.api.v1 import agent_service_pb2 as agent_pb
from rasd.api.v1 import agent_service_pb2_grpc as agent_grpc
from rasd.api.v1 import commands_pb2 as commands_pb
from rasd.api.v1 import health_pb2 as health_pb

VENV_BIN = pathlib.Path(sys.executable).parent


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def port_open(port: int) -> bool:
    """Whether something accepts TCP connections on 127.0.0.1:port."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def proc_status_mib(pid: int, field: str) -> float:
    """A memory field of /proc/PID/status (VmRSS, VmHWM) in MiB."""
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024.0
    raise KeyError(f"{field} not in /proc/{pid}/status")


# -- the controller as a process ---------------------------------------------------------------------------
LIFTED_BREAKER = {"disruption": {"breaker_quarantine_pct": 100.0}}
"""The remediation policy of tests that fault every node at once on purpose: the circuit breaker,
which counts GPU resets too, would rightly hold them all; they test durability, not the breaker."""


def lifted_breaker_config(workdir: pathlib.Path) -> pathlib.Path:
    """A controller.toml with `LIFTED_BREAKER`, for `ControllerProcess(config=...)`."""
    path = workdir / "controller.toml"
    path.write_text("[remediation.disruption]\nbreaker_quarantine_pct = 100.0\n")
    return path


class ControllerProcess:
    """A real rasd-controller on 127.0.0.1:port, started and killed by the test."""

    def __init__(self, workdir: pathlib.Path, db_url: str, port: int, *, config: pathlib.Path | None = None) -> None:
        self.workdir = workdir
        self.db_url = db_url
        self.port = port
        self.config = config
        self.process: subprocess.Popen[bytes] | None = None
        self.starts = 0
        self.kills = 0
        self.peak_rss_mib = 0.0
        self._log = open(workdir / "controller.log", "ab")  # noqa: SIM115 - closed in close()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        argv = [str(VENV_BIN / "rasd-controller"), "--insecure", "--listen", self.address, "--metrics-port", "-1",
                "--db", self.db_url, "--log-level", "info"]  # fmt: skip
        if self.config is not None:
            argv += ["--config", str(self.config)]
        self.process = subprocess.Popen(argv, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        self.starts += 1

    async def wait_ready(self, timeout_s: float = 60.0) -> float:
        """Wait until the gRPC port accepts; returns how long it took."""
        started = time.monotonic()
        while not port_open(self.port):
            if self.process is not None and self.process.poll() is not None:
                raise AssertionError(f"rasd-controller exited with {self.process.returncode}; see {self._log.name}")
            if time.monotonic() - started > timeout_s:
                raise AssertionError(f"rasd-controller not listening after {timeout_s} s; see {self._log.name}")
            await asyncio.sleep(0.05)
        return time.monotonic() - started

    def sample_rss(self) -> float:
        """Current RSS in MiB (and remember the peak of this process's life, VmHWM)."""
        assert self.process is not None
        with contextlib.suppress(OSError, KeyError):
            self.peak_rss_mib = max(self.peak_rss_mib, proc_status_mib(self.process.pid, "VmHWM"))
            return proc_status_mib(self.process.pid, "VmRSS")
        return 0.0

    def kill(self) -> None:
        """SIGKILL: no goodbye, no flush, nothing after this instant reaches the database."""
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait()
        self.kills += 1

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def close(self) -> None:
        self.stop()
        self._log.close()


# -- a network partition -----------------------------------------------------------------------------------
class TcpProxy:
    """Forwards 127.0.0.1:port to an upstream port; `cut()` black-holes it until `heal()`.

    A cut forwards nothing in either direction and connects nothing upstream, but closes nothing:
    like a partitioned network, each side only finds out from its own timeouts. Bytes read just
    before the cut are delivered after the heal, as TCP would retransmit them.
    """

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.port = 0
        self.connections = 0
        self._loop = asyncio.new_event_loop()
        self._open: asyncio.Event | None = None
        self._server: asyncio.AbstractServer | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="chaos-proxy", daemon=True)
        self._thread.start()
        self._ready.wait(10)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._open = asyncio.Event()
        self._open.set()
        self._server = self._loop.run_until_complete(asyncio.start_server(self._handle, "127.0.0.1", 0))
        self.port = self._server.sockets[0].getsockname()[1]
        self._ready.set()
        self._loop.run_forever()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        assert self._open is not None
        self.connections += 1
        await self._open.wait()
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        except OSError:
            writer.close()
            return
        await asyncio.gather(self._pump(reader, up_writer), self._pump(up_reader, writer), return_exceptions=True)

    async def _pump(self, source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
        assert self._open is not None
        try:
            while True:
                await self._open.wait()
                data = await source.read(65536)
                if not data:
                    break
                await self._open.wait()
                sink.write(data)
                await sink.drain()
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            with contextlib.suppress(Exception):
                sink.close()

    def cut(self) -> None:
        assert self._open is not None
        self._loop.call_soon_threadsafe(self._open.clear)

    def heal(self) -> None:
        assert self._open is not None
        self._loop.call_soon_threadsafe(self._open.set)

    def close(self) -> None:
        self.heal()

        async def _shutdown() -> None:
            assert self._server is not None
            self._server.close()
            for task in asyncio.all_tasks():
                if task is not asyncio.current_task():
                    task.cancel()

        asyncio.run_coroutine_threadsafe(_shutdown(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()


# -- a private PostgreSQL ----------------------------------------------------------------------------------
def postgres_bin_dir() -> pathlib.Path | None:
    """The newest installed PostgreSQL server's bin folder (Debian layout, or pg_ctl on PATH)."""
    candidates = sorted(
        pathlib.Path("/usr/lib/postgresql").glob("*/bin"),
        key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0,
    )
    for folder in reversed(candidates):
        if (folder / "pg_ctl").exists() and (folder / "initdb").exists():
            return folder
    on_path = shutil.which("pg_ctl")
    if on_path and (pathlib.Path(on_path).parent / "initdb").exists():
        return pathlib.Path(on_path).parent
    return None


class PrivatePostgres:
    """A throwaway PostgreSQL cluster owned by this test: initdb in a temp dir, its own port.

    As root, the server runs as the `postgres` user (PostgreSQL refuses to run as root), so workdir
    must be reachable by that user: a fresh folder directly under /tmp, not under pytest's
    basetemp (pytest keeps /tmp/pytest-of-<user> at mode 0700).
    """

    def __init__(self, bin_dir: pathlib.Path, workdir: pathlib.Path) -> None:
        self.bin = bin_dir
        self.workdir = workdir
        self.data = workdir / "pgdata"
        self.port = free_port()
        self.restarts = 0
        self._as_postgres = os.geteuid() == 0
        if self._as_postgres:
            shutil.chown(workdir, "postgres", "postgres")

    def _run(self, *argv: str, timeout_s: float = 120) -> None:
        command = [str(self.bin / argv[0]), *argv[1:]]
        if self._as_postgres:
            command = ["runuser", "-u", "postgres", "--", *command]
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(argv[:2])} failed ({done.returncode}): {done.stderr[-800:]}")

    def init(self) -> None:
        self._run("initdb", "-D", str(self.data), "-A", "trust", "-U", "rasd", "--no-sync", "-E", "UTF8")
        self.start()
        self._run("createdb", "-h", "127.0.0.1", "-p", str(self.port), "-U", "rasd", "rasd")

    def _options(self) -> str:
        # fsync stays on: a restart must keep every committed row. The socket lives in the data dir.
        return f"-p {self.port} -k {self.data} -c listen_addresses=127.0.0.1 -c max_connections=50"

    def start(self) -> None:
        self._run("pg_ctl", "-D", str(self.data), "-o", self._options(), "-l", str(self.workdir / "pg.log"),
                  "-w", "-t", "60", "start")  # fmt: skip

    def stop(self, mode: str = "fast") -> None:
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "-t", "60", "stop")

    def restart(self, *, down_s: float = 0.0) -> None:
        """Stop (dropping every client connection), stay down for down_s, start again."""
        self.stop("immediate")
        time.sleep(down_s)
        self.start()
        self.restarts += 1

    @property
    def url(self) -> str:
        return f"postgresql+psycopg://rasd@127.0.0.1:{self.port}/rasd"

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.stop("immediate")


# -- many light agents on one loop -------------------------------------------------------------------------
GPU_MODEL = "NVIDIA H100 80GB HBM3"


def gpu_uuid(node_index: int, gpu_index: int) -> str:
    """A stable, valid GPU UUID for a light agent's GPU."""
    return f"GPU-{uuid.UUID(int=(0xC4A05 << 96) | (node_index << 16) | gpu_index)}"


def gpu_infos(node_index: int, gpus: int) -> list[health_pb.GpuInfo]:
    return [
        health_pb.GpuInfo(
            uuid=gpu_uuid(node_index, g),
            model=GPU_MODEL,
            pci_bus_id=f"00000000:{0x18 + 0x10 * g:02X}:00.0",
            power_limit_min_w=200,
            power_limit_max_w=700,
            power_limit_default_w=700,
            memory_total_mib=81559,
        )
        for g in range(gpus)
    ]


@dataclasses.dataclass
class LightAgent:
    """One node's stream state: what it spooled, what was acked, what the controller asked it to do."""

    index: int
    node_id: str
    gpus: int
    boot_id: str = dataclasses.field(default_factory=lambda: uuid.uuid4().hex)
    next_seq: int = 1
    spool: dict[int, health_pb.HealthEvent] = dataclasses.field(default_factory=dict)
    acked_seq: int = 0
    acks: list[int] = dataclasses.field(default_factory=list)
    welcomes: int = 0
    connected: bool = False
    welcomed_at: float = 0.0
    commands: list[commands_pb.Command] = dataclasses.field(default_factory=list)
    executed: dict[str, commands_pb.ActionResult] = dataclasses.field(default_factory=dict)
    failures: int = 0
    clock_skew_ns: int = 0
    outbox: asyncio.Queue[agent_pb.AgentMessage] | None = None

    def hello(self) -> agent_pb.AgentMessage:
        return agent_pb.AgentMessage(
            hello=agent_pb.Hello(
                node_id=self.node_id,
                boot_id=self.boot_id,
                agent_version="chaos-light",
                hostname=self.node_id,
                backend="simulated",
                gpus=gpu_infos(self.index, self.gpus),
                labels={"rack": f"rack-{self.index // 8:03d}"},
                spool_head_seq=self.next_seq - 1,
            )
        )

    def spool_event(self, *, xid: int = 13, gpu: int = 0, now_ns: int | None = None) -> health_pb.HealthEvent:
        """Record a new health event (Xid on a GPU) with the next seq, observed on this node's (skewed) clock."""
        observed = (now_ns if now_ns is not None else time.time_ns()) + self.clock_skew_ns
        event = health_pb.HealthEvent(
            seq=self.next_seq,
            observed_unix_ns=observed,
            kind=health_pb.EVENT_KIND_XID,
            gpu_uuid=gpu_uuid(self.index, gpu),
            severity=health_pb.SEVERITY_ERROR,
            message=f"NVRM: Xid (PCI:0000:{0x18 + 0x10 * gpu:02x}:00): {xid}, chaos event {self.next_seq}",
            source="kmsg",
            xid=xid,
        )
        self.spool[self.next_seq] = event
        self.next_seq += 1
        return event

    def unacked(self) -> list[health_pb.HealthEvent]:
        return [self.spool[s] for s in sorted(self.spool) if s > self.acked_seq]

    def on_ack(self, acked_seq: int) -> None:
        self.acks.append(acked_seq)
        if acked_seq > self.acked_seq:
            self.acked_seq = acked_seq

    def answer(self, command: commands_pb.Command) -> commands_pb.ActionResult:
        """Run a command once per id (simulated: it succeeds); a repeat gets the stored answer, replayed."""
        previous = self.executed.get(command.command_id)
        if previous is not None:
            replay = commands_pb.ActionResult()
            replay.CopyFrom(previous)
            replay.replayed = True
            return replay
        now = time.time_ns() + self.clock_skew_ns
        result = commands_pb.ActionResult(
            command_id=command.command_id,
            outcome=commands_pb.ACTION_OUTCOME_SUCCEEDED,
            message="chaos light agent: done",
            started_unix_ns=now,
            finished_unix_ns=now,
        )
        if command.WhichOneof("action") == "run_validation":
            result.validation_verdict = "pass"
            for uuid_ in command.run_validation.gpu_uuids:
                result.verdicts.add(check="v1_known_answer_gemm", gpu_uuid=uuid_, verdict="pass")
        self.executed[command.command_id] = result
        return result


def channel(address: str) -> grpc.aio.Channel:
    """A channel with its own subchannel (own TCP connection), as a separate node would have."""
    return grpc.aio.insecure_channel(address, options=[("grpc.use_local_subchannel_pool", 1)])


class LightFleet:
    """count light agents, each keeping one stream to address up, reconnecting with full jitter."""

    def __init__(
        self,
        address: str,
        count: int,
        *,
        gpus: int = 8,
        prefix: str = "light",
        reconnect_max_s: float = 1.0,
        seed: int = 0,
        heartbeat_s: float = 5.0,
    ) -> None:
        self.address = address
        self.agents = [LightAgent(i, f"{prefix}-{i:05d}", gpus) for i in range(count)]
        self.reconnect_max_s = reconnect_max_s
        self.heartbeat_s = heartbeat_s
        self._rng = random.Random(seed)
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._calls: dict[int, grpc.aio.StreamStreamCall] = {}

    def start(self) -> None:
        self._tasks = [asyncio.create_task(self._keep_connected(a)) for a in self.agents]

    def connected(self) -> int:
        return sum(1 for a in self.agents if a.connected)

    async def wait_connected(self, timeout_s: float, *, welcomes_at_least: int = 1) -> float:
        """Wait until every agent holds a stream (and has had at least so many Welcomes); seconds taken."""
        started = time.monotonic()
        while not all(a.connected and a.welcomes >= welcomes_at_least for a in self.agents):
            if time.monotonic() - started > timeout_s:
                missing = sum(1 for a in self.agents if not (a.connected and a.welcomes >= welcomes_at_least))
                raise AssertionError(f"{missing} of {len(self.agents)} agents not back after {timeout_s} s")
            await asyncio.sleep(0.05)
        return time.monotonic() - started

    async def stop(self) -> None:
        self._stop.set()
        for call in list(self._calls.values()):
            call.cancel()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _keep_connected(self, agent: LightAgent) -> None:
        attempt = 0
        while not self._stop.is_set():
            chan = channel(self.address)
            try:
                await self._session(chan, agent)
                attempt = 0
            except (grpc.aio.AioRpcError, ConnectionError, TimeoutError, asyncio.InvalidStateError):
                agent.failures += 1
            finally:
                agent.connected = False
                self._calls.pop(agent.index, None)
                await chan.close(grace=None)
            attempt += 1
            ceiling = min(self.reconnect_max_s, 0.05 * 2 ** min(attempt, 10))
            await asyncio.sleep(self._rng.uniform(0, ceiling))

    async def _session(self, chan: grpc.aio.Channel, agent: LightAgent) -> None:
        call = agent_grpc.AgentServiceStub(chan).Connect()
        self._calls[agent.index] = call
        await call.write(agent.hello())
        first = await asyncio.wait_for(call.read(), timeout=30)
        if first is grpc.aio.EOF or not first.HasField("welcome"):
            raise ConnectionError("no Welcome")
        agent.on_ack(first.welcome.acked_seq)
        agent.welcomes += 1
        agent.welcomed_at = time.monotonic()
        agent.connected = True
        outbox: asyncio.Queue[agent_pb.AgentMessage] = asyncio.Queue(maxsize=100)
        agent.outbox = outbox
        pending = agent.unacked()
        if pending:
            await outbox.put(agent_pb.AgentMessage(events=agent_pb.HealthEventBatch(events=pending)))

        async def reader() -> None:
            while True:
                message = await call.read()
                if message is grpc.aio.EOF:
                    raise ConnectionError("controller ended the stream")
                which = message.WhichOneof("payload")
                if which == "ack":
                    agent.on_ack(message.ack.acked_seq)
                elif which == "command":
                    agent.commands.append(message.command)
                    await outbox.put(agent_pb.AgentMessage(action_result=agent.answer(message.command)))

        async def writer() -> None:
            while True:
                try:
                    message = await asyncio.wait_for(outbox.get(), timeout=self.heartbeat_s)
                except TimeoutError:
                    message = agent_pb.AgentMessage(
                        heartbeat=agent_pb.Heartbeat(sent_unix_ns=time.time_ns(), spool_depth=len(agent.unacked()))
                    )
                await call.write(message)

        tasks = [asyncio.create_task(reader()), asyncio.create_task(writer())]
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                error = task.exception()
                if error is not None:
                    raise error
        finally:
            agent.outbox = None
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            call.cancel()


def percentile(values: Sequence[float], pct: float) -> float:
    """Nearest-rank percentile of values (0 when empty)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, round(pct / 100 * len(ordered) + 0.5) - 1))
    return ordered[rank]


async def until(predicate: Callable[[], bool], timeout_s: float, what: str, poll_s: float = 0.05) -> float:
    """Wait until predicate() holds; seconds taken. Fails naming what did not happen."""
    started = time.monotonic()
    while not predicate():
        if time.monotonic() - started > timeout_s:
            # Where every coroutine waits, for the failure report (captured output).
            for task in asyncio.all_tasks():
                # A frame without a line number (a C-level wait) breaks print_stack on 3.11: never
                # let the report hide the failure it reports.
                with contextlib.suppress(TypeError):
                    task.print_stack(limit=8, file=sys.stdout)
            raise AssertionError(f"{what}: not within {timeout_s} s")
        await asyncio.sleep(poll_s)
    return time.monotonic() - started


def agents_alive(tasks: Sequence[asyncio.Task[None]]) -> bool:
    """True while every in-process agent runs; an agent that ended by itself fails the test with its error."""
    for task in tasks:
        if task.done():
            error = None if task.cancelled() else task.exception()
            raise AssertionError(f"an agent stopped by itself: {error!r}")
    return True
