"""Node state operators can select (issue #38 item 2): the ``rasd.io/state`` label, the ``RasdHealthy``
condition always present (NPD style), an Event on each transition; the real ``kubernetes`` client against
the fake API server (tests/fakes/kube_api.py)."""

from __future__ import annotations

import datetime as dt
import pathlib
import sys

import kubernetes.client
import pytest

from rasd.controller.core.remediation import actions
from rasd.controller.executors import quarantine

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "fakes"))
import kube_api

T0 = dt.datetime(2026, 12, 5, 8, 0, tzinfo=dt.UTC)


class _Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> dt.datetime:
        return self.now


@pytest.fixture
def api():
    fake = kube_api.FakeKubeApi()
    fake.start()
    for name in ("n1", "n2", "n3", "n4"):
        fake.add_node(name, gpus=4)
    yield fake
    fake.stop()


@pytest.fixture
def clock():
    return _Clock()


@pytest.fixture
def k8s(api, clock):
    client = kubernetes.client.ApiClient(kubernetes.client.Configuration(host=api.url))
    adapter = quarantine.KubernetesQuarantine(
        client, quarantine.KubernetesSettings(request_timeout_s=5, drain_backoff_s=0.01), clock=clock
    )
    yield adapter
    adapter.close()


def _condition(node):
    return next((c for c in node["status"].get("conditions") or [] if c["type"] == "RasdHealthy"), None)


def _state(node):
    return node["metadata"].get("labels", {}).get("rasd.io/state")


def _selected(api, selector: str) -> list[str]:
    """What ``kubectl get nodes -l <selector>`` lists, through the real client."""
    client = kubernetes.client.CoreV1Api(kubernetes.client.ApiClient(kubernetes.client.Configuration(host=api.url)))
    return sorted(n.metadata.name for n in client.list_node(label_selector=selector).items)


def test_label_selector_selects_exactly_the_quarantined_nodes(api, k8s):
    k8s.quarantine_node("n1", reason="Xid 79", ticket_id="t1")
    k8s.quarantine_node("n3", reason="Xid 48", ticket_id="t3")
    k8s.quarantine_node("n2", reason="Xid 79", ticket_id="t2")
    k8s.release_node("n2", reason="validation passed", ticket_id="t2")
    k8s.quarantine_gpu("n4", "GPU-a", reason="Xid 94", ticket_id="t4")  # a GPU: the node stays schedulable

    assert _selected(api, "rasd.io/state=quarantined") == ["n1", "n3"]
    assert _selected(api, "rasd.io/state=healthy") == ["n2"]
    assert _selected(api, "rasd.io/state!=quarantined") == ["n2", "n4"]


def test_condition_is_false_while_held_and_true_after_release_never_deleted(api, k8s, clock):
    k8s.quarantine_node("n1", reason="Xid 79: fell off the bus", ticket_id="t1")
    held = _condition(api.node("n1"))
    clock.now = T0 + dt.timedelta(minutes=5)

    k8s.release_node("n1", reason="validation passed", ticket_id="t1")

    released = _condition(api.node("n1"))
    assert (held["status"], held["reason"]) == ("False", "RasdQuarantined")
    assert "Xid 79" in held["message"] and held["lastHeartbeatTime"] == "2026-12-05T08:00:00Z"
    assert (released["status"], released["reason"]) == ("True", "RasdReleased")
    assert released["message"] == "released: validation passed"
    assert released["lastTransitionTime"] == released["lastHeartbeatTime"] == "2026-12-05T08:05:00Z"


def test_heartbeat_makes_the_condition_present_everywhere_and_refreshes_it(api, k8s, clock):
    k8s.quarantine_node("n1", reason="Xid 79", ticket_id="t1")
    clock.now = T0 + dt.timedelta(minutes=1)

    written = k8s.heartbeat(["n1", "n2", "gone"])

    n1, n2 = _condition(api.node("n1")), _condition(api.node("n2"))
    assert written == 2, "a node the API server does not know is skipped"
    assert (n2["status"], n2["reason"]) == ("True", "RasdNoFault"), "present on a node rasd never held"
    assert n1["status"] == "False" and n1["reason"] == "RasdQuarantined", "a heartbeat never flips the status"
    assert n1["lastHeartbeatTime"] == "2026-12-05T08:01:00Z"
    assert n1["lastTransitionTime"] == "2026-12-05T08:00:00Z", "the transition stays when the status does"
    assert _condition(api.node("n3")) is None, "only the nodes named"


def test_every_transition_posts_an_event_and_sets_the_label(api, k8s):
    api.add_pod("ml", "trainer-0", node="n1", gpus=4)
    seen = []

    k8s.quarantine_node("n1", reason="Xid 79", ticket_id="t1")
    seen.append(_state(api.node("n1")))
    k8s.drain_node("n1", reason="before reboot_node", ticket_id="t1", pods="gpu", deadline_s=5)
    seen.append(_state(api.node("n1")))
    k8s.mark_rma("n1", reason="reboot budget spent", ticket_id="t1")
    seen.append(_state(api.node("n1")))
    k8s.release_node("n1", reason="part replaced, validation passed", ticket_id="t1")
    seen.append(_state(api.node("n1")))

    assert seen == ["quarantined", "repairing", "rma", "healthy"]
    assert api.evicted == ["ml/trainer-0"]
    assert [e["reason"] for e in api.events] == [
        "RasdQuarantined", "RasdRepairing", "RasdDrained", "RasdRma", "RasdReleased",
    ]  # fmt: skip
    assert all(
        e["involvedObject"] == {"apiVersion": "v1", "kind": "Node", "name": "n1", "uid": e["involvedObject"]["uid"]}
        for e in api.events
    )
    assert _condition(api.node("n1"))["status"] == "True"


def test_repeats_change_nothing_and_post_nothing(api, k8s):
    k8s.quarantine_node("n1", reason="r", ticket_id="t1")
    k8s.mark_rma("n1", reason="r", ticket_id="t1")
    events, patches = len(api.events), api.count("PATCH")

    again = k8s.mark_rma("n1", reason="r", ticket_id="t1")
    requarantined = k8s.quarantine_node("n1", reason="r", ticket_id="t2")

    assert again.status is quarantine.Status.ALREADY_QUARANTINED
    assert requarantined.status is quarantine.Status.ALREADY_QUARANTINED
    assert _state(api.node("n1")) == "rma", "a later quarantine does not hide an open RMA"
    assert (len(api.events), api.count("PATCH")) == (events, patches)


def test_a_drain_on_a_node_rasd_does_not_hold_leaves_its_label(api, k8s):
    k8s.quarantine_gpu("n1", "GPU-a", reason="Xid 94", ticket_id="t1")  # a reset: the node stays schedulable

    k8s.drain_node("n1", reason="before reset_gpu", ticket_id="t1", pods="gpu", deadline_s=5)

    assert _state(api.node("n1")) is None
    assert [e["reason"] for e in api.events] == ["RasdGpuQuarantined", "RasdDrained"]


def test_executors_mark_rma_for_a_node_and_leave_the_label_for_a_gpu(api, k8s):
    run = quarantine.executors(k8s)
    common = {"ticket_id": "t1", "step": 0, "node_id": "n1", "reason": "r"}
    k8s.quarantine_node("n1", reason="r", ticket_id="t1")

    gpu = run["open_rma"](actions.OpenRma(gpu_uuid="GPU-a", **common))
    assert _state(api.node("n1")) == "quarantined" and "leaves" in str(gpu)
    run["open_rma"](actions.OpenRma(**common))
    assert _state(api.node("n1")) == "rma"
    assert "drain_node" in run and "open_rma" not in quarantine.executors(quarantine.RecordOnlyQuarantine())
