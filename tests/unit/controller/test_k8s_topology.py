"""Topology from Node labels (issue #38 item 3): the Kubernetes adapter reads each Node's zone, NVLink clique
(GPU Feature Discovery's ``nvidia.com/gpu.clique``) and rack labels, and the ladder's blast radius counts
those domains, agent.toml's labels staying the fallback; the real client against the fake API server."""

from __future__ import annotations

import asyncio
import pathlib
import sys
import time

import kubernetes.client
import pytest
from prometheus_client import CollectorRegistry

from rasd.controller import wiring
from rasd.controller.core import fleet
from rasd.controller.core.remediation import events as health
from rasd.controller.core.remediation import policy as policy_mod
from rasd.controller.executors import quarantine
from rasd.controller.ingest import streams as streams_mod
from rasd.controller.observability import metrics
from rasd.controller.remediation import node_sync
from rasd.controller.remediation import state as state_mod
from rasd.controller.store import repo

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "fakes"))
import kube_api

T0_NS = 1_800_000_000 * 10**9


@pytest.fixture
def api():
    fake = kube_api.FakeKubeApi()
    fake.start()
    for name, clique, zone, rack in (("a", "nvl-1", "z1", "r1"), ("b", "nvl-1", "z1", "r2"), ("c", "nvl-2", "z2", "")):
        fake.add_node(name, gpus=1)
        labels = fake.nodes[name]["metadata"]["labels"]
        labels.update({"nvidia.com/gpu.clique": clique, "topology.kubernetes.io/zone": zone, "site/rack": rack})
    yield fake
    fake.stop()


def _adapter(api, **settings) -> quarantine.KubernetesQuarantine:
    client = kubernetes.client.ApiClient(kubernetes.client.Configuration(host=api.url))
    return quarantine.KubernetesQuarantine(client, quarantine.KubernetesSettings(request_timeout_s=5, **settings))


def test_sync_reads_every_nodes_topology_under_the_configured_keys_and_heartbeats_the_named(api):
    adapter = _adapter(api, rack_label="site/rack")
    try:
        topology = adapter.sync_nodes(["a", "unknown"])
    finally:
        adapter.close()

    assert topology == {
        "a": {"zone": "z1", "nvlink_domain": "nvl-1", "rack": "r1"},
        "b": {"zone": "z1", "nvlink_domain": "nvl-1", "rack": "r2"},
        "c": {"zone": "z2", "nvlink_domain": "nvl-2"},  # an empty label value names no domain
    }
    assert api.count("GET", "/api/v1/nodes") == 1, "one list, not a read per node"
    conditions = {n: [c["type"] for c in api.node(n)["status"]["conditions"]] for n in ("a", "b")}
    assert conditions == {"a": ["Ready", "RasdHealthy"], "b": ["Ready"]}


def test_a_key_set_empty_is_not_read(api):
    adapter = _adapter(api, nvlink_domain_label="", zone_label="")
    try:
        assert adapter.sync_nodes([])["a"] == {}, "the default rack label (rasd.io/rack) is not on these nodes"
    finally:
        adapter.close()


def test_node_sync_settings_name_a_bad_value():
    with pytest.raises(quarantine.QuarantineSettingsError, match="node_sync_s"):
        quarantine.open_quarantine({"adapter": "kubernetes", "kubernetes": {"host": "http://x", "node_sync_s": -1}})


# ---- the ladder's blast radius counts the Node labels' domains --------------------------------


def _hello(node: str, labels: dict[str, str]) -> fleet.NodeHello:
    gpu = fleet.GpuRecord(f"GPU-{node}", "H100", "0000:18:00.0", 200, 700, 700, node_id=node)
    return fleet.NodeHello(node, "boot-1", "0.1.0", node, "simulated", labels, (gpu,), 0)


def _xid79(node: str, at_ns: int) -> repo.StoredEvent:
    return repo.StoredEvent(
        node_id=node, seq=1, observed_unix_ns=at_ns - 10**6, received_unix_ns=at_ns,
        kind=int(health.EventKind.XID), severity=int(health.Severity.ERROR), gpu_uuid=f"GPU-{node}", xid=79,
        message="NVRM: Xid (PCI:0000:18:00): 79", source="kmsg", attributes={},
    )  # fmt: skip


def _run_two_reboots(tmp_path, api, *, node_sync: bool) -> dict[str, str]:
    """Xid 79 on nodes a and b (one NVLink clique by their Node labels, not agent.toml): their quarantines' status."""
    tmp_path.mkdir()
    store = repo.Store.open(f"sqlite:///{tmp_path / 'rasd.db'}")
    adapter = _adapter(api)
    pol = policy_mod.RemediationPolicy.from_mapping(
        {
            "disruption": {
                "domain_max_nodes": {"nvlink_domain": 1},
                "max_disrupted_nodes": 10,
                "max_disrupted_nodes_pct": 100.0,
                "breaker_quarantine_pct": 100.0,
            }
        }
    )
    ladder = wiring.Ladder(
        policy=pol,
        executors=quarantine.executors(adapter),
        node_sync=adapter.sync_nodes if node_sync else None,
        node_sync_s=60.0,
    )
    wired = wiring.single_replica(
        store, metrics.ControllerMetrics(CollectorRegistry()), ladder=ladder, clock=lambda: T0_NS
    )
    for name, agent_labels in (("a", {"rack": "r1"}), ("b", {"rack": "r2"}), ("c", {})):
        store.register_hello(_hello(name, agent_labels), T0_NS)
    status: dict[str, str] = {}

    async def scenario() -> None:
        service = wired.remediation
        await service.start()  # as the leader's term starts it: the first node sync runs at once
        deadline = time.monotonic() + 5
        while node_sync and not service.state.topology:
            assert time.monotonic() < deadline, "the first node sync never came"
            await asyncio.sleep(0.01)
        for name in ("a", "b"):
            await service.on_events(name, [_xid79(name, T0_NS)], dict(service.state.streams.node_labels.get(name, {})))
        await asyncio.sleep(0.3)
        for name in ("a", "b"):
            [command] = [c for c in service.store.commands(node_id=name) if c.kind == "quarantine_node"]
            status[name] = command.status

    async def whole() -> None:
        await wired.ingest.start()
        try:
            await scenario()
        finally:
            await wired.stop()

    try:
        asyncio.run(whole())
    finally:
        adapter.close()
        store.close()
    return status


def test_the_nvlink_clique_from_node_labels_bounds_the_reboots_the_agents_labels_did_not(tmp_path, api):
    with_labels = _run_two_reboots(tmp_path / "k8s", api, node_sync=True)
    assert sorted(with_labels.values()) == ["pending", "succeeded"], "one node of the clique at a time"

    without = _run_two_reboots(tmp_path / "agent-only", api, node_sync=False)
    assert without == {"a": "succeeded", "b": "succeeded"}, "agent.toml named no NVLink domain"


def test_a_failed_sync_keeps_the_last_topology_and_agent_labels_fill_what_node_labels_lack(api):
    streams = streams_mod.AgentStreams(clock=lambda: T0_NS)
    streams.remember_remote_node("a", {"rack": "agent-rack", "power_feed": "pdu-1"}, ("GPU-a",))
    state = state_mod.LadderState(
        policy=policy_mod.RemediationPolicy(), clock=lambda: T0_NS, streams=streams,
        metrics=metrics.ControllerMetrics(CollectorRegistry()),
    )  # fmt: skip
    adapter = _adapter(api)
    sync = node_sync.NodeSync.configured(state, adapter.sync_nodes, period_s=60)

    async def rounds() -> list[bool]:
        first = await sync.sync_once()
        api.unavailable = True
        second = await sync.sync_once()
        return [first, second]

    try:
        assert asyncio.run(rounds()) == [True, False]
    finally:
        adapter.close()

    assert state.fleet_view().node_labels["a"] == {
        "rack": "agent-rack", "power_feed": "pdu-1", "zone": "z1", "nvlink_domain": "nvl-1",
    }, "the API server's outage kept the topology; agent.toml's labels fill what the Node does not say"  # fmt: skip
    assert node_sync.NodeSync.configured(state, adapter.sync_nodes, period_s=0) is None
