"""V1 known-answer GEMM: integer-valued operands whose product is exact in any summation order.

Operands are integers drawn uniformly from ``[-e, e]``, with ``e`` chosen per dtype and K so that
every partial sum of ``K`` products is an integer the accumulator and the output dtype represent
exactly (sdc-anchors §3.2): ``K * e**2 <= EXACT_LIMIT[dtype]``. Then split-K, tile order or kernel
choice cannot change a single bit, and the expected result is the int64 product on the host, which
needs no golden and no peer. (The host computes it with fp64 BLAS, which is exact here because every
partial sum is an integer below 2**53, and holds it as int64.)

=========  ============  ==============================================
dtype      exact limit   why
=========  ============  ==============================================
float64    2**53         53-bit significand
float32    2**24         24-bit significand (TF32 is off, so fp32 FMA)
float16    2**11         11-bit significand of the fp16 output
bfloat16   2**8          8-bit significand of the bf16 output
=========  ============  ==============================================

The comparison is by value (``-0.0 == 0.0``): the sign of an exact zero is not part of the known
answer, every other bit is.

Verdict per GPU (``classify_deviations``): a case wrong in every repeat, or two or more wrong repeats
in total → fail; a single wrong repeat → suspect; otherwise pass.

Raw output::

    {"gpus": [{"gpu": int, "duration_s": float, "cases": [{"case": str, "dtype": str,
      "shape": [M, N, K], "entry_bound": int, "repeats": [{"mismatches": int, "samples": [
      {"row": int, "col": int, "expected": int, "got": float|str, "expected_bits": int,
       "got_bits": int}]}]}]}],
     "incomplete": str | None, "duration_s": float}
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Mapping
from typing import Any

from rasd.validation.checks.tensors import mismatch_indices
from rasd.validation.context import RunContext
from rasd.validation.model import CheckResult, Evidence, GpuResult, Verdict, classify_deviations, combine
from rasd.validation.runtime import FLOAT_BITS, bits_hex, differing_bits, int_view, require_torch, sync

CHECK = "V1"
TITLE = "known-answer GEMM"

EXACT_LIMIT = {"float64": 2**53, "float32": 2**24, "float16": 2**11, "bfloat16": 2**8}
# Largest operand magnitude used per dtype: wide enough to exercise more significand bits than +-1,
# small enough that the int64 host reference cannot overflow.
MAX_ENTRY = {"float64": 2**20, "float32": 2**10, "float16": 2**5, "bfloat16": 2**4}


@dataclasses.dataclass(frozen=True)
class Spec:
    """V1 work and reporting limits.

    Attributes:
        shapes: (M, N, K) triples; odd sizes and a K large enough to trigger split-K belong here.
        dtypes: operand/output dtypes by torch name.
        repeats: times each case is recomputed, to tell persistent from intermittent faults.
        max_samples: mismatching elements recorded per repeat.
    """

    shapes: tuple[tuple[int, int, int], ...]
    dtypes: tuple[str, ...] = ("float64", "float32", "bfloat16", "float16")
    repeats: int = 2
    max_samples: int = 4


def entry_bound(dtype: str, k: int) -> int:
    """Largest integer magnitude for operands so that every K-term partial sum is exact in ``dtype``.

    Returns 0 when even ``{-1, 0, 1}`` operands cannot be exact at this K.
    """
    return min(MAX_ENTRY[dtype], math.isqrt(EXACT_LIMIT[dtype] // k))


def run(spec: Spec, ctx: RunContext) -> dict[str, Any]:
    """Compute every case on every device, compare with the int64 product, record mismatches."""
    torch = require_torch()
    started = time.monotonic()
    injector = ctx.injects(CHECK)
    cases = []
    for case_no, (m, n, k) in enumerate(spec.shapes):
        for dtype in spec.dtypes:
            bound = entry_bound(dtype, k)
            if bound < 1:
                continue
            gen = torch.Generator().manual_seed(ctx.seed * 1000 + case_no)
            a = torch.randint(-bound, bound + 1, (m, k), generator=gen, dtype=torch.int64)
            b = torch.randint(-bound, bound + 1, (k, n), generator=gen, dtype=torch.int64)
            cases.append((f"{dtype} {m}x{n}x{k}", dtype, (m, n, k), bound, a, b))
    references: dict[str, Any] = {}
    gpus = []
    incomplete = None
    for device in ctx.devices:
        gpu_started = time.monotonic()
        results = []
        for label, dtype, shape, bound, a_int, b_int in cases:
            if ctx.budget.exhausted():
                incomplete = "budget"
                break
            if label not in references:
                # Every partial sum is an integer below 2**53, so host fp64 BLAS computes the integer
                # product exactly (and fast); the result is held as int64.
                references[label] = (a_int.to(torch.float64) @ b_int.to(torch.float64)).to(torch.int64)
            expected_int = references[label]
            tdtype = getattr(torch, dtype)
            a = a_int.to(tdtype).to(device.torch_device)
            b = b_int.to(tdtype).to(device.torch_device)
            expected = expected_int.to(torch.float64).to(device.torch_device)
            repeats = []
            for repeat in range(spec.repeats):
                c = a @ b
                if injector is not None:
                    injector.corrupt_output(CHECK, device.gpu, c, f"{label} repeat {repeat}")
                count, flat = _mismatches(torch, c, expected, spec.max_samples)
                samples = []
                for idx in flat:
                    row, col = divmod(idx, shape[1])
                    exp_val = int(expected_int[row, col])
                    got_val = float(c[row, col].item())
                    samples.append(
                        {
                            "row": row,
                            "col": col,
                            "expected": exp_val,
                            "got": got_val if math.isfinite(got_val) else str(got_val),
                            "expected_bits": _bits_of(torch, exp_val, tdtype),
                            "got_bits": _bits_of_element(torch, c, row, col),
                        }
                    )
                repeats.append({"mismatches": count, "samples": samples})
            sync(torch, device)
            results.append(
                {"case": label, "dtype": dtype, "shape": list(shape), "entry_bound": bound, "repeats": repeats}
            )
        gpus.append({"gpu": device.gpu, "duration_s": time.monotonic() - gpu_started, "cases": results})
        if incomplete:
            break
    return {"gpus": gpus, "incomplete": incomplete, "duration_s": time.monotonic() - started}


def _mismatches(torch: Any, c: Any, expected: Any, limit: int) -> tuple[int, list[int]]:
    # NaN != x is True, so NaN and Inf results count as mismatches too.
    return mismatch_indices(torch, c.to(torch.float64) != expected, limit)


def _bits_of(torch: Any, value: int, tdtype: Any) -> int:
    return int(int_view(torch, torch.tensor([value], dtype=tdtype))[0].item())


def _bits_of_element(torch: Any, c: Any, row: int, col: int) -> int:
    return int(int_view(torch, c[row : row + 1, col : col + 1].contiguous()).reshape(-1)[0].item())


def judge(raw: Mapping[str, Any], spec: Spec) -> CheckResult:
    """Classify each GPU by how many repeats missed the known answer. Pure."""
    per_gpu = []
    for entry in raw["gpus"]:
        events = 0
        persistent = False
        evidence = []
        for case in entry["cases"]:
            width = FLOAT_BITS[case["dtype"]]
            bad = [i for i, r in enumerate(case["repeats"]) if r["mismatches"] > 0]
            events += len(bad)
            persistent = persistent or (bool(bad) and len(bad) == len(case["repeats"]))
            for i in bad:
                rep = case["repeats"][i]
                for s in rep["samples"]:
                    flips = differing_bits(s["expected_bits"], s["got_bits"], width)
                    evidence.append(
                        Evidence(
                            case=f"{case['case']} repeat {i}",
                            location=f"element ({s['row']}, {s['col']}) bit {','.join(map(str, flips))}",
                            expected=f"{s['expected']} ({bits_hex(s['expected_bits'], width)})",
                            got=f"{s['got']} ({bits_hex(s['got_bits'], width)})",
                            note=f"{rep['mismatches']} wrong element(s) in this repeat",
                        )
                    )
        verdict = classify_deviations(events, persistent=persistent)
        if verdict is Verdict.PASS:
            n = sum(len(c["repeats"]) for c in entry["cases"])
            reason = f"{len(entry['cases'])} cases x repeats ({n} GEMMs) exact"
        else:
            kind = "persistent" if persistent else ("repeated" if events >= 2 else "one-off")
            first = evidence[0] if evidence else None
            where = f" first at {first.case}, {first.location}" if first else ""
            reason = f"V1 known answer wrong in {events} repeat(s) ({kind});{where}"
        per_gpu.append(GpuResult(entry["gpu"], verdict, reason, tuple(evidence), entry["duration_s"]))
    return combine(
        CHECK,
        TITLE,
        per_gpu,
        incomplete=raw.get("incomplete"),
        duration_s=raw["duration_s"],
        details={"shapes": [list(s) for s in spec.shapes], "dtypes": list(spec.dtypes), "repeats": spec.repeats},
    )
