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
- node condition ``type=RasdHealthy, status=False, reason=RasdQuarantined, message=<reason>`` in
  ``status.conditions`` (merged by ``type``). A release deletes it (``$patch: delete``).

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
``event_posted=False``.

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

Errors: 404 → ``NODE_NOT_FOUND`` outcome; 409 → re-read and retry (``conflict_retries`` times, then
`QuarantineUnavailableError`); no connection, timeouts, 429 and 5xx → `QuarantineUnavailableError`;
other 4xx (401, 403, 422, ...) → `QuarantineRejectedError`.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import json
import re
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import structlog

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
CONDITION_TYPE = "RasdHealthy"
"""Node condition type rasd owns (status False while quarantined; deleted on release)."""


API_CONNECTIONS = 16
"""Connections the Kubernetes client keeps open to the API server (`api_client`)."""


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

    def validate(self, prefix: str) -> None:
        """Check values; raise `QuarantineSettingsError` naming the key."""
        require(self.request_timeout_s > 0, f"{prefix}request_timeout_s", "must be > 0", self.request_timeout_s)
        require(self.conflict_retries >= 0, f"{prefix}conflict_retries", "must be >= 0", self.conflict_retries)
        require(bool(self.event_namespace), f"{prefix}event_namespace", "must not be empty", self.event_namespace)
        require(bool(self.gpu_resource), f"{prefix}gpu_resource", "must not be empty", self.gpu_resource)
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
    """

    name = "kubernetes"

    def __init__(
        self,
        api_client: kubernetes.client.ApiClient,
        settings: KubernetesSettings | None = None,
        *,
        clock: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC),
    ) -> None:
        import kubernetes.client  # optional extra: imported only when this adapter is configured

        self._api_client = api_client
        self._core = kubernetes.client.CoreV1Api(api_client)
        self._settings = settings or KubernetesSettings()
        self._clock = clock

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

    def close(self) -> None:
        """Close the API client's connection pool."""
        self._api_client.close()

    # ---- plans (pure functions of the node as read) ----------------------------------------

    def _plan_node_q(self, node: dict[str, Any], reason: str, ticket_id: str) -> _Plan:
        meta, spec = node.get("metadata") or {}, node.get("spec") or {}
        annotations = meta.get("annotations") or {}
        taints = list(spec.get("taints") or [])
        has_taint = any(t.get("key") == TAINT_QUARANTINED for t in taints)
        has_condition = (_condition(node, CONDITION_TYPE) or {}).get("status") == "False"
        has_annotation = ANN_QUARANTINED in annotations
        unschedulable = bool(spec.get("unschedulable"))
        kept = ("cordon set by someone else",) if unschedulable and ANN_CORDONED not in annotations else ()
        if has_taint and has_condition and has_annotation and unschedulable:
            held = annotations[ANN_QUARANTINED]
            return _Plan(Status.ALREADY_QUARANTINED, f"already quarantined by rasd (ticket {held})", kept=kept)
        new_annotations: dict[str, Any] = {}
        patch_spec: dict[str, Any] = {}
        done: list[str] = []
        if not has_annotation:
            new_annotations[ANN_QUARANTINED] = ticket_id
        if not unschedulable:
            patch_spec["unschedulable"] = True
            new_annotations[ANN_CORDONED] = ticket_id
            done.append("cordoned")
        if not has_taint:
            taints.append({"key": TAINT_QUARANTINED, "value": label_value(ticket_id), "effect": "NoSchedule"})
            patch_spec["taints"] = taints
            done.append(f"tainted {TAINT_QUARANTINED}:NoSchedule")
        patch: dict[str, Any] | None = None
        if new_annotations or patch_spec:
            patch = {"metadata": {"annotations": new_annotations}} if new_annotations else {}
            if patch_spec:
                patch["spec"] = patch_spec
        status_patch = None
        if not has_condition:
            now = _rfc3339(self._clock())
            condition = {
                "type": CONDITION_TYPE,
                "status": "False",
                "reason": "RasdQuarantined",
                "message": f"{reason} (ticket {ticket_id})",
                "lastHeartbeatTime": now,
                "lastTransitionTime": now,
            }
            status_patch = {"status": {"conditions": [condition]}}
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
        has_condition = _condition(node, CONDITION_TYPE) is not None
        rasd_cordoned = ANN_CORDONED in annotations
        unschedulable = bool(spec.get("unschedulable"))
        kept = ("cordon set by someone else",) if unschedulable and not rasd_cordoned else ()
        if len(kept_taints) == len(taints) and not has_condition and ANN_QUARANTINED not in annotations:
            return _Plan(Status.NOT_QUARANTINED, "rasd holds no node quarantine here; nothing changed", kept=kept)
        done: list[str] = []
        patch: dict[str, Any] = {"metadata": {"annotations": {ANN_QUARANTINED: None, ANN_CORDONED: None}}}
        patch_spec: dict[str, Any] = {}
        if len(kept_taints) != len(taints):
            patch_spec["taints"] = kept_taints
            done.append(f"removed taint {TAINT_QUARANTINED}")
        if rasd_cordoned and unschedulable:
            patch_spec["unschedulable"] = False
            done.append("uncordoned")
        if patch_spec:
            patch["spec"] = patch_spec
        status_patch = None
        if has_condition:
            status_patch = {"status": {"conditions": [{"type": CONDITION_TYPE, "$patch": "delete"}]}}
            done.append(f"removed condition {CONDITION_TYPE}")
        if not done:
            done.append("removed annotations")
        return _Plan(Status.RELEASED, ", ".join(done) + f": {reason}", patch, status_patch, kept, "RasdReleased")

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
            posted = self._post_event(node, plan)
            return outcome(plan, event_posted=posted, applied=True)
        raise QuarantineUnavailableError(
            f"{operation} {scope} on node {node_id}: still conflicting after "
            f"{self._settings.conflict_retries} retries (the node keeps changing)"
        )

    def _read(self, node_id: str) -> dict[str, Any] | None:
        try:
            return json.loads(self._call(self._core.read_node, node_id, what="read node"))
        except _NotFound:
            return None

    def _call(self, method: Callable[..., Any], *args: Any, what: str, conflict: bool = False, **kwargs: Any) -> bytes:
        """Call the API; its answer's body as sent; failures mapped onto this module's errors (404, 409: private).

        The body is not turned into the client's model objects: a quarantine storm makes hundreds of
        calls a second, the models cost more CPU than the HTTP, and the plans read plain JSON anyway.
        A non-2xx answer still raises the client's ``ApiException``.
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


def _condition(node: dict[str, Any], kind: str) -> dict[str, Any] | None:
    for condition in (node.get("status") or {}).get("conditions") or []:
        if condition.get("type") == kind:
            return condition
    return None


def _int_quantity(value: Any) -> int:
    """An integer resource quantity ("8") as int; 0 when absent or not a plain integer."""
    try:
        return int(str(value))
    except (TypeError, ValueError):
        return 0


def _rfc3339(moment: dt.datetime) -> str:
    return moment.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _api_message(exc: Any) -> str:
    body = getattr(exc, "body", None) or ""
    if isinstance(body, bytes):
        body = body.decode(errors="replace")
    return str(body)[:300]


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
    # Connections kept open to the API server: as many as the remediation service makes adapter calls
    # at once (its ADAPTER_THREADS), or a storm opens and drops a connection for each call beyond them.
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
