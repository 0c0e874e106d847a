"""Pages of a listing, newest first: bounded in rows and in bytes, and resumable where the last one ended.

An operator listing (events, audit records, incidents, repairs, validations) used to read every row
it asked for at once: 10,000 events of 4 KiB messages built a 41 MB answer, larger than any gRPC
message allows, on the thread that ingestion needs. A page here stops at `limit` rows or once the
rows it holds would pass `max_bytes` (always at least one row), reading the rows a few at a time
so that a page's cost is bounded by what it returns; and it says where the next page starts.

Order is descending on (an order column, the table's key): a keyset, so the next page is a range
scan from where this one ended, not an offset that rereads everything before it, and rows that
arrive meanwhile do not shift it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, Generic, TypeVar

import sqlalchemy as sa
from sqlalchemy.orm import Session

ItemT = TypeVar("ItemT")

Position = tuple[int, int | str]
"""Where a page ended: the last row's (order value, key); the next page starts after it."""

FETCH_ROWS = 64
"""Rows fetched from the database at a time while a page is filled."""


@dataclasses.dataclass(frozen=True)
class Page(Generic[ItemT]):
    """Rows of one page, and where the next starts (None: there is no next)."""

    items: list[ItemT]
    next_after: Position | None


def read_page(
    session: Session,
    query: sa.Select[Any],
    *,
    order: sa.ColumnElement[Any],
    key: sa.ColumnElement[Any],
    after: Position | None,
    limit: int,
    max_bytes: int | None,
    convert: Callable[[Any], ItemT],
    size_of: Callable[[ItemT], int],
) -> Page[ItemT]:
    """One page of query's rows (ORM entities), newest first by (order, key), after the position `after`.

    Args:
        session: where to read.
        query: a select of one entity, filtered as the listing asks.
        order: the column the listing is ordered by (descending).
        key: the table's key, breaking ties of order.
        after: the position a previous page ended at, or None for the first page.
        limit: rows at most (at least 1).
        max_bytes: the page holds rows until the next would take the sum of `size_of` past this
            (None: no byte bound); it holds the first row whatever its size.
        convert: a row to what the page holds.
        size_of: what an item takes on the wire, in bytes, about.
    """
    limit = max(1, limit)
    if after is not None:
        last_order, last_key = after
        query = query.where(sa.or_(order < last_order, sa.and_(order == last_order, key < last_key)))
    query = query.order_by(order.desc(), key.desc()).limit(limit + 1)
    items: list[ItemT] = []
    positions: list[Position] = []
    used = 0
    more = False
    rows = session.scalars(query.execution_options(yield_per=FETCH_ROWS))
    try:
        for row in rows:
            item = convert(row)
            size = size_of(item)
            if len(items) == limit or (items and max_bytes is not None and used + size > max_bytes):
                more = True
                break
            items.append(item)
            positions.append(_position_of(row, order, key))
            used += size
    finally:
        rows.close()  # a page that ends early leaves rows unread (a server-side cursor on PostgreSQL)
    return Page(items, positions[-1] if more else None)


def _position_of(row: Any, order: sa.ColumnElement[Any], key: sa.ColumnElement[Any]) -> Position:
    return int(getattr(row, order.key)), getattr(row, key.key)  # type: ignore[attr-defined]


def text_bytes(*texts: str) -> int:
    """The UTF-8 size of some text fields (what they take in a protobuf message, about)."""
    return sum(len(text.encode()) for text in texts)


def mapping_bytes(values: Mapping[str, Any]) -> int:
    """About what a stored row or a JSON document takes on the wire: its text, and 8 bytes for anything else."""
    total = 0
    for name, value in values.items():
        total += len(name) + 2
        if isinstance(value, str):
            total += len(value.encode())
        elif isinstance(value, Mapping):
            total += mapping_bytes(value)
        elif isinstance(value, list | tuple):
            total += sum(mapping_bytes(v) if isinstance(v, Mapping) else len(str(v)) + 2 for v in value)
        else:
            total += 8
    return total
