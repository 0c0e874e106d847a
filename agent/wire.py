"""Conversions between the agent's core model and rasd.api.v1 messages.

The only agent module besides the link that touches protobuf: the core never sees wire types.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from rasd.agent.core import model
from rasd.agent.core import summary as core_summary
from rasd.api.v1 import agent_service_pb2 as agent_pb
from rasd.api.v1 import commands_pb2 as commands_pb
from rasd.api.v1 import health_pb2 as health_pb
from rasd.common.kernel_log import KernelEvent

# GpuCounters fields copied one to one onto the message (same names on both sides).
_COUNTER_FIELDS = tuple(
    f
    for f in model.GpuCounters.__dataclass_fields__
    if f not in ("gpu_uuid", "sample_unix_ns", "nvlinks", "nvlink_sample_unix_ns")
)


def gpu_info_to_wire(info: model.GpuInfo) -> health_pb.GpuInfo:
    """GpuInfo for the Hello inventory."""
    return health_pb.GpuInfo(
        uuid=info.uuid,
        model=info.model,
        pci_bus_id=info.pci_bus_id,
        serial=info.serial,
        vbios_version=info.vbios_version,
        memory_total_mib=info.memory_total_mib,
        power_limit_min_w=info.power_limit_min_w,
        power_limit_max_w=info.power_limit_max_w,
        power_limit_default_w=info.power_limit_default_w,
        power_smoothing_supported=info.power_smoothing_supported,
        labels=dict(info.labels),
    )


def hello(
    *,
    node_id: str,
    boot_id: str,
    agent_version: str,
    hostname: str,
    backend: str,
    gpus: Sequence[model.GpuInfo],
    labels: Mapping[str, str],
    spool_head_seq: int,
    sent_unix_ns: int = 0,
    spool_id: str = "",
    spool_acked_seq: int = 0,
    summaries: bool = True,
) -> agent_pb.AgentMessage:
    """The first message of every stream; sent_unix_ns is the agent's clock as it sends it.

    summaries: offer TELEMETRY_FORMAT_SUMMARY beside the raw batches every controller takes.
    """
    return agent_pb.AgentMessage(
        hello=agent_pb.Hello(
            node_id=node_id,
            boot_id=boot_id,
            agent_version=agent_version,
            hostname=hostname,
            backend=backend,
            gpus=[gpu_info_to_wire(g) for g in gpus],
            labels=dict(labels),
            spool_head_seq=spool_head_seq,
            sent_unix_ns=sent_unix_ns,
            spool_id=spool_id,
            spool_acked_seq=spool_acked_seq,
            telemetry_formats=TELEMETRY_FORMATS if summaries else (health_pb.TELEMETRY_FORMAT_RAW,),
        )
    )


TELEMETRY_FORMATS = (health_pb.TELEMETRY_FORMAT_RAW, health_pb.TELEMETRY_FORMAT_SUMMARY)
"""What this agent can send; the controller picks one in Welcome."""


def summaries_chosen(config: agent_pb.AgentConfig) -> bool:
    """Whether the Welcome chose telemetry summaries (unset, as from controllers before them: raw batches)."""
    return config.telemetry_format == health_pb.TELEMETRY_FORMAT_SUMMARY


def full_rate_from_wire(request: agent_pb.FullRateRequest, known_gpus: frozenset[str]) -> frozenset[str]:
    """The GPUs whose full series the controller wants, of this node's (any other name is ignored)."""
    return frozenset(request.gpu_uuids) & known_gpus


def power_series(samples: model.PowerSamples, interval_ms: int) -> health_pb.PowerSeries:
    """One GPU's consecutive samples, packed (their spacing taken as interval_ms)."""
    return health_pb.PowerSeries(
        gpu_uuid=samples.gpu_uuid,
        first_sample_unix_ns=samples.times_unix_ns[0],
        sample_interval_ms=interval_ms,
        power_w=samples.watts,
    )


def counters_to_wire(
    counters: model.GpuCounters, message: health_pb.GpuCounters | None = None
) -> health_pb.GpuCounters:
    """GpuCounters (into message, when given); a None (unsupported) counter stays absent on the wire."""
    if message is None:
        message = health_pb.GpuCounters()
    message.gpu_uuid = counters.gpu_uuid
    message.sample_unix_ns = counters.sample_unix_ns
    message.nvlink_sample_unix_ns = counters.nvlink_sample_unix_ns or counters.sample_unix_ns
    for field in _COUNTER_FIELDS:
        value = getattr(counters, field)
        if value is not None:
            setattr(message, field, value)
    for link in counters.nvlinks:
        wire_link = message.nvlinks.add(link=link.link, active=link.active)
        for field in ("crc_errors", "replay_errors", "recovery_errors"):
            value = getattr(link, field)
            if value is not None:
                setattr(wire_link, field, value)
    return message


def telemetry(
    power: Sequence[model.PowerSamples], counters: Sequence[model.GpuCounters], interval_ms: int
) -> agent_pb.AgentMessage:
    """One telemetry batch with every sample (TELEMETRY_FORMAT_RAW): power series per GPU, the latest counters."""
    return agent_pb.AgentMessage(
        telemetry=health_pb.TelemetryBatch(
            power=[power_series(samples, interval_ms) for samples in power if samples.watts],
            counters=[counters_to_wire(c) for c in counters],
        )
    )


# The control values a GpuPowerSummary carries from the newest counters (same names on both sides).
_CONTROL_FIELDS = ("enforced_power_limit_w", "power_limit_slew_target_w", "clock_event_reasons", "utilization_gpu_pct")


def summary(
    power: core_summary.PowerSummary,
    latest_counters: Mapping[str, model.GpuCounters],
    counters: Sequence[model.GpuCounters],
    gpu_order: Sequence[str],
    edges: Mapping[str, Sequence[int]] | None = None,
) -> agent_pb.AgentMessage:
    """One `TelemetrySummary` (TELEMETRY_FORMAT_SUMMARY), built straight into the message that is sent.

    Args:
        power: The interval's power summary (`core.summary.summarize`).
        latest_counters: Each GPU's newest counters: its summary carries their limit, slew target,
            clock event reasons and utilisation, with their sample time.
        counters: The counters to send whole (changed since last sent, or the heartbeat's).
        gpu_order: The node's GPUs in inventory order.
        edges: Per GPU, its compute -> communication edges this interval, Unix ns
            (`core.power_edges.interval_edges`).
    """
    message = agent_pb.AgentMessage()
    out = message.summary
    draws = {d.gpu_uuid: d for d in power.draws}
    for gpu_uuid in gpu_order:
        draw = draws.get(gpu_uuid)
        control = latest_counters.get(gpu_uuid)
        if draw is None and control is None:
            continue
        gpu = out.gpus.add(gpu_uuid=gpu_uuid)
        if draw is not None:
            gpu.samples = draw.samples
            gpu.mean_w, gpu.min_w, gpu.max_w, gpu.last_w = draw.mean_w, draw.min_w, draw.max_w, draw.last_w
            gpu.last_sample_unix_ns = draw.last_sample_unix_ns
            if edges and gpu_uuid in edges:
                gpu.falling_edge_unix_ns.extend(edges[gpu_uuid])
        if control is not None:
            gpu.counters_sample_unix_ns = control.sample_unix_ns
            for field in _CONTROL_FIELDS:
                value = getattr(control, field)
                if value is not None:
                    setattr(gpu, field, value)
    if power.node is not None:
        node = out.node_power
        node.first_sample_unix_ns = power.node.first_sample_unix_ns
        node.sample_interval_ms = power.node.interval_ms
        node.power_w.extend(power.node.power_w)
        node.gpus.extend(power.node.gpus)
    for series in power.full_rate:
        out.full_rate.add(
            gpu_uuid=series.gpu_uuid,
            first_sample_unix_ns=series.first_sample_unix_ns,
            sample_interval_ms=series.interval_ms,
            power_w=series.power_w,
        )
    for c in counters:
        counters_to_wire(c, out.counters.add())
    return message


# The controller refuses longer text (rasd.controller.rpc.validate_input); a refused event would block the
# spool behind it, so the agent cuts to these bounds before sending. A test checks they agree.
MAX_MESSAGE_CHARS = 4096
MAX_SOURCE_CHARS = 32
MAX_ATTRIBUTES = 64
MAX_ATTRIBUTE_CHARS = 253
MAX_EVIDENCE_CHARS = 64 * 1024


def _bounded(text: str, limit: int) -> str:
    # NUL cannot be stored by PostgreSQL and is refused by the controller; kernel lines can carry it.
    return text.replace("\x00", "\ufffd")[:limit]


UNANNOUNCED_GPU_ATTRIBUTE = "kernel_gpu_uuid"
"""Attribute that carries the UUID of a GPU this node does not announce in its Hello.

The controller refuses an event about a GPU its node did not announce, and one refused event blocks
every event spooled behind it, so such an event goes out about the node, naming the GPU here. The name
comes from the kernel log, the first source to need it (`sources.observation_for`)."""


def event_to_wire(event: model.SpooledEvent, known_gpus: frozenset[str] | None = None) -> health_pb.HealthEvent:
    """A spooled event with its sequence number, its text cut to what the controller accepts.

    known_gpus: the GPUs this agent's Hello announced. An event about any other GPU (one that fell off
    the bus before the agent restarted is no longer enumerated) goes out node-level, with the GPU's
    UUID in `UNANNOUNCED_GPU_ATTRIBUTE`. None sends every GPU as spooled.
    """
    obs = event.observation
    gpu_uuid = obs.gpu_uuid
    attributes_in = dict(obs.attributes)
    if gpu_uuid and known_gpus is not None and gpu_uuid not in known_gpus:
        # First, so that the cut to MAX_ATTRIBUTES below never drops it.
        attributes_in = {
            UNANNOUNCED_GPU_ATTRIBUTE: gpu_uuid,
            **{key: value for key, value in attributes_in.items() if key != UNANNOUNCED_GPU_ATTRIBUTE},
        }
        gpu_uuid = ""
    attributes = {
        _bounded(key, MAX_ATTRIBUTE_CHARS): _bounded(value, MAX_ATTRIBUTE_CHARS)
        for key, value in list(attributes_in.items())[:MAX_ATTRIBUTES]
    }
    message = health_pb.HealthEvent(
        seq=event.seq,
        observed_unix_ns=obs.observed_unix_ns,
        kind=int(obs.kind),
        gpu_uuid=gpu_uuid,
        severity=int(obs.severity),
        message=_bounded(obs.message, MAX_MESSAGE_CHARS),
        source=_bounded(obs.source, MAX_SOURCE_CHARS),
        attributes=attributes,
    )
    if obs.xid is not None:
        message.xid = obs.xid
    if obs.kernel_log is not None:
        message.kernel_log.CopyFrom(kernel_log_to_wire(obs.kernel_log))
    return message


_UINT32 = 2**32 - 1
_INT32 = 2**31 - 1
_INT63 = 2**63 - 1
MAX_REGISTERS = 16
"""Registers one kernel event carries on the wire (the driver prints 6 or 7)."""


def kernel_log_to_wire(event: KernelEvent) -> health_pb.KernelLogFacts:
    """The facts of a kernel-log event, each cut or dropped to what the wire type and the controller accept.

    A number the field cannot hold (the parser reads digit runs of up to 20 digits) is left unset, as a
    fact the line did not state: refused by the controller, the event would block the spool behind it.
    """
    facts = health_pb.KernelLogFacts(
        raw=_bounded(event.raw, MAX_MESSAGE_CHARS),
        pci_bus_id=_bounded(event.pci or "", MAX_ATTRIBUTE_CHARS),
        process_name=_bounded(event.process or "", MAX_ATTRIBUTE_CHARS),
        nvlink_subcode=_bounded(event.nvlink_subcode, MAX_ATTRIBUTE_CHARS),
        nvswitch=_bounded(event.nvswitch, MAX_ATTRIBUTE_CHARS),
        ib_device=_bounded(event.ib_device, MAX_ATTRIBUTE_CHARS),
        ib_state=_bounded(event.ib_state, MAX_ATTRIBUTE_CHARS),
    )
    registers = event.registers
    if len(registers) <= MAX_REGISTERS and all(0 <= r <= _UINT32 for r in registers):
        facts.nvlink_registers.extend(registers)  # all or none: a register's meaning is its position
    numbers: tuple[tuple[str, int | None, int, int], ...] = (
        ("pid", event.pid, 0, _INT63),
        ("kernel_time_us", event.kernel_time_us, 0, _INT63),
        ("gpu_instance", event.gpu_instance, 0, _UINT32),
        ("compute_instance", event.compute_instance, 0, _UINT32),
        ("nvlink", event.nvlink, -_INT32 - 1, _INT32),
        ("recovery_action", event.recovery_action, 0, _UINT32),
        ("previous_recovery_action", event.previous_recovery_action, 0, _UINT32),
        ("sxid", event.sxid, 0, _UINT32),
        ("ib_port", event.ib_port, 0, _UINT32),
    )
    for name, value, lo, hi in numbers:
        if value is not None and lo <= value <= hi:
            setattr(facts, name, int(value))
    if event.nvlink_fatal is not None:
        facts.nvlink_fatal = event.nvlink_fatal
    if event.sxid_fatal is not None:
        facts.sxid_fatal = event.sxid_fatal
    return facts


def events(batch: Sequence[model.SpooledEvent], known_gpus: frozenset[str] | None = None) -> agent_pb.AgentMessage:
    """A batch of spooled events in seq order; known_gpus as in `event_to_wire`."""
    return agent_pb.AgentMessage(events=agent_pb.HealthEventBatch(events=[event_to_wire(e, known_gpus) for e in batch]))


def heartbeat(now_unix_ns: int, spool_depth: int) -> agent_pb.AgentMessage:
    """Liveness with the spool depth."""
    return agent_pb.AgentMessage(heartbeat=agent_pb.Heartbeat(sent_unix_ns=now_unix_ns, spool_depth=spool_depth))


def action_result(result: model.ActionResult) -> agent_pb.AgentMessage:
    """A command's result."""
    return agent_pb.AgentMessage(
        action_result=commands_pb.ActionResult(
            command_id=result.command_id,
            outcome=int(result.outcome),
            message=_bounded(result.message, MAX_MESSAGE_CHARS),
            started_unix_ns=result.started_unix_ns,
            finished_unix_ns=result.finished_unix_ns,
            enforced_limits=[
                commands_pb.GpuPowerLimit(
                    gpu_uuid=uuid, power_limit_w=watts, slew_target_w=result.slew_targets_w.get(uuid, 0)
                )
                for uuid, watts in result.enforced_limits_w.items()
            ],
            replayed=result.replayed,
            validation_verdict=result.validation_verdict,
            verdicts=[
                commands_pb.CheckVerdict(
                    check=check, gpu_uuid=gpu, verdict=verdict, evidence=_bounded(evidence, MAX_EVIDENCE_CHARS)
                )
                for check, gpu, verdict, evidence in result.check_verdicts
            ],
        )
    )


class UnknownCommand(ValueError):
    """A command whose action this agent version does not know."""


def command_from_wire(message: commands_pb.Command) -> model.Command:
    """Decode a controller command; raises UnknownCommand for an action newer than this agent."""
    which = message.WhichOneof("action")
    action: model.Action
    if which == "set_power_cap":
        limits = message.set_power_cap.limits
        action = model.SetPowerCap(
            limits_w={limit.gpu_uuid: limit.power_limit_w for limit in limits},
            max_raise_w_per_s={limit.gpu_uuid: limit.max_raise_w_per_s for limit in limits if limit.max_raise_w_per_s},
        )
    elif which == "set_power_smoothing":
        smoothing = message.set_power_smoothing
        action = model.SetPowerSmoothing(
            gpu_uuids=tuple(smoothing.gpu_uuids),
            enabled=smoothing.enabled,
            floor_pct=smoothing.floor_pct,
            ramp_up_w_per_s=smoothing.ramp_up_w_per_s,
            ramp_down_w_per_s=smoothing.ramp_down_w_per_s,
        )
    elif which == "set_trough_filler":
        filler = message.set_trough_filler
        action = model.SetTroughFiller(
            gpu_uuids=tuple(filler.gpu_uuids),
            enabled=filler.enabled,
            floor_w=filler.floor_w,
            ramp_down_w_per_s=filler.ramp_down_w_per_s,
        )
    elif which == "restart_process":
        restart = message.restart_process
        action = model.RestartProcess(
            gpu_uuid=restart.gpu_uuid,
            pids=tuple(restart.pids),
            systemd_unit=restart.systemd_unit,
            grace_s=restart.grace_s or 30.0,
        )
    elif which == "reset_gpu":
        action = model.ResetGpu(gpu_uuid=message.reset_gpu.gpu_uuid)
    elif which == "reboot_node":
        action = model.RebootNode()
    elif which == "run_validation":
        validation = message.run_validation
        action = model.RunValidation(
            suite=validation.suite, gpu_uuids=tuple(validation.gpu_uuids), seed=validation.seed
        )
    else:
        raise UnknownCommand(f"command {message.command_id!r} has no action this agent knows ({which!r})")
    return model.Command(
        command_id=message.command_id,
        issued_unix_ns=message.issued_unix_ns,
        deadline_unix_ns=message.deadline_unix_ns,
        reason=message.reason,
        action=action,
        deadline_agent_unix_ns=message.deadline_agent_unix_ns,
    )
