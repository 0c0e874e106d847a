"""V4 HBM pattern tests over most of the GPU's free memory, with an ECC watch around them.

Patterns are address-in-address, moving inversions and random data, plus walking bits and
checkerboards in the full (post-repair) suite.

The memory under test is a list of 1-D int64 chunks. Every write goes through ``_Memory.write``,
which is also where ``FaultInjector.after_write`` models faulty cells (stuck bits, coupled or aliased
words). Patterns (sdc-anchors §3.4, reimplemented in torch):

- ``address``: word ``w`` holds ``w`` (its index in the tested region); verify; invert every word;
  verify. Catches address-decoder faults and aliasing: a word reading another word's address says
  which two addresses share a cell.
- ``moving_inversions``: write a random 64-bit pattern ``p`` everywhere; ascending by block, verify
  ``p`` and write ``~p``; descending, verify ``~p`` and write ``p``; verify ``p``. Catches stuck bits,
  transition and coupling faults.
- ``random``: counter-based random words (a seeded generator per block), written everywhere, then
  regenerated and compared. Catches data-dependent faults.
- ``checkerboard`` (full): 0xAAAA... then 0x5555...
- ``walking`` (full): ``1 << b`` and its complement for each bit ``b`` in ``Spec.walking_bits``.

ECC watch: the context's ``ecc_probe`` is sampled before and after; new uncorrectable errors fail the
GPU, correctable errors above ``Spec.max_correctable_delta`` make it suspect. Without a probe (CPU,
standalone) the result says the watch was unavailable.

Verdict per GPU: any mismatching word → fail (a wrong word that got past HBM ECC is never benign).

What is not covered: memory the CUDA context and other processes hold (drain the GPU first), and on
``--device cpu`` the "HBM" is host RAM, so only the pattern and fault-model code is exercised.

Raw output::

    {"gpus": [{"gpu": int, "duration_s": float, "words": int, "chunks": int,
      "passes": [{"pattern": str, "step": str, "mismatches": int, "samples": [{"word": int,
        "address": int, "expected": int, "got": int}]}],
      "ecc_before": {"correctable": int, "uncorrectable": int} | None, "ecc_after": ... | None}],
     "incomplete": str | None, "duration_s": float}
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import time
from collections.abc import Callable, Mapping
from typing import Any

from rasd.validation.checks.tensors import mismatch_indices
from rasd.validation.context import RunContext
from rasd.validation.faults import FaultInjector
from rasd.validation.model import CheckResult, Evidence, GpuResult, Verdict, combine, worst
from rasd.validation.runtime import Device, bits_hex, differing_bits, require_torch, sync

CHECK = "V4"
TITLE = "HBM pattern tests + ECC watch"

QUICK_PATTERNS = ("address", "moving_inversions", "random")
FULL_PATTERNS = ("address", "checkerboard", "walking", "moving_inversions", "random")
_AA = -0x5555555555555556  # 0xAAAAAAAAAAAAAAAA as a signed int64
_55 = 0x5555555555555555


@dataclasses.dataclass(frozen=True)
class Spec:
    """V4 work and thresholds.

    Attributes:
        patterns: pattern names, in order (see the module docstring).
        test_bytes: bytes to test per GPU; None = ``free_fraction`` of the GPU's free memory.
        free_fraction: share of free memory to test when ``test_bytes`` is None.
        chunk_words: int64 words per allocated chunk.
        block_words: words per write/verify step (bounds temporaries; the moving-inversion stride).
        random_passes: random-pattern passes (each with fresh data).
        walking_bits: bits walked in the ``walking`` pattern.
        max_samples: mismatching words recorded per pass.
        max_correctable_delta: correctable ECC errors tolerated during the test; None = not judged.
    """

    patterns: tuple[str, ...] = QUICK_PATTERNS
    test_bytes: int | None = 8 << 20
    free_fraction: float = 0.9
    chunk_words: int = 1 << 18
    block_words: int = 1 << 16
    random_passes: int = 1
    walking_bits: tuple[int, ...] = tuple(range(64))
    max_samples: int = 4
    max_correctable_delta: int | None = None


class _Memory:
    """The chunks under test; every write passes the fault-injection hook."""

    def __init__(self, chunks: list[Any], chunk_words: int, injector: FaultInjector | None, gpu: int) -> None:
        self.chunks = chunks
        self.chunk_words = chunk_words
        self.injector = injector
        self.gpu = gpu

    def blocks(self, block_words: int, descending: bool = False) -> list[tuple[int, int, int]]:
        out = []
        for c, chunk in enumerate(self.chunks):
            for start in range(0, chunk.numel(), block_words):
                out.append((c, start, min(start + block_words, chunk.numel())))
        return out[::-1] if descending else out

    def base(self, chunk_no: int) -> int:
        return chunk_no * self.chunk_words

    def write(self, chunk_no: int, start: int, stop: int, values: Any) -> None:
        chunk = self.chunks[chunk_no]
        chunk[start:stop] = values
        if self.injector is not None:
            self.injector.after_write(CHECK, self.gpu, chunk, self.base(chunk_no), start, stop)


def run(spec: Spec, ctx: RunContext) -> dict[str, Any]:
    """Run the patterns on every device (concurrently on CUDA) with the ECC watch around them."""
    torch = require_torch()
    started = time.monotonic()
    if any(d.kind == "cuda" for d in ctx.devices) and len(ctx.devices) > 1:
        with concurrent.futures.ThreadPoolExecutor(len(ctx.devices)) as pool:
            gpus = list(pool.map(lambda d: _test(torch, spec, ctx, d), ctx.devices))
    else:
        gpus = [_test(torch, spec, ctx, d) for d in ctx.devices]
    incomplete = "budget" if any(g.pop("cut") for g in gpus) else None
    return {"gpus": gpus, "incomplete": incomplete, "duration_s": time.monotonic() - started}


def _allocate(torch: Any, spec: Spec, device: Device) -> list[Any]:
    if spec.test_bytes is not None:
        words = spec.test_bytes // 8
    else:
        free_bytes, _ = torch.cuda.mem_get_info(device.gpu)
        words = int(free_bytes * spec.free_fraction) // 8
    chunks = []
    while words > 0:
        n = min(words, spec.chunk_words)
        try:
            chunks.append(torch.empty(n, dtype=torch.int64, device=device.torch_device))
        except torch.OutOfMemoryError:
            break  # test what could be allocated; the raw output records how much that was
        words -= n
    return chunks


def _test(torch: Any, spec: Spec, ctx: RunContext, device: Device) -> dict[str, Any]:
    started = time.monotonic()
    ecc_before = ctx.ecc_probe(device.gpu) if ctx.ecc_probe is not None else None
    chunks = _allocate(torch, spec, device)
    mem = _Memory(chunks, spec.chunk_words, ctx.injects(CHECK), device.gpu)
    patterns = _Patterns(torch, spec, ctx, mem, device.torch_device)
    cut = False
    for pattern in spec.patterns:
        if ctx.budget.exhausted():
            cut = True
            break
        if not patterns.run(pattern):
            cut = True
    sync(torch, device)
    words_tested = sum(c.numel() for c in chunks)
    chunks.clear()  # drop the test memory before the ECC read-back (the patterns still hold mem)
    ecc_after = ctx.ecc_probe(device.gpu) if ctx.ecc_probe is not None else None
    return {
        "gpu": device.gpu,
        "duration_s": time.monotonic() - started,
        "words": words_tested,
        "chunks": (words_tested + spec.chunk_words - 1) // spec.chunk_words,
        "passes": patterns.passes,
        "ecc_before": dataclasses.asdict(ecc_before) if ecc_before is not None else None,
        "ecc_after": dataclasses.asdict(ecc_after) if ecc_after is not None else None,
        "cut": cut,
    }


class _Patterns:
    """The V4 patterns over one device's test memory; every verify pass is recorded in `passes`."""

    def __init__(self, torch: Any, spec: Spec, ctx: RunContext, mem: _Memory, dev: Any) -> None:
        self.torch = torch
        self.spec = spec
        self.ctx = ctx
        self.mem = mem
        self.dev = dev
        self.passes: list[dict[str, Any]] = []

    def run(self, pattern: str) -> bool:
        """Write and verify one pattern; False when the budget ran out part-way (walking bits)."""
        if pattern == "address":
            self.write_all(self.addresses)
            self.verify("address", "verify w", self.addresses)
            self.write_all(self.inverted_addresses)
            self.verify("address", "verify ~w", self.inverted_addresses)
        elif pattern == "checkerboard":
            for value in (_AA, _55):
                self.write_all(self.const(value))
                self.verify("checkerboard", f"verify {bits_hex(value, 64)}", self.const(value))
        elif pattern == "walking":
            return self.walking()
        elif pattern == "moving_inversions":
            self.moving_inversions()
        elif pattern == "random":
            for pass_no in range(self.spec.random_passes):
                words = self.random_words(pass_no)
                self.write_all(words)
                self.verify("random", f"pass {pass_no}", words)
        else:
            raise ValueError(f"unknown V4 pattern {pattern!r}")
        return True

    def walking(self) -> bool:
        """Walking ones and zeros over the configured bits; False when the budget ran out part-way."""
        for bit in self.spec.walking_bits:
            if self.ctx.budget.exhausted():
                return False
            one = (1 << bit) - (1 << 64) if bit == 63 else 1 << bit
            self.write_all(self.const(one))
            self.verify("walking", f"verify 1<<{bit}", self.const(one))
            self.write_all(self.const(~one))
            self.verify("walking", f"verify ~(1<<{bit})", self.const(~one))
        return True

    def moving_inversions(self) -> None:
        """A seeded word p: ascending verify p and write ~p, descending verify ~p and write p, verify p."""
        torch = self.torch
        g = torch.Generator().manual_seed(self.ctx.seed * 31 + 7)
        p = int(torch.randint(-(2**63), 2**63 - 1, (1,), generator=g, dtype=torch.int64).item())
        self.write_all(self.const(p))
        self.verify("moving_inversions", "ascending: verify p, write ~p", self.const(p), then_write=self.const(~p))
        self.verify("moving_inversions", "descending: verify ~p, write p", self.const(~p), True, self.const(p))
        self.verify("moving_inversions", "verify p", self.const(p))

    def addresses(self, c: int, s: int, e: int) -> Any:
        """Each word's own index in the test memory."""
        return self.torch.arange(self.mem.base(c) + s, self.mem.base(c) + e, dtype=self.torch.int64, device=self.dev)

    def inverted_addresses(self, c: int, s: int, e: int) -> Any:
        """Each word's index, bits inverted."""
        return self.addresses(c, s, e).bitwise_not()

    def const(self, value: int) -> Callable[[int, int, int], Any]:
        """One value in every word."""
        torch, dev = self.torch, self.dev
        return lambda c, s, e: torch.full((e - s,), value, dtype=torch.int64, device=dev)

    def random_words(self, pass_no: int) -> Callable[[int, int, int], Any]:
        """Seeded random words for one pass, reproducible per block."""
        torch, dev, mem, seed = self.torch, self.dev, self.mem, self.ctx.seed

        def gen(c: int, s: int, e: int) -> Any:
            g = torch.Generator(device=dev).manual_seed(
                (seed * 1_000_003 + pass_no * 65_537 + mem.base(c) + s) & 0x7FFF_FFFF_FFFF
            )
            return torch.randint(-(2**63), 2**63 - 1, (e - s,), generator=g, dtype=torch.int64, device=dev)

        return gen

    def write_all(self, values: Callable[[int, int, int], Any]) -> None:
        """Write values block by block, ascending."""
        for c, s, e in self.mem.blocks(self.spec.block_words):
            self.mem.write(c, s, e, values(c, s, e))

    def verify(
        self,
        pattern: str,
        step: str,
        values: Callable[[int, int, int], Any],
        descending: bool = False,
        then_write: Callable[[int, int, int], Any] | None = None,
    ) -> None:
        """Read every block back against values (and write then_write over it), recording one pass."""
        torch, mem = self.torch, self.mem
        count = 0
        samples: list[dict[str, int]] = []
        for c, s, e in mem.blocks(self.spec.block_words, descending):
            expected = values(c, s, e)
            got = mem.chunks[c][s:e]
            n, idx = mismatch_indices(torch, got != expected, self.spec.max_samples - len(samples))
            count += n
            for i in idx:
                samples.append(
                    {
                        "word": mem.base(c) + s + i,
                        "address": mem.chunks[c].data_ptr() + (s + i) * 8,
                        "expected": int(expected[i].item()),
                        "got": int(got[i].item()),
                    }
                )
            if then_write is not None:
                mem.write(c, s, e, then_write(c, s, e))
        self.passes.append({"pattern": pattern, "step": step, "mismatches": count, "samples": samples})


def _interpret(pass_: Mapping[str, Any], sample: Mapping[str, int], words: int) -> str:
    """A hint for the memory engineer about one wrong read in the address pattern.

    A word holding another word's address points at aliasing, unless it is one bit off, which a stuck
    or coupled bit also explains.
    """
    other = _address_held(pass_, sample, words)
    if other is None:
        return ""
    if len(differing_bits(sample["expected"], sample["got"], 64)) == 1:
        return f"one bit off; also the address of word {other} (stuck/coupled bit or aliasing)"
    return f"holds the address of word {other}: address aliasing / decoder fault"


def _address_held(pass_: Mapping[str, Any], sample: Mapping[str, int], words: int) -> int | None:
    """The other word whose address a wrong read in the address pattern holds, if any."""
    if pass_["pattern"] != "address":
        return None
    other = sample["got"] if pass_["step"] == "verify w" else ~sample["got"]
    return other if 0 <= other < words and other != sample["word"] else None


def diagnose(samples: list[tuple[int, int, int]], aliases: Mapping[int, int] | None = None) -> str:
    """Per-word summary over all patterns.

    A word whose wrong reads all differ in the same single bit has a stuck (always the same wrong
    value) or flipping bit; a word that read another word's address and is otherwise garbled is
    aliased with that word.

    Args:
        samples: (word, expected, got) for every recorded mismatch.
        aliases: word -> the other word whose address it held in the address pattern.
    """
    aliases = aliases or {}
    by_word: dict[int, list[tuple[int, int]]] = {}
    for word, expected, got in samples:
        by_word.setdefault(word, []).append((expected, got))
    notes = []
    for word, pairs in sorted(by_word.items())[:4]:
        flips = {tuple(differing_bits(e, g, 64)) for e, g in pairs}
        if len(flips) == 1 and len(next(iter(flips))) == 1:
            bit = next(iter(flips))[0]
            values = {(g >> bit) & 1 for _, g in pairs}
            stuck = f"stuck at {values.pop()}" if len(values) == 1 else "flipping"
            notes.append(f"word {word} bit {bit} {stuck} ({len(pairs)} reads)")
        elif word in aliases:
            notes.append(f"word {word} aliased with word {aliases[word]} ({len(pairs)} reads)")
        else:
            notes.append(f"word {word}: {len(pairs)} wrong reads, {len(flips)} different bit patterns")
    return "; ".join(notes)


def judge(raw: Mapping[str, Any], spec: Spec) -> CheckResult:
    """Any mismatching word fails the GPU; the ECC deltas fail or flag it. Pure."""
    per_gpu = []
    for g in raw["gpus"]:
        bad = [p for p in g["passes"] if p["mismatches"] > 0]
        evidence = []
        for p in bad:
            for s in p["samples"]:
                flips = differing_bits(s["expected"], s["got"], 64)
                evidence.append(
                    Evidence(
                        case=f"{p['pattern']}: {p['step']}",
                        location=(
                            f"word {s['word']} (byte offset {s['word'] * 8:#x}, address {s['address']:#x}) "
                            f"bit {','.join(map(str, flips))}"
                        ),
                        expected=bits_hex(s["expected"], 64),
                        got=bits_hex(s["got"], 64),
                        note=_interpret(p, s, g["words"]),
                    )
                )
        parts = [Verdict.FAIL if bad else Verdict.PASS]
        mib = g["words"] * 8 / 2**20
        if bad:
            words_bad = sum(p["mismatches"] for p in bad)
            aliases = {}
            for p in bad:
                for s in p["samples"]:
                    other = _address_held(p, s, g["words"])
                    if other is not None:
                        aliases[s["word"]] = other
            summary = diagnose([(s["word"], s["expected"], s["got"]) for p in bad for s in p["samples"]], aliases)
            hint = next((e.note for e in evidence if e.note), "")
            reason = f"V4 {words_bad} wrong word reads in {len(bad)} pattern step(s): {summary}"
            reason += f"; {hint}" if hint else ""
        else:
            reason = f"{mib:.1f} MiB x {len(g['passes'])} pattern steps clean"
        before, after = g.get("ecc_before"), g.get("ecc_after")
        if before is None or after is None:
            reason += "; ECC watch unavailable"
        else:
            new_ue = after["uncorrectable"] - before["uncorrectable"]
            new_ce = after["correctable"] - before["correctable"]
            if new_ue > 0:
                parts.append(Verdict.FAIL)
                reason += f"; {new_ue} new uncorrectable ECC error(s) during the test"
                evidence.append(Evidence("ECC watch", "volatile uncorrectable", "+0", f"+{new_ue}"))
            if spec.max_correctable_delta is not None and new_ce > spec.max_correctable_delta:
                parts.append(Verdict.SUSPECT)
                reason += f"; {new_ce} new correctable ECC error(s) (> {spec.max_correctable_delta})"
                evidence.append(
                    Evidence("ECC watch", "volatile correctable", f"<= +{spec.max_correctable_delta}", f"+{new_ce}")
                )
        if g["words"] == 0:
            parts = [Verdict.INCOMPLETE, *parts[1:]]
            reason = "no memory could be allocated to test"
        per_gpu.append(GpuResult(g["gpu"], worst(parts), reason, tuple(evidence[:8]), g["duration_s"]))
    return combine(
        CHECK,
        TITLE,
        per_gpu,
        incomplete=raw.get("incomplete"),
        duration_s=raw["duration_s"],
        details={"patterns": list(spec.patterns), "words": {str(g["gpu"]): g["words"] for g in raw["gpus"]}},
    )
