"""The state the parts of the remediation service share, in one explicit object (`LadderState`).

The ladder (every node's `escalation.RemediationState`), the correlation state, the disruption
budget and the outbox's in-memory lists (what waits for admission, what was sent and is not
answered, which adapter a repair waits for) are read and changed by several parts: the decider,
dispatch, the adapters, results, the ticker, sweeps and operator commands. Each part is given this
object at construction; none keeps a copy. Every change happens under the decision lock
(`DecisionLock`), except where a part says otherwise.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
from collections.abc import Callable, Mapping

from rasd.common import xid_catalog
from rasd.controller.core.remediation import actions, blast_radius, correlate, escalation
from rasd.controller.core.remediation import policy as policy_mod
from rasd.controller.ingest import streams as streams_mod
from rasd.controller.observability import metrics as metrics_mod

DECISION_LATENCIES_KEPT = 100_000
"""Decision latencies `RemediationStats` keeps (the latest): the simulator's report and the benchmark read them."""
AGENT_KINDS = frozenset({"restart_process", "reset_gpu", "reboot_node", "run_validation"})
"""Actions carried out by the node's agent (sent as commands); the others by controller-side adapters."""


@dataclasses.dataclass
class RemediationStats:
    """What the service did (for metrics, the simulator's report and tests)."""

    events: int = 0
    decisions: int = 0
    actions_by_kind: dict[str, int] = dataclasses.field(default_factory=dict)
    decision_latency_s: collections.deque[float] = dataclasses.field(
        default_factory=lambda: collections.deque(maxlen=DECISION_LATENCIES_KEPT)
    )
    """Event stored → each action it led to handed to its executor, per such action (`Sender.note_handed_over`);
    the latest `DECISION_LATENCIES_KEPT` (the controller runs for months; Prometheus has
    ``rasd_time_to_first_action_seconds``, once per event)."""
    decision_latency_kinds: collections.deque[str] = dataclasses.field(
        default_factory=lambda: collections.deque(maxlen=DECISION_LATENCIES_KEPT)
    )
    """The action kind of each entry of decision_latency_s, at the same position: a repair that follows a
    quarantine leaves after two commits, the quarantine's and the dispatch round's."""
    policy_held_s: collections.deque[float] = dataclasses.field(
        default_factory=lambda: collections.deque(maxlen=DECISION_LATENCIES_KEPT)
    )
    """Event stored → handed over, for the actions of events the blast-radius policy held back (the
    budget, a cooldown, the breaker, a pause; `EventClock.held`): their wait is the policy's, not the
    decision's, and is kept out of decision_latency_s."""
    commit_s: collections.deque[float] = dataclasses.field(
        default_factory=lambda: collections.deque(maxlen=DECISION_LATENCIES_KEPT)
    )
    """How long each remediation transaction took the store (`Ledger.store_commit`), the latest
    `DECISION_LATENCIES_KEPT`: the store's share of the decision latencies (Prometheus has
    ``rasd_remediation_commit_seconds``)."""
    max_disrupted_nodes: int = 0
    passes: int = 0
    """Decision passes committed."""
    passes_overlapped: int = 0
    """Of those, passes decided while a pass ahead of them was still committing (`Decider`)."""


@dataclasses.dataclass(slots=True)
class EventClock:
    """When an event that led to commands was stored, and whether one of them has left yet."""

    stored_s: float
    acted: bool = False
    held: bool = False
    """Whether the blast-radius policy deferred one of its actions (`RemediationStats.policy_held_s`)."""


class DecisionLock:
    """The decision lock (an `asyncio.Lock`) that also counts who waits for it.

    The decider asks `waiting` to end a hold only when something else wants the lock.
    """

    def __init__(self) -> None:
        self._lock = asyncio.Lock()
        self.waiting = 0

    async def __aenter__(self) -> None:
        self.waiting += 1
        try:
            await self._lock.acquire()
        finally:
            self.waiting -= 1

    async def __aexit__(self, *exc_info: object) -> None:
        self._lock.release()

    def locked(self) -> bool:
        """Whether someone holds it."""
        return self._lock.locked()


@dataclasses.dataclass(eq=False)
class LadderState:
    """What the remediation service's parts share (see the module docstring)."""

    policy: policy_mod.RemediationPolicy
    clock: Callable[[], int]
    """The controller's clock, unix ns."""
    streams: streams_mod.AgentStreams
    """This replica's agent streams and the nodes' inventory (labels, GPUs), read only here."""
    metrics: metrics_mod.ControllerMetrics
    catalog: xid_catalog.XidCatalog = dataclasses.field(default_factory=xid_catalog.load_catalog)
    lock: DecisionLock = dataclasses.field(default_factory=DecisionLock)
    stats: RemediationStats = dataclasses.field(default_factory=RemediationStats)
    node_states: dict[str, escalation.RemediationState] = dataclasses.field(default_factory=dict)
    correlation: correlate.CorrelationState = dataclasses.field(default_factory=correlate.CorrelationState)
    budget: blast_radius.BudgetState = dataclasses.field(default_factory=blast_radius.BudgetState)
    budget_stored: blast_radius.BudgetState | None = None
    """The budget as the store holds it (None: never written); only a changed budget is written."""
    deferred: dict[str, actions.Action] = dataclasses.field(default_factory=dict)
    """Command id → an action in the outbox pending: waiting for admission."""
    unanswered: dict[str, actions.Action] = dataclasses.field(default_factory=dict)
    """Agent commands dispatched and not yet answered, re-sent when their node reconnects."""
    kinds: dict[str, str] = dataclasses.field(default_factory=dict)
    """Command id → its action kind, from dispatch until it is finished (counted by kind and outcome)."""
    event_times: dict[str, EventClock] = dataclasses.field(default_factory=dict)
    """Command id → when the event that led to it was stored, until the command leaves (`Sender.note_handed_over`)."""
    running: dict[str, actions.Action] = dataclasses.field(default_factory=dict)
    """Controller-side actions whose adapter was called, until their outcome is committed."""
    adapter_of_ticket: dict[str, str] = dataclasses.field(default_factory=dict)
    """Ticket id → the command id of its controller-side action whose adapter runs now."""
    held: dict[str, list[actions.Action]] = dataclasses.field(default_factory=dict)
    """Command id of a running adapter → the agent commands of its ticket that wait for it to return."""
    held_by: dict[str, str] = dataclasses.field(default_factory=dict)
    """Agent command id → the command id it waits for (`held`)."""
    quarantine_gauge_stale: bool = False
    """A commit changed quarantines: the next tick refreshes ``rasd_quarantined`` (`Ticker.tick`)."""
    term_ended: bool = False
    """The service stopped and has not started since: nothing is decided (`TermEnded`)."""
    topology: dict[str, dict[str, str]] = dataclasses.field(default_factory=dict)
    """Node → blast-radius domains read from the scheduler (Kubernetes Node labels, `node_sync`); laid over
    the agent's own labels (agent.toml), which stay the fallback for what the scheduler does not say."""
    topology_version: int = 0
    """Moves with every change of `topology` (`set_topology`)."""
    _fleet: blast_radius.FleetView | None = None
    _fleet_version: tuple[int, int] = (-1, -1)
    """The labels' and the topology's versions the fleet view was built from."""

    def clear_transient(self) -> None:
        """Forget the outbox's in-memory lists: a new term starts from the store alone."""
        for transient in (
            self.deferred,
            self.unanswered,
            self.kinds,
            self.event_times,
            self.running,
            self.adapter_of_ticket,
            self.held,
            self.held_by,
        ):
            transient.clear()

    def now_s(self) -> float:
        """The clock's reading, in seconds."""
        return self.clock() / 1e9

    def state_of(self, node_id: str) -> escalation.RemediationState:
        """The node's ladder state (a fresh one for a node with none)."""
        return self.node_states.get(node_id) or escalation.RemediationState(node_id)

    def fleet_view(self) -> blast_radius.FleetView:
        """The fleet as the budget sees it; rebuilt only when a node's labels changed.

        Kept between passes so that its per-domain node counts are computed once, not on every
        admission (a fleet-wide count costs milliseconds per pass); the streams count label changes, so
        telling whether anything changed is one compare.
        """
        labels = self.streams.node_labels
        if self._fleet is None or self._fleet_version != (labels.version, self.topology_version):
            # A node's GPUs are set with its labels (its Hello), so the labels' version covers them.
            self._fleet_version = (labels.version, self.topology_version)
            self._fleet = blast_radius.FleetView(
                node_labels={n: self.labels_of(n, v) for n, v in labels.items()},
                node_gpu_counts={n: len(self.streams.node_gpus(n)) for n in labels},
            )
        return self._fleet

    def labels_of(self, node_id: str, agent_labels: Mapping[str, str]) -> dict[str, str]:
        """A node's labels as the ladder reads them: the agent's, with the scheduler's topology over them."""
        topology = self.topology.get(node_id)
        return {**agent_labels, **topology} if topology else dict(agent_labels)

    def set_topology(self, topology: Mapping[str, Mapping[str, str]]) -> bool:
        """Take the scheduler's topology (`node_sync`); True when it changed (the fleet view is rebuilt)."""
        fresh = {node: dict(domains) for node, domains in topology.items() if domains}
        if fresh == self.topology:
            return False
        self.topology = fresh
        self.topology_version += 1
        return True
