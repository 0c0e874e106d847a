"""A result another replica stored for the leader is deleted only once the leader committed it.

Lease election on real PostgreSQL (the only store with more than one replica): the agent's stream is
on replica B, which stores the result; leader A applies it. When A's commit fails, the stored row
stays for the next round or the next leader (an in-memory copy dies with A's term).
"""

from __future__ import annotations

import asyncio
import dataclasses
import time

import pytest
from prometheus_client import CollectorRegistry

from rasd.api.v1 import commands_pb2 as commands_pb
from rasd.controller import wiring
from rasd.controller.core import fleet
from rasd.controller.core.remediation import events as health
from rasd.controller.ingest import service as ingest_mod
from rasd.controller.observability import metrics
from rasd.controller.replication import leader
from rasd.controller.replication import relay as relay_mod
from rasd.controller.store import repo

GPU = "GPU-00000000-0000-4000-8000-000000000001"
NODE = "node-1"
LABELS = {"rack": "r1"}


def _hello() -> fleet.NodeHello:
    gpus = (fleet.GpuRecord(GPU, "H100", "0000:18:00.0", 200, 700, 700, node_id=NODE),)
    return fleet.NodeHello(NODE, "boot-1", "0.1.0", NODE, "simulated", LABELS, gpus, 0)


def _xid(seq: int, code: int) -> repo.StoredEvent:
    at_ns = time.time_ns()
    return repo.StoredEvent(
        node_id=NODE, seq=seq, observed_unix_ns=at_ns - 10**6, received_unix_ns=at_ns,
        kind=int(health.EventKind.XID), severity=int(health.Severity.ERROR), gpu_uuid=GPU, xid=code,
        message=f"NVRM: Xid (PCI:0000:18:00): {code}", source="kmsg", attributes={},
    )  # fmt: skip


class _Replica:
    """Wired as controller/server.py wires a lease-election replica (the relay owns the term callbacks)."""

    def __init__(self, url: str, name: str) -> None:
        self.store = repo.Store.open(url)
        # A lease no CPU-starved renewal loses mid-test (tests run in parallel): the handover is explicit.
        self.leadership = leader.Leadership(
            self.store.engine, leader.LeaderSettings(replica_id=name, lease_s=5.0, renew_s=0.2), election="lease"
        )
        self.wired = wiring.replicated(
            self.store,
            metrics.ControllerMetrics(CollectorRegistry()),
            self.leadership,
            ladder=wiring.Ladder(fence=self.leadership.fence),
            settings=ingest_mod.IngestSettings(mark_all_disconnected_at_start=False),
            poll_s=0.05,
        )
        self.ingest = self.wired.ingest
        self.service = self.wired.remediation
        self.relay = self.wired.relay
        self.ingest.node_labels[NODE] = dict(LABELS)


def test_a_relayed_result_the_leader_could_not_commit_is_kept_for_the_next_leader(postgres_schema_url):
    a, b = _Replica(postgres_schema_url, "ctl-a"), _Replica(postgres_schema_url, "ctl-b")
    a.store.register_hello(_hello(), 1)

    async def scenario() -> dict[str, str]:
        await a.ingest.start()
        await b.ingest.start()
        await a.leadership.start()
        await a.service.on_events(NODE, [_xid(1, 13)], LABELS)
        (restart,) = a.service.store.commands(node_id=NODE)
        # The agent's stream is on B: B stores its answer for the leader.
        ok = commands_pb.ActionResult(command_id=restart.command_id, outcome=commands_pb.ACTION_OUTCOME_SUCCEEDED)
        b.relay.store.save_result(
            command_id=restart.command_id, node_id=NODE, result=ok.SerializeToString(),
            replica_id="ctl-b", now_unix_ns=time.time_ns(),
        )  # fmt: skip
        commit, failures = a.service.store.commit, []

        def lost_once(change):
            if not failures:
                failures.append(1)
                raise repo.WriterLost("the store writer process died during the commit")
            return commit(change)

        a.service.store.commit = lost_once  # type: ignore[method-assign]
        assert (await a.relay.take_in())["results"] == 0
        assert len(a.relay.store.results()) == 1, "the result A could not commit is still stored"
        await a.leadership.stop()  # A's term ends before it tried again
        await b.leadership.start()
        assert (await b.relay.take_in())["results"] == 1
        assert b.relay.store.results() == []
        b.service.state.clock = lambda: time.time_ns() + 3600 * 10**9  # the restart's wait has long run out
        await b.service.tick()
        rows = {c.kind: c.status for c in b.service.store.commands(node_id=NODE)}
        await b.leadership.stop()
        await a.ingest.stop()
        await b.ingest.stop()
        return rows

    try:
        rows = asyncio.run(scenario())
    finally:
        a.store.close()
        b.store.close()
    assert rows.get("restart_process") == "succeeded", rows
    assert "reset_gpu" not in rows, f"the ladder climbed past a restart that worked: {rows}"


@pytest.mark.parametrize("per_read", [1_000, 1], ids=["one read", "a read each"])
def test_the_leader_applies_the_stored_results_together_in_one_transaction(postgres_schema_url, per_read, monkeypatch):
    """Results the other replicas stored go into the ladder a group to a commit, not one commit each; an
    intake round reads on while its reads come back full (with one result a read: three reads, three commits)."""
    monkeypatch.setattr(relay_mod, "RESULTS_PER_READ", per_read)
    gpus = [f"GPU-00000000-0000-4000-8000-00000000001{i}" for i in range(3)]
    records = tuple(
        fleet.GpuRecord(g, "H100", f"0000:1{i}:00.0", 200, 700, 700, node_id=NODE) for i, g in enumerate(gpus)
    )
    a, b = _Replica(postgres_schema_url, "ctl-a"), _Replica(postgres_schema_url, "ctl-b")
    a.store.register_hello(fleet.NodeHello(NODE, "boot-1", "0.1.0", NODE, "simulated", LABELS, records, 0), 1)

    def xid13(seq: int, gpu: str) -> repo.StoredEvent:
        return dataclasses.replace(_xid(seq, 13), gpu_uuid=gpu)

    async def scenario() -> tuple[int, float, dict[str, str]]:
        await a.ingest.start()
        await a.leadership.start()
        await a.service.on_events(NODE, [xid13(i + 1, g) for i, g in enumerate(gpus)], LABELS)
        restarts = a.service.store.commands(node_id=NODE)
        for restart in restarts:  # the agent's stream is on B: B stores each answer for the leader
            ok = commands_pb.ActionResult(command_id=restart.command_id, outcome=commands_pb.ACTION_OUTCOME_SUCCEEDED)
            b.relay.store.save_result(command_id=restart.command_id, node_id=NODE, result=ok.SerializeToString(),
                                      replica_id="ctl-b", now_unix_ns=time.time_ns())  # fmt: skip
        commits = a.service.state.metrics.remediation_commit_seconds
        before = _count(commits)
        applied = (await a.relay.take_in())["results"]
        transactions = _count(commits) - before
        rows = {c.gpu_uuid: c.status for c in a.service.store.commands(node_id=NODE)}
        await a.leadership.stop()
        await a.ingest.stop()
        return applied, transactions, rows

    try:
        applied, transactions, rows = asyncio.run(scenario())
    finally:
        a.store.close()
        b.store.close()
    assert applied == 3 and transactions == (1 if per_read > 3 else 3)
    assert rows == dict.fromkeys(gpus, "succeeded")


def _count(histogram) -> float:
    return next(s.value for m in histogram.collect() for s in m.samples if s.name.endswith("_count"))
