"""Runs a whole rasd system on loopback: one real controller and N agents with simulated GPUs.

Agents share this process and its event loop (so thousands fit on 2 cores) but each keeps its own
gRPC stream, spool and state, exactly as separate nodes would. The scenario's faults are reported
by the simulated GPUs (directly, or through counters the agents' health evaluators must notice) and
travel the real path (spool → stream → store → ack); operator actions go through the controller's
command path to the agents and back.

Every figure in the result is measured from what the controller and agents did and compared with
the scenario's ground truth; none is copied from the scenario.
"""

from __future__ import annotations

import asyncio
import dataclasses
import pathlib
import resource
import sys
import time
import uuid
from collections.abc import Callable
from typing import TextIO

import grpc
import structlog

from rasd.agent import node_ops, runtime, spool
from rasd.agent import settings as agent_settings
from rasd.agent.gpu import simulated, step_job
from rasd.api.v1 import admin_service_pb2 as admin_pb
from rasd.api.v1 import admin_service_pb2_grpc as admin_grpc
from rasd.api.v1 import commands_pb2 as commands_pb
from rasd.cli import views
from rasd.common import devcerts, tls
from rasd.controller import server
from rasd.controller.core import fleet
from rasd.controller.ingest import service as ingest_mod
from rasd.controller.remediation import service as remediation_mod
from rasd.controller.rpc import authn
from rasd.sim import bmc as bmc_mod
from rasd.sim import netdelay, power_sim
from rasd.sim import scenario as scenario_mod

log = structlog.get_logger("rasd.sim")


@dataclasses.dataclass(frozen=True)
class SimSettings:
    """What to simulate."""

    nodes: int
    gpus_per_node: int
    duration_s: float
    seed: int
    scenario: scenario_mod.Scenario
    out_dir: pathlib.Path
    table_interval_s: float = 5.0
    """How often the live fleet table is printed; 0 disables it."""
    nodes_per_rack: int = 4
    tls: bool = True
    """Run every agent stream and admin call over mutual TLS with dev certificates (OUT/certs)."""
    record_path: pathlib.Path | None = None
    """Record the controller's inbound streams and decisions here (replay: rasd-sim --replay)."""
    downlink_delay_s: tuple[float, float] | None = None
    """Deliver what the controller sends to the agents late by U(lo, hi) s per chunk, in order
    (`sim.netdelay`): delivery jitter. None: the agents connect straight to the controller."""


@dataclasses.dataclass(frozen=True)
class InjectedFault:
    """Ground truth: a fault that happened on a node, as its simulated backend recorded it."""

    node_id: str
    fired: simulated.FiredFault


@dataclasses.dataclass
class CommandOutcome:
    """A command the scripted operator sent and what came back."""

    node_id: str
    requested_w: int
    sent_unix_ns: int
    outcome: str = "NO_RESULT"
    latency_s: float | None = None
    read_back_ok: bool = False


@dataclasses.dataclass
class SimResult:
    """Everything measured in one run; `report.build()` turns it into report.json."""

    settings: SimSettings
    started_unix_ns: int
    finished_unix_ns: int
    controller_address: str
    metrics_port: int | None
    injected: list[InjectedFault]
    commands: list[CommandOutcome]
    final_nodes: list[admin_pb.NodeStatus]
    samples_ingested: int
    stored_events: list[dict[str, object]]
    agent_events_spooled: int
    agent_events_unacked: int
    power_rows: list[tuple[int, float, int]]
    operator_marks_unix_ns: list[int]
    cpu_s: float
    """User + system CPU seconds of this process and of its reaped children (the commit writer)."""
    peak_rss_mib: float
    fleet_power: dict[str, float] = dataclasses.field(default_factory=dict)
    outbox: list[dict[str, object]] = dataclasses.field(default_factory=list)
    """The controller's outbox at the end (every action it decided), oldest first."""
    tickets: list[dict[str, object]] = dataclasses.field(default_factory=list)
    decision_latency_s: list[float] = dataclasses.field(default_factory=list)
    max_disrupted_nodes: int = 0
    disruption_budget: int = 0
    agent_streams: int = 0
    """Agent streams the controller opened (counted by the controller, not by the sim)."""
    agent_streams_mtls: int = 0
    """Of those, streams whose agent presented a verified node certificate."""
    power_trace: power_sim.PowerTrace | None = None
    """Ground truth of the power loop's effect (scenarios with a `[power]` table)."""
    quarantines: list[dict[str, object]] = dataclasses.field(default_factory=list)
    """The controller's active quarantines at the end (node, GPU, port)."""
    stragglers: list[dict[str, object]] = dataclasses.field(default_factory=list)
    """The GPUs the controller named stragglers, in the order named (node, GPU, when, steps, lag, reason)."""
    straggler_steps_judged: int = 0
    stalls: list[dict[str, object]] = dataclasses.field(default_factory=list)
    """The hung-job stalls the controller named, oldest first (when, suspect, silent nodes, reason)."""


def _node_id(index: int) -> str:
    return f"node-{index:03d}"


def _labels(index: int, nodes_per_rack: int) -> dict[str, str]:
    rack = index // nodes_per_rack
    return {"rack": f"rack-{rack:02d}", "row": f"row-{rack // 4}", "nvlink_domain": f"nvl-{index:03d}"}


@dataclasses.dataclass
class _Session:
    """One run's controller, simulated nodes and what the scripted operator did, for its steps."""

    settings: SimSettings
    controller: server.Controller
    backends: list[simulated.SimulatedBackend]
    agents: list[runtime.Agent]
    probe: power_sim.PowerProbe | None
    started_ns: int
    clock: Callable[[], int]
    ops: list[node_ops.SimulatedNodeOps] = dataclasses.field(default_factory=list)
    bmc: bmc_mod.SimulatedBmc | None = None
    commands: list[CommandOutcome] = dataclasses.field(default_factory=list)
    operator_marks: list[int] = dataclasses.field(default_factory=list)


@dataclasses.dataclass(frozen=True)
class _ControllerRecord:
    """What the controller held at the end, read before it stops."""

    power_rows: list[tuple[int, float, int]]
    samples_ingested: int
    outbox: list[dict[str, object]]
    tickets: list[dict[str, object]]
    quarantines: list[dict[str, object]]
    stragglers: list[dict[str, object]]
    straggler_steps_judged: int
    stalls: list[dict[str, object]]


async def run(
    settings: SimSettings, out: TextIO | None = None, *, clock: Callable[[], int] = time.time_ns
) -> SimResult:
    """Run the simulation for settings.duration_s and return what was measured (printing to out or stdout)."""
    out = out or sys.stdout
    pki = _fresh_out_dir(settings)
    power = settings.scenario.power
    gpu_model = scenario_mod.GPU_MODELS[power.gpu_model] if power else simulated.H100_SXM
    sim_bmc = bmc_mod.SimulatedBmc(_action_faults(settings, "power_cycle_bmc"))
    controller = await _start_controller(settings, pki, gpu_model, sim_bmc)
    agent_address = controller.address
    proxy = None
    if settings.downlink_delay_s is not None:
        proxy = netdelay.DelayProxy(controller.address, settings.downlink_delay_s, settings.seed)
        agent_address = await proxy.start()
    started_ns = clock()
    workload = _workload(settings.scenario.workload, started_ns)
    # One job for the whole fleet: a step ends when its slowest rank on any node is done.
    job = step_job.StepJob(workload.shape(gpu_model.idle_w), settings.seed)
    backends: list[simulated.SimulatedBackend] = []
    agents: list[runtime.Agent] = []
    ops: list[node_ops.SimulatedNodeOps] = []
    node_faults = _action_faults(settings)
    for index in range(settings.nodes):
        backends.append(_backend(settings, index, workload, job, gpu_model, started_ns, clock))
        # Simulated GPUs take real repairs: the controller's commands change their state.
        ops.append(node_ops.SimulatedNodeOps(backends[-1], node_faults.get(_node_id(index), ())))
        sim_bmc.attach(_node_id(index), ops[-1])
        agents.append(_agent(settings, index, backends[-1], agent_address, pki, ops[-1]))
    probe = _power_probe(settings, controller, job, backends, gpu_model, started_ns, clock)
    session = _Session(settings, controller, backends, agents, probe, started_ns, clock, ops, sim_bmc)
    stop_agents = asyncio.Event()
    agent_tasks = [asyncio.create_task(a.run(stop_agents), name=f"agent-{a.identity.node_id}") for a in agents]
    # Reads (the live table, the final fleet) go through a viewer certificate; the scripted budget
    # changes are an admin's (SetPowerBudget needs the admin role), each with the least it needs.
    channel = tls.aio_channel(controller.address, _operator_files(pki, "viewer"))
    admin = admin_grpc.AdminServiceStub(channel)
    admin_channel = tls.aio_channel(controller.address, _operator_files(pki, "admin"))
    budget_admin = admin_grpc.AdminServiceStub(admin_channel)
    print(
        f"rasd-sim: scenario {settings.scenario.name!r}: {settings.nodes} nodes × {settings.gpus_per_node} GPUs "
        f"for {settings.duration_s:g} s; controller {controller.address}, metrics :{controller.metrics_port}",
        file=out,
        flush=True,
    )
    try:
        final_nodes, events = await _play(session, admin, budget_admin, out)
    finally:
        for node in ops:  # hung repairs end, so that every agent can stop
            node.close()
        sim_bmc.close()
        stop_agents.set()
        await asyncio.gather(*agent_tasks, return_exceptions=True)
        if proxy is not None:
            await proxy.close()
        await channel.close()
        await admin_channel.close()
        finished_ns = clock()
        record = await _controller_record(controller, started_ns)
        await controller.stop()
    return _result(session, final_nodes, events, record, finished_ns)


def _fresh_out_dir(settings: SimSettings) -> devcerts.DevPki | None:
    """Make the output folder, remove a previous run's database, and issue dev certificates if TLS is on."""
    settings.out_dir.mkdir(parents=True, exist_ok=True)
    db_path = settings.out_dir / "rasd.db"
    for stale in (db_path, db_path.with_suffix(".db-wal"), db_path.with_suffix(".db-shm")):
        stale.unlink(missing_ok=True)
    if not settings.tls:
        return None
    return devcerts.init(settings.out_dir / "certs", [_node_id(i) for i in range(settings.nodes)])


def _action_faults(settings: SimSettings, action: str | None = None) -> dict[str, list[simulated.ActionFault]]:
    """The scenario's action faults by node id (only those of one action, when given)."""
    out: dict[str, list[simulated.ActionFault]] = {}
    for found in settings.scenario.action_faults:
        if action is None or found.fault.action == action:
            out.setdefault(_node_id(found.node % settings.nodes), []).append(found.fault)
    return out


async def _start_controller(
    settings: SimSettings,
    pki: devcerts.DevPki | None,
    gpu_model: simulated.SimulatedGpuModel,
    sim_bmc: bmc_mod.SimulatedBmc,
) -> server.Controller:
    """Start a real controller on a loopback port, with its store in the output folder and the simulated BMC."""
    power = settings.scenario.power
    controller = server.Controller(
        server.ControllerSettings(
            listen="127.0.0.1:0",
            db_url=f"sqlite:///{settings.out_dir / 'rasd.db'}",
            metrics_port=0,
            remediation_policy=settings.scenario.remediation,
            ingest=ingest_mod.IngestSettings(stragglers=settings.scenario.stragglers),
            security=authn.SecuritySettings(
                tls=tls.TlsFiles(pki.ca.cert, pki.controller.cert, pki.controller.key) if pki else None
            ),
            record_path=settings.record_path,
            power=_power_table(settings, gpu_model) if power and power.managed else None,
            power_cycler=sim_bmc,
            commit_writer="process",  # as rasd-controller runs
        )
    )
    await controller.start()
    return controller


def _workload(job_spec: scenario_mod.Workload, started_ns: int) -> simulated.StepWorkload:
    """The scenario's training job as the simulated GPUs run it, its phase anchored at the start."""
    return simulated.StepWorkload(
        period_s=job_spec.period_s,
        compute_fraction=job_spec.compute_fraction,
        compute_w=job_spec.compute_w,
        comm_w=job_spec.comm_w,
        # One phase anchor for the whole fleet: this is what makes the job step-synchronous.
        anchor_unix_s=started_ns / 1e9,
        start_after_s=job_spec.start_after_s,
        stop_after_s=job_spec.stop_after_s,
        checkpoint_every_steps=job_spec.checkpoint_every_steps,
        checkpoint_s=job_spec.checkpoint_s,
    )


def _backend(
    settings: SimSettings,
    index: int,
    workload: simulated.StepWorkload,
    job: step_job.StepJob,
    gpu_model: simulated.SimulatedGpuModel,
    started_ns: int,
    clock: Callable[[], int],
) -> simulated.SimulatedBackend:
    """Node index's simulated GPUs, with the scenario's faults for that node."""
    node_id = _node_id(index)
    script = [nf.fault for nf in settings.scenario.faults if nf.node % settings.nodes == index]
    return simulated.SimulatedBackend(
        node_id,
        settings.gpus_per_node,
        settings.seed,
        workload=workload,
        faults=script,
        epoch_unix_ns=started_ns,
        gpu_model=gpu_model,
        job=job,
        clock=clock,
    )


def _agent(
    settings: SimSettings,
    index: int,
    backend: simulated.SimulatedBackend,
    agent_address: str,
    pki: devcerts.DevPki | None,
    ops: node_ops.SimulatedNodeOps,
) -> runtime.Agent:
    """Node index's agent: its identity, link to the controller and action settings."""
    node_id = _node_id(index)
    files = tls.TlsFiles(pki.ca.cert, pki.nodes[node_id].cert, pki.nodes[node_id].key) if pki else None
    return runtime.Agent(
        agent_settings.AgentSettings(
            node_id=node_id,
            labels=_labels(index, settings.nodes_per_rack),
            link=agent_settings.LinkSettings(controller_address=agent_address),
            tls=agent_settings.TlsSettings(files=files),
            actions=agent_settings.ActionSettings(destructive_enabled=True),
        ),
        backend,
        spool.Spool(":memory:"),
        boot_id=str(uuid.UUID(int=settings.seed * 1_000_003 + index)),
        ops=ops,
    )


def _power_probe(
    settings: SimSettings,
    controller: server.Controller,
    job: step_job.StepJob,
    backends: list[simulated.SimulatedBackend],
    gpu_model: simulated.SimulatedGpuModel,
    started_ns: int,
    clock: Callable[[], int],
) -> power_sim.PowerProbe | None:
    """The power loop's ground-truth probe, for scenarios with a `[power]` table; else None."""
    power = settings.scenario.power
    if power is None:
        return None
    probe = power_sim.PowerProbe(
        job,
        settings.seed,
        [_node_id(i) for i in range(settings.nodes) for _ in range(settings.gpus_per_node)],
        [g.uuid for b in backends for g in b.inventory()],
        gpu_model.power_limit_max_w,
        power,
        started_ns,
        clock,
    )
    probe.loop = controller.power
    probe.workload_stopped = lambda: {gpu for backend in backends for gpu in backend.stopped_gpus()}
    if controller.remediation is not None:
        store = controller.remediation.store
        probe.quarantined = lambda: controller.ingest.store_calls.run_in_store(store.quarantines)
    return probe


def _operator_files(pki: devcerts.DevPki | None, role: str) -> tls.TlsFiles | None:
    """The dev certificate of the operator with role ("viewer", "admin"); None without TLS."""
    if pki is None:
        return None
    return tls.TlsFiles(pki.ca.cert, pki.operators[role].cert, pki.operators[role].key)


async def _play(
    session: _Session, admin: admin_grpc.AdminServiceStub, budget_admin: admin_grpc.AdminServiceStub, out: TextIO
) -> tuple[list[admin_pb.NodeStatus], admin_pb.ListEventsResponse]:
    """Play the scenario for its duration, then print and return the final fleet and the stored events."""
    settings, probe, clock = session.settings, session.probe, session.clock
    await asyncio.gather(
        _operate(
            settings,
            session.controller,
            session.agents,
            session.commands,
            session.operator_marks,
            clock,
            session.started_ns,
        ),
        _show_table(settings, admin, out, clock, session.started_ns),
        asyncio.sleep(settings.duration_s),
        *(
            (probe.sample(settings.duration_s), probe.play_budget_changes(budget_admin, settings.duration_s))
            if probe
            else ()
        ),
    )
    # Let the last telemetry batch and event acks land before measuring.
    await asyncio.sleep(1.5)
    final_nodes = await _every_node(admin, timeout_s=10)
    print(f"\nfleet after {settings.duration_s:g} s:", file=out)
    views.nodes_table(final_nodes, clock(), out)
    events = admin_pb.ListEventsResponse()
    request = admin_pb.ListEventsRequest(limit=1000)
    while True:  # the controller answers a page at a time
        page = await admin.ListEvents(request, timeout=10)
        events.events.extend(page.events)
        if not page.next_page_token:
            return final_nodes, events
        request.page_token = page.next_page_token


async def _every_node(admin: admin_grpc.AdminServiceStub, *, timeout_s: float) -> list[admin_pb.NodeStatus]:
    """Every node, page after page."""
    nodes: list[admin_pb.NodeStatus] = []
    request = admin_pb.ListNodesRequest()
    while True:
        page = await admin.ListNodes(request, timeout=timeout_s)
        nodes.extend(page.nodes)
        if not page.next_page_token:
            return nodes
        request.page_token = page.next_page_token


async def _controller_record(controller: server.Controller, started_ns: int) -> _ControllerRecord:
    """Read the power series, the sample count, the outbox and the tickets from the controller."""
    power_rows = controller.ingest.power_window.series(since_unix_ns=started_ns)
    samples = controller.ingest.samples_ingested
    remediation = controller.remediation
    outbox, tickets, quarantines = [], [], []
    if remediation is not None:
        run_in_store = controller.ingest.store_calls.run_in_store
        outbox = [dataclasses.asdict(c) for c in await run_in_store(remediation.store.commands)]
        tickets = await run_in_store(lambda: remediation.store.tickets(limit=10_000))
        quarantines = await run_in_store(remediation.store.quarantines)
    stragglers = [
        {"node_id": named.node_id, "gpu_uuid": gpu_uuid, "named_unix_ns": named.named_unix_ns,
         "steps": named.verdict.steps, "mean_lag_s": named.verdict.mean_lag_s, "reason": named.verdict.reason}
        for gpu_uuid, named in controller.ingest.stragglers.suspects.items()
    ]  # fmt: skip
    watch = controller.ingest.stragglers
    stalls = [
        {"named_unix_ns": named_ns, "node_id": node_id, "gpu_uuid": verdict.suspect_gpu,
         "silent_nodes": list(verdict.silent_nodes), "reason": verdict.reason}
        for named_ns, node_id, verdict in watch.stalls
    ]  # fmt: skip
    return _ControllerRecord(power_rows, samples, outbox, tickets, quarantines, stragglers, watch.steps_judged, stalls)


def _result(
    session: _Session,
    final_nodes: list[admin_pb.NodeStatus],
    events: admin_pb.ListEventsResponse,
    record: _ControllerRecord,
    finished_ns: int,
) -> SimResult:
    """What was measured, from the controller's, the agents' and the simulated GPUs' records."""
    settings, controller, agents = session.settings, session.controller, session.agents
    remediation = controller.remediation
    usage = resource.getrusage(resource.RUSAGE_SELF)
    writer = resource.getrusage(resource.RUSAGE_CHILDREN)  # the controller's commit writer, reaped at stop
    return SimResult(
        settings=settings,
        started_unix_ns=session.started_ns,
        finished_unix_ns=finished_ns,
        controller_address=controller.address,
        metrics_port=controller.metrics_port,
        injected=[
            InjectedFault(_node_id(index), fired)
            for index, backend in enumerate(session.backends)
            for fired in backend.fired
            if fired.fired_unix_ns < finished_ns
        ],
        commands=session.commands,
        final_nodes=final_nodes,
        samples_ingested=record.samples_ingested,
        stored_events=[
            {
                "node_id": e.node_id,
                "gpu_uuid": e.event.gpu_uuid,
                "kind": int(e.event.kind),
                "xid": e.event.xid if e.event.HasField("xid") else None,
                "observed_unix_ns": e.event.observed_unix_ns,
                "received_unix_ns": e.received_unix_ns,
            }
            for e in events.events
        ],
        agent_events_spooled=sum(a.stats.events_spooled for a in agents),
        agent_events_unacked=sum(a.spool.depth() for a in agents),
        power_rows=record.power_rows,
        operator_marks_unix_ns=session.operator_marks,
        cpu_s=usage.ru_utime + usage.ru_stime + writer.ru_utime + writer.ru_stime,
        peak_rss_mib=usage.ru_maxrss / 1024,
        fleet_power=fleet.summarize_power(
            record.power_rows, min_gpus=int(0.95 * settings.nodes * settings.gpus_per_node)
        ),
        outbox=record.outbox,
        tickets=record.tickets,
        decision_latency_s=list(remediation.stats.decision_latency_s) if remediation else [],
        max_disrupted_nodes=remediation.stats.max_disrupted_nodes if remediation else 0,
        disruption_budget=_budget_nodes(settings),
        agent_streams=controller.security.streams_total,
        agent_streams_mtls=controller.security.streams_mtls,
        power_trace=session.probe.trace(finished_ns) if session.probe else None,
        quarantines=record.quarantines,
        stragglers=record.stragglers,
        straggler_steps_judged=record.straggler_steps_judged,
        stalls=record.stalls,
    )


def _power_table(settings: SimSettings, gpu_model: simulated.SimulatedGpuModel) -> dict[str, object]:
    """The controller's `[power]` table: the scenario's budgets over the fleet's racks and rows."""
    assert settings.scenario.power is not None
    labels = [_labels(i, settings.nodes_per_rack) for i in range(settings.nodes)]
    nodes = [(_node_id(i), lab["rack"], lab["row"]) for i, lab in enumerate(labels)]
    tree = power_sim.tree_mapping(nodes, settings.gpus_per_node, gpu_model.power_limit_max_w, settings.scenario.power)
    return power_sim.power_table(tree, settings.scenario.power)


def _budget_nodes(settings: SimSettings) -> int:
    """The cluster-wide disruption budget in nodes, as the policy defines it for this fleet size."""
    disruption = settings.scenario.remediation.disruption
    by_pct = int(disruption.max_disrupted_nodes_pct / 100 * settings.nodes)
    return max(1, min(disruption.max_disrupted_nodes, by_pct))


async def _at(started_ns: int, at_s: float, clock: Callable[[], int]) -> None:
    await asyncio.sleep(max(0.0, at_s - (clock() - started_ns) / 1e9))


async def _operate(
    settings: SimSettings,
    controller: server.Controller,
    agents: list[runtime.Agent],
    commands: list[CommandOutcome],
    marks: list[int],
    clock: Callable[[], int],
    started_ns: int,
) -> None:
    for action in settings.scenario.operator:
        if action.at_s >= settings.duration_s:
            continue
        await _at(started_ns, action.at_s, clock)
        if action.action != "set_power_cap":
            if controller.remediation is not None:
                await _by_hand(settings, controller.remediation, agents, action)
            continue
        marks.append(clock())

        reason = f"scenario operator action at {action.at_s:g} s"
        await asyncio.gather(
            *(_cap_node(controller, agent, action.power_limit_w, reason, commands, clock) for agent in agents)
        )
        ok = sum(1 for c in commands if c.read_back_ok)
        log.info("operator_power_cap_applied", power_limit_w=action.power_limit_w, nodes_confirmed=ok)


async def _by_hand(
    settings: SimSettings,
    service: remediation_mod.RemediationService,
    agents: list[runtime.Agent],
    action: scenario_mod.OperatorAction,
) -> None:
    """A scripted action on the ladder: an SDC accusation, a quarantine, release, pause or resume.

    A training job accuses; an operator does the rest as rasctl asks it (actor "operator").
    """
    if action.action in ("pause_automation", "resume_automation"):
        await service.set_paused(action.action == "pause_automation", reason=action.reason, actor="operator")
        log.info("operator_automation", action=action.action)
        return
    agent = agents[action.node % len(agents)]
    node_id = agent.identity.node_id
    gpu_uuid = agent.backend.inventory()[action.gpu % settings.gpus_per_node].uuid if action.gpu is not None else ""
    if action.action == "accuse_sdc":
        await service.accuse(node_id, gpu_uuid, reason=action.reason, accuser="training-job")
        log.info("sdc_accused", node=node_id, gpu_uuid=gpu_uuid)
        return
    if action.action == "quarantine":
        await service.operator_quarantine(node_id, gpu_uuid, reason=action.reason, actor="operator")
        log.info("operator_quarantined", node=node_id, gpu_uuid=gpu_uuid)
        return
    try:
        said = await service.operator_release(
            node_id, gpu_uuid, reason=action.reason, force=action.force, actor="operator"
        )
    except (LookupError, PermissionError) as exc:  # as rasctl would show it; the run goes on
        log.warning("operator_release_refused", node=node_id, gpu_uuid=gpu_uuid, error=str(exc))
        return
    log.info("operator_released", node=node_id, gpu_uuid=gpu_uuid, outcome=said)


async def _cap_node(
    controller: server.Controller,
    agent: runtime.Agent,
    watts: int,
    reason: str,
    commands: list[CommandOutcome],
    clock: Callable[[], int],
) -> None:
    """Cap every GPU of one node through the controller's command path and check the read-back."""
    node_id = agent.identity.node_id
    sent = clock()
    outcome = CommandOutcome(node_id=node_id, requested_w=watts, sent_unix_ns=sent)
    commands.append(outcome)
    command = commands_pb.Command(
        command_id=uuid.uuid4().hex,
        issued_unix_ns=sent,
        deadline_unix_ns=sent + 10 * 1_000_000_000,
        reason=reason,
        set_power_cap=commands_pb.SetPowerCap(
            limits=[commands_pb.GpuPowerLimit(gpu_uuid=g.uuid, power_limit_w=watts) for g in agent.backend.inventory()]
        ),
    )
    try:
        result = await controller.ingest.send_command(node_id, command, timeout_s=10.0)
    except (LookupError, TimeoutError, ConnectionError) as exc:
        outcome.outcome = f"ERROR: {exc}"
        return
    outcome.outcome = commands_pb.ActionOutcome.Name(result.outcome)
    outcome.latency_s = (clock() - sent) / 1e9
    outcome.read_back_ok = len(result.enforced_limits) == len(command.set_power_cap.limits) and all(
        limit.power_limit_w == watts for limit in result.enforced_limits
    )


async def _show_table(
    settings: SimSettings, admin: admin_grpc.AdminServiceStub, out: TextIO, clock: Callable[[], int], started_ns: int
) -> None:
    if settings.table_interval_s <= 0:
        return
    at_s = min(settings.table_interval_s, 3.0)
    while at_s < settings.duration_s:
        await _at(started_ns, at_s, clock)
        try:
            nodes = await _every_node(admin, timeout_s=5)
        except grpc.aio.AioRpcError as exc:
            print(f"[t={at_s:5.1f}s] ListNodes failed: {exc.code().name}", file=out, flush=True)
        else:
            print(f"\n[t={at_s:5.1f}s]", file=out)
            views.nodes_table(nodes, clock(), out)
            out.flush()
        at_s += settings.table_interval_s
