"""V0 health gate: RMA flags, pending row remaps, and new ECC or XID events since the last run.

It launches no GPU work. Its inputs are values: on a node the agent passes them in (``--health-json``
or a ``HealthProvider`` callable); standalone there is no source and V0 is ``skipped`` with that
reason, never a silent pass.

Decision table (sdc-anchors §2.2 and §5, V0 row), per GPU, first match wins:

================================================  ===========  ===================================
input                                             verdict      why
================================================  ===========  ===================================
row_remap_failure or sram_threshold_exceeded      fail         NVIDIA RMA criterion
new XID in RMA_XIDS (95 uncontained ECC,           fail         RMA path
64 remap failure)
row_remap_pending                                 fail         reset the GPU, then retest
new XID in MEMORY_XIDS (48, 94, 63, 160, 171,     fail         memory fault since last run
172) or new_uncorrectable_ecc > 0
any other new XID                                 suspect      something happened; retest
new_correctable_ecc > spec.max_new_correctable    suspect      HBM degrading (post-repair: > 0)
all fields None                                   skipped      nothing known
otherwise                                         pass
================================================  ===========  ===================================

Raw output: ``{"source": str, "gpus": [{"gpu": int, "snapshot": {field: value} | None}],
"duration_s": float}``.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping
from typing import Any

from rasd.validation.context import HealthSnapshot, RunContext
from rasd.validation.model import CheckResult, Evidence, GpuResult, Verdict, combine

CHECK = "V0"
TITLE = "health gate"

RMA_XIDS = frozenset({64, 95})
MEMORY_XIDS = frozenset({48, 63, 94, 160, 171, 172})


@dataclasses.dataclass(frozen=True)
class Spec:
    """V0 thresholds.

    Attributes:
        max_new_correctable: correctable ECC errors since the last run tolerated before ``suspect``;
            None never flags them (rolling sweeps), 0 flags any (post-repair).
    """

    max_new_correctable: int | None = None


def run(spec: Spec, ctx: RunContext) -> dict[str, Any]:
    """Collect each GPU's health snapshot from the context's provider; no GPU work."""
    started = time.monotonic()
    gpus = []
    for device in ctx.devices:
        snapshot = ctx.health(device.gpu) if ctx.health is not None else None
        gpus.append({"gpu": device.gpu, "snapshot": dataclasses.asdict(snapshot) if snapshot else None})
    return {
        "source": "provided" if ctx.health is not None else "none",
        "gpus": gpus,
        "duration_s": time.monotonic() - started,
    }


def _judge_gpu(gpu: int, snap: HealthSnapshot, spec: Spec) -> GpuResult:
    unknown = [f.name for f in dataclasses.fields(snap) if getattr(snap, f.name) is None]
    if len(unknown) == len(dataclasses.fields(snap)):
        return GpuResult(gpu, Verdict.SKIPPED, "no health value known for this GPU")
    xids = tuple(snap.new_xids or ())

    def ev(field: str, got: object, expected: str, note: str) -> Evidence:
        return Evidence(case="telemetry", location=field, expected=expected, got=str(got), note=note)

    if snap.row_remap_failure or snap.sram_threshold_exceeded:
        field = "row_remap_failure" if snap.row_remap_failure else "sram_threshold_exceeded"
        return GpuResult(gpu, Verdict.FAIL, f"RMA flag {field} is set", (ev(field, True, "False", "RMA"),))
    rma = sorted(set(xids) & RMA_XIDS)
    if rma:
        return GpuResult(gpu, Verdict.FAIL, f"new XID {rma} (RMA path)", (ev("new_xids", rma, "[]", "RMA"),))
    if snap.row_remap_pending:
        return GpuResult(
            gpu,
            Verdict.FAIL,
            "row remap pending: reset the GPU, then retest",
            (ev("row_remap_pending", True, "False", "reset"),),
        )
    memory = sorted(set(xids) & MEMORY_XIDS)
    if memory or (snap.new_uncorrectable_ecc or 0) > 0:
        got = memory or snap.new_uncorrectable_ecc
        field = "new_xids" if memory else "new_uncorrectable_ecc"
        return GpuResult(gpu, Verdict.FAIL, f"memory error since last run ({field}={got})", (ev(field, got, "0", ""),))
    if xids:
        return GpuResult(
            gpu,
            Verdict.SUSPECT,
            f"new XID {sorted(set(xids))} since last run",
            (ev("new_xids", sorted(set(xids)), "[]", ""),),
        )
    limit = spec.max_new_correctable
    if limit is not None and (snap.new_correctable_ecc or 0) > limit:
        return GpuResult(
            gpu,
            Verdict.SUSPECT,
            f"{snap.new_correctable_ecc} new correctable ECC errors (> {limit})",
            (ev("new_correctable_ecc", snap.new_correctable_ecc, f"<= {limit}", "HBM degrading?"),),
        )
    note = f" (unknown: {', '.join(unknown)})" if unknown else ""
    return GpuResult(gpu, Verdict.PASS, f"no RMA flag, pending remap or new error{note}")


def judge(raw: Mapping[str, Any], spec: Spec) -> CheckResult:
    """Apply the decision table in the module docstring to each GPU's snapshot. Pure."""
    if raw["source"] == "none":
        return CheckResult(
            CHECK,
            TITLE,
            Verdict.SKIPPED,
            "no telemetry source: standalone run without --health-json (the agent passes it on a node)",
            tuple(GpuResult(g["gpu"], Verdict.SKIPPED, "no telemetry source") for g in raw["gpus"]),
            duration_s=raw["duration_s"],
        )
    per_gpu = []
    for entry in raw["gpus"]:
        snap = entry["snapshot"]
        if snap is None:
            per_gpu.append(GpuResult(entry["gpu"], Verdict.SKIPPED, "the source knows nothing of this GPU"))
        else:
            per_gpu.append(_judge_gpu(entry["gpu"], HealthSnapshot.from_json(snap), spec))
    return combine(CHECK, TITLE, per_gpu, duration_s=raw["duration_s"])
