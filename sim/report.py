"""Turns a simulation's measurements into report.json and report.md.

Every number is derived from what the controller stored and the agents did, compared with the
scenario's ground truth. Capabilities that are not built yet are absent rather than faked; the
Markdown report says which.
"""

from __future__ import annotations

import datetime
import json
import math
import pathlib
from collections.abc import Mapping, Sequence
from typing import Any

from rasd.agent.gpu import simulated
from rasd.common import VERSION
from rasd.controller.core import fleet
from rasd.sim import power_sim
from rasd.sim.fleet import InjectedFault, SimResult


def percentile(values: Sequence[float], pct: float) -> float | None:
    """Nearest-rank percentile; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(pct / 100 * len(ordered)))
    return ordered[rank - 1]


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000


def _round(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)


def match_faults(
    injected: Sequence[InjectedFault], stored_events: Sequence[dict[str, Any]]
) -> list[tuple[InjectedFault, dict[str, Any] | None]]:
    """Pair each injected fault with the earliest stored event that reports it, each event used once.

    An event reports a fault when it comes from the same node, has the kind the fault must produce,
    names the same GPU (node-level faults name none), and was observed no earlier than the fault.
    """
    unused = sorted(stored_events, key=lambda e: int(e["observed_unix_ns"]))
    pairs: list[tuple[InjectedFault, dict[str, Any] | None]] = []
    for fault in sorted(injected, key=lambda f: f.fired.fired_unix_ns):
        expected = fault.fired.fault.expected_event_kind
        match = None
        if expected is not None:
            for event in unused:
                if (
                    event["node_id"] == fault.node_id
                    and int(event["kind"]) == int(expected)
                    and (not fault.fired.gpu_uuid or event["gpu_uuid"] == fault.fired.gpu_uuid)
                    and int(event["observed_unix_ns"]) >= fault.fired.fired_unix_ns
                ):
                    match = event
                    break
            if match is not None:
                unused.remove(match)
        pairs.append((fault, match))
    return pairs


# What NVIDIA's catalog and the ladder must do first for each scripted fault (None: no expectation).
EXPECTED_FIRST_ACTION: dict[str, frozenset[str] | None] = {
    "xid:13": frozenset({"restart_process"}),
    "xid:31": frozenset({"restart_process"}),
    "xid:48": frozenset({"reset_gpu"}),
    "xid:79": frozenset({"reboot_node"}),
    "xid:94": frozenset({"restart_process"}),
    "xid:95": frozenset({"reset_gpu"}),
    "ecc_dbe": frozenset({"reset_gpu"}),
    "row_remap_pending": frozenset({"reset_gpu"}),
    "row_remap_failure": frozenset({"open_rma"}),
    "fallen_off_bus": frozenset({"reboot_node"}),
    "gpu_lost": frozenset({"reboot_node"}),
    "nvlink_crc_storm": frozenset({"reset_gpu"}),
    "ib_link_flap": frozenset({"quarantine_node", "quarantine_port"}),
    "recovery_action": frozenset({"reboot_node"}),
    # Silent until accused: the accusation suite must fail it and open an RMA.
    "sdc": frozenset({"open_rma"}),
}
REPAIR_KINDS = frozenset({"restart_process", "reset_gpu", "reboot_node", "power_cycle_bmc", "open_rma"})
"""Rungs of the ladder: the first of these after a fault is the action judged (holding a node or GPU
out of service before repairing it is part of the repair, not a choice of rung)."""
ISOLATION_KINDS = frozenset({"quarantine_node", "quarantine_port"})
RESOLVED_TICKET_STATES = frozenset({"watching", "draining", "rma_pending", "awaiting_operator"})
PATH_KINDS = frozenset({"restart_process", "reset_gpu", "reboot_node", "power_cycle_bmc", "run_validation", "open_rma"})
"""The commands a ladder's path lists: its rungs, validations and RMA (`ladder_path`)."""


def ladder_path(outbox: Sequence[dict[str, Any]], node_id: str) -> list[str]:
    """The ladder's path on a node: its repair commands in the order decided, as "kind:outcome".

    The outcome is the command's final outbox status ("succeeded", "refused", "timed_out", ...,
    "pending" while the budget holds it), or a validation's verdict ("pass", "fail").
    """
    commands = sorted(
        (c for c in outbox if c["node_id"] == node_id and c["kind"] in PATH_KINDS),
        key=lambda c: (int(c["created_unix_ns"]), int((c.get("payload") or {}).get("step", 0))),
    )
    path = []
    for command in commands:
        verdict = (command.get("result") or {}).get("validation_verdict") or ""
        status = verdict if command["kind"] == "run_validation" and verdict else str(command["status"])
        path.append(f"{command['kind']}:{status}")
    return path


def expectations(result: SimResult) -> dict[str, Any] | None:
    """The scenario's `[expect]` against what the run shows on that node; None without one.

    ``met`` is true when the ladder's path (`ladder_path`), the states of the node's open tickets
    and what stays quarantined there ("node", "gpu:<index>") are each what the scenario says.
    """
    expect = result.settings.scenario.expect
    if expect is None:
        return None
    settings = result.settings
    node_id = f"node-{expect.node % settings.nodes:03d}"
    index_of = {simulated.simulated_gpu_uuid(settings.seed, node_id, i): i for i in range(settings.gpus_per_node)}
    shown = {
        "path": ladder_path(result.outbox, node_id),
        "tickets": sorted(str(t["state"]) for t in result.tickets if t["node_id"] == node_id and not t["closed"]),
        "quarantined": sorted(
            "node"
            if not q["gpu_uuid"] and not q["port"]
            else f"gpu:{index_of.get(str(q['gpu_uuid']), '?')}"
            if q["gpu_uuid"]
            else f"port:{q['port']}"
            for q in result.quarantines
            if q["node_id"] == node_id
        ),
    }
    wanted = {"path": expect.path, "tickets": expect.tickets, "quarantined": expect.quarantined}
    unmet = {key: {"expected": list(value), "shown": shown[key]} for key, value in wanted.items()
             if value is not None and list(value) != shown[key]}  # fmt: skip
    return {"node_id": node_id, "met": not unmet, "unmet": unmet, **shown}


def _fault_key(fault: InjectedFault) -> str:
    scripted = fault.fired.fault
    return f"xid:{scripted.xid}" if scripted.kind == "xid" else scripted.kind


def commands_after(fault: InjectedFault, outbox: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Outbox commands decided for the fault's target after it fired, oldest first.

    A GPU fault's commands name its GPU, or the node (node-level actions such as a reboot or a node
    quarantine cover every GPU of it).
    """
    gpu = fault.fired.gpu_uuid
    return [
        c
        for c in outbox
        if c["node_id"] == fault.node_id
        and int(c["created_unix_ns"]) >= fault.fired.fired_unix_ns
        and (not gpu or c["gpu_uuid"] in (gpu, "") or c["kind"] in ("reboot_node", "quarantine_node"))
    ]


def validation_detection(fault: InjectedFault, outbox: Sequence[dict[str, Any]]) -> int | None:
    """When a validation run first failed the fault's GPU (Unix ns), or None: how silent faults are found."""
    times = [
        int(c["finished_unix_ns"])
        for c in commands_after(fault, outbox)
        if c["kind"] == "run_validation"
        and c.get("finished_unix_ns")
        and fault.fired.gpu_uuid in ((c.get("result") or {}).get("failed_gpu_uuids") or ())
    ]
    return min(times, default=None)


def judge_remediation(result: SimResult) -> dict[str, Any]:
    """Compare what the controller did for each injected fault with what it should have done."""
    per_fault = []
    for fault in sorted(result.injected, key=lambda f: f.fired.fired_unix_ns):
        if fault.fired.fault.expected_event_kind is None and _fault_key(fault) not in EXPECTED_FIRST_ACTION:
            continue
        gpu = fault.fired.gpu_uuid
        expected = EXPECTED_FIRST_ACTION.get(_fault_key(fault))
        judged_kinds = REPAIR_KINDS | (ISOLATION_KINDS if expected and expected & ISOLATION_KINDS else frozenset())
        after = [c for c in commands_after(fault, result.outbox) if c["kind"] in judged_kinds]
        first = after[0] if after else None
        tickets = [
            t
            for t in result.tickets
            if t["node_id"] == fault.node_id and (t["gpu_uuid"] == gpu or not t["gpu_uuid"])
            and int(t["updated_unix_ns"]) >= fault.fired.fired_unix_ns
        ]  # fmt: skip
        per_fault.append(
            {
                "fault": _fault_key(fault),
                "node_id": fault.node_id,
                "gpu_uuid": gpu,
                "first_action": first["kind"] if first else None,
                "expected": sorted(expected) if expected else None,
                "wrong": bool(first and expected and first["kind"] not in expected),
                "time_to_first_action_s": (
                    round((int(first["created_unix_ns"]) - fault.fired.fired_unix_ns) / 1e9, 3) if first else None
                ),
                "ticket_states": sorted({str(t["state"]) for t in tickets}),
                "remediated": any(str(t["state"]) in RESOLVED_TICKET_STATES for t in tickets),
            }
        )
    return {"per_fault": per_fault}


def build(result: SimResult) -> dict[str, Any]:
    """The report as a JSON-ready dict."""
    settings = result.settings
    gpus = settings.nodes * settings.gpus_per_node
    wall_s = (result.finished_unix_ns - result.started_unix_ns) / 1e9
    faults, detect_latencies, events_lost = _faults_section(result)
    final = result.final_nodes
    return {
        "rasd_version": VERSION,
        "generated_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "scenario": settings.scenario.name,
        "seed": settings.seed,
        # True only when the controller counted every agent stream of the run as mutually authenticated.
        "tls": result.agent_streams > 0 and result.agent_streams_mtls == result.agent_streams,
        "agent_streams": {"opened": result.agent_streams, "mutual_tls": result.agent_streams_mtls},
        "run": {
            "nodes": settings.nodes,
            "gpus_per_node": settings.gpus_per_node,
            "gpus": gpus,
            "duration_s": settings.duration_s,
            "wall_s": round(wall_s, 2),
        },
        "fleet": {
            "nodes_seen": len(final),
            "nodes_connected": sum(1 for n in final if n.connected),
            "gpus_seen": sum(len(n.gpus) for n in final),
            "gpus_with_power": sum(1 for n in final for g in n.gpus if g.HasField("power_w") and g.power_w > 0),
            "power_draw_w": round(sum(n.power_draw_w for n in final), 1),
            "power_cap_w": sum(n.power_cap_w for n in final),
        },
        "faults": faults,
        "remediation": _remediation_section(result, detect_latencies),
        "events_lost": events_lost,
        "agent_events_spooled": result.agent_events_spooled,
        "agent_events_unacked_at_end": result.agent_events_unacked,
        "controller": {
            "telemetry_samples": result.samples_ingested,
            "samples_per_s": round(result.samples_ingested / wall_s, 1) if wall_s > 0 else 0.0,
            "cpu_s": round(result.cpu_s, 2),
            "cpu_s_note": "whole rasd-sim process: the controller and every in-process agent",
            "peak_rss_mib": round(result.peak_rss_mib, 1),
            "address": result.controller_address,
            "metrics_port": result.metrics_port,
        },
        "commands": _commands_section(result),
        "power": _power_section(result),
        "stragglers": _stragglers_section(result),
        **({"expectations": checked} if (checked := expectations(result)) is not None else {}),
    }


def _stragglers_section(result: SimResult) -> dict[str, Any]:
    """Stragglers injected against those the controller named (issue #40), with each named one's verdict.

    Injected: the fault kinds in `simulated.STRAGGLER_FAULTS` (a slow node: each of its GPUs).

    Steps to localise: the named verdict's steps (its score climbed over them, from the first step the
    slowed GPU lagged); time to localise: from the fault to its naming, which adds the steps the
    controller waits for every node's edges.
    """
    injected = {
        (f.node_id, f.fired.gpu_uuid): f for f in result.injected if f.fired.fault.kind in simulated.STRAGGLER_FAULTS
    }
    named = {(str(s["node_id"]), str(s["gpu_uuid"])): s for s in result.stragglers}
    localised = [(injected[key], named[key]) for key in injected if key in named]
    steps = [float(n["steps"]) for _, n in localised]  # type: ignore[arg-type]
    seconds = [(int(n["named_unix_ns"]) - f.fired.fired_unix_ns) / 1e9 for f, n in localised]  # type: ignore[call-overload]
    return {
        "injected": len(injected),
        "localised": len(localised),
        "false_positives": sorted(f"{node}/{gpu}" for node, gpu in named if (node, gpu) not in injected),
        "steps_to_localise_max": max(steps, default=None),
        "time_to_localise_s_max": _round(max(seconds, default=None)),
        "steps_judged": result.straggler_steps_judged,
        "named": [
            {
                "gpu": f"{f.node_id}/{f.fired.gpu_uuid}",
                "kind": f.fired.fault.kind,
                "steps": n["steps"],
                "reason": n["reason"],
            }
            for f, n in localised
        ],
        "step_time": [_step_time_around_action(result, f, n) for f, n in localised],
        "job_hangs": _job_hangs(result),
    }


def _job_hangs(result: SimResult) -> dict[str, Any]:
    """Hung jobs injected (`job_hang`) against the stalls the controller named: each hang's first stall after it.

    A stall named with no hang before it (since the previous stall) is a false one.
    """
    hangs = sorted(f.fired.fired_unix_ns for f in result.injected if f.fired.fault.kind in simulated.JOB_FAULTS)
    named = sorted(int(s["named_unix_ns"]) for s in result.stalls)  # type: ignore[call-overload]
    seconds: list[float] = []
    false = 0
    pending = list(hangs)
    for at_ns in named:
        before = [h for h in pending if h <= at_ns]
        if not before:
            false += 1
            continue
        seconds.append((at_ns - before[0]) / 1e9)
        pending = [h for h in pending if h > at_ns]
    return {
        "injected": len(hangs),
        "named": len(seconds),
        "time_to_name_s_max": _round(max(seconds, default=None)),
        "stalls_with_no_hang": false,
        "stalls": result.stalls,
    }


ACTION_SETTLE_S = 2.0
"""Steps that start within this after the action are in neither window (the eviction lands at the next sample)."""


def _step_time_around_action(result: SimResult, fault: InjectedFault, named: Mapping[str, Any]) -> dict[str, Any]:
    """The job's step time against its clean twin's, from the fault to the first action and after the last.

    The first action is the naming (its notice); the last, the quarantine that is still held at the end
    (the scheduler replaced the GPU: it left both twins). Steps are the probe's (scenarios with `[power]`).
    """
    gpu = fault.fired.gpu_uuid
    held = [int(q["since_unix_ns"]) for q in result.quarantines if q.get("gpu_uuid") == gpu]
    row: dict[str, Any] = {"gpu": f"{fault.node_id}/{gpu}", "action": "quarantine_gpu" if held else None}
    trace = result.power_trace
    if trace is None:
        return {**row, "note": "no [power] table: no clean twin stepped beside the job"}
    base_ns = result.started_unix_ns
    windows = {"before": ((fault.fired.fired_unix_ns - base_ns) / 1e9, (int(named["named_unix_ns"]) - base_ns) / 1e9)}
    if held:
        windows["after"] = ((max(held) - base_ns) / 1e9 + ACTION_SETTLE_S, math.inf)
    for name, (since_s, until_s) in windows.items():
        job = [d for start, d, _ in trace.managed_steps_s if since_s <= start and start + d <= until_s]
        clean = [d for start, d, _ in trace.unmanaged_steps_s if since_s <= start and start + d <= until_s]
        if job and clean:
            mean_job, mean_clean = sum(job) / len(job), sum(clean) / len(clean)
            row[f"step_s_{name}"] = _round(mean_job, 4)
            row[f"clean_step_s_{name}"] = _round(mean_clean, 4)
            row[f"step_time_cost_pct_{name}"] = _round(100.0 * (mean_job / mean_clean - 1.0), 3) or 0.0  # not -0.0
            row[f"steps_{name}"] = len(job)
    return row


def _faults_section(result: SimResult) -> tuple[dict[str, Any], list[float], int]:
    """The report's "faults" section, every detected fault's time to detect (s), and the events lost.

    A fault with an expected event is detected by its stored event; a silent one (SDC) shows no
    event and is detected when a validation run fails its GPU.
    """
    matches = match_faults(result.injected, result.stored_events)
    detect_latencies = [
        (int(event["received_unix_ns"]) - fault.fired.fired_unix_ns) / 1e9
        for fault, event in matches
        if event is not None
    ]
    detectable = [(f, e) for f, e in matches if f.fired.fault.expected_event_kind is not None]
    missed = sum(1 for _, event in detectable if event is None)
    by_kind: dict[str, dict[str, int]] = {}
    for fault, event in detectable:
        entry = by_kind.setdefault(fault.fired.fault.kind, {"injected": 0, "detected": 0})
        entry["injected"] += 1
        entry["detected"] += event is not None
    silent = [
        f
        for f, _ in matches
        if f.fired.fault.expected_event_kind is None
        and f.fired.fault.kind not in simulated.STRAGGLER_FAULTS | simulated.JOB_FAULTS
    ]
    silent_found = {id(f): found for f in silent if (found := validation_detection(f, result.outbox)) is not None}
    detect_latencies += [(found - f.fired.fired_unix_ns) / 1e9 for f in silent if (found := silent_found.get(id(f)))]
    for fault in silent:
        entry = by_kind.setdefault(fault.fired.fault.kind, {"injected": 0, "detected": 0})
        entry["injected"] += 1
        entry["detected"] += id(fault) in silent_found
    faults = {
        "injected": len(detectable) + len(silent),
        "detected": len(detectable) - missed + len(silent_found),
        "missed": missed + len(silent) - len(silent_found),
        "by_kind": by_kind,
        "silent_injected": len(silent),
        "silent_detected_by_validation": len(silent_found),
        "time_to_detect_s_p50": _round(percentile(detect_latencies, 50)),
        "time_to_detect_s_p99": _round(percentile(detect_latencies, 99)),
    }
    return faults, detect_latencies, missed


def _remediation_section(result: SimResult, detect_latencies: list[float]) -> dict[str, Any]:
    """The report's "remediation" section: what the controller did for each fault, and how fast."""
    judged = judge_remediation(result)
    first_action_delays = [
        f["time_to_first_action_s"] for f in judged["per_fault"] if f["time_to_first_action_s"] is not None
    ]
    outbox_kinds: dict[str, int] = {}
    for command in result.outbox:
        outbox_kinds[str(command["kind"])] = outbox_kinds.get(str(command["kind"]), 0) + 1
    return {
        "remediated": sum(1 for f in judged["per_fault"] if f["remediated"]),
        "wrong_actions": sum(1 for f in judged["per_fault"] if f["wrong"]),
        "time_to_detect_s_p50": _round(percentile(detect_latencies, 50)),
        "time_to_detect_s_p99": _round(percentile(detect_latencies, 99)),
        "time_to_first_action_s_p99": _round(percentile(first_action_delays, 99)),
        "decision_latency_ms_p50": _round(_ms(percentile(result.decision_latency_s, 50)), 2),
        "decision_latency_ms_p99": _round(_ms(percentile(result.decision_latency_s, 99)), 2),
        "decisions_measured": len(result.decision_latency_s),
        "max_concurrent_disruptions": result.max_disrupted_nodes,
        "disruption_budget": result.disruption_budget,
        "actions_by_kind": dict(sorted(outbox_kinds.items())),
        "per_fault": judged["per_fault"],
    }


def _commands_section(result: SimResult) -> dict[str, Any]:
    """The report's "commands" section: the scripted operator's power caps."""
    command_latencies = [c.latency_s for c in result.commands if c.latency_s is not None]
    return {
        "sent": len(result.commands),
        "succeeded": sum(1 for c in result.commands if c.outcome == "ACTION_OUTCOME_SUCCEEDED"),
        "read_back_confirmed": sum(1 for c in result.commands if c.read_back_ok),
        "latency_s_p50": _round(percentile(command_latencies, 50)),
        "latency_s_p99": _round(percentile(command_latencies, 99)),
    }


def _power_section(result: SimResult) -> dict[str, Any]:
    """The report's "power" section: the fleet's draw, around the operator's cap, and managed power."""
    settings = result.settings
    min_gpus = int(0.95 * settings.nodes * settings.gpus_per_node)
    power: dict[str, Any] = {
        "fleet_power_w_mean": _round(result.fleet_power.get("mean_w"), 1),
        "fleet_power_w_min": _round(result.fleet_power.get("min_w"), 1),
        "fleet_power_w_max": _round(result.fleet_power.get("max_w"), 1),
        "swing_p2p_w_observed": _round(result.fleet_power.get("p2p_w"), 1),
        "complete_buckets": result.fleet_power.get("buckets", 0),
        "bucket_ms": 100,
    }
    if result.operator_marks_unix_ns:
        mark = result.operator_marks_unix_ns[0]
        before = fleet.summarize_power([r for r in result.power_rows if r[0] < mark], min_gpus=min_gpus)
        # Skip the first 2 s after the change: caps land within one command round trip.
        after = fleet.summarize_power([r for r in result.power_rows if r[0] >= mark + 2_000_000_000], min_gpus=min_gpus)
        power["before_operator_cap"] = {k: _round(v, 1) for k, v in before.items()}
        power["after_operator_cap"] = {k: _round(v, 1) for k, v in after.items()}
    if result.power_trace is not None and settings.scenario.power is not None:
        power.update(power_sim.report_section(result.power_trace, settings.scenario.power.policy))
    return power


def markdown(report: dict[str, Any]) -> str:
    """A short human summary of the report."""
    run, fleet_, faults, ctl, cmds, power = (
        report["run"],
        report["fleet"],
        report["faults"],
        report["controller"],
        report["commands"],
        report["power"],
    )
    lines = [
        f"# rasd-sim report: scenario `{report['scenario']}` (seed {report['seed']})",
        "",
        f"{run['nodes']} nodes × {run['gpus_per_node']} GPUs for {run['duration_s']:g} s (wall {run['wall_s']} s).",
        "",
        "| what | value |",
        "|---|---|",
        f"| nodes / GPUs seen by the controller | {fleet_['nodes_seen']} / {fleet_['gpus_seen']} |",
        f"| GPUs with non-zero power at the end | {fleet_['gpus_with_power']} |",
        f"| fleet draw / cap at the end | {fleet_['power_draw_w'] / 1000:.1f} kW / "
        f"{fleet_['power_cap_w'] / 1000:.1f} kW |",
        f"| faults injected / detected / missed | {faults['injected']} / {faults['detected']} / {faults['missed']} |",
        f"| of them silent (SDC), found by validation | {faults['silent_detected_by_validation']} of "
        f"{faults['silent_injected']} |",
        f"| time to detect p50 / p99 | {faults['time_to_detect_s_p50']} s / {faults['time_to_detect_s_p99']} s |",
        f"| events lost | {report['events_lost']} |",
        f"| agent streams over mutual TLS | {report['agent_streams']['mutual_tls']} of "
        f"{report['agent_streams']['opened']} (tls: {str(report['tls']).lower()}) |",
        f"| faults remediated / wrong actions | {report['remediation']['remediated']} / "
        f"{report['remediation']['wrong_actions']} |",
        f"| decision latency p50 / p99 | {report['remediation']['decision_latency_ms_p50']} ms / "
        f"{report['remediation']['decision_latency_ms_p99']} ms |",
        f"| max concurrent disruptions / budget | {report['remediation']['max_concurrent_disruptions']} / "
        f"{report['remediation']['disruption_budget']} nodes |",
        f"| telemetry samples ingested | {ctl['telemetry_samples']} ({ctl['samples_per_s']}/s) |",
        f"| CPU (sim process and the controller's commit writer) / peak RSS | {ctl['cpu_s']} s / "
        f"{ctl['peak_rss_mib']} MiB |",
        f"| operator cap commands sent / succeeded / read-back confirmed | {cmds['sent']} / {cmds['succeeded']} / "
        f"{cmds['read_back_confirmed']} |",
        (
            f"| operator cap command round trip p50 / p99 | {cmds['latency_s_p50']} s / {cmds['latency_s_p99']} s |"
            if cmds["sent"]
            else "| operator cap command round trip p50 / p99 | – (the scenario sends none) |"
        ),
        f"| fleet power mean / peak-to-peak swing | {power['fleet_power_w_mean']} W / "
        f"{power['swing_p2p_w_observed']} W |",
    ]
    lines.append(_stragglers_row(report["stragglers"]))
    if "before_operator_cap" in power:
        lines.append(
            f"| mean fleet power before / after the operator cap | {power['before_operator_cap'].get('mean_w')} W / "
            f"{power['after_operator_cap'].get('mean_w')} W |"
        )
    lines += power_sim.markdown_rows(power)
    checked = report.get("expectations")
    if checked is not None:
        path = " → ".join(checked["path"]) or "(none)"
        lines.append(f"| ladder path on {checked['node_id']} | {path} |")
        lines.append(
            f"| scenario expectations | {'met' if checked['met'] else 'NOT met: ' + json.dumps(checked['unmet'])} |"
        )
    lines += [
        "",
        "",
    ]
    return "\n".join(lines)


def _stragglers_row(found: dict[str, Any]) -> str:
    """The report's stragglers line: injected / localised / steps and time to localise / false positives."""
    fps = found["false_positives"]
    line = (
        f"| stragglers injected / localised / steps (time) to localise, max / false positives | {found['injected']} / "
        f"{found['localised']} / {found['steps_to_localise_max'] or '-'} ({found['time_to_localise_s_max'] or '-'} s)"
        f" / {len(fps)}{' (' + ', '.join(fps) + ')' if fps else ''} |"
    )
    costs = "".join(
        f"\n| straggler {row['gpu']}: step-time cost vs clean twin before / after {row['action'] or 'no action'} | "
        f"{row.get('step_time_cost_pct_before', '-')} % / {row.get('step_time_cost_pct_after', '-')} % |"
        for row in found.get("step_time", [])
    )
    return line + costs + _job_hangs_row(found.get("job_hangs", {}))


def _job_hangs_row(hangs: dict[str, Any]) -> str:
    """The hung-job line, where a hang was injected or a stall named (no line otherwise)."""
    if not hangs.get("injected") and not hangs.get("stalls"):
        return ""
    return (
        f"\n| job hangs injected / stalls named / time to name, max / stalls with no hang | {hangs['injected']} / "
        f"{hangs['named']} / {hangs['time_to_name_s_max'] or '-'} s / {hangs['stalls_with_no_hang']} |"
    )


def write(report: dict[str, Any], json_path: pathlib.Path, md_path: pathlib.Path) -> None:
    """Write report.json and report.md."""
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(report, indent=2) + "\n")
    md_path.write_text(markdown(report))
