"""Benchmark: two controller replicas on a real PostgreSQL hold one power budget; the leader is SIGKILLed mid-period.

Run: `RASD_TEST_POSTGRES_URL=postgresql+psycopg://rasd:rasd@127.0.0.1:5432/rasd_test .venv/bin/python bench/replicas.py`
(`--nodes 8 --gpus-per-node 4` by default; `--no-write` leaves bench/RESULTS.md alone).

Two `rasd-controller` processes (lease election on a fresh schema of that PostgreSQL, remediation
off) and real agents (`rasd.agent.runtime.Agent` on simulated H100-class GPUs running one synchronous
training job, in this process). Each agent dials a small TCP front that stands in for the Kubernetes
Service: it prefers one replica and falls over to the other when that one is gone. Half the nodes
prefer ctl-a, half ctl-b, so every rack of the budget tree spans both replicas, and the job's
compute demand (650-700 W a GPU) is over every budget: the caps bind everywhere.

1. ctl-a leads; its power loop reads ctl-b's nodes from the aggregates ctl-b ships
   (`replication.aggregates`) and sends their caps through the relay.
2. Once every budget holds, the job leaves a quarter of the GPUs (one node of each replica in each
   rack): the leader moves their watts to the busy GPUs, decreases first. As soon as it has
   persisted a period's apply state with commands in flight, ctl-a is SIGKILLed.
3. ctl-b takes the lease, continues from the stored apply state, and its agents come over; later
   the idle GPUs rejoin the job and the watts move back under the new leader.

Measured: the limits every simulated GPU enforces, summed per domain every few milliseconds (a
violation: any domain over its budget, from the first moment every budget held); every command id
each agent ran (from its `command_executed` log lines: run, not answered from its journal), so a
command run twice shows; the takeover time (the lease's acquisition after the kill) and the new
leader's first period; the command sequence the new leader continued from. Writes the
`## Replicas` section of bench/RESULTS.md, ending with `Goal: ... met` or `NOT met`.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import dataclasses
import datetime
import json
import os
import pathlib
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import results
import sqlalchemy as sa
import structlog

from rasd.agent import runtime, spool
from rasd.agent import settings as agent_settings
from rasd.agent.gpu import simulated, step_job
from rasd.controller.core import aggregates, fleet
from rasd.controller.core.power import apply as power_apply
from rasd.controller.core.power import tree as power_tree

SECTION = "## Replicas"
POSTGRES_URL_ENV = "RASD_TEST_POSTGRES_URL"
CAP_ID = re.compile(r"^cap-(?P<epoch>[0-9a-z]+)-(?P<seq>\d+)$")


@dataclasses.dataclass(frozen=True)
class Setup:
    """The fleet, the budgets and the timing."""

    nodes: int = 8
    gpus_per_node: int = 4
    gpu_budget_w: int = 480
    """Each rack's budget per GPU (H100 limits 200-700 W; the job's compute wants 650-700 W)."""
    lease_s: float = 3.0
    renew_s: float = 1.0
    control_period_s: float = 1.0
    command_ttl_s: float = 3.0
    relay_poll_s: float = 0.1
    settle_s: float = 10.0
    """After every budget first held, before the load change that the kill interrupts."""
    after_s: float = 16.0
    """After the takeover: half of it with the GPUs idle, half after they rejoined."""
    sample_s: float = 0.005
    """How often the GPUs' limits are summed per domain."""

    def node_ids(self) -> list[str]:
        """node-00 .. node-NN."""
        return [f"node-{i:02d}" for i in range(self.nodes)]

    def prefers(self, index: int) -> str:
        """The replica node `index` dials first: alternating, so each rack spans both."""
        return "a" if index % 2 == 0 else "b"

    def tree(self) -> dict[str, Any]:
        """Racks of four nodes; each rack `gpu_budget_w` a GPU, the cluster 95 % of the racks' sum."""
        racks = [self.node_ids()[i : i + 4] for i in range(0, self.nodes, 4)]
        rack_w = [len(r) * self.gpus_per_node * self.gpu_budget_w for r in racks]
        return {
            "name": "cluster",
            "budget_w": int(0.95 * sum(rack_w)),
            "rows": [
                {
                    "name": "row-0",
                    "racks": [
                        {"name": f"rack-{k}", "budget_w": w, "nodes": [{"name": n} for n in r]}
                        for k, (r, w) in enumerate(zip(racks, rack_w, strict=True))
                    ],
                }
            ],
        }

    def idle_nodes(self) -> list[str]:
        """The nodes whose GPUs leave the job: the first two of each rack (one on each replica)."""
        ids = self.node_ids()
        return [ids[i + k] for i in range(0, self.nodes, 4) for k in (0, 1) if i + k < self.nodes]


CONFIG = """
[leader]
replica_id = "ctl-{name}"
lease_s = {lease_s}
renew_s = {renew_s}
relay_poll_s = {relay_poll_s}

[power]
telemetry_stale_s = 5.0
detect_window_s = 10.0

[power.policy]
control_period_s = {control_period_s}
command_ttl_s = {command_ttl_s}
"""


class Front:
    """A TCP front like a Kubernetes Service: each listener prefers one backend and falls over to the next."""

    def __init__(self) -> None:
        self._servers: list[asyncio.Server] = []
        self._connections: set[asyncio.Task[Any]] = set()

    async def listen(self, backends: list[int]) -> int:
        """A listener that connects to the first of backends that accepts; returns its port."""

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            for port in backends:
                try:
                    up_reader, up_writer = await asyncio.open_connection("127.0.0.1", port)
                    break
                except OSError:
                    continue
            else:
                writer.close()
                return
            piping = asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
            self._connections.add(piping)
            piping.add_done_callback(self._connections.discard)
            with contextlib.suppress(asyncio.CancelledError):
                await piping

        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        self._servers.append(server)
        return server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        """Stop listening and end every connection."""
        for server in self._servers:
            server.close()
        for piping in list(self._connections):
            piping.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)


async def _pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
    try:
        while data := await src.read(65536):
            dst.write(data)
            await dst.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        dst.close()


class Executions:
    """Every command id the agents ran, from their `command_executed` log lines (a structlog processor)."""

    def __init__(self) -> None:
        self.ran: collections.Counter[str] = collections.Counter()
        """Command id -> how often an agent ran it (not answered from its journal)."""
        self.replayed: collections.Counter[str] = collections.Counter()
        self.first_ran_s: dict[str, float] = {}
        self.node_of: dict[str, str] = {}

    def __call__(self, _logger: Any, _method: str, event: dict[str, Any]) -> dict[str, Any]:
        """Count one log event when it is an execution; pass it on unchanged."""
        if event.get("event") == "command_executed":
            command_id = str(event.get("command_id"))
            if event.get("replayed"):
                self.replayed[command_id] += 1
            else:
                self.ran[command_id] += 1
                self.first_ran_s.setdefault(command_id, time.time())
                self.node_of[command_id] = str(event.get("node"))
        return event


@contextlib.contextmanager
def agent_logs(executions: Executions, path: pathlib.Path) -> Iterator[None]:
    """The agents of this process log JSON lines to path, through executions; the old set-up after."""
    saved = structlog.get_config()
    with path.open("a") as out:
        structlog.configure(
            processors=[structlog.processors.add_log_level, executions, structlog.processors.JSONRenderer()],
            wrapper_class=structlog.make_filtering_bound_logger(20),
            logger_factory=structlog.PrintLoggerFactory(file=out),
            cache_logger_on_first_use=False,
        )
        try:
            yield
        finally:
            structlog.configure(**saved)


class Cluster:
    """The two `rasd-controller` processes, their logs, and reads of the shared store."""

    def __init__(self, setup: Setup, db_url: str, workdir: pathlib.Path) -> None:
        self.setup = setup
        self.db_url = db_url
        self.workdir = workdir
        self.bin = pathlib.Path(sys.executable).parent
        self.ports = {"a": _free_port(), "b": _free_port()}
        self.processes: dict[str, subprocess.Popen[bytes]] = {}
        self.engine = sa.create_engine(db_url, poolclass=sa.pool.NullPool)
        self._logs: list[Any] = []

    def start(self, name: str) -> None:
        """Start replica ctl-<name>."""
        s = self.setup
        config = self.workdir / f"controller-{name}.toml"
        power = {"tree": s.tree()}
        config.write_text(
            CONFIG.format(name=name, lease_s=s.lease_s, renew_s=s.renew_s, relay_poll_s=s.relay_poll_s,
                          control_period_s=s.control_period_s, command_ttl_s=s.command_ttl_s)
            + _toml_tree(power["tree"])
        )  # fmt: skip
        log = (self.workdir / f"controller-{name}.log").open("a")
        self._logs.append(log)
        self.processes[name] = subprocess.Popen(
            [str(self.bin / "rasd-controller"), "--insecure", "--listen", f"127.0.0.1:{self.ports[name]}",
             "--metrics-port", "-1", "--db", self.db_url, "--config", str(config), "--no-remediation"],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        )  # fmt: skip

    def query(self, sql: str, **params: Any) -> list[Any]:
        """Rows of a read on the shared store (empty before the first replica has migrated it)."""
        try:
            with self.engine.connect() as connection:
                return list(connection.execute(sa.text(sql), params).mappings().all())
        except sa.exc.ProgrammingError:
            return []

    def lease(self) -> dict[str, Any]:
        """The lease row ({} before the first election)."""
        rows = self.query("SELECT holder, fencing_token, acquired_unix_ns FROM leader_lease WHERE name = 'controller'")
        return dict(rows[0]) if rows else {}

    def apply_doc(self) -> tuple[int, dict[str, Any]]:
        """(when it was written, the document) of the persisted two-phase apply state; (0, {}) before one."""
        rows = self.query("SELECT state, updated_unix_ns FROM controller_states WHERE name = 'power/apply'")
        if not rows:
            return 0, {}
        state = rows[0]["state"]
        return int(rows[0]["updated_unix_ns"]), state if isinstance(state, dict) else json.loads(state)

    def records(self, name: str, event: str) -> list[dict[str, Any]]:
        """The JSON log lines of replica name with this event."""
        out = []
        for line in (self.workdir / f"controller-{name}.log").read_text().splitlines():
            if f'"{event}"' in line:
                try:
                    out.append(json.loads(line))
                except ValueError:
                    continue
        return out

    def tails(self, chars: int = 3000) -> str:
        """The end of each replica's log (for a failure's message)."""
        return "\n".join(
            f"--- {path.name}\n{path.read_text()[-chars:]}" for path in sorted(self.workdir.glob("controller-*.log"))
        )

    def cpu_s(self, name: str) -> float:
        """CPU seconds replica name has used so far (user + system; nan once it is gone)."""
        try:
            fields = pathlib.Path(f"/proc/{self.processes[name].pid}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, KeyError):
            return float("nan")
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def kill(self, name: str) -> None:
        """SIGKILL replica name and reap it."""
        self.processes[name].send_signal(signal.SIGKILL)
        self.processes[name].wait()

    def stop(self) -> None:
        """SIGTERM what still runs, close the logs and the engine."""
        for process in self.processes.values():
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                try:
                    process.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
        for log in self._logs:
            log.close()
        self.engine.dispose()


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _toml_tree(tree: dict[str, Any]) -> str:
    """The `[power.tree]` table as TOML."""
    lines = ["", "[power.tree]", f'name = "{tree["name"]}"', f"budget_w = {tree['budget_w']}"]
    for row in tree["rows"]:
        lines += ["[[power.tree.rows]]", f'name = "{row["name"]}"']
        for rack in row["racks"]:
            lines += ["[[power.tree.rows.racks]]", f'name = "{rack["name"]}"', f"budget_w = {rack['budget_w']}"]
            for node in rack["nodes"]:
                lines += ["[[power.tree.rows.racks.nodes]]", f'name = "{node["name"]}"']
    return "\n".join(lines) + "\n"


class Watcher:
    """The limits the simulated GPUs enforce, summed per budget domain every `sample_s`."""

    def __init__(self, setup: Setup, job: step_job.StepJob) -> None:
        self.setup = setup
        self.job = job
        self.tree = power_tree.PowerTree.from_mapping(setup.tree())
        index = self.tree.index
        self._node_idx = np.repeat([index.node_of_name[n] for n in setup.node_ids()], setup.gpus_per_node)
        self.held_at_s: float | None = None
        """When every budget first held (the GPUs boot at their 700 W default, over every budget)."""
        self.violations: list[tuple[float, tuple[str, ...], float]] = []
        """(time, domains over budget, watts over the cluster's or the worst domain's budget)."""
        self.samples = 0
        self.peak_cluster_w = 0.0
        """The highest sum of the limits over the whole fleet, sampled from when every budget held."""

    def over(self) -> tuple[list[str], float]:
        """The domains over budget now, and by how many watts at most."""
        caps = np.asarray(self.job.cap_w, dtype=np.float64)[: len(self._node_idx)]
        index = self.tree.index
        over = index.over_budget(self._node_idx, caps)
        excess = 0.0
        if over:
            sums = index.sums(self._node_idx, caps)
            excess = max(float(np.max(s - b)) for s, b in zip(sums, index.level_budgets(), strict=True))
        return over, excess

    async def run(self, stop: asyncio.Event) -> None:
        """Sample until stop is set."""
        while not stop.is_set():
            over, excess = self.over()
            now = time.time()
            self.samples += 1
            if self.held_at_s is None:
                if not over:
                    self.held_at_s = now
            else:
                self.peak_cluster_w = max(self.peak_cluster_w, float(np.sum(self.job.cap_w)))
                if over:
                    self.violations.append((now, tuple(over), excess))
            await asyncio.sleep(self.setup.sample_s)


def _agents(setup: Setup, job: step_job.StepJob, workload: simulated.StepWorkload, fronts: dict[str, str],
            workdir: pathlib.Path) -> list[runtime.Agent]:  # fmt: skip
    """One real agent per node, on simulated H100s of the shared job, dialling its front."""
    agents = []
    for i, node_id in enumerate(setup.node_ids()):
        backend = simulated.SimulatedBackend(node_id, setup.gpus_per_node, i + 1, workload=workload, job=job)
        settings = agent_settings.AgentSettings(
            node_id=node_id,
            labels={"rack": f"rack-{i // 4}"},
            link=agent_settings.LinkSettings(
                controller_address=fronts[node_id],
                telemetry_send_interval_ms=500,
                heartbeat_interval_ms=500,
                reconnect_initial_s=0.05,
                reconnect_max_s=0.5,
                welcome_timeout_s=5.0,
            ),
            sampling=agent_settings.SamplingSettings(counter_interval_ms=500),
        )
        journal = spool.Spool(str(workdir / f"{node_id}.db"))
        agents.append(runtime.Agent(settings, backend, journal, boot_id=f"boot-{node_id}"))
    return agents


async def _until(what: str, predicate: Callable[[], Any], timeout_s: float, poll_s: float = 0.1) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = await asyncio.to_thread(predicate)
        if value:
            return value
        await asyncio.sleep(poll_s)
    raise TimeoutError(f"timed out after {timeout_s:g} s waiting for {what}")


def _connected(cluster: Cluster, name: str) -> set[str]:
    opened = collections.Counter(r["node"] for r in cluster.records(name, "agent_connected"))
    closed = collections.Counter(r["node"] for r in cluster.records(name, "agent_disconnected"))
    return {node for node, n in opened.items() if n > closed[node]}


async def _kill_mid_period(cluster: Cluster, after_ns: int, timeout_s: float) -> tuple[int, int, dict[str, Any]]:
    """SIGKILL ctl-a as soon as it has persisted an apply state with commands in flight.

    Returns (kill time ns, when that state was written ns, the state).
    """
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        written_ns, doc = await asyncio.to_thread(cluster.apply_doc)
        if written_ns > after_ns and _in_flight(doc):
            cluster.kill("a")
            return time.time_ns(), written_ns, doc
        await asyncio.sleep(0.002)
    raise TimeoutError("ctl-a never persisted an apply state with commands in flight after the load change")


def _in_flight(doc: dict[str, Any]) -> list[str]:
    """The nodes of the GPUs with a command in flight in a persisted apply state (one entry per GPU)."""
    if not doc:
        return []
    state = power_apply.ApplyState.from_mapping(doc)
    return [state.gpus[i].node_id for i in np.flatnonzero(state.pending_seq >= 0).tolist()]


def _ranks(setup: Setup, node_id: str) -> range:
    """The job's ranks of a node's GPUs (nodes join the job in order)."""
    i = setup.node_ids().index(node_id)
    return range(i * setup.gpus_per_node, (i + 1) * setup.gpus_per_node)


def _logged_s(record: dict[str, Any]) -> float:
    return datetime.datetime.fromisoformat(record["timestamp"]).timestamp()


@dataclasses.dataclass
class Run:
    """What one run left to analyse."""

    setup: Setup
    cluster: Cluster
    watcher: Watcher
    executions: Executions
    marks: dict[str, float] = dataclasses.field(default_factory=dict)
    """Phase -> unix s: held, change, kill, takeover, loop_started, all_on_b, rejoin, end."""
    killed_state: dict[str, Any] = dataclasses.field(default_factory=dict)
    killed_state_written_s: float = 0.0
    lease_before: dict[str, Any] = dataclasses.field(default_factory=dict)
    lease_after: dict[str, Any] = dataclasses.field(default_factory=dict)
    cpu_s: dict[str, float] = dataclasses.field(default_factory=dict)


async def _bring_up(run: Run, front: Front, job: step_job.StepJob, stop: asyncio.Event) -> list[asyncio.Task[None]]:
    """ctl-a leads, ctl-b follows, every agent on the replica it prefers."""
    setup, cluster = run.setup, run.cluster
    cluster.start("a")
    await _until("ctl-a to lead", lambda: cluster.lease().get("holder") == "ctl-a", 90)
    cluster.start("b")
    await _until("ctl-b to serve", lambda: cluster.records("b", "controller_started"), 90)
    fronts = {}
    for i, node_id in enumerate(setup.node_ids()):
        first = setup.prefers(i)
        order = [cluster.ports[first], cluster.ports["b" if first == "a" else "a"]]
        fronts[node_id] = f"127.0.0.1:{await front.listen(order)}"
    workload = simulated.StepWorkload(period_s=2.0)
    agents = _agents(setup, job, workload, fronts, cluster.workdir)
    tasks = [asyncio.create_task(agent.run(stop), name=f"agent-{agent.identity.node_id}") for agent in agents]
    wanted = {node_id: setup.prefers(i) for i, node_id in enumerate(setup.node_ids())}

    def placed() -> bool:
        on = {name: _connected(cluster, name) for name in ("a", "b")}
        return all(node_id in on[name] for node_id, name in wanted.items())

    await _until("every agent on the replica it prefers", placed, 90)
    return tasks


async def _fail_over(run: Run, job: step_job.StepJob) -> None:
    """Load change, SIGKILL ctl-a mid-period, ctl-b takes over; the idle GPUs rejoin under it."""
    setup, cluster, marks = run.setup, run.cluster, run.marks
    await _until("every budget to hold", lambda: run.watcher.held_at_s is not None, 120)
    marks["held"] = run.watcher.held_at_s or time.time()
    await asyncio.sleep(setup.settle_s)
    run.lease_before = cluster.lease()
    marks["change"] = time.time()
    for node_id in setup.idle_nodes():
        for rank in _ranks(setup, node_id):
            job.set_active(rank, False)
    run.cpu_s["a"] = cluster.cpu_s("a")
    kill_ns, written_ns, run.killed_state = await _kill_mid_period(cluster, int(marks["change"] * 1e9), 60)
    marks["kill"], run.killed_state_written_s = kill_ns / 1e9, written_ns / 1e9

    def taken() -> dict[str, Any] | bool:
        row = cluster.lease()
        return row.get("holder") == "ctl-b" and row

    lease = await _until("ctl-b to take the lease", taken, setup.lease_s * 20)
    run.lease_after = lease
    marks["takeover"] = int(lease["acquired_unix_ns"]) / 1e9
    started = await _until("ctl-b's power loop", lambda: cluster.records("b", "power_loop_started"), 60)
    marks["loop_started"] = _logged_s(started[-1])
    await _until("every agent on ctl-b", lambda: set(setup.node_ids()) <= _connected(cluster, "b"), 90)
    marks["all_on_b"] = time.time()
    await asyncio.sleep(setup.after_s / 2)
    marks["rejoin"] = time.time()
    for node_id in setup.idle_nodes():
        for rank in _ranks(setup, node_id):
            job.set_active(rank, True)
    await asyncio.sleep(setup.after_s / 2)
    run.cpu_s["b"] = cluster.cpu_s("b")
    marks["end"] = time.time()


async def run_replicas(setup: Setup, db_url: str, workdir: pathlib.Path) -> dict[str, Any]:
    """Run the scenario (module docstring) on the PostgreSQL schema db_url; returns its figures."""
    cluster = Cluster(setup, db_url, workdir)
    front = Front()
    executions = Executions()
    job = step_job.StepJob(simulated.StepWorkload(period_s=2.0).shape(), seed=1)
    run = Run(setup, cluster, Watcher(setup, job), executions)
    stop_agents, stop_watch = asyncio.Event(), asyncio.Event()
    tasks: list[asyncio.Task[None]] = []
    started = run.marks["start"] = time.time()
    try:
        with agent_logs(executions, workdir / "agents.log"):
            try:
                tasks = await _bring_up(run, front, job, stop_agents)
            except TimeoutError as exc:
                raise TimeoutError(f"{exc}\n{cluster.tails()}") from exc
            watching = asyncio.create_task(run.watcher.run(stop_watch))
            try:
                await _fail_over(run, job)
            except TimeoutError as exc:
                raise TimeoutError(f"{exc}\n{cluster.tails()}") from exc
            finally:
                stop_watch.set()
                await watching
                stop_agents.set()
                await asyncio.gather(*tasks, return_exceptions=True)
    finally:
        await front.close()
        cluster.stop()
    figures = analyse(run)
    figures["wall_s"] = round(time.time() - started, 1)
    return figures


def _cap_seqs(executions: Executions) -> dict[str, tuple[str, int]]:
    """Cap command id -> (epoch, seq), for the SetPowerCap commands the agents ran."""
    out = {}
    for command_id in executions.ran:
        found = CAP_ID.match(command_id)
        if found:
            out[command_id] = (found["epoch"], int(found["seq"]))
    return out


def analyse(run: Run) -> dict[str, Any]:
    """The run's figures: violations, commands run twice, the takeover, the lineage the new leader continued."""
    setup, marks, ran, cluster = run.setup, run.marks, run.executions, run.cluster
    kill = marks["kill"]
    restored = cluster.records("b", "power_state_restored")
    next_seq = int(restored[-1]["next_seq"]) if restored else -1
    caps = _cap_seqs(ran)
    old = {c for c, (_epoch, seq) in caps.items() if seq < next_seq}
    new = {c for c, (_epoch, seq) in caps.items() if seq >= next_seq}
    relayed = [r for r in cluster.records("b", "relay_command_sent") if r.get("action") == "relayed"]
    violations = run.watcher.violations
    caps_w = np.asarray(run.watcher.job.cap_w, dtype=np.float64)
    return {
        "nodes": setup.nodes,
        "gpus": setup.nodes * setup.gpus_per_node,
        "budget_held_after_s": round(marks["held"] - marks.get("start", marks["held"]), 1),
        "violations": len(violations),
        "violation_max_w": round(max((v[2] for v in violations), default=0.0), 1),
        "violation_domains": sorted({d for v in violations for d in v[1]}),
        "samples": run.watcher.samples,
        "sample_interval_ms": round((marks["end"] - marks["held"]) * 1000 / max(1, run.watcher.samples), 1),
        "peak_cluster_caps_w": int(run.watcher.peak_cluster_w),
        "duplicates": {c: n for c, n in ran.ran.items() if n > 1},
        "commands_run": sum(ran.ran.values()),
        "answered_from_journal": sum(ran.replayed.values()),
        "cap_epochs": sorted({epoch for epoch, _seq in caps.values()}),
        "old_leader_caps": len(old),
        "old_leader_nodes": sorted({ran.node_of[c] for c in old if ran.first_ran_s[c] < kill}),
        "old_leader_caps_run_after_kill": sum(1 for c in old if ran.first_ran_s[c] >= kill),
        "relayed_to_ctl_b_nodes_before_kill": sum(1 for r in relayed if _logged_s(r) < kill),
        "new_leader_caps": len(new),
        "new_leader_caps_before_kill": sum(1 for c in new if ran.first_ran_s[c] < kill),
        "new_leader_nodes": sorted({ran.node_of[c] for c in new}),
        "in_flight_at_kill": len(_in_flight(run.killed_state)),
        "in_flight_at_kill_on_ctl_b_nodes": sum(
            1 for n in _in_flight(run.killed_state) if setup.prefers(setup.node_ids().index(n)) == "b"
        ),
        "kill_after_persist_ms": round((kill - run.killed_state_written_s) * 1000, 1),
        "persisted_next_seq_at_kill": int(run.killed_state.get("next_seq", -1)),
        "restored_next_seq": next_seq,
        "fencing_tokens": (run.lease_before.get("fencing_token"), run.lease_after.get("fencing_token")),
        "takeover_s": round(marks["takeover"] - kill, 2),
        "loop_started_after_kill_s": round(marks["loop_started"] - kill, 2),
        "all_agents_on_b_after_kill_s": round(marks["all_on_b"] - kill, 2),
        "caps_w_at_end": int(caps_w.sum()),
        "cluster_budget_w": int(setup.tree()["budget_w"]),
        "cpu_s": {k: round(v, 1) for k, v in run.cpu_s.items()},
        "phases_s": {k: round(v - kill, 1) for k, v in marks.items()},
    }


def goal_met(figures: dict[str, Any], setup: Setup) -> tuple[bool, list[str]]:
    """Whether the run met the goal, and what missed."""
    missed = []
    if figures["violations"]:
        missed.append(f"{figures['violations']} budget violations (up to {figures['violation_max_w']} W)")
    if figures["duplicates"]:
        missed.append(f"commands run twice: {figures['duplicates']}")
    if figures["takeover_s"] > setup.lease_s + 1.0:
        missed.append(f"takeover {figures['takeover_s']} s > lease {setup.lease_s:g} s + 1 s")
    if len(figures["cap_epochs"]) != 1 or figures["restored_next_seq"] < figures["persisted_next_seq_at_kill"]:
        missed.append("the new leader did not continue the stored apply state's lineage")
    if figures["new_leader_caps_before_kill"]:
        missed.append("a command id of the new leader ran before the kill (reused id)")
    if set(figures["old_leader_nodes"]) != set(setup.node_ids()):
        missed.append("the leader did not cap every node of both replicas")
    if not figures["new_leader_caps"]:
        missed.append("the new leader sent no cap")
    return not missed, missed


def section(figures: dict[str, Any], setup: Setup, machine: str, command: str) -> str:
    """The `## Replicas` section of bench/RESULTS.md."""
    ok, missed = goal_met(figures, setup)
    f = figures
    journal = f"{f['commands_run']} run, {f['answered_from_journal']} answered from the journal"
    lineage = f"{len(f['cap_epochs'])}; next seq persisted {f['persisted_next_seq_at_kill']}, restored "
    lineage += str(f["restored_next_seq"])
    old_nodes = f"{len(f['old_leader_nodes'])} of {f['nodes']} nodes"
    rows = [
        ("budget violations (every domain, GPUs' enforced limits)",
         f"{f['violations']} of {f['samples']:,} samples (one every {f['sample_interval_ms']} ms)"),
        ("commands run twice on an agent", f"{len(f['duplicates'])} ({journal})"),
        ("takeover (lease acquired after the SIGKILL)", f"{f['takeover_s']} s (lease {setup.lease_s:g} s)"),
        ("new leader's power loop started after the kill", f"{f['loop_started_after_kill_s']} s"),
        ("every agent on the new leader after the kill", f"{f['all_agents_on_b_after_kill_s']} s"),
        ("GPUs with a command in flight in the state persisted at the kill",
         f"{f['in_flight_at_kill']} ({f['in_flight_at_kill_on_ctl_b_nodes']} on ctl-b's nodes); killed "
         f"{f['kill_after_persist_ms']} ms after it was written"),
        ("apply-state lineages of every cap run", lineage),
        ("caps by the old leader", f"{f['old_leader_caps']} ({old_nodes}; {f['relayed_to_ctl_b_nodes_before_kill']} "
         "relayed through ctl-b)"),
        ("old leader's caps that ran after the kill", f"{f['old_leader_caps_run_after_kill']}"),
        ("caps by the new leader", f"{f['new_leader_caps']} ({len(f['new_leader_nodes'])} nodes)"),
        ("summed caps, highest sampled and at the end / cluster budget",
         f"{f['peak_cluster_caps_w']:,} and {f['caps_w_at_end']:,} / {f['cluster_budget_w']:,} W"),
        ("controller CPU (ctl-a until the kill, ctl-b until the end)",
         f"{f['cpu_s'].get('a')} s in {-f['phases_s']['start']:g} s; {f['cpu_s'].get('b')} s in "
         f"{f['phases_s']['end'] - f['phases_s']['start']:g} s"),
    ]  # fmt: skip
    table = "\n".join(["| figure | measured |", "|---|---|", *(f"| {a} | {b} |" for a, b in rows)])
    verdict = "met" if ok else f"NOT met ({'; '.join(missed)})"
    return (
        f"{SECTION}\n\n"
        f"Command: `{command}`  \n"
        f"Machine: {machine}  \n"
        f"Run: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, wall {f['wall_s']} s. Two `rasd-controller` "
        f"processes (lease {setup.lease_s:g} s, renew {setup.renew_s:g} s, relay poll {setup.relay_poll_s:g} s, "
        f"remediation off) on a fresh schema of the PostgreSQL; {f['nodes']} real agents in the bench's process "
        f"({f['gpus']} simulated H100-class GPUs, one synchronous 2 s-step job at 650-700 W compute), half "
        f"preferring each replica through a TCP front; budget tree: racks of 4 nodes at {setup.gpu_budget_w} W a "
        f"GPU, the cluster at 95 % of their sum; control period {setup.control_period_s:g} s, command TTL "
        f"{setup.command_ttl_s:g} s. The GPUs' enforced limits summed per domain every {setup.sample_s * 1000:g} ms "
        "from the moment every budget first held. The job leaves the first two nodes of each rack (one per "
        "replica); ctl-a is SIGKILLed the moment it has persisted an apply state with commands in flight; the "
        f"GPUs rejoin {setup.after_s / 2:g} s after every agent reached ctl-b.\n\n"
        f"{table}\n\n"
        f"{_aggregate_prose(f.get('aggregate'))}"
        f"Goal: two replicas hold every budget across both, and a leader SIGKILLed mid-period is continued with "
        f"0 violations and 0 commands run twice: {verdict}\n"
    )


def synthetic_aggregate(nodes: int, gpus_per_node: int = 8) -> aggregates.ReplicaAggregate:
    """A replica's aggregate of `nodes` busy nodes (synthetic values, real shapes), 25 s of 10 Hz series."""
    built = time.time_ns()
    streams, records, latest = {}, {}, {}
    for n in range(nodes):
        node_id = f"node-{n:05d}"
        uuids = tuple(f"GPU-{n:08x}-0000-4000-8000-{g:012x}" for g in range(gpus_per_node))
        streams[node_id] = aggregates.NodeStream(node_id, uuid.uuid4().hex, built - 10**12, uuid.uuid4().hex,
                                                 {"rack": f"rack-{n // 16}"}, uuids, -5_000)  # fmt: skip
        for g, gpu in enumerate(uuids):
            bus = f"00000000:{0x18 + 0x10 * g:02X}:00.0"
            records[gpu] = fleet.GpuRecord(gpu, "H100", bus, 200, 700, 700, serial=f"SIM{n:06d}{g:02d}",
                                           labels={"index": str(g)}, node_id=node_id)  # fmt: skip
            latest[gpu] = fleet.GpuLatest(power_w=600.0 + g, power_sample_unix_ns=built - 10**8,
                                          enforced_power_limit_w=650, temperature_c=71, utilization_gpu_pct=100,
                                          clock_event_reasons=4, counters_unix_ns=built - 10**8)  # fmt: skip
    peaks = {gpu: 680.0 for gpu in records}
    series = tuple((built - k * 10**8, 600.0 * len(records), len(records)) for k in range(250))
    return aggregates.ReplicaAggregate("ctl-x", built, 1.5, streams, records, latest,
                                       dict.fromkeys(records, built - 10**8), 5.0, peaks, 20.0, peaks,
                                       series=series)  # fmt: skip


def aggregate_costs(nodes: int) -> dict[str, float]:
    """CPU ms to encode and decode one replica's aggregate of `nodes` x 8 GPUs (best of 3), and its size."""
    aggregate = synthetic_aggregate(nodes)

    def best_ms(work: Callable[[], Any]) -> float:
        times = []
        for _ in range(3):
            started = time.process_time()
            work()
            times.append((time.process_time() - started) * 1000)
        return round(min(times), 1)

    inventory = aggregates.encode_records(aggregate.records)
    payload = aggregates.encode(aggregate, records=inventory)
    records = aggregates.decode_records(inventory)
    return {
        "nodes": nodes,
        "bytes": len(payload),
        "inventory_encode_ms": best_ms(lambda: aggregates.encode_records(aggregate.records)),
        "inventory_decode_ms": best_ms(lambda: aggregates.decode_records(inventory)),
        "encode_ms": best_ms(lambda: aggregates.encode(aggregate, records=inventory)),
        "decode_ms": best_ms(lambda: aggregates.decode(payload, records=records)),
    }


def _aggregate_prose(costs: dict[str, float] | None) -> str:
    if not costs:
        return ""
    return (
        f"What one replica of {costs['nodes']:,} nodes x 8 GPUs ships each half period (a synthetic aggregate "
        f"of that shape, timed on its own, best of 3, CPU): {costs['bytes'] / 1e6:.2f} MB compressed; "
        f"{costs['encode_ms']:g} ms to encode on the replica, {costs['decode_ms']:g} ms to decode on the "
        f"leader (format {aggregates.FORMAT_VERSION}, its streams part included, which the leader decodes once per"
        f" change); the inventory part {costs['inventory_encode_ms']:g} ms "
        f"to encode and {costs['inventory_decode_ms']:g} ms to decode, once per change of the streams.\n\n"
    )


def main(argv: list[str] | None = None) -> int:
    """Create a schema, run, drop the schema, print the section, write it to bench/RESULTS.md."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=Setup.nodes)
    parser.add_argument("--gpus-per-node", type=int, default=Setup.gpus_per_node)
    parser.add_argument("--aggregate-nodes", type=int, default=2048, help="nodes of the synthetic aggregate timed")
    parser.add_argument("--no-write", action="store_true", help="print only; leave bench/RESULTS.md alone")
    args = parser.parse_args(argv)
    url = os.environ.get(POSTGRES_URL_ENV, "")
    if not url:
        parser.error(f"{POSTGRES_URL_ENV} must name a PostgreSQL (a fresh schema is made in it and dropped after)")
    setup = Setup(nodes=args.nodes, gpus_per_node=args.gpus_per_node)
    info = results.machine()
    with tempfile.TemporaryDirectory() as tmp, schema(url) as db_url:
        figures = asyncio.run(run_replicas(setup, db_url, pathlib.Path(tmp)))
    figures["aggregate"] = aggregate_costs(args.aggregate_nodes)
    command = f"{POSTGRES_URL_ENV}=... .venv/bin/python bench/replicas.py --nodes {args.nodes}"
    command += f" --gpus-per-node {args.gpus_per_node} --aggregate-nodes {args.aggregate_nodes}"
    text = section(figures, setup, info, command)
    print(text)
    if not args.no_write:
        results.write_section(SECTION, text)
    return 0 if goal_met(figures, setup)[0] else 1


@contextlib.contextmanager
def schema(url: str) -> Iterator[str]:
    """A fresh schema in the PostgreSQL at url, dropped afterwards; yields a URL that uses it."""
    name = f"rasd_bench_{uuid.uuid4().hex[:12]}"
    admin = sa.create_engine(url, poolclass=sa.pool.NullPool)
    with admin.begin() as connection:
        connection.execute(sa.text(f'CREATE SCHEMA "{name}"'))
    parsed = sa.engine.make_url(url)
    options = " ".join(filter(None, [parsed.query.get("options", ""), f"-csearch_path={name}"]))
    try:
        yield parsed.update_query_dict({"options": options}).render_as_string(hide_password=False)
    finally:
        with admin.begin() as connection:
            connection.execute(sa.text(f'DROP SCHEMA "{name}" CASCADE'))
        admin.dispose()


if __name__ == "__main__":
    sys.exit(main())
