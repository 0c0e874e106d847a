"""Per-GPU floors the power loop serves within the budget: what a straggler's "raise cap" becomes (issue #40).

This module owns the rules of the floors registry the power loop shell holds (`power.loop.PowerLoop.floors`):
a `Floor` per GPU UUID, with why and when it was set; which floors are in force at a period (`in_force`:
not expired, not on a quarantined GPU or node); and what the allocator is given (`floors_w`). The
allocator serves a floor first within its priority class and only within every domain's headroom
(`allocate._grant`): a floor never breaks a budget.

A floor ends when the straggler's case clears, when the GPU is validated or quarantined (the shell
removes it; a quarantined GPU is ineligible anyway), and at the latest `TTL_S` after it was set: a
straggler that keeps lagging has gone on to be validated long before that, and a floor nobody
removed (a lost effect, a restarted watch) must not hold watts for ever.

The floors survive a restart and a change of leader: the shell stores them (`to_mapping`) with the
period that first serves them, before its commands leave, and a starting loop reads them back
(`from_mapping`), without the ones that expired meanwhile.

Pure: values in, values out; `now_s` is passed in.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping

TTL_S = 900.0
"""A floor expires this long after it was set, s (15 min: many rungs of a straggler's case)."""


@dataclasses.dataclass(frozen=True)
class Floor:
    """The least cap one GPU should get when the budget has room."""

    gpu_uuid: str
    node_id: str
    floor_w: float
    reason: str
    """Why it was set (the straggler case's action, one sentence)."""
    set_at_s: float
    """When it was set, controller time (s)."""
    expires_at_s: float

    def __post_init__(self) -> None:
        """Reject a floor that cannot mean anything, naming the field."""
        if not self.floor_w > 0:
            raise ValueError(f"floor_w: must be > 0, got {self.floor_w}")
        if not self.expires_at_s > self.set_at_s:
            raise ValueError(f"expires_at_s: must be after set_at_s ({self.set_at_s}), got {self.expires_at_s}")


def floor(gpu_uuid: str, node_id: str, floor_w: float, reason: str, *, now_s: float, ttl_s: float = TTL_S) -> Floor:
    """A floor set now that expires `ttl_s` later."""
    return Floor(gpu_uuid, node_id, float(floor_w), reason, now_s, now_s + ttl_s)


def in_force(
    floors: Mapping[str, Floor],
    *,
    now_s: float,
    quarantined_gpus: Collection[str] = frozenset(),
    quarantined_nodes: Collection[str] = frozenset(),
) -> dict[str, Floor]:
    """The floors that still hold: not expired, and not on a quarantined GPU or on a GPU of a quarantined node."""
    return {
        gpu: f
        for gpu, f in floors.items()
        if now_s < f.expires_at_s and gpu not in quarantined_gpus and f.node_id not in quarantined_nodes
    }


def floors_w(floors: Mapping[str, Floor]) -> dict[str, float]:
    """GPU -> its floor, W (what `inputs.PeriodInputs.floors_w` carries)."""
    return {gpu: f.floor_w for gpu, f in floors.items()}


def to_mapping(floors: Mapping[str, Floor]) -> dict[str, list[dict[str, object]]]:
    """The floors as a JSON-friendly document (`from_mapping` reads it back)."""
    return {"floors": [dataclasses.asdict(f) for f in floors.values()]}


def from_mapping(doc: Mapping[str, object], *, now_s: float) -> dict[str, Floor]:
    """The floors of a `to_mapping` document still in force at now_s (expired ones are left out).

    Raises:
        ValueError: a document that is no floors document, or a floor that cannot mean anything (named).
    """
    items = doc.get("floors")
    if not isinstance(items, list):
        raise ValueError(f"floors: must be a list, got {type(items).__name__}")
    out: dict[str, Floor] = {}
    for item in items:
        try:
            kept = Floor(**item)
        except TypeError as exc:
            raise ValueError(f"floors: not a floor: {item!r} ({exc})") from None
        if now_s < kept.expires_at_s:
            out[kept.gpu_uuid] = kept
    return out
