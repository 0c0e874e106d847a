"""The checks and suites: what each suite runs, in which order, at what size, within what time budget.

``CHECKS`` is an explicit, ordered dict (no import-time self-registration). ``profile(suite, kind)``
returns the per-check specs for a suite on ``cuda`` or ``cpu``. Sizes on CPU are tiny on purpose: there
they prove the code paths (``--suite quick --device cpu`` runs in seconds on a 2-core machine); only
the CUDA profiles test hardware. Order follows sdc-anchors §5.1: the health gate first, the known
answer next, then the hot stress so the bitwise and memory tests that follow run on a warm GPU.

Time budgets (DESIGN §5, issue 6): quick ≤ 5 min, accusation ≤ 10 min, post-repair ≤ 45 min per node.
The CUDA profiles below are sized from the H100 estimates in sdc-anchors §3 (all [M]) to fit with
margin; the runner still enforces the budget and reports ``incomplete: budget`` instead of overrunning.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import Any

from rasd.validation.checks import (
    v0_health,
    v1_known_answer,
    v2_bitwise,
    v3_abft,
    v4_hbm,
    v5_transfer,
    v6_collective,
)
from rasd.validation.context import RunContext
from rasd.validation.model import CheckResult

SUITES = ("quick", "accusation", "post-repair")
BUDGET_S = {"quick": 300.0, "accusation": 600.0, "post-repair": 2700.0}


@dataclasses.dataclass(frozen=True)
class Check:
    """One check: its id, title, the run() adapter and the pure judge()."""

    id: str
    title: str
    run: Callable[[Any, RunContext], dict[str, Any]]
    judge: Callable[[Mapping[str, Any], Any], CheckResult]
    needs_gpu: str  # what a CPU run of this check does and does not prove


def _check(module: ModuleType, needs_gpu: str) -> Check:
    return Check(module.CHECK, module.TITLE, module.run, module.judge, needs_gpu)


CHECKS: dict[str, Check] = {
    "V0": _check(v0_health, "needs the agent's NVML telemetry; standalone it is skipped"),
    "V1": _check(v1_known_answer, "GPU for hardware meaning; on CPU it proves exactness logic"),
    "V3": _check(v3_abft, "GPU (hot, pulsed, tensor cores); on CPU it proves the checksum maths"),
    "V2": _check(v2_bitwise, "GPU with a golden for its key and peers; on CPU slots are the same CPU"),
    "V4": _check(v4_hbm, "GPU HBM and NVML ECC counters; on CPU it tests host RAM and fault models"),
    "V5": _check(v5_transfer, "GPU (PCIe/DMA, NVLink P2P, pinned memory); on CPU copies are memcpy"),
    "V6": _check(v6_collective, "several GPUs with NCCL; on CPU gloo over loopback proves payloads"),
}


def profile(suite: str, kind: str) -> dict[str, Any]:
    """Per-check specs for ``suite`` on device kind ``kind`` ("cuda" or "cpu"), in run order.

    Raises:
        ValueError: for an unknown suite or device kind.
    """
    if suite not in SUITES:
        raise ValueError(f"unknown suite {suite!r}; choose one of {', '.join(SUITES)}")
    if kind == "cpu":
        return _cpu(suite)
    if kind == "cuda":
        return _cuda(suite)
    raise ValueError(f"unknown device kind {kind!r}")


def _cpu(suite: str) -> dict[str, Any]:
    scale = {"quick": 1, "accusation": 2, "post-repair": 4}[suite]
    return {
        "V0": v0_health.Spec(max_new_correctable=0 if suite == "post-repair" else None),
        "V1": v1_known_answer.Spec(shapes=((48, 40, 64), (33, 17, 129), (16, 8, 1000)), repeats=2),
        "V3": v3_abft.Spec(
            n=64,
            dtypes=("float32", "float64", "bfloat16", "float16"),
            sustained_s=0.2 * scale,
            pulsed_s=0.2 * scale,
            pulse_on_s=0.1,
            pulse_off_s=0.02,
        ),
        "V2": v2_bitwise.Spec(shapes=((32, 32, 64), (17, 29, 33)), repeats=2 + (scale > 1)),
        "V4": v4_hbm.Spec(
            patterns=v4_hbm.FULL_PATTERNS if suite == "post-repair" else v4_hbm.QUICK_PATTERNS,
            test_bytes=(1 << 20) * scale,
            chunk_words=1 << 15,
            block_words=1 << 13,
            walking_bits=tuple(range(0, 64, 9)) if suite != "post-repair" else tuple(range(64)),
            max_correctable_delta=0 if suite == "post-repair" else None,
        ),
        "V5": v5_transfer.Spec(transfer_bytes=(256 << 10) * scale),
        "V6": v6_collective.Spec(elements=4096 * scale, timeout_s=30.0),
    }


def _cuda(suite: str) -> dict[str, Any]:
    # Estimated H100 runtimes per node of 8 GPUs [M] in comments; V3 is the filler that sets the heat.
    if suite == "quick":
        v3 = v3_abft.Spec(
            n=8192,
            dtypes=("bfloat16", "float16", "float32"),
            sustained_s=45,
            pulsed_s=15,
            pulse_on_s=1.0,
            pulse_off_s=0.5,
            perf_outlier_fraction=0.10,
        )
        v4 = v4_hbm.Spec(test_bytes=None, free_fraction=0.5, chunk_words=1 << 27, block_words=1 << 24)
        v2_shapes: tuple[tuple[int, int, int], ...] = ((2048, 2048, 2048), (1023, 1025, 4097))
        transfer, elements, repeats = 256 << 20, 1 << 21, 2
    elif suite == "accusation":
        v3 = v3_abft.Spec(
            n=8192,
            dtypes=("bfloat16", "float16", "float32"),
            sustained_s=90,
            pulsed_s=30,
            pulse_on_s=1.0,
            pulse_off_s=0.5,
            perf_outlier_fraction=0.10,
        )
        v4 = v4_hbm.Spec(test_bytes=None, free_fraction=0.9, chunk_words=1 << 27, block_words=1 << 24, random_passes=2)
        v2_shapes = ((2048, 2048, 2048), (1023, 1025, 4097), (8192, 256, 1024), (4096, 4096, 4096))
        transfer, elements, repeats = 1 << 30, 1 << 24, 3
    else:
        v3 = v3_abft.Spec(
            n=8192,
            dtypes=("bfloat16", "float16", "float32"),
            sustained_s=600,
            pulsed_s=300,
            pulse_on_s=1.0,
            pulse_off_s=0.5,
            perf_outlier_fraction=0.10,
        )
        v4 = v4_hbm.Spec(
            patterns=v4_hbm.FULL_PATTERNS,
            test_bytes=None,
            free_fraction=0.92,
            chunk_words=1 << 27,
            block_words=1 << 24,
            random_passes=4,
            max_correctable_delta=0,
        )
        v2_shapes = ((2048, 2048, 2048), (1023, 1025, 4097), (8192, 256, 1024), (4096, 4096, 4096), (8192,) * 3)
        transfer, elements, repeats = 2 << 30, 1 << 26, 5
    return {
        "V0": v0_health.Spec(max_new_correctable=0 if suite == "post-repair" else None),
        "V1": v1_known_answer.Spec(
            shapes=((1024, 1024, 256), (1023, 1025, 255), (8192, 128, 256), (256, 256, 8192)),
            repeats=2 if suite == "quick" else 3,
        ),
        "V3": v3,
        "V2": v2_bitwise.Spec(shapes=v2_shapes, repeats=repeats),
        "V4": v4,
        "V5": v5_transfer.Spec(transfer_bytes=transfer),
        "V6": v6_collective.Spec(elements=elements, timeout_s=120.0),
    }


def stress_seconds(spec: Any) -> float:
    """Planned seconds of a V3 spec per device (what ``scale_stress`` shrinks to fit a budget)."""
    return float(spec.sustained_s + spec.pulsed_s) if isinstance(spec, v3_abft.Spec) else 0.0


def scale_stress(spec: Any, factor: float) -> Any:
    """A V3 spec with its phases shortened by ``factor`` (0 < factor <= 1); other specs unchanged."""
    if not isinstance(spec, v3_abft.Spec) or factor >= 1.0:
        return spec
    return dataclasses.replace(spec, sustained_s=spec.sustained_s * factor, pulsed_s=spec.pulsed_s * factor)
