"""Quarantine adapters against their real edges: the real ``kubernetes`` client talking HTTP to a fake
API server on 127.0.0.1, and `SlurmQuarantine` running a fake ``scontrol`` found on PATH."""

from __future__ import annotations

import json
import os
import pathlib
import socket
import stat
import sys
import textwrap

import kubernetes.client
import pytest

from rasd.controller.core.remediation import actions
from rasd.controller.executors import quarantine

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "fakes"))
import kube_api

TICKET = "n1/GPU-1/xid:79/3"


@pytest.fixture
def api():
    fake = kube_api.FakeKubeApi()
    fake.start()
    fake.add_node("n1", gpus=4)
    yield fake
    fake.stop()


@pytest.fixture
def k8s(api):
    configuration = kubernetes.client.Configuration(host=api.url)
    adapter = quarantine.KubernetesQuarantine(
        kubernetes.client.ApiClient(configuration), quarantine.KubernetesSettings(request_timeout_s=5)
    )
    yield adapter
    adapter.close()


def _taints(node):
    return {(t["key"], t.get("value", ""), t["effect"]) for t in node["spec"].get("taints") or []}


def _condition(node, kind):
    return next((c for c in node["status"].get("conditions") or [] if c["type"] == kind), None)


# ---- Kubernetes: node ---------------------------------------------------------------------


def test_node_quarantine_cordons_taints_sets_condition_and_annotates(api, k8s):
    outcome = k8s.quarantine_node("n1", reason="Xid 79: fell off the bus", ticket_id=TICKET)

    assert outcome.status is quarantine.Status.QUARANTINED and outcome.changed
    node = api.node("n1")
    assert node["spec"]["unschedulable"] is True
    assert _taints(node) == {("rasd.io/quarantined", "n1-GPU-1-xid-79-3", "NoSchedule")}
    annotations = node["metadata"]["annotations"]
    assert annotations["rasd.io/quarantined"] == TICKET
    assert annotations["rasd.io/cordoned-by-rasd"] == TICKET
    condition = _condition(node, "RasdHealthy")
    assert condition["status"] == "False" and condition["reason"] == "RasdQuarantined"
    assert "Xid 79" in condition["message"]
    assert _condition(node, "Ready")["status"] == "True", "other conditions are untouched"
    # Right patch types: strategic merge on the node, and the status subresource for the condition.
    patches = [(path, ctype) for method, path, ctype, _ in api.requests if method == "PATCH"]
    assert patches == [
        ("/api/v1/nodes/n1", kube_api.STRATEGIC),
        ("/api/v1/nodes/n1/status", kube_api.STRATEGIC),
    ]
    assert outcome.event_posted is True
    assert [c for m, p, c, _ in api.requests if m == "POST"] == ["application/json"]
    [event] = api.events
    assert event["involvedObject"]["name"] == "n1" and event["reason"] == "RasdQuarantined"
    assert event["type"] == "Warning"


def test_node_quarantine_twice_is_a_noop_that_says_so(api, k8s):
    k8s.quarantine_node("n1", reason="r", ticket_id=TICKET)
    patches_before = api.count("PATCH")

    again = k8s.quarantine_node("n1", reason="r", ticket_id="another-ticket")

    assert again.status is quarantine.Status.ALREADY_QUARANTINED and not again.changed
    assert TICKET in again.detail
    assert api.count("PATCH") == patches_before
    assert len(api.events) == 1, "a repeat posts no Event"


def test_release_lifts_rasds_own_cordon_taint_condition_and_annotations(api, k8s):
    k8s.quarantine_node("n1", reason="r", ticket_id=TICKET)

    outcome = k8s.release_node("n1", reason="validation passed", ticket_id=TICKET)

    assert outcome.status is quarantine.Status.RELEASED and outcome.kept == ()
    node = api.node("n1")
    assert not node["spec"].get("unschedulable")
    assert _taints(node) == set()
    assert not node["metadata"].get("annotations")
    assert node["metadata"]["labels"]["rasd.io/state"] == "healthy"
    condition = _condition(node, "RasdHealthy")
    assert (condition["status"], condition["reason"]) == ("True", "RasdReleased"), "never deleted (NPD style)"
    assert "validation passed" in condition["message"]
    assert condition["lastHeartbeatTime"] and condition["lastTransitionTime"]
    assert _condition(node, "Ready") is not None
    assert [e["reason"] for e in api.events] == ["RasdQuarantined", "RasdReleased"]


def test_someone_elses_cordon_survives_release(api, k8s):
    api.add_node("n2", unschedulable=True)  # an operator cordoned it for maintenance

    first = k8s.quarantine_node("n2", reason="r", ticket_id=TICKET)
    released = k8s.release_node("n2", reason="validation passed", ticket_id=TICKET)

    assert first.kept == ("cordon set by someone else",)
    assert "rasd.io/cordoned-by-rasd" not in api.node("n2")["metadata"]["annotations"]
    node = api.node("n2")
    assert node["spec"]["unschedulable"] is True, "rasd never lifts a cordon it did not set"
    assert _taints(node) == set() and _condition(node, "RasdHealthy")["status"] == "True"
    assert released.status is quarantine.Status.RELEASED
    assert released.kept == ("cordon set by someone else",)


def test_release_keeps_other_taints(api, k8s):
    foreign = {"key": "example.com/maintenance", "value": "disk", "effect": "NoExecute"}
    api.add_node("n2", taints=[foreign])

    k8s.quarantine_node("n2", reason="r", ticket_id=TICKET)
    k8s.release_node("n2", reason="ok", ticket_id=TICKET)

    assert _taints(api.node("n2")) == {("example.com/maintenance", "disk", "NoExecute")}


def test_release_of_a_node_rasd_never_quarantined_is_a_noop(api, k8s):
    api.add_node("n2", unschedulable=True)

    outcome = k8s.release_node("n2", reason="ok", ticket_id=TICKET)

    assert outcome.status is quarantine.Status.NOT_QUARANTINED
    assert outcome.kept == ("cordon set by someone else",)
    assert api.count("PATCH") == 0 and api.node("n2")["spec"]["unschedulable"] is True


def test_long_ticket_ids_become_valid_taint_values(api, k8s):
    ticket = "node-with-a-long-name-0001/GPU-8f4e2c1a-0b9d-4e57-a3c2-1f0e9d8c7b6a/xid:79/12"

    outcome = k8s.quarantine_node("n1", reason="r", ticket_id=ticket)

    assert outcome.status is quarantine.Status.QUARANTINED  # the fake answers 422 to a bad label value
    [(_, value, _)] = _taints(api.node("n1"))
    assert len(value) <= 63
    assert api.node("n1")["metadata"]["annotations"]["rasd.io/quarantined"] == ticket


# ---- Kubernetes: GPU and port -------------------------------------------------------------


def test_gpu_quarantine_keeps_the_node_schedulable_and_lists_uuids_sorted(api, k8s):
    k8s.quarantine_gpu("n1", "GPU-b", reason="row remap pending", ticket_id="t1")
    outcome = k8s.quarantine_gpu("n1", "GPU-a", reason="dbe", ticket_id="t2")

    node = api.node("n1")
    assert outcome.status is quarantine.Status.QUARANTINED
    assert node["metadata"]["annotations"]["rasd.io/quarantined-gpus"] == "GPU-a,GPU-b"
    assert not node["spec"].get("unschedulable") and _taints(node) == set()
    assert "2 of 4" in outcome.detail
    assert [e["reason"] for e in api.events] == ["RasdGpuQuarantined", "RasdGpuQuarantined"]


def test_gpu_quarantine_repeat_and_release(api, k8s):
    k8s.quarantine_gpu("n1", "GPU-a", reason="r", ticket_id="t1")
    k8s.quarantine_gpu("n1", "GPU-b", reason="r", ticket_id="t1")

    repeat = k8s.quarantine_gpu("n1", "GPU-a", reason="r", ticket_id="t1")
    released = k8s.release_gpu("n1", "GPU-a", reason="validated", ticket_id="t1")
    stray = k8s.release_gpu("n1", "GPU-a", reason="validated", ticket_id="t1")
    k8s.release_gpu("n1", "GPU-b", reason="validated", ticket_id="t1")

    assert repeat.status is quarantine.Status.ALREADY_QUARANTINED
    assert released.status is quarantine.Status.RELEASED
    assert stray.status is quarantine.Status.NOT_QUARANTINED
    assert "rasd.io/quarantined-gpus" not in (api.node("n1")["metadata"].get("annotations") or {})


def test_all_gpus_quarantined_taints_the_node_until_one_is_released(api, k8s):
    for i in range(3):
        k8s.quarantine_gpu("n1", f"GPU-{i}", reason="r", ticket_id="t")
    assert _taints(api.node("n1")) == set()

    last = k8s.quarantine_gpu("n1", "GPU-3", reason="r", ticket_id="t")

    assert _taints(api.node("n1")) == {("rasd.io/all-gpus-quarantined", "all", "NoSchedule")}
    assert "added taint" in last.detail
    assert not api.node("n1")["spec"].get("unschedulable"), "a GPU quarantine never cordons"

    k8s.release_gpu("n1", "GPU-0", reason="ok", ticket_id="t")

    assert _taints(api.node("n1")) == set()


def test_port_quarantine_annotates_and_releases(api, k8s):
    k8s.quarantine_port("n1", "mlx5_1/1", reason="link flaps", ticket_id="t")
    outcome = k8s.quarantine_port("n1", "mlx5_0/1", reason="link flaps", ticket_id="t")

    assert outcome.status is quarantine.Status.QUARANTINED
    assert api.node("n1")["metadata"]["annotations"]["rasd.io/quarantined-ports"] == "mlx5_0/1,mlx5_1/1"
    assert k8s.release_port("n1", "mlx5_0/1", reason="ok", ticket_id="t").status is quarantine.Status.RELEASED
    assert api.node("n1")["metadata"]["annotations"]["rasd.io/quarantined-ports"] == "mlx5_1/1"


# ---- Kubernetes: failures -----------------------------------------------------------------


def test_missing_node_is_a_clear_outcome(api, k8s):
    outcome = k8s.quarantine_node("gone", reason="r", ticket_id="t")

    assert outcome.status is quarantine.Status.NODE_NOT_FOUND and not outcome.changed
    assert "no such node" in str(outcome)
    assert k8s.release_gpu("gone", "GPU-a", reason="r", ticket_id="t").status is quarantine.Status.NODE_NOT_FOUND


def test_conflict_rereads_and_keeps_the_other_writers_change(api, k8s):
    other = {"key": "example.com/other", "value": "x", "effect": "NoSchedule"}

    def other_writer(node):
        taints = node["spec"].setdefault("taints", [])
        if other not in taints:
            taints.append(dict(other))
        node["metadata"].setdefault("labels", {})["touched"] = str(len(api.requests))

    api.race_next(other_writer, times=2)

    outcome = k8s.quarantine_node("n1", reason="r", ticket_id="t")

    assert outcome.status is quarantine.Status.QUARANTINED
    assert api.count("GET", "/nodes/n1") == 3, "two 409s, each followed by a fresh read"
    assert _taints(api.node("n1")) == {
        ("example.com/other", "x", "NoSchedule"),
        ("rasd.io/quarantined", "t", "NoSchedule"),
    }


def test_endless_conflicts_raise_a_retryable_error(api):
    adapter = quarantine.KubernetesQuarantine(
        kubernetes.client.ApiClient(kubernetes.client.Configuration(host=api.url)),
        quarantine.KubernetesSettings(conflict_retries=2),
    )
    api.race_next(lambda node: node["metadata"].setdefault("labels", {}).update(x="y"), times=10)

    with pytest.raises(quarantine.QuarantineUnavailableError, match="conflicting"):
        adapter.quarantine_node("n1", reason="r", ticket_id="t")
    adapter.close()


def test_api_server_down_raises_a_retryable_error():
    with socket.socket() as sock:  # a port that was free: nothing listens there
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    configuration = kubernetes.client.Configuration(host=f"http://127.0.0.1:{port}")
    configuration.retries = 0
    adapter = quarantine.KubernetesQuarantine(kubernetes.client.ApiClient(configuration))

    with pytest.raises(quarantine.QuarantineUnavailableError, match="unreachable"):
        adapter.quarantine_node("n1", reason="r", ticket_id="t")
    adapter.close()


def test_api_server_503_raises_a_retryable_error(api, k8s):
    api.unavailable = True

    with pytest.raises(quarantine.QuarantineUnavailableError, match="503"):
        k8s.release_node("n1", reason="r", ticket_id="t")


def test_validation_refusal_is_not_retryable(api, k8s):
    api.add_node("n2", taints=[{"key": "example.com/bad", "value": "not a label value", "effect": "NoSchedule"}])

    with pytest.raises(quarantine.QuarantineRejectedError, match="422"):
        k8s.quarantine_node("n2", reason="r", ticket_id="t")


# ---- Slurm --------------------------------------------------------------------------------

_FAKE_SCONTROL = textwrap.dedent(
    """\
    #!{python}
    # Fake scontrol: records argv, keeps node state in a JSON file, prints `show node` like Slurm 23.
    import json, os, sys
    here = os.path.dirname(os.path.abspath(__file__))
    state_path = os.path.join(here, "..", "slurm-state.json")
    with open(os.path.join(here, "..", "argv.log"), "a") as log:
        log.write(json.dumps(sys.argv[1:]) + "\\n")
    if os.environ.get("FAKE_SLURMCTLD_DOWN"):
        print("slurm_load_node error: Unable to contact slurm controller (connect failure)", file=sys.stderr)
        sys.exit(1)
    state = json.load(open(state_path))
    args = sys.argv[1:]
    if args[:2] == ["show", "node"]:
        node = state.get(args[2])
        if node is None:
            print(f"Node {{args[2]}} not found")
            sys.exit(1)
        reason = node["reason"]
        print(f"NodeName={{args[2]}} Arch=x86_64 CoresPerSocket=32")
        print("   CPUAlloc=0 CPUEfctv=64 CPUTot=64 CPULoad=0.02")
        print("   Gres=gpu:h100:8")
        print(f"   State={{node['state']}} ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A")
        print("   Partitions=gpu")
        if reason:
            print(f"   Reason={{reason}} [{{node['user']}}@2026-11-30T06:00:00]")
        sys.exit(0)
    if args[0] == "update":
        fields = dict(a.split("=", 1) for a in args[1:])
        node = state.get(fields["nodename"])
        if node is None:
            print(f"Invalid node name specified", file=sys.stderr)
            sys.exit(1)
        if fields["state"] == "drain":
            if not fields.get("reason"):
                print("You must specify a reason when DOWNING or DRAINING a node. Request denied", file=sys.stderr)
                sys.exit(1)
            node.update(state="IDLE+DRAIN", reason=fields["reason"], user="rasd")
        elif fields["state"] == "resume":
            node.update(state="IDLE", reason="", user="")
        json.dump(state, open(state_path, "w"))
        sys.exit(0)
    sys.exit(2)
    """
)


class FakeSlurm:
    def __init__(self, root: pathlib.Path) -> None:
        self.root = root
        self.bin = root / "bin"
        self.bin.mkdir()
        self.program = self.bin / "scontrol"
        self.program.write_text(_FAKE_SCONTROL.format(python=sys.executable))
        self.program.chmod(self.program.stat().st_mode | stat.S_IXUSR)
        self.state_path = root / "slurm-state.json"
        self.set_nodes({"n1": ("IDLE", "", "")})

    def set_nodes(self, nodes):
        self.state_path.write_text(
            json.dumps({name: {"state": s, "reason": r, "user": u} for name, (s, r, u) in nodes.items()})
        )

    def node(self, name):
        return json.loads(self.state_path.read_text())[name]

    def calls(self):
        path = self.root / "argv.log"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    def updates(self):
        return [c for c in self.calls() if c[0] == "update"]


@pytest.fixture
def slurm(tmp_path, monkeypatch):
    fake = FakeSlurm(tmp_path)
    monkeypatch.setenv("PATH", f"{fake.bin}{os.pathsep}{os.environ.get('PATH', '')}")
    return fake


def test_slurm_drains_and_resumes_its_own_drain(slurm):
    adapter = quarantine.SlurmQuarantine()  # "scontrol" from PATH

    drained = adapter.quarantine_node("n1", reason="Xid 79", ticket_id="t1")
    released = adapter.release_node("n1", reason="validation passed", ticket_id="t1")

    assert drained.status is quarantine.Status.QUARANTINED and drained.applied_scope == "node"
    assert released.status is quarantine.Status.RELEASED
    assert slurm.updates() == [
        ["update", "nodename=n1", "state=drain", "reason=rasd: Xid 79 (t1) {holds=node}"],
        ["update", "nodename=n1", "state=resume"],
    ]
    assert slurm.node("n1")["state"] == "IDLE"


def test_slurm_quarantine_twice_is_a_noop(slurm):
    adapter = quarantine.SlurmQuarantine()
    adapter.quarantine_node("n1", reason="r", ticket_id="t1")

    again = adapter.quarantine_node("n1", reason="r", ticket_id="t1")

    assert again.status is quarantine.Status.ALREADY_QUARANTINED
    assert len(slurm.updates()) == 1


def test_slurm_never_resumes_someone_elses_drain(slurm):
    slurm.set_nodes({"n1": ("IDLE+DRAIN", "bad DIMM, ticket INC-42", "root")})
    adapter = quarantine.SlurmQuarantine()

    outcome = adapter.release_node("n1", reason="validation passed", ticket_id="t1")

    assert outcome.status is quarantine.Status.NOT_QUARANTINED
    assert outcome.kept == ("drain set by someone else (bad DIMM, ticket INC-42)",)
    assert slurm.updates() == []
    assert slurm.node("n1")["state"] == "IDLE+DRAIN"


def test_slurm_quarantine_over_someone_elses_drain_restores_it_on_release(slurm):
    slurm.set_nodes({"n1": ("IDLE+DRAIN", "bad DIMM", "root")})
    adapter = quarantine.SlurmQuarantine()

    held = adapter.quarantine_node("n1", reason="Xid 79", ticket_id="t1")
    released = adapter.release_node("n1", reason="validation passed", ticket_id="t1")

    assert held.kept == ("drain set by someone else (bad DIMM); restored on release",)
    assert slurm.updates() == [
        ["update", "nodename=n1", "state=drain", "reason=rasd: Xid 79 (t1) {holds=node} {prior=bad DIMM}"],
        ["update", "nodename=n1", "state=drain", "reason=bad DIMM"],
    ]
    assert released.status is quarantine.Status.RELEASED
    assert slurm.node("n1") == {"state": "IDLE+DRAIN", "reason": "bad DIMM", "user": "rasd"}


def test_slurm_gpu_quarantine_falls_back_to_a_node_drain_until_the_last_hold_goes(slurm):
    adapter = quarantine.SlurmQuarantine()

    gpu = adapter.quarantine_gpu("n1", "GPU-a", reason="dbe", ticket_id="t1")
    adapter.quarantine_port("n1", "mlx5_0/1", reason="flaps", ticket_id="t2")
    first = adapter.release_gpu("n1", "GPU-a", reason="validated", ticket_id="t1")

    assert gpu.scope == "gpu" and gpu.applied_scope == "node"
    assert "Slurm drains whole nodes" in gpu.detail
    assert first.status is quarantine.Status.RELEASED
    assert slurm.node("n1")["state"] == "IDLE+DRAIN", "the port still holds the drain"
    assert "{holds=port:mlx5_0/1}" in slurm.node("n1")["reason"]

    adapter.release_port("n1", "mlx5_0/1", reason="validated", ticket_id="t2")

    assert slurm.node("n1")["state"] == "IDLE"


def test_slurm_unknown_node_is_a_clear_outcome(slurm):
    outcome = quarantine.SlurmQuarantine().quarantine_node("nope", reason="r", ticket_id="t")

    assert outcome.status is quarantine.Status.NODE_NOT_FOUND
    assert slurm.updates() == []


def test_slurm_controller_down_raises_a_retryable_error(slurm, monkeypatch):
    monkeypatch.setenv("FAKE_SLURMCTLD_DOWN", "1")

    with pytest.raises(quarantine.QuarantineUnavailableError, match="Unable to contact slurm controller"):
        quarantine.SlurmQuarantine().quarantine_node("n1", reason="r", ticket_id="t")


def test_slurm_scontrol_path_is_configurable(tmp_path, monkeypatch):
    fake = FakeSlurm(tmp_path)
    monkeypatch.setenv("PATH", "/nonexistent")
    adapter = quarantine.open_quarantine({"adapter": "slurm", "slurm": {"scontrol": str(fake.program)}})

    assert adapter.quarantine_node("n1", reason="r", ticket_id="t").status is quarantine.Status.QUARANTINED
    with pytest.raises(quarantine.QuarantineUnavailableError, match="not found on PATH"):
        quarantine.SlurmQuarantine().quarantine_node("n1", reason="r", ticket_id="t")


# ---- record only, settings, dispatch ------------------------------------------------------


def test_record_only_changes_nothing_and_says_so():
    adapter = quarantine.RecordOnlyQuarantine()

    first = adapter.quarantine_gpu("n1", "GPU-a", reason="r", ticket_id="t")
    again = adapter.quarantine_gpu("n1", "GPU-a", reason="r", ticket_id="t")
    released = adapter.release_gpu("n1", "GPU-a", reason="ok", ticket_id="t")
    stray = adapter.release_node("n1", reason="ok", ticket_id="t")

    assert first.recorded_only and not first.changed and "nothing changed" in first.detail
    assert again.status is quarantine.Status.ALREADY_QUARANTINED
    assert released.status is quarantine.Status.RELEASED and not released.changed
    assert stray.status is quarantine.Status.NOT_QUARANTINED


def test_open_quarantine_defaults_to_record_only():
    adapter = quarantine.open_quarantine({})

    assert isinstance(adapter, quarantine.RecordOnlyQuarantine)
    assert isinstance(adapter, quarantine.QuarantineAdapter)


def test_the_kubernetes_client_keeps_a_connection_for_each_adapter_call_the_service_makes_at_once():
    from rasd.controller.executors.quarantine import k8s_process
    from rasd.controller.remediation import adapters as remediation

    settings = {"host": "http://127.0.0.1:9", "own_process": False}  # the child builds its client the same way
    adapter = quarantine.open_quarantine({"adapter": "kubernetes", "kubernetes": settings})
    try:
        assert adapter._api_client.configuration.connection_pool_maxsize >= remediation.ADAPTER_THREADS
        assert (
            adapter._api_client.configuration.connection_pool_maxsize
            >= k8s_process.CALL_THREADS + k8s_process.EVENT_THREADS
        ), "and one for each Event posted after a call at once"
    finally:
        adapter.close()


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"adaptor": "slurm"}, "quarantine.adaptor: unknown setting"),
        ({"adapter": "pbs"}, "quarantine.adapter: expected 'record', 'kubernetes' or 'slurm', got \"pbs\""),
        ({"slurm": {"timeout": 3}}, "quarantine.slurm.timeout: unknown setting"),
        ({"slurm": {"timeout_s": 0}}, "quarantine.slurm.timeout_s: must be > 0"),
        (
            {"kubernetes": {"conflict_retries": "5"}},
            'quarantine.kubernetes.conflict_retries: expected an integer, got "5"',
        ),
        ({"kubernetes": {"host": "10.0.0.1:6443"}}, "quarantine.kubernetes.host: must be an http"),
        ({"kubernetes": []}, "quarantine.kubernetes: expected a table"),
    ],
)
def test_open_quarantine_names_the_bad_key(settings, message):
    with pytest.raises(quarantine.QuarantineSettingsError, match=message):
        quarantine.open_quarantine(settings)


def test_open_quarantine_builds_a_working_kubernetes_adapter(api):
    adapter = quarantine.open_quarantine({"adapter": "kubernetes", "kubernetes": {"host": api.url}})

    assert adapter.quarantine_port("n1", "mlx5_0/1", reason="r", ticket_id="t").changed
    adapter.close()


def test_executors_carry_out_the_cores_actions():
    adapter = quarantine.RecordOnlyQuarantine()
    run = quarantine.executors(adapter)
    common = {"ticket_id": "t", "step": 0, "node_id": "n1", "reason": "r"}

    gpu = run["quarantine_gpu"](actions.QuarantineGpu(gpu_uuid="GPU-a", **common))
    node = run["quarantine_node"](actions.QuarantineNode(**common))
    release = run["release"](actions.Release(gpu_uuid="GPU-a", **common))

    assert (gpu.scope, gpu.target, gpu.status) == ("gpu", "GPU-a", quarantine.Status.QUARANTINED)
    assert node.scope == "node"
    assert (release.operation, release.scope, release.status) == ("release", "gpu", quarantine.Status.RELEASED)
    assert str(release).startswith("record: release gpu n1/GPU-a: released")
    with pytest.raises(TypeError):
        quarantine.execute(adapter, actions.RebootNode(**common))
