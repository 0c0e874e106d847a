"""Draining before a repair (issue #38 item 1): the Eviction API, PodDisruptionBudgets honoured, nobody
else's cordon or taint touched; the real ``kubernetes`` client against the fake API server."""

from __future__ import annotations

import pathlib
import sys

import kubernetes.client
import pytest

from rasd.controller.executors import quarantine
from rasd.controller.executors.quarantine import k8s_drain

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "fakes"))
import kube_api

PDB_MESSAGE = "The disruption budget trainer-pdb needs 2 healthy pods and has 2 currently"


@pytest.fixture
def api():
    fake = kube_api.FakeKubeApi()
    fake.start()
    fake.add_node("n1", gpus=8)
    fake.add_node("n2", gpus=8)
    yield fake
    fake.stop()


@pytest.fixture
def k8s(api):
    client = kubernetes.client.ApiClient(kubernetes.client.Configuration(host=api.url))
    settings = quarantine.KubernetesSettings(request_timeout_s=5, drain_backoff_s=0.01, drain_backoff_max_s=0.05)
    adapter = quarantine.KubernetesQuarantine(client, settings)
    yield adapter
    adapter.close()


def _mixed_pods(api):
    api.add_pod("ml", "trainer-0", node="n1", gpus=8, labels={"app": "trainer"})
    api.add_pod("ml", "notebook", node="n1", gpus=1)
    api.add_pod("web", "frontend", node="n1")
    api.add_pod("kube-system", "dcgm-exporter-x", node="n1", gpus=0, owner_kind="DaemonSet")
    api.add_pod("gpu-operator", "device-plugin-x", node="n1", gpus=1, owner_kind="DaemonSet")
    api.add_pod("ml", "elsewhere", node="n2", gpus=8)


def test_gpu_policy_evicts_only_the_nodes_gpu_pods_through_the_eviction_api(api, k8s):
    _mixed_pods(api)

    report = k8s.drain_node("n1", reason="before reset_gpu", ticket_id="t1", pods="gpu", deadline_s=5)

    assert api.evicted == ["ml/notebook", "ml/trainer-0"]
    assert report.evicted == ("ml/notebook", "ml/trainer-0") and report.refusals == 0
    assert api.pods_on("n1") == ["gpu-operator/device-plugin-x", "kube-system/dcgm-exporter-x", "web/frontend"]
    [body, *_] = [b for m, p, _c, b in api.requests if m == "POST" and p.endswith("/eviction")]
    assert (body["apiVersion"], body["kind"]) == ("policy/v1", "Eviction")
    assert body["deleteOptions"]["preconditions"]["uid"].startswith("uid-ml-")
    assert "evicted 2 pod(s)" in str(report)


def test_all_policy_evicts_every_pod_but_daemonsets(api, k8s):
    _mixed_pods(api)

    k8s.drain_node("n1", reason="before reboot_node", ticket_id="t1", pods="all", deadline_s=5)

    assert api.pods_on("n1") == ["gpu-operator/device-plugin-x", "kube-system/dcgm-exporter-x"]
    assert api.pods_on("n2") == ["ml/elsewhere"]


def test_a_pdb_refusal_is_retried_until_a_replacement_is_healthy(api, k8s):
    api.add_pod("ml", "trainer-0", node="n1", gpus=8, labels={"app": "trainer"})
    api.add_pod("ml", "trainer-1", node="n2", gpus=8, labels={"app": "trainer"})
    api.add_pdb("ml", "trainer-pdb", match_labels={"app": "trainer"}, min_available=2)

    def reschedule(refusals: int) -> None:
        if refusals == 3:  # the workload's controller brings a third replica up elsewhere
            api.pods[("ml", "trainer-2")] = {
                **api.pods[("ml", "trainer-1")], "metadata": {"name": "trainer-2", "namespace": "ml",
                                                              "labels": {"app": "trainer"}},
            }  # fmt: skip

    api.on_refusal = reschedule

    report = k8s.drain_node("n1", reason="before reboot_node", ticket_id="t1", pods="gpu", deadline_s=10)

    assert api.refused == ["ml/trainer-0"] * 3
    assert api.evicted == ["ml/trainer-0"] and report.refusals == 3
    assert [e["reason"] for e in api.events] == ["RasdDrained"]


def test_a_blocking_pdb_stops_the_drain_at_its_deadline_and_says_why(api, k8s):
    api.add_pod("ml", "trainer-0", node="n1", gpus=8, labels={"app": "trainer"})
    api.add_pod("ml", "trainer-1", node="n2", gpus=8, labels={"app": "trainer"})
    api.add_pdb("ml", "trainer-pdb", match_labels={"app": "trainer"}, max_unavailable=0)
    before = api.node("n1")

    with pytest.raises(quarantine.DrainBlockedError) as blocked:
        # 2 s, not less: on two loaded CI cores one round of patch, list and evict over HTTP has taken 0.3 s
        k8s.drain_node("n1", reason="before reboot_node", ticket_id="t1", pods="gpu", deadline_s=2)

    assert "ml/trainer-0" in str(blocked.value)
    assert "The disruption budget trainer-pdb needs 2 healthy pods and has 2 currently" in str(blocked.value)
    assert api.pods_on("n1") == ["ml/trainer-0"], "the PDB is respected"
    assert len(api.refused) >= 2, "429 is retried"
    after = api.node("n1")
    assert after["spec"] == before["spec"], "a drain never touches cordons or taints"
    [event] = api.events
    assert (event["reason"], event["type"]) == ("RasdDrainBlocked", "Warning")


def test_someone_elses_cordon_and_taint_survive_quarantine_drain_and_release(api, k8s):
    theirs = {"key": "maintenance", "value": "fw", "effect": "NoSchedule"}
    api.add_node("n3", unschedulable=True, taints=[theirs])
    api.add_pod("ml", "job", node="n3", gpus=1)

    k8s.quarantine_node("n3", reason="Xid 79", ticket_id="t1")
    k8s.drain_node("n3", reason="before reboot_node", ticket_id="t1", pods="gpu", deadline_s=5)
    k8s.release_node("n3", reason="validation passed", ticket_id="t1")

    node = api.node("n3")
    assert node["spec"]["unschedulable"] is True and node["spec"]["taints"] == [theirs]
    assert api.evicted == ["ml/job"]


def test_a_drain_of_an_unknown_node_evicts_nothing(api, k8s):
    report = k8s.drain_node("gone", reason="r", ticket_id="t1", pods="gpu", deadline_s=1)

    assert report.evicted == () and api.evicted == []


# ---- the loop itself, over edges the test gives ---------------------------------------------


def _pod(name: str, *, gpus: int = 1, terminating: bool = False) -> dict:
    meta = {"name": name, "namespace": "ml"}
    if terminating:
        meta["deletionTimestamp"] = "2026-12-05T08:00:00Z"
    return {
        "metadata": meta,
        "spec": {"containers": [{"resources": {"requests": {"nvidia.com/gpu": str(gpus)}}}]},
        "status": {"phase": "Running"},
    }


def test_the_backoff_doubles_up_to_its_cap_and_terminating_pods_are_not_evicted_twice():
    now = [0.0]
    sleeps: list[float] = []
    evictions: list[str] = []
    rounds = iter([[_pod("a")], [_pod("a", terminating=True)], [_pod("a", terminating=True)], []])

    def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        now[0] += seconds

    def evict(pod):
        evictions.append(pod["metadata"]["name"])
        return k8s_drain.Eviction.ACCEPTED, ""

    edges = k8s_drain.DrainEdges(lambda _node: next(rounds), evict, lambda: now[0], sleep)
    report = k8s_drain.drain(
        "n1", scope="gpu", gpu_resource="nvidia.com/gpu", deadline_s=60, backoff_s=1, backoff_max_s=3, edges=edges
    )

    assert evictions == ["a"], "a pod already terminating is waited for"
    assert sleeps == [1, 2, 3]
    assert report.evicted == ("ml/a",) and report.waited_s == 6


def test_finished_and_mirror_pods_are_left_alone():
    done = _pod("done")
    done["status"]["phase"] = "Succeeded"
    mirror = _pod("static")
    mirror["metadata"]["annotations"] = {k8s_drain.MIRROR_ANNOTATION: "x"}
    cpu = _pod("cpu", gpus=0)

    chosen = k8s_drain.pods_to_evict([done, mirror, cpu, _pod("b")], scope="all", gpu_resource="nvidia.com/gpu")

    assert [p["metadata"]["name"] for p in chosen] == ["b", "cpu"]
