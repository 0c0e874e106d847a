"""Lost nodes: which in-service nodes no replica has heard from for too long, judged from last-seen times.

A host that dies (a PSU, a CPU, a memory or I/O board, a kernel hang) sends nothing: no Xid, no event.
Its agent's stream simply stops. The scheduler notices at its own NotReady timeout (Kubernetes: 40 s
to NotReady, pods evicted 300 s later by default), and the job waits for it. Every replica writes
each node's last-seen time to the store (summaries each second, heartbeats every 5 s, flushed every
5 s), so the leader can see a silent node whichever replica held its stream. `judge` names the
nodes silent for ``lost_after_s``; the shell (`rasd.controller.remediation.lost_nodes`) hands each
to the ladder as a ``NODE_LOST`` event, which quarantines the node for a person.

What is never named lost:

- a node the ladder is working on (``judged`` False: rebooting, quarantined, validating), whose
  silence may be the ladder's own doing;
- a node already silent when this watch started, before ``lost_after_s`` ahead of it (a node that
  left the fleet long ago, or was silent across a controller outage): this term never saw it alive;
- anyone, while more nodes fall silent at once than a failure of hosts explains
  (``storm_min_nodes``, ``storm_fraction_pct`` of the nodes seen this term). Then the silence is on
  the controller's side (a partition, a store that stopped taking last-seen writes) and quarantining
  them would take the fleet out: the storm is reported, nothing is named, and the nodes are judged
  again at each check.

A node named once is not named again until it has been seen since (its last-seen time moved). One
heard from again is *returned*: the shell asks the ladder to validate it and, on a pass, release it
(``release_on_return``), unless it came back once already within ``relapse_window_s``: a node that
keeps dropping out waits for a person.

Pure: no I/O, no clock reads (``now_s`` is passed in).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping

from rasd.controller.core.remediation import policy


@dataclasses.dataclass(frozen=True, slots=True)
class Sighting:
    """One node as the store and the ladder know it."""

    node_id: str
    last_seen_s: float
    """When any replica last heard from its agent (controller clock; unix seconds)."""
    judged: bool
    """In service with nothing of the ladder under way: its silence can only mean it is lost."""


@dataclasses.dataclass(frozen=True)
class WatchState:
    """What one term of the watch remembers."""

    started_s: float
    """When the watch started (this leader's term): silence counts from here at the earliest."""
    reported: Mapping[str, float] = dataclasses.field(default_factory=dict)
    """Node -> its last-seen time when it was named lost."""
    returned: Mapping[str, float] = dataclasses.field(default_factory=dict)
    """Node -> when it last came back after being named lost (kept ``relapse_window_s``)."""


@dataclasses.dataclass(frozen=True, slots=True)
class LostNode:
    """A node named lost now."""

    node_id: str
    last_seen_s: float
    silent_s: float
    """How long it has been silent, counted from the watch's start at the earliest."""


@dataclasses.dataclass(frozen=True)
class Judgement:
    """One check's outcome."""

    state: WatchState
    lost: tuple[LostNode, ...]
    """Named now: each goes to the ladder once."""
    silent: int
    """Nodes seen this term and silent for ``lost_after_s`` now (named before, named now, held by a storm,
    or under the ladder's care)."""
    storm: bool
    """More nodes fell silent at once than a failure of hosts explains: none was named."""
    release: tuple[str, ...] = ()
    """Named before and heard from since: to validate and release (``release_on_return``)."""
    relapsed: tuple[str, ...] = ()
    """Named before and heard from since, but back once already within ``relapse_window_s``: left to a person."""


def judge(
    state: WatchState,
    sightings: Iterable[Sighting],
    *,
    now_s: float,
    pol: policy.LostNodePolicy,
    nodes_seen: int | None = None,
) -> Judgement:
    """The nodes lost at now_s (see the module docstring); state carries the nodes named before.

    sightings: every node, or (with nodes_seen) only those silent for ``lost_after_s`` and those named
    before, with nodes_seen the count of nodes heard from since ``lost_after_s`` before the watch started
    (the storm's base); the shell reads it that way so that a check costs a few rows, not the fleet's.
    """
    horizon = horizon_s(state, pol)
    reported: dict[str, float] = {}
    returned = {node: at for node, at in state.returned.items() if now_s - at < pol.relapse_window_s}
    back: list[str] = []
    relapsed: list[str] = []
    candidates: list[LostNode] = []
    seen_this_term = silent = 0
    for sighting in sightings:
        named_at = state.reported.get(sighting.node_id)
        if named_at is not None and sighting.last_seen_s > named_at:  # heard from since it was named
            (relapsed if sighting.node_id in returned else back).append(sighting.node_id)
            returned[sighting.node_id] = now_s
            named_at = None
        if sighting.last_seen_s < horizon:
            continue  # silent since before this term could have seen it alive: not this watch's to judge
        seen_this_term += 1
        silent_s = now_s - max(sighting.last_seen_s, state.started_s)
        if silent_s < pol.lost_after_s:
            continue
        silent += 1
        if named_at is not None:
            reported[sighting.node_id] = named_at
        elif sighting.judged:
            candidates.append(LostNode(sighting.node_id, sighting.last_seen_s, silent_s))
    storm = len(candidates) > storm_limit(seen_this_term if nodes_seen is None else nodes_seen, pol)
    if storm:
        candidates = []
    reported.update((lost.node_id, lost.last_seen_s) for lost in candidates)
    return Judgement(
        WatchState(state.started_s, reported, returned),
        tuple(candidates),
        silent,
        storm,
        release=tuple(back),
        relapsed=tuple(relapsed),
    )


def horizon_s(state: WatchState, pol: policy.LostNodePolicy) -> float:
    """Nodes last heard from before this are not this term's to judge."""
    return state.started_s - pol.lost_after_s


def storm_limit(nodes_seen: int, pol: policy.LostNodePolicy) -> int:
    """The most nodes one check may name lost at once: more is a storm."""
    return max(pol.storm_min_nodes, math.floor(nodes_seen * pol.storm_fraction_pct / 100.0))
