"""Leader election on a real store: the lease row, the fence on the ladder's writes, and `Leadership`.

Every store test runs on SQLite and on PostgreSQL (see conftest.py); the two-replica timing tests
need PostgreSQL, where replicas really elect.
"""

from __future__ import annotations

import asyncio
import threading
import time

import prometheus_client
import pytest
import sqlalchemy as sa

from rasd.controller import main
from rasd.controller.replication import leader
from rasd.controller.rpc import leader_gate
from rasd.controller.store import lease as lease_store
from rasd.controller.store import remediation as rstore
from rasd.controller.store import repo, schema


def _audit(note: str) -> dict:
    return {"at_unix_ns": 1, "actor": "test", "action": note, "node_id": "", "gpu_uuid": "", "reason": "",
            "outcome": "ok", "details": {}}  # fmt: skip


def _audits(store: repo.Store) -> list[str]:
    with store.engine.connect() as connection:
        return list(connection.scalars(sa.select(schema.AuditRow.action)))


def test_replicas_elect_one_leader_and_a_takeover_gets_the_next_token(store):
    leases = lease_store.LeaseStore(store.engine)
    first, lease_a, _ = leases.look("ctl-a", lease_s=0.5)
    second, _, _ = leases.look("ctl-b", lease_s=0.5)
    assert first.leader and lease_a.fencing_token == 1
    assert not second.leader and "ctl-a leads term 1" in second.reason
    renewed, lease_a, _ = leases.look("ctl-a", lease_s=0.5)
    assert renewed.verdict.value == "renewed" and lease_a.fencing_token == 1
    time.sleep(0.6)  # ctl-a stops renewing
    taken, lease_b, _ = leases.look("ctl-b", lease_s=0.5)
    assert taken.leader and lease_b.holder == "ctl-b" and lease_b.fencing_token == 2
    back, _, _ = leases.look("ctl-a", lease_s=0.5)
    assert not back.leader
    assert leases.current() == lease_b


def test_a_release_hands_the_lease_over_at_once(store):
    leases = lease_store.LeaseStore(store.engine)
    leases.look("ctl-a", lease_s=60)
    assert not leases.release("ctl-b")
    assert leases.release("ctl-a")
    taken, lease_b, _ = leases.look("ctl-b", lease_s=60)
    assert taken.leader and lease_b.fencing_token == 2


def test_the_fence_refuses_a_deposed_leaders_commit_and_keeps_nothing_of_it(store):
    leases = lease_store.LeaseStore(store.engine)
    _, lease_a, _ = leases.look("ctl-a", lease_s=0.3)
    ladder = rstore.RemediationStore(store.engine)
    ladder.fence = lambda session: lease_store.check_fence(session, lease_a.fencing_token)
    ladder.commit(rstore.Commit(now_unix_ns=1, audit=[_audit("in term 1")]))
    time.sleep(0.4)
    leases.look("ctl-b", lease_s=30)  # ctl-b takes over; ctl-a does not know yet
    with pytest.raises(
        lease_store.NotLeaderError, match="fencing token 1 is stale: the lease is at term 2 held by ctl-b"
    ):
        ladder.commit(rstore.Commit(now_unix_ns=2, audit=[_audit("late write of term 1")]))
    assert _audits(store) == ["in term 1"]


def test_a_replica_without_a_term_cannot_write(store):
    ladder = rstore.RemediationStore(store.engine)
    ladder.fence = lambda session: lease_store.check_fence(session, None)
    with pytest.raises(lease_store.NotLeaderError, match="not the leader"):
        ladder.commit(rstore.Commit(now_unix_ns=1, audit=[_audit("follower")]))
    assert _audits(store) == []


def test_a_takeover_waits_for_the_leaders_transaction_in_flight(store, store_url):
    if not store_url.startswith("postgresql"):
        pytest.skip("PostgreSQL behaviour: the fence's shared row lock orders a takeover after the write")
    leases = lease_store.LeaseStore(store.engine)
    _, lease_a, _ = leases.look("ctl-a", lease_s=0.2)
    time.sleep(0.3)
    entered, release = threading.Event(), threading.Event()

    def slow_fence(session):
        lease_store.check_fence(session, lease_a.fencing_token)
        entered.set()
        release.wait(10)

    ladder = rstore.RemediationStore(store.engine)
    ladder.fence = slow_fence
    writer = threading.Thread(target=lambda: ladder.commit(rstore.Commit(now_unix_ns=1, audit=[_audit("term 1")])))
    writer.start()
    assert entered.wait(10)
    took: list[float] = []
    taker = threading.Thread(target=lambda: took.append(time.monotonic()) or leases.look("ctl-b", lease_s=30))
    started = time.monotonic()
    taker.start()
    time.sleep(0.5)
    assert taker.is_alive(), "the takeover must wait for the write that passed the fence"
    release.set()
    writer.join(10)
    taker.join(10)
    assert time.monotonic() - started >= 0.5
    assert _audits(store) == ["term 1"] and leases.current().holder == "ctl-b"


def test_static_election_takes_a_new_term_at_each_start(store):
    async def run():
        terms = []
        for _ in range(2):
            leadership = leader.Leadership(store.engine, leader.LeaderSettings(replica_id="solo"), election="static")
            elected = []

            async def on_elected(token, elected=elected):
                elected.append(token)

            leadership.on_elected(on_elected)
            registry = prometheus_client.CollectorRegistry()
            leadership.register_metrics(registry)
            await leadership.start()
            assert leadership.is_leader() and elected == [leadership.fencing_token]
            assert registry.get_sample_value("rasd_controller_leader") == 1.0
            assert registry.get_sample_value("rasd_controller_leader_term") == leadership.fencing_token
            terms.append(leadership.fencing_token)
            await leadership.stop()
            assert not leadership.is_leader() and leadership.fencing_token is None
            assert registry.get_sample_value("rasd_controller_leader") == 0.0
        return terms

    assert asyncio.run(run()) == [1, 2]


def test_two_replicas_one_leader_and_a_clean_stop_hands_over(store, store_url):
    if not store_url.startswith("postgresql"):
        pytest.skip("needs PostgreSQL: SQLite is one replica (static election)")
    settings = {"lease_s": 2.0, "renew_s": 0.2}

    async def run():
        events = []
        replicas = {}
        for name in ("a", "b"):
            replicas[name] = leader.Leadership(
                store.engine, leader.LeaderSettings(replica_id=f"ctl-{name}", **settings), election="lease"
            )

            async def elected(token, name=name):
                events.append(("elected", name, token))

            async def deposed(name=name):
                events.append(("deposed", name))

            replicas[name].on_elected(elected)
            replicas[name].on_deposed(deposed)
        await replicas["a"].start()
        await replicas["b"].start()
        await asyncio.sleep(0.5)  # several renewals
        assert replicas["a"].is_leader() and not replicas["b"].is_leader()
        assert replicas["b"].leader_id == "ctl-a"
        stopped = time.monotonic()
        await replicas["a"].stop()
        while not replicas["b"].is_leader():
            await asyncio.sleep(0.02)
        handover_s = time.monotonic() - stopped
        await replicas["b"].stop()
        return events, handover_s

    events, handover_s = asyncio.run(run())
    assert events == [("elected", "a", 1), ("deposed", "a"), ("elected", "b", 2), ("deposed", "b")]
    assert handover_s < 1.0, "a released lease is taken on the follower's next look, not after lease_s"


def test_leader_settings_name_the_bad_key():
    assert leader.LeaderSettings.from_mapping({"lease_s": 10, "renew_s": 2}).lease_s == 10.0
    with pytest.raises(leader.LeaderSettingsError, match=r"leader\.renew_s: must be"):
        leader.LeaderSettings.from_mapping({"lease_s": 10, "renew_s": 6})
    with pytest.raises(leader.LeaderSettingsError, match=r"leader\.election"):
        leader.LeaderSettings.from_mapping({"election": "raft"})
    with pytest.raises(leader.LeaderSettingsError, match=r"leader\.lease_time: unknown setting"):
        leader.LeaderSettings.from_mapping({"lease_time": 10})
    assert leader.LeaderSettings().resolved_election("sqlite:///x.db") == "static"
    assert leader.LeaderSettings().resolved_election("postgresql+psycopg://u@h/db") == "lease"
    assert leader.LeaderSettings(election="static").resolved_election("postgresql+psycopg://u@h/db") == "static"


def test_replica_id_defaults_to_the_pod_name(monkeypatch):
    monkeypatch.setenv("POD_NAME", "rasd-controller-5d9c-x2x7q")
    assert leader.default_replica_id() == "rasd-controller-5d9c-x2x7q"
    monkeypatch.delenv("POD_NAME")
    assert leader.default_replica_id()


def test_controller_toml_leader_table(tmp_path):
    path = tmp_path / "controller.toml"
    path.write_text('[leader]\nlease_s = 20\nrenew_s = 5\nreplica_id = "ctl-0"\n')
    assert main.load_config(path)["leader"] == leader.LeaderSettings(lease_s=20.0, renew_s=5.0, replica_id="ctl-0")
    path.write_text("[leader]\nlease_s = -1\n")
    with pytest.raises(ValueError, match=r"leader\.lease_s"):
        main.load_config(path)


def test_only_reads_run_on_a_follower():
    for method in ("ListNodes", "GetNode", "ListRepairs", "GetPowerStatus", "ListAudit"):
        assert not leader_gate.needs_leader(f"/rasd.api.v1.AdminService/{method}")
    for method in ("Quarantine", "Release", "Validate", "AccuseSdc", "ApproveRma", "SetAutomationPaused",
                   "SetPowerBudget"):  # fmt: skip
        assert leader_gate.needs_leader(f"/rasd.api.v1.AdminService/{method}")
    assert not leader_gate.needs_leader("/rasd.api.v1.AgentService/Connect")
    assert not leader_gate.needs_leader("/grpc.health.v1.Health/Check")


def test_a_leader_whose_loops_fail_to_start_hands_the_lease_over(store, store_url):
    if not store_url.startswith("postgresql"):
        pytest.skip("needs PostgreSQL: SQLite is one replica (static election)")

    async def run():
        broken = leader.Leadership(
            store.engine, leader.LeaderSettings(replica_id="ctl-a", lease_s=5.0, renew_s=0.2), election="lease"
        )
        healthy = leader.Leadership(
            store.engine, leader.LeaderSettings(replica_id="ctl-b", lease_s=5.0, renew_s=0.2), election="lease"
        )

        async def fail(_token):
            raise RuntimeError("store unreadable")

        broken.on_elected(fail)
        await broken.start()
        await healthy.start()
        started = time.monotonic()
        while not healthy.is_leader():
            await asyncio.sleep(0.02)
        waited_s = time.monotonic() - started
        await broken.stop()
        await healthy.stop()
        return waited_s, broken.is_leader()

    waited_s, broken_leads = asyncio.run(run())
    assert not broken_leads
    assert waited_s < 2.0, "handed over at the next look, long before the 5 s lease ran out"


def test_a_renewal_that_hangs_ends_the_term_when_the_lease_stops_covering_it(store, store_url):
    """Packets to the database dropped: the renewal neither returns nor fails for minutes.

    The term must end (the deposed callbacks: the ladder stops, its adapters with it) when the last
    renewal stops covering it, before another replica can take the lease, not when the call returns.
    """
    if not store_url.startswith("postgresql"):
        pytest.skip("needs PostgreSQL: SQLite is one replica (static election)")
    a = leader.Leadership(
        store.engine, leader.LeaderSettings(replica_id="ctl-a", lease_s=1.0, renew_s=0.2), election="lease"
    )
    hang = threading.Event()
    look = a.store.look

    def black_holed(*args, **kwargs):
        if hang.is_set():
            time.sleep(4.0)  # then TCP finally gives up
            raise ConnectionError("server closed the connection unexpectedly")
        return look(*args, **kwargs)

    a.store.look = black_holed  # type: ignore[method-assign]
    deposed_after_s: list[float] = []

    async def run():
        async def deposed():
            deposed_after_s.append(time.monotonic() - hung_at)

        a.on_deposed(deposed)
        await a.start()
        assert a.is_leader()
        hang.set()
        hung_at = time.monotonic()
        while not deposed_after_s and time.monotonic() - hung_at < 6:
            await asyncio.sleep(0.02)
        await a.stop()

    asyncio.run(run())
    assert deposed_after_s and deposed_after_s[0] < 1.0, deposed_after_s  # within the lease, not after 4 s


def test_a_term_whose_loops_take_longer_than_the_lease_to_start_is_renewed_meanwhile(store, store_url):
    """The leader's loops may take longer to start than the lease lasts (a commit writer process to
    start on a busy host): the lease must be renewed while they start, or the term lapses as it begins
    and a follower takes over a leader that is alive and well."""
    if not store_url.startswith("postgresql"):
        pytest.skip("needs PostgreSQL: SQLite is one replica (static election)")

    async def run():
        events = []
        a = leader.Leadership(
            store.engine, leader.LeaderSettings(replica_id="ctl-a", lease_s=1.0, renew_s=0.2), election="lease"
        )
        b = leader.Leadership(
            store.engine, leader.LeaderSettings(replica_id="ctl-b", lease_s=1.0, renew_s=0.2), election="lease"
        )

        async def slow_start(token):
            await asyncio.sleep(2.5)  # two and a half leases
            events.append(("started", token))

        async def deposed():
            events.append(("deposed",))

        a.on_elected(slow_start)
        a.on_deposed(deposed)
        await a.start()
        await b.start()
        await asyncio.sleep(1.5)  # b looks several times, a's loops are up
        leads = a.is_leader(), b.is_leader()
        await b.stop()
        await a.stop()
        return events, leads

    events, leads = asyncio.run(run())
    assert leads == (True, False)
    assert events == [("started", 1), ("deposed",)], "one term, ended only by the stop"
