"""torch helpers shared by the run() adapters: comparing tensors and describing mismatches as raw data.

Only run() adapters import this module (it needs torch); judges read the plain data it produces.
"""

from __future__ import annotations

import hashlib
from types import ModuleType
from typing import Any

from rasd.validation.runtime import int_view


def mismatch_indices(torch: ModuleType, mask: Any, limit: int) -> tuple[int, list[int]]:
    """Count the True entries of a boolean ``mask`` and return the first ``limit`` flat indices.

    The count and the indices are the only data that cross to the host, so a clean result on a large
    GPU tensor costs one reduction.
    """
    count = int(mask.sum().item())
    if count == 0:
        return 0, []
    flat = mask.reshape(-1)
    return count, [int(i) for i in flat.nonzero()[:limit, 0].tolist()]


def element_bits(torch: ModuleType, tensor: Any, flat_index: int) -> int:
    """The bit pattern of one element of ``tensor``, as a signed integer of the element's width."""
    return int(int_view(torch, tensor.contiguous()).reshape(-1)[flat_index].item())


def sha256_bits(torch: ModuleType, tensor: Any) -> str:
    """SHA-256 over the exact bit pattern of ``tensor`` (copied to the host)."""
    host = int_view(torch, tensor.detach().contiguous()).cpu().numpy()
    return hashlib.sha256(host.tobytes()).hexdigest()


def row_col_bitsums(torch: ModuleType, tensor: Any) -> tuple[list[int], list[int]]:
    """Per-row and per-column sums of a 2-D tensor's bit patterns (as int64, wrapping).

    A single flipped bit at (i, j) changes row sum i and column sum j by exactly ±2**bit, which is
    how V2 locates a deviating element without shipping the whole matrix.
    """
    bits = int_view(torch, tensor.contiguous()).to(torch.int64)
    return bits.sum(dim=1).tolist(), bits.sum(dim=0).tolist()
