"""The SQL store: registration, idempotent event storage, spool resets, latest telemetry."""

from __future__ import annotations

import pytest

from rasd.controller.core import fleet
from rasd.controller.store import repo

GPU_A = "GPU-00000000-0000-4000-8000-00000000000a"


def _hello(node_id="node-1", boot_id="boot-1", spool_head_seq=0):
    gpu = fleet.GpuRecord(GPU_A, node_id, "H100", "00000000:18:00.0", 200, 700, 700)
    return fleet.NodeHello(node_id, boot_id, "0.1.0", node_id, "simulated", {"rack": "r1"}, (gpu,), spool_head_seq)


def _event(seq, node_id="node-1"):
    return repo.StoredEvent(node_id, seq, 10 + seq, 20 + seq, 1, 3, GPU_A, 13, f"xid {seq}", "kmsg", {"pid": "1"})


@pytest.fixture
def store(tmp_path):
    opened = repo.Store.open(f"sqlite:///{tmp_path / 'rasd.db'}")
    yield opened
    opened.close()


def test_hello_registers_node_and_gpus(store):
    outcome = store.register_hello(_hello(), 100)
    assert outcome == repo.HelloOutcome(acked_seq=0, spool_reset=False, rebooted=False)
    (node,) = store.list_nodes()
    assert node.node_id == "node-1" and node.connected and node.labels == {"rack": "r1"}
    assert [g.record.uuid for g in node.gpus] == [GPU_A]


def test_events_are_stored_once_and_acked_in_the_same_transaction(store):
    store.register_hello(_hello(), 100)
    assert store.append_events("node-1", [_event(1), _event(2)]) == (2, 2)
    # A resend after a lost ack, overlapping with a new event.
    assert store.append_events("node-1", [_event(2), _event(3), _event(3)]) == (3, 1)
    assert [e.seq for e in store.list_events()] == [3, 2, 1]
    assert store.count_events() == 3


def test_reconnect_welcomes_with_the_acked_position(store):
    store.register_hello(_hello(), 100)
    store.append_events("node-1", [_event(1), _event(2)])
    assert store.register_hello(_hello(spool_head_seq=5), 200).acked_seq == 2


def test_a_wiped_agent_spool_starts_a_new_epoch_instead_of_dropping_events(store):
    store.register_hello(_hello(), 100)
    store.append_events("node-1", [_event(1), _event(2), _event(3)])
    outcome = store.register_hello(_hello(spool_head_seq=1), 200)
    assert outcome.spool_reset and outcome.acked_seq == 0
    assert store.append_events("node-1", [_event(1)]) == (1, 1)
    assert store.count_events() == 4


def test_new_boot_id_is_reported_as_reboot(store):
    store.register_hello(_hello(), 100)
    assert store.register_hello(_hello(boot_id="boot-2"), 200).rebooted


def test_latest_telemetry_and_disconnect_are_persisted(store):
    store.register_hello(_hello(), 100)
    store.save_latest({GPU_A: fleet.GpuLatest(power_w=512.5, power_sample_unix_ns=150, enforced_power_limit_w=650)})
    store.mark_disconnected("node-1", 300)
    (node,) = store.list_nodes()
    assert node.gpus[0].latest.power_w == 512.5
    assert node.gpus[0].latest.enforced_power_limit_w == 650
    assert not node.connected and node.last_seen_unix_ns == 300


def test_events_for_an_unknown_node_are_refused(store):
    with pytest.raises(KeyError, match="ghost"):
        store.append_events("ghost", [_event(1, "ghost")])


def test_bad_url_is_named():
    with pytest.raises(ValueError, match="not a SQLAlchemy URL"):
        repo.Store.open("definitely not a url")
