"""Disruption budget, circuit breaker, storm cooldown and pause, alone and behind the ladder."""

from __future__ import annotations

import collections
import dataclasses
import json

from hypothesis import given, settings
from hypothesis import strategies as st

from rasd.common import xid_catalog
from rasd.controller.core.remediation import actions, blast_radius, correlate, escalation, policy
from rasd.controller.core.remediation import events as health

CATALOG = xid_catalog.load_catalog()
T0 = 1_780_000_000.0


def fleet(nodes: int = 200, rack_size: int = 10, feeds: int = 4) -> blast_radius.FleetView:
    return blast_radius.FleetView(
        {
            f"n{i:03d}": {
                "rack": f"r{i // rack_size:02d}",
                "nvlink_domain": f"nvl{i // rack_size:02d}",
                "power_feed": f"pdu{i % feeds}",
            }
            for i in range(nodes)
        }
    )


def node_pair(node: str, ticket: str | None = None) -> list[actions.Action]:
    tid = ticket or f"t-{node}"
    return [
        actions.QuarantineNode(ticket_id=tid, step=0, node_id=node),
        actions.RebootNode(ticket_id=tid, step=1, node_id=node),
    ]


NO_BREAKER = policy.DisruptionPolicy(breaker_quarantine_pct=100.0)


def out_of_service(state: blast_radius.BudgetState, view: blast_radius.FleetView) -> tuple[int, dict]:
    out = state.disrupted_nodes()
    per_domain: dict[tuple[str, str], int] = collections.Counter()
    for node in out:
        for label, value in view.node_labels[node].items():
            per_domain[(label, value)] += 1
    return len(out), per_domain


def test_the_cluster_cap_is_the_smaller_of_count_and_percentage():
    view = fleet(nodes=100, rack_size=100, feeds=1)
    pol = policy.DisruptionPolicy(
        breaker_quarantine_pct=100.0,
        max_disrupted_nodes=8,
        max_disrupted_nodes_pct=3.0,
        domain_max_nodes={},
        domain_max_pct={},
    )
    proposed = [a for i in range(10) for a in node_pair(f"n{i:03d}")]
    _admitted, deferred, state, reasons = blast_radius.admit(
        blast_radius.BudgetState(), proposed, view, now_s=T0, policy=pol
    )
    assert len(state.disrupted_nodes()) == 3
    assert len(deferred) == 14 and len(reasons) == 14
    assert "cluster budget allows 3" in reasons[0]


def test_per_rack_cap_keeps_a_tickets_actions_together():
    view = fleet()
    proposed = [a for i in range(5) for a in node_pair(f"n{i:03d}")]  # all in rack r00
    admitted, deferred, _state, _ = blast_radius.admit(
        blast_radius.BudgetState(), proposed, view, now_s=T0, policy=NO_BREAKER
    )
    # rack r00: min(2, 25% of 10 = 2); nvlink domain nvl00: min(1, ...) = 1.
    assert [(a.kind, a.node_id) for a in admitted] == [("quarantine_node", "n000"), ("reboot_node", "n000")]
    assert all(isinstance(a, actions.QuarantineNode | actions.RebootNode) for a in deferred)
    assert {a.node_id for a in deferred} == {"n001", "n002", "n003", "n004"}


def test_percentage_caps_floor_at_one_node_so_small_domains_can_repair():
    view = blast_radius.FleetView({"a": {"rack": "tiny"}, "b": {"rack": "tiny"}})
    pol = policy.DisruptionPolicy(breaker_min_nodes=10, domain_max_nodes={}, domain_max_pct={"rack": 1.0})
    admitted, deferred, _, _ = blast_radius.admit(
        blast_radius.BudgetState(), node_pair("a") + node_pair("b"), view, now_s=T0, policy=pol
    )
    assert {a.node_id for a in admitted} == {"a"}
    assert {a.node_id for a in deferred} == {"b"}


def test_gpu_level_actions_and_notifications_do_not_use_the_node_budget():
    view = fleet(nodes=10, rack_size=10)
    pol = policy.DisruptionPolicy(max_disrupted_nodes=0, breaker_quarantine_pct=100.0)
    proposed = [
        actions.QuarantineGpu(ticket_id="t1", step=0, node_id="n000", gpu_uuid="GPU-1"),
        actions.ResetGpu(ticket_id="t1", step=1, node_id="n000", gpu_uuid="GPU-1"),
        actions.Notify(ticket_id="t2", step=0, node_id="n001", summary="hi"),
        *node_pair("n002"),
    ]
    admitted, deferred, _, _ = blast_radius.admit(blast_radius.BudgetState(), proposed, view, now_s=T0, policy=pol)
    assert [a.kind for a in admitted] == ["quarantine_gpu", "reset_gpu", "notify"]
    assert [a.kind for a in deferred] == ["quarantine_node", "reboot_node"]


def test_results_and_releases_free_the_budget():
    view = fleet()
    state = blast_radius.BudgetState()
    admitted, deferred, state, _ = blast_radius.admit(
        state, node_pair("n000") + node_pair("n001"), view, now_s=T0, policy=NO_BREAKER
    )
    assert {a.node_id for a in deferred} == {"n001"}
    reboot = next(a for a in admitted if a.kind == "reboot_node")
    state = blast_radius.complete(state, reboot.command_id, now_s=T0 + 60)
    assert state.disrupted_nodes() == {"n000"}  # still quarantined until validated and released
    release = actions.Release(ticket_id="t-n000", step=3, node_id="n000")
    admitted, deferred, state, _ = blast_radius.admit(
        state, [release, *deferred], view, now_s=T0 + 120, policy=NO_BREAKER
    )
    assert [a.kind for a in admitted] == ["release", "quarantine_node", "reboot_node"]
    assert state.disrupted_nodes() == {"n001"}


def test_pause_defers_everything_but_notifications_and_rma_paperwork_until_resume():
    view = fleet(nodes=20)
    state = blast_radius.pause(blast_radius.BudgetState(), now_s=T0, reason="maintenance window")
    proposed = [
        actions.ResetGpu(ticket_id="t1", step=0, node_id="n000", gpu_uuid="GPU-1"),
        actions.OpenRma(ticket_id="t2", step=0, node_id="n001", gpu_uuid="GPU-2"),
        actions.Notify(ticket_id="t2", step=1, node_id="n001"),
    ]
    admitted, deferred, state, reasons = blast_radius.admit(state, proposed, view, now_s=T0, policy=NO_BREAKER)
    assert [a.kind for a in admitted] == ["open_rma", "notify"]
    assert [a.kind for a in deferred] == ["reset_gpu"]
    assert "maintenance window" in reasons[0]
    state = blast_radius.resume(state, now_s=T0 + 60, policy=NO_BREAKER)
    admitted, deferred, _, _ = blast_radius.admit(state, deferred, view, now_s=T0 + 60, policy=NO_BREAKER)
    assert [a.kind for a in admitted] == ["reset_gpu"]


def test_a_storm_that_drains_starts_a_cooldown_for_new_node_actions():
    view = fleet(nodes=40, rack_size=40, feeds=1)
    pol = policy.DisruptionPolicy(
        max_disrupted_nodes=1,
        breaker_quarantine_pct=100.0,
        storm_cooldown_s=600.0,
        domain_max_nodes={},
        domain_max_pct={},
    )
    state = blast_radius.BudgetState()
    admitted, deferred, state, _ = blast_radius.admit(
        state, node_pair("n000") + node_pair("n001"), view, now_s=T0, policy=pol
    )
    assert state.storm_active
    state = blast_radius.complete(state, admitted[1].command_id, now_s=T0 + 10)
    release = actions.Release(ticket_id="t-n000", step=2, node_id="n000")
    admitted, deferred, state, _ = blast_radius.admit(state, [release, *deferred], view, now_s=T0 + 20, policy=pol)
    assert not deferred  # the last waiting node got in: the storm is over, the cooldown starts
    assert not state.storm_active and state.cooldown_until == T0 + 20 + 600
    state = blast_radius.complete(state, admitted[-1].command_id, now_s=T0 + 30)
    _, _, state, _ = blast_radius.admit(
        state, [actions.Release(ticket_id="t-n001", step=2, node_id="n001")], view, now_s=T0 + 40, policy=pol
    )
    assert state.disrupted_nodes() == frozenset()
    _, deferred, _, reasons = blast_radius.admit(state, node_pair("n002"), view, now_s=T0 + 100, policy=pol)
    assert len(deferred) == 2 and "cooldown" in reasons[0]
    admitted, _, _, _ = blast_radius.admit(state, node_pair("n002"), view, now_s=T0 + 621, policy=pol)
    assert len(admitted) == 2


def test_a_wait_for_a_domain_cap_is_no_storm_and_the_rest_of_the_fleet_repairs_on():
    """Two GPUs off the bus in one NVLink domain: one node after the other, and no fleet-wide cooldown after."""
    view = fleet(nodes=200, rack_size=8)
    pol = policy.DisruptionPolicy(breaker_quarantine_pct=100.0, storm_cooldown_s=600.0)
    admitted, deferred, state, reasons = blast_radius.admit(
        blast_radius.BudgetState(), node_pair("n000") + node_pair("n001"), view, now_s=T0, policy=pol
    )
    assert [a.node_id for a in admitted] == ["n000", "n000"] and [a.node_id for a in deferred] == ["n001", "n001"]
    assert "nvlink_domain nvl00 allows 1" in reasons[0]
    assert not state.storm_active and state.cooldown_until is None
    reboot = admitted[1]
    # Meanwhile a node of another domain is repaired at once.
    admitted, deferred, state, _ = blast_radius.admit(
        state, [*deferred, *node_pair("n020")], view, now_s=T0 + 5, policy=pol
    )
    assert {a.node_id for a in admitted} == {"n020"} and {a.node_id for a in deferred} == {"n001"}
    # n000 comes back: n001 goes next, and no cooldown holds the fleet's next repair.
    state = blast_radius.complete(state, reboot.command_id, now_s=T0 + 10)
    release = actions.Release(ticket_id="t-n000", step=2, node_id="n000")
    admitted, deferred, state, _ = blast_radius.admit(state, [release, *deferred], view, now_s=T0 + 20, policy=pol)
    assert not deferred and {a.node_id for a in admitted} == {"n000", "n001"}
    assert not state.storm_active and state.cooldown_until is None
    admitted, deferred, _, _ = blast_radius.admit(state, node_pair("n030"), view, now_s=T0 + 21, policy=pol)
    assert len(admitted) == 2 and not deferred


def test_budget_state_round_trips_through_json():
    view = fleet()
    _, _, state, _ = blast_radius.admit(
        blast_radius.BudgetState(), node_pair("n000"), view, now_s=T0, policy=NO_BREAKER
    )
    state = blast_radius.pause(state, now_s=T0, reason="x")
    document = json.loads(json.dumps(state.to_dict()))
    demand = json.loads(json.dumps(blast_radius.demand_documents({}, state.demand)))
    assert "demand" not in document and list(demand) == [repr(T0)]
    assert blast_radius.BudgetState.from_dict(document).with_demand(demand.values()) == state


def test_the_breakers_demand_is_stored_as_one_document_per_first_proposal_time():
    """A commit writes only the demand it added or let expire, not every node's (~80 KB in a 2,000-node burst)."""
    view = fleet()
    pol = policy.DisruptionPolicy(breaker_quarantine_pct=100.0, breaker_window_s=600.0)
    state = blast_radius.BudgetState()
    documents: dict[str, dict] = {}
    written = []
    for now, nodes in ((T0, ["n000", "n001"]), (T0 + 1, ["n002"]), (T0 + 1, ["n003"]), (T0 + 700, ["n004"])):
        proposed = [a for n in nodes for a in node_pair(n)]
        _, _, after, _ = blast_radius.admit(state, proposed, view, now_s=now, policy=pol)
        changed = blast_radius.demand_documents(state.demand, after.demand)
        written.append(changed)
        for key, doc in changed.items():
            if doc is None:
                del documents[key]
            else:
                documents[key] = json.loads(json.dumps(doc))
        state = after
        assert blast_radius.BudgetState().with_demand(documents.values()).demand == state.demand
    assert written[0] == {repr(T0): {"at": T0, "nodes": ["n000", "n001"]}}
    assert written[1] == {repr(T0 + 1): {"at": T0 + 1, "nodes": ["n002"]}}, "the earlier time is left alone"
    assert written[2] == {repr(T0 + 1): {"at": T0 + 1, "nodes": ["n002", "n003"]}}, "the same time: one document"
    assert written[3] == {repr(T0): None, repr(T0 + 1): None, repr(T0 + 700): {"at": T0 + 700, "nodes": ["n004"]}}
    # A document from before the demand was stored apart still holds it: it is kept, and the earliest time wins.
    legacy = blast_radius.BudgetState.from_dict({"demand": [["n004", T0 + 650], ["n005", T0 + 690]]})
    merged = legacy.with_demand(documents.values()).demand
    assert merged == {"n004": T0 + 650, "n005": T0 + 690} and list(merged) == ["n004", "n005"], "oldest first"


def _gpu_quarantine(node: str, gpu: int, ticket: str | None = None) -> actions.QuarantineGpu:
    return actions.QuarantineGpu(
        ticket_id=ticket or f"t-{node}-{gpu}", step=0, node_id=node, gpu_uuid=f"{node}-GPU-{gpu}"
    )


def test_a_node_whose_every_gpu_is_quarantined_counts_as_out_of_service():
    """The last GPU in service's quarantine takes the node out (the Kubernetes adapter taints it NoSchedule):
    it is admitted under the node caps, and the node counts against them until a GPU is released."""
    view = dataclasses.replace(
        fleet(nodes=100, rack_size=100, feeds=1), node_gpu_counts=dict.fromkeys(fleet(100).node_labels, 2)
    )
    pol = policy.DisruptionPolicy(
        breaker_quarantine_pct=100.0, max_disrupted_nodes=1, domain_max_nodes={}, domain_max_pct={}
    )
    state = blast_radius.BudgetState()
    admitted, deferred, state, _ = blast_radius.admit(state, [_gpu_quarantine("n000", 0)], view, now_s=T0, policy=pol)
    assert len(admitted) == 1 and state.disrupted_nodes() == set(), "one of two GPUs: the node still serves"
    admitted, deferred, state, _ = blast_radius.admit(state, [_gpu_quarantine("n000", 1)], view, now_s=T0, policy=pol)
    assert len(admitted) == 1 and state.disrupted_nodes() == {"n000"}, "its last GPU: the node is out"
    # The cluster allows one node out: another node's quarantine, or another node's last GPU, waits.
    proposed = [*node_pair("n001"), _gpu_quarantine("n002", 0), _gpu_quarantine("n002", 1)]
    admitted, deferred, state, reasons = blast_radius.admit(state, proposed, view, now_s=T0, policy=pol)
    assert [a.kind for a in admitted] == ["quarantine_gpu"], "n002's first GPU: the node still serves"
    assert [(a.kind, a.node_id) for a in deferred] == [
        ("quarantine_node", "n001"), ("reboot_node", "n001"), ("quarantine_gpu", "n002")
    ]  # fmt: skip
    assert reasons[2] == (
        "quarantine_gpu on n002 waits: it is the node's last GPU in service, and the cluster budget allows 1 "
        "nodes out of service at once and 1 are"
    )
    assert blast_radius.free_node_slots(state, view, now_s=T0, policy=pol) == 0
    # A GPU of n000 released: the node is back, and the budget takes the next one.
    release = actions.Release(ticket_id="t-n000-1", step=3, node_id="n000", gpu_uuid="n000-GPU-1")
    admitted, deferred, state, _ = blast_radius.admit(state, [release, *deferred], view, now_s=T0, policy=pol)
    assert [a.kind for a in admitted] == ["release", "quarantine_node", "reboot_node"]
    assert state.disrupted_nodes() == {"n001"} and [a.node_id for a in deferred] == ["n002"]
    assert state.quarantined_gpus == {"n000": {"n000-GPU-0"}, "n002": {"n002-GPU-0"}}


def test_a_node_whose_gpu_count_drops_under_its_quarantined_gpus_is_counted_out_at_the_next_call():
    """A GPU that falls off the bus leaves its node's Hello with fewer GPUs: if every one left is quarantined,
    the node is out of service though no quarantine or release of its own came; the budget must see it."""
    pol = policy.DisruptionPolicy(
        breaker_quarantine_pct=100.0, max_disrupted_nodes=1, domain_max_nodes={}, domain_max_pct={}
    )
    eight = dataclasses.replace(fleet(nodes=10), node_gpu_counts={"n000": 2, "n001": 2})
    _, _, state, _ = blast_radius.admit(
        blast_radius.BudgetState(), [_gpu_quarantine("n000", 0)], eight, now_s=T0, policy=pol
    )
    assert (
        state.disrupted_nodes() == frozenset() and blast_radius.free_node_slots(state, eight, now_s=T0, policy=pol) == 1
    )
    fell_off = dataclasses.replace(eight, node_gpu_counts={"n000": 1, "n001": 2})  # n000's Hello: one GPU left
    assert blast_radius.free_node_slots(state, fell_off, now_s=T0, policy=pol) == 0
    admitted, deferred, state, reasons = blast_radius.admit(state, node_pair("n001"), fell_off, now_s=T0, policy=pol)
    assert admitted == () and len(deferred) == 2, "n000 is out: the cluster's one slot is taken"
    assert "the cluster budget allows 1 nodes out of service at once and 1 are" in reasons[0]
    assert state.disrupted_nodes() == {"n000"}
    back = dataclasses.replace(eight)  # its GPU is back (a new view, as a Hello makes)
    admitted, _, state, _ = blast_radius.admit(state, node_pair("n001"), back, now_s=T0, policy=pol)
    assert len(admitted) == 2 and state.disrupted_nodes() == {"n001"}


def test_the_gpus_automation_holds_are_not_in_the_budget_document_but_rebuilt_from_the_store():
    """The store's quarantine rows are their durable record; the document (rewritten on most commits) stays small."""
    view = dataclasses.replace(fleet(nodes=10), node_gpu_counts={"n000": 2, "n002": 2})
    state = blast_radius.BudgetState(quarantined_nodes=("n001",)).with_quarantined_gpus(
        [("n000", "GPU-a"), ("n000", "GPU-b"), ("n002", "GPU-c")], view
    )
    assert state.disrupted_nodes() == {"n000", "n001"}, "n000 has no GPU left in service"
    document = json.loads(json.dumps(state.to_dict()))
    assert "quarantined_gpus" not in document and "emptied_nodes" not in document
    loaded = blast_radius.BudgetState.from_dict(document)
    assert loaded.same_document(state) and loaded.quarantined_gpus == {} and loaded.emptied_nodes == frozenset()
    assert loaded.with_quarantined_gpus([("n000", "GPU-a"), ("n000", "GPU-b"), ("n002", "GPU-c")], view) == state
    released = state.with_gpu("n000", "GPU-a", view, held=False)
    assert released.disrupted_nodes() == {"n001"} and released.quarantined_gpus["n000"] == {"GPU-b"}
    assert released.with_gpu("n000", "GPU-a", view, held=True) == state
    assert not state.same_document(dataclasses.replace(state, paused=True))


# ---- the acceptance scenario: 100 nodes failing at once -------------------------------------


def _fail_nodes(nodes: list[str], pol: policy.RemediationPolicy, now: float) -> tuple[dict, list[actions.Action]]:
    """Xid 79 on every node, through correlate and the ladder; returns node states and proposals."""
    states = {}
    proposed: list[actions.Action] = []
    corr = correlate.CorrelationState()
    for node in nodes:
        ev = health.HealthEvent(
            node_id=node, kind=health.EventKind.XID, observed_at=now, gpu_uuid=f"{node}-GPU-0", xid=79
        )
        c = correlate.correlate(corr, ev, now_s=now, catalog=CATALOG, policy=pol)
        corr = c.state
        d = escalation.decide(escalation.RemediationState(node), c.incident, now_s=now, policy=pol.escalation)
        states[node] = d.state
        proposed.extend(d.actions)
    return states, proposed


def test_a_hundred_nodes_failing_at_once_trip_the_breaker_which_holds_until_resumed():
    view = fleet()
    pol = policy.RemediationPolicy()
    _, proposed = _fail_nodes(sorted(view.node_labels)[:100], pol, T0)
    assert len(proposed) == 200

    admitted, deferred, state, reasons = blast_radius.admit(
        blast_radius.BudgetState(), proposed, view, now_s=T0, policy=pol.disruption
    )
    assert state.breaker_tripped
    assert [a.kind for a in admitted] == ["notify"] and admitted[0].severity == "critical"
    assert "circuit breaker tripped" in reasons[-1]
    assert len(deferred) == 200

    # It holds: hours later, nothing node-level gets through, and no second trip notice.
    for hour in range(1, 6):
        admitted, deferred, state, _ = blast_radius.admit(
            state, deferred, view, now_s=T0 + hour * 3600, policy=pol.disruption
        )
        assert admitted == () and len(deferred) == 200 and state.breaker_tripped

    # An operator resumes; after the cooldown the backlog drains within the budget, never above it.
    state = blast_radius.resume(state, now_s=T0 + 6 * 3600, policy=pol.disruption)
    now = T0 + 6 * 3600 + pol.disruption.storm_cooldown_s
    done = set()
    for _ in range(200):
        admitted, deferred, state, _ = blast_radius.admit(state, deferred, view, now_s=now, policy=pol.disruption)
        assert not state.breaker_tripped
        count, per_domain = out_of_service(state, view)
        assert count <= 8  # min(8, 5% of 200 = 10)
        assert max(per_domain.values(), default=0) <= 4
        assert all(n <= 1 for (label, _), n in per_domain.items() if label in ("rack", "nvlink_domain"))
        # every admitted reboot finishes, and its node is validated and released
        for action in admitted:
            if action.kind == "reboot_node":
                state = blast_radius.complete(state, action.command_id, now_s=now)
                deferred = (*deferred, actions.Release(ticket_id=action.ticket_id, step=99, node_id=action.node_id))
                done.add(action.node_id)
        now += 60
        if not deferred:
            break
    assert len(done) == 100
    assert state.disrupted_nodes() == frozenset()


def test_the_budget_alone_never_exceeds_its_caps_under_a_hundred_failures():
    view = fleet()
    pol = policy.RemediationPolicy(disruption=NO_BREAKER)
    _, proposed = _fail_nodes(sorted(view.node_labels)[:100], pol, T0)
    admitted, _deferred, state, _ = blast_radius.admit(
        blast_radius.BudgetState(), proposed, view, now_s=T0, policy=pol.disruption
    )
    count, per_domain = out_of_service(state, view)
    assert count == 8  # the cluster cap min(8, 5% of 200)
    assert all(n <= 1 for (label, _), n in per_domain.items() if label in ("rack", "nvlink_domain"))
    assert all(n <= 4 for (label, _), n in per_domain.items() if label == "power_feed")
    assert len([a for a in admitted if a.kind == "reboot_node"]) == count
    assert not state.breaker_tripped and state.storm_active
    # no reboot admitted without its quarantine
    admitted_nodes = {a.node_id for a in admitted if a.kind == "quarantine_node"}
    assert {a.node_id for a in admitted if a.kind == "reboot_node"} == admitted_nodes


def test_a_wave_of_gpu_faults_trips_the_breaker_and_a_wave_of_process_restarts_does_not():
    """A bad driver push faults GPUs on every node at once; one job's crash restarts processes on all its nodes."""
    view = fleet()
    pol = policy.DisruptionPolicy()

    def gpu_repairs(node: str) -> list[actions.Action]:
        return [
            actions.QuarantineGpu(ticket_id=f"{node}/t", step=0, node_id=node, gpu_uuid="GPU-1"),
            actions.ResetGpu(ticket_id=f"{node}/t", step=1, node_id=node, gpu_uuid="GPU-1"),
        ]

    wave = [a for node in sorted(view.node_labels)[:40] for a in gpu_repairs(node)]
    admitted, deferred, state, reasons = blast_radius.admit(
        blast_radius.BudgetState(), wave, view, now_s=T0, policy=pol
    )
    assert state.breaker_tripped and "40 of 200 nodes" in reasons[-1]
    assert [a.kind for a in admitted] == ["notify"] and len(deferred) == 80
    crash = [
        actions.RestartProcess(ticket_id=f"{node}/job", step=0, node_id=node, gpu_uuid="GPU-1")
        for node in sorted(view.node_labels)[:100]
    ]
    admitted, _, state, _ = blast_radius.admit(blast_radius.BudgetState(), crash, view, now_s=T0, policy=pol)
    assert not state.breaker_tripped and len(admitted) == 100


def test_new_failures_after_a_resume_can_trip_the_breaker_again():
    view = fleet(nodes=50, rack_size=5)
    pol = policy.DisruptionPolicy()
    first = [a for i in range(10) for a in node_pair(f"n{i:03d}")]
    _, deferred, state, _ = blast_radius.admit(blast_radius.BudgetState(), first, view, now_s=T0, policy=pol)
    assert state.breaker_tripped and state.trips == 1
    state = blast_radius.resume(state, now_s=T0 + 100, policy=pol)
    _, deferred, state, _ = blast_radius.admit(state, deferred, view, now_s=T0 + 101, policy=pol)
    assert not state.breaker_tripped  # the acknowledged backlog does not re-trip it
    fresh = [a for i in range(10, 20) for a in node_pair(f"n{i:03d}")]
    admitted, _, state, _ = blast_radius.admit(state, [*deferred, *fresh], view, now_s=T0 + 200, policy=pol)
    assert state.breaker_tripped and state.trips == 2
    assert admitted[-1].ticket_id == "breaker/2"


# ---- property: whatever arrives, the caps hold ---------------------------------------------

_PROPERTY_FLEET = dataclasses.replace(
    fleet(nodes=60, rack_size=6, feeds=3), node_gpu_counts={f"n{i:03d}": 2 for i in range(60)}
)  # two GPUs a node: quarantining both takes it out of service
_PROPERTY_POLICY = policy.DisruptionPolicy(breaker_quarantine_pct=50.0, breaker_window_s=300.0)
_NODES = sorted(_PROPERTY_FLEET.node_labels)

budget_ops = st.lists(
    st.one_of(
        st.tuples(st.just("fail"), st.lists(st.sampled_from(_NODES), min_size=1, max_size=30, unique=True)),
        st.tuples(
            st.just("gpu_fail"),
            st.lists(st.tuples(st.sampled_from(_NODES), st.integers(0, 1)), min_size=1, max_size=30, unique=True),
        ),
        st.tuples(st.just("gpu_release"), st.integers(min_value=0, max_value=20)),
        st.tuples(st.just("finish"), st.integers(min_value=0, max_value=20)),
        st.tuples(st.just("advance"), st.sampled_from([-5.0, 1.0, 30.0, 400.0, 3600.0])),  # -5: a clock set back
        st.tuples(st.just("resume")),
        st.tuples(st.just("pause")),
    ),
    max_size=30,
)


def _breaker_nodes(proposed: list[actions.Action]) -> set[str]:
    """The nodes whose proposals count toward the breaker (the module doc's rule)."""
    return {
        a.node_id
        for a in proposed
        if (a.node_disruptive or a.kind in ("quarantine_gpu", "reset_gpu")) and not getattr(a, "planned", False)
    }


@settings(max_examples=200, deadline=None)
@given(sequence=budget_ops)
def test_random_failures_never_exceed_the_budget(sequence):
    pol = _PROPERTY_POLICY
    state = blast_radius.BudgetState()
    backlog: list[actions.Action] = []
    running: list[actions.Action] = []
    demand_documents: dict[str, dict] = {}  # the store's demand documents, changed as the service does
    now = T0
    for round_no, op in enumerate(sequence):
        if op[0] == "fail":
            backlog.extend(a for n in op[1] for a in node_pair(n, ticket=f"t-{n}-{round_no}"))
        elif op[0] == "gpu_fail":
            backlog.extend(_gpu_quarantine(n, gpu, ticket=f"t-{n}-{gpu}-{round_no}") for n, gpu in op[1])
        elif op[0] == "gpu_release" and state.quarantined_gpus:
            held = sorted((n, g) for n, gpus in state.quarantined_gpus.items() for g in gpus)
            node, gpu = held[op[1] % len(held)]
            backlog.append(actions.Release(ticket_id=f"rel-{gpu}-{round_no}", step=0, node_id=node, gpu_uuid=gpu))
        elif op[0] == "finish" and running:
            done = running.pop(op[1] % len(running))
            state = blast_radius.complete(state, done.command_id, now_s=now)
            backlog.append(actions.Release(ticket_id=f"rel-{done.command_id}", step=0, node_id=done.node_id))
        elif op[0] == "advance":
            now += op[1]
        elif op[0] == "resume":
            state = blast_radius.resume(state, now_s=now, policy=pol)
        elif op[0] == "pause":
            state = blast_radius.pause(state, now_s=now, reason="test")
        was_tripped = state.breaker_tripped
        before = state
        backlog_in = list(backlog)
        admitted, deferred, state, reasons = blast_radius.admit(state, backlog, _PROPERTY_FLEET, now_s=now, policy=pol)
        for key, doc in blast_radius.demand_documents(before.demand, state.demand).items():
            if doc is None:
                del demand_documents[key]
            else:
                demand_documents[key] = doc
        assert blast_radius.BudgetState().with_demand(demand_documents.values()).demand == state.demand
        # The demand is kept oldest first, and read at its ends only; the same as a pass over every entry:
        assert list(state.demand.values()) == sorted(state.demand.values())
        window = pol.breaker_window_s
        kept = {n: at for n, at in before.demand.items() if n in _breaker_nodes(backlog_in) or now - at <= window}
        assert state.demand == {**kept, **{n: now for n in _breaker_nodes(backlog_in) if n not in kept}}
        assert blast_radius._fresh_demand(state.demand, now_s=now, window_s=window, resumed_at=state.resumed_at) == sum(
            1
            for at in state.demand.values()
            if now - at <= window and (state.resumed_at is None or at > state.resumed_at)
        )
        backlog = list(deferred)
        running.extend(a for a in admitted if a.kind == "reboot_node")
        assert len(reasons) >= len(deferred)
        count, per_domain = out_of_service(state, _PROPERTY_FLEET)
        assert count <= 3  # min(8, 5% of 60)
        assert all(n <= 1 for (label, _), n in per_domain.items() if label == "nvlink_domain")
        assert all(n <= 1 for (label, _), n in per_domain.items() if label == "rack")  # min(2, 25% of 6)
        if state.paused:  # an operator's pause holds everything but telling people
            assert all(a.kind in ("notify", "open_rma") for a in admitted)
        elif was_tripped:  # the breaker stops new disruptions; repairs in flight still validate and release (rule 3)
            assert all(a.kind in ("notify", "open_rma", "run_validation", "release") for a in admitted)
        for a in admitted:  # a reboot is never admitted without its node being out of service
            if a.kind == "reboot_node":
                assert a.node_id in state.disrupted_nodes()
        assert all(state.quarantined_gpus.values()), "a node whose GPUs were all released is not listed"


def test_a_tripped_breaker_lets_the_repairs_in_flight_validate_and_release():
    """100 of 256 nodes lose a GPU at once: the 8 rebooted before the trip are validated and returned."""
    view = fleet(nodes=256, rack_size=8)
    pol = policy.RemediationPolicy()
    nodes = sorted(view.node_labels)
    first_states, first = _fail_nodes(nodes[::33], pol, T0)  # 8 nodes of 8 racks and 4 feeds: no domain cap binds
    admitted, deferred, state, _ = blast_radius.admit(
        blast_radius.BudgetState(), first, view, now_s=T0, policy=pol.disruption
    )
    assert not deferred and not state.breaker_tripped
    rebooted = {a.node_id: a for a in admitted if a.kind == "reboot_node"}
    assert len(rebooted) == 8
    _, storm = _fail_nodes([n for n in nodes if n not in rebooted][:92], pol, T0 + 60)
    _, deferred, state, _ = blast_radius.admit(state, storm, view, now_s=T0 + 60, policy=pol.disruption)
    assert state.breaker_tripped and len(deferred) == len(storm)

    # The reboots come back: each ladder asks for its post-repair validation, then releases on a pass.
    now = T0 + 300
    validations = []
    for node, reboot in rebooted.items():
        state = blast_radius.complete(state, reboot.command_id, now_s=now)
        ladder = escalation.mark_dispatched(first_states[node], reboot.command_id, now_s=T0)
        done = escalation.on_result(
            ladder, escalation.ActionResult(reboot.command_id, escalation.Outcome.SUCCEEDED), now_s=now,
            policy=pol.escalation,
        )  # fmt: skip
        first_states[node] = done.state
        validations.extend(done.actions)
    assert [a.kind for a in validations] == ["run_validation"] * 8
    admitted, deferred, state, _ = blast_radius.admit(
        state, [*deferred, *validations], view, now_s=now, policy=pol.disruption
    )
    assert sorted(a.node_id for a in admitted) == sorted(rebooted)  # the validations, nothing new
    assert {a.kind for a in admitted} == {"run_validation"} and len(deferred) == len(storm)

    releases = []
    for validation in admitted:
        ladder = escalation.mark_dispatched(first_states[validation.node_id], validation.command_id, now_s=now)
        passed = escalation.on_result(
            ladder,
            escalation.ActionResult(validation.command_id, escalation.Outcome.SUCCEEDED, validation_verdict="pass"),
            now_s=now + 60,
            policy=pol.escalation,
        )
        releases.extend(passed.actions)
    admitted, deferred, state, _ = blast_radius.admit(
        state, [*deferred, *releases], view, now_s=now + 60, policy=pol.disruption
    )
    assert {a.kind for a in admitted} == {"release"} and {a.node_id for a in admitted} == set(rebooted)
    assert state.breaker_tripped and len(deferred) == len(storm)  # still nothing new gets through
    assert not set(rebooted) & state.disrupted_nodes()
