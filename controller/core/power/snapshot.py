"""Plain-data form of the power period's values: record a period, replay it, compare the results.

This module owns how a `period.step`'s state, inputs and result become JSON-safe data and back
(`to_plain`, `from_plain`), so that a real run's periods can be recorded
(`rasd.controller.power.recording`) and replayed through `period.step` to the same commands and
status. A value's type is named in the data and looked up in an explicit table (`TYPES`): nothing
outside it is built from data. Floats survive exactly (JSON keeps their shortest repr; NaN and
infinities are tagged), numpy arrays keep their dtype.

Pure: no I/O, no logging, no clock reads.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from rasd.controller.core import fleet
from rasd.controller.core.power import apply as power_apply
from rasd.controller.core.power import commands, fallback, period, smoothing, start_smoothing, status, swing
from rasd.controller.core.power import inputs as period_inputs
from rasd.controller.core.power import policy as power_policy
from rasd.controller.core.power import ramp as power_ramp
from rasd.controller.core.power import tree as power_tree

TYPES: Mapping[str, type] = {
    cls.__name__: cls
    for cls in (
        fleet.GpuRecord,
        fleet.GpuLatest,
        power_tree.PowerTree,
        power_tree.Domain,
        power_policy.PowerPolicy,
        power_apply.ApplyState,
        power_apply.GpuLimits,
        power_apply.CapReadback,
        power_apply.CapAck,
        power_apply.CapCommand,
        power_apply.CapPlan,
        power_ramp.RampState,
        start_smoothing.StartState,
        swing.SwingReport,
        swing.SmoothingPlan,
        smoothing.SmoothingState,
        fallback.FallbackState,
        period_inputs.PeriodConfig,
        period_inputs.FleetView,
        period_inputs.WindowView,
        period_inputs.NodeLimitResult,
        period_inputs.SendOutcomes,
        period_inputs.PeriodInputs,
        period.PeriodState,
        period.PeriodStatus,
        period.Period,
        status.PowerStatus,
        status.DomainStatus,
        status.GpuRoom,
        commands.SetCaps,
        commands.SetSmoothing,
        commands.SetTroughFiller,
        commands.SetNodeLimit,
        commands.Note,
        commands.Commands,
    )
}
"""Every type a recorded period holds, by name."""


def _float(value: float) -> float | dict[str, str]:
    return value if math.isfinite(value) else {"float": repr(value)}


def to_plain(value: Any) -> Any:
    """`value` as JSON-safe data (dicts with string keys, lists, strings, numbers, booleans, None).

    Raises:
        TypeError: a value of a type outside `TYPES` (and the builtin containers).
    """
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return _float(value)
    if isinstance(value, np.ndarray):
        return {"ndarray": value.dtype.str, "data": [to_plain(v) for v in value.tolist()]}
    if isinstance(value, np.generic):
        return {"numpy": value.dtype.str, "value": to_plain(value.item())}
    if isinstance(value, tuple) and type(value).__name__ in TYPES:  # a NamedTuple
        return {"type": type(value).__name__, "fields": {k: to_plain(v) for k, v in value._asdict().items()}}
    if isinstance(value, status.PowerStatus):
        # Recorded with its tree, as before the tree was built at the first read (`DomainSums`):
        # recordings keep one form, and a replay compares trees.
        fields = {f.name: to_plain(getattr(value, f.name)) for f in dataclasses.fields(value) if f.name != "sums"}
        return {"type": "PowerStatus", "fields": {**fields, "root": to_plain(value.root)}}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        name = type(value).__name__
        if TYPES.get(name) is not type(value):
            raise TypeError(f"no plain form for {type(value)!r}")
        # A field marked not recorded is derived from the others (a cache): the replay does without it.
        fields = {
            f.name: to_plain(getattr(value, f.name))
            for f in dataclasses.fields(value)
            if f.init and f.metadata.get("recorded", True)
        }
        return {"type": name, "fields": fields}
    if isinstance(value, tuple):
        return {"tuple": [to_plain(v) for v in value]}
    if isinstance(value, list):
        return [to_plain(v) for v in value]
    if isinstance(value, frozenset | set):
        return {"frozenset": sorted((to_plain(v) for v in value), key=repr)}
    if isinstance(value, Mapping):
        if not all(isinstance(k, str) for k in value):
            raise TypeError("only mappings with string keys have a plain form")
        return {"mapping": {k: to_plain(v) for k, v in value.items()}}
    raise TypeError(f"no plain form for {type(value)!r}")


def _power_status(fields: dict[str, Any]) -> status.PowerStatus:
    """A recorded status: its tree as recorded, in the place `PowerStatus.root` keeps the one it builds."""
    root = fields.pop("root", None)
    value = status.PowerStatus(sums=None, **fields)
    value.__dict__["root"] = root  # functools.cached_property's own slot: read back as recorded
    return value


def from_plain(data: Any) -> Any:
    """The value `to_plain` made `data` from.

    Raises:
        ValueError: a type name outside `TYPES`, or data `to_plain` does not make.
    """
    if data is None or isinstance(data, bool | int | float | str):
        return data
    if isinstance(data, list):
        return [from_plain(v) for v in data]
    if not isinstance(data, dict):
        raise ValueError(f"not plain data: {data!r}")
    if "float" in data:
        return float(data["float"])
    if "ndarray" in data:
        return np.array([from_plain(v) for v in data["data"]], dtype=np.dtype(data["ndarray"]))
    if "numpy" in data:
        return np.dtype(data["numpy"]).type(from_plain(data["value"]))
    if "tuple" in data:
        return tuple(from_plain(v) for v in data["tuple"])
    if "frozenset" in data:
        return frozenset(from_plain(v) for v in data["frozenset"])
    if "mapping" in data:
        return {k: from_plain(v) for k, v in data["mapping"].items()}
    if "type" in data:
        cls = TYPES.get(data["type"])
        if cls is None:
            raise ValueError(f"unknown type {data['type']!r}")
        fields = {k: from_plain(v) for k, v in data["fields"].items()}
        if cls is status.PowerStatus:
            return _power_status(fields)
        return cls(**fields)
    raise ValueError(f"not plain data: {sorted(data)}")
