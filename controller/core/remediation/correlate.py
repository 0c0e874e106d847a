"""Correlation: many events, one incident. Bursts, sympathetic errors and flap storms fold together.

An `Incident` is one fault on one target (a GPU, or a node for node-level faults) with the
events that belong to it. For each classified event, `correlate` answers with an `Outcome`:

======================  ==========================================================  ==============
outcome                 when                                                        escalate?
======================  ==========================================================  ==============
NEW                     a fault needing attention with no open incident             yes
DUPLICATE               same target and fault_key within ``dedupe_window_s`` of     no
                        the incident opening (a burst)
SECONDARY               a consequence of another open incident (rules below)        no
RECURRENCE              a sticky fault seen again after the dedupe window but       yes
                        within ``sticky_window_s`` of its last sighting
UPGRADE                 what would be a DUPLICATE or SECONDARY asks for a           yes
                        stronger repair than its incident (Xid 154 "reset" then
                        "reboot"; a DBE whose remap count reaches the RMA limit):
                        the incident takes the new classification
NAMED                   an Xid 48/94/95 on a GPU whose incident was opened by a     yes
                        counter that saw the same error first (the DBE count, a
                        pending remap; ``classify.COUNTER_FAULTS_NAMED_BY_XID``):
                        the incident takes the Xid's classification, whatever
                        repair it asks for (Xid 94: restart, not reset)
OBSERVED                nothing to act on (classification action "none")            no
======================  ==========================================================  ==============

A finished repair ends a burst: once the ladder's repair of a target has run (``repaired_at``, from
``escalation.repaired_at``), an event of that target neither joins nor details an incident opened
before it. It opens a new incident (a sticky one recurs), and the ladder climbs on it: folding is
right while a repair is due or running, not after it (issue #37).

Secondary rules (each within ``secondary_window_s`` of the root's last event):

- Xid 45 (preemptive cleanup) after any other Xid on the same GPU (else the same node);
- Xid 43 (channel stopped) after an ERROR-or-worse incident on the same GPU;
- Xid 63/64 (remap event/failure), 171/172 (DRAM/SRAM detail) after Xid 48 on the same GPU;
- ECC_DBE and ROW_REMAP_PENDING (the counters) after Xid 48, 94 or 95 on the same GPU: two sources
  for one uncorrectable error, one incident whichever comes first (the reverse order is NAMED);
- FALLEN_OFF_BUS and GPU_LOST after Xid 79 on the same GPU, and Xid 79 after either;
- Xid 74 on a peer GPU of the same NVLink domain (``HealthEvent.nvlink_domain``), after an
  NVLink incident on another GPU: the peer is recorded in ``peer_gpu_uuids``, sympathetic.

IB link flaps: every IB_LINK_STATE event is remembered per port for ``ib_flap_window_s``, at the
controller's ``now`` (the window is pruned with ``now`` too: an agent clock that is hours off must
neither hide a storm nor keep old flaps counting forever); the count goes to ``classify``. A storm
opens one incident per node (fault_key "ib_flap", or one per port when ``ib_flap_isolation =
"port"``) and later flaps, on any port of that node, are duplicates of it while it is open.

State is grouped by correlation scope (the NVLink domain when known, else the node) so peer Xid
74 can fold across the nodes of one NVL72 domain, and only the event's scope is rebuilt per
event. Incidents are forgotten after their window passes; the store keeps history.

Pure: no I/O, no logging, no clock reads; ``now`` is float Unix seconds.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from typing import Any

from rasd.common import xid_catalog
from rasd.common.vocabulary import EventKind, Severity
from rasd.controller.core.remediation import classify, policy
from rasd.controller.core.remediation import events as health


class Outcome(enum.StrEnum):
    """What correlation made of one event (see the module table)."""

    NEW = "new"
    DUPLICATE = "duplicate"
    SECONDARY = "secondary"
    RECURRENCE = "recurrence"
    UPGRADE = "upgrade"
    NAMED = "named"
    OBSERVED = "observed"


@dataclasses.dataclass(frozen=True)
class Incident:
    """One fault on one target and everything folded into it."""

    incident_id: str
    """Deterministic: ``<node>/<gpu or ->/<fault_key>/<seq>t<ms>`` of the root event (``t<ms>`` alone
    without a seq). The observed time is part of it because an agent whose spool was reset numbers
    its events from 1 again: seq alone would give a new fault an old incident's id, and the ticket and
    command ids derived from it would name commands that already ran."""
    node_id: str
    gpu_uuid: str
    """"" for node-level faults (IB flaps, SXID)."""
    classification: classify.Classification
    """The root event's classification."""
    opened_at: float
    last_seen_at: float
    event_count: int = 1
    """Events folded in as duplicates or recurrences, the root included."""
    occurrences: int = 1
    """Sightings separated by more than the dedupe window (1 + recurrences)."""
    xid: int | None = None
    """The root event's Xid, when it was one."""
    nvlink_domain: str = ""
    ib_port: str = ""
    """The root event's IB port, for port isolation."""
    sticky: bool = False
    secondary_keys: tuple[str, ...] = ()
    """fault_keys of secondaries folded in, in arrival order (bounded)."""
    peer_gpu_uuids: tuple[str, ...] = ()
    """Other GPUs whose sympathetic errors folded in (peer Xid 74)."""
    newest_seq: int = 0
    """The highest agent seq folded in (0: none had one). With `newest_observed_at`, it tells an event
    that was observed before evidence the incident already holds, arriving late (a spool replay, a
    reordered batch), from a new sighting (`_Fold.joinable`)."""
    newest_observed_at: float = 0.0
    """The latest observed time folded in, on the agent's own clock (never compared with the controller's)."""

    @property
    def fault_key(self) -> str:
        """The root classification's fault key."""
        return self.classification.fault_key

    def to_dict(self) -> dict[str, Any]:
        """A JSON-friendly dict; `from_dict` reverses it.

        Shallow, not ``dataclasses.asdict``: every field but the classification is a scalar or a
        tuple of str, and a burst serialises thousands of incidents (asdict deep-copied each leaf).
        """
        out = {name: getattr(self, name) for name in _INCIDENT_FIELDS}
        out["classification"] = self.classification.to_dict()
        out["secondary_keys"] = list(self.secondary_keys)
        out["peer_gpu_uuids"] = list(self.peer_gpu_uuids)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Incident:
        """Rebuild from `to_dict` output."""
        fields = dict(data)
        fields["classification"] = classify.Classification.from_dict(fields["classification"])
        fields["secondary_keys"] = tuple(fields.get("secondary_keys", ()))
        fields["peer_gpu_uuids"] = tuple(fields.get("peer_gpu_uuids", ()))
        return cls(**fields)


_INCIDENT_FIELDS = tuple(f.name for f in dataclasses.fields(Incident))


@dataclasses.dataclass(frozen=True)
class PortHistory:
    """Recent state-change times of one IB port (bounded by the flap window)."""

    node_id: str
    ib_port: str
    changed_at: tuple[float, ...]


@dataclasses.dataclass(frozen=True)
class CorrelationState:
    """Open incidents and IB port histories, grouped by correlation scope.

    The mappings are never mutated; every call returns a new state sharing unchanged scopes.
    """

    incidents: Mapping[str, tuple[Incident, ...]] = dataclasses.field(default_factory=dict)
    """Scope (NVLink domain, else node id) → open incidents, oldest first."""
    ports: Mapping[str, tuple[PortHistory, ...]] = dataclasses.field(default_factory=dict)
    """Node id → IB port histories."""

    def open_incidents(self) -> tuple[Incident, ...]:
        """Every remembered incident, by scope then age."""
        return tuple(i for scope in sorted(self.incidents) for i in self.incidents[scope])

    def to_dict(self) -> dict[str, Any]:
        """A JSON-friendly dict; `from_dict` reverses it."""
        return {
            "incidents": {s: [i.to_dict() for i in incs] for s, incs in self.incidents.items()},
            "ports": {
                n: [{"node_id": p.node_id, "ib_port": p.ib_port, "changed_at": list(p.changed_at)} for p in ps]
                for n, ps in self.ports.items()
            },
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CorrelationState:
        """Rebuild from `to_dict` output."""
        return cls(
            incidents={s: tuple(Incident.from_dict(i) for i in incs) for s, incs in data["incidents"].items()},
            ports={
                n: tuple(PortHistory(p["node_id"], p["ib_port"], tuple(p["changed_at"])) for p in ps)
                for n, ps in data["ports"].items()
            },
        )


@dataclasses.dataclass(frozen=True)
class Correlation:
    """The answer for one event."""

    state: CorrelationState
    outcome: Outcome
    incident: Incident | None
    """The incident the event opened or joined; None for OBSERVED."""
    classification: classify.Classification
    """The event's own classification."""
    reason: str

    @property
    def needs_decision(self) -> bool:
        """True when escalation must see it (NEW, RECURRENCE, UPGRADE or NAMED)."""
        return self.outcome in (Outcome.NEW, Outcome.RECURRENCE, Outcome.UPGRADE, Outcome.NAMED)


_MAX_SECONDARY_KEYS = 32

_ACTION_RANK = {
    classify.RecommendedAction.RESTART_PROCESS: 1,
    classify.RecommendedAction.RESET_GPU: 2,
    classify.RecommendedAction.REBOOT_NODE: 3,
    classify.RecommendedAction.RMA: 4,
}
"""How strong a repair each ladder action is; anything else ranks 0."""


def _stronger(new: classify.Classification, old: classify.Classification) -> bool:
    return _ACTION_RANK.get(new.action, 0) > _ACTION_RANK.get(old.action, 0)


_SECONDARY_OF_48 = frozenset({63, 64, 171, 172})
_SECONDARY_XIDS = frozenset({43, 45, 74, 79}) | _SECONDARY_OF_48
"""Xids some rule of `_secondary_root` is about: it returns before any rule for the others, so a new
rule there adds its Xid here (or its kind to `_SECONDARY_KINDS`)."""
_COUNTER_KEYS = {EventKind.ECC_DBE: "ecc_dbe", EventKind.ROW_REMAP_PENDING: "row_remap_pending"}
"""Counter events an Xid can name (`classify.COUNTER_FAULTS_NAMED_BY_XID`), by kind → their fault_key."""
_NAMING_XIDS = frozenset().union(*classify.COUNTER_FAULTS_NAMED_BY_XID.values())
"""The Xids that name a counter's memory error (48, 94, 95)."""
_SECONDARY_KINDS = frozenset({EventKind.FALLEN_OFF_BUS, EventKind.GPU_LOST, *_COUNTER_KEYS})
"""Event kinds some rule of `_secondary_root` is about, whatever their Xid (see `_SECONDARY_XIDS`)."""


def scope_of(event: health.HealthEvent) -> str:
    """The correlation scope of an event: its NVLink domain when known, else its node."""
    return f"nvl:{event.nvlink_domain}" if event.nvlink_domain else f"node:{event.node_id}"


def _observed_before_newest(event: health.HealthEvent, inc: Incident) -> bool:
    """Whether the agent observed event before the newest event inc already holds.

    Such an event arrived late (reordered, replayed from a spool after a broken stream): it belongs to
    the burst the repair was for, not to a recurrence after it. Both the seq and the observed time
    must say so, each on the agent's own numbering and clock: a spool reset numbers from 1 again,
    but its events are observed later; a clock stepped back leaves the seq still rising.
    """
    return (
        event.node_id == inc.node_id and 0 < event.seq < inc.newest_seq and event.observed_at <= inc.newest_observed_at
    )


def _incident_id(event: health.HealthEvent, fault_key: str) -> str:
    observed_ms = round(event.observed_at * 1000)
    tail = f"{event.seq}t{observed_ms}" if event.seq else f"t{observed_ms}"
    return f"{event.node_id}/{event.gpu_uuid or '-'}/{fault_key}/{tail}"


def _prune(incidents: tuple[Incident, ...], now_s: float, pol: policy.CorrelationPolicy) -> tuple[Incident, ...]:
    """The incidents still remembered at now (sticky: the sticky window; others: dedupe or secondary)."""
    plain_s = max(pol.dedupe_window_s, pol.secondary_window_s)  # once per call: this runs for every event
    sticky_s = pol.sticky_window_s
    for incident in incidents:
        if now_s - incident.last_seen_at > (sticky_s if incident.sticky else plain_s):
            break
    else:
        # Nothing expired, the common case: the same tuple, not a copy (the service writes a scope only
        # when its tuple changed), and no tuple built for every event of a burst.
        return incidents
    return tuple(i for i in incidents if now_s - i.last_seen_at <= (sticky_s if i.sticky else plain_s))


def expire(state: CorrelationState, now_s: float, policy: policy.RemediationPolicy) -> CorrelationState:
    """The state at now with every scope's expired incidents forgotten (the same object when none expired).

    `correlate` prunes a scope only when an event arrives in it; the service calls this on its tick
    so that an incident of a quiet scope also closes when its window ends.
    """
    corr_pol = policy.correlation
    scoped = dict(state.incidents)
    changed = False
    for scope, incidents in state.incidents.items():
        kept = _prune(incidents, now_s, corr_pol)
        if kept is not incidents:
            changed = True
            if kept:
                scoped[scope] = kept
            else:
                del scoped[scope]
    return CorrelationState(scoped, state.ports) if changed else state


def _secondary_root(
    event: health.HealthEvent, incidents: tuple[Incident, ...], now_s: float, pol: policy.CorrelationPolicy
) -> tuple[Incident, str] | None:
    """The open incident this event is a consequence of, with the rule's wording, or None."""
    xid = event.xid if event.kind is EventKind.XID else None
    if xid not in _SECONDARY_XIDS and event.kind not in _SECONDARY_KINDS:
        return None  # no rule below is about this event: most of a burst's events
    recent = [i for i in reversed(incidents) if now_s - i.last_seen_at <= pol.secondary_window_s]
    same_gpu = [i for i in recent if i.node_id == event.node_id and i.gpu_uuid == event.gpu_uuid]
    if xid == 45:
        for group in (same_gpu, [i for i in recent if i.node_id == event.node_id]):
            for inc in group:
                if inc.xid is not None and inc.xid != 45:
                    return inc, f"Xid 45 is the cleanup after Xid {inc.xid}"
    if xid == 43:
        for inc in same_gpu:
            if inc.classification.severity >= Severity.ERROR:
                return inc, f"Xid 43 follows the {inc.fault_key} fault that stopped the channel"
    if xid in _SECONDARY_OF_48:
        for inc in same_gpu:
            if inc.xid == 48:
                return inc, f"Xid {xid} details the Xid 48 double-bit error"
    counter_key = _COUNTER_KEYS.get(event.kind)
    if counter_key is not None:
        named_by = classify.COUNTER_FAULTS_NAMED_BY_XID[counter_key]
        for inc in same_gpu:
            if inc.xid in named_by:
                what = "the DBE counter" if event.kind is EventKind.ECC_DBE else "the pending row remap"
                return inc, f"{what} reports the Xid {inc.xid} memory error"
    off_bus_kinds = (EventKind.FALLEN_OFF_BUS, EventKind.GPU_LOST)
    if event.kind in off_bus_kinds or xid == 79:
        for inc in same_gpu:
            if inc.fault_key in ("xid:79", "off_bus"):
                return inc, "another report of the same GPU falling off the bus"
    if xid == 74 and event.nvlink_domain:
        for inc in recent:
            if (
                inc.gpu_uuid
                and inc.gpu_uuid != event.gpu_uuid
                and inc.nvlink_domain == event.nvlink_domain
                and inc.classification.component is classify.Component.NVLINK
            ):
                return inc, f"Xid 74 on a peer of {inc.gpu_uuid} in NVLink domain {event.nvlink_domain} is sympathetic"
    return None


def _count_port_changes(
    state: CorrelationState, event: health.HealthEvent, now_s: float, window_s: float
) -> tuple[tuple[PortHistory, ...], int]:
    histories = state.ports.get(event.node_id, ())
    port = event.ib_port
    kept: list[PortHistory] = []
    count = 0
    found = False
    for hist in histories:
        times = tuple(t for t in hist.changed_at if now_s - t <= window_s)
        if hist.ib_port == port:
            times = (*times, now_s)
            count = len(times)
            found = True
        if times:
            kept.append(PortHistory(hist.node_id, hist.ib_port, times))
    if not found:
        kept.append(PortHistory(event.node_id, port, (now_s,)))
        count = 1
    return tuple(kept), count


def correlate(
    state: CorrelationState,
    event: health.HealthEvent,
    *,
    now_s: float,
    catalog: xid_catalog.XidCatalog,
    policy: policy.RemediationPolicy,
    nvlink5_rules: tuple[xid_catalog.Nvlink5Rule, ...] | None = None,
    repaired_at: float | None = None,
) -> Correlation:
    """Classify one event and fold it into the open incidents. Pure.

    Worked examples (default policy):

    - Xid 48 on GPU-1 at t=0 → NEW incident "n1/GPU-1/xid:48/…"; Xid 45 on GPU-1 at t=2 →
      SECONDARY of it ("Xid 45 is the cleanup after Xid 48"); still one incident.
    - Xid 13 on GPU-1 at t=0 and again at t=60 → NEW, then DUPLICATE (within 180 s). Again at
      t=400 → NEW (a new incident: escalation decides whether it is a recurrence after repair).
    - Xid 79 at t=0 and t=1000 → NEW, then RECURRENCE (79 is sticky for 3 h).
    - IB port mlx5_0/1 down/up 3 times within 10 min → OBSERVED ×5, then NEW on the 6th state
      change ("ib_flap"); any later flap on that node while it is open → DUPLICATE.

    The steps, in order, each answering when its rule applies: `_join_flap_storm`, `_join_burst`
    (DUPLICATE or UPGRADE), `_name_counter_fault` (NAMED), `_fold_secondary` (SECONDARY or
    UPGRADE), `_recur` (RECURRENCE), and `_open_incident` (OBSERVED or NEW) for what is left.

    Args:
        state: the open incidents and port histories.
        event: the new event (its ``nvlink_domain`` filled in by the service when known).
        now_s: current time, Unix seconds (prunes expired incidents).
        catalog: NVIDIA's XID catalog.
        policy: all remediation settings (classification and correlation parts are used).
        nvlink5_rules: NVIDIA's Xid 144-150 decode sheet, passed on to ``classify`` (None: the catalog's).
        repaired_at: when the ladder's repair of the event's target finished (``escalation.repaired_at``),
            or None while one is due or running. An incident of that GPU (or node) opened before it
            is not joined as a duplicate or a secondary: the fault is back after its repair, which
            is the evidence the ladder climbs on. Sticky recurrences are recurrences either way.

    Returns:
        The new state, the outcome, the incident and the event's classification.
    """
    corr_pol = policy.correlation
    scope = scope_of(event)
    incidents = _prune(state.incidents.get(scope, ()), now_s, corr_pol)
    ports = state.ports
    changes = 0
    if event.kind is EventKind.IB_LINK_STATE:
        node_ports, changes = _count_port_changes(state, event, now_s, policy.classification.ib_flap_window_s)
        ports = {**state.ports, event.node_id: node_ports}
    cls = classify.classify(
        event,
        catalog=catalog,
        policy=policy.classification,
        ib_state_changes_in_window=changes,
        nvlink5_rules=nvlink5_rules,
    )
    same_target = tuple(
        i
        for i in incidents
        if i.node_id == event.node_id and i.gpu_uuid == event.gpu_uuid and i.fault_key == cls.fault_key
    )
    fold = _Fold(state, event, scope, incidents, ports, cls, same_target, now_s, corr_pol, repaired_at)
    for step in (_join_flap_storm, _join_burst, _name_counter_fault, _fold_secondary, _recur):
        found = step(fold)
        if found is not None:
            return found
    return _open_incident(fold)


@dataclasses.dataclass(frozen=True)
class _Fold:
    """One event on its way into its scope's incidents: what every step of `correlate` reads."""

    state: CorrelationState
    event: health.HealthEvent
    scope: str
    incidents: tuple[Incident, ...]
    """The scope's incidents still remembered at now."""
    ports: Mapping[str, tuple[PortHistory, ...]]
    """The port histories with this event counted."""
    cls: classify.Classification
    same_target: tuple[Incident, ...]
    """Open incidents of the event's node, GPU and fault key, oldest first."""
    now_s: float
    pol: policy.CorrelationPolicy
    repaired_at: float | None = None
    """When the ladder's repair of the event's target finished (see `correlate`)."""

    def joinable(self, incidents: tuple[Incident, ...]) -> tuple[Incident, ...]:
        """incidents without those of the event's target opened before its repair finished.

        Those are the faults the repair was for: the event comes after it, so it is no part of their
        burst and no detail of them (`_join_burst`, `_fold_secondary`).
        """
        at, event = self.repaired_at, self.event
        if at is None:
            return incidents
        return tuple(
            i
            for i in incidents
            if not (
                i.node_id == event.node_id
                and i.gpu_uuid == event.gpu_uuid
                and i.opened_at < at
                and not _observed_before_newest(event, i)
            )
        )

    def seen(self, inc: Incident, **changes: Any) -> Incident:
        """inc with the event folded in: last seen now, one more event, its seq and observed time kept."""
        event = self.event
        newest: dict[str, Any] = {}
        if event.node_id == inc.node_id:
            newest = {
                "newest_seq": max(inc.newest_seq, event.seq),
                "newest_observed_at": max(inc.newest_observed_at, event.observed_at),
            }
        return dataclasses.replace(inc, last_seen_at=self.now_s, event_count=inc.event_count + 1, **newest, **changes)

    def answer(
        self, new_incidents: tuple[Incident, ...], outcome: Outcome, inc: Incident | None, why: str
    ) -> Correlation:
        """The Correlation with the scope's incidents replaced by new_incidents."""
        state = self.state
        if new_incidents is state.incidents.get(self.scope, ()) and self.ports is state.ports:
            return Correlation(state, outcome, inc, self.cls, why)  # nothing changed: share the whole state
        scoped = dict(state.incidents)
        if new_incidents:
            scoped[self.scope] = new_incidents
        else:
            scoped.pop(self.scope, None)
        return Correlation(CorrelationState(scoped, self.ports), outcome, inc, self.cls, why)

    def replace(self, old: Incident, new: Incident) -> tuple[Incident, ...]:
        """The scope's incidents with old replaced by new."""
        return tuple(new if i is old else i for i in self.incidents)

    def upgrade(self, inc: Incident) -> Correlation:
        """UPGRADE: the incident keeps its identity (fault_key) and takes the event's stronger verdict."""
        cls = self.cls
        stronger = self.seen(
            inc,
            classification=dataclasses.replace(cls, fault_key=inc.fault_key),
            secondary_keys=(*inc.secondary_keys, cls.fault_key)[-_MAX_SECONDARY_KEYS:],
        )
        return self.answer(
            self.replace(inc, stronger),
            Outcome.UPGRADE,
            stronger,
            f"{cls.fault_key} asks for {cls.action} where incident {inc.incident_id} asked for "
            f"{inc.classification.action}: {cls.reason}",
        )


def _join_flap_storm(fold: _Fold) -> Correlation | None:
    """An IB flap storm is one incident per node (or per port): later flaps join it as DUPLICATE."""
    event, key = fold.event, fold.cls.fault_key
    if not key.startswith("ib_flap") and not (
        event.kind is EventKind.IB_LINK_STATE
        and any(i.node_id == event.node_id and i.fault_key.startswith("ib_flap") for i in fold.incidents)
    ):
        return None
    for inc in fold.incidents:
        same_key = inc.fault_key == key or (not key.startswith("ib_flap") and inc.fault_key == "ib_flap")
        if inc.node_id == event.node_id and same_key:
            joined = fold.seen(inc)
            return fold.answer(
                fold.replace(inc, joined),
                Outcome.DUPLICATE,
                joined,
                f"IB state change on {event.ib_port or '?'} joins the open flap incident {inc.incident_id}",
            )
    return None


def _join_burst(fold: _Fold) -> Correlation | None:
    """The same fault on the same target within the dedupe window: DUPLICATE, or UPGRADE when stronger."""
    window_s = fold.pol.dedupe_window_s
    for inc in reversed(fold.joinable(fold.same_target)):
        if fold.now_s - inc.opened_at <= window_s:
            if _stronger(fold.cls, inc.classification):
                return fold.upgrade(inc)
            joined = fold.seen(inc)
            return fold.answer(
                fold.replace(inc, joined),
                Outcome.DUPLICATE,
                joined,
                f"{fold.cls.fault_key} again within {window_s:g}s of incident {inc.incident_id}: "
                "part of the same burst",
            )
    return None


def _name_counter_fault(fold: _Fold) -> Correlation | None:
    """An Xid that names the memory error a counter of its GPU reported first: NAMED (see the module table).

    The counter incident (``ecc_dbe``, ``row_remap_pending``), opened within ``secondary_window_s``
    and not named yet, takes the Xid's classification and fault key (the Xid is the more specific
    evidence: Xid 94 says restart, where the DBE count alone says reset) and keeps its id; the
    counter's key joins its secondaries. Later reports of the same error fold into it as usual.
    """
    event = fold.event
    xid = event.xid if event.kind is EventKind.XID else None
    if xid not in _NAMING_XIDS or fold.cls.action is classify.RecommendedAction.NONE:
        return None
    for inc in reversed(fold.joinable(fold.incidents)):
        named_by = classify.COUNTER_FAULTS_NAMED_BY_XID.get(inc.fault_key, frozenset())
        if (
            xid in named_by
            and inc.xid is None
            and inc.node_id == event.node_id
            and inc.gpu_uuid == event.gpu_uuid
            and fold.now_s - inc.last_seen_at <= fold.pol.secondary_window_s
        ):
            named = fold.seen(
                inc,
                classification=fold.cls,
                xid=xid,
                sticky=xid in fold.pol.sticky_xids,
                secondary_keys=(*inc.secondary_keys, inc.fault_key)[-_MAX_SECONDARY_KEYS:],
            )
            return fold.answer(
                fold.replace(inc, named),
                Outcome.NAMED,
                named,
                f"Xid {xid} names the {inc.fault_key} error its counter reported first (incident "
                f"{inc.incident_id}): {fold.cls.reason}",
            )
    return None


def _fold_secondary(fold: _Fold) -> Correlation | None:
    """A consequence of an open incident (`_secondary_root`): SECONDARY, or UPGRADE of the root on the same GPU."""
    event = fold.event
    root = _secondary_root(event, fold.joinable(fold.incidents), fold.now_s, fold.pol)
    if root is None:
        return None
    inc, why = root
    # A counter's generic rule ("any uncorrectable ECC → reset") never overrides the Xid that names the
    # same error (Xid 94: restart): the more specific evidence decides. Evidence of its own (spare rows
    # used up: RMA) has another fault key, and upgrades as any secondary does.
    generic = fold.cls.fault_key in classify.COUNTER_FAULTS_NAMED_BY_XID and inc.xid in _NAMING_XIDS
    if _stronger(fold.cls, inc.classification) and inc.gpu_uuid == event.gpu_uuid and not generic:
        return fold.upgrade(inc)
    peers = inc.peer_gpu_uuids
    if event.gpu_uuid and event.gpu_uuid != inc.gpu_uuid and event.gpu_uuid not in peers:
        peers = (*peers, event.gpu_uuid)
    folded = dataclasses.replace(
        inc,
        secondary_keys=(*inc.secondary_keys, fold.cls.fault_key)[-_MAX_SECONDARY_KEYS:],
        peer_gpu_uuids=peers,
    )
    return fold.answer(
        fold.replace(inc, folded), Outcome.SECONDARY, folded, f"{why}: folded into incident {inc.incident_id}"
    )


def _recur(fold: _Fold) -> Correlation | None:
    """A sticky fault seen again after the dedupe window: RECURRENCE of its incident."""
    for inc in reversed(fold.same_target):
        if inc.sticky:
            again = fold.seen(inc, occurrences=inc.occurrences + 1)
            return fold.answer(
                fold.replace(inc, again),
                Outcome.RECURRENCE,
                again,
                f"sticky fault {fold.cls.fault_key} seen again within {fold.pol.sticky_window_s:g}s "
                f"(occurrence {again.occurrences} of incident {inc.incident_id})",
            )
    return None


def _open_incident(fold: _Fold) -> Correlation:
    """What no rule folded: OBSERVED when there is nothing to act on, else a NEW incident."""
    cls, event = fold.cls, fold.event
    if cls.action is classify.RecommendedAction.NONE:
        return fold.answer(fold.incidents, Outcome.OBSERVED, None, f"nothing to act on: {cls.reason}")
    xid = event.xid if event.kind is EventKind.XID else None
    new = Incident(
        incident_id=_incident_id(event, cls.fault_key),
        node_id=event.node_id,
        gpu_uuid="" if cls.component is classify.Component.IB_PORT else event.gpu_uuid,
        classification=cls,
        opened_at=fold.now_s,
        last_seen_at=fold.now_s,
        xid=xid,
        nvlink_domain=event.nvlink_domain,
        ib_port=event.ib_port,
        sticky=xid is not None and xid in fold.pol.sticky_xids,
        newest_seq=event.seq,
        newest_observed_at=event.observed_at,
    )
    return fold.answer((*fold.incidents, new), Outcome.NEW, new, f"new incident: {cls.reason}")
