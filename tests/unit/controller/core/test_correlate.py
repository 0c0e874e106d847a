"""Correlation rules: bursts, secondaries, peers in an NVLink domain, sticky faults, IB flaps."""

from __future__ import annotations

import json

import pytest

from rasd.common import xid_catalog
from rasd.controller.core.remediation import correlate, policy
from rasd.controller.core.remediation import events as health

EventKind = health.EventKind
Outcome = correlate.Outcome
CATALOG = xid_catalog.load_catalog()
POLICY = policy.RemediationPolicy()
T0 = 1_780_000_000.0


class Feed:
    def __init__(self, pol: policy.RemediationPolicy = POLICY) -> None:
        self.state = correlate.CorrelationState()
        self.now = T0
        self.pol = pol

    def __call__(
        self,
        kind: EventKind,
        *,
        node: str = "n1",
        gpu: str = "GPU-1",
        repaired_at: float | None = None,
        **fields: object,
    ) -> correlate.Correlation:
        ev = health.HealthEvent(node_id=node, kind=kind, observed_at=self.now, gpu_uuid=gpu, **fields)
        result = correlate.correlate(
            self.state, ev, now_s=self.now, catalog=CATALOG, policy=self.pol, repaired_at=repaired_at
        )
        self.state = result.state
        return result

    def xid(self, xid: int, **fields: object) -> correlate.Correlation:
        return self(EventKind.XID, xid=xid, **fields)


def test_same_fault_within_the_dedupe_window_is_a_duplicate_then_a_new_incident():
    feed = Feed()
    assert feed.xid(13).outcome is Outcome.NEW
    feed.now += 179
    dup = feed.xid(13)
    assert dup.outcome is Outcome.DUPLICATE and dup.incident.event_count == 2
    feed.now += 2  # 181 s after the incident opened: the burst window is anchored on the opening
    assert feed.xid(13).outcome is Outcome.NEW


def test_the_same_xid_on_another_gpu_is_its_own_incident():
    feed = Feed()
    feed.xid(13, gpu="GPU-1")
    assert feed.xid(13, gpu="GPU-2").outcome is Outcome.NEW
    assert len(feed.state.open_incidents()) == 2


@pytest.mark.parametrize("root", [48, 13, 79, 95])
def test_xid45_after_another_xid_is_secondary(root):
    feed = Feed()
    first = feed.xid(root)
    feed.now += 5
    second = feed.xid(45)
    assert second.outcome is Outcome.SECONDARY
    assert second.incident.incident_id == first.incident.incident_id
    assert second.incident.secondary_keys == ("xid:45",)


def test_xid45_alone_is_only_observed():
    assert Feed().xid(45).outcome is Outcome.OBSERVED


def test_xid45_after_the_secondary_window_is_not_folded():
    feed = Feed()
    feed.xid(48)
    feed.now += POLICY.correlation.secondary_window_s + 1
    assert feed.xid(45).outcome is Outcome.OBSERVED


def test_xid43_after_a_fatal_is_secondary():
    feed = Feed()
    feed.xid(95)
    feed.now += 1
    assert feed.xid(43).outcome is Outcome.SECONDARY


@pytest.mark.parametrize("detail", [63, 64, 171, 172])
def test_remap_and_dram_details_after_xid48_are_secondary(detail):
    feed = Feed()
    feed.xid(48)
    assert feed.xid(detail).outcome is Outcome.SECONDARY


def test_peer_xid74_in_one_nvlink_domain_folds_into_the_root_across_nodes():
    feed = Feed()
    root = feed.xid(74, node="tray-1", gpu="GPU-A", nvlink_domain="nvl72-0")
    feed.now += 1
    peers = [feed.xid(74, node=f"tray-{i}", gpu=f"GPU-{i}", nvlink_domain="nvl72-0") for i in range(2, 6)]
    assert root.outcome is Outcome.NEW
    assert {p.outcome for p in peers} == {Outcome.SECONDARY}
    assert peers[-1].incident.peer_gpu_uuids == ("GPU-2", "GPU-3", "GPU-4", "GPU-5")
    assert len(feed.state.open_incidents()) == 1


def test_xid74_in_another_nvlink_domain_is_its_own_incident():
    feed = Feed()
    feed.xid(74, gpu="GPU-A", nvlink_domain="nvl72-0")
    assert feed.xid(74, gpu="GPU-B", nvlink_domain="nvl72-1").outcome is Outcome.NEW


def test_a_sticky_xid_seen_again_within_three_hours_is_a_recurrence():
    feed = Feed()
    first = feed.xid(79)
    assert first.incident.sticky
    feed.now += 2 * 3600
    again = feed.xid(79)
    assert again.outcome is Outcome.RECURRENCE
    assert again.incident.occurrences == 2
    assert again.needs_decision
    feed.now += 3 * 3600 + 1
    assert feed.xid(79).outcome is Outcome.NEW


def test_non_sticky_incidents_are_forgotten_after_their_window():
    feed = Feed()
    feed.xid(13)
    feed.now += 3600
    feed.xid(13, gpu="GPU-2")
    assert [i.gpu_uuid for i in feed.state.open_incidents()] == ["GPU-2"]


def test_ib_flaps_count_per_port_and_open_one_incident_per_node():
    feed = Feed()
    outcomes = []
    for i in range(12):
        feed.now += 20
        port = str(1 + i % 2)
        r = feed(EventKind.IB_LINK_STATE, gpu="", attributes={"ib_device": "mlx5_0", "ib_port": port})
        outcomes.append(r.outcome)
    # port 1 reaches 6 changes on the 11th event; earlier ones are only observed.
    assert outcomes[:10] == [Outcome.OBSERVED] * 10
    assert outcomes[10] is Outcome.NEW
    assert outcomes[11] is Outcome.DUPLICATE
    assert [i.fault_key for i in feed.state.open_incidents()] == ["ib_flap"]


def test_ib_state_changes_outside_the_flap_window_do_not_count():
    feed = Feed()
    for _ in range(10):
        feed.now += POLICY.classification.ib_flap_window_s / 5 + 1
        r = feed(EventKind.IB_LINK_STATE, gpu="", attributes={"ib_device": "mlx5_0", "ib_port": "1"})
        assert r.outcome is Outcome.OBSERVED
    assert len(feed.state.ports["n1"][0].changed_at) <= 5


def test_state_round_trips_through_json():
    feed = Feed()
    feed.xid(48, nvlink_domain="d0")
    feed.xid(45, nvlink_domain="d0")
    feed(EventKind.IB_LINK_STATE, gpu="", attributes={"ib_device": "mlx5_0", "ib_port": "1"})
    restored = correlate.CorrelationState.from_dict(json.loads(json.dumps(feed.state.to_dict())))
    assert restored == feed.state


def test_correlation_does_not_mutate_its_input_state():
    feed = Feed()
    feed.xid(48)
    before = feed.state
    snapshot = before.to_dict()
    feed.xid(45)
    feed.xid(13, gpu="GPU-2")
    assert before.to_dict() == snapshot


def test_a_stronger_recovery_action_within_the_burst_upgrades_the_incident():
    feed = Feed()
    feed.xid(154, message="... to 0x1 (GPU Reset Required)")
    feed.now += 30
    up = feed.xid(154, message="... from 0x1 (GPU Reset Required) to 0x2 (Node Reboot Required)")
    assert up.outcome is Outcome.UPGRADE and up.needs_decision
    assert up.incident.classification.action.value == "reboot_node"
    feed.now += 30
    assert feed.xid(154, message="... to 0x1 (GPU Reset Required)").outcome is Outcome.DUPLICATE


def test_a_secondary_that_proves_the_memory_exhausted_upgrades_the_root_to_rma():
    feed = Feed()
    root = feed.xid(48)
    up = feed(EventKind.ECC_DBE, remapped_rows_uncorrectable=600)
    assert up.outcome is Outcome.UPGRADE
    assert up.incident.incident_id == root.incident.incident_id
    assert up.incident.classification.action.value == "rma"
    assert up.incident.fault_key == "xid:48"


@pytest.mark.parametrize("agent_clock_off_s", [-7200.0, 7200.0])
def test_the_flap_window_runs_on_the_controller_clock_however_far_off_the_agent_clock_is(agent_clock_off_s):
    state = correlate.CorrelationState()
    now = T0
    outcomes = []
    for _ in range(6):  # three down/up flaps, 20 s apart
        now += 20
        event = health.HealthEvent(
            node_id="n1",
            kind=EventKind.IB_LINK_STATE,
            observed_at=now + agent_clock_off_s,
            attributes={"ib_device": "mlx5_0", "ib_port": "1"},
        )
        result = correlate.correlate(state, event, now_s=now, catalog=CATALOG, policy=POLICY)
        state = result.state
        outcomes.append(result.outcome)
    assert outcomes == [Outcome.OBSERVED] * 5 + [Outcome.NEW], "the storm is seen whatever the agent's clock says"
    now += POLICY.classification.ib_flap_window_s + 1
    later = health.HealthEvent(
        node_id="n1",
        kind=EventKind.IB_LINK_STATE,
        observed_at=now + agent_clock_off_s,
        attributes={"ib_device": "mlx5_0", "ib_port": "1"},
    )
    state = correlate.correlate(state, later, now_s=now, catalog=CATALOG, policy=POLICY).state
    assert state.ports["n1"][0].changed_at == (now,), "old changes age out on the controller's clock"


def test_expire_forgets_the_incidents_of_quiet_scopes_and_shares_the_state_when_none_expired():
    feed = Feed()
    feed.xid(13, node="n1", gpu="GPU-1")
    feed.xid(79, node="n2", gpu="GPU-9")  # sticky: remembered for 3 h
    assert correlate.expire(feed.state, T0 + 180, POLICY) is feed.state
    later = correlate.expire(feed.state, T0 + 181, POLICY)
    assert [i.fault_key for i in later.open_incidents()] == ["xid:79"]
    assert correlate.expire(later, T0 + 3 * 3600 + 1, POLICY).incidents == {}


def test_the_same_seq_at_another_time_is_another_incident_id():
    """An agent whose spool was reset numbers its events from 1 again: the ids must still differ."""
    feed = Feed()
    first = feed.xid(79, seq=1)
    feed.now += 4 * 3600  # past the sticky window: a new incident
    again = feed.xid(79, seq=1)
    assert again.outcome is Outcome.NEW
    assert again.incident.incident_id != first.incident.incident_id
    assert first.incident.incident_id.startswith("n1/GPU-1/xid:79/1t")


def test_after_its_repair_finished_a_repeat_opens_a_new_incident_and_a_dbe_is_no_detail_of_the_old_xid48():
    feed = Feed()
    old = feed.xid(13).incident
    feed.xid(48, gpu="GPU-2")
    feed.now += 60
    repaired = feed.now - 30
    again = feed.xid(13, repaired_at=repaired)
    assert again.outcome is Outcome.NEW and again.incident.incident_id != old.incident_id
    feed.now += 1  # the recurrence's own burst folds into it
    assert feed.xid(13, repaired_at=repaired).outcome is Outcome.DUPLICATE
    assert feed(EventKind.ECC_DBE, gpu="GPU-2", repaired_at=repaired).outcome is Outcome.NEW
    # Another GPU's repair changes nothing here: its faults still fold.
    assert feed.xid(45, gpu="GPU-2", repaired_at=None).outcome is Outcome.SECONDARY


def test_an_event_the_agent_observed_before_the_burst_arriving_after_the_repair_joins_the_burst():
    """A reordered or replayed event is no recurrence: the agent saw it before evidence already folded."""
    feed = Feed()
    burst = feed.xid(13, seq=24).incident  # seq 24 arrived first; seq 4 was held up on a broken stream
    feed.now += 60
    repaired = feed.now - 30
    late = health.HealthEvent(node_id="n1", kind=EventKind.XID, xid=13, gpu_uuid="GPU-1", seq=4, observed_at=T0 - 5)
    joined = correlate.correlate(feed.state, late, now_s=feed.now, catalog=CATALOG, policy=POLICY, repaired_at=repaired)
    assert joined.outcome is Outcome.DUPLICATE and joined.incident.incident_id == burst.incident_id
    # Seen after the newest folded event (a higher seq), it is a recurrence: a new incident.
    assert feed.xid(13, seq=25, repaired_at=repaired).outcome is Outcome.NEW


def test_after_a_spool_reset_a_low_seq_observed_later_is_still_a_recurrence():
    """Seqs start at 1 again after a spool reset; the observed time tells the new sighting apart."""
    feed = Feed()
    feed.xid(13, seq=24)
    feed.now += 60
    assert feed.xid(13, seq=1, repaired_at=feed.now - 30).outcome is Outcome.NEW
