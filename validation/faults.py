"""Fault injection: the documented hook through which ``--inject-fault`` proves each check can fail.

A ``FaultInjector`` is handed to every run() adapter. Adapters call it at three points, and only there:

- ``corrupt_output(check, gpu, tensor, case)`` right after a result tensor is produced (GEMM output,
  received transfer buffer, collective output). ``bitflip`` XORs one bit of one element in place.
- ``after_write(check, gpu, chunk, chunk_base_word, start, stop)`` after the memory test writes words
  ``[start, stop)`` of a chunk. ``stuck-bit``, ``coupling``, ``alias`` and ``bitflip`` rewrite the
  chunk's storage there, as faulty DRAM cells would.
- ``drifted(check, tensor)`` where V2 looks up its golden: ``drift`` returns a golden computed from the
  healthy result with one low-order bit changed on every GPU alike, i.e. a golden recorded by a
  different software stack. Every GPU then agrees with its peers and not with the golden.

Fault kinds and the checks that must catch them (``FAULT_CHECKS``):

==========  =============================  ====================================================
kind        checks                         model
==========  =============================  ====================================================
bitflip     V1 V2 V3 V4 V5 V6              bit ``bit`` of element ``index`` XORed
stuck-bit   V4                             bit ``bit`` of word ``index`` stuck at ``stuck_value``
coupling    V4                             a write to word ``index`` copies its bit ``bit`` into
                                           the neighbouring word (idempotent coupling fault)
alias       V4                             words ``index`` and ``index + alias_distance_words``
                                           are one cell: the later write wins, both read it
drift       V2                             golden differs from this node's (healthy) answer
==========  =============================  ====================================================

Defaults, chosen so the failure location is predictable: ``gpu`` is the last GPU under test,
``index`` is the middle element (``numel // 2``) or the middle word of the first memory chunk,
``bit`` is the top exponent bit of floats (width - 2) for ``bitflip``, bit 13 for ``stuck-bit`` and
bit 0 for ``coupling`` (neighbouring addresses always differ in bit 0). ``occurrences=None`` makes
the fault persistent; ``occurrences=1`` makes it a one-off, which checks report as ``suspect``.
Every injection is appended to ``log`` so tests can compare it with the reported location.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any

from rasd.validation.runtime import int_view, require_torch


class FaultKind(enum.StrEnum):
    """Fault classes that ``--inject-fault`` can inject."""

    BITFLIP = "bitflip"
    STUCK_BIT = "stuck-bit"
    COUPLING = "coupling"
    ALIAS = "alias"
    DRIFT = "drift"


FAULT_CHECKS: dict[FaultKind, frozenset[str]] = {
    FaultKind.BITFLIP: frozenset({"V1", "V2", "V3", "V4", "V5", "V6"}),
    FaultKind.STUCK_BIT: frozenset({"V4"}),
    FaultKind.COUPLING: frozenset({"V4"}),
    FaultKind.ALIAS: frozenset({"V4"}),
    FaultKind.DRIFT: frozenset({"V2"}),
}

_MEMORY_KINDS = {FaultKind.STUCK_BIT, FaultKind.COUPLING, FaultKind.ALIAS, FaultKind.BITFLIP}


@dataclasses.dataclass(frozen=True)
class Injection:
    """A record of one injected fault: where it went."""

    check: str
    gpu: int
    case: str
    index: int
    bit: int | None


@dataclasses.dataclass
class FaultInjector:
    """Corrupts results or memory of one GPU for the checks of its fault class.

    Attributes:
        kind: the fault class.
        gpu: the GPU (or CPU slot) whose results or memory are corrupted.
        checks: restrict to these check ids; None means every check in ``FAULT_CHECKS[kind]``.
        bit: bit position to corrupt; None picks the documented default for the kind.
        index: flat element or word index; None picks the middle element / word.
        occurrences: how many times the fault fires per check; None = every time (persistent).
        stuck_value: the value a stuck bit is stuck at (0 or 1).
        alias_distance_words: distance in 8-byte words between two aliased addresses.
        log: injections done so far.
    """

    kind: FaultKind
    gpu: int
    checks: frozenset[str] | None = None
    bit: int | None = None
    index: int | None = None
    occurrences: int | None = None
    stuck_value: int = 1
    alias_distance_words: int = 1024
    log: list[Injection] = dataclasses.field(default_factory=list)
    _fired: dict[str, int] = dataclasses.field(default_factory=dict)

    def applies(self, check: str, gpu: int | None = None) -> bool:
        """Whether this injector targets ``check`` (and ``gpu``, when given)."""
        wanted = FAULT_CHECKS[self.kind] if self.checks is None else self.checks & FAULT_CHECKS[self.kind]
        return check in wanted and (gpu is None or gpu == self.gpu)

    def _take(self, check: str) -> bool:
        fired = self._fired.get(check, 0)
        if self.occurrences is not None and fired >= self.occurrences:
            return False
        self._fired[check] = fired + 1
        return True

    def describe(self) -> dict[str, Any]:
        """JSON-able description for the report."""
        return {
            "kind": self.kind.value,
            "gpu": self.gpu,
            "checks": sorted(self.checks) if self.checks is not None else sorted(FAULT_CHECKS[self.kind]),
            "bit": self.bit,
            "index": self.index,
            "occurrences": self.occurrences,
        }

    # -- results ---------------------------------------------------------------------------------

    def corrupt_output(self, check: str, gpu: int, tensor: Any, case: str) -> None:
        """Flip one bit of one element of ``tensor`` in place (``bitflip`` only).

        Args:
            check: the calling check's id.
            gpu: the GPU the tensor belongs to.
            tensor: a contiguous result tensor.
            case: the calling check's case label, recorded in ``log``.
        """
        if self.kind is not FaultKind.BITFLIP or not self.applies(check, gpu) or not self._take(check):
            return
        torch = require_torch()
        flat = int_view(torch, tensor).view(-1)
        width = tensor.element_size() * 8
        index = (flat.numel() // 2 if self.index is None else self.index) % flat.numel()
        bit = width - 2 if self.bit is None else self.bit
        flat[index] ^= _signed_mask(bit, width)
        self.log.append(Injection(check, gpu, case, index, bit))

    def drifted(self, check: str, tensor: Any) -> Any:
        """A copy of a healthy result with the lowest bit of its middle element changed (``drift``).

        Returns None when this injector does not drift ``check``'s golden.
        """
        if self.kind is not FaultKind.DRIFT or not self.applies(check):
            return None
        torch = require_torch()
        copy = tensor.clone()
        flat = int_view(torch, copy).view(-1)
        index = flat.numel() // 2 if self.index is None else self.index % flat.numel()
        flat[index] ^= 1
        self.log.append(Injection(check, -1, "golden", index, 0))
        return copy

    # -- memory ----------------------------------------------------------------------------------

    def target_word(self, chunk_words: int) -> int:
        """The word index (in the whole tested region) a memory fault sits at."""
        return chunk_words // 2 if self.index is None else self.index

    def after_write(self, check: str, gpu: int, chunk: Any, chunk_base_word: int, start: int, stop: int) -> None:
        """Apply a memory fault model after words ``[start, stop)`` of ``chunk`` were written.

        Args:
            check: the calling check's id.
            gpu: the GPU the chunk lives on.
            chunk: a 1-D int64 tensor, one chunk of the memory under test.
            chunk_base_word: index of ``chunk[0]`` in the whole tested region.
            start: first written word, relative to the chunk.
            stop: one past the last written word, relative to the chunk.
        """
        if self.kind not in _MEMORY_KINDS or not self.applies(check, gpu):
            return
        n = chunk.numel()
        word = self.target_word(n) - chunk_base_word
        if not 0 <= word < n:
            return
        if self.kind is FaultKind.ALIAS:
            self._alias(check, gpu, chunk, chunk_base_word, word, start, stop)
            return
        if not start <= word < stop or not self._take(check):
            return
        if self.kind is FaultKind.STUCK_BIT:
            bit = 13 if self.bit is None else self.bit
            mask = _signed_mask(bit, 64)
            chunk[word] = chunk[word] | mask if self.stuck_value else chunk[word] & ~mask
            self.log.append(Injection(check, gpu, "memory", chunk_base_word + word, bit))
        elif self.kind is FaultKind.COUPLING:
            bit = 0 if self.bit is None else self.bit
            victim = word + 1 if word + 1 < n else word - 1
            mask = _signed_mask(bit, 64)
            chunk[victim] = (chunk[victim] & ~mask) | (chunk[word] & mask)
            self.log.append(Injection(check, gpu, "memory", chunk_base_word + victim, bit))
        else:  # BITFLIP: a cell upset after the write
            bit = 62 if self.bit is None else self.bit
            chunk[word] ^= _signed_mask(bit, 64)
            self.log.append(Injection(check, gpu, "memory", chunk_base_word + word, bit))

    def _alias(self, check: str, gpu: int, chunk: Any, base: int, word: int, start: int, stop: int) -> None:
        n = chunk.numel()
        other = word + self.alias_distance_words
        if other >= n:
            other = word - self.alias_distance_words
        if not 0 <= other < n:
            return
        lo, hi = min(word, other), max(word, other)
        lo_written, hi_written = start <= lo < stop, start <= hi < stop
        if not (lo_written or hi_written) or not self._take(check):
            return
        # One physical cell: the later write wins. Within one ascending write the higher address is
        # written last; when only one of the two was written, that write is the latest.
        if hi_written:
            chunk[lo] = chunk[hi]
            self.log.append(Injection(check, gpu, "memory", base + lo, None))
        else:
            chunk[hi] = chunk[lo]
            self.log.append(Injection(check, gpu, "memory", base + hi, None))


def _signed_mask(bit: int, width: int) -> int:
    """``1 << bit`` as a signed ``width``-bit integer (bit ``width - 1`` is negative)."""
    mask = 1 << bit
    return mask - (1 << width) if bit == width - 1 else mask
