"""The ladder drains through the Kubernetes API before a repair (issue #38 item 1, its "done when"):
quarantine → drain → reset → validate → release, the real adapter and ``kubernetes`` client against the
fake API server (tests/fakes/kube_api.py) with a PodDisruptionBudget that blocks the eviction."""

from __future__ import annotations

import asyncio
import pathlib
import sys
import threading
import time

import kubernetes.client
import pytest
from prometheus_client import CollectorRegistry

from rasd.controller import wiring
from rasd.controller.core import agent_messages as msgs
from rasd.controller.core import fleet
from rasd.controller.core.remediation import events as health
from rasd.controller.core.remediation import policy as policy_mod
from rasd.controller.executors import quarantine
from rasd.controller.observability import metrics
from rasd.controller.store import repo

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "fakes"))
import kube_api

T0_NS = 1_800_000_000 * 10**9
NODE = "gpu-node-1"
GPU = "GPU-00000000-0000-4000-8000-000000000001"


def _hello() -> fleet.NodeHello:
    gpu = fleet.GpuRecord(GPU, "H100", "0000:18:00.0", 200, 700, 700, node_id=NODE)
    return fleet.NodeHello(NODE, "boot-1", "0.1.0", NODE, "simulated", {}, (gpu,), 0)


def _xid(seq: int, xid: int, at_ns: int) -> repo.StoredEvent:
    return repo.StoredEvent(
        node_id=NODE, seq=seq, observed_unix_ns=at_ns - 10**6, received_unix_ns=at_ns,
        kind=int(health.EventKind.XID), severity=int(health.Severity.ERROR), gpu_uuid=GPU, xid=xid,
        message=f"NVRM: Xid (PCI:0000:18:00): {xid}", source="kmsg", attributes={},
    )  # fmt: skip


@pytest.fixture
def api():
    fake = kube_api.FakeKubeApi()
    fake.start()
    fake.add_node(NODE, gpus=1)
    fake.add_node("gpu-node-2", gpus=1)
    # A two-replica trainer, one replica on the faulty node, and a budget that wants both up.
    fake.add_pod("ml", "trainer-0", node=NODE, gpus=1, labels={"app": "trainer"})
    fake.add_pod("ml", "trainer-1", node="gpu-node-2", gpus=1, labels={"app": "trainer"})
    fake.add_pdb("ml", "trainer-pdb", match_labels={"app": "trainer"}, min_available=2)
    fake.add_pod("kube-system", "dcgm-exporter-a", node=NODE, owner_kind="DaemonSet")
    yield fake
    fake.stop()


class _Rig:
    def __init__(self, url: str, api: kube_api.FakeKubeApi, *, own_process: bool = False, **escalation: object) -> None:
        self.now_ns = T0_NS
        self.store = repo.Store.open(url)
        settings = quarantine.KubernetesSettings(
            host=api.url, request_timeout_s=5, drain_backoff_s=0.02, drain_backoff_max_s=0.1
        )
        if own_process:  # rasd-controller's default: the client in a child, awaited on the loop
            self.adapter = quarantine.KubernetesProcess(settings)
        else:
            client = kubernetes.client.ApiClient(kubernetes.client.Configuration(host=api.url))
            self.adapter = quarantine.KubernetesQuarantine(client, settings)
        pol = policy_mod.RemediationPolicy.from_mapping(
            {"escalation": {"drain_before": ["reset_gpu", "reboot_node"], **escalation}}
        )
        ladder = wiring.Ladder(policy=pol, executors=quarantine.executors(self.adapter))
        self.wired = wiring.single_replica(
            self.store, metrics.ControllerMetrics(CollectorRegistry()), ladder=ladder, clock=lambda: self.now_ns
        )
        self.service = self.wired.remediation
        self.store.register_hello(_hello(), T0_NS)

    def run(self, scenario) -> None:
        async def whole() -> None:
            await self.wired.ingest.start()
            try:
                await scenario()
            finally:
                await self.wired.stop()

        try:
            asyncio.run(whole())
        finally:
            self.adapter.close()
            self.store.close()

    def commands(self, kind: str) -> list:
        return [c for c in self.service.store.commands(node_id=NODE, limit=1000) if c.kind == kind]

    async def settled(self, kind: str, timeout_s: float = 10.0):
        """The newest command of kind, once its outcome is committed."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            mine = self.commands(kind)
            if mine and mine[-1].status not in ("pending", "dispatched"):
                return mine[-1]
            await asyncio.sleep(0.01)
        raise AssertionError(f"{kind}: no outcome within {timeout_s} s: {self.commands(kind)}")

    async def answer(self, kind: str, outcome=msgs.Outcome.SUCCEEDED, verdict: str = "") -> None:
        """The agent answers the dispatched command of kind."""
        deadline = time.monotonic() + 10
        while not [c for c in self.commands(kind) if c.status == "dispatched"]:
            assert time.monotonic() < deadline, f"{kind} never dispatched: {self.commands(kind)}"
            await asyncio.sleep(0.01)
        command = [c for c in self.commands(kind) if c.status == "dispatched"][-1]
        self.now_ns += 10**9
        result = msgs.AgentResult(command_id=command.command_id, outcome=outcome, validation_verdict=verdict)
        await self.service.on_result(NODE, result)


def _state(api) -> str:
    return api.node(NODE)["metadata"]["labels"].get("rasd.io/state", "")


@pytest.mark.parametrize("own_process", [False, True], ids=["in-process", "own-process"])
def test_quarantine_drain_reset_validate_release_with_a_blocking_pdb(tmp_path, api, own_process):
    """The PDB refuses until the trainer's replacement is up elsewhere; only then is the pod evicted, the GPU reset."""
    rig = _Rig(f"sqlite:///{tmp_path / 'rasd.db'}", api, own_process=own_process, drain_deadline_s=20.0)
    healthy_at_eviction: list[int] = []

    def replacement_comes_up(refusals: int) -> None:
        if refusals == 3:  # the trainer's ReplicaSet schedules a third replica on another node
            api.pods[("ml", "trainer-2")] = {**api.pods[("ml", "trainer-1")], "metadata": {
                "name": "trainer-2", "namespace": "ml", "labels": {"app": "trainer"}}}  # fmt: skip

    api.on_refusal = replacement_comes_up
    seen_states: list[str] = []

    async def scenario() -> None:
        await rig.service.on_events(NODE, [_xid(1, 48, rig.now_ns)], {})  # DBE: quarantine the GPU, reset it
        drain = await rig.settled("drain_node")
        assert drain.status == "succeeded", drain.result
        healthy_at_eviction.append(sum(1 for p in api.pods.values() if p["metadata"]["labels"].get("app") == "trainer"))
        assert "after 3 PDB refusal(s)" in drain.result["message"]
        await rig.answer("reset_gpu")
        seen_states.append(_state(api))
        await rig.answer("run_validation", verdict="pass")
        release = await rig.settled("release")
        assert release.status == "succeeded", release.result
        adapter_threads.extend(
            t.name for t in threading.enumerate() if t.name.startswith("rasd-adapter") and t not in threads_before
        )

    threads_before = set(threading.enumerate())  # an earlier test's service may have left its idle threads
    adapter_threads: list[str] = []
    rig.run(scenario)

    # In its own process the adapter is awaited on the loop (`call_async`): no thread here waits on it.
    assert bool(adapter_threads) is not own_process, adapter_threads

    order = [
        c.kind for c in sorted(rig.service.store.commands(node_id=NODE, limit=1000), key=lambda c: c.payload["step"])
    ]
    assert order[:3] == ["quarantine_gpu", "drain_node", "reset_gpu"], order
    assert order[-2:] == ["run_validation", "release"], order
    assert api.refused == ["ml/trainer-0"] * 3, "the PDB's 429s were retried, not overridden"
    assert api.evicted == ["ml/trainer-0"] and healthy_at_eviction == [2], "evicted only once two others were up"
    assert api.pods_on(NODE) == ["kube-system/dcgm-exporter-a"], "the DaemonSet's pod stays"
    node = api.node(NODE)
    assert not node["spec"].get("unschedulable"), "a GPU reset never cordons the node"
    assert node["metadata"]["annotations"].get("rasd.io/quarantined-gpus") is None, "released"
    assert [e["reason"] for e in api.events] == ["RasdGpuQuarantined", "RasdDrained", "RasdGpuReleased"]
    assert _state(api) == "", "a GPU's repair leaves the node's label alone"


def test_a_pdb_that_never_yields_holds_the_reboot_and_asks_an_operator(tmp_path, api):
    rig = _Rig(f"sqlite:///{tmp_path / 'rasd.db'}", api, drain_deadline_s=0.5)

    async def scenario() -> None:
        await rig.service.on_events(NODE, [_xid(1, 79, rig.now_ns)], {})  # fell off the bus: reboot
        drain = await rig.settled("drain_node")
        assert drain.status == "failed"
        assert "The disruption budget trainer-pdb needs 2 healthy pods and has 2 currently" in drain.result["message"]
        notice = await rig.settled("notify")
        assert notice.status == "succeeded" and "an operator decides" in notice.payload["summary"]
        assert "trainer-pdb needs 2 healthy pods" in notice.payload["summary"]
        [ticket] = rig.service.state.node_states[NODE].tickets
        tickets.append(ticket)

    tickets: list = []
    rig.run(scenario)

    kinds = [c.kind for c in rig.service.store.commands(node_id=NODE, limit=1000)]
    assert "reboot_node" not in kinds, "no reboot while the budget refuses"
    assert tickets[0].state.value == "awaiting_operator" and tickets[0].held == ("node",)
    assert "trainer-pdb" in tickets[0].reason
    assert api.pods_on(NODE) == ["kube-system/dcgm-exporter-a", "ml/trainer-0"], "the PDB is respected"
    assert len(api.refused) >= 2
    node = api.node(NODE)
    assert node["spec"]["unschedulable"] is True and _state(api) == "repairing", "the node stays out of service"
    assert [e["reason"] for e in api.events] == ["RasdQuarantined", "RasdRepairing", "RasdDrainBlocked"]


def test_an_operators_quarantine_and_release_go_through_the_adapters_child_on_the_loop(tmp_path, api):
    rig = _Rig(f"sqlite:///{tmp_path / 'rasd.db'}", api, own_process=True)
    seen: dict[str, object] = {}

    async def scenario() -> None:
        threads_before = set(threading.enumerate())
        await rig.service.operator_quarantine(NODE, "", reason="bad optics", actor="alice")
        seen["cordoned"] = api.node(NODE)["spec"].get("unschedulable")
        seen["said"] = await rig.service.operator_release(NODE, "", reason="optics replaced", force=True, actor="alice")
        seen["threads"] = [
            t.name for t in threading.enumerate() if t.name.startswith("rasd-adapter") and t not in threads_before
        ]

    rig.run(scenario)

    assert seen["cordoned"] is True
    assert seen["said"] == "released by force, without validation"
    assert not api.node(NODE)["spec"].get("unschedulable"), "the release reached the API server"
    assert seen["threads"] == [], "awaited on the loop: no adapter thread"
