"""The SQL store: registration, idempotent event storage, spool resets, latest telemetry."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sqlite3
import subprocess
import sys
import threading
import time

import pytest
import sqlalchemy as sa
from sqlalchemy import orm

from rasd.controller import server
from rasd.controller.core import fleet
from rasd.controller.replication import leader as leader_mod
from rasd.controller.store import repo, schema

GPU_A = "GPU-00000000-0000-4000-8000-00000000000a"


def _hello(node_id="node-1", boot_id="boot-1", spool_head_seq=0, spool_id=""):
    gpu = fleet.GpuRecord(GPU_A, "H100", "00000000:18:00.0", 200, 700, 700, node_id=node_id)
    return fleet.NodeHello(
        node_id, boot_id, "0.1.0", node_id, "simulated", {"rack": "r1"}, (gpu,), spool_head_seq, spool_id
    )


def _event(seq, node_id="node-1"):
    return repo.StoredEvent(node_id, seq, 10 + seq, 20 + seq, 1, 3, GPU_A, 13, f"xid {seq}", "kmsg", {"pid": "1"})


# `store` (conftest.py) is parametrized: every test runs on SQLite and on PostgreSQL.


def test_hello_registers_node_and_gpus(store):
    outcome = store.register_hello(_hello(), 100)
    assert outcome == repo.HelloOutcome(acked_seq=0, spool_reset=False, rebooted=False)
    (node,) = store.list_nodes()
    assert node.node_id == "node-1" and node.connected and node.labels == {"rack": "r1"}
    assert [g.record.uuid for g in node.gpus] == [GPU_A]


def test_events_are_stored_once_and_acked_in_the_same_transaction(store):
    store.register_hello(_hello(), 100)
    assert store.append_events("node-1", [_event(1), _event(2)]) == (2, [1, 2])
    # A resend after a lost ack, overlapping with a new event.
    assert store.append_events("node-1", [_event(2), _event(3), _event(3)]) == (3, [3])
    assert [e.seq for e in store.list_events()] == [3, 2, 1]
    assert store.count_events() == 3


def test_warming_up_the_event_path_writes_nothing(store):
    store.warm_up_events()
    with orm.Session(store.engine) as session:
        assert session.scalars(sa.select(schema.NodeRow)).all() == []
        assert session.scalars(sa.select(schema.HealthEventRow)).all() == []
    store.register_hello(_hello(), 100)
    assert store.append_events("node-1", [_event(1)]) == (1, [1]), "and events are stored as before"


def test_reconnect_welcomes_with_the_acked_position(store):
    store.register_hello(_hello(), 100)
    store.append_events("node-1", [_event(1), _event(2)])
    assert store.register_hello(_hello(spool_head_seq=5), 200).acked_seq == 2


def test_a_wiped_agent_spool_starts_a_new_epoch_instead_of_dropping_events(store):
    store.register_hello(_hello(), 100)
    store.append_events("node-1", [_event(1), _event(2), _event(3)])
    outcome = store.register_hello(_hello(spool_head_seq=1), 200)
    assert outcome.spool_reset and outcome.acked_seq == 0
    assert store.append_events("node-1", [_event(1)]) == (1, [1])
    assert store.count_events() == 4


def test_a_new_spool_whose_head_passed_the_old_acked_position_is_a_new_epoch(store):
    """A reimaged node's new spool already holds more events than the old one had acked: welcomed with
    the old position, the agent deleted its new events up to it unsent (the invariant-3 audit)."""
    store.register_hello(_hello(spool_id="spool-a"), 100)
    store.append_events("node-1", [_event(1), _event(2), _event(3)])
    same = store.register_hello(_hello(spool_head_seq=5, spool_id="spool-a"), 200)
    assert not same.spool_reset and same.acked_seq == 3
    other = store.register_hello(_hello(spool_head_seq=4, spool_id="spool-b"), 300)
    assert other.spool_reset and other.acked_seq == 0
    assert store.append_events("node-1", [_event(1), _event(2), _event(3), _event(4)]) == (4, [1, 2, 3, 4])
    assert store.count_events() == 7


def test_events_of_a_spool_the_node_has_left_are_refused_and_the_new_spools_are_kept(store):
    """A stream still sending from the old spool after the node's new spool said Hello (an agent restarted
    with its state directory wiped, while its last batch was in flight): stored, its old seqs would sit in the
    new epoch, and the new spool's events with those seqs would be skipped as duplicates and acked unstored."""
    assert store.register_hello(_hello(spool_id="spool-a"), 100).spool_epoch == 0
    store.append_events("node-1", [dataclasses.replace(_event(s), spool_epoch=0) for s in (1, 2)])
    new = store.register_hello(_hello(spool_id="spool-b"), 200)
    assert new.spool_reset and new.spool_epoch == 1
    late = [dataclasses.replace(_event(s), spool_epoch=0) for s in (3, 4)]
    with pytest.raises(repo.SpoolEpochChanged, match="events of spool epoch 0, but the node's spool is in epoch 1"):
        store.append_events("node-1", late)
    assert store.count_events() == 2, "nothing of the old spool's late batch is stored"
    fresh = [dataclasses.replace(_event(s), spool_epoch=1) for s in (1, 2, 3, 4)]
    assert store.append_events("node-1", fresh) == (4, [1, 2, 3, 4]), "every event of the new spool is kept"
    # In a group, only the late batch is refused.
    outcomes = store.append_events_many(
        [
            ("node-1", [dataclasses.replace(_event(5), spool_epoch=0)]),
            ("node-1", [dataclasses.replace(_event(5), spool_epoch=1)]),
        ]
    )
    assert isinstance(outcomes[0], repo.SpoolEpochChanged) and outcomes[1] == (5, [5])


def test_a_spool_id_seen_for_the_first_time_or_not_sent_changes_nothing(store):
    store.register_hello(_hello(), 100)  # an agent that sends no spool id
    store.append_events("node-1", [_event(1), _event(2)])
    adopted = store.register_hello(_hello(spool_head_seq=2, spool_id="spool-a"), 200)  # upgraded agent
    assert not adopted.spool_reset and adopted.acked_seq == 2
    older = store.register_hello(_hello(spool_head_seq=2), 300)  # downgraded again: the head decides
    assert not older.spool_reset and older.acked_seq == 2
    assert store.register_hello(_hello(spool_head_seq=2, spool_id="spool-a"), 400).acked_seq == 2


def test_a_store_that_lost_its_last_acks_moves_its_acked_position_up_to_the_agents(store):
    """Restored from a backup: acks 3..5 are gone, and the agent, which dropped 3..5, resends from 6.
    The ack moves only over stored seqs, so it waited on the gap for ever (the invariant-3 audit)."""
    store.register_hello(_hello(spool_id="spool-a"), 100)
    store.append_events("node-1", [_event(1), _event(2)])  # the backup's state
    hello = dataclasses.replace(_hello(spool_head_seq=8, spool_id="spool-a"), spool_acked_seq=5)
    outcome = store.register_hello(hello, 200)
    assert outcome.acked_seq == 5 and outcome.lost_seqs == (3, 5) and not outcome.spool_reset
    assert store.append_events("node-1", [_event(6), _event(7), _event(8)]) == (8, [6, 7, 8])
    again = store.register_hello(dataclasses.replace(hello, spool_acked_seq=8), 300)
    assert again.acked_seq == 8 and again.lost_seqs is None


def test_new_boot_id_is_reported_as_reboot(store):
    store.register_hello(_hello(), 100)
    assert store.register_hello(_hello(boot_id="boot-2"), 200).rebooted


def test_hellos_registered_in_one_group_decide_what_one_by_one_would(store):
    """A reconnect storm's group: the same outcomes, rows and order as registering each Hello alone."""
    store.register_hello(_hello(), 100)
    store.append_events("node-1", [_event(1), _event(2), _event(3)])
    group = [
        (_hello(spool_head_seq=9), 200),  # reconnects: welcomed at its acked position
        (_hello(node_id="node-2"), 210),  # new
        (_hello(boot_id="boot-2", spool_head_seq=1), 220),  # the same node again: rebooted, spool wiped
        (_hello(node_id="node-2", boot_id="boot-9"), 230),
    ]
    outcomes = store.register_hellos(group)
    assert outcomes == [
        repo.HelloOutcome(acked_seq=3, spool_reset=False, rebooted=False),
        repo.HelloOutcome(acked_seq=0, spool_reset=False, rebooted=False),
        repo.HelloOutcome(acked_seq=0, spool_reset=True, rebooted=True, spool_epoch=1),
        repo.HelloOutcome(acked_seq=0, spool_reset=False, rebooted=True),
    ]
    assert store.append_events("node-1", [_event(1)]) == (1, [1])  # the new epoch stores seq 1 again
    nodes = {n.node_id: n for n in store.list_nodes()}
    assert nodes["node-1"].boot_id == "boot-2" and nodes["node-2"].boot_id == "boot-9"
    assert nodes["node-2"].last_seen_unix_ns == 230
    with store.engine.connect() as conn:
        first_seen = dict(conn.execute(sa.select(schema.NodeRow.node_id, schema.NodeRow.first_seen_unix_ns)).all())
    assert first_seen == {"node-1": 100, "node-2": 210}


def test_event_batches_stored_in_one_group_decide_what_one_by_one_would(store):
    """A burst's group of stream batches: the outcomes, rows and acked positions of appending each alone."""
    store.register_hello(_hello(), 100)
    store.register_hello(_hello(node_id="node-2"), 100)
    store.append_events("node-1", [_event(1), _event(3)])  # 3 ahead of a missing 2: stored, not acked
    group = [
        ("node-1", [_event(2), _event(4), _event(4)]),  # fills the gap; 4 twice in one batch: once
        ("ghost", [_event(1, "ghost")]),  # never said Hello: refused alone
        ("node-2", [_event(2, "node-2")]),  # ahead of a missing 1
        ("node-1", [_event(3), _event(5)]),  # the same node again, after the batch above: 3 is a resend
        ("node-2", [_event(1, "node-2")]),
    ]
    first, ghost, second, third, fourth = store.append_events_many(group)
    assert first == (4, [2, 4])
    assert isinstance(ghost, KeyError) and "ghost" in str(ghost)
    assert second == (0, [2])
    assert third == (5, [5])
    assert fourth == (2, [1])
    stored = sorted((e.node_id, e.seq) for e in store.list_events(limit=100))
    assert stored == [("node-1", seq) for seq in range(1, 6)] + [("node-2", 1), ("node-2", 2)]
    # The acked positions are durable: a Hello reads them back, and a resend stores nothing.
    assert store.register_hello(_hello(spool_head_seq=9), 200).acked_seq == 5
    assert store.append_events_many([("node-2", [_event(2, "node-2")])]) == [(2, [])]
    assert store.append_events_many([]) == []


def test_a_hello_keeps_the_gpu_state_and_telemetry_the_controller_recorded(store):
    store.register_hello(_hello(), 100)
    store.save_latest({GPU_A: fleet.GpuLatest(power_w=512.5, power_sample_unix_ns=150, enforced_power_limit_w=650)})
    with store.engine.begin() as conn:
        conn.execute(
            sa.update(schema.GpuRow)
            .where(schema.GpuRow.uuid == GPU_A)
            .values(state=int(fleet.ComponentState.QUARANTINED))
        )
    store.register_hellos([(_hello(boot_id="boot-2"), 200)])
    (node,) = store.list_nodes()
    (gpu,) = node.gpus
    assert gpu.state is fleet.ComponentState.QUARANTINED
    assert gpu.latest.power_w == 512.5 and gpu.latest.enforced_power_limit_w == 650


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


# -- backend behaviour (each test runs on SQLite and PostgreSQL unless it says otherwise) ----------------


def _postgres_only(store):
    if store.engine.dialect.name != "postgresql":
        pytest.skip("PostgreSQL behaviour: SQLite serializes writers with its file lock (one writer thread)")


def _lock_timeout_200ms(dbapi_connection, _record) -> None:
    with dbapi_connection.cursor() as cursor:
        cursor.execute("SET lock_timeout = '200ms'")
    dbapi_connection.commit()


def test_append_events_reads_the_acked_position_under_a_row_lock(store, store_url):
    _postgres_only(store)
    store.register_hello(_hello(), 100)
    store.append_events("node-1", [_event(1)])
    # A second replica whose statements give up after 200 ms of waiting for a lock. It turns impatient
    # once open: opening runs the migrations under their database-wide advisory lock, which stores
    # opening in other schemas (tests on other pytest-xdist workers) may hold for longer than that.
    impatient = repo.Store.open(store_url)
    impatient.engine.dispose()
    sa.event.listen(impatient.engine, "connect", _lock_timeout_200ms)
    try:
        with store.engine.connect() as holder:
            holder.execute(sa.text("SELECT 1 FROM nodes WHERE node_id = 'node-1' FOR UPDATE"))
            # Even a pure resend (nothing to write) waits: the acked position is read FOR UPDATE, so
            # no other transaction can act on the same position at the same time.
            with pytest.raises(sa.exc.OperationalError, match="lock timeout"):
                impatient.append_events("node-1", [_event(1)])
            holder.rollback()
        assert impatient.append_events("node-1", [_event(1), _event(2)]) == (2, [2])
    finally:
        impatient.close()


def test_postgresql_sessions_end_a_transaction_whose_client_went_silent(
    postgres_schema_url, postgres_url_with, monkeypatch
):
    """A dead client's open transaction (a leader's host lost power) must not hold its locks for hours."""
    monkeypatch.setitem(repo.POSTGRES_SESSION_SETTINGS, "idle_in_transaction_session_timeout", "1s")
    store = repo.Store.open(postgres_schema_url)
    try:
        with store.engine.connect() as connection:
            shown = {
                name: connection.exec_driver_sql(f"SHOW {name}").scalar()
                for name in ("idle_in_transaction_session_timeout", "tcp_keepalives_idle", "search_path")
            }
        assert shown["idle_in_transaction_session_timeout"] == "1s" and shown["tcp_keepalives_idle"] == "10"
        assert shown["search_path"].startswith("rasd_test_")  # the URL's own options still apply
        store.register_hello(_hello(), 100)
        silent = store.engine.connect()
        silent.execute(sa.text("SELECT 1 FROM nodes WHERE node_id = 'node-1' FOR SHARE"))  # then nothing
        time.sleep(1.5)
        with store.engine.connect() as taker:
            taker.execute(sa.text("SET LOCAL lock_timeout = '3s'"))
            # Without the timeout this waits for the silent transaction and fails on lock_timeout.
            taker.execute(sa.text("SELECT 1 FROM nodes WHERE node_id = 'node-1' FOR UPDATE"))
            taker.rollback()
        with pytest.raises(sa.exc.DBAPIError, match="idle-in-transaction timeout"):
            silent.execute(sa.text("SELECT 1"))  # the server ended that session
        silent.invalidate()
        silent.close()
        # A URL that names a setting keeps its own value.
        url = postgres_url_with(postgres_schema_url, None, idle_in_transaction_session_timeout="7s")
        own = repo.create_engine(url)
        with own.connect() as connection:
            assert connection.exec_driver_sql("SHOW idle_in_transaction_session_timeout").scalar() == "7s"
        own.dispose()
    finally:
        store.close()


def test_a_lease_elected_replica_ends_a_stalled_transaction_within_its_lease(postgres_schema_url):
    """A leader stopped mid-transaction (SIGSTOP) held the lease row's lock 10 s whatever its lease
    (the leader-failover test's takeover took 10 s against a 3 s lease)."""
    leader = leader_mod.LeaderSettings(election="lease", lease_s=3.0, renew_s=1.0)
    url = server._store_url(server.ControllerSettings(db_url=postgres_schema_url, leader=leader))
    assert server._store_url(server.ControllerSettings(db_url=url, leader=leader)) == url  # named: kept
    engine = repo.create_engine(url)
    try:
        with engine.connect() as connection:
            assert connection.exec_driver_sql("SHOW idle_in_transaction_session_timeout").scalar() == "2s"
            assert connection.exec_driver_sql("SHOW search_path").scalar().startswith("rasd_test_")
    finally:
        engine.dispose()
    long = dataclasses.replace(leader, lease_s=60.0, renew_s=5.0)
    long_url = server._store_url(server.ControllerSettings(db_url=postgres_schema_url, leader=long))
    assert "-c idle_in_transaction_session_timeout=10000ms" in sa.engine.make_url(long_url).query["options"]
    sqlite = server.ControllerSettings(db_url="sqlite:///x.db", leader=leader_mod.LeaderSettings(election="static"))
    assert server._store_url(sqlite) == "sqlite:///x.db"


def test_concurrent_appends_of_overlapping_batches_store_each_event_once(store):
    # Without SELECT ... FOR UPDATE both transactions read the same acked_seq and the second
    # insert of a seq violates uq_health_event_node_seq.
    _postgres_only(store)
    store.register_hello(_hello(), 100)
    batches = [[_event(seq) for seq in range(start, start + 4)] for start in range(1, 60, 2)]
    barrier = threading.Barrier(2)
    errors: list[BaseException] = []

    def sender():
        try:
            barrier.wait(timeout=10)
            for batch in batches:
                store.append_events("node-1", batch)
        except BaseException as exc:  # reported below, in the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=sender) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert errors == []
    assert store.count_events() == 62
    assert sorted(e.seq for e in store.list_events(limit=1000)) == list(range(1, 63))
    assert store.register_hello(_hello(spool_head_seq=62), 200).acked_seq == 62


def test_json_columns_round_trip_nested_unicode_and_quotes(store):
    labels = {"rack": "r1", "topology": "ünïcødé ☃ 机架", "quote": "a\"b'c\\d", "empty": "", "json": '{"x": [1]}'}
    store.register_hello(fleet.NodeHello("node-1", "b", "0.1.0", "h", "simulated", labels, (), 0), 100)
    attributes = {f"k{i}": "v" * i for i in range(40)} | {"emoji": "🔥", "newline": "a\nb"}
    store.append_events("node-1", [dataclasses.replace(_event(1), attributes=attributes)])
    (node,) = store.list_nodes()
    assert node.labels == labels
    (event,) = store.list_events()
    assert event.attributes == attributes
    if store.engine.dialect.name == "postgresql":
        with store.engine.connect() as connection:
            # Real json on the server, not text: its operators work.
            assert connection.scalar(sa.text("SELECT labels->>'topology' FROM nodes")) == labels["topology"]
            assert connection.scalar(sa.text("SELECT json_typeof(attributes) FROM health_events")) == "object"


def test_nul_characters_are_stored_as_replacement_characters_on_every_backend(store):
    # PostgreSQL refuses NUL in text; a batch holding one would be refused and resent forever.
    hello = _hello(boot_id="boot\x00-1")
    store.register_hello(hello, 100)
    assert not store.register_hello(hello, 150).rebooted
    nul = dataclasses.replace(_event(1), message="NVRM: Xid 79\x00\x00", attributes={"k\x00": "v\x00"})
    assert store.append_events("node-1", [nul]) == (1, [1])
    (event,) = store.list_events()
    assert event.message == "NVRM: Xid 79\ufffd\ufffd"
    assert event.attributes == {"k\ufffd": "v\ufffd"}
    assert store.list_nodes()[0].boot_id == "boot\ufffd-1"


def test_nanosecond_timestamps_and_seqs_keep_all_64_bits(store):
    now_ns = 1_795_000_000_123_456_789  # 2026: above 2**53, so a float would lose the last digits
    store.register_hello(_hello(), now_ns)
    big = 2**63 - 1
    event = dataclasses.replace(_event(2**53 + 1), observed_unix_ns=big, received_unix_ns=now_ns + 1)
    # Stored, but not acked: the seqs below it never arrived (the ack only covers a gap-free run).
    assert store.append_events("node-1", [event]) == (0, [2**53 + 1])
    store.save_latest(
        {GPU_A: fleet.GpuLatest(power_sample_unix_ns=big - 1, counters_unix_ns=now_ns, clock_event_reasons=2**40)}
    )
    store.touch_nodes({"node-1": big - 2})
    (stored,) = store.list_events(since_unix_ns=now_ns + 1)
    assert (stored.seq, stored.observed_unix_ns, stored.received_unix_ns) == (2**53 + 1, big, now_ns + 1)
    (node,) = store.list_nodes()
    assert node.last_seen_unix_ns == big - 2
    latest = node.gpus[0].latest
    assert latest.power_sample_unix_ns == big - 1
    assert (latest.counters_unix_ns, latest.clock_event_reasons) == (now_ns, 2**40)


def test_every_unix_ns_column_is_a_64_bit_integer_in_the_database(store):
    inspector = sa.inspect(store.engine)
    for table in schema.Base.metadata.sorted_tables:
        reflected = {column["name"]: column["type"] for column in inspector.get_columns(table.name)}
        for column in table.columns:
            if column.name.endswith("_unix_ns"):
                assert isinstance(column.type, sa.BigInteger), f"{table.name}.{column.name}"
                assert isinstance(reflected[column.name], sa.BigInteger), f"{table.name}.{column.name}"


def test_bulk_updates_write_each_row_its_own_values_and_skip_unknown_ids(store):
    gpus = [f"GPU-00000000-0000-4000-8000-0000000000{i:02d}" for i in range(8)]
    for n in range(2):
        records = tuple(
            fleet.GpuRecord(uuid, "H100", f"00000000:{i:02x}:00.0", 200, 700, 700, node_id=f"node-{n}")
            for i, uuid in enumerate(gpus[n * 4 : n * 4 + 4])
        )
        store.register_hello(fleet.NodeHello(f"node-{n}", "b", "0.1.0", f"node-{n}", "simulated", {}, records, 0), 100)
    latest = {
        uuid: fleet.GpuLatest(
            power_w=100.0 + i + 0.25,
            power_sample_unix_ns=1_000 + i,
            enforced_power_limit_w=None if i % 2 else 600 + i,
            temperature_c=40 + i,
            utilization_gpu_pct=None if i == 3 else i,
            clock_event_reasons=i,
            counters_unix_ns=2_000 + i,
        )
        for i, uuid in enumerate(gpus)
    }
    store.save_latest(latest | {"GPU-ffffffff-0000-4000-8000-000000000000": fleet.GpuLatest(power_w=1.0)})
    store.touch_nodes({"node-0": 5_000, "node-1": 6_000, "ghost": 7_000})
    nodes = store.list_nodes()
    assert [(n.node_id, n.last_seen_unix_ns) for n in nodes] == [("node-0", 5_000), ("node-1", 6_000)]
    stored = {g.record.uuid: g.latest for n in nodes for g in n.gpus}
    assert stored == latest
    # Back to unknown: NULLs are written, not skipped.
    store.save_latest({gpus[0]: fleet.GpuLatest()})
    assert store.list_nodes(["node-0"])[0].gpus[0].latest == fleet.GpuLatest()


def test_a_sighting_never_moves_a_node_last_seen_backwards(store):
    """Each replica flushes its own streams' sightings: an older one (a late flush, a node that moved) loses."""
    store.register_hello(_hello(), 100)
    for written, expected in ((6_000, 6_000), (5_000, 6_000), (7_000, 7_000)):
        store.touch_nodes({"node-1": written})
        assert store.list_nodes()[0].last_seen_unix_ns == expected


def test_latest_telemetry_commits_without_waiting_for_the_disk_and_leaves_every_connection_syncing(store):
    """The flush's rows copy memory (the next flush writes them again): their commits skip the log sync, nothing else's.

    SQLite: NORMAL around the flush's transaction, FULL again before the connection is reused (an
    ack's commit after it still syncs). PostgreSQL: synchronous_commit off for that transaction only.
    """
    store.register_hello(_hello(), 100)
    statements: list[str] = []
    sa.event.listen(store.engine, "before_cursor_execute", lambda _c, _cur, sql, *_r: statements.append(sql))
    store.save_latest({GPU_A: fleet.GpuLatest(power_w=512.5, power_sample_unix_ns=150)})
    store.touch_nodes({"node-1": 6_000})
    kinds = [sql.split()[0] for sql in statements]
    if store.engine.dialect.name == "sqlite":
        assert kinds == ["PRAGMA", "UPDATE", "PRAGMA"] * 2
        assert statements[0::3] == ["PRAGMA synchronous=NORMAL"] * 2
        assert statements[2::3] == ["PRAGMA synchronous=FULL"] * 2
        with store.engine.connect() as connection:  # the pool's connection, as the next commit gets it
            assert connection.exec_driver_sql("PRAGMA synchronous").scalar() == 2  # FULL
    else:
        assert kinds == ["SET", "UPDATE"] * 2
        assert statements[0::2] == ["SET LOCAL synchronous_commit = off"] * 2
        with store.engine.connect() as connection:
            assert connection.exec_driver_sql("SHOW synchronous_commit").scalar() == "on"
    (node,) = store.list_nodes()
    assert node.last_seen_unix_ns == 6_000 and node.gpus[0].latest.power_w == 512.5


def test_a_failed_cache_write_still_leaves_the_connection_syncing(store):
    """A flush chunk that fails (a store outage) rolls back, and the connection it used syncs its commits again."""
    with pytest.raises(RuntimeError, match="store went away"), store._cache_writes() as connection:
        connection.exec_driver_sql("UPDATE nodes SET last_seen_unix_ns = 1")
        raise RuntimeError("store went away")
    with store.engine.connect() as connection:
        if store.engine.dialect.name == "sqlite":
            assert connection.exec_driver_sql("PRAGMA synchronous").scalar() == 2  # FULL
        else:
            assert connection.exec_driver_sql("SHOW synchronous_commit").scalar() == "on"


def test_redact_url_hides_the_password(store_url):
    assert ":***@" in repo.redact_url("postgresql+psycopg://rasd:s3cr3t-pw@db.example:5432/rasd")
    assert "s3cr3t-pw" not in repo.redact_url("postgresql+psycopg://rasd:s3cr3t-pw@db.example:5432/rasd")
    redacted = repo.redact_url(store_url)
    password = sa.engine.make_url(store_url).password
    if password:
        assert f":{password}@" not in redacted and ":***@" in redacted
    assert sa.engine.make_url(redacted).database == sa.engine.make_url(store_url).database


def test_a_url_that_does_not_parse_is_named_without_its_password():
    with pytest.raises(ValueError, match="not a SQLAlchemy URL") as raised:
        repo.Store.open("postgresql+psycopg://rasd:s3cr3t@host:notaport/rasd")
    assert "s3cr3t" not in str(raised.value)
    assert "rasd:***@host" in str(raised.value)
    assert repo.redact_url("postgresql+psycopg://rasd:s3cr3t@host:notaport/rasd") == "<invalid url>"


def test_remediation_ids_built_from_real_node_names_fit(store):
    # correlate builds "<node>/<gpu uuid>/<fault key>/<seq>" and escalation adds "@<n>": 80+ characters
    # for an ordinary FQDN. SQLite ignores VARCHAR lengths; PostgreSQL refuses what does not fit.
    from rasd.controller.store import records, remediation

    node = "gpu-node-0001.cluster.example.com"
    incident_id = f"{node}/GPU-12345678-1234-1234-1234-123456789abc/xid:79/12345"
    remediation.RemediationStore(store.engine).commit(
        remediation.Commit(
            now_unix_ns=1,
            incidents=[records.IncidentRecord(incident_id=incident_id, node_id=node, cause="xid:79")],
            tickets=[
                records.TicketRecord(ticket_id=f"{incident_id}@1", node_id=node, incident_id=incident_id, state="open")
            ],
        )
    )
    assert [i["incident_id"] for i in remediation.RemediationStore(store.engine).incidents()] == [incident_id]


def test_an_event_ahead_of_a_gap_is_stored_but_not_acked_until_the_gap_fills(store):
    store.register_hello(_hello(), 100)
    assert store.append_events("node-1", [_event(1)]) == (1, [1])
    # seq 3 arrives before seq 2 (a reordered or lossy sender): keep it, do not ack past the gap.
    assert store.append_events("node-1", [_event(3)]) == (1, [3])
    assert store.append_events("node-1", [_event(3)]) == (1, [])
    assert store.append_events("node-1", [_event(2)]) == (3, [2])
    assert sorted(e.seq for e in store.list_events()) == [1, 2, 3]


def test_sqlite_commits_are_synced_before_they_return(tmp_path):
    """An ack and a dispatched command must outlive a crash of the controller's host (invariants 2, 3).

    WAL with synchronous=FULL syncs the log at every commit; NORMAL would sync only at a checkpoint.
    Every connection of the pool gets it, not only the first one.
    """
    store = repo.Store.open(f"sqlite:///{tmp_path / 'rasd.db'}")
    connections = [store.engine.connect() for _ in range(3)]
    try:
        for connection in connections:
            assert connection.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
            assert connection.exec_driver_sql("PRAGMA synchronous").scalar() == 2  # FULL
    finally:
        for connection in connections:
            connection.close()
        store.close()


def test_sqlite_commits_leave_the_wal_checkpoint_to_the_store_thread(tmp_path):
    """No commit checkpoints the WAL (a stall on the event → dispatch path); the checkpointer does."""
    store = repo.Store.open(f"sqlite:///{tmp_path / 'rasd.db'}")
    with store.engine.connect() as connection:
        assert connection.exec_driver_sql("PRAGMA wal_autocheckpoint").scalar() == 0
    store.register_hello(_hello(), 100)
    store.append_events("node-1", [_event(seq) for seq in range(1, 200)])
    store.close()  # a last checkpoint: everything in the WAL is in the database file
    check = sa.create_engine(f"sqlite:///{tmp_path / 'rasd.db'}")
    with check.connect() as connection:
        busy, frames, checkpointed = connection.exec_driver_sql("PRAGMA wal_checkpoint(PASSIVE)").one()
        assert busy == 0 and frames == checkpointed
        assert connection.exec_driver_sql("SELECT count(*) FROM health_events").scalar() == 199
    check.dispose()


def _wal_database(path):
    """A SQLite file in WAL mode whose commits never checkpoint, with one table to write to."""
    engine = repo.create_engine(f"sqlite:///{path}")

    @sa.event.listens_for(engine, "connect")
    def _no_autocheckpoint(dbapi_connection, _record):
        dbapi_connection.execute("PRAGMA wal_autocheckpoint=0")

    with engine.begin() as connection:
        connection.exec_driver_sql("CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT)")
    return engine


def _write_rows(engine, first, count, size=3000):
    with engine.begin() as connection:
        for row in range(first, first + count):
            connection.exec_driver_sql("INSERT INTO t VALUES (?, ?)", (row, "x" * size))


def test_the_wal_index_reads_what_a_checkpoint_would_copy(tmp_path):
    """The -shm header offsets are SQLite's: checked against what PRAGMA wal_checkpoint reports."""
    path = str(tmp_path / "wal.db")
    index = repo.WalIndex(path)
    assert index.pending_bytes() is None  # no database, no WAL index
    engine = _wal_database(path)
    _write_rows(engine, 0, 300)
    with engine.connect() as connection:
        page_size = connection.exec_driver_sql("PRAGMA page_size").scalar()
        pending = index.pending_bytes()
        busy, frames, checkpointed = connection.exec_driver_sql("PRAGMA wal_checkpoint(PASSIVE)").one()
    assert busy == 0 and frames == checkpointed > 300  # nothing had been copied before: all of it was pending
    assert pending == frames * page_size
    assert index.pending_bytes() == 0
    _write_rows(engine, 1000, 10)  # the next commit restarts the log from its start
    with engine.connect() as connection:
        pending = index.pending_bytes()
        _busy, frames, _checkpointed = connection.exec_driver_sql("PRAGMA wal_checkpoint(PASSIVE)").one()
    assert 0 < pending == frames * page_size < 300 * page_size
    engine.dispose()
    index.close()


def test_the_checkpointer_waits_for_the_wal_to_gather_before_it_checkpoints(tmp_path):
    """A quiet store's log is not checkpointed every round: each catch-up costs the next commit a sync."""
    path = str(tmp_path / "wal.db")
    engine = _wal_database(path)
    checkpointer = repo.WalCheckpointer(engine, interval_s=0.01, checkpoint_after_bytes=1024 * 1024)
    index = repo.WalIndex(path)
    try:
        _write_rows(engine, 0, 20)  # about 80 KiB
        time.sleep(0.2)  # twenty rounds
        assert checkpointer.checkpoints == 0 and 0 < index.pending_bytes() < 1024 * 1024
        _write_rows(engine, 100, 400)  # past 1 MiB
        deadline = time.monotonic() + 5
        while checkpointer.checkpoints == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert checkpointer.checkpoints >= 1 and index.pending_bytes() == 0
    finally:
        checkpointer.stop()
        engine.dispose()
        checkpointer.close()
        index.close()


def _wal_file_bytes(path):
    return os.path.getsize(path + "-wal") if os.path.exists(path + "-wal") else 0


@contextlib.contextmanager
def _checkpointed_database(tmp_path, bound, *, interval_s):
    """A WAL database with its checkpointer (truncating past bound) and a reader connection; all closed after."""
    path = str(tmp_path / "wal.db")
    engine = _wal_database(path)
    checkpointer = repo.WalCheckpointer(
        engine,
        interval_s=interval_s,
        checkpoint_after_bytes=64 * 1024,
        truncate_above_bytes=bound,
        truncate_every_s=0.05,
    )
    reader = sqlite3.connect(path, isolation_level=None)
    try:
        yield path, engine, checkpointer, reader
    finally:
        reader.close()
        checkpointer.stop()
        engine.dispose()
        checkpointer.close()


def test_the_checkpointer_truncates_a_wal_file_that_grew_past_its_bound(tmp_path):
    """Issue #37 item 18: a write burst while a reader held an old snapshot left a 373 MB WAL file.

    PASSIVE checkpoints copy the log into the database once the reader is gone, and the next commit
    writes the log from its start again, but the file kept its size for as long as the controller ran.
    """
    bound = 512 * 1024
    with _checkpointed_database(tmp_path, bound, interval_s=0.01) as (path, engine, checkpointer, reader):
        reader.execute("BEGIN")
        reader.execute("SELECT count(*) FROM t").fetchone()  # an old snapshot: no checkpoint catches up past it
        for first in range(0, 1000, 100):
            _write_rows(engine, first, 100)  # ~3 MB in ten commits
        grown = _wal_file_bytes(path)
        assert grown > 2 * 1024 * 1024
        reader.execute("COMMIT")
        deadline = time.monotonic() + 5
        while (_wal_file_bytes(path) > bound or checkpointer.truncations == 0) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert _wal_file_bytes(path) <= bound, f"the WAL file stayed at {_wal_file_bytes(path)} bytes (was {grown})"
        assert checkpointer.truncations >= 1
        _write_rows(engine, 5000, 10)  # the store goes on writing
        with engine.connect() as connection:
            assert connection.exec_driver_sql("SELECT count(*) FROM t").scalar() == 1010
            assert connection.exec_driver_sql("PRAGMA busy_timeout").scalar() == repo.SQLITE_BUSY_TIMEOUT_S * 1000


def test_watching_the_wal_never_drops_this_processs_sqlite_locks(tmp_path):
    """Closing any descriptor of a file drops all of a process's POSIX locks on it, SQLite's too.

    The checkpointer reads the -shm file many times while this process holds SQLite's write lock;
    a writer in another process must still wait for it (it did not when each read opened and
    closed the file: two writers at once).
    """
    path = tmp_path / "wal.db"
    engine = _wal_database(str(path))
    _write_rows(engine, 0, 5)
    checkpointer = repo.WalCheckpointer(engine, interval_s=0.01, checkpoint_after_bytes=1 << 30)
    holder = sqlite3.connect(path, isolation_level=None)
    try:
        holder.execute("BEGIN IMMEDIATE")
        holder.execute("INSERT INTO t VALUES (9999, 'held')")
        time.sleep(0.2)  # twenty reads of the wal-index
        other = subprocess.run(
            [sys.executable, "-c", _OTHER_PROCESS_WRITES, str(path)], capture_output=True, text=True, timeout=60
        )
        assert other.stdout.strip() == "locked", other.stdout + other.stderr
    finally:
        holder.execute("ROLLBACK")
        holder.close()
        checkpointer.stop()
        engine.dispose()
        checkpointer.close()


_OTHER_PROCESS_WRITES = """
import sqlite3, sys
connection = sqlite3.connect(sys.argv[1], timeout=0.5)
try:
    connection.execute("INSERT INTO t VALUES (-1, 'other')")
    connection.commit()
    print("wrote")
except sqlite3.OperationalError as exc:
    print("locked" if "locked" in str(exc) else exc)
"""


def test_a_read_then_write_upsert_leaves_insert_only_columns_of_an_existing_row_alone(store):
    """The path for backends without ON CONFLICT keeps `upsert_many`'s insert-only rule."""
    store.register_hello(_hello(), 100)
    rma, healthy = int(fleet.ComponentState.RMA), int(fleet.ComponentState.HEALTHY)
    with orm.Session(store.engine) as session, session.begin():
        repo.upsert_row(session, schema.GpuRow, {"uuid": GPU_A}, insert_only=("state",), model="B200", state=rma)
        repo.upsert_row(
            session, schema.GpuRow, {"uuid": "GPU-new"}, insert_only=("state",), node_id="node-1", state=healthy
        )
    (node,) = store.list_nodes()
    gpus = {g.record.uuid: g for g in node.gpus}
    assert gpus[GPU_A].record.model == "B200" and gpus[GPU_A].state is fleet.ComponentState.HEALTHY
    assert gpus["GPU-new"].state is fleet.ComponentState.HEALTHY


def test_the_wal_file_is_not_truncated_while_commits_go_on_only_once_they_pause(tmp_path):
    """A TRUNCATE checkpoint holds new writers back while it runs: tried during a remediation burst
    whose WAL had passed the bound, it made the decision p99 3-5x worse. It waits for a pause."""
    bound = 256 * 1024
    with _checkpointed_database(tmp_path, bound, interval_s=0.25) as (path, engine, checkpointer, reader):
        reader.execute("BEGIN")
        reader.execute("SELECT count(*) FROM t").fetchone()  # the log grows past the bound behind this snapshot
        _write_rows(engine, 0, 200)
        reader.execute("COMMIT")
        assert _wal_file_bytes(path) > bound
        busy_until = time.monotonic() + 1.0
        row = 1000
        while time.monotonic() < busy_until:  # a commit every ~10 ms: never a whole 250 ms interval without one
            _write_rows(engine, row, 1, size=100)
            row += 1
            time.sleep(0.01)
        assert checkpointer.truncations == 0, "truncated while commits were under way"
        assert checkpointer.checkpoints >= 1  # the log was still copied into the database meanwhile
        deadline = time.monotonic() + 5
        while checkpointer.truncations == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert checkpointer.truncations >= 1
        assert _wal_file_bytes(path) <= bound
