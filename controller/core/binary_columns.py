"""Columns of values as raw numbers: how aggregate format 3 carries the readings and peaks.

At fleet scale the leader reads six aggregates of about 17,000 GPUs each per second. In JSON most
of that text is numbers (three nanosecond timestamps, draws, limits, peaks per GPU), and reading it
was most of the leader's decode. Here a column whose values are all integers (int64) or all
numbers (float64), None allowed, travels as little-endian 8-byte values, with a byte per value
marking the None where there is any; a column of nothing but None travels as its length; any
other column (bools, tuples, strings, integers beyond int64) stays a JSON list. So a field added to
a reading travels as it is, and the reader gets back the values it was sent: ints as ints, floats
as floats (a NaN too, which JSON cannot carry), None as None.

`pack` gives each column's spec (plain data for a JSON header) and the bytes of all of them one
after the other; `unpack` reads them back, and refuses specs and bytes that do not agree.

Pure: no I/O.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

_DTYPES = {"i8": np.dtype("<i8"), "f8": np.dtype("<f8")}
_NONE = type(None)
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


@dataclasses.dataclass(frozen=True, eq=False)
class Column:
    """One column read back: its values, and for a numeric one the array they came from."""

    values: list[Any]
    """The values as they were packed (None where there was None)."""
    array: np.ndarray | None
    """The numbers (0 where a value is None; `nulls` says where), None for a column packed as JSON."""
    nulls: np.ndarray | None
    """True where the value is None (None: no value is)."""

    def filled(self, dtype: type, fill: Any) -> np.ndarray:
        """The column as an array of dtype, fill where a value is None.

        Example: clock event reasons [4, None] as int64 with 0 → [4, 0].
        """
        if self.array is None:
            return np.array([fill if v is None else v for v in self.values], dtype=dtype)
        out = self.array.astype(dtype)  # a copy: the array reads the decoded bytes, which are read-only
        if self.nulls is not None:
            out[self.nulls] = fill
        return out


def _kind(values: Sequence[Any]) -> str:
    """How a column travels: "none", "i8", "f8" or "json" (see the module docstring)."""
    types = set(map(type, values))
    types.discard(_NONE)
    if not types:
        return "none"
    if types == {int}:
        ints = [v for v in values if v is not None] if None in values else values
        return "i8" if min(ints) >= _INT64_MIN and max(ints) <= _INT64_MAX else "json"
    if types <= {int, float}:
        return "f8"
    return "json"


def pack(columns: Mapping[str, Sequence[Any]]) -> tuple[list[dict[str, Any]], bytes]:
    """(each column's spec, their bytes in spec order) for columns by name."""
    specs: list[dict[str, Any]] = []
    parts: list[bytes] = []
    for name, values in columns.items():
        kind = _kind(values)
        spec: dict[str, Any] = {"name": name, "kind": kind, "count": len(values)}
        if kind == "json":
            spec["values"] = list(values)
        elif kind != "none":
            has_nulls = None in values
            filled = [0 if v is None else v for v in values] if has_nulls else values
            parts.append(np.array(filled, dtype=_DTYPES[kind]).tobytes())
            if has_nulls:
                parts.append(np.fromiter((v is None for v in values), dtype=np.bool_, count=len(values)).tobytes())
            spec["nulls"] = has_nulls
        specs.append(spec)
    return specs, b"".join(parts)


def unpack(specs: Sequence[Mapping[str, Any]], data: bytes | memoryview) -> tuple[dict[str, Column], int]:
    """(the columns by name, the bytes they took) of `pack`'s specs over data (which may go on after them).

    Raises:
        ValueError: a spec of an unknown kind or a negative count, or data shorter than the specs announce.
    """
    out: dict[str, Column] = {}
    offset = 0
    for spec in specs:
        kind, count = spec["kind"], int(spec["count"])
        if count < 0:
            raise ValueError(f"column {spec['name']!r}: count {count}")
        if kind == "json":
            values = list(spec["values"])
            if len(values) != count:
                raise ValueError(f"column {spec['name']!r}: {len(values)} values, count {count}")
            out[spec["name"]] = Column(values, None, None)
            continue
        if kind == "none":
            out[spec["name"]] = Column([None] * count, None, None)
            continue
        if kind not in _DTYPES:
            raise ValueError(f"column {spec['name']!r}: unknown kind {kind!r}")
        size = count * 8 + (count if spec["nulls"] else 0)
        if offset + size > len(data):
            raise ValueError(f"column {spec['name']!r}: {size} bytes announced, {len(data) - offset} left")
        array = np.frombuffer(data, dtype=_DTYPES[kind], count=count, offset=offset)
        values = array.tolist()
        nulls = None
        if spec["nulls"]:
            nulls = np.frombuffer(data, dtype=np.bool_, count=count, offset=offset + count * 8)
            for i in np.flatnonzero(nulls).tolist():
                values[i] = None
        out[spec["name"]] = Column(values, array, nulls)
        offset += size
    return out, offset
