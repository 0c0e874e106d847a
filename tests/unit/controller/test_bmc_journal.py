"""The stored BMC journal: what one replica journaled, every replica sees; a deposed one writes nothing.

`rasd.controller.executors.bmc` journals "about to power-cycle" per ticket before it asks the BMC, and never
cycles a ticket it finds in the journal. A standby that takes the lead must see the entries of the
leader before it, not a copy of the journal from its own start (it cycled the node again).
"""

from __future__ import annotations

import pytest

from rasd.controller.store import lease as lease_store
from rasd.controller.store import remediation as rstore

LONG_TICKET = "node-0042/GPU-00000000-0000-4000-8000-000000000007/xid:79@3+1"  # longer than a doc name


def test_an_entry_one_replica_journals_is_seen_by_a_replica_that_started_before_it(store):
    leader = rstore.StoredJournal(rstore.RemediationStore(store.engine), "bmc_journal")
    standby = rstore.StoredJournal(rstore.RemediationStore(store.engine), "bmc_journal")  # built at its start
    assert "t-1" not in standby and len(standby) == 0
    leader["t-1"] = '{"state": "requested"}'
    leader[LONG_TICKET] = '{"state": "power_cycled"}'
    assert standby["t-1"] == '{"state": "requested"}' and standby.get(LONG_TICKET) == '{"state": "power_cycled"}'
    assert sorted(standby) == sorted(["t-1", LONG_TICKET]) and len(standby) == 2
    del standby["t-1"]
    assert "t-1" not in leader
    with pytest.raises(KeyError):
        del leader["t-1"]


def test_the_one_document_journal_of_older_versions_is_still_read(store):
    docs = rstore.RemediationStore(store.engine)
    docs.commit(rstore.Commit(now_unix_ns=1, docs={"bmc_journal": {"t-old": '{"state": "power_cycled"}', "t-2": "x"}}))
    journal = rstore.StoredJournal(docs, "bmc_journal")
    assert journal["t-old"] == '{"state": "power_cycled"}' and sorted(journal) == ["t-2", "t-old"]
    del journal["t-2"]
    assert sorted(journal) == ["t-old"]
    journal["t-old"] = '{"state": "timed_out"}'  # the newer per-key document wins
    assert journal["t-old"] == '{"state": "timed_out"}' and len(journal) == 1


def test_a_replica_that_does_not_lead_journals_nothing(store):
    """A deposed replica's adapter thread may still run: its write is refused before the BMC is asked."""
    fenced = rstore.RemediationStore(store.engine)
    fenced.fence = lease_store.Fence(None)  # what Leadership.current_fence gives a replica that does not lead
    journal = rstore.StoredJournal(fenced, "bmc_journal")
    with pytest.raises(lease_store.NotLeaderError):
        journal["t-1"] = '{"state": "requested"}'
    assert "t-1" not in rstore.StoredJournal(rstore.RemediationStore(store.engine), "bmc_journal")
