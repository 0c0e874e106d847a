"""Blast radius: the disruption budget, the circuit breaker, storm cooldown and manual pause.

Every batch of actions the escalation core proposes passes through `admit` before executors see
it. It answers which actions may run now and which must wait, and why (DESIGN invariant 4).

Rules, in order, for each proposed action:

1. Actions of one ticket keep their order: once one is deferred, the rest of that ticket's
   actions in the batch wait too (a reboot never runs without its quarantine).
2. ``Notify`` and ``OpenRma`` are always admitted: telling a person and opening paperwork change
   nothing on the fleet.
3. Manual pause (``pause``) defers everything else. A tripped breaker defers everything else but
   ``RunValidation`` and ``Release``: it stops new disruptions, and the repairs already in flight
   still validate and give their nodes back (a reboot that finished before the trip left its node
   quarantined to the end of a storm). Neither takes anything out of service: a validation runs on
   what its ticket holds already (its quarantine went first, rule 1), and a release frees budget.
4. Node-level disruptive actions (``QuarantineNode``, ``RebootNode``, ``PowerCycleBmc``) on a node
   already out of service are admitted: they add no disruption. For a new node:

   - during storm cooldown they wait;
   - the cluster cap: nodes out of service (quarantined by automation or with a reboot/power-cycle
     in flight) + 1 ≤ min(``max_disrupted_nodes``, max(1, ⌊``max_disrupted_nodes_pct`` × N⌋));
   - per topology domain (each label in ``domain_max_nodes``/``domain_max_pct``: rack,
     nvlink_domain, power_feed): the same count within the domain ≤ min(count cap,
     max(1, ⌊pct × domain size⌋)). The percentage caps floor at one node so that every domain can
     always repair; a count cap of 0 stops automation in that scope.

5. GPU-level actions, port quarantines, validations and releases are admitted (a node-scope
   ``Release`` frees its node's budget), except a ``QuarantineGpu`` of a node's last GPU in
   service: a node whose every GPU automation quarantined is out of service as surely as a
   quarantined node (the Kubernetes adapter taints it NoSchedule), so it counts toward the caps of
   rule 4 and that quarantine is admitted under them. A GPU ``Release`` brings its node back.
   Nodes whose GPU count the fleet view does not know (``node_gpu_counts``) are never counted so.

Circuit breaker: every node for which a node-level action, or a GPU quarantine or reset, is proposed
counts as "needing quarantine" for ``breaker_window_s`` from its first proposal (demand before the
last `resume` never counts again). GPU-level breakage counts too: a bad driver or firmware push
shows as GPU faults on every node at once, and counted by node-level actions only it quarantined and
reset GPUs across the whole fleet without the breaker noticing. A process restart does not count:
one training job's crash raises application Xids on all of its nodes at once. When more than
``breaker_quarantine_pct`` of all nodes (and at least ``breaker_min_nodes``) need it within the
window, the breaker trips: the batch's admitted actions gain a critical `Notify`, and everything but
notifications and RMA paperwork waits until an operator calls `resume`. It counts demand, not
admissions, because the budget already caps what is admitted: the breaker's job is to notice that
too much is breaking at once.

Storm: while node-level actions wait for the cluster cap, a storm is on. When a batch has none
waiting for it any more, the storm ends and new node-level disruptions wait ``storm_cooldown_s`` so
that statuses settle (NHC's ``stormCooldownDuration``). `resume` also starts a cooldown. A node that
waits for its rack's or NVLink domain's cap only is no storm: two GPUs falling off the bus in one
NVLink domain are repaired one after the other, and the rest of the fleet's repairs go on (counted
as a storm, the second node's wait held every new node-level repair in the fleet for the cooldown).

The service must re-propose everything still deferred with each call (deferred actions are not
remembered here), and call `complete` when a node-level action's result arrives.

Pure: no I/O, no logging, no clock reads; ``now`` is float Unix seconds.
"""

from __future__ import annotations

import bisect
import collections
import dataclasses
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple

from rasd.controller.core.remediation import actions, policy


@dataclasses.dataclass(frozen=True)
class FleetView:
    """What the budget needs to know about the fleet: every node and its topology labels."""

    node_labels: Mapping[str, Mapping[str, str]]
    """Node id → labels (e.g. {"rack": "r12", "nvlink_domain": "nvl-3", "power_feed": "pdu-a"})."""
    node_gpu_counts: Mapping[str, int] = dataclasses.field(default_factory=dict)
    """Node id → how many GPUs it has (its last Hello); absent or 0: not known."""
    _sizes: dict[tuple[str, ...], Mapping[tuple[str, str], int]] = dataclasses.field(
        default_factory=dict, init=False, compare=False, repr=False
    )
    """Memo of `domain_sizes` (the view is immutable, so a service that keeps it counts once)."""

    def domain_sizes(self, labels: Sequence[str]) -> Mapping[tuple[str, str], int]:
        """(label, value) → how many nodes carry it, for the given labels (counted once per view)."""
        key = tuple(labels)
        sizes = self._sizes.get(key)
        if sizes is None:
            sizes = self._sizes[key] = collections.Counter(
                (label, node_labels[label])
                for node_labels in self.node_labels.values()
                for label in key
                if label in node_labels
            )
        return sizes

    @property
    def total_nodes(self) -> int:
        """How many nodes the fleet has (at least 1, so percentages stay defined)."""
        return max(1, len(self.node_labels))


@dataclasses.dataclass(frozen=True)
class InFlight:
    """An admitted reboot or power-cycle whose result has not come back."""

    command_id: str
    node_id: str
    kind: str
    admitted_at: float


@dataclasses.dataclass(frozen=True)
class BudgetState:
    """What the budget remembers between calls; JSON-friendly through `to_dict`."""

    in_flight: tuple[InFlight, ...] = ()
    quarantined_nodes: tuple[str, ...] = ()
    """Nodes automation quarantined and has not released."""
    quarantined_gpus: Mapping[str, frozenset[str]] = dataclasses.field(default_factory=dict)
    """Node id → the GPUs on it automation quarantined and has not released (never mutated: replaced).

    Not in the stored document (`to_dict`): a burst quarantines hundreds of GPUs, and the document,
    rewritten on most commits, grew from ~23 KB to ~165 KB. The store's quarantine rows are the
    durable record; the service rebuilds this from them at start (`with_quarantined_gpus`)."""
    emptied_nodes: frozenset[str] = frozenset()
    """The nodes of quarantined_gpus with every GPU in it, by the GPU counts of counted_for (kept by
    `admit`, so that no call scans every node with a quarantined GPU); not stored either."""
    counted_for: FleetView | None = dataclasses.field(default=None, compare=False, repr=False)
    """The fleet view emptied_nodes was counted against. A call given another (a node's Hello changed
    its GPUs) counts them again (`emptied_for`): a node whose GPU fell off the bus can be left with
    none in service without a quarantine or release of its own."""
    demand: Mapping[str, float] = dataclasses.field(default_factory=dict)
    """Node id → when a node-level action was first proposed for it; kept while it is re-proposed.

    Oldest first (never mutated: replaced), so that `admit` finds what expired at its front and
    what is fresh at its back without a pass over every entry: in a burst it holds thousands of
    nodes, and passes over them all on every call add up.

    Not in the stored document either: one entry per node with demand in the window, ~80 KB after
    a 2,000-node burst, and it changes on most commits of a burst. It is stored as documents of its
    own, one per first-proposal time (`demand_documents`), so that a commit writes only the few
    entries it added or let expire."""
    resumed_at: float | None = None
    """The last operator resume: demand from before it never counts toward the breaker again."""
    breaker_tripped_at: float | None = None
    breaker_reason: str = ""
    trips: int = 0
    """How many times the breaker has tripped (numbers its notifications)."""
    paused: bool = False
    pause_reason: str = ""
    storm_active: bool = False
    cooldown_until: float | None = None

    @property
    def breaker_tripped(self) -> bool:
        """True while the breaker holds automation."""
        return self.breaker_tripped_at is not None

    def disrupted_nodes(self) -> frozenset[str]:
        """Nodes out of service by automation: quarantined, with a node command in flight, or emptied.

        Emptied: every GPU of it quarantined by automation (rule 5), as last counted.
        """
        return frozenset(self.quarantined_nodes) | {f.node_id for f in self.in_flight} | self.emptied_nodes

    def emptied_for(self, fleet: FleetView) -> frozenset[str]:
        """emptied_nodes by fleet's GPU counts: as kept when counted against fleet, else counted again."""
        if self.counted_for is fleet:
            return self.emptied_nodes
        return frozenset(_emptied_nodes(self.quarantined_gpus, fleet))

    def with_quarantined_gpus(self, gpus: Iterable[tuple[str, str]], fleet: FleetView) -> BudgetState:
        """This state counting exactly the given (node id, GPU uuid) quarantines (from the store at start)."""
        by_node: dict[str, set[str]] = {}
        for node, gpu in gpus:
            by_node.setdefault(node, set()).add(gpu)
        held = {n: frozenset(g) for n, g in by_node.items()}
        emptied = frozenset(_emptied_nodes(held, fleet))
        return dataclasses.replace(self, quarantined_gpus=held, emptied_nodes=emptied, counted_for=fleet)

    def with_gpu(self, node_id: str, gpu_uuid: str, fleet: FleetView, *, held: bool) -> BudgetState:
        """This state with one GPU quarantined by automation (held) or released; itself when nothing changes."""
        gpus = self.quarantined_gpus.get(node_id, frozenset())
        if (gpu_uuid in gpus) == held:
            return self
        gpus = gpus | {gpu_uuid} if held else gpus - {gpu_uuid}
        by_node = {**self.quarantined_gpus, node_id: gpus}
        if not gpus:
            del by_node[node_id]
        emptied = self.emptied_for(fleet) - {node_id} | _emptied_nodes({node_id: gpus}, fleet)
        return dataclasses.replace(self, quarantined_gpus=by_node, emptied_nodes=frozenset(emptied), counted_for=fleet)

    def same_document(self, other: BudgetState | None) -> bool:
        """Whether `to_dict` of both is the same (the GPUs and the demand, stored apart, may differ)."""
        return other is not None and all(getattr(self, f) == getattr(other, f) for f in _DOCUMENT_FIELDS)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-friendly dict; `from_dict` reverses it."""
        # Shallow, not dataclasses.asdict: every other field is a scalar (asdict deep-copies each leaf).
        out = {name: getattr(self, name) for name in _DOCUMENT_FIELDS}
        out["in_flight"] = [
            {"command_id": f.command_id, "node_id": f.node_id, "kind": f.kind, "admitted_at": f.admitted_at}
            for f in self.in_flight
        ]
        out["quarantined_nodes"] = list(self.quarantined_nodes)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> BudgetState:
        """Rebuild from `to_dict` output.

        A document written before the demand was stored apart still holds it under "demand"; it is
        kept (`with_demand` merges it with the demand documents), so an upgrade forgets none.
        """
        fields = dict(data)
        fields["in_flight"] = tuple(InFlight(**f) for f in fields.get("in_flight", ()))
        fields["quarantined_nodes"] = tuple(fields.get("quarantined_nodes", ()))
        fields.pop("quarantined_gpus", None)  # from the store's quarantine rows, not the document
        fields.pop("emptied_nodes", None)
        fields.pop("counted_for", None)
        fields["demand"] = _oldest_first({d[0]: d[1] for d in fields.get("demand", ())})
        return cls(**fields)

    def with_demand(self, documents: Iterable[Mapping[str, Any]]) -> BudgetState:
        """This state with the demand of the given `demand_documents` added (a node's earliest time wins)."""
        first: dict[str, float] = dict(self.demand)
        for doc in documents:
            at = float(doc["at"])
            for node in doc["nodes"]:
                if node not in first or at < first[node]:
                    first[node] = at
        return dataclasses.replace(self, demand=_oldest_first(first))


def _oldest_first(demand: Mapping[str, float]) -> dict[str, float]:
    """demand ordered by time, then node."""
    return dict(sorted(demand.items(), key=lambda item: (item[1], item[0])))


_STORED_APART = frozenset({"quarantined_gpus", "emptied_nodes", "counted_for", "demand"})
"""BudgetState fields not in its document: rebuilt from the quarantine rows, or stored as documents of their own."""
_DOCUMENT_FIELDS = tuple(f.name for f in dataclasses.fields(BudgetState) if f.name not in _STORED_APART)


def demand_documents(before: Mapping[str, float], after: Mapping[str, float]) -> dict[str, dict[str, Any] | None]:
    """The demand documents that differ between two demands: key → document, or None to delete. Pure.

    One document per first-proposal time, ``{"at": at, "nodes": [...]}``, keyed by ``repr(float(at))``. A
    burst's commit adds the nodes first proposed at its ``now``, so it writes one small document;
    expiry deletes whole documents. Applying every call's result in turn to a store of documents
    leaves documents that `BudgetState.with_demand` reads back as ``after``.
    """
    if before is after or before == after:
        return {}
    touched = {at for _, at in before.items() ^ after.items()}
    oldest = min(touched)
    nodes_at: dict[float, list[str]] = {}
    for node, at in reversed(after.items()):  # newest first: a burst touches only the newest time
        if at < oldest:
            break
        if at in touched:
            nodes_at.setdefault(at, []).append(node)
    return {
        repr(float(at)): {"at": at, "nodes": sorted(nodes_at[at])} if at in nodes_at else None for at in sorted(touched)
    }


class Admission(NamedTuple):
    """The answer of `admit`; unpacks as ``admitted, deferred, state, reasons``."""

    admitted: tuple[actions.Action, ...]
    """Actions to carry out now, in proposal order (plus the breaker's own Notify when it trips)."""
    deferred: tuple[actions.Action, ...]
    """Actions that must wait; propose them again next time."""
    state: BudgetState
    reasons: tuple[str, ...]
    """One sentence per deferred action (same order), then one for a breaker trip if any."""


_ALWAYS_KINDS = frozenset({"notify", "open_rma"})
_IN_FLIGHT_KINDS = frozenset({"run_validation", "release"})
"""What a tripped breaker still lets through: the end of repairs in flight, which disrupts nothing new (rule 3)."""


def _cap(count_cap: int | None, pct: float | None, size: int) -> int:
    caps = []
    if count_cap is not None:
        caps.append(count_cap)
    if pct is not None:
        caps.append(max(1, math.floor(pct * size / 100.0)))
    return min(caps) if caps else size


def free_node_slots(state: BudgetState, fleet: FleetView, *, now_s: float, policy: policy.DisruptionPolicy) -> int:
    """How many more nodes automation could take out of service now under the cluster cap. Pure.

    Zero while paused, tripped or cooling down. Per-domain caps are not counted here (``admit``
    still applies them); planners use this to leave the budget to repairs.
    """
    cooling = state.cooldown_until is not None and now_s < state.cooldown_until
    if state.paused or state.breaker_tripped_at is not None or cooling:
        return 0
    in_flight = {f.node_id for f in state.in_flight if now_s - f.admitted_at < policy.in_flight_max_age_s}
    out = set(state.quarantined_nodes) | in_flight
    out |= state.emptied_for(fleet)
    cap = _cap(policy.max_disrupted_nodes, policy.max_disrupted_nodes_pct, fleet.total_nodes)
    return max(0, cap - len(out))


_BREAKER_GPU_KINDS = frozenset({"quarantine_gpu", "reset_gpu"})
"""GPU-level actions that count toward the circuit breaker's demand (see the module doc)."""


def _emptied_nodes(gpus_out: Mapping[str, frozenset[str]], fleet: FleetView) -> set[str]:
    """Nodes every GPU of which is quarantined (gpus_out: node → its GPUs quarantined); rule 5."""
    return {node for node, out in gpus_out.items() if _none_left(node, len(out), fleet)}


def _none_left(node_id: str, quarantined: int, fleet: FleetView) -> bool:
    """Whether quarantined GPUs leave node_id none in service (rule 5; never for a node of unknown GPU count)."""
    return 0 < fleet.node_gpu_counts.get(node_id, 0) <= quarantined


def admit(
    state: BudgetState,
    proposed: Sequence[actions.Action],
    fleet: FleetView,
    *,
    now_s: float,
    policy: policy.DisruptionPolicy,
) -> Admission:
    """Split proposed actions into those that may run now and those that must wait. Pure.

    Worked example (defaults: ≤ 8 nodes and ≤ 5 %; rack ≤ 2 and ≤ 25 %; breaker > 10 % in 10 min):
    200 nodes labelled only with racks, 20 racks of 10. 100 nodes each propose (QuarantineNode,
    RebootNode) at once → the breaker sees 100 nodes > 20 needing quarantine and trips: admitted =
    (Notify(breaker),), deferred = the 200 node actions, until ``resume``. Had only 5 nodes of one
    rack proposed, 2 nodes' pairs would be admitted (rack cap min(2, ⌊25 % × 10⌋) = 2) and 3 nodes'
    pairs deferred, reasons "rack r00 allows 2 of its 10 nodes out of service at once and 2 are".

    Args:
        state: what the budget remembers.
        proposed: new actions plus everything still deferred, in order.
        fleet: nodes and their topology labels.
        now_s: current time, Unix seconds.
        policy: the disruption settings.

    Returns:
        ``Admission(admitted, deferred, state, reasons)``.
    """
    demand = _renewed_demand(state.demand, _breaker_nodes(proposed), now_s=now_s, window_s=policy.breaker_window_s)
    fresh = _fresh_demand(demand, now_s=now_s, window_s=policy.breaker_window_s, resumed_at=state.resumed_at)
    breaker = _breaker(state, fresh, fleet.total_nodes, now_s=now_s, policy=policy)
    ledger = _Ledger.start(state, fleet, now_s=now_s, policy=policy)
    cooling = state.cooldown_until is not None and now_s < state.cooldown_until
    for action in proposed:
        why, for_budget = _wait_reason(action, ledger, state, held=breaker.tripped_at is not None, cooling=cooling)
        if why:
            ledger.defer(action, why)
            ledger.budget_waits = ledger.budget_waits or for_budget
        else:
            ledger.admit(action, now_s=now_s)
    storm_active, cooldown_until = _storm(state, ledger.budget_waits, now_s=now_s, policy=policy)
    if breaker.trip_reason:
        ledger.admitted.append(_breaker_notify(breaker))
        ledger.reasons.append(breaker.trip_reason)
    new_state = BudgetState(
        in_flight=tuple(ledger.in_flight),
        quarantined_nodes=tuple(ledger.quarantined),
        quarantined_gpus=ledger.gpus_out,
        emptied_nodes=frozenset(ledger.emptied),
        counted_for=fleet,
        demand=demand,
        breaker_tripped_at=breaker.tripped_at,
        breaker_reason=breaker.reason,
        trips=breaker.trips,
        resumed_at=state.resumed_at,
        paused=state.paused,
        pause_reason=state.pause_reason,
        storm_active=storm_active,
        cooldown_until=cooldown_until,
    )
    return Admission(tuple(ledger.admitted), tuple(ledger.deferred), new_state, tuple(ledger.reasons))


def _breaker_nodes(proposed: Sequence[actions.Action]) -> set[str]:
    """The nodes proposed actions count toward the breaker's demand (node-level, or a GPU quarantine or reset)."""
    # Planned maintenance (sweeps) is not breakage: it never feeds the breaker.
    return {
        a.node_id
        for a in proposed
        if (a.node_disruptive or a.kind in _BREAKER_GPU_KINDS) and not getattr(a, "planned", False)
    }


class _Breaker(NamedTuple):
    """The circuit breaker after this call's demand: as it was, or tripped now (then trip_reason is set)."""

    tripped_at: float | None
    reason: str
    trips: int
    trip_reason: str = ""


def _breaker(state: BudgetState, fresh: int, total: int, *, now_s: float, policy: policy.DisruptionPolicy) -> _Breaker:
    """Trip the breaker when more than its share of the fleet needed quarantine within the window."""
    limit = policy.breaker_quarantine_pct * total / 100.0
    if state.breaker_tripped_at is not None or fresh <= limit or fresh < policy.breaker_min_nodes:
        return _Breaker(state.breaker_tripped_at, state.breaker_reason, state.trips)
    reason = (
        f"{fresh} of {total} nodes needed quarantine within {policy.breaker_window_s:g}s "
        f"(more than {policy.breaker_quarantine_pct:g}%): automation stops until an operator resumes"
    )
    return _Breaker(now_s, reason, state.trips + 1, f"circuit breaker tripped: {reason}")


def _breaker_notify(breaker: _Breaker) -> actions.Notify:
    """The critical notification a breaker trip adds to the admitted actions."""
    return actions.Notify(
        ticket_id=f"breaker/{breaker.trips}",
        step=0,
        node_id="",
        reason=breaker.trip_reason,
        severity="critical",
        summary=breaker.trip_reason,
    )


@dataclasses.dataclass
class _Ledger:
    """What one `admit` call has decided so far: its working copy of the budget and its answers.

    Local to the call (the call stays pure): it starts from the state and becomes the new one.
    """

    fleet: FleetView
    disruption: policy.DisruptionPolicy
    labels: list[str]
    """The topology labels with a per-domain cap."""
    domain_size: Mapping[tuple[str, str], int]
    cluster_cap: int
    in_flight: list[InFlight]
    quarantined: list[str]
    gpus_out: Mapping[str, frozenset[str]]
    """The state's own mapping until the first change of this call (most calls change nothing)."""
    emptied: set[str]
    admitted: list[actions.Action] = dataclasses.field(default_factory=list)
    deferred: list[actions.Action] = dataclasses.field(default_factory=list)
    reasons: list[str] = dataclasses.field(default_factory=list)
    blocked_tickets: set[str] = dataclasses.field(default_factory=set)
    budget_waits: bool = False
    """Whether a node-level action waits for the cluster cap (a storm is on)."""
    gpus_copied: bool = False

    @classmethod
    def start(cls, state: BudgetState, fleet: FleetView, *, now_s: float, policy: policy.DisruptionPolicy) -> _Ledger:
        """A ledger holding the state's budget (in-flight commands past their maximum age dropped)."""
        labels = sorted(set(policy.domain_max_nodes) | set(policy.domain_max_pct))
        return cls(
            fleet=fleet,
            disruption=policy,
            labels=labels,
            domain_size=fleet.domain_sizes(labels),
            cluster_cap=_cap(policy.max_disrupted_nodes, policy.max_disrupted_nodes_pct, fleet.total_nodes),
            in_flight=[f for f in state.in_flight if now_s - f.admitted_at < policy.in_flight_max_age_s],
            quarantined=list(state.quarantined_nodes),
            gpus_out=state.quarantined_gpus,
            emptied=set(state.emptied_for(fleet)),
        )

    def disrupted(self) -> set[str]:
        """Nodes out of service by automation so far (rule 4 and 5)."""
        return set(self.quarantined) | {f.node_id for f in self.in_flight} | self.emptied

    def budget_refusal(self, node_id: str, out: set[str]) -> tuple[str, bool]:
        """Why taking node_id out would break the budget ("" when it fits); whether the cluster cap refuses it."""
        return _budget_refusal(
            node_id, out, self.fleet, self.labels, self.domain_size, self.cluster_cap, self.disruption
        )

    def defer(self, action: actions.Action, why: str) -> None:
        """Hold action back, and the rest of its ticket with it (rule 1)."""
        self.deferred.append(action)
        self.reasons.append(f"{action.kind} on {action.node_id} waits: {why}")
        self.blocked_tickets.add(action.ticket_id)

    def admit(self, action: actions.Action, *, now_s: float) -> None:
        """Let action run now and count what it takes out of service or gives back."""
        if isinstance(action, actions.QuarantineGpu):
            held = self.gpus_out.get(action.node_id, frozenset())
            if action.gpu_uuid not in held:
                self._set_gpus(action.node_id, held | {action.gpu_uuid})
        elif action.node_disruptive:
            if action.kind != "quarantine_node":
                self.in_flight.append(InFlight(action.command_id, action.node_id, action.kind, now_s))
            elif action.node_id not in self.quarantined:
                self.quarantined.append(action.node_id)
        elif isinstance(action, actions.Release) and not action.gpu_uuid and not action.ib_port:
            self.quarantined = [n for n in self.quarantined if n != action.node_id]
        elif isinstance(action, actions.Release) and action.gpu_uuid in self.gpus_out.get(action.node_id, ()):
            self._set_gpus(action.node_id, self.gpus_out[action.node_id] - {action.gpu_uuid})
        self.admitted.append(action)

    def _set_gpus(self, node_id: str, gpus: frozenset[str]) -> None:
        if not self.gpus_copied:
            self.gpus_out, self.gpus_copied = dict(self.gpus_out), True
        if gpus:
            self.gpus_out[node_id] = gpus  # type: ignore[index]
        else:
            self.gpus_out.pop(node_id, None)  # type: ignore[attr-defined]
        self.emptied.discard(node_id)
        self.emptied.update(_emptied_nodes({node_id: gpus}, self.fleet))


def _wait_reason(
    action: actions.Action, ledger: _Ledger, state: BudgetState, *, held: bool, cooling: bool
) -> tuple[str, bool]:
    """Why action must wait now ("" when it may run), and whether it waits for the cluster cap (rules 1-5).

    Args:
        action: the proposed action.
        ledger: what this call has decided so far.
        state: the budget as the call found it (pause and cooldown).
        held: whether the circuit breaker holds automation.
        cooling: whether a storm cooldown is on.
    """
    if action.ticket_id in ledger.blocked_tickets:
        return "an earlier action of its ticket waits", False
    if action.kind in _ALWAYS_KINDS:
        return "", False
    if state.paused:
        return f"automation is paused by an operator ({state.pause_reason or 'no reason given'})", False
    if held and action.kind not in _IN_FLIGHT_KINDS:
        return "the circuit breaker holds automation until an operator resumes it", False
    empties = isinstance(action, actions.QuarantineGpu) and _empties_node(action, ledger.gpus_out, ledger.fleet)
    if not (action.node_disruptive or empties):
        return "", False
    out = ledger.disrupted()
    if action.node_id in out:
        return "", False  # already out of service: adds no disruption
    why, cluster_wide = ledger.budget_refusal(action.node_id, out)
    if empties and why:
        why = f"it is the node's last GPU in service, and {why}"
    if cooling:
        return f"storm cooldown until {state.cooldown_until:.0f}", False
    return why, cluster_wide


def _storm(
    state: BudgetState, budget_waits: bool, *, now_s: float, policy: policy.DisruptionPolicy
) -> tuple[bool, float | None]:
    """(storm_active, cooldown_until): a storm lasts while actions wait for budget; its end starts a cooldown."""
    if budget_waits:
        return True, state.cooldown_until
    if state.storm_active:
        return False, now_s + policy.storm_cooldown_s
    return False, state.cooldown_until


def _renewed_demand(
    demand: Mapping[str, float], proposed_nodes: set[str], *, now_s: float, window_s: float
) -> Mapping[str, float]:
    """demand without what left the window unproposed, with the newly proposed nodes at now; itself if the same.

    demand is oldest first, so what expired is at its front: the scan stops at the first entry in
    the window (those proposed again are kept, and passed over at each call until they are not).
    """
    expired = []
    for node, at in demand.items():
        if now_s - at <= window_s:
            break
        if node not in proposed_nodes:
            expired.append(node)
    new = sorted(node for node in proposed_nodes if node not in demand)
    if not expired and not new:
        return demand
    renewed = dict(demand)
    for node in expired:
        del renewed[node]
    in_order = not renewed or next(reversed(renewed.values())) <= now_s
    renewed.update(dict.fromkeys(new, now_s))
    return renewed if in_order or not new else _oldest_first(renewed)  # a clock that went back: sort again


def _fresh_demand(demand: Mapping[str, float], *, now_s: float, window_s: float, resumed_at: float | None) -> int:
    """How many of demand's nodes count toward the breaker: proposed within the window and after the last resume.

    demand is oldest first, so they are its newest entries: a binary search finds the first.
    """
    times = list(demand.values())
    first = bisect.bisect_left(times, True, key=lambda at: now_s - at <= window_s)
    if resumed_at is not None:
        first = max(first, bisect.bisect_right(times, resumed_at))
    return len(times) - first


def _empties_node(action: actions.QuarantineGpu, gpus_out: Mapping[str, frozenset[str]], fleet: FleetView) -> bool:
    """Whether quarantining action's GPU leaves its node no GPU in service (rule 5)."""
    held = gpus_out.get(action.node_id, frozenset())
    if action.gpu_uuid in held:
        return False  # already counted
    return _none_left(action.node_id, len(held) + 1, fleet)


def _budget_refusal(
    node_id: str,
    out: set[str],
    fleet: FleetView,
    labels: Iterable[str],
    domain_size: Mapping[tuple[str, str], int],
    cluster_cap: int,
    pol: policy.DisruptionPolicy,
) -> tuple[str, bool]:
    """Why taking ``node_id`` out now would break the budget ("" when it fits), and whether the cluster cap refuses."""
    if len(out) + 1 > cluster_cap:
        return f"the cluster budget allows {cluster_cap} nodes out of service at once and {len(out)} are", True
    node_labels = fleet.node_labels.get(node_id, {})
    for label in labels:
        value = node_labels.get(label)
        if value is None:
            continue
        size = domain_size.get((label, value), 1)
        cap = _cap(pol.domain_max_nodes.get(label), pol.domain_max_pct.get(label), size)
        in_domain = sum(1 for n in out if fleet.node_labels.get(n, {}).get(label) == value)
        if in_domain + 1 > cap:
            return f"{label} {value} allows {cap} of its {size} nodes out of service at once and {in_domain} are", False
    return "", False


def complete(state: BudgetState, command_id: str, *, now_s: float) -> BudgetState:
    """A node-level command's result arrived: it no longer counts as in flight. Pure.

    Args:
        state: what the budget remembers.
        command_id: the finished command.
        now_s: current time, Unix seconds (unused today; kept for a uniform signature).

    Returns:
        The new state; state itself when command_id was not in flight.
    """
    del now_s
    if all(f.command_id != command_id for f in state.in_flight):
        return state  # not a node-level command (most are not): the same state, so callers can tell nothing changed
    return dataclasses.replace(state, in_flight=tuple(f for f in state.in_flight if f.command_id != command_id))


def pause(state: BudgetState, *, now_s: float, reason: str) -> BudgetState:
    """An operator pauses automation: only notifications and RMA paperwork pass until `resume`. Pure."""
    del now_s
    return dataclasses.replace(state, paused=True, pause_reason=reason)


def resume(state: BudgetState, *, now_s: float, policy: policy.DisruptionPolicy) -> BudgetState:
    """An operator resumes automation: clears pause and breaker, starts a storm cooldown. Pure.

    Demand proposed before the resume never counts toward the breaker again (the operator has
    seen it), so re-proposing the held-back actions does not trip it at once; new failures do.
    The cooldown lets statuses settle before new node-level disruptions.
    """
    return dataclasses.replace(
        state,
        paused=False,
        pause_reason="",
        breaker_tripped_at=None,
        breaker_reason="",
        resumed_at=now_s,
        storm_active=False,
        cooldown_until=now_s + policy.storm_cooldown_s,
    )
