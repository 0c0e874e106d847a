"""An agent stream's messages: inbound telemetry as domain values; outbound Welcome, acks, commands, full-rate asks.

The ingest queues what it sends a node as `ControllerMessage`s built here; the stream's writer
(`rpc.agent_service`) writes them as they are. Inbound telemetry is checked (`agent.check_telemetry`)
and converted here once.
"""

from __future__ import annotations

from rasd.api.v1 import agent_service_pb2 as agent_pb
from rasd.api.v1 import commands_pb2 as commands_pb
from rasd.api.v1 import health_pb2 as health_pb
from rasd.controller.core import agent_messages as msgs
from rasd.controller.wire import agent as wire_agent

ControllerMessage = agent_pb.ControllerMessage
"""What goes on a node's stream (a session's outbound queue holds these)."""


def telemetry_from_wire(batch: health_pb.TelemetryBatch, known_gpus: frozenset[str]) -> msgs.Telemetry:
    """Validate a telemetry batch against the node's GPUs and convert it.

    Raises:
        wire_agent.WireError: a field is malformed, or names a GPU the node did not announce.
    """
    wire_agent.check_telemetry(batch, known_gpus)
    counters = batch.counters
    return msgs.Telemetry(
        power=tuple(
            msgs.PowerSeries(s.gpu_uuid, s.first_sample_unix_ns, s.sample_interval_ms, s.power_w) for s in batch.power
        ),
        latest=wire_agent.latest_from_telemetry(batch),
        newest_counters_unix_ns=max(c.sample_unix_ns for c in counters) if counters else None,
    )


def summary_from_wire(
    summary: health_pb.TelemetrySummary, node_id: str, known_gpus: frozenset[str], *, checked: bool = False
) -> msgs.TelemetrySummary:
    """Validate a telemetry summary against the node's GPUs and convert it.

    checked: the caller ran `wire.agent.check_summary` on it already (the stream's edge does, when
    the message arrives; this runs later, on the ingest's telemetry turn, for 2,048 summaries a
    second on one core).

    Raises:
        wire_agent.WireError: a field names a GPU the node did not announce.
    """
    if not checked:
        wire_agent.check_summary(summary, known_gpus)
    node = summary.node_power if summary.HasField("node_power") else None
    # Peaks, stamps, edges and samples in one pass over the GPUs (`latest_from_summary` makes the
    # other): 2,048 summaries a second on one core at 2,048 nodes.
    peaks: list[msgs.GpuPeak] = []
    stamps: list[int] = [c.sample_unix_ns for c in summary.counters]
    edges: dict[str, tuple[int, ...]] = {}
    samples = 0
    for gpu in summary.gpus:
        if gpu.samples:
            samples += gpu.samples
            peaks.append(msgs.GpuPeak(gpu.gpu_uuid, gpu.last_sample_unix_ns, gpu.max_w))
        if gpu.counters_sample_unix_ns:
            stamps.append(gpu.counters_sample_unix_ns)
        if gpu.falling_edge_unix_ns:
            edges[gpu.gpu_uuid] = tuple(gpu.falling_edge_unix_ns)
    return msgs.TelemetrySummary(
        latest=wire_agent.latest_from_summary(summary),
        peaks=tuple(peaks),
        node_power=(
            msgs.NodePower(node_id, node.first_sample_unix_ns, node.sample_interval_ms, node.power_w, node.gpus)
            if node is not None and node.power_w
            else None
        ),
        full_rate=tuple(
            msgs.PowerSeries(s.gpu_uuid, s.first_sample_unix_ns, s.sample_interval_ms, s.power_w)
            for s in summary.full_rate
        ),
        samples=samples,
        newest_counters_unix_ns=max(stamps) if stamps else None,
        edges=edges,
    )


def welcome_message(welcome: msgs.Welcome) -> agent_pb.ControllerMessage:
    """The Welcome answering a Hello, with the stream's telemetry format."""
    config = agent_pb.AgentConfig(**welcome.agent_config)
    config.telemetry_format = (
        health_pb.TELEMETRY_FORMAT_SUMMARY if welcome.summaries else health_pb.TELEMETRY_FORMAT_RAW
    )
    return agent_pb.ControllerMessage(
        welcome=agent_pb.Welcome(
            controller_version=welcome.controller_version,
            acked_seq=welcome.acked_seq,
            session_id=welcome.session_id,
            config=config,
        )
    )


def full_rate_message(gpu_uuids: frozenset[str]) -> agent_pb.ControllerMessage:
    """Ask a node for the full power series of these of its GPUs (none: stop)."""
    return agent_pb.ControllerMessage(full_rate=agent_pb.FullRateRequest(gpu_uuids=sorted(gpu_uuids)))


def ack_message(acked_seq: int) -> agent_pb.ControllerMessage:
    """A cumulative ack of the node's events up to acked_seq."""
    return agent_pb.ControllerMessage(ack=agent_pb.EventAck(acked_seq=acked_seq))


def command_message(command: commands_pb.Command) -> agent_pb.ControllerMessage:
    """A command on its way to the node."""
    return agent_pb.ControllerMessage(command=command)


def event_kind_name(kind: int) -> str:
    """rasd.api.v1.EventKind's name of an event kind ("EVENT_KIND_XID"), for logs."""
    return health_pb.EventKind.Name(kind)
