"""V2's golden store: a JSON file of known-good GEMM bit patterns keyed by hardware and software.

Layout::

    {"format": 1, "goldens": {"<key string>": {"<case id>": {"digest": sha256-hex,
                                                             "row_sums": [int], "col_sums": [int]}}}}

The key string (``runtime.key_string``) names GPU model, SM count, compute capability and the torch,
CUDA and cuBLAS versions: cuBLAS is bitwise reproducible only within one such key. The case id names
dtype, shape, value range and seed. Row and column bit-sums let a mismatch be located to an element.

Nothing is recorded automatically: a golden must come from a run whose GPUs agreed unanimously
(``rasd-validate --record-golden``), so a single faulty GPU can never define "correct".
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

FORMAT = 1

Goldens = dict[str, dict[str, dict[str, Any]]]


def load(path: str | os.PathLike[str]) -> Goldens:
    """Read a golden file; a missing file is an empty store.

    Raises:
        ValueError: the file exists but is not a golden store of this format.
    """
    p = Path(path)
    if not p.exists():
        return {}
    data = json.loads(p.read_text())
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ValueError(f"{p}: not a rasd golden store (format {FORMAT})")
    return {str(k): dict(v) for k, v in data["goldens"].items()}


def merge(existing: Goldens, new: Mapping[str, Mapping[str, Mapping[str, Any]]]) -> Goldens:
    """``existing`` with ``new``'s entries added or replaced, key by key and case by case."""
    out = {k: dict(v) for k, v in existing.items()}
    for key, cases in new.items():
        out.setdefault(key, {}).update({c: dict(e) for c, e in cases.items()})
    return out


def save(path: str | os.PathLike[str], goldens: Goldens) -> None:
    """Write the store atomically (write a temporary file, then rename over the old one)."""
    p = Path(path)
    tmp = p.with_suffix(p.suffix + ".tmp")
    tmp.write_text(json.dumps({"format": FORMAT, "goldens": goldens}, sort_keys=True))
    tmp.replace(p)
