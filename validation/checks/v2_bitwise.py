"""V2 bitwise GEMM: full-entropy operands, compared bit for bit with a golden and with peer GPUs.

Every GPU computes the same GEMMs (random full-significand operands, bounded in (-1, 1) and a wide
range scaled by 2**[-4, 4]) several times. run() hashes each result's bit pattern (SHA-256) and keeps
per-row and per-column sums of the bit patterns so a deviation can be located; it looks up the golden
for each GPU's software key (``rasd.validation.golden``) and puts it into the raw output.

judge(), per case, within each group of GPUs sharing a software key (a "reference" is the digest a
GPU's repeats are held against):

==============================================================  ====================================
situation                                                       outcome
==============================================================  ====================================
golden exists, GPU matches it                                   pass
golden exists, >= 2 GPUs, all agree with each other, not with   software_drift for every GPU: the
it (and each GPU's repeats agree)                               stack or the golden changed; alert,
                                                                do not quarantine
golden exists, a peer majority differs from it, peers split     suspect for the majority GPUs
golden exists, GPU matches neither golden nor the majority      deviation (hardware)
golden exists, one GPU only, it differs                         suspect: cannot tell hardware from
                                                                drift (V1 can)
no golden, strict peer majority, GPU differs from it            deviation (hardware)
no golden, peers split without a majority (e.g. 2 GPUs)         suspect for the split GPUs
any repeat differing from the reference                         deviation (intermittent)
==============================================================  ====================================

Deviations are counted per repeat and classified by ``classify_deviations``: persistent or repeated
→ fail, one-off → suspect.

Raw output::

    {"gpus": [{"gpu": int, "key": str, "duration_s": float, "cases": [{"case": str, "dtype": str,
      "repeats": [{"digest": str, "row_sums": [int] | None, "col_sums": [int] | None}]}]}],
     "golden": {key: {case: {"digest", "row_sums", "col_sums"}}}, "golden_source": str,
     "incomplete": str | None, "duration_s": float}

Row/column sums are kept for repeat 0 and for any repeat whose digest differs from repeat 0.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import time
from collections.abc import Mapping, Sequence
from typing import Any

from rasd.validation import golden as golden_store
from rasd.validation.checks.tensors import row_col_bitsums, sha256_bits
from rasd.validation.context import RunContext
from rasd.validation.faults import FaultKind
from rasd.validation.model import CheckResult, Evidence, GpuResult, Verdict, classify_deviations, combine, worst
from rasd.validation.runtime import FLOAT_BITS, Device, key_string, require_torch, software_key, sync

CHECK = "V2"
TITLE = "bitwise GEMM vs golden and peers"


@dataclasses.dataclass(frozen=True)
class Spec:
    """V2 work.

    Attributes:
        shapes: (M, N, K) triples.
        dtypes: torch dtype names.
        ranges: operand value ranges: "bounded" = uniform(-1, 1); "wide" = that times 2**[-4, 4].
        repeats: times each case is recomputed on each GPU.
    """

    shapes: tuple[tuple[int, int, int], ...]
    dtypes: tuple[str, ...] = ("float64", "float32", "bfloat16", "float16")
    ranges: tuple[str, ...] = ("bounded", "wide")
    repeats: int = 3


def case_id(dtype: str, shape: Sequence[int], value_range: str, seed: int) -> str:
    """The id a case has in the golden store: everything that determines its operands."""
    return f"{dtype} {shape[0]}x{shape[1]}x{shape[2]} {value_range} seed={seed}"


def run(spec: Spec, ctx: RunContext) -> dict[str, Any]:
    """Compute and fingerprint every case on every device; attach the golden for each key."""
    torch = require_torch()
    started = time.monotonic()
    injector = ctx.injector if ctx.injector is not None and ctx.injector.applies(CHECK) else None
    cases = []
    for shape_no, (m, n, k) in enumerate(spec.shapes):
        for range_no, value_range in enumerate(spec.ranges):
            gen = torch.Generator().manual_seed(ctx.seed * 1000 + 100 * shape_no + range_no)
            a = torch.rand((m, k), generator=gen, dtype=torch.float64) * 2 - 1
            b = torch.rand((k, n), generator=gen, dtype=torch.float64) * 2 - 1
            if value_range == "wide":
                # 2**[-4, 4] spreads exponents while keeping fp16 results of K ~ 8192 clear of overflow.
                a = a * torch.exp2(torch.randint(-4, 5, (m, k), generator=gen).to(torch.float64))
                b = b * torch.exp2(torch.randint(-4, 5, (k, n), generator=gen).to(torch.float64))
            for dtype in spec.dtypes:
                cases.append((case_id(dtype, (m, n, k), value_range, ctx.seed), dtype, a, b))
    stored = golden_store.load(ctx.golden_path) if ctx.golden_path else {}
    drifting = injector is not None and injector.kind is FaultKind.DRIFT

    def fingerprint(device: Device) -> tuple[dict[str, Any], dict[str, Any], bool]:
        """One device's cases: (raw entry, drifted golden entries, cut by the budget)."""
        key = key_string(software_key(device))
        gpu_started = time.monotonic()
        results = []
        drifted_golden: dict[str, Any] = {}
        cut = False
        for label, dtype, a64, b64 in cases:
            if ctx.budget.exhausted():
                cut = True
                break
            tdtype = getattr(torch, dtype)
            a = a64.to(tdtype).to(device.torch_device)
            b = b64.to(tdtype).to(device.torch_device)
            repeats: list[dict[str, Any]] = []
            for repeat in range(spec.repeats):
                c = a @ b
                if injector is not None:
                    injector.corrupt_output(CHECK, device.gpu, c, f"{label} repeat {repeat}")
                digest = sha256_bits(torch, c)
                rec: dict[str, Any] = {"digest": digest, "row_sums": None, "col_sums": None}
                if repeat == 0 or digest != repeats[0]["digest"]:
                    rec["row_sums"], rec["col_sums"] = row_col_bitsums(torch, c)
                repeats.append(rec)
                if repeat == 0 and drifting and device == ctx.devices[0]:
                    # Drift: the golden is this healthy answer with one bit changed, as if it had
                    # been recorded by another software stack.
                    drifted = injector.drifted(CHECK, c)
                    rows, cols = row_col_bitsums(torch, drifted)
                    drifted_golden[label] = {"digest": sha256_bits(torch, drifted), "row_sums": rows, "col_sums": cols}
            sync(torch, device)
            results.append({"case": label, "dtype": dtype, "repeats": repeats})
        entry = {"gpu": device.gpu, "key": key, "duration_s": time.monotonic() - gpu_started, "cases": results}
        return entry, drifted_golden, cut

    if any(d.kind == "cuda" for d in ctx.devices) and len(ctx.devices) > 1:
        # Each GPU computes and hashes its own cases; hashing releases the GIL, so GPUs overlap.
        with concurrent.futures.ThreadPoolExecutor(len(ctx.devices)) as pool:
            outputs = list(pool.map(fingerprint, ctx.devices))
    else:
        outputs = [fingerprint(d) for d in ctx.devices]

    golden: dict[str, dict[str, Any]] = {}
    golden_source = f"file {ctx.golden_path}" if ctx.golden_path else "none"
    for entry, _, _ in outputs:
        if entry["key"] in stored:
            golden[entry["key"]] = stored[entry["key"]]
    if drifting:
        golden[outputs[0][0]["key"]] = outputs[0][1]
        golden_source = "fault injection: drift (golden from a different stack)"
    return {
        "gpus": [entry for entry, _, _ in outputs],
        "golden": golden,
        "golden_source": golden_source,
        "incomplete": "budget" if any(cut for _, _, cut in outputs) else None,
        "duration_s": time.monotonic() - started,
    }


# -- judge -----------------------------------------------------------------------------------------


def _signed64(x: int) -> int:
    x &= (1 << 64) - 1
    return x - (1 << 64) if x >> 63 else x


def locate(expected: Mapping[str, Any] | None, got: Mapping[str, Any] | None, width: int) -> tuple[str, str, str]:
    """Where two results differ, from their row and column bit-sums: (location, expected, got).

    One differing row and column with a difference of exactly ±2**b is one element with bit b flipped.
    """
    if not expected or not got or expected.get("row_sums") is None or got.get("row_sums") is None:
        return "not located (no row/column sums for this repeat)", "", ""
    rows = [
        (i, _signed64(g - e))
        for i, (e, g) in enumerate(zip(expected["row_sums"], got["row_sums"], strict=True))
        if e != g
    ]
    cols = [
        (j, _signed64(g - e))
        for j, (e, g) in enumerate(zip(expected["col_sums"], got["col_sums"], strict=True))
        if e != g
    ]
    if len(rows) == 1 and len(cols) == 1 and rows[0][1] == cols[0][1]:
        diff = rows[0][1]
        mag = abs(diff)
        if mag & (mag - 1) == 0 and mag.bit_length() - 1 < width:
            bit = mag.bit_length() - 1
            direction = "0->1" if (diff > 0) != (bit == width - 1) else "1->0"
            return (
                f"element ({rows[0][0]}, {cols[0][0]}) bit {bit}",
                f"row {rows[0][0]} bit-sum {expected['row_sums'][rows[0][0]]}",
                f"row {rows[0][0]} bit-sum {got['row_sums'][rows[0][0]]} (bit {bit} {direction})",
            )
        return f"element ({rows[0][0]}, {cols[0][0]})", "bit-sum diff 0", f"bit-sum diff {diff}"
    return (
        f"rows {[i for i, _ in rows[:8]]} cols {[j for j, _ in cols[:8]]}",
        f"{len(rows)} rows/{len(cols)} cols as reference",
        f"{len(rows)} rows/{len(cols)} cols differ",
    )


def _mode(digests: Sequence[str]) -> str:
    counts = collections.Counter(digests)
    best = max(counts.values())
    return next(d for d in digests if counts[d] == best)  # ties go to the earliest repeat


@dataclasses.dataclass
class _Tally:
    """What `judge` collects per GPU (by index) over every case of every software key."""

    events: collections.Counter[int] = dataclasses.field(default_factory=collections.Counter)
    """Repeats that differ from their reference."""
    persistent: dict[int, bool] = dataclasses.field(default_factory=lambda: collections.defaultdict(bool))
    """Whether some case differed in every repeat."""
    flags: dict[int, list[str]] = dataclasses.field(default_factory=lambda: collections.defaultdict(list))
    """Why a GPU is suspect without a counted deviation."""
    drift_cases: collections.Counter[int] = dataclasses.field(default_factory=collections.Counter)
    evidence: dict[int, list[Evidence]] = dataclasses.field(default_factory=lambda: collections.defaultdict(list))


@dataclasses.dataclass(frozen=True)
class _Case:
    """One case across the GPUs of one software key: their answers and what they are held against."""

    name: str
    members: list[tuple[int, Any]]
    """(GPU index, its raw case) for every GPU of the key that ran the case."""
    width: int
    answers: dict[int, str]
    """Each GPU's most frequent digest."""
    top: str
    top_n: int
    majority: str | None
    """The answer of a strict majority of the GPUs, else None."""
    gold: Mapping[str, Any] | None
    drift: bool
    """Node-wide drift: every GPU's answer is the same and it is not the golden's."""

    def sums_for(self, digest: str) -> Mapping[str, Any] | None:
        """A repeat with digest that kept its row/column sums, or None."""
        for _, c in self.members:
            for r in c["repeats"]:
                if r["digest"] == digest and r.get("row_sums") is not None:
                    return r
        return None


def _cases(group: Sequence[Mapping[str, Any]], goldens: Mapping[str, Any]) -> list[_Case]:
    """The cases of one software key's GPUs, in the order of the GPU that ran the most."""
    longest = max(group, key=lambda e: len(e["cases"]))
    cases = []
    for case_no, name in enumerate(c["case"] for c in longest["cases"]):
        members = [(e["gpu"], e["cases"][case_no]) for e in group if len(e["cases"]) > case_no]
        answers = {gpu: _mode([r["digest"] for r in c["repeats"]]) for gpu, c in members}
        counts = collections.Counter(answers.values())
        top, top_n = counts.most_common(1)[0]
        gold = goldens.get(name)
        # Repeats that stray from a drifted shared answer are still counted per GPU.
        drift = gold is not None and len(counts) == 1 and len(members) >= 2 and top != gold["digest"]
        majority = top if top_n * 2 > len(members) else None
        width = FLOAT_BITS[members[0][1]["dtype"]]
        cases.append(_Case(name, members, width, answers, top, top_n, majority, gold, drift))
    return cases


def judge(raw: Mapping[str, Any], spec: Spec) -> CheckResult:
    """Vote per case within each software-key group, against the golden and the peers. Pure."""
    goldens: Mapping[str, Mapping[str, Any]] = raw.get("golden") or {}
    by_key: dict[str, list[Mapping[str, Any]]] = collections.defaultdict(list)
    for entry in raw["gpus"]:
        by_key[entry["key"]].append(entry)
    tally = _Tally()
    for key, group in by_key.items():
        for case in _cases(group, goldens.get(key, {})):
            if case.drift:
                _record_drift(case, tally)
            for gpu, c in case.members:
                ref, ref_name = _reference(case, gpu, tally)
                _count_deviations(case, gpu, c, ref, ref_name, tally)
    per_gpu = [_gpu_result(entry, tally, has_golden=bool(goldens.get(entry["key"]))) for entry in raw["gpus"]]
    return combine(
        CHECK,
        TITLE,
        per_gpu,
        incomplete=raw.get("incomplete"),
        duration_s=raw["duration_s"],
        details={"golden_source": raw.get("golden_source", "none"), "keys": sorted(by_key)},
    )


def _record_drift(case: _Case, tally: _Tally) -> None:
    """Every GPU of a drifted case: a drift case, with where the shared answer differs from the golden."""
    assert case.gold is not None
    loc, exp, got = locate(case.gold, case.sums_for(case.top), case.width)
    for gpu, _ in case.members:
        tally.drift_cases[gpu] += 1
        tally.evidence[gpu].append(
            Evidence(
                case.name,
                loc,
                f"golden {case.gold['digest'][:16]} {exp}".strip(),
                f"{case.top[:16]} {got}".strip(),
                f"all {len(case.members)} GPUs agree with each other and not with the golden: software or golden drift",
            )
        )


def _reference(case: _Case, gpu: int, tally: _Tally) -> tuple[str, str]:
    """(digest, its name) that gpu's repeats are held against; flags the GPU where the vote cannot decide."""
    own, gold, name = case.answers[gpu], case.gold, case.name
    if case.drift:
        return case.top, "unanimous peers"
    if gold is not None and own == gold["digest"]:
        return own, "golden"
    if gold is not None and len(case.members) == 1:
        # One GPU against a golden cannot separate a hardware fault from a drifted stack; the
        # place it differs is still evidence the operator needs for the accusation that follows.
        tally.flags[gpu].append(f"{name}: differs from the golden and there is no peer to tell drift")
        loc, exp, got = locate(gold, case.sums_for(own), case.width)
        tally.evidence[gpu].append(
            Evidence(
                name,
                loc,
                f"golden {gold['digest'][:16]} {exp}".strip(),
                f"{own[:16]} {got}".strip(),
                "differs from the golden; no peer GPU to tell a hardware fault from drift",
            )
        )
        return own, "own repeats"
    if gold is not None and own == case.majority:
        tally.flags[gpu].append(
            f"{name}: agrees with the peer majority ({case.top_n} of {len(case.members)}), not the golden; peers split"
        )
        return own, "own repeats"
    if gold is not None:
        return gold["digest"], "golden"
    if case.majority is not None:
        return case.majority, "peer majority"
    tally.flags[gpu].append(f"{name}: peers disagree and there is no golden to break the tie")
    return own, "own repeats"


def _count_deviations(case: _Case, gpu: int, c: Mapping[str, Any], ref: str, ref_name: str, tally: _Tally) -> None:
    """Count gpu's repeats of the case that differ from ref, with where each differs."""
    ref_rec = case.gold if ref_name == "golden" else case.sums_for(ref)
    bad = [i for i, r in enumerate(c["repeats"]) if r["digest"] != ref]
    if bad and len(case.members) == 1 and case.gold is not None and ref_name == "golden":
        # One GPU against a golden cannot separate a hardware fault from a drifted stack.
        tally.flags[gpu].append(f"{case.name}: differs from the golden and there is no peer to tell drift")
        bad = []
    tally.events[gpu] += len(bad)
    tally.persistent[gpu] = tally.persistent[gpu] or (bool(bad) and len(bad) == len(c["repeats"]))
    for i in bad:
        rec = c["repeats"][i]
        if rec.get("row_sums") is None:
            # Sums are kept once per distinct digest; an identical earlier repeat has them.
            rec = next((r for r in c["repeats"] if r["digest"] == rec["digest"] and r["row_sums"]), rec)
        loc, exp, got = locate(ref_rec, rec if rec.get("row_sums") is not None else None, case.width)
        tally.evidence[gpu].append(
            Evidence(
                f"{case.name} repeat {i}",
                loc,
                f"{ref_name} {ref[:16]} {exp}".strip(),
                f"{rec['digest'][:16]} {got}".strip(),
                f"differs from the {ref_name}",
            )
        )


def _gpu_result(entry: Mapping[str, Any], tally: _Tally, *, has_golden: bool) -> GpuResult:
    """One GPU's verdict from its tally, with the reason."""
    gpu = entry["gpu"]
    events, flags, drift_cases, evidence = (
        tally.events[gpu],
        tally.flags[gpu],
        tally.drift_cases[gpu],
        tally.evidence[gpu],
    )
    parts = [classify_deviations(events, persistent=tally.persistent[gpu])]
    if flags:
        parts.append(Verdict.SUSPECT)
    if drift_cases:
        parts.append(Verdict.SOFTWARE_DRIFT)
    verdict = worst(parts)
    if verdict is Verdict.FAIL:
        first = evidence[0] if evidence else None
        where = f"; first {first.case} at {first.location}" if first else ""
        reason = f"V2 bit pattern wrong in {events} repeat(s){where}"
    elif verdict is Verdict.SUSPECT:
        reason = "; ".join(flags[:3]) if flags else f"V2 one-off deviation ({events} repeat)"
    elif verdict is Verdict.SOFTWARE_DRIFT:
        reason = f"{drift_cases} case(s) differ from the golden identically on every GPU: software drift"
    else:
        basis = "golden and peers" if has_golden else "peers only (no golden for this key)"
        reason = f"{len(entry['cases'])} cases bitwise consistent ({basis})"
    return GpuResult(gpu, verdict, reason, tuple(evidence[:8]), entry["duration_s"])


def unanimous_goldens(raw: Mapping[str, Any]) -> dict[str, dict[str, dict[str, Any]]]:
    """Golden entries worth recording from a run: cases where every GPU of a key agreed in every repeat.

    Needs at least two GPUs per key, so one GPU can never define "correct" on its own.
    """
    out: dict[str, dict[str, dict[str, Any]]] = {}
    by_key: dict[str, list[Mapping[str, Any]]] = collections.defaultdict(list)
    for entry in raw["gpus"]:
        by_key[entry["key"]].append(entry)
    for key, group in by_key.items():
        if len(group) < 2:
            continue
        for case_no, case in enumerate(group[0]["cases"]):
            reps = [r for e in group if len(e["cases"]) > case_no for r in e["cases"][case_no]["repeats"]]
            if len({r["digest"] for r in reps}) == 1 and all(len(e["cases"]) > case_no for e in group):
                first = case["repeats"][0]
                out.setdefault(key, {})[case["case"]] = {
                    "digest": first["digest"],
                    "row_sums": first["row_sums"],
                    "col_sums": first["col_sums"],
                }
    return out
