"""The correlation state is stored per scope: only what a decision changed is written, and it rebuilds."""

from __future__ import annotations

from rasd.common import xid_catalog
from rasd.controller import remediation
from rasd.controller.core import correlate, health, policy


def _event(node, gpu, xid, at):
    return health.HealthEvent(node_id=node, kind=health.EventKind.XID, observed_at=at, gpu_uuid=gpu, xid=xid, seq=1)


def _step(state, event, now):
    return correlate.correlate(
        state, event, now=now, catalog=xid_catalog.load_catalog(), policy=policy.RemediationPolicy()
    ).state


def test_only_changed_scopes_are_written_and_the_state_rebuilds():
    empty = correlate.CorrelationState()
    one = _step(empty, _event("n1", "GPU-a", 13, 100.0), 100.0)
    docs = remediation.correlation_docs(empty, one)
    assert list(docs) == ["correlation/incidents/node:n1"]
    two = _step(one, _event("n2", "GPU-b", 48, 101.0), 101.0)
    assert list(remediation.correlation_docs(one, two)) == ["correlation/incidents/node:n2"]
    rebuilt = remediation.correlation_from_docs({**docs, **remediation.correlation_docs(one, two)})
    assert rebuilt.to_dict() == two.to_dict()


def test_a_scope_that_empties_is_deleted():
    one = _step(correlate.CorrelationState(), _event("n1", "GPU-a", 13, 100.0), 100.0)
    assert remediation.correlation_docs(one, correlate.CorrelationState()) == {"correlation/incidents/node:n1": None}
