"""Kubernetes quarantine adapter: cordon, taint, a node condition, annotations and Events (``kubernetes`` client).

Node quarantine (one strategic-merge patch of the Node, guarded by its ``resourceVersion``, then one
strategic-merge patch of the ``/status`` subresource):

- ``spec.unschedulable: true`` (cordon), only if the node was schedulable; rasd then records that it
  cordoned it in the annotation ``rasd.io/cordoned-by-rasd: <ticket>``. A node that was already
  unschedulable is left as it is and its cordon survives the release.
- taint ``rasd.io/quarantined=<ticket as a label value>:NoSchedule`` (``spec.taints`` is replaced as a
  whole by a strategic merge, so it is written from a fresh read with a ``resourceVersion``
  precondition; a 409 re-reads and retries, keeping taints others added meanwhile).
- annotation ``rasd.io/quarantined: <ticket>`` (the full ticket id; taint values are limited to 63
  label-value characters).
- label ``rasd.io/state=quarantined`` and node condition ``type=RasdHealthy, status=False,
  reason=RasdQuarantined, message=<reason>`` in ``status.conditions`` (merged by ``type``). A release
  sets ``rasd.io/state=healthy`` and ``RasdHealthy=True`` (reason ``RasdReleased``): the condition is
  never deleted, NPD style (`k8s_state`; `sync_nodes`, every ``node_sync_s``, keeps it present and
  fresh on every node rasd knows).

A drain before a reset or reboot (`drain_node`, `k8s_drain`) labels a held node ``repairing`` and
evicts its pods through the Eviction API, PDBs honoured; an RMA of the node (`mark_rma`) labels it
``rma``. `sync_nodes` also reads each Node's topology labels (zone, NVLink clique, rack) for the
ladder's blast radius.

GPU quarantine keeps the node schedulable: the UUIDs go into the annotation
``rasd.io/quarantined-gpus`` (comma-separated, sorted). Only when *every* GPU of the node is
quarantined (the count reaches ``status.capacity["nvidia.com/gpu"]``, resource name configurable) does
rasd add the taint ``rasd.io/all-gpus-quarantined=all:NoSchedule``; releasing one GPU removes it.

*Device-plugin integration, honestly:* the annotation by itself does not stop Kubernetes from handing
the GPU to a pod. The stock NVIDIA k8s-device-plugin decides device health on its own (NVML XID
events it watches); it reads no annotation and offers no documented per-GPU "mark unhealthy" input.
To enforce a per-GPU quarantine a cluster needs one of:

- DRA with device taints: a ``DeviceTaintRule`` (``resource.k8s.io``; alpha in Kubernetes 1.33 behind
  the ``DRADeviceTaints`` gate, stable in 1.37) selecting the GPU's device from the NVIDIA DRA
  driver, written by a small controller (or a later rasd adapter) that follows the annotation;
- a device plugin (fork or sidecar) that reports the annotated UUIDs ``Unhealthy`` to the kubelet;
- or, without either, only the node-level levers: the all-GPUs taint above, or a node quarantine.

Port quarantine is the annotation ``rasd.io/quarantined-ports`` (sorted ``mlx5_0/1`` names); isolating
the port in the fabric (subnet manager, NIC disable) is outside this adapter.

Every change also creates a core/v1 ``Event`` (``involvedObject`` = the Node, namespace
``event_namespace``, ``source.component`` ``rasd-controller``); a repeat that changes nothing posts
none. An Event that cannot be posted does not undo the change: the outcome says
``event_posted=False``. In the controller the adapter runs in its own process (`k8s_process`), which
posts a quarantine's Event after the call has returned, so the repair that waits for it leaves first.

RBAC the controller's ServiceAccount needs (a ClusterRole; the Helm chart renders it)::

    - apiGroups: [""]
      resources: ["nodes"]
      verbs: ["get", "list", "patch"]
    - apiGroups: [""]
      resources: ["nodes/status"]
      verbs: ["patch"]
    - apiGroups: [""]
      resources: ["events"]
      verbs: ["create"]
    - apiGroups: [""]
      resources: ["pods"]
      verbs: ["list"]
    - apiGroups: [""]
      resources: ["pods/eviction"]
      verbs: ["create"]

(Drains list the node's pods and evict them; a PodDisruptionBudget's refusal comes back in the
eviction's 429, so rasd never reads PDBs.)

Errors: 404 → ``NODE_NOT_FOUND`` outcome; 409 → re-read and retry (``conflict_retries`` times, then
`QuarantineUnavailableError`); no connection, timeouts, 429 and 5xx → `QuarantineUnavailableError`;
other 4xx (401, 403, 422, ...) → `QuarantineRejectedError`.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import hashlib
import json
import re
import time
import uuid
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import structlog

from rasd.controller.executors.quarantine import k8s_drain
from rasd.controller.executors.quarantine import k8s_state as node_state
from rasd.controller.executors.quarantine.adapter import (
    QuarantineError,
    QuarantineOutcome,
    QuarantineRejectedError,
    QuarantineSettingsError,
    QuarantineUnavailableError,
    Status,
    require,
    split_items,
)

if TYPE_CHECKING:
    import kubernetes.client

log = structlog.get_logger("rasd.controller")

TAINT_QUARANTINED = "rasd.io/quarantined"
"""Taint key of a node quarantine (effect NoSchedule; value: the ticket as a label value)."""
TAINT_ALL_GPUS = "rasd.io/all-gpus-quarantined"
"""Taint key set while every GPU of the node is quarantined (effect NoSchedule)."""
ANN_QUARANTINED = "rasd.io/quarantined"
"""Annotation: the ticket id of the node quarantine."""
ANN_CORDONED = "rasd.io/cordoned-by-rasd"
"""Annotation: present only when rasd itself set ``spec.unschedulable``; value: the ticket id."""
ANN_GPUS = "rasd.io/quarantined-gpus"
"""Annotation: quarantined GPU UUIDs, comma-separated, sorted."""
ANN_PORTS = "rasd.io/quarantined-ports"
"""Annotation: quarantined InfiniBand ports ("mlx5_0/1"), comma-separated, sorted."""
CONDITION_TYPE = node_state.CONDITION_TYPE
"""Node condition type rasd owns (False while rasd holds the node, True after; never deleted)."""
STATE_LABEL = node_state.STATE_LABEL
"""Node label with the node's state as rasd sees it (healthy, quarantined, repairing, rma)."""


CALLS_AT_ONCE = 16
"""Adapter calls made at once (the remediation service's adapter threads, the child's call threads)."""
EVENT_POSTS_AT_ONCE = 4
"""Events posted at once after the calls that caused them have returned (`post_later`)."""
API_CONNECTIONS = CALLS_AT_ONCE + EVENT_POSTS_AT_ONCE
"""Connections the Kubernetes client keeps open to the API server (`api_client`): one per call and Event post
in flight, or a storm opens and drops a connection (and, against a real API server, a TLS handshake) for each
request beyond them."""


@dataclasses.dataclass(frozen=True)
class KubernetesSettings:
    """How to reach the API server and what to write."""

    host: str = ""
    """API server URL without credentials (``kubectl proxy``'s "http://127.0.0.1:8001", or a test
    server); empty: the in-cluster service account, else ``kubeconfig``."""
    kubeconfig: str = ""
    """Kubeconfig file used when ``host`` is empty and the controller runs outside a cluster."""
    context: str = ""
    """Kubeconfig context; empty: the file's current context."""
    verify_tls: bool = True
    """Verify the API server's certificate when ``host`` is set."""
    event_namespace: str = "default"
    """Namespace of the Events posted for Node changes (kubectl shows Node events from "default")."""
    gpu_resource: str = "nvidia.com/gpu"
    """Extended resource whose capacity counts the node's GPUs (for the all-GPUs taint)."""
    request_timeout_s: float = 10.0
    """Timeout of each API request."""
    conflict_retries: int = 5
    """Re-reads after a 409 before giving up with `QuarantineUnavailableError`."""
    component: str = "rasd-controller"
    """``source.component`` and ``reportingComponent`` of posted Events."""
    drain_backoff_s: float = 1.0
    """A drain's first wait after a PDB refusal (or for pods still terminating); doubles each time."""
    drain_backoff_max_s: float = 30.0
    """A drain's longest wait between rounds of evictions."""
    zone_label: str = "topology.kubernetes.io/zone"
    """Node label read as the ``zone`` blast-radius domain ("": not read)."""
    nvlink_domain_label: str = "nvidia.com/gpu.clique"
    """Node label read as the ``nvlink_domain`` domain (GPU Feature Discovery's NVLink clique)."""
    rack_label: str = "rasd.io/rack"
    """Node label read as the ``rack`` domain (Kubernetes has no standard one: name the cluster's own)."""
    node_sync_s: float = 60.0
    """How often the leader reads the Nodes' topology and refreshes ``RasdHealthy``'s heartbeat (0: never)."""
    own_process: bool = True
    """Run the client in a process of its own (`k8s_process`), off the interpreter that decides, and post
    quarantines' Events after the call returns; false: in the controller's process, Events before."""

    def validate(self, prefix: str) -> None:
        """Check values; raise `QuarantineSettingsError` naming the key."""
        require(self.request_timeout_s > 0, f"{prefix}request_timeout_s", "must be > 0", self.request_timeout_s)
        require(self.conflict_retries >= 0, f"{prefix}conflict_retries", "must be >= 0", self.conflict_retries)
        require(bool(self.event_namespace), f"{prefix}event_namespace", "must not be empty", self.event_namespace)
        require(bool(self.gpu_resource), f"{prefix}gpu_resource", "must not be empty", self.gpu_resource)
        require(self.node_sync_s >= 0, f"{prefix}node_sync_s", "must be >= 0", self.node_sync_s)
        require(self.drain_backoff_s > 0, f"{prefix}drain_backoff_s", "must be > 0", self.drain_backoff_s)
        require(
            self.drain_backoff_max_s >= self.drain_backoff_s,
            f"{prefix}drain_backoff_max_s",
            f"must be >= drain_backoff_s ({self.drain_backoff_s})",
            self.drain_backoff_max_s,
        )
        require(
            not self.host or self.host.startswith(("http://", "https://")),
            f"{prefix}host",
            "must be an http(s) URL",
            self.host,
        )


@dataclasses.dataclass(frozen=True)
class _Plan:
    """One read-modify-write: the patches to send, or none, and what to report."""

    status: Status
    detail: str
    patch: dict[str, Any] | None = None
    """Strategic-merge patch of the Node (metadata/spec); gets the read's resourceVersion."""
    status_patch: dict[str, Any] | None = None
    """Strategic-merge patch of the Node's /status subresource."""
    kept: tuple[str, ...] = ()
    event_reason: str = ""
    event_type: str = "Normal"


_STRATEGIC = "application/strategic-merge-patch+json"
_LABEL_VALUE_OK = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


def label_value(text: str) -> str:
    """Turn a ticket id into a valid Kubernetes label (taint) value: ≤ 63 of ``[A-Za-z0-9-_.]``.

    Example: ``label_value("n1/GPU-1/xid:13/7")`` → ``"n1-GPU-1-xid-13-7"``. Longer ids are cut and
    end in 8 hex digits of their SHA-256, so distinct long ids stay distinct.
    """
    cleaned = re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-_.")
    if len(cleaned) > 63:
        digest = hashlib.sha256(text.encode()).hexdigest()[:8]
        cleaned = cleaned[:54].rstrip("-_.") + "-" + digest
    return cleaned or "rasd"


def _join(items: set[str]) -> str | None:
    """Annotation value for a set; None (delete the key in a merge patch) when empty."""
    return ",".join(sorted(items)) or None


class KubernetesQuarantine:
    """Quarantine through the Kubernetes API: cordon, taints, a node condition, annotations, Events.

    Args:
        api_client: a configured ``kubernetes.client.ApiClient`` (see `open_quarantine`); closed by
            `close`.
        settings: namespaces, timeouts, names.
        clock: current UTC time, for condition and Event timestamps.
        post_later: takes a quarantine's or release's Event post (a callable) to run after the call has
            returned (`k8s_process` hands it to its own threads), so that the repair waiting for the call
            does not wait for the Event too; the outcome's ``event_posted`` is then None and a failed post
            is logged. None: posted before the call returns.
    """

    name = "kubernetes"

    def __init__(
        self,
        api_client: kubernetes.client.ApiClient,
        settings: KubernetesSettings | None = None,
        *,
        clock: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC),
        post_later: Callable[[Callable[[], bool]], Any] | None = None,
    ) -> None:
        import kubernetes.client  # optional extra: imported only when this adapter is configured

        self._api_client = api_client
        self._core = kubernetes.client.CoreV1Api(api_client)
        self._settings = settings or KubernetesSettings()
        self._clock = clock
        self._post_later = post_later

    # ---- public API -----------------------------------------------------------------------

    def quarantine_node(self, node_id: str, *, reason: str, ticket_id: str) -> QuarantineOutcome:
        """Cordon (unless already cordoned), taint, annotate and set ``RasdHealthy=False``."""
        return self._apply(
            "quarantine", "node", node_id, "", ticket_id, lambda n: self._plan_node_q(n, reason, ticket_id)
        )

    def release_node(self, node_id: str, *, reason: str, ticket_id: str) -> QuarantineOutcome:
        """Remove rasd's taint, annotations and condition; uncordon only if rasd cordoned."""
        return self._apply("release", "node", node_id, "", ticket_id, lambda n: self._plan_node_r(n, reason))

    def quarantine_gpu(self, node_id: str, gpu_uuid: str, *, reason: str, ticket_id: str) -> QuarantineOutcome:
        """Add the UUID to ``rasd.io/quarantined-gpus``; taint only when every GPU is quarantined."""
        return self._apply(
            "quarantine", "gpu", node_id, gpu_uuid, ticket_id, lambda n: self._plan_gpu(n, gpu_uuid, reason, add=True)
        )

    def release_gpu(self, node_id: str, gpu_uuid: str, *, reason: str, ticket_id: str) -> QuarantineOutcome:
        """Remove the UUID from ``rasd.io/quarantined-gpus`` (and the all-GPUs taint)."""
        return self._apply(
            "release", "gpu", node_id, gpu_uuid, ticket_id, lambda n: self._plan_gpu(n, gpu_uuid, reason, add=False)
        )

    def quarantine_port(self, node_id: str, port: str, *, reason: str, ticket_id: str) -> QuarantineOutcome:
        """Add the port to ``rasd.io/quarantined-ports``."""
        return self._apply(
            "quarantine", "port", node_id, port, ticket_id, lambda n: self._plan_port(n, port, reason, add=True)
        )

    def release_port(self, node_id: str, port: str, *, reason: str, ticket_id: str) -> QuarantineOutcome:
        """Remove the port from ``rasd.io/quarantined-ports``."""
        return self._apply(
            "release", "port", node_id, port, ticket_id, lambda n: self._plan_port(n, port, reason, add=False)
        )

    def mark_rma(self, node_id: str, *, reason: str, ticket_id: str) -> QuarantineOutcome:
        """An RMA is open for the node: ``rasd.io/state=rma``, ``RasdHealthy=False`` (reason ``RasdRma``)."""
        return self._apply(
            "rma", "node", node_id, "", ticket_id, lambda n: self._plan_state(n, node_state.RMA, "RasdRma", reason)
        )

    def drain_node(
        self, node_id: str, *, reason: str, ticket_id: str, pods: str, deadline_s: float
    ) -> k8s_drain.DrainReport:
        """Evict the node's pods (``pods``: "gpu" or "all") through the Eviction API before a repair.

        A node rasd holds is labelled ``repairing`` first. Events: ``RasdDrained`` when done,
        ``RasdDrainBlocked`` (Warning) when the deadline passes. Cordons and taints are not touched.

        Raises:
            k8s_drain.DrainBlockedError: pods remain at the deadline (named, with the PDB's words).
            QuarantineUnavailableError, QuarantineRejectedError: the API failed.
        """
        marked = self._apply(
            "repair", "node", node_id, "", ticket_id,
            lambda n: self._plan_state(n, node_state.REPAIRING, "RasdRepairing", reason, only_if_held=True),
        )  # fmt: skip
        if marked.status is Status.NODE_NOT_FOUND:
            return k8s_drain.DrainReport(node_id, (), 0, 0.0)
        edges = k8s_drain.DrainEdges(self._list_pods, self._evict, time.monotonic, time.sleep)
        node = {"metadata": {"name": node_id}}
        try:
            report = k8s_drain.drain(
                node_id, scope=pods, gpu_resource=self._settings.gpu_resource, deadline_s=deadline_s,
                backoff_s=self._settings.drain_backoff_s, backoff_max_s=self._settings.drain_backoff_max_s,
                edges=edges,
            )  # fmt: skip
        except k8s_drain.DrainBlockedError as exc:
            blocked = _Plan(Status.QUARANTINED, str(exc), event_reason="RasdDrainBlocked", event_type="Warning")
            self._post_event(node, blocked)
            raise
        self._post_event(node, _Plan(Status.QUARANTINED, f"{report}: {reason}", event_reason="RasdDrained"))
        return report

    @property
    def sync_period_s(self) -> float:
        """How often `sync_nodes` should run (0: never)."""
        return self._settings.node_sync_s

    def sync_nodes(self, node_ids: Iterable[str]) -> dict[str, dict[str, str]]:
        """One list of the Nodes: every Node's topology (`k8s_state.topology_of`), and a heartbeat for these.

        The heartbeat keeps ``RasdHealthy`` present and fresh on the nodes rasd knows (NPD style): a
        node without it gets it (True unless its label says rasd holds it), one with it a new
        ``lastHeartbeatTime``. A node the API server does not list is skipped.
        """
        nodes = json.loads(self._call(self._core.list_node, what="list nodes")).get("items") or []
        settings = self._settings
        keys = {"zone": settings.zone_label, "nvlink_domain": settings.nvlink_domain_label, "rack": settings.rack_label}
        by_name = {(n.get("metadata") or {}).get("name", ""): n for n in nodes}
        self._heartbeat(by_name, node_ids)
        return {name: node_state.topology_of(node, keys) for name, node in by_name.items()}

    def heartbeat(self, node_ids: Iterable[str]) -> int:
        """`sync_nodes`'s heartbeat alone, each node read first; returns how many were written."""
        nodes = {node_id: node for node_id in node_ids if (node := self._read(node_id)) is not None}
        return self._heartbeat(nodes, nodes)

    def _heartbeat(self, nodes: dict[str, dict[str, Any]], node_ids: Iterable[str]) -> int:
        written = 0
        now = _rfc3339(self._clock())
        for node_id in node_ids:
            node = nodes.get(node_id)
            if node is None:
                continue
            patch = node_state.heartbeat_patch(node, now=now)
            try:
                self._call(self._core.patch_node_status, node_id, patch, _content_type=_STRATEGIC, what="heartbeat")
            except _NotFound:
                continue
            except QuarantineError as exc:  # one node's refusal must not cost the others theirs, nor the topology
                log.warning("node_heartbeat_failed", node=node_id, error=str(exc))
                continue
            written += 1
        return written

    def close(self) -> None:
        """Close the API client's connection pool."""
        self._api_client.close()

    # ---- plans (pure functions of the node as read) ----------------------------------------

    def _plan_node_q(self, node: dict[str, Any], reason: str, ticket_id: str) -> _Plan:
        meta, spec = node.get("metadata") or {}, node.get("spec") or {}
        annotations = meta.get("annotations") or {}
        taints = list(spec.get("taints") or [])
        has_taint = any(t.get("key") == TAINT_QUARANTINED for t in taints)
        has_condition = (node_state.condition_of(node) or {}).get("status") == "False"
        has_label = node_state.state_of(node) in node_state.HELD_STATES
        has_annotation = ANN_QUARANTINED in annotations
        unschedulable = bool(spec.get("unschedulable"))
        kept = ("cordon set by someone else",) if unschedulable and ANN_CORDONED not in annotations else ()
        if has_taint and has_condition and has_label and has_annotation and unschedulable:
            held = annotations[ANN_QUARANTINED]
            return _Plan(Status.ALREADY_QUARANTINED, f"already quarantined by rasd (ticket {held})", kept=kept)
        new_meta: dict[str, Any] = {"annotations": {}}
        patch_spec: dict[str, Any] = {}
        done: list[str] = []
        if not has_annotation:
            new_meta["annotations"][ANN_QUARANTINED] = ticket_id
        if not unschedulable:
            patch_spec["unschedulable"] = True
            new_meta["annotations"][ANN_CORDONED] = ticket_id
            done.append("cordoned")
        if not has_taint:
            taints.append({"key": TAINT_QUARANTINED, "value": label_value(ticket_id), "effect": "NoSchedule"})
            patch_spec["taints"] = taints
            done.append(f"tainted {TAINT_QUARANTINED}:NoSchedule")
        if not has_label:
            new_meta.update(node_state.label_patch(node_state.QUARANTINED))
            done.append(f"labelled {node_state.STATE_LABEL}={node_state.QUARANTINED}")
        patch: dict[str, Any] = {"metadata": new_meta}
        if patch_spec:
            patch["spec"] = patch_spec
        status_patch = None
        if not has_condition:
            status_patch = node_state.condition_patch(
                node, healthy=False, reason="RasdQuarantined", message=f"{reason} (ticket {ticket_id})",
                now=_rfc3339(self._clock()),
            )  # fmt: skip
            done.append(f"condition {CONDITION_TYPE}=False")
        if not done:
            done.append("annotated")
        return _Plan(
            Status.QUARANTINED,
            ", ".join(done) + f": {reason}",
            patch,
            status_patch,
            kept,
            "RasdQuarantined",
            "Warning",
        )

    def _plan_node_r(self, node: dict[str, Any], reason: str) -> _Plan:
        meta, spec = node.get("metadata") or {}, node.get("spec") or {}
        annotations = meta.get("annotations") or {}
        taints = list(spec.get("taints") or [])
        kept_taints = [t for t in taints if t.get("key") != TAINT_QUARANTINED]
        unhealthy = (node_state.condition_of(node) or {}).get("status") == "False"
        held_label = node_state.state_of(node) in node_state.HELD_STATES
        rasd_cordoned = ANN_CORDONED in annotations
        unschedulable = bool(spec.get("unschedulable"))
        kept = ("cordon set by someone else",) if unschedulable and not rasd_cordoned else ()
        untouched = len(kept_taints) == len(taints) and ANN_QUARANTINED not in annotations
        if untouched and not unhealthy and not held_label:
            return _Plan(Status.NOT_QUARANTINED, "rasd holds no node quarantine here; nothing changed", kept=kept)
        done: list[str] = []
        patch: dict[str, Any] = {
            "metadata": {
                "annotations": {ANN_QUARANTINED: None, ANN_CORDONED: None},
                **node_state.label_patch(node_state.HEALTHY),
            }
        }
        patch_spec: dict[str, Any] = {}
        if len(kept_taints) != len(taints):
            patch_spec["taints"] = kept_taints
            done.append(f"removed taint {TAINT_QUARANTINED}")
        if rasd_cordoned and unschedulable:
            patch_spec["unschedulable"] = False
            done.append("uncordoned")
        if patch_spec:
            patch["spec"] = patch_spec
        done.append(f"labelled {node_state.STATE_LABEL}={node_state.HEALTHY}")
        # NPD style: the condition stays, True, so "not rasd's concern any more" reads as healthy.
        status_patch = node_state.condition_patch(
            node, healthy=True, reason="RasdReleased", message=f"released: {reason}", now=_rfc3339(self._clock())
        )
        done.append(f"condition {CONDITION_TYPE}=True")
        return _Plan(Status.RELEASED, ", ".join(done) + f": {reason}", patch, status_patch, kept, "RasdReleased")

    def _plan_state(
        self, node: dict[str, Any], state: str, why: str, reason: str, *, only_if_held: bool = False
    ) -> _Plan:
        """Set ``rasd.io/state`` (and ``RasdHealthy=False`` with reason ``why``); only_if_held: on a node rasd holds."""
        current = node_state.state_of(node)
        if only_if_held and current not in node_state.HELD_STATES:
            return _Plan(Status.NOT_QUARANTINED, f"node not held by rasd; {node_state.STATE_LABEL} left {current!r}")
        if current == node_state.RMA and state != node_state.RMA:
            return _Plan(Status.ALREADY_QUARANTINED, f"an RMA is open; {node_state.STATE_LABEL} stays rma")
        condition = node_state.condition_of(node) or {}
        if current == state and condition.get("status") == "False" and condition.get("reason") == why:
            return _Plan(Status.ALREADY_QUARANTINED, f"already {node_state.STATE_LABEL}={state}; nothing changed")
        status_patch = node_state.condition_patch(
            node, healthy=False, reason=why, message=reason, now=_rfc3339(self._clock())
        )
        detail = f"labelled {node_state.STATE_LABEL}={state}, condition {CONDITION_TYPE}=False ({why}): {reason}"
        patch = {"metadata": node_state.label_patch(state)}
        return _Plan(Status.QUARANTINED, detail, patch, status_patch, (), why, "Warning")

    def _plan_gpu(self, node: dict[str, Any], gpu_uuid: str, reason: str, *, add: bool) -> _Plan:
        meta, spec = node.get("metadata") or {}, node.get("spec") or {}
        annotations = meta.get("annotations") or {}
        gpus = split_items(annotations.get(ANN_GPUS))
        new = (gpus | {gpu_uuid}) if add else (gpus - {gpu_uuid})
        capacity = _int_quantity(((node.get("status") or {}).get("capacity") or {}).get(self._settings.gpu_resource))
        all_quarantined = capacity > 0 and len(new) >= capacity
        taints = list(spec.get("taints") or [])
        has_taint = any(t.get("key") == TAINT_ALL_GPUS for t in taints)
        new_taints = None
        if all_quarantined and not has_taint:
            new_taints = [*taints, {"key": TAINT_ALL_GPUS, "value": "all", "effect": "NoSchedule"}]
        elif not all_quarantined and has_taint:
            new_taints = [t for t in taints if t.get("key") != TAINT_ALL_GPUS]
        if new == gpus and new_taints is None:
            if add:
                return _Plan(Status.ALREADY_QUARANTINED, f"GPU already in {ANN_GPUS}; nothing changed")
            return _Plan(Status.NOT_QUARANTINED, f"GPU not in {ANN_GPUS}; nothing changed")
        patch: dict[str, Any] = {"metadata": {"annotations": {ANN_GPUS: _join(new)}}}
        if add:
            done = f"added to {ANN_GPUS} ({len(new)} of {capacity or '?'} GPUs quarantined)"
        else:
            done = f"removed from {ANN_GPUS} ({len(new)} of {capacity or '?'} GPUs still quarantined)"
        if new_taints is not None:
            patch["spec"] = {"taints": new_taints}
            done += f", {'added' if all_quarantined else 'removed'} taint {TAINT_ALL_GPUS}:NoSchedule"
        # A changed set says what happened; an unchanged one only had the all-GPUs taint to repair.
        if add:
            status = Status.QUARANTINED if new != gpus else Status.ALREADY_QUARANTINED
        else:
            status = Status.RELEASED if new != gpus else Status.NOT_QUARANTINED
        event = "RasdGpuQuarantined" if add else "RasdGpuReleased"
        return _Plan(status, f"{done}: {reason}", patch, None, (), event, "Warning" if add else "Normal")

    def _plan_port(self, node: dict[str, Any], port: str, reason: str, *, add: bool) -> _Plan:
        annotations = (node.get("metadata") or {}).get("annotations") or {}
        ports = split_items(annotations.get(ANN_PORTS))
        new = (ports | {port}) if add else (ports - {port})
        if new == ports:
            if add:
                return _Plan(Status.ALREADY_QUARANTINED, f"port already in {ANN_PORTS}; nothing changed")
            return _Plan(Status.NOT_QUARANTINED, f"port not in {ANN_PORTS}; nothing changed")
        patch = {"metadata": {"annotations": {ANN_PORTS: _join(new)}}}
        if add:
            return _Plan(
                Status.QUARANTINED, f"added to {ANN_PORTS}: {reason}", patch, None, (), "RasdPortQuarantined", "Warning"
            )
        return _Plan(Status.RELEASED, f"removed from {ANN_PORTS}: {reason}", patch, None, (), "RasdPortReleased")

    # ---- I/O ------------------------------------------------------------------------------

    def _apply(
        self,
        operation: str,
        scope: str,
        node_id: str,
        target: str,
        ticket_id: str,
        plan_for: Callable[[dict[str, Any]], _Plan],
    ) -> QuarantineOutcome:
        """Read the node, plan, patch with a resourceVersion precondition; re-read on 409."""

        def outcome(plan: _Plan, *, event_posted: bool | None = None, applied: bool = False) -> QuarantineOutcome:
            return QuarantineOutcome(
                self.name,
                operation,
                scope,
                node_id,
                target,
                ticket_id,
                plan.status,
                plan.detail,
                applied_scope=scope if applied else "",
                kept=plan.kept,
                event_posted=event_posted,
            )

        not_found = _Plan(Status.NODE_NOT_FOUND, "the API server has no such node; nothing changed")
        for _attempt in range(self._settings.conflict_retries + 1):
            node = self._read(node_id)
            if node is None:
                return outcome(not_found)
            plan = plan_for(node)
            if plan.patch is None and plan.status_patch is None:
                return outcome(plan)
            try:
                if plan.patch is not None:
                    body = dict(plan.patch)
                    body["metadata"] = {
                        **body.get("metadata", {}),
                        "resourceVersion": node["metadata"]["resourceVersion"],
                    }
                    self._call(
                        self._core.patch_node, node_id, body, _content_type=_STRATEGIC, what="patch node", conflict=True
                    )
                if plan.status_patch is not None:
                    # Conditions merge by type, so this patch needs no precondition.
                    self._call(
                        self._core.patch_node_status, node_id, plan.status_patch, _content_type=_STRATEGIC,
                        what="patch node status",
                    )  # fmt: skip
            except _Conflict:
                log.info("quarantine_conflict_retried", node=node_id, operation=operation, scope=scope)
                continue
            except _NotFound:
                return outcome(not_found)
            if self._post_later is not None:
                self._post_later(functools.partial(self._post_event, node, plan))
                return outcome(plan, applied=True)
            posted = self._post_event(node, plan)
            return outcome(plan, event_posted=posted, applied=True)
        raise QuarantineUnavailableError(
            f"{operation} {scope} on node {node_id}: still conflicting after "
            f"{self._settings.conflict_retries} retries (the node keeps changing)"
        )

    def _list_pods(self, node_id: str) -> list[dict[str, Any]]:
        """The node's pods, every namespace (field selector ``spec.nodeName``)."""
        body = self._call(
            self._core.list_pod_for_all_namespaces, field_selector=f"spec.nodeName={node_id}", what="list pods"
        )
        return list(json.loads(body).get("items") or [])

    def _evict(self, pod: dict[str, Any]) -> tuple[k8s_drain.Eviction, str]:
        """One policy/v1 Eviction: accepted, gone (404), or blocked by a PDB (429, with its message)."""
        import kubernetes.client.exceptions

        meta = pod.get("metadata") or {}
        try:
            self._call(
                self._core.create_namespaced_pod_eviction, meta.get("name", ""), meta.get("namespace", ""),
                k8s_drain.eviction_body(pod), _headers={"Content-Type": "application/json"}, what="evict pod",
                raw_errors=(429,),
            )  # fmt: skip
        except _NotFound:
            return k8s_drain.Eviction.GONE, ""
        except kubernetes.client.exceptions.ApiException as exc:
            try:
                status = json.loads(_api_message(exc, limit=4096))
            except ValueError:
                status = {}
            return k8s_drain.Eviction.BLOCKED, k8s_drain.refusal_message(status if isinstance(status, dict) else {})
        return k8s_drain.Eviction.ACCEPTED, ""

    def _read(self, node_id: str) -> dict[str, Any] | None:
        try:
            return json.loads(self._call(self._core.read_node, node_id, what="read node"))
        except _NotFound:
            return None

    def _call(
        self,
        method: Callable[..., Any],
        *args: Any,
        what: str,
        conflict: bool = False,
        raw_errors: tuple[int, ...] = (),
        **kwargs: Any,
    ) -> bytes:
        """Call the API; its answer's body as sent; failures mapped onto this module's errors (404, 409: private).

        The body is not turned into the client's model objects: a quarantine storm makes hundreds of
        calls a second, the models cost more CPU than the HTTP, and the plans read plain JSON anyway.
        A non-2xx answer still raises the client's ``ApiException``; one whose status is in
        raw_errors is raised as that ``ApiException`` (a 429 from an eviction is a PDB's answer).
        """
        import kubernetes.client.exceptions
        import urllib3.exceptions

        try:
            response = method(
                *args, _request_timeout=self._settings.request_timeout_s, _preload_content=False, **kwargs
            )
            return bytes(response.data)  # read to the end: the connection goes back to the pool
        except kubernetes.client.exceptions.ApiException as exc:
            status = exc.status or 0
            if status in raw_errors:
                raise
            if status == 404:
                raise _NotFound from exc
            if status == 409 and conflict:
                raise _Conflict from exc
            text = f"{what} {args[0]}: HTTP {status} {exc.reason or ''}".strip()
            if status in (0, 408, 409, 429) or status >= 500:
                raise QuarantineUnavailableError(text) from exc
            raise QuarantineRejectedError(f"{text}: {_api_message(exc)}") from exc
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise QuarantineUnavailableError(f"{what} {args[0]}: API server unreachable: {exc}") from exc

    def _post_event(self, node: dict[str, Any], plan: _Plan) -> bool:
        """Create a core/v1 Event about the Node; failures are logged, never raised."""
        meta = node.get("metadata") or {}
        now = _rfc3339(self._clock())
        name = meta.get("name", "")
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": f"{name}.{uuid.uuid4().hex[:16]}", "namespace": self._settings.event_namespace},
            "involvedObject": {"apiVersion": "v1", "kind": "Node", "name": name, "uid": meta.get("uid", "")},
            "reason": plan.event_reason,
            "message": plan.detail[:1024],
            "type": plan.event_type,
            "source": {"component": self._settings.component},
            "reportingComponent": self._settings.component,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        try:
            self._call(
                self._core.create_namespaced_event,
                self._settings.event_namespace,
                event,
                _headers={"Content-Type": "application/json"},
                what="create event",
            )
        except (QuarantineError, _NotFound) as exc:
            log.warning("quarantine_event_failed", node=name, error=str(exc) or type(exc).__name__)
            return False
        return True


class _NotFound(Exception):
    """404 from the API (internal signal)."""


class _Conflict(Exception):
    """409 on a guarded patch (internal signal)."""


def _int_quantity(value: Any) -> int:
    """An integer resource quantity ("8") as int; 0 when absent or not a plain integer."""
    try:
        return int(str(value))
    except (TypeError, ValueError):
        return 0


def _rfc3339(moment: dt.datetime) -> str:
    return moment.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _api_message(exc: Any, *, limit: int = 300) -> str:
    body = getattr(exc, "body", None) or ""
    if isinstance(body, bytes):
        body = body.decode(errors="replace")
    return str(body)[:limit]


# --------------------------------------------------------------------------------------------
# Slurm


def api_client(settings: KubernetesSettings, prefix: str) -> kubernetes.client.ApiClient:
    """A configured API client: ``host`` if set, else the in-cluster service account, else ``kubeconfig``."""
    try:
        import kubernetes.client
        import kubernetes.config
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise QuarantineSettingsError(
            f"{prefix.rstrip('.')}: the kubernetes client is not installed (pip install 'rasd[kubernetes]')"
        ) from exc
    configuration = kubernetes.client.Configuration()
    configuration.connection_pool_maxsize = max(configuration.connection_pool_maxsize, API_CONNECTIONS)
    if settings.host:
        configuration.host = settings.host
        configuration.verify_ssl = settings.verify_tls
    else:
        try:
            kubernetes.config.load_incluster_config(client_configuration=configuration)
        except kubernetes.config.ConfigException:
            try:
                kubernetes.config.load_kube_config(
                    config_file=settings.kubeconfig or None,
                    context=settings.context or None,
                    client_configuration=configuration,
                )
            except (kubernetes.config.ConfigException, OSError) as exc:
                raise QuarantineSettingsError(
                    f"{prefix}kubeconfig: no in-cluster config and no usable kubeconfig: {exc}"
                ) from exc
    return kubernetes.client.ApiClient(configuration)
