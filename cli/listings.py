"""How rasctl shows a listing in each ``-o`` form, and follows it with ``--watch``.

Table (no ``-o``) and ``wide``: aligned columns (`views`, `remediation_views`). ``json``: one JSON
array; ``yaml``: one YAML list (PyYAML's safe emitter); ``name``: one ``KIND/NAME`` per line. Under
``--watch`` the listing comes first, then each change as it arrives: table rows without the header
again, one compact JSON object per line, one YAML document per change (``---``), or names.
"""

from __future__ import annotations

import dataclasses
import json
import re
import time
from collections.abc import Callable, Iterable
from datetime import datetime
from typing import Any, TextIO

from rasd.cli import output


@dataclasses.dataclass(frozen=True)
class Listing:
    """One kind of item rasctl lists."""

    kind: str
    """The ``-o name`` prefix: node, event, incident, ..."""
    rows: Callable[[list[Any], int, bool], output.Rows]
    """(items, now, wide) → the table."""
    name: Callable[[Any], str]
    to_json: Callable[[list[Any]], list[Any]] = lambda items: [output.message_json(m) for m in items]
    footer: Callable[[list[Any], TextIO], None] | None = None
    """What a table prints under its rows (the fleet's totals)."""


def render(listing: Listing, items: list[Any], form: str, now: int, out: TextIO) -> None:
    """Print items as form asks ("" is a table)."""
    if form == "json":
        output.dump_json(listing.to_json(items), out)
    elif form == "yaml":
        dump_yaml(listing.to_json(items), out)
    elif form == "name":
        for item in items:
            print(output.printable(f"{listing.kind}/{listing.name(item)}"), file=out)
    else:
        output.table(*listing.rows(items, now, form == "wide"), out)
        if listing.footer is not None:
            listing.footer(items, out)


def render_change(listing: Listing, items: list[Any], form: str, now: int, out: TextIO) -> None:
    """Print items that changed during a --watch, as form asks, and flush (a pipe reader sees them at once)."""
    if form == "json":
        for data in listing.to_json(items):
            out.write(json.dumps(data, separators=(",", ":")) + "\n")
    elif form == "yaml":
        for data in listing.to_json(items):
            out.write("---\n")
            dump_yaml(data, out)
    elif form == "name":
        for item in items:
            print(output.printable(f"{listing.kind}/{listing.name(item)}"), file=out)
    elif items:
        output.table(*listing.rows(items, now, form == "wide"), out, header=False)
    out.flush()


def dump(data: Any, form: str, out: TextIO) -> None:
    """data as YAML for form "yaml", else as JSON."""
    if form == "yaml":
        dump_yaml(data, out)
    else:
        output.dump_json(data, out)


def dump_yaml(data: Any, out: TextIO) -> None:
    """data as block YAML (PyYAML's safe dumper: plain data only), keys in their order."""
    import yaml  # imported when asked for: rasctl starts faster without it

    yaml.safe_dump(data, out, sort_keys=False, default_flow_style=False, allow_unicode=False)


def follow(
    listing: Listing, answers: Iterable[Any], items_of: Callable[[Any], list[Any]], form: str, out: TextIO, err: TextIO
) -> None:
    """Print each watch answer's items as they come; a resync answer is said on err first."""
    for answer in answers:
        if answer.resync:
            print("rasctl: the watch fell behind and changes were dropped; the current state follows", file=err)
        render_change(listing, list(items_of(answer)), form, time.time_ns(), out)


_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def since_unix_ns(text: str, now_unix_ns: int) -> int:
    """--since as unix ns: a duration before now ("10m", "2h", "1h30m") or an RFC 3339 time; 0 for "".

    Raises:
        ValueError: neither, naming what was given and what is taken.
    """
    if not text:
        return 0
    if _DURATION.fullmatch(text) or re.fullmatch(f"(?:{_DURATION.pattern})+", text):
        seconds = sum(float(n) * _UNIT_S[unit] for n, unit in _DURATION.findall(text))
        return max(1, now_unix_ns - int(seconds * 1e9))
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        moment = None
    if moment is None or moment.tzinfo is None or "T" not in text.upper():
        raise ValueError(
            f"--since {text!r}: give a duration (10m, 2h, 1h30m) or an RFC 3339 time with its zone "
            "(2026-12-05T08:00:00Z)"
        )
    return int(moment.timestamp() * 1e9)
