"""Quarantine executors: take a node, a GPU or an InfiniBand port out of scheduling, and give it back.

The pure core (`rasd.controller.core.remediation.actions`) decides *that* something is quarantined
(`QuarantineNode`, `QuarantineGpu`, `QuarantinePort`) or released (`Release`); this module carries
it out on the cluster's scheduler through one `QuarantineAdapter`:

- `RecordOnlyQuarantine` (the default): remembers what it was asked and changes nothing.
- `KubernetesQuarantine`: cordon, taint, node condition, annotations and Events, through the official
  ``kubernetes`` client.
- `SlurmQuarantine`: ``scontrol update nodename=<n> state=drain|resume``.

Every call is idempotent: quarantining twice, or releasing something that is not quarantined, changes
nothing and says so in the returned `QuarantineOutcome`. Expected results ("node not found",
"already quarantined") are outcomes; failures the caller can retry raise
`QuarantineUnavailableError`, and refusals that a retry cannot fix (RBAC, validation) raise
`QuarantineRejectedError`. The calls block (HTTP or a subprocess): the service runs them in a thread
(`executors` gives it the ``kind → callable`` table it takes).

**Never undo someone else's work.** A cordon or a Slurm drain that rasd did not set is never lifted
by a rasd release (NVSentinel #1424: "don't uncordon nodes cordoned by others").

Kubernetes
----------
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

Slurm
-----
Slurm drains whole nodes only. A GPU or port quarantine **falls back to a node drain** (the outcome's
``applied_scope`` is ``"node"``); per-GPU marking through ``gres`` is not implemented. Because one
drain can hold several quarantines, rasd writes what it holds into its drain reason::

    rasd: <reason> (<ticket>) {holds=node,gpu:GPU-1,port:mlx5_0/1}

and a release removes one hold; the node is resumed only when the last one goes. rasd recognises its
own drain by the ``rasd: `` prefix of ``Reason=`` in ``scontrol show node``. A drain set by someone
else is never resumed: if rasd quarantines a node someone already drained, their reason is kept in
rasd's (``{prior=<their reason>}``) and a release restores it (the node stays drained) instead of
resuming.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import hashlib
import json
import re
import shutil
import subprocess
import threading
import uuid
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import structlog

from rasd.common import settings as settings_check
from rasd.controller.core.remediation import actions

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
SLURM_REASON_PREFIX = "rasd: "
"""How a Slurm drain reason written by rasd starts."""


class QuarantineError(Exception):
    """Base of the quarantine adapters' errors."""


class QuarantineUnavailableError(QuarantineError):
    """The scheduler's API could not be reached or kept conflicting; retrying later may work."""


class QuarantineRejectedError(QuarantineError):
    """The scheduler refused the change (permissions, validation); a retry will not help."""


class QuarantineSettingsError(ValueError):
    """Bad quarantine settings; the message starts with the offending key's path."""


class Status(enum.StrEnum):
    """What a quarantine or release call found and did."""

    QUARANTINED = "quarantined"
    """It was not quarantined; now it is."""
    ALREADY_QUARANTINED = "already_quarantined"
    """Repeat: it was already quarantined by rasd; nothing changed."""
    RELEASED = "released"
    """rasd's quarantine was removed."""
    NOT_QUARANTINED = "not_quarantined"
    """Repeat or stray release: rasd held no quarantine on it; nothing changed."""
    NODE_NOT_FOUND = "node_not_found"
    """The scheduler does not know the node (deleted, or a wrong name); nothing changed."""


@dataclasses.dataclass(frozen=True)
class QuarantineOutcome:
    """What one adapter call did, for the audit log and the action result message."""

    adapter: str
    """"record", "kubernetes" or "slurm"."""
    operation: str
    """"quarantine" or "release"."""
    scope: str
    """What was asked for: "node", "gpu" or "port"."""
    node_id: str
    target: str
    """The GPU UUID or port name; "" for a node."""
    ticket_id: str
    status: Status
    detail: str
    """One sentence: what changed or why nothing did."""
    applied_scope: str = ""
    """What the scheduler actually acted on (Slurm: always "node"); "" when nothing was applied."""
    recorded_only: bool = False
    """True for the record-only adapter: rasd noted it, nothing on the cluster changed."""
    kept: tuple[str, ...] = ()
    """Things left in place because they belong to someone else (another cordon or drain)."""
    event_posted: bool | None = None
    """Kubernetes: whether the Event was created (None: no Event was due)."""

    @property
    def changed(self) -> bool:
        """True when the cluster's scheduling state was changed by this call."""
        return not self.recorded_only and self.status in (Status.QUARANTINED, Status.RELEASED)

    def __str__(self) -> str:
        where = self.node_id + (f"/{self.target}" if self.target else "")
        text = f"{self.adapter}: {self.operation} {self.scope} {where}: {self.status}: {self.detail}"
        if self.kept:
            text += f" (kept: {'; '.join(self.kept)})"
        return text


@runtime_checkable
class QuarantineAdapter(Protocol):
    """Takes nodes, GPUs and ports out of scheduling and gives them back; every call is idempotent."""

    name: str
    """Short adapter name used in outcomes and logs."""

    def quarantine_node(self, node_id: str, *, reason: str, ticket_id: str) -> QuarantineOutcome:
        """Take the whole node out of scheduling."""
        ...

    def quarantine_gpu(self, node_id: str, gpu_uuid: str, *, reason: str, ticket_id: str) -> QuarantineOutcome:
        """Take one GPU out of scheduling; the node's other GPUs stay schedulable where possible."""
        ...

    def quarantine_port(self, node_id: str, port: str, *, reason: str, ticket_id: str) -> QuarantineOutcome:
        """Isolate one InfiniBand port ("mlx5_0/1") where the scheduler can express it."""
        ...

    def release_node(self, node_id: str, *, reason: str, ticket_id: str) -> QuarantineOutcome:
        """Undo rasd's node quarantine (never someone else's cordon or drain)."""
        ...

    def release_gpu(self, node_id: str, gpu_uuid: str, *, reason: str, ticket_id: str) -> QuarantineOutcome:
        """Undo rasd's quarantine of one GPU."""
        ...

    def release_port(self, node_id: str, port: str, *, reason: str, ticket_id: str) -> QuarantineOutcome:
        """Undo rasd's quarantine of one port."""
        ...

    def close(self) -> None:
        """Release connections; the adapter is not used afterwards."""
        ...


# --------------------------------------------------------------------------------------------
# Dispatch from the core's actions


def execute(adapter: QuarantineAdapter, action: actions.Action) -> QuarantineOutcome:
    """Carry out one quarantine or release action with ``adapter``.

    Args:
        adapter: the configured adapter.
        action: a `QuarantineNode`, `QuarantineGpu`, `QuarantinePort` or `Release`.

    Returns:
        The adapter's outcome.

    Raises:
        TypeError: the action is not a quarantine or a release.
        QuarantineUnavailableError: retry later.
        QuarantineRejectedError: the scheduler refused.
    """
    common = {"reason": action.reason, "ticket_id": action.ticket_id}
    if isinstance(action, actions.QuarantineNode):
        return adapter.quarantine_node(action.node_id, **common)
    if isinstance(action, actions.QuarantineGpu):
        return adapter.quarantine_gpu(action.node_id, action.gpu_uuid, **common)
    if isinstance(action, actions.QuarantinePort):
        return adapter.quarantine_port(action.node_id, action.ib_port, **common)
    if isinstance(action, actions.Release):
        if action.gpu_uuid:
            return adapter.release_gpu(action.node_id, action.gpu_uuid, **common)
        if action.ib_port:
            return adapter.release_port(action.node_id, action.ib_port, **common)
        return adapter.release_node(action.node_id, **common)
    raise TypeError(f"not a quarantine or release action: {action.kind}")


def executors(adapter: QuarantineAdapter) -> dict[str, Callable[[actions.Action], QuarantineOutcome]]:
    """The ``kind → callable`` table the remediation service takes for controller-side actions.

    Example: ``RemediationService(..., executors={**quarantine.executors(adapter), ...})``; each
    callable returns a `QuarantineOutcome` whose ``str()`` is the action's result message.
    """

    def run(action: actions.Action) -> QuarantineOutcome:
        outcome = execute(adapter, action)
        log.info(
            "quarantine_executed",
            adapter=outcome.adapter,
            kind=action.kind,
            node=outcome.node_id,
            target=outcome.target,
            ticket=outcome.ticket_id,
            status=str(outcome.status),
            detail=outcome.detail,
        )
        return outcome

    # Whether a call waits on another system: the service calls one that does not (record only)
    # with the decision (or in its dispatch round), without a thread and without a commit of its own
    # for the outcome.
    run.blocking = getattr(adapter, "blocking", True)  # type: ignore[attr-defined]
    kinds = (actions.QuarantineNode.kind, actions.QuarantineGpu.kind, actions.QuarantinePort.kind, actions.Release.kind)
    return dict.fromkeys(kinds, run)


# --------------------------------------------------------------------------------------------
# Record only


class RecordOnlyQuarantine:
    """Remembers quarantines in memory and changes nothing on the cluster (the default adapter).

    Outcomes carry ``recorded_only=True``. The memory is per process: the store is the durable record.
    """

    name = "record"
    blocking = False
    """Its calls wait on nothing: the remediation service makes them in the transaction of their decision."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: dict[tuple[str, str, str], str] = {}  # (scope, node, target) -> ticket

    def _quarantine(self, scope: str, node_id: str, target: str, reason: str, ticket_id: str) -> QuarantineOutcome:
        with self._lock:
            held_by = self._held.get((scope, node_id, target))
            if held_by is None:
                self._held[(scope, node_id, target)] = ticket_id
        if held_by is None:
            status, detail = Status.QUARANTINED, f"recorded only, nothing changed on the cluster: {reason}"
        else:
            status, detail = Status.ALREADY_QUARANTINED, f"already recorded (ticket {held_by}); nothing changed"
        return QuarantineOutcome(
            self.name, "quarantine", scope, node_id, target, ticket_id, status, detail, recorded_only=True
        )

    def _release(self, scope: str, node_id: str, target: str, reason: str, ticket_id: str) -> QuarantineOutcome:
        with self._lock:
            held_by = self._held.pop((scope, node_id, target), None)
        if held_by is None:
            status, detail = Status.NOT_QUARANTINED, "no recorded quarantine; nothing changed"
        else:
            status, detail = Status.RELEASED, f"release recorded only (was ticket {held_by}): {reason}"
        return QuarantineOutcome(
            self.name, "release", scope, node_id, target, ticket_id, status, detail, recorded_only=True
        )

    def quarantine_node(self, node_id: str, *, reason: str, ticket_id: str) -> QuarantineOutcome:
        """Record a node quarantine."""
        return self._quarantine("node", node_id, "", reason, ticket_id)

    def quarantine_gpu(self, node_id: str, gpu_uuid: str, *, reason: str, ticket_id: str) -> QuarantineOutcome:
        """Record a GPU quarantine."""
        return self._quarantine("gpu", node_id, gpu_uuid, reason, ticket_id)

    def quarantine_port(self, node_id: str, port: str, *, reason: str, ticket_id: str) -> QuarantineOutcome:
        """Record a port quarantine."""
        return self._quarantine("port", node_id, port, reason, ticket_id)

    def release_node(self, node_id: str, *, reason: str, ticket_id: str) -> QuarantineOutcome:
        """Record a node release."""
        return self._release("node", node_id, "", reason, ticket_id)

    def release_gpu(self, node_id: str, gpu_uuid: str, *, reason: str, ticket_id: str) -> QuarantineOutcome:
        """Record a GPU release."""
        return self._release("gpu", node_id, gpu_uuid, reason, ticket_id)

    def release_port(self, node_id: str, port: str, *, reason: str, ticket_id: str) -> QuarantineOutcome:
        """Record a port release."""
        return self._release("port", node_id, port, reason, ticket_id)

    def close(self) -> None:
        """Nothing to close."""


# --------------------------------------------------------------------------------------------
# Kubernetes


API_CONNECTIONS = 16
"""Connections the Kubernetes client keeps open to the API server (`_kubernetes_client`)."""


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
        _require(self.request_timeout_s > 0, f"{prefix}request_timeout_s", "must be > 0", self.request_timeout_s)
        _require(self.conflict_retries >= 0, f"{prefix}conflict_retries", "must be >= 0", self.conflict_retries)
        _require(bool(self.event_namespace), f"{prefix}event_namespace", "must not be empty", self.event_namespace)
        _require(bool(self.gpu_resource), f"{prefix}gpu_resource", "must not be empty", self.gpu_resource)
        _require(
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


def _split(value: str | None) -> set[str]:
    return {item for item in (value or "").split(",") if item}


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
        gpus = _split(annotations.get(ANN_GPUS))
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
        ports = _split(annotations.get(ANN_PORTS))
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


@dataclasses.dataclass(frozen=True)
class SlurmSettings:
    """Where scontrol is and how long it may take."""

    scontrol: str = "scontrol"
    """The scontrol program: a path, or a name looked up on PATH."""
    timeout_s: float = 30.0
    """Timeout of one scontrol run."""

    def validate(self, prefix: str) -> None:
        """Check values; raise `QuarantineSettingsError` naming the key."""
        _require(bool(self.scontrol), f"{prefix}scontrol", "must not be empty", self.scontrol)
        _require(self.timeout_s > 0, f"{prefix}timeout_s", "must be > 0", self.timeout_s)


@dataclasses.dataclass(frozen=True)
class _SlurmNode:
    state: str
    reason: str
    """``Reason=`` without Slurm's trailing ``[user@time]``; "" when none."""

    @property
    def drained(self) -> bool:
        return "DRAIN" in self.state.upper()

    @property
    def ours(self) -> bool:
        return self.drained and self.reason.startswith(SLURM_REASON_PREFIX)


_HOLDS = re.compile(r"\{holds=([^}]*)\}")
_PRIOR = re.compile(r"\{prior=(.*)\}\s*$")
_SLURM_STAMP = re.compile(r"\s*\[[^\[\]]*@[^\[\]]*\]\s*$")


def slurm_reason(reason: str, ticket_id: str, holds: set[str], prior: str = "") -> str:
    """The drain reason rasd writes, e.g. ``rasd: xid 79 (t1) {holds=gpu:GPU-1,node}``.

    Args:
        reason: the latest quarantine's reason (braces are replaced: they delimit rasd's fields).
        ticket_id: the latest quarantine's ticket.
        holds: what rasd holds with this drain ("node", "gpu:<uuid>", "port:<name>").
        prior: someone else's drain reason that rasd's replaced, restored on release.

    Returns:
        One line for ``scontrol update ... reason=<it>``.
    """
    clean = " ".join(reason.replace("{", "(").replace("}", ")").split())
    text = f"{SLURM_REASON_PREFIX}{clean} ({ticket_id}) {{holds={','.join(sorted(holds))}}}"
    if prior:
        text += f" {{prior={' '.join(prior.split())}}}"
    return text


class SlurmQuarantine:
    """Quarantine by draining Slurm nodes with ``scontrol``; GPUs and ports fall back to a node drain.

    Args:
        settings: the scontrol program and timeout.
    """

    name = "slurm"

    def __init__(self, settings: SlurmSettings | None = None) -> None:
        self._settings = settings or SlurmSettings()
        # Read-modify-write of a drain reason: serialise rasd's own calls (one controller leader).
        self._lock = threading.Lock()

    def quarantine_node(self, node_id: str, *, reason: str, ticket_id: str) -> QuarantineOutcome:
        """Drain the node (hold "node")."""
        return self._hold("node", node_id, "", "node", reason, ticket_id)

    def quarantine_gpu(self, node_id: str, gpu_uuid: str, *, reason: str, ticket_id: str) -> QuarantineOutcome:
        """Drain the whole node for one GPU (Slurm drains nodes; no per-GPU gres marking)."""
        return self._hold("gpu", node_id, gpu_uuid, f"gpu:{gpu_uuid}", reason, ticket_id)

    def quarantine_port(self, node_id: str, port: str, *, reason: str, ticket_id: str) -> QuarantineOutcome:
        """Drain the whole node for one port (Slurm has no port scheduling)."""
        return self._hold("port", node_id, port, f"port:{port}", reason, ticket_id)

    def release_node(self, node_id: str, *, reason: str, ticket_id: str) -> QuarantineOutcome:
        """Drop the "node" hold; resume only when rasd's drain holds nothing else."""
        return self._unhold("node", node_id, "", "node", reason, ticket_id)

    def release_gpu(self, node_id: str, gpu_uuid: str, *, reason: str, ticket_id: str) -> QuarantineOutcome:
        """Drop the GPU's hold; resume only when rasd's drain holds nothing else."""
        return self._unhold("gpu", node_id, gpu_uuid, f"gpu:{gpu_uuid}", reason, ticket_id)

    def release_port(self, node_id: str, port: str, *, reason: str, ticket_id: str) -> QuarantineOutcome:
        """Drop the port's hold; resume only when rasd's drain holds nothing else."""
        return self._unhold("port", node_id, port, f"port:{port}", reason, ticket_id)

    def close(self) -> None:
        """Nothing to close."""

    # ---- internals ------------------------------------------------------------------------

    def _hold(self, scope: str, node_id: str, target: str, hold: str, reason: str, ticket_id: str) -> QuarantineOutcome:
        def outcome(status: Status, detail: str, *, applied: bool = False, kept: tuple[str, ...] = ()):
            return QuarantineOutcome(
                self.name, "quarantine", scope, node_id, target, ticket_id, status, detail,
                applied_scope="node" if applied else "", kept=kept,
            )  # fmt: skip

        fallback = "" if scope == "node" else " (Slurm drains whole nodes: node drain for this " + scope + ")"
        with self._lock:
            node = self._show(node_id)
            if node is None:
                return outcome(Status.NODE_NOT_FOUND, "scontrol does not know the node; nothing changed")
            if node.ours:
                holds = _holds(node.reason)
                if hold in holds:
                    return outcome(Status.ALREADY_QUARANTINED, f"already drained by rasd ({node.reason})")
                prior = _prior(node.reason)
                self._update(node_id, "drain", slurm_reason(reason, ticket_id, holds | {hold}, prior))
                return outcome(Status.QUARANTINED, f"added to rasd's drain{fallback}: {reason}", applied=True)
            prior = node.reason if node.drained else ""
            self._update(node_id, "drain", slurm_reason(reason, ticket_id, {hold}, prior))
            if prior:
                kept = (f"drain set by someone else ({prior}); restored on release",)
                return outcome(Status.QUARANTINED, f"drained by rasd{fallback}: {reason}", applied=True, kept=kept)
            return outcome(Status.QUARANTINED, f"drained{fallback}: {reason}", applied=True)

    def _unhold(
        self, scope: str, node_id: str, target: str, hold: str, reason: str, ticket_id: str
    ) -> QuarantineOutcome:
        def outcome(status: Status, detail: str, *, applied: bool = False, kept: tuple[str, ...] = ()):
            return QuarantineOutcome(
                self.name, "release", scope, node_id, target, ticket_id, status, detail,
                applied_scope="node" if applied else "", kept=kept,
            )  # fmt: skip

        with self._lock:
            node = self._show(node_id)
            if node is None:
                return outcome(Status.NODE_NOT_FOUND, "scontrol does not know the node; nothing changed")
            if not node.ours:
                kept = (f"drain set by someone else ({node.reason})",) if node.drained else ()
                return outcome(Status.NOT_QUARANTINED, "rasd holds no drain on this node; nothing changed", kept=kept)
            holds = _holds(node.reason)
            if hold not in holds:
                return outcome(
                    Status.NOT_QUARANTINED, f"rasd's drain does not hold {hold} ({node.reason}); nothing changed"
                )
            rest = holds - {hold}
            prior = _prior(node.reason)
            if rest:
                self._update(node_id, "drain", _replace_holds(node.reason, rest))
                return outcome(
                    Status.RELEASED,
                    f"node stays drained, rasd still holds {','.join(sorted(rest))}: {reason}",
                    applied=True,
                )
            if prior:
                self._update(node_id, "drain", prior)
                kept = (f"drain set by someone else ({prior})",)
                return outcome(Status.RELEASED, f"restored the earlier drain reason: {reason}", applied=True, kept=kept)
            self._update(node_id, "resume", "")
            return outcome(Status.RELEASED, f"resumed: {reason}", applied=True)

    def _run(self, *argv: str) -> subprocess.CompletedProcess[str]:
        program = self._settings.scontrol
        resolved = program if "/" in program else shutil.which(program)
        if resolved is None:
            raise QuarantineUnavailableError(f"scontrol program {program!r} not found on PATH")
        try:
            return subprocess.run(
                [resolved, *argv], capture_output=True, text=True, timeout=self._settings.timeout_s, check=False
            )
        except subprocess.TimeoutExpired as exc:
            raise QuarantineUnavailableError(
                f"scontrol {argv[0]} timed out after {self._settings.timeout_s} s"
            ) from exc
        except OSError as exc:
            raise QuarantineUnavailableError(f"cannot run scontrol ({resolved}): {exc}") from exc

    def _show(self, node_id: str) -> _SlurmNode | None:
        done = self._run("show", "node", node_id)
        text = done.stdout + done.stderr
        if done.returncode != 0:
            if "not found" in text.lower() or "invalid node name" in text.lower():
                return None
            raise QuarantineUnavailableError(f"scontrol show node {node_id} failed ({done.returncode}): {text.strip()}")
        return _parse_show(text)

    def _update(self, node_id: str, state: str, reason: str) -> None:
        argv = ["update", f"nodename={node_id}", f"state={state}"]
        if reason:
            argv.append(f"reason={reason}")
        done = self._run(*argv)
        if done.returncode != 0:
            text = (done.stdout + done.stderr).strip()
            if any(word in text.lower() for word in ("invalid", "denied", "not authorized")):
                raise QuarantineRejectedError(f"scontrol update {node_id} state={state} refused: {text}")
            raise QuarantineUnavailableError(
                f"scontrol update {node_id} state={state} failed ({done.returncode}): {text}"
            )


def _parse_show(text: str) -> _SlurmNode:
    """Parse ``scontrol show node``: ``State=`` is a token; ``Reason=`` runs to the end of its line."""
    state = ""
    reason = ""
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("Reason="):
            reason = _SLURM_STAMP.sub("", stripped[len("Reason=") :]).strip()
            continue
        for token in stripped.split():
            if token.startswith("State="):
                state = token[len("State=") :]
    if reason in ("(null)", "None"):
        reason = ""
    return _SlurmNode(state, reason)


def _holds(reason: str) -> set[str]:
    found = _HOLDS.search(reason)
    return _split(found.group(1)) if found else {"node"}


def _prior(reason: str) -> str:
    found = _PRIOR.search(reason)
    return found.group(1) if found else ""


def _replace_holds(reason: str, holds: set[str]) -> str:
    value = ",".join(sorted(holds))
    if _HOLDS.search(reason):
        return _HOLDS.sub(lambda _m: f"{{holds={value}}}", reason, count=1)
    return f"{reason} {{holds={value}}}"


# --------------------------------------------------------------------------------------------
# Settings


def _require(ok: bool, path: str, message: str, value: Any) -> None:
    settings_check.require(ok, path, message, value, QuarantineSettingsError)


def _build(cls: type[Any], data: Any, prefix: str) -> Any:
    """A settings dataclass from a mapping; unknown keys and wrong types name the key."""
    settings = cls(**settings_check.typed_values(cls, data, prefix, QuarantineSettingsError))
    settings.validate(prefix)
    return settings


ADAPTERS = ("record", "kubernetes", "slurm")
"""Names accepted by ``adapter`` in the quarantine settings."""


def open_quarantine(settings: Mapping[str, Any], *, prefix: str = "quarantine.") -> QuarantineAdapter:
    """Build the configured adapter from the ``[quarantine]`` settings table.

    Example::

        open_quarantine({"adapter": "kubernetes", "kubernetes": {"event_namespace": "rasd"}})
        open_quarantine({"adapter": "slurm", "slurm": {"scontrol": "/usr/bin/scontrol"}})
        open_quarantine({})  # record only

    Args:
        settings: ``adapter`` ("record" by default, "kubernetes" or "slurm") and one sub-table per
            adapter (`KubernetesSettings`, `SlurmSettings` fields).
        prefix: key path prefix for error messages.

    Returns:
        The adapter. A Kubernetes adapter loads ``host`` if set, else the in-cluster service account,
        else ``kubeconfig``.

    Raises:
        QuarantineSettingsError: an unknown key or a bad value, named by its path.
    """
    if not isinstance(settings, Mapping):
        raise QuarantineSettingsError(f"{prefix.rstrip('.')}: expected a table, got {settings!r}")
    known = {"adapter", *ADAPTERS[1:]}
    for key in settings:
        if key not in known:
            raise QuarantineSettingsError(f"{prefix}{key}: unknown setting (known: {', '.join(sorted(known))})")
    adapter = settings.get("adapter", "record")
    if adapter not in ADAPTERS:
        raise QuarantineSettingsError(f"{prefix}adapter: must be one of {', '.join(ADAPTERS)}, got {adapter!r}")
    k8s = _build(KubernetesSettings, settings.get("kubernetes", {}), f"{prefix}kubernetes.")
    slurm = _build(SlurmSettings, settings.get("slurm", {}), f"{prefix}slurm.")
    if adapter == "kubernetes":
        return KubernetesQuarantine(_kubernetes_client(k8s, f"{prefix}kubernetes."), k8s)
    if adapter == "slurm":
        return SlurmQuarantine(slurm)
    return RecordOnlyQuarantine()


def _kubernetes_client(settings: KubernetesSettings, prefix: str) -> kubernetes.client.ApiClient:
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
