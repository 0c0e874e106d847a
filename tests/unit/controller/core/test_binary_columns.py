"""Columns of numbers as raw 8-byte values (`core.binary_columns`): what goes in comes back, bad bytes are refused."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from rasd.controller.core import binary_columns

VALUES = st.one_of(
    st.lists(st.one_of(st.none(), st.integers(min_value=-(2**70), max_value=2**70)), max_size=20),
    st.lists(st.one_of(st.none(), st.floats(allow_nan=True), st.integers(-(2**40), 2**40)), max_size=20),
    st.lists(st.one_of(st.none(), st.booleans(), st.tuples(st.integers(0, 16), st.integers(0, 16))), max_size=20),
    st.lists(st.none(), max_size=5),
)


def _same(a, b) -> bool:
    if isinstance(a, float) and math.isnan(a):
        return isinstance(b, float) and math.isnan(b)
    if isinstance(a, tuple):
        return list(a) == list(b)  # JSON has no tuple
    # A column of numbers is float64: an integer among floats comes back a float of its value.
    return a == b and (type(a) is type(b) or (type(a) is int and type(b) is float))


@given(st.dictionaries(st.text(min_size=1, max_size=8), VALUES, max_size=4))
def test_every_column_comes_back_as_it_went(columns):
    specs, data = binary_columns.pack(columns)
    back, used = binary_columns.unpack(specs, data + b"more after")
    assert used == len(data) and list(back) == list(columns)
    for name, values in columns.items():
        got = back[name].values
        assert len(got) == len(values) and all(_same(a, b) for a, b in zip(values, got, strict=True)), name


def test_numbers_travel_raw_and_the_rest_as_json():
    specs, data = binary_columns.pack(
        {
            "ns": [1_800_000_000_000_000_000, None, 5],
            "w": [612.5, 700, math.nan],
            "flag": [True, None, False],
            "none": [None, None],
            "huge": [2**64, 1],
        }
    )
    assert [(s["kind"], s.get("nulls")) for s in specs] == [
        ("i8", True),
        ("f8", False),
        ("json", None),
        ("none", None),
        ("json", None),
    ]
    assert len(data) == 3 * 8 + 3 + 3 * 8, "8 bytes a number, a byte a value where any is None"
    back, _ = binary_columns.unpack(specs, data)
    assert back["ns"].values == [1_800_000_000_000_000_000, None, 5]
    assert back["ns"].filled(np.int64, -1).tolist() == [1_800_000_000_000_000_000, -1, 5]
    assert back["ns"].array.tolist() == [1_800_000_000_000_000_000, 0, 5], "the array itself is left as sent"
    assert back["w"].values[:2] == [612.5, 700.0] and math.isnan(back["w"].values[2])
    assert back["flag"].filled(np.float64, math.nan).tolist()[:1] == [1.0]
    assert back["none"].values == [None, None] and back["huge"].values == [2**64, 1]


@pytest.mark.parametrize(
    ("specs", "data", "complaint"),
    [
        ([{"name": "w", "kind": "f8", "count": 3, "nulls": False}], b"\x00" * 16, "24 bytes announced, 16 left"),
        ([{"name": "w", "kind": "f8", "count": 2, "nulls": True}], b"\x00" * 16, "18 bytes announced, 16 left"),
        ([{"name": "w", "kind": "f4", "count": 1, "nulls": False}], b"\x00" * 8, "unknown kind 'f4'"),
        ([{"name": "w", "kind": "f8", "count": -1, "nulls": False}], b"", "count -1"),
        ([{"name": "w", "kind": "json", "count": 2, "values": [1]}], b"", "1 values, count 2"),
    ],
)
def test_specs_and_bytes_that_do_not_agree_are_refused_with_why(specs, data, complaint):
    with pytest.raises(ValueError, match=complaint):
        binary_columns.unpack(specs, data)
