"""V5 transfer integrity: host→GPU→host round trips (pinned and pageable) and GPU→GPU copies.

Each buffer is random int64 words from a seeded host generator. Two wrapping int64 checksums (the word
sum and the index-weighted word sum) are computed where the data lands, so a corruption is attributed
to a leg without trusting another copy:

- ``h2d+d2h``: host → GPU, checksum on the GPU (H2D leg), GPU → host, compare word by word on the host
  (D2H leg, and the location of any wrong word).
- ``p2p i->j``: GPU i → GPU j, checksum on j against i's buffer, then both to the host and compared.

Wrapping integer sums are exact and order-independent (addition modulo 2**64), so the GPU and the host
agree on a healthy buffer whatever the reduction order. Pinned host memory only exists with CUDA; on
``--device cpu`` the copies are host memcpy and only the code path is exercised.

Verdict: any wrong word or checksum on a transfer fails the receiving GPU, and the evidence names the
path (leg or GPU pair) so the controller can cross-check pairs to separate a GPU from a link.

Raw output::

    {"gpus": [{"gpu": int, "duration_s": float, "transfers": [{"path": str, "src": str, "dst": int,
      "bytes": int, "leg_checksum_ok": bool, "mismatches": int, "samples": [{"word": int,
      "expected": int, "got": int}], "gbytes_per_s": float}]}],
     "incomplete": str | None, "duration_s": float}
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping
from typing import Any

from rasd.validation.checks.tensors import mismatch_indices
from rasd.validation.context import RunContext
from rasd.validation.faults import FaultInjector
from rasd.validation.model import CheckResult, Evidence, GpuResult, Verdict, combine
from rasd.validation.runtime import Device, bits_hex, differing_bits, require_torch, sync

CHECK = "V5"
TITLE = "host<->GPU and GPU<->GPU transfer integrity"


@dataclasses.dataclass(frozen=True)
class Spec:
    """V5 work.

    Attributes:
        transfer_bytes: size of each transferred buffer.
        peer: also copy between every ordered pair of GPUs.
        max_samples: wrong words recorded per transfer.
    """

    transfer_bytes: int = 1 << 20
    peer: bool = True
    max_samples: int = 4


def _checksums(torch: Any, words: Any) -> tuple[int, int]:
    weights = torch.arange(1, words.numel() + 1, dtype=torch.int64, device=words.device)
    return int(words.sum().item()), int((words * weights).sum().item())


def run(spec: Spec, ctx: RunContext) -> dict[str, Any]:
    """Round-trip a buffer through every device, and copy it between every pair of devices."""
    torch = require_torch()
    started = time.monotonic()
    injector = ctx.injects(CHECK)
    n = spec.transfer_bytes // 8
    gen = torch.Generator().manual_seed(ctx.seed * 104_729 + 5)
    source = torch.randint(-(2**63), 2**63 - 1, (n,), generator=gen, dtype=torch.int64)
    host_sums = _checksums(torch, source)
    per_gpu: dict[int, dict[str, Any]] = {}
    resident: dict[int, Any] = {}
    incomplete = None
    for device in ctx.devices:
        if ctx.budget.exhausted():
            incomplete = "budget"
            break
        t_gpu = time.monotonic()
        transfers, resident[device.gpu] = _round_trips(torch, spec, device, source, host_sums, injector)
        per_gpu[device.gpu] = {"gpu": device.gpu, "duration_s": time.monotonic() - t_gpu, "transfers": transfers}
    if spec.peer and incomplete is None:
        incomplete = _peer_copies(torch, spec, ctx, resident, per_gpu, injector)
    return {"gpus": list(per_gpu.values()), "incomplete": incomplete, "duration_s": time.monotonic() - started}


def _compare(torch: Any, expected: Any, got: Any, max_samples: int) -> tuple[int, list[dict[str, int]]]:
    """How many words differ, and up to max_samples of them (word, expected, got)."""
    count, idx = mismatch_indices(torch, expected != got, max_samples)
    return count, [{"word": i, "expected": int(expected[i].item()), "got": int(got[i].item())} for i in idx]


def _round_trips(
    torch: Any, spec: Spec, device: Device, source: Any, host_sums: tuple[int, int], injector: FaultInjector | None
) -> tuple[list[dict[str, Any]], Any]:
    """Host → device → host, pinned and pageable on CUDA; (the transfers, the buffer left on the device)."""
    n = spec.transfer_bytes // 8
    transfers = []
    on_gpu = None
    pin_modes = (True, False) if device.kind == "cuda" else (False,)
    for pinned in pin_modes:
        label = f"h2d+d2h {'pinned' if pinned else 'pageable'}"
        host = source.pin_memory() if pinned else source
        t0 = time.monotonic()
        on_gpu = torch.empty(n, dtype=torch.int64, device=device.torch_device)
        on_gpu.copy_(host, non_blocking=pinned)
        sync(torch, device)
        if injector is not None:
            injector.corrupt_output(CHECK, device.gpu, on_gpu, label)
        leg_ok = _checksums(torch, on_gpu) == host_sums
        back = torch.empty(n, dtype=torch.int64, pin_memory=pinned)
        back.copy_(on_gpu)
        sync(torch, device)
        elapsed = time.monotonic() - t0
        count, samples = _compare(torch, source, back, spec.max_samples)
        transfers.append(
            {
                "path": label,
                "src": "host",
                "dst": device.gpu,
                "bytes": spec.transfer_bytes,
                "leg_checksum_ok": leg_ok,
                "mismatches": count,
                "samples": samples,
                "gbytes_per_s": 2 * spec.transfer_bytes / elapsed / 1e9 if elapsed > 0 else 0.0,
            }
        )
    return transfers, on_gpu


def _peer_copies(
    torch: Any,
    spec: Spec,
    ctx: RunContext,
    resident: Mapping[int, Any],
    per_gpu: dict[int, dict[str, Any]],
    injector: FaultInjector | None,
) -> str | None:
    """Copy each device's resident buffer to every other device, adding each copy to its receiver's transfers.

    Returns:
        "budget" when the budget ran out before every pair was copied, else None.
    """
    n = spec.transfer_bytes // 8
    incomplete = None
    for src in ctx.devices:
        for dst in ctx.devices:
            if src.gpu == dst.gpu:
                continue
            if ctx.budget.exhausted():
                incomplete = "budget"
                break
            t0 = time.monotonic()
            label = f"p2p {src.gpu}->{dst.gpu}"
            sent = resident[src.gpu]
            received = torch.empty(n, dtype=torch.int64, device=dst.torch_device)
            received.copy_(sent)
            sync(torch, dst)
            if injector is not None:
                injector.corrupt_output(CHECK, dst.gpu, received, label)
            leg_ok = _checksums(torch, received) == _checksums(torch, sent)
            count, samples = _compare(torch, sent.cpu(), received.cpu(), spec.max_samples)
            elapsed = time.monotonic() - t0
            per_gpu[dst.gpu]["transfers"].append(
                {
                    "path": label,
                    "src": str(src.gpu),
                    "dst": dst.gpu,
                    "bytes": spec.transfer_bytes,
                    "leg_checksum_ok": leg_ok,
                    "mismatches": count,
                    "samples": samples,
                    "gbytes_per_s": spec.transfer_bytes / elapsed / 1e9 if elapsed > 0 else 0.0,
                }
            )
            per_gpu[dst.gpu]["duration_s"] += elapsed
    return incomplete


def judge(raw: Mapping[str, Any], spec: Spec) -> CheckResult:
    """Fail a GPU on any wrong word or checksum on a transfer into it; name the leg. Pure."""
    per_gpu = []
    for g in raw["gpus"]:
        bad = [t for t in g["transfers"] if t["mismatches"] > 0 or not t["leg_checksum_ok"]]
        evidence = []
        for t in bad:
            if t["src"] == "host":
                leg = "H2D leg (wrong on the GPU)" if not t["leg_checksum_ok"] else "D2H leg (right on the GPU)"
            else:
                leg = f"link GPU {t['src']} -> GPU {t['dst']}"
            for s in t["samples"] or [{"word": -1, "expected": 0, "got": 0}]:
                if s["word"] < 0:
                    evidence.append(Evidence(t["path"], "checksum only", "checksum match", "checksum mismatch", leg))
                    continue
                flips = differing_bits(s["expected"], s["got"], 64)
                evidence.append(
                    Evidence(
                        case=t["path"],
                        location=f"word {s['word']} (byte offset {s['word'] * 8:#x}) bit {','.join(map(str, flips))}",
                        expected=bits_hex(s["expected"], 64),
                        got=bits_hex(s["got"], 64),
                        note=leg,
                    )
                )
        if bad:
            where = f"; first {evidence[0].case} {evidence[0].location}" if evidence else ""
            reason = f"V5 corruption on {len(bad)} of {len(g['transfers'])} transfers{where}"
            verdict = Verdict.FAIL
        else:
            reason = f"{len(g['transfers'])} transfers bit-exact"
            verdict = Verdict.PASS
        per_gpu.append(GpuResult(g["gpu"], verdict, reason, tuple(evidence[:8]), g["duration_s"]))
    return combine(
        CHECK,
        TITLE,
        per_gpu,
        incomplete=raw.get("incomplete"),
        duration_s=raw["duration_s"],
        details={"transfer_bytes": spec.transfer_bytes, "peer": spec.peer},
    )
