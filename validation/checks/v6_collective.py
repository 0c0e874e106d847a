"""V6 collective correctness: torch.distributed collectives with closed-form payloads.

One rank per GPU (one per logical slot on CPU), each in its own thread of this process with its own
process group built directly on an in-process ``HashStore``: NCCL on CUDA, gloo on CPU with its
transport bound to 127.0.0.1. Nothing listens beyond loopback and no launcher is needed.

Payloads are chosen so every result is exact in any reduction order (sdc-anchors §3.5); with
``f(i) = (i mod 65521) + 1`` and ``S = W (W + 1) / 2`` for world size ``W``:

==================  ===========================================  ===================================
op                  rank r sends                                 every rank must receive
==================  ===========================================  ===================================
all_reduce int32    ``(r + 1) * f(i)``                           ``S * f(i)``
all_reduce float32  ``(r + 1) * ((i mod 1024) + 1)``             ``S * ((i mod 1024) + 1)`` (< 2**24)
all_reduce bf16     ``(r + 1) * ((i mod q) + 1)`` (NCCL only)    ``S * ((i mod q) + 1)``, q = 256 // S
broadcast           root 0: ``f(i)``                             ``f(i)``
all_gather          ``(r + 1) * f(i)``                           slot j: ``(j + 1) * f(i)``
reduce_scatter      ``(r + 1) * f(i)`` over W chunks              chunk r of ``S * f(i)``
all_to_all          ``(r + 1) * f(i)`` over W chunks              from j: chunk r of ``(j + 1) * f(i)``
send/recv ring      ``(r + 1) * f(i)`` to r + 1                  ``r * f(i)`` (from r - 1)
==================  ===========================================  ===================================

Verdict: a rank that receives any wrong element fails (its GPU); when every rank receives the same
corruption the evidence says so (a contribution or the reduction path is bad: run pairwise tests to
localize). A collective that raises or times out makes the GPU suspect. Fewer than two ranks: skipped.

Raw output::

    {"backend": str, "world_size": int, "elements": int,
     "ranks": [{"gpu": int, "rank": int, "duration_s": float, "error": str | None,
       "ops": [{"op": str, "mismatches": int, "samples": [{"index": int, "expected": float,
       "got": float}]}]}], "incomplete": str | None, "duration_s": float}
"""

from __future__ import annotations

import dataclasses
import datetime
import threading
import time
from collections.abc import Mapping
from typing import Any

from rasd.validation.checks.tensors import mismatch_indices
from rasd.validation.context import RunContext
from rasd.validation.model import CheckResult, Evidence, GpuResult, Verdict, combine
from rasd.validation.runtime import Device, require_torch

CHECK = "V6"
TITLE = "collective correctness"

_MOD = 65521  # largest prime below 2**16: keeps S * f(i) well inside int32 for W <= 64


@dataclasses.dataclass(frozen=True)
class Spec:
    """V6 work.

    Attributes:
        elements: elements per rank and op (a multiple of the world size is used).
        timeout_s: per-collective timeout; a hang becomes a suspect, not a stuck suite.
        max_samples: wrong elements recorded per op and rank.
    """

    elements: int = 1 << 16
    timeout_s: float = 60.0
    max_samples: int = 4


def _f(torch: Any, n: int, dev: str, mod: int = _MOD, offset: int = 0) -> Any:
    return (torch.arange(offset, offset + n, dtype=torch.int64, device=dev) % mod + 1).to(torch.int32)


def _make_group(torch: Any, store: Any, rank: int, world: int, device: Device, timeout_s: float) -> Any:
    dist = torch.distributed
    timeout = datetime.timedelta(seconds=timeout_s)
    if device.kind == "cuda":
        opts = dist.ProcessGroupNCCL.Options()
        opts._timeout = timeout
        return dist.ProcessGroupNCCL(store, rank, world, opts)
    opts = dist.ProcessGroupGloo._Options()
    opts._timeout = timeout
    # Loopback only: the validation group never listens on a routable interface.
    opts._devices = [dist.ProcessGroupGloo.create_device(hostname="127.0.0.1")]
    return dist.ProcessGroupGloo(store, rank, world, opts)


def _rank_main(torch: Any, spec: Spec, ctx: RunContext, store: Any, rank: int, world: int, n: int) -> dict[str, Any]:
    dist = torch.distributed
    device = ctx.devices[rank]
    dev = device.torch_device
    if device.kind == "cuda":
        torch.cuda.set_device(device.gpu)
    injector = ctx.injects(CHECK)
    started = time.monotonic()
    pg = _make_group(torch, store, rank, world, device, spec.timeout_s)
    s = world * (world + 1) // 2
    f = _f(torch, n, dev)
    ops: list[dict[str, Any]] = []

    def check(op: str, got: Any, expected: Any) -> None:
        if injector is not None:
            injector.corrupt_output(CHECK, device.gpu, got, op)
        count, idx = mismatch_indices(torch, got != expected, spec.max_samples)
        flat_e, flat_g = expected.reshape(-1), got.reshape(-1)
        samples = [{"index": i, "expected": float(flat_e[i].item()), "got": float(flat_g[i].item())} for i in idx]
        ops.append({"op": op, "mismatches": count, "samples": samples})

    x = (rank + 1) * f
    pg.allreduce([x]).wait()
    check("all_reduce int32", x, s * f)

    g = _f(torch, n, dev, mod=1024).to(torch.float32)
    y = (rank + 1) * g
    pg.allreduce([y]).wait()
    check("all_reduce float32", y, s * g)

    if device.kind == "cuda" and s <= 256:
        # bf16 holds integers exactly up to 256: S * max(payload) must stay within it.
        h = _f(torch, n, dev, mod=max(1, 256 // s)).to(torch.bfloat16)
        z = (rank + 1) * h
        pg.allreduce([z]).wait()
        check("all_reduce bfloat16", z, s * h)

    b = f.clone() if rank == 0 else torch.zeros_like(f)
    bopts = dist.BroadcastOptions()
    bopts.rootRank, bopts.rootTensor = 0, 0
    pg.broadcast([b], bopts).wait()
    check("broadcast", b, f)

    gathered = [torch.empty_like(f) for _ in range(world)]
    pg.allgather([gathered], [(rank + 1) * f]).wait()
    check("all_gather", torch.stack(gathered), torch.stack([(j + 1) * f for j in range(world)]))

    chunk = n // world
    rs_out = torch.empty(chunk, dtype=torch.int32, device=dev)
    pg._reduce_scatter_base(rs_out, (rank + 1) * f).wait()
    check("reduce_scatter", rs_out, s * f[rank * chunk : (rank + 1) * chunk])

    a2a_out = torch.empty(n, dtype=torch.int32, device=dev)
    pg.alltoall_base(a2a_out, (rank + 1) * f, [], []).wait()
    expected = torch.cat([(j + 1) * f[rank * chunk : (rank + 1) * chunk] for j in range(world)])
    check("all_to_all", a2a_out, expected)

    recv = torch.empty_like(f)
    outgoing = (rank + 1) * f
    # Even ranks send first, odd ranks receive first: with two ranks both directions share one NCCL
    # stream, and send-before-recv on both sides would wait on each other.
    if rank % 2 == 0:
        works = [pg.send([outgoing], (rank + 1) % world, 0), pg.recv([recv], (rank - 1) % world, 0)]
    else:
        works = [pg.recv([recv], (rank - 1) % world, 0), pg.send([outgoing], (rank + 1) % world, 0)]
    for work in works:
        work.wait()
    check("send/recv ring", recv, ((rank - 1) % world + 1) * f)

    if device.kind == "cuda":
        torch.cuda.synchronize(device.gpu)
    return {"gpu": device.gpu, "rank": rank, "duration_s": time.monotonic() - started, "error": None, "ops": ops}


def run(spec: Spec, ctx: RunContext) -> dict[str, Any]:
    """Run every op on a world of one rank per device, one thread per rank."""
    torch = require_torch()
    started = time.monotonic()
    world = len(ctx.devices)
    backend = "nccl" if any(d.kind == "cuda" for d in ctx.devices) else "gloo"
    n = max(world, spec.elements // world * world)
    base = {"backend": backend, "world_size": world, "elements": n}
    if world < 2:
        return {**base, "ranks": [], "incomplete": None, "duration_s": time.monotonic() - started}
    if ctx.budget.exhausted():
        return {**base, "ranks": [], "incomplete": "budget", "duration_s": time.monotonic() - started}
    dist = torch.distributed
    store = dist.PrefixStore(f"rasd-v6-{ctx.seed}", dist.HashStore())
    timeout_s = max(1.0, min(spec.timeout_s, ctx.budget.remaining_s()))
    spec = dataclasses.replace(spec, timeout_s=timeout_s)
    results: list[dict[str, Any] | None] = [None] * world
    bugs: list[Exception] = []

    def target(rank: int) -> None:
        try:
            results[rank] = _rank_main(torch, spec, ctx, store, rank, world, n)
        except Exception as exc:  # caught here so no rank thread dies silently; sorted out below
            if not isinstance(exc, RuntimeError):
                bugs.append(exc)
            # gloo/NCCL errors and timeouts are RuntimeErrors: a failing collective is a finding.
            results[rank] = {
                "gpu": ctx.devices[rank].gpu,
                "rank": rank,
                "duration_s": 0.0,
                "error": f"{type(exc).__name__}: {exc}",
                "ops": [],
            }

    threads = [threading.Thread(target=target, args=(r,), name=f"rasd-v6-rank{r}", daemon=True) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        # Each collective has its own timeout; this bounds the sum of them.
        t.join(timeout=timeout_s * 12)
    if bugs:
        raise bugs[0]  # a bug in this check, not a finding about a GPU
    ranks = [
        r
        if r is not None
        else {"gpu": ctx.devices[i].gpu, "rank": i, "duration_s": 0.0, "error": "rank did not finish", "ops": []}
        for i, r in enumerate(results)
    ]
    return {**base, "ranks": ranks, "incomplete": None, "duration_s": time.monotonic() - started}


def judge(raw: Mapping[str, Any], spec: Spec) -> CheckResult:
    """Fail ranks that received wrong elements; suspect ranks whose collectives errored. Pure."""
    if raw["world_size"] < 2:
        return CheckResult(
            CHECK, TITLE, Verdict.SKIPPED, "needs at least two GPUs (ranks)", duration_s=raw["duration_s"]
        )
    if not raw["ranks"] and raw.get("incomplete"):
        return combine(CHECK, TITLE, [], incomplete=raw["incomplete"], duration_s=raw["duration_s"])
    wrong_by_op: dict[str, int] = {}
    for r in raw["ranks"]:
        for op in r["ops"]:
            if op["mismatches"]:
                wrong_by_op[op["op"]] = wrong_by_op.get(op["op"], 0) + 1
    per_gpu = []
    for r in raw["ranks"]:
        if r["error"]:
            per_gpu.append(GpuResult(r["gpu"], Verdict.SUSPECT, f"collective error on rank {r['rank']}: {r['error']}"))
            continue
        bad = [op for op in r["ops"] if op["mismatches"]]
        evidence = []
        for op in bad:
            everywhere = wrong_by_op[op["op"]] == len(raw["ranks"])
            note = (
                "every rank received wrong data: a contribution or the reduction path is bad; localize pairwise"
                if everywhere
                else f"only some ranks received wrong data ({wrong_by_op[op['op']]} of {len(raw['ranks'])})"
            )
            for s in op["samples"]:
                evidence.append(
                    Evidence(
                        case=f"{op['op']} ({raw['backend']}, {raw['world_size']} ranks)",
                        location=f"rank {r['rank']} element {s['index']}",
                        expected=repr(s["expected"]),
                        got=repr(s["got"]),
                        note=note,
                    )
                )
        if bad:
            where = f"; first {evidence[0].case} at {evidence[0].location}" if evidence else ""
            reason = f"V6 wrong result in {len(bad)} of {len(r['ops'])} collectives{where}"
            per_gpu.append(GpuResult(r["gpu"], Verdict.FAIL, reason, tuple(evidence[:8]), r["duration_s"]))
        else:
            reason = f"{len(r['ops'])} collectives exact ({raw['backend']}, {raw['world_size']} ranks)"
            per_gpu.append(GpuResult(r["gpu"], Verdict.PASS, reason, (), r["duration_s"]))
    return combine(
        CHECK,
        TITLE,
        per_gpu,
        incomplete=raw.get("incomplete"),
        duration_s=raw["duration_s"],
        details={"backend": raw["backend"], "world_size": raw["world_size"], "elements": raw["elements"]},
    )
