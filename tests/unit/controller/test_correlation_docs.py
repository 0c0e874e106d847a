"""The correlation state is stored per scope: only what a decision changed is written, and it rebuilds."""

from __future__ import annotations

import hypothesis
from hypothesis import strategies as st

from rasd.common import xid_catalog
from rasd.controller.core.remediation import correlate, policy
from rasd.controller.core.remediation import events as health
from rasd.controller.remediation import correlation_docs as remediation


def _event(node, gpu, xid, at, seq=1):
    return health.HealthEvent(node_id=node, kind=health.EventKind.XID, observed_at=at, gpu_uuid=gpu, xid=xid, seq=seq)


def _step(state, event, now):
    return correlate.correlate(
        state, event, now_s=now, catalog=xid_catalog.load_catalog(), policy=policy.RemediationPolicy()
    ).state


def _rows(changed):
    """What the incidents table holds for the changed incidents (their `data` column)."""
    return {i.incident_id: i.to_dict() for i in changed}


def test_only_changed_scopes_are_written_and_the_state_rebuilds():
    empty = correlate.CorrelationState()
    one = _step(empty, _event("n1", "GPU-a", 13, 100.0), 100.0)
    docs, changed = remediation.correlation_changes(empty, one)
    assert list(docs) == ["correlation/incidents/node:n1"]
    assert [i.incident_id for i in changed] == [i.incident_id for i in one.open_incidents()]
    two = _step(one, _event("n2", "GPU-b", 48, 101.0), 101.0)
    docs_two, changed_two = remediation.correlation_changes(one, two)
    assert list(docs_two) == ["correlation/incidents/node:n2"]
    assert [i.node_id for i in changed_two] == ["n2"]
    rows = {**_rows(changed), **_rows(changed_two)}
    rebuilt = remediation.correlation_from_docs({**docs, **docs_two}, rows)
    assert rebuilt.to_dict() == two.to_dict()


def test_a_duplicate_rewrites_its_incident_row_not_its_scope():
    one = _step(correlate.CorrelationState(), _event("n1", "GPU-a", 13, 100.0), 100.0)
    docs, changed = remediation.correlation_changes(correlate.CorrelationState(), one)
    again = _step(one, _event("n1", "GPU-a", 13, 110.0, seq=2), 110.0)
    docs_again, changed_again = remediation.correlation_changes(one, again)
    assert docs_again == {}, "the scope's incident list did not change"
    assert [(i.incident_id, i.event_count) for i in changed_again] == [(changed[0].incident_id, 2)]
    rebuilt = remediation.correlation_from_docs(docs, {**_rows(changed), **_rows(changed_again)})
    assert rebuilt.to_dict() == again.to_dict()


def test_an_event_that_changes_nothing_shares_the_state_and_writes_nothing():
    one = _step(correlate.CorrelationState(), _event("n1", "GPU-a", 13, 100.0), 100.0)
    observed = _step(one, _event("n1", "GPU-b", 92, 101.0, seq=2), 101.0)  # Xid 92: observed, nothing to act on
    assert observed is one
    assert remediation.correlation_changes(one, observed) == ({}, [])


def test_a_scope_that_empties_is_deleted():
    one = _step(correlate.CorrelationState(), _event("n1", "GPU-a", 13, 100.0), 100.0)
    docs, changed = remediation.correlation_changes(one, correlate.CorrelationState())
    assert docs == {"correlation/incidents/node:n1": None}
    assert changed == []


def test_scope_documents_of_the_earlier_format_still_load():
    one = _step(correlate.CorrelationState(), _event("n1", "GPU-a", 13, 100.0), 100.0)
    inline = {"correlation/incidents/node:n1": {"items": [i.to_dict() for i in one.incidents["node:n1"]]}}
    assert remediation.correlation_from_docs(inline).to_dict() == one.to_dict()


def test_stored_documents_keep_the_format_of_a_deep_asdict():
    """The shallow to_dict methods (a burst serialises thousands) write what dataclasses.asdict wrote."""
    import dataclasses

    from rasd.controller.core.remediation import blast_radius, escalation

    one = _step(correlate.CorrelationState(), _event("n1", "GPU-a", 48, 100.0), 100.0)
    (incident,) = one.incidents["node:n1"]
    incident = dataclasses.replace(incident, secondary_keys=("xid:45",), peer_gpu_uuids=("GPU-b",))
    reference = dataclasses.asdict(incident)
    reference.update(
        classification=incident.classification.to_dict(), secondary_keys=["xid:45"], peer_gpu_uuids=["GPU-b"]
    )
    assert incident.to_dict() == reference

    state = escalation.decide(
        escalation.RemediationState("n1"), incident, now_s=100.0, policy=policy.EscalationPolicy()
    )
    (ticket,) = state.state.tickets
    assert ticket.pending is not None
    assert escalation.RemediationState.from_dict(state.state.to_dict()) == state.state
    assert state.state.to_dict()["tickets"][0]["pending"] == dataclasses.asdict(ticket.pending)

    budget = blast_radius.BudgetState(
        in_flight=(blast_radius.InFlight("c1", "n1", "reboot_node", 5.0),), quarantined_nodes=("n1",),
        demand={"n1": 5.0}, paused=True, pause_reason="why",
    )  # fmt: skip
    reference = dataclasses.asdict(budget)
    reference.update(in_flight=list(reference["in_flight"]), quarantined_nodes=["n1"])
    del reference["quarantined_gpus"], reference["emptied_nodes"]  # not stored: rebuilt from the quarantine rows
    del reference["demand"]  # stored as documents of its own (blast_radius.demand_documents)
    del reference["counted_for"]  # which fleet view emptied_nodes was counted against: memory only
    assert budget.to_dict() == reference
    rebuilt = blast_radius.BudgetState.from_dict(budget.to_dict())
    assert rebuilt.with_demand(blast_radius.demand_documents({}, budget.demand).values()) == budget


_NODES = ("n1", "n2", "n3", "n4")
_EVENTS = st.lists(
    st.tuples(
        st.sampled_from(_NODES),
        st.sampled_from(("GPU-a", "GPU-b")),
        st.sampled_from((13, 31, 43, 45, 48, 74, 79, 94, "ib")),
        st.sampled_from(("", "nvl-0", "nvl-1")),
        st.floats(min_value=0.0, max_value=400.0),
        st.sampled_from(("DOWN", "ACTIVE")),
    ),
    min_size=1,
    max_size=40,
)


@hypothesis.settings(max_examples=150, deadline=None)
@hypothesis.given(_EVENTS)
def test_the_events_scopes_and_nodes_name_everything_that_changed(events):
    """A decision pass writes only its events' scopes and nodes: the same as looking at every one of them."""
    catalog, pol = xid_catalog.load_catalog(), policy.RemediationPolicy()
    state, now = correlate.CorrelationState(), 1_000.0
    for seq, (node, gpu, what, domain, gap_s, ib_state) in enumerate(events, start=1):
        now += gap_s
        if what == "ib":
            event = health.HealthEvent(
                node_id=node, kind=health.EventKind.IB_LINK_STATE, observed_at=now, seq=seq, nvlink_domain=domain,
                attributes={"ib_device": "mlx5_0", "ib_port": "1", "ib_state": ib_state},
            )  # fmt: skip
        else:
            event = health.HealthEvent(
                node_id=node, kind=health.EventKind.XID, observed_at=now, gpu_uuid=gpu, xid=what, seq=seq,
                nvlink_domain=domain,
            )  # fmt: skip
        after = correlate.correlate(state, event, now_s=now, catalog=catalog, policy=pol).state
        scopes, nodes = {correlate.scope_of(event)}, {event.node_id}
        docs, changed = remediation.correlation_changes(state, after)
        hinted_docs, hinted_changed = remediation.correlation_changes(state, after, scopes=scopes, port_nodes=nodes)
        assert hinted_docs == docs
        assert _rows(hinted_changed) == _rows(changed)
        expired = remediation.expired_incidents(state, after)
        assert _rows(remediation.expired_incidents(state, after, scopes=scopes)) == _rows(expired)
        state = after
