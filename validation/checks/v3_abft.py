"""V3 ABFT-checked hot stress: GEMMs on random data, sustained then pulsed, each checked by checksums.

Algorithm-based fault tolerance (Huang and Abraham 1984; sdc-anchors §3.3): for ``C = A @ B`` the
column sums satisfy ``1ᵀC = (1ᵀA) B`` and the row sums ``C 1 = A (B 1)``. run() computes both
references in fp64 from the very operands the GEMM saw, and the observed sums of ``C`` in fp64, so no
golden and no peer are needed and the data can be production-like (uniform in (-1, 1), fresh every
iteration).

Threshold (documented; ``Spec.c`` scales it). Column ``j`` deviates when

    |1ᵀC - (1ᵀA)B|_j  >  c * ((K + 1) * u_acc + u_out) * ((1ᵀ|A|) |B|)_j

(rows likewise with ``|A| (|B| 1)``), where ``u_acc`` is the unit roundoff of the accumulator (2**-24:
fp32 accumulation for fp32, bf16 and fp16; 2**-53 for fp64) and ``u_out`` that of the output dtype.
This is the worst-case rounding bound of any summation order, so with ``c = 1`` a healthy GPU can not
exceed it: there are no false positives to calibrate away.

Known blind spot (tested as a known miss): a flip whose value change is below the threshold passes.
The worst-case bound grows with K while real rounding error grows far slower, so the blind spot widens
with the GEMM size. Measured on CPU (fp32, uniform(-1, 1), c = 1, a persistent flip at the middle
element, 6 iterations per bit), the significand bits whose flip was never caught:

=====  ==============================================
n      never caught
=====  ==============================================
32     bits 0-10
128    bits 0-15
512    bits 0-21 (only bit 22, exponent, sign caught)
=====  ==============================================

At the CUDA profiles' n = 8192 expect only exponent and sign flips (and NaN/Inf) to be caught with
c = 1. The bitwise checks V1 and V2 cover the low bits; V3 exists for the hot, pulsed, full-entropy
regime. Calibration (sdc-anchors §3.3): healthy runs report ``max_ratio_by_dtype`` in the details;
once measured on a GPU model, ``Spec.c`` can be lowered to about 10x that ratio for that model and
dtype, trading the no-false-positive guarantee for coverage. That has not been done (no GPU here).

A NaN or Inf in C is always a deviation (the operands are finite and small). run() runs the sustained
phase (back-to-back GEMMs) and then the pulsed phase (``pulse_on_s`` of GEMMs, then ``pulse_off_s``
idle, repeated) to create power transients; on CUDA all GPUs stress concurrently, one thread each.

Verdict per GPU: deviating iterations through ``classify_deviations`` (every iteration, or two or more
→ fail; exactly one → suspect). With ``perf_outlier_fraction`` set and at least three GPUs, a GPU
whose GEMM rate is that fraction below the median is ``suspect`` (degraded GPUs often fail later).

Raw output::

    {"gpus": [{"gpu": int, "duration_s": float, "iterations": {"sustained": int, "pulsed": int},
      "gflops": float, "max_ratio": float, "max_ratio_by_dtype": {dtype: float},
      "nonfinite_iterations": int, "flagged_total": int,
      "flagged": [{"iteration": int, "phase": str, "dtype": str, "nonfinite": int,
        "col": int, "col_ratio": float, "col_residual": float, "row": int, "row_ratio": float,
        "row_residual": float, "cols_over": int, "rows_over": int, "got": float|str,
        "got_bits": int, "corrected_bits": int}]}],
     "incomplete": str | None, "duration_s": float}

``flagged`` holds the first ``MAX_FLAGGED`` iterations whose largest ratio exceeded ``Spec.record_ratio``
(a fraction of the threshold), so near misses are visible too; ``flagged_total`` counts all of them and
``max_ratio`` is the largest ratio over every iteration.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import math
import statistics
import time
from collections.abc import Mapping
from typing import Any

from rasd.validation.context import RunContext
from rasd.validation.model import CheckResult, Evidence, GpuResult, Verdict, classify_deviations, combine, worst
from rasd.validation.runtime import FLOAT_BITS, Device, bits_hex, differing_bits, int_view, require_torch, sync

CHECK = "V3"
TITLE = "ABFT hot stress (sustained + pulsed)"

# Flagged iterations kept in the raw output per GPU; the rest are only counted (``flagged_total``).
MAX_FLAGGED = 64
U_ACC = {"float64": 2.0**-53, "float32": 2.0**-24, "bfloat16": 2.0**-24, "float16": 2.0**-24}
U_OUT = {"float64": 2.0**-53, "float32": 2.0**-24, "bfloat16": 2.0**-8, "float16": 2.0**-11}


@dataclasses.dataclass(frozen=True)
class Spec:
    """V3 work and threshold.

    Attributes:
        n: square GEMM size (M = N = K).
        dtypes: dtypes cycled through, one per iteration.
        sustained_s: seconds of back-to-back GEMMs per GPU.
        pulsed_s: seconds of the pulsed phase per GPU.
        pulse_on_s: load part of one pulse.
        pulse_off_s: idle part of one pulse.
        c: threshold factor over the worst-case rounding bound (1.0 = the bound itself).
        record_ratio: iterations whose largest residual/threshold ratio exceeds this are recorded.
        perf_outlier_fraction: flag a GPU this fraction below the median GEMM rate; None = off.
        max_iterations: hard cap on iterations per phase (tests); None = time-bound only.
    """

    n: int
    dtypes: tuple[str, ...] = ("float32",)
    sustained_s: float = 1.0
    pulsed_s: float = 1.0
    pulse_on_s: float = 0.2
    pulse_off_s: float = 0.1
    c: float = 1.0
    record_ratio: float = 0.25
    perf_outlier_fraction: float | None = None
    max_iterations: int | None = None


def run(spec: Spec, ctx: RunContext) -> dict[str, Any]:
    """Stress every device (concurrently on CUDA) and record checksum residuals."""
    torch = require_torch()
    started = time.monotonic()
    cuda = any(d.kind == "cuda" for d in ctx.devices)
    if cuda and len(ctx.devices) > 1:
        with concurrent.futures.ThreadPoolExecutor(len(ctx.devices)) as pool:
            gpus = list(pool.map(lambda d: _stress(torch, spec, ctx, d), ctx.devices))
    else:
        # On CPU the "GPUs" share the same cores; running them concurrently would only oversubscribe.
        gpus = [_stress(torch, spec, ctx, d) for d in ctx.devices]
    incomplete = "budget" if any(g.pop("cut") for g in gpus) else None
    return {"gpus": gpus, "incomplete": incomplete, "duration_s": time.monotonic() - started}


def _stress(torch: Any, spec: Spec, ctx: RunContext, device: Device) -> dict[str, Any]:
    injector = ctx.injects(CHECK)
    n = spec.n
    gen = torch.Generator(device=device.torch_device).manual_seed(ctx.seed * 7919 + device.gpu)
    started = time.monotonic()
    iterations = {"sustained": 0, "pulsed": 0}
    flagged: list[dict[str, Any]] = []
    max_ratio = 0.0
    max_by_dtype: dict[str, float] = {}
    nonfinite_iterations = 0
    flagged_total = 0
    gemm_s = 0.0
    gemms = 0
    cut = False
    total = 0

    def one(phase: str) -> None:
        nonlocal max_ratio, nonfinite_iterations, gemm_s, gemms, total, flagged_total
        dtype = spec.dtypes[total % len(spec.dtypes)]
        tdtype = getattr(torch, dtype)
        a = (torch.rand((n, n), generator=gen, device=device.torch_device, dtype=torch.float32) * 2 - 1).to(tdtype)
        b = (torch.rand((n, n), generator=gen, device=device.torch_device, dtype=torch.float32) * 2 - 1).to(tdtype)
        t0 = time.monotonic()
        c = a @ b
        sync(torch, device)
        gemm_s += time.monotonic() - t0
        gemms += 1
        if injector is not None:
            injector.corrupt_output(CHECK, device.gpu, c, f"{phase} iteration {total}")
        rec = _residuals(torch, spec, a, b, c, dtype)
        max_ratio = max(max_ratio, rec["col_ratio"], rec["row_ratio"])
        max_by_dtype[dtype] = max(max_by_dtype.get(dtype, 0.0), rec["col_ratio"], rec["row_ratio"])
        if rec["nonfinite"]:
            nonfinite_iterations += 1
        if rec["nonfinite"] or max(rec["col_ratio"], rec["row_ratio"]) > spec.record_ratio:
            flagged_total += 1
            if len(flagged) < MAX_FLAGGED:
                flagged.append({"iteration": total, "phase": phase, **rec})
        iterations[phase] += 1
        total += 1

    def capped(phase: str) -> bool:
        return spec.max_iterations is not None and iterations[phase] >= spec.max_iterations

    phase_end = time.monotonic() + spec.sustained_s
    while time.monotonic() < phase_end and not capped("sustained"):
        if ctx.budget.exhausted():
            cut = True
            break
        one("sustained")
    phase_end = time.monotonic() + spec.pulsed_s
    while not cut and time.monotonic() < phase_end and not capped("pulsed"):
        on_end = min(phase_end, time.monotonic() + spec.pulse_on_s)
        while time.monotonic() < on_end and not capped("pulsed"):
            if ctx.budget.exhausted():
                cut = True
                break
            one("pulsed")
        if not cut:
            ctx.sleep(spec.pulse_off_s)  # the idle half of the pulse: the load step is the point
    flops = 2.0 * n**3 * gemms
    return {
        "gpu": device.gpu,
        "duration_s": time.monotonic() - started,
        "iterations": iterations,
        "gflops": flops / gemm_s / 1e9 if gemm_s > 0 else 0.0,
        "max_ratio": max_ratio,
        "max_ratio_by_dtype": max_by_dtype,
        "nonfinite_iterations": nonfinite_iterations,
        "flagged": flagged,
        "flagged_total": flagged_total,
        "cut": cut,
    }


def _residuals(torch: Any, spec: Spec, a: Any, b: Any, c: Any, dtype: str) -> dict[str, Any]:
    """Checksum residuals of one GEMM, normalised by the unscaled threshold (``c = 1``)."""
    a64, b64, c64 = a.to(torch.float64), b.to(torch.float64), c.to(torch.float64)
    k = a.shape[1]
    unit = (k + 1) * U_ACC[dtype] + U_OUT[dtype]
    col_ref = a64.sum(dim=0) @ b64
    row_ref = a64 @ b64.sum(dim=1)
    col_tau = unit * (a64.abs().sum(dim=0) @ b64.abs())
    row_tau = unit * (a64.abs() @ b64.abs().sum(dim=1))
    col_res = c64.sum(dim=0) - col_ref
    row_res = c64.sum(dim=1) - row_ref
    nonfinite = int((~torch.isfinite(c)).sum().item())
    # NaN residuals compare False; nan_to_num makes them infinite so they rank first.
    col_ratio = torch.nan_to_num(col_res.abs() / col_tau, nan=math.inf)
    row_ratio = torch.nan_to_num(row_res.abs() / row_tau, nan=math.inf)
    col = int(col_ratio.argmax().item())
    row = int(row_ratio.argmax().item())
    got = float(c[row, col].item())
    corrected = torch.tensor([got - float(col_res[col].item())], dtype=torch.float64).to(c.dtype)
    return {
        "dtype": dtype,
        "nonfinite": nonfinite,
        "col": col,
        "col_ratio": float(col_ratio[col].item()),
        "col_residual": float(col_res[col].item()),
        "row": row,
        "row_ratio": float(row_ratio[row].item()),
        "row_residual": float(row_res[row].item()),
        "cols_over": int((col_ratio > 1.0).sum().item()),
        "rows_over": int((row_ratio > 1.0).sum().item()),
        "got": got if math.isfinite(got) else str(got),
        "got_bits": int(int_view(torch, c[row : row + 1, col : col + 1].contiguous()).reshape(-1)[0].item()),
        "corrected_bits": int(int_view(torch, corrected)[0].item()),
    }


def judge(raw: Mapping[str, Any], spec: Spec) -> CheckResult:
    """Count iterations over the threshold (or with NaN/Inf) per GPU; flag rate outliers. Pure."""
    rates = [g["gflops"] for g in raw["gpus"] if g["gflops"] > 0]
    median = statistics.median(rates) if len(rates) >= 3 else None
    per_gpu = []
    for g in raw["gpus"]:
        bad = [f for f in g["flagged"] if f["nonfinite"] or f["col_ratio"] > spec.c or f["row_ratio"] > spec.c]
        events = max(len(bad), g["nonfinite_iterations"])
        # Past MAX_FLAGGED only a count was kept: a full record list that is all bad means the
        # unrecorded flagged iterations were bad too as far as anyone can tell, so count them.
        truncated = g.get("flagged_total", len(g["flagged"])) > len(g["flagged"])
        if truncated and len(bad) == len(g["flagged"]):
            events = max(events, g["flagged_total"])
        total = sum(g["iterations"].values())
        verdict = classify_deviations(events, persistent=total > 0 and events >= total)
        evidence = []
        for f in bad[:8]:
            width = FLOAT_BITS[f["dtype"]]
            single = f["cols_over"] == 1 and f["rows_over"] == 1
            # The ABFT-corrected value carries the column's rounding noise in its low bits, so only
            # the most significant differing bit is a trustworthy "which bit flipped".
            diff = differing_bits(f["corrected_bits"], f["got_bits"], width) if single else []
            flips = diff[-1:]
            loc = (
                f"element ({f['row']}, {f['col']})"
                if single
                else (f"{f['rows_over']} rows / {f['cols_over']} cols over threshold, worst ({f['row']}, {f['col']})")
            )
            if flips:
                loc += f" bit {','.join(map(str, flips))}"
            evidence.append(
                Evidence(
                    case=f"{f['dtype']} {spec.n}^3 {f['phase']} iteration {f['iteration']}",
                    location=loc,
                    expected=(
                        f"column checksum within threshold (ABFT-corrected value "
                        f"{bits_hex(f['corrected_bits'], width)})"
                    ),
                    got=(
                        f"{f['got']} ({bits_hex(f['got_bits'], width)}), residual {f['col_residual']:.6g} "
                        f"= {f['col_ratio']:.3g} x threshold"
                    ),
                    note=f"{f['nonfinite']} non-finite element(s)" if f["nonfinite"] else "",
                )
            )
        parts = [verdict]
        reason = (
            f"{total} GEMMs ({g['iterations']['sustained']} sustained, {g['iterations']['pulsed']} pulsed), "
            f"largest residual {g['max_ratio']:.3g} x threshold"
        )
        if verdict is not Verdict.PASS:
            where = f" first at {evidence[0].location}" if evidence else ""
            reason = f"V3 ABFT checksum exceeded in {events} of {total} iterations;{where}"
        if (
            spec.perf_outlier_fraction is not None
            and median is not None
            and g["gflops"] < (1 - spec.perf_outlier_fraction) * median
        ):
            parts.append(Verdict.SUSPECT)
            reason += f"; GEMM rate {g['gflops']:.0f} GFLOP/s is >{spec.perf_outlier_fraction:.0%} below median"
        per_gpu.append(GpuResult(g["gpu"], worst(parts), reason, tuple(evidence), g["duration_s"]))
    return combine(
        CHECK,
        TITLE,
        per_gpu,
        incomplete=raw.get("incomplete"),
        duration_s=raw["duration_s"],
        details={
            "n": spec.n,
            "dtypes": list(spec.dtypes),
            "threshold": "c*((K+1)*u_acc+u_out)*((1^T|A|)|B|)",
            "c": spec.c,
            "gflops": {str(g["gpu"]): round(g["gflops"], 2) for g in raw["gpus"]},
            # The calibration input for Spec.c: healthy margins per GPU and dtype.
            "max_ratio_by_dtype": {str(g["gpu"]): g.get("max_ratio_by_dtype", {}) for g in raw["gpus"]},
        },
    )
