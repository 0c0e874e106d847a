"""Conversions between rasd.api.v1 messages and the controller's core values, with validation.

Every inbound field is checked here, once: a bad field raises `WireError` naming it, which the RPC
layer answers with INVALID_ARGUMENT. Nothing accepted before a bad message is dropped, because
each message is validated and applied on its own.
"""

from __future__ import annotations

import json
import math
import re

from rasd.api.v1 import admin_service_pb2 as admin_pb
from rasd.api.v1 import agent_service_pb2 as agent_pb
from rasd.api.v1 import health_pb2 as health_pb
from rasd.common import kernel_log, vocabulary, xid_catalog
from rasd.common.text import echoed
from rasd.controller.core import fleet, stall, straggler
from rasd.controller.store import repo

GPU_UUID_RE = re.compile(r"^(GPU|MIG)-[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$")
NODE_ID_RE = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._-]{0,251}[A-Za-z0-9])?$")
MAX_GPUS_PER_NODE = 64
MAX_LABELS = 64
MAX_TEXT = 4096
MAX_POWER_W = 5000.0
MAX_SAMPLES_PER_SERIES = 6000


class WireError(ValueError):
    """A message field is malformed; `field` names it as a dotted path."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field


def _check_text(field: str, value: str, max_len: int = MAX_TEXT) -> str:
    if len(value) > max_len:
        raise WireError(field, f"longer than {max_len} characters")
    return value


def _check_labels(field: str, labels: dict[str, str] | object) -> dict[str, str]:
    result = dict(labels)  # type: ignore[call-overload]
    if len(result) > MAX_LABELS:
        raise WireError(field, f"more than {MAX_LABELS} labels")
    for key, value in result.items():
        _check_text(f"{field}[{echoed(key, 40)}]", key, 253)
        _check_text(f"{field}[{echoed(key, 40)}]", value, 253)
    return result


def hello_from_wire(message: agent_pb.Hello) -> fleet.NodeHello:
    """Validate and convert a Hello."""
    if not NODE_ID_RE.match(message.node_id):
        raise WireError("hello.node_id", f"{echoed(message.node_id)} is not a valid node id")
    if len(message.gpus) > MAX_GPUS_PER_NODE:
        raise WireError("hello.gpus", f"more than {MAX_GPUS_PER_NODE} GPUs")
    seen: set[str] = set()
    gpus = []
    for index, gpu in enumerate(message.gpus):
        field = f"hello.gpus[{index}]"
        if not GPU_UUID_RE.match(gpu.uuid):
            raise WireError(f"{field}.uuid", f"{echoed(gpu.uuid)} is not a GPU UUID")
        if gpu.uuid in seen:
            raise WireError(f"{field}.uuid", f"{echoed(gpu.uuid)} appears twice")
        seen.add(gpu.uuid)
        if not 0 < gpu.power_limit_min_w <= gpu.power_limit_max_w <= MAX_POWER_W:
            raise WireError(
                f"{field}.power_limit_min_w",
                f"constraints [{gpu.power_limit_min_w}, {gpu.power_limit_max_w}] W are not a sane range",
            )
        gpus.append(
            fleet.GpuRecord(
                uuid=gpu.uuid,
                node_id=message.node_id,
                model=_check_text(f"{field}.model", gpu.model, 96),
                pci_bus_id=_check_text(f"{field}.pci_bus_id", gpu.pci_bus_id, 32),
                power_limit_min_w=gpu.power_limit_min_w,
                power_limit_max_w=gpu.power_limit_max_w,
                power_limit_default_w=gpu.power_limit_default_w or gpu.power_limit_max_w,
                serial=_check_text(f"{field}.serial", gpu.serial, 64),
                vbios_version=_check_text(f"{field}.vbios_version", gpu.vbios_version, 64),
                memory_total_mib=gpu.memory_total_mib,
                power_smoothing_supported=gpu.power_smoothing_supported,
                labels=_check_labels(f"{field}.labels", gpu.labels),
            )
        )
    return fleet.NodeHello(
        node_id=message.node_id,
        boot_id=_check_text("hello.boot_id", message.boot_id, 64),
        agent_version=_check_text("hello.agent_version", message.agent_version, 64),
        hostname=_check_text("hello.hostname", message.hostname, 253),
        backend=_check_text("hello.backend", message.backend, 32),
        labels=_check_labels("hello.labels", message.labels),
        gpus=tuple(gpus),
        spool_head_seq=message.spool_head_seq,
        spool_id=_check_text("hello.spool_id", message.spool_id, 64),
        spool_acked_seq=message.spool_acked_seq,
        summaries_offered=health_pb.TELEMETRY_FORMAT_SUMMARY in message.telemetry_formats,
    )


def _finite(field: str, value: float, lo: float, hi: float) -> float:
    if not math.isfinite(value) or not lo <= value <= hi:
        raise WireError(field, f"{echoed(value)} is not a finite number in [{lo:g}, {hi:g}]")
    return value


def check_telemetry(batch: health_pb.TelemetryBatch, known_gpus: frozenset[str]) -> None:
    """Reject a batch with a malformed field or a GPU the node did not announce in Hello.

    Field names are built only for the error (this runs for every batch of every node).
    """
    for index, series in enumerate(batch.power):
        if series.gpu_uuid not in known_gpus:
            raise WireError(
                f"telemetry.power[{index}].gpu_uuid", f"{echoed(series.gpu_uuid)} is not one of this node's GPUs"
            )
        if not 1 <= series.sample_interval_ms <= 60_000:
            raise WireError(
                f"telemetry.power[{index}].sample_interval_ms", f"{series.sample_interval_ms} is outside 1..60000"
            )
        samples = series.power_w
        if len(samples) > MAX_SAMPLES_PER_SERIES:
            raise WireError(f"telemetry.power[{index}].power_w", f"more than {MAX_SAMPLES_PER_SERIES} samples")
        if not all(0.0 <= watts <= MAX_POWER_W for watts in samples):  # NaN and inf fail too
            for sample_index, watts in enumerate(samples):
                _finite(f"telemetry.power[{index}].power_w[{sample_index}]", watts, 0.0, MAX_POWER_W)
    for index, counters in enumerate(batch.counters):
        if counters.gpu_uuid not in known_gpus:
            raise WireError(
                f"telemetry.counters[{index}].gpu_uuid", f"{echoed(counters.gpu_uuid)} is not one of this node's GPUs"
            )
        if counters.HasField("temperature_c") and not -50 <= counters.temperature_c <= 200:
            raise WireError(
                f"telemetry.counters[{index}].temperature_c", f"{counters.temperature_c} is outside -50..200"
            )
        if counters.HasField("enforced_power_limit_w") and counters.enforced_power_limit_w > MAX_POWER_W:
            raise WireError(
                f"telemetry.counters[{index}].enforced_power_limit_w",
                f"{counters.enforced_power_limit_w} W is not sane",
            )


def check_summary(summary: health_pb.TelemetrySummary, known_gpus: frozenset[str]) -> None:
    """Reject a summary that names a GPU the node did not announce in Hello (the edge checked the rest)."""
    for name, entries in (("gpus", summary.gpus), ("full_rate", summary.full_rate), ("counters", summary.counters)):
        for index, entry in enumerate(entries):
            if entry.gpu_uuid not in known_gpus:
                raise WireError(
                    f"summary.{name}[{index}].gpu_uuid", f"{echoed(entry.gpu_uuid)} is not one of this node's GPUs"
                )


def latest_from_summary(summary: health_pb.TelemetrySummary) -> dict[str, fleet.GpuLatest]:
    """The freshest values per GPU in a (validated) summary, for `fleet.merge_summary`.

    Each GPU's summary gives its last sample and the power loop's counters as of its newest counters
    sample; the counters a summary brings whole (they changed) add temperature and smoothing state.
    """
    whole: dict[str, health_pb.GpuCounters] = {}
    for counters in summary.counters:
        seen = whole.get(counters.gpu_uuid)
        if seen is None or counters.sample_unix_ns >= seen.sample_unix_ns:
            whole[counters.gpu_uuid] = counters
    latest: dict[str, fleet.GpuLatest] = {}
    row = fleet.latest_row
    for gpu in summary.gpus:
        has = gpu.HasField
        c = whole.pop(gpu.gpu_uuid, None) if whole else None
        sampled = gpu.samples > 0
        # A reading per GPU per second at 2,048 nodes, merged at once: built from its values in
        # `fleet.LATEST_FIELDS` order (`fleet.latest_row`), a third of the keyword constructor's cost.
        latest[gpu.gpu_uuid] = row(
            (
                float(gpu.last_w) if sampled else None,  # power_w
                gpu.last_sample_unix_ns if sampled else 0,  # power_sample_unix_ns
                gpu.enforced_power_limit_w if has("enforced_power_limit_w") else None,
                c.temperature_c if c is not None and c.HasField("temperature_c") else None,
                gpu.utilization_gpu_pct if has("utilization_gpu_pct") else None,
                gpu.clock_event_reasons if has("clock_event_reasons") else None,
                gpu.counters_sample_unix_ns,  # counters_unix_ns
                c.power_smoothing_enabled if c is not None and c.HasField("power_smoothing_enabled") else None,
                gpu.power_limit_slew_target_w if has("power_limit_slew_target_w") else None,
                _pcie_link(c) if c is not None else None,
            )
        )
    for gpu_uuid, c in whole.items():  # counters of a GPU without a summary this interval
        latest[gpu_uuid] = _latest_from_counters(c, None, 0)
    return latest


def latest_from_telemetry(batch: health_pb.TelemetryBatch) -> dict[str, fleet.GpuLatest]:
    """The freshest values per GPU in a (validated) batch: one `GpuLatest` per GPU.

    The newest power series end and the newest counters sample of each GPU win (what
    `fleet.merge_latest` would keep), gathered first so that only one value object is built per
    GPU: this runs for every batch of every node.
    """
    power: dict[str, tuple[float, int]] = {}
    for series in batch.power:
        samples = series.power_w
        if not samples:
            continue
        last_ns = series.first_sample_unix_ns + (len(samples) - 1) * series.sample_interval_ms * 1_000_000
        seen = power.get(series.gpu_uuid)
        if seen is None or last_ns >= seen[1]:
            power[series.gpu_uuid] = (float(samples[-1]), last_ns)
    newest: dict[str, health_pb.GpuCounters] = {}
    for counters in batch.counters:
        seen_counters = newest.get(counters.gpu_uuid)
        if seen_counters is None or counters.sample_unix_ns >= seen_counters.sample_unix_ns:
            newest[counters.gpu_uuid] = counters
    latest: dict[str, fleet.GpuLatest] = {}
    for gpu_uuid in power.keys() | newest.keys():
        watts, power_ns = power.get(gpu_uuid, (None, 0))
        c = newest.get(gpu_uuid)
        if c is None:
            latest[gpu_uuid] = fleet.GpuLatest(power_w=watts, power_sample_unix_ns=power_ns)
            continue
        latest[gpu_uuid] = _latest_from_counters(c, watts, power_ns)
    return latest


def _latest_from_counters(c: health_pb.GpuCounters, watts: float | None, power_ns: int) -> fleet.GpuLatest:
    return fleet.GpuLatest(
        power_w=watts,
        power_sample_unix_ns=power_ns,
        enforced_power_limit_w=c.enforced_power_limit_w if c.HasField("enforced_power_limit_w") else None,
        temperature_c=c.temperature_c if c.HasField("temperature_c") else None,
        utilization_gpu_pct=c.utilization_gpu_pct if c.HasField("utilization_gpu_pct") else None,
        clock_event_reasons=c.clock_event_reasons if c.HasField("clock_event_reasons") else None,
        counters_unix_ns=c.sample_unix_ns,
        power_smoothing_enabled=c.power_smoothing_enabled if c.HasField("power_smoothing_enabled") else None,
        power_limit_slew_target_w=c.power_limit_slew_target_w if c.HasField("power_limit_slew_target_w") else None,
        pcie_link=_pcie_link(c),
    )


_PCIE_FIELDS = ("pcie_link_width", "pcie_link_width_max", "pcie_link_gen", "pcie_link_gen_max")


def _pcie_link(c: health_pb.GpuCounters) -> fleet.PcieLink | None:
    """The counters' PCIe link, when all four of its values are there (one alone says nothing)."""
    if not all(c.HasField(name) for name in _PCIE_FIELDS):
        return None
    return fleet.PcieLink(c.pcie_link_width, c.pcie_link_width_max, c.pcie_link_gen, c.pcie_link_gen_max)


def events_from_wire(
    batch: agent_pb.HealthEventBatch,
    known_gpus: frozenset[str],
    received_unix_ns: int,
    node_id: str,
    *,
    spool_epoch: int | None = None,
) -> list[repo.StoredEvent]:
    """Validate and convert a batch of health events; spool_epoch: the epoch of its stream's Hello."""
    events = []
    kinds = set(health_pb.EventKind.values())
    severities = set(health_pb.Severity.values())
    for index, event in enumerate(batch.events):
        field = f"events.events[{index}]"
        if event.seq == 0:
            raise WireError(f"{field}.seq", "must be > 0")
        if event.kind not in kinds or event.kind == health_pb.EVENT_KIND_UNSPECIFIED:
            raise WireError(f"{field}.kind", f"{event.kind} is not a known EventKind")
        if event.severity not in severities:
            raise WireError(f"{field}.severity", f"{event.severity} is not a known Severity")
        if event.gpu_uuid and event.gpu_uuid not in known_gpus:
            raise WireError(f"{field}.gpu_uuid", f"{echoed(event.gpu_uuid)} is not one of this node's GPUs")
        if event.HasField("xid") and not 0 < event.xid < 100_000:
            raise WireError(f"{field}.xid", f"{event.xid} is not a plausible Xid")
        xid = event.xid if event.HasField("xid") else None
        message = _check_text(f"{field}.message", event.message)
        attributes = _check_labels(f"{field}.attributes", event.attributes)
        if event.HasField("kernel_log"):
            facts = kernel_log_from_wire(event, f"{field}.kernel_log", xid=xid, message=message)
            if facts is not None:
                # The event store keeps a text map: the facts go in it in the one text form
                # (`rasd.common.kernel_log`) that the classifier reads back, winning over free attributes.
                attributes = {**attributes, **kernel_log.to_attributes(facts)}
        events.append(
            repo.StoredEvent(
                node_id=node_id,
                seq=event.seq,
                observed_unix_ns=event.observed_unix_ns,
                received_unix_ns=received_unix_ns,
                kind=event.kind,
                severity=event.severity,
                gpu_uuid=event.gpu_uuid,
                xid=xid,
                message=message,
                source=_check_text(f"{field}.source", event.source, 32),
                attributes=attributes,
                spool_epoch=spool_epoch,
            )
        )
    return events


MAX_REGISTERS = 16
"""NVLink registers one kernel event may carry (the driver prints 6 or 7)."""
MAX_FACT_CHARS = 253
"""Longest text fact of a kernel event but ``raw`` (which may be as long as a message); as an attribute value."""


def kernel_log_from_wire(
    event: health_pb.HealthEvent, field: str, *, xid: int | None, message: str
) -> kernel_log.KernelEvent | None:
    """The kernel-log facts of an event, validated; None when its kind is not one the kernel log reports.

    Args:
        event: the wire event, with ``kernel_log`` set.
        field: the facts' dotted path, for errors.
        xid: the event's Xid.
        message: the event's (checked) message.

    Returns:
        The facts, or None for an event kind no kernel-log line reports (the facts are then ignored).

    Raises:
        WireError: a text field is too long, or there are too many registers.
    """
    kind = kernel_log.kernel_kind(vocabulary.EventKind(event.kind))
    if kind is None:
        return None
    facts = event.kernel_log
    if len(facts.nvlink_registers) > MAX_REGISTERS:
        raise WireError(f"{field}.nvlink_registers", f"more than {MAX_REGISTERS} registers")

    def optional(name: str) -> int | None:
        return getattr(facts, name) if facts.HasField(name) else None

    def recovery_action(name: str) -> xid_catalog.RecoveryAction | None:
        value = optional(name)
        try:
            return None if value is None else xid_catalog.RecoveryAction(value)
        except ValueError:
            return None  # a value newer than this controller knows: not one it can act on

    return kernel_log.KernelEvent(
        kind=kind,
        message=message,
        raw=_check_text(f"{field}.raw", facts.raw),
        xid=xid,
        pci=_check_text(f"{field}.pci_bus_id", facts.pci_bus_id, MAX_FACT_CHARS) or None,
        pid=optional("pid"),
        process=_check_text(f"{field}.process_name", facts.process_name, MAX_FACT_CHARS) or None,
        gpu_uuid=event.gpu_uuid,
        kernel_time_us=optional("kernel_time_us"),
        gpu_instance=optional("gpu_instance"),
        compute_instance=optional("compute_instance"),
        nvlink=optional("nvlink"),
        registers=tuple(facts.nvlink_registers),
        nvlink_subcode=_check_text(f"{field}.nvlink_subcode", facts.nvlink_subcode, MAX_FACT_CHARS),
        nvlink_fatal=facts.nvlink_fatal if facts.HasField("nvlink_fatal") else None,
        recovery_action=recovery_action("recovery_action"),
        previous_recovery_action=recovery_action("previous_recovery_action"),
        sxid=optional("sxid"),
        sxid_fatal=facts.sxid_fatal if facts.HasField("sxid_fatal") else None,
        nvswitch=_check_text(f"{field}.nvswitch", facts.nvswitch, MAX_FACT_CHARS),
        ib_device=_check_text(f"{field}.ib_device", facts.ib_device, MAX_FACT_CHARS),
        ib_port=optional("ib_port"),
        ib_state=_check_text(f"{field}.ib_state", facts.ib_state, MAX_FACT_CHARS),
    )


# -- admin responses ----------------------------------------------------------------------------------
def node_status_to_wire(node: fleet.NodeStatus) -> admin_pb.NodeStatus:
    """NodeStatus for rasctl."""
    message = admin_pb.NodeStatus(
        node_id=node.node_id,
        state=int(node.state),
        connected=node.connected,
        last_seen_unix_ns=node.last_seen_unix_ns,
        boot_id=node.boot_id,
        agent_version=node.agent_version,
        backend=node.backend,
        hostname=node.hostname,
        labels=dict(node.labels),
        power_draw_w=node.power_draw_w,
        power_cap_w=node.power_cap_w,
    )
    for gpu in node.gpus:
        wire_gpu = message.gpus.add(
            uuid=gpu.record.uuid,
            model=gpu.record.model,
            state=int(gpu.state),
            power_limit_min_w=gpu.record.power_limit_min_w,
            power_limit_max_w=gpu.record.power_limit_max_w,
            last_sample_unix_ns=max(gpu.latest.power_sample_unix_ns, gpu.latest.counters_unix_ns),
            pci_bus_id=gpu.record.pci_bus_id,
        )
        if gpu.latest.power_w is not None:
            wire_gpu.power_w = gpu.latest.power_w
        if gpu.latest.enforced_power_limit_w is not None:
            wire_gpu.power_limit_w = gpu.latest.enforced_power_limit_w
        if gpu.latest.temperature_c is not None:
            wire_gpu.temperature_c = gpu.latest.temperature_c
        if gpu.latest.utilization_gpu_pct is not None:
            wire_gpu.utilization_gpu_pct = gpu.latest.utilization_gpu_pct
    return message


def stored_event_to_wire(event: repo.StoredEvent) -> admin_pb.StoredEvent:
    """A stored event for rasctl."""
    health_event = health_pb.HealthEvent(
        seq=event.seq,
        observed_unix_ns=event.observed_unix_ns,
        kind=event.kind,
        gpu_uuid=event.gpu_uuid,
        severity=event.severity,
        message=event.message,
        source=event.source,
        attributes=dict(event.attributes),
    )
    if event.xid is not None:
        health_event.xid = event.xid
    return admin_pb.StoredEvent(node_id=event.node_id, event=health_event, received_unix_ns=event.received_unix_ns)


# -- remediation views --------------------------------------------------------------------------------
def _target(node_id: str, gpu_uuid: str) -> admin_pb.Target:
    return admin_pb.Target(node_id=node_id, gpu_uuid=gpu_uuid or "")


def incident_to_wire(row: dict) -> admin_pb.Incident:
    """An incident row for rasctl."""
    data = row.get("data") or {}
    return admin_pb.Incident(
        incident_id=row["incident_id"],
        target=_target(row["node_id"], row["gpu_uuid"]),
        cause=row["cause"],
        severity=int(row["severity"]),
        opened_unix_ns=int(row["opened_unix_ns"]),
        closed_unix_ns=int(row["closed_unix_ns"] or 0),
        state=f"{row['state']} ({data.get('event_count', 1)} events)",
    )


def repair_to_wire(row: dict) -> admin_pb.Repair:
    """A repair ticket row for rasctl; its history lines become steps."""
    return admin_pb.Repair(
        ticket_id=row["ticket_id"],
        target=_target(row["node_id"], row["gpu_uuid"]),
        incident_id=row["incident_id"],
        state=row["state"],
        rung=row["rung"],
        reason=row["reason"],
        steps=[admin_pb.RepairStep(reason=str(line)) for line in row.get("steps") or []],
        opened_unix_ns=int(row["opened_unix_ns"]),
        updated_unix_ns=int(row["updated_unix_ns"]),
    )


def quarantine_to_wire(row: dict) -> admin_pb.QuarantineRecord:
    """An active quarantine row."""
    return admin_pb.QuarantineRecord(
        target=_target(row["node_id"], row["gpu_uuid"]),
        port=row["port"],
        reason=row["reason"],
        source=row["source"],
        since_unix_ns=int(row["since_unix_ns"]),
    )


def straggler_to_wire(
    node_id: str, verdict: straggler.Verdict, named_unix_ns: int, *, action: str = "", action_reason: str = ""
) -> admin_pb.StragglerRecord:
    """A GPU named a straggler (`rasd.controller.stragglers.Suspect`), with its actions' rung and last reason."""
    return admin_pb.StragglerRecord(
        target=_target(node_id, verdict.gpu_uuid),
        score=verdict.score,
        mean_lag_s=verdict.mean_lag_s,
        steps=verdict.steps,
        reason=verdict.reason,
        named_unix_ns=named_unix_ns,
        action=action,
        action_reason=action_reason,
    )


def job_stall_to_wire(node_id: str, verdict: stall.StallVerdict, named_unix_ns: int) -> admin_pb.JobStall:
    """A hung job's stall (`rasd.controller.stragglers.StragglerWatch.stall`); node_id: its suspect's node."""
    return admin_pb.JobStall(
        named_unix_ns=named_unix_ns,
        silent_s=verdict.silent_s,
        period_s=verdict.period_s,
        busy_gpus=verdict.busy_gpus,
        gpus=verdict.gpus,
        suspect=_target(node_id, verdict.suspect_gpu),
        silent_nodes=list(verdict.silent_nodes),
        reason=verdict.reason,
    )


def validation_to_wire(row: dict) -> admin_pb.Validation:
    """A validation run."""
    return admin_pb.Validation(
        validation_id=row["validation_id"],
        target=_target(row["node_id"], row["gpu_uuid"]),
        suite=row["suite"],
        verdict=row["verdict"],
        started_unix_ns=int(row["started_unix_ns"] or 0),
        finished_unix_ns=int(row["finished_unix_ns"] or 0),
        evidence_json=json.dumps(row.get("evidence") or {}, sort_keys=True),
    )


def sdc_gpu_to_wire(row: dict) -> admin_pb.SdcGpu:
    """A GPU's SDC record (a ``sdc_service`` ledger row)."""
    return admin_pb.SdcGpu(
        target=_target(row["node_id"], row["gpu_uuid"]),
        suspicion=float(row["suspicion"]),
        accusations=int(row["accusations"]),
        runs=int(row["runs"]),
        fails=int(row["fails"]),
        suspects=int(row["suspects"]),
        passes=int(row["passes"]),
        last_verdict=row["last_verdict"],
        last_unix_ns=int((row["last_at"] or 0) * 1e9),
        watch_until_unix_ns=int((row["watch_until"] or 0) * 1e9),
    )


def rma_to_wire(row: dict) -> admin_pb.RmaTicket:
    """An RMA ticket with its evidence bundle."""
    return admin_pb.RmaTicket(
        rma_id=row["rma_id"],
        target=_target(row["node_id"], row["gpu_uuid"]),
        state=row["state"],
        reason=row["reason"],
        evidence_json=json.dumps(row.get("evidence") or {}, sort_keys=True),
        opened_unix_ns=int(row["opened_unix_ns"]),
    )


def audit_to_wire(row: dict) -> admin_pb.AuditRecord:
    """An audit record (the peer and the refusals left out before it come from its details)."""
    details = row.get("details") or {}
    return admin_pb.AuditRecord(
        at_unix_ns=int(row["at_unix_ns"]),
        actor=row["actor"],
        action=row["action"],
        target=_target(row["node_id"], row["gpu_uuid"]),
        reason=row["reason"],
        outcome=row["outcome"],
        peer=str(details.get("peer", ""))[:128],
        dropped_before=min(int(details.get("dropped_before", 0) or 0), 2**32 - 1),
    )
