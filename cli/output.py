"""Rendering of rasctl output: aligned text tables for people, JSON for machines.

Text for people shows what nodes and callers wrote with control characters escaped (`printable`):
every table cell is, and each view passes the strings it prints outside a table through it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, TextIO

from rasd.common import text

if TYPE_CHECKING:
    from google.protobuf.message import Message

Rows = tuple[list[str], list[list[Any]]]
"""A table: its headers and its rows (each cell any value; numbers are right-aligned)."""

printable = text.printable
"""Escape control characters, line breaks and bidirectional overrides (`rasd.common.text.printable`)."""


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]], out: TextIO, *, header: bool = True) -> None:
    """Print rows under headers with columns padded to width; numbers right-aligned; each cell `printable`.

    header: False leaves the header line out (a --watch prints it once, with the listing).
    """
    text_rows = [[printable(str(cell)) for cell in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in text_rows:
        widths = [max(w, len(cell)) for w, cell in zip(widths, row, strict=True)]
    numeric = [bool(rows) and all(isinstance(row[i], int | float) for row in rows) for i in range(len(headers))]

    def fmt(cells: Sequence[str]) -> str:
        return "  ".join(
            cell.rjust(width) if is_num else cell.ljust(width)
            for cell, width, is_num in zip(cells, widths, numeric, strict=True)
        ).rstrip()

    if header:
        print(fmt(headers), file=out)
    for row in text_rows:
        print(fmt(row), file=out)


def message_json(message: Message) -> dict[str, Any]:
    """A protobuf message as a JSON-ready dict with the proto field names and enums as names."""
    from google.protobuf import json_format  # imported when needed: rasctl starts faster without it

    return json_format.MessageToDict(
        message, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )


def dump_json(data: Any, out: TextIO) -> None:
    """Pretty JSON plus a newline."""
    json.dump(data, out, indent=2, sort_keys=False)
    out.write("\n")


def age(now_unix_ns: int, then_unix_ns: int) -> str:
    """Age of a timestamp such as "3s ago"; "never" for 0."""
    if then_unix_ns <= 0:
        return "never"
    seconds = max(0.0, (now_unix_ns - then_unix_ns) / 1e9)
    if seconds < 120:
        return f"{seconds:.0f}s ago"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m ago"
    return f"{seconds / 3600:.1f}h ago"


def timestamp(unix_ns: int) -> str:
    """An RFC 3339 UTC time to the second ("2026-12-05T08:00:00Z"); "-" for 0."""
    if unix_ns <= 0:
        return "-"
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(unix_ns / 1e9))
