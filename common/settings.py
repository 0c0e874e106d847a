"""Checking a settings table (parsed TOML) against a frozen settings dataclass.

Shared by the controller's adapters (quarantine, BMC): every unknown key and every value of the
wrong type is refused with the key's full path, so an operator's typo never passes silently.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any


def require(ok: bool, path: str, message: str, value: Any, error: type[Exception]) -> None:
    """Raise error("<path>: <message>, got <value>") unless ok."""
    if not ok:
        raise error(f"{path}: {message}, got {value!r}")


def typed_values(
    cls: type[Any],
    data: Any,
    prefix: str,
    error: type[Exception],
    *,
    skip: frozenset[str] | set[str] = frozenset(),
) -> dict[str, Any]:
    """The values of data for dataclass cls, each checked against the type of its field's default.

    Args:
        cls: a dataclass whose fields have bool, int, float or str defaults.
        data: the table; anything else is refused.
        prefix: the table's key path ("quarantine.kubernetes."), for error messages.
        error: the exception to raise (a ValueError subclass of the caller).
        skip: keys accepted but not checked here (nested tables the caller parses itself).

    Returns:
        Keyword arguments for cls (ints widened to float where the default is a float).
    """
    if not isinstance(data, Mapping):
        raise error(f"{prefix.rstrip('.')}: expected a table, got {data!r}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    values: dict[str, Any] = {}
    for key, value in data.items():
        if key not in fields:
            raise error(f"{prefix}{key}: unknown setting (known: {', '.join(sorted(fields))})")
        if key in skip:
            continue
        default = fields[key].default
        if isinstance(default, bool):
            ok = isinstance(value, bool)
        elif isinstance(default, int):
            ok = isinstance(value, int) and not isinstance(value, bool)
        elif isinstance(default, float):
            ok = isinstance(value, int | float) and not isinstance(value, bool)
            value = float(value) if ok else value
        else:
            ok = isinstance(value, str)
        if not ok:
            kind = type(default).__name__ if default is not dataclasses.MISSING else "str"
            raise error(f"{prefix}{key}: expected {kind}, got {value!r}")
        values[key] = value
    return values
