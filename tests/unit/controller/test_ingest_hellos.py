"""Ingest.register_hello: Hellos that arrive together are registered in one store transaction."""

from __future__ import annotations

import asyncio

import pytest
import sqlalchemy as sa
from prometheus_client import CollectorRegistry
from sqlalchemy import event as sa_event

from rasd.controller import ingest as ingest_mod
from rasd.controller import metrics
from rasd.controller.core import fleet
from rasd.controller.store import repo


def _hello(n: int, *, gpu_node: str | None = None) -> fleet.NodeHello:
    node_id = f"node-{n}"
    gpu = fleet.GpuRecord(
        f"GPU-00000000-0000-4000-8000-{n:012d}", gpu_node or node_id, "H100", "00000000:18:00.0", 200, 700, 700
    )
    return fleet.NodeHello(node_id, "boot-1", "0.1.0", node_id, "simulated", {"rack": "r1"}, (gpu,), 0)


@pytest.fixture
def rig(tmp_path):
    store = repo.Store.open(f"sqlite:///{tmp_path / 'rasd.db'}")
    commits: list[int] = []
    sa_event.listen(store.engine, "commit", lambda _conn: commits.append(1))
    ingest = ingest_mod.Ingest(store, metrics.ControllerMetrics(CollectorRegistry()))
    yield store, ingest, commits
    store.close()


def test_a_storm_of_hellos_is_registered_in_few_transactions(rig):
    store, ingest, commits = rig

    async def storm():
        return await asyncio.gather(*(ingest.register_hello(_hello(n), 1_000 + n) for n in range(200)))

    outcomes = asyncio.run(storm())
    assert outcomes == [repo.HelloOutcome(acked_seq=0, spool_reset=False, rebooted=False)] * 200
    assert len(store.list_nodes()) == 200
    assert len(commits) <= 3  # the first Hello alone, then the rest together (at most 256 a group)


def test_a_hello_the_store_refuses_fails_alone(rig):
    store, ingest, _commits = rig
    # A GPU row naming a node that does not exist: the foreign key refuses it, and with it the group.
    ghost = _hello(7, gpu_node="node-that-never-said-hello")

    async def storm():
        return await asyncio.gather(
            *(ingest.register_hello(h, 1_000) for h in [_hello(1), _hello(2), ghost, _hello(3)]),
            return_exceptions=True,
        )

    first, second, refused, fourth = asyncio.run(storm())
    assert isinstance(refused, sa.exc.IntegrityError)
    assert all(isinstance(o, repo.HelloOutcome) for o in (first, second, fourth))
    assert sorted(n.node_id for n in store.list_nodes()) == ["node-1", "node-2", "node-3"]
