"""The demo's pictures: fleet power over time, and each fault's timeline from injection to repair.

Needs the optional extra `rasd[plots]` (matplotlib); without it rasd-sim writes the reports and
says the pictures were skipped. Drawn with the non-interactive Agg backend, straight to PNG.
"""

from __future__ import annotations

import pathlib
from typing import Any

from rasd.sim import report as report_mod
from rasd.sim.fleet import SimResult

ACTION_COLOURS = {
    "restart_process": "tab:green",
    "reset_gpu": "tab:orange",
    "reboot_node": "tab:red",
    "power_cycle_bmc": "darkred",
    "open_rma": "black",
    "quarantine_gpu": "tab:purple",
    "quarantine_node": "tab:purple",
    "quarantine_port": "tab:purple",
    "run_validation": "tab:blue",
    "release": "tab:cyan",
    "notify": "tab:gray",
}


def available() -> bool:
    """Whether matplotlib is installed."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def power_png(result: SimResult, path: pathlib.Path) -> None:
    """Fleet power over time: managed against unmanaged with the budget, or the telemetry and the cap.

    With a power loop the picture is `managed_power_png`; without one, fleet telemetry (complete 100 ms
    buckets) with the fleet cap and the operator's cap change.
    """
    if result.power_trace is not None:
        managed_power_png(result, path)
        return
    plt = _pyplot()
    gpus = result.settings.nodes * result.settings.gpus_per_node
    rows = [(t, w) for t, w, n in result.power_rows if n >= 0.95 * gpus]
    fig, ax = plt.subplots(figsize=(11, 4.2), dpi=110)
    if rows:
        t0 = result.started_unix_ns
        ax.plot([(t - t0) / 1e9 for t, _ in rows], [w / 1000 for _, w in rows], lw=0.9, label="fleet draw (unmanaged)")
    cap_kw = gpus * 700 / 1000
    ax.axhline(cap_kw, color="tab:red", ls="--", lw=1, label=f"fleet cap at start ({cap_kw:.1f} kW)")
    for mark in result.operator_marks_unix_ns:
        ax.axvline((mark - result.started_unix_ns) / 1e9, color="tab:gray", ls=":", lw=1)
        ax.text((mark - result.started_unix_ns) / 1e9, cap_kw * 0.96, " operator cap change", fontsize=8, va="top")
    ax.set_xlabel("time since start (s)")
    ax.set_ylabel("power (kW)")
    ax.set_title(
        f"{result.settings.nodes} nodes × {result.settings.gpus_per_node} GPUs, step-synchronous training: "
        "the swing the power manager (issue #5) will damp"
    )
    ax.set_ylim(bottom=0)
    ax.legend(loc="lower right", fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def incidents_png(result: SimResult, report: dict[str, Any], path: pathlib.Path) -> None:
    """One row per fault, on a log time axis from its injection: detected → each action → released / RMA."""
    plt = _pyplot()
    per_fault = report["remediation"]["per_fault"]
    injected = sorted(result.injected, key=lambda f: f.fired.fired_unix_ns)
    rows = [
        f for f in injected if any(p["node_id"] == f.node_id and p["gpu_uuid"] == f.fired.gpu_uuid for p in per_fault)
    ]
    fig, ax = plt.subplots(figsize=(11, 0.6 * max(3, len(rows)) + 1.4), dpi=110)
    labels = []
    used_legend: set[str] = set()

    def mark(x_s: float, y: int, kind: str, colour: str, shape: str = "o") -> None:
        ax.plot([max(x_s, 1e-3)], [y], marker=shape, ms=7, color=colour, label=None if kind in used_legend else kind)
        used_legend.add(kind)

    detections = {id(f): e for f, e in report_mod.match_faults(result.injected, result.stored_events) if e}
    for y, fault in enumerate(rows):
        fired = fault.fired.fired_unix_ns
        gpu = fault.fired.gpu_uuid
        at_s = fault.fired.fault.at_s
        labels.append(f"{fault.fired.fault.kind} at {at_s:g} s  {fault.node_id} {gpu[:12] or '(node)'}")
        end_s = 1e-3
        event = detections.get(id(fault))
        if event is not None:
            detected_s = (int(event["received_unix_ns"]) - fired) / 1e9
            mark(detected_s, y, "detected", "tab:red", "x")
            end_s = max(end_s, detected_s)
        for command in report_mod.commands_after(fault, result.outbox):
            done_s = (int(command["finished_unix_ns"] or command["created_unix_ns"]) - fired) / 1e9
            end_s = max(end_s, done_s)
            kind = str(command["kind"])
            mark(done_s, y, kind, ACTION_COLOURS.get(kind, "tab:olive"))
        ax.hlines(y, 1e-3, max(end_s, 1e-3), color="lightgray", lw=2, zorder=0)
    ax.set_xscale("log")
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels(labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("seconds after the fault (log scale): detected, then each action as it finished")
    ax.set_title("every injected fault: detection, repair rung, validation, release or RMA")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7)
    ax.grid(axis="x", alpha=0.3, which="both")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def managed_power_png(result: SimResult, path: pathlib.Path) -> None:
    """Aggregate draw of the simulated GPUs, unmanaged twin against managed, with the cluster budget."""
    plt = _pyplot()
    trace = result.power_trace
    assert trace is not None
    fig, ax = plt.subplots(figsize=(11, 4.6), dpi=110)
    ax.plot(trace.t_s, trace.unmanaged_w / 1000, lw=0.8, color="tab:gray", alpha=0.8, label="unmanaged (same seed)")
    ax.plot(trace.t_s, trace.managed_w / 1000, lw=1.0, color="tab:blue", label="managed (what the GPUs drew)")
    ax.step(trace.t_s, trace.cluster_budget_w / 1000, where="post", color="tab:red", ls="--", lw=1.2,
            label="cluster budget")  # fmt: skip
    if trace.smoothing_from_s is not None:
        ax.axvline(trace.smoothing_from_s, color="tab:green", ls=":", lw=1)
        ax.text(trace.smoothing_from_s, ax.get_ylim()[1] * 0.02, f" smoothing {trace.smoothing_mode}", fontsize=8)
    for cut in trace.cuts:
        ax.axvline(cut.at_s, color="tab:red", ls=":", lw=1)
        ax.text(cut.at_s, ax.get_ylim()[1] * 0.1, f" {cut.domain} budget {cut.budget_w / 1000:.1f} kW", fontsize=8)
    gpus = result.settings.nodes * result.settings.gpus_per_node
    ax.set_xlabel("time since start (s)")
    ax.set_ylabel("aggregate power (kW)")
    ax.set_title(f"{result.settings.nodes} nodes x {result.settings.gpus_per_node} GPUs ({gpus}): power loop on "
                 "against the same job with power management off")  # fmt: skip
    ax.set_ylim(bottom=0)
    ax.legend(loc="lower right", fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
