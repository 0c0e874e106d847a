"""Draining a node before a reset or reboot: its pods evicted through the Eviction API, PDBs honoured.

The ladder decides the drain (``actions.DrainNode``: which pods, by when); `drain` carries it out
with three edges it is given (list the node's pods, evict one, the clock and a sleep), so the loop
is tested without a server and the adapter (`KubernetesQuarantine.drain_node`) only does the I/O.

Which pods (`pods_to_evict`): not finished (``Succeeded``/``Failed``), not owned by a DaemonSet (its
controller would put it straight back, and ``kubectl drain`` leaves them too), not a static (mirror)
pod; with ``pods="gpu"`` only those whose containers request or limit the GPU resource
(``nvidia.com/gpu``), with ``pods="all"`` every other one. The API server cannot say which pod holds
which GPU (the kubelet's pod-resources API can, on the node), so a GPU reset drains every GPU pod of
its node.

How (`drain`): a ``policy/v1`` Eviction per pod. 2xx: the pod is on its way out; 404: already gone;
429: a PodDisruptionBudget refuses for now (its message is kept); the loop re-lists the node's pods
and retries with an exponential backoff (``backoff_s`` doubling up to ``backoff_max_s``) until none
is left or the deadline passes. It never changes a cordon, a taint or a PDB: the quarantine before it
cordoned the node (or found it cordoned by someone else and left that alone). A deadline that passes
is a `DrainBlockedError` naming the pods still there and why, which the ladder turns into a ticket
reason and a notice.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable, Iterable
from typing import Any

MIRROR_ANNOTATION = "kubernetes.io/config.mirror"
"""A static pod's mirror carries this annotation; the API server cannot evict it for real."""


class DrainBlockedError(Exception):
    """Pods were still on the node at the drain's deadline (a PDB refused, or they did not terminate)."""


class Eviction(enum.StrEnum):
    """How the API server answered one eviction."""

    ACCEPTED = "accepted"
    GONE = "gone"
    BLOCKED = "blocked"
    """429: a PodDisruptionBudget allows no disruption now."""


@dataclasses.dataclass(frozen=True)
class DrainReport:
    """What a finished drain did, for the action's result message."""

    node_id: str
    evicted: tuple[str, ...]
    """``namespace/name`` of the pods evicted."""
    refusals: int
    """429 answers on the way (each retried)."""
    waited_s: float

    def __str__(self) -> str:
        names = ", ".join(self.evicted[:10]) + (f" and {len(self.evicted) - 10} more" if len(self.evicted) > 10 else "")
        pods = f"evicted {len(self.evicted)} pod(s) ({names})" if self.evicted else "no pod to evict"
        refused = f" after {self.refusals} PDB refusal(s)" if self.refusals else ""
        return f"drained node {self.node_id}: {pods}{refused} in {self.waited_s:.1f}s"


def pod_key(pod: dict[str, Any]) -> str:
    """``namespace/name`` of a pod."""
    meta = pod.get("metadata") or {}
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


def _requests_resource(pod: dict[str, Any], resource: str) -> bool:
    spec = pod.get("spec") or {}
    for container in [*(spec.get("containers") or []), *(spec.get("initContainers") or [])]:
        wanted = container.get("resources") or {}
        for part in ("requests", "limits"):
            if str((wanted.get(part) or {}).get(resource, "0")).strip() not in ("", "0"):
                return True
    return False


def pods_to_evict(pods: Iterable[dict[str, Any]], *, scope: str, gpu_resource: str) -> list[dict[str, Any]]:
    """The pods a drain evicts (see the module docstring), in ``namespace/name`` order."""
    chosen = []
    for pod in pods:
        meta = pod.get("metadata") or {}
        if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            continue
        if MIRROR_ANNOTATION in (meta.get("annotations") or {}):
            continue
        if any(ref.get("kind") == "DaemonSet" for ref in meta.get("ownerReferences") or []):
            continue
        if scope == "gpu" and not _requests_resource(pod, gpu_resource):
            continue
        chosen.append(pod)
    return sorted(chosen, key=pod_key)


def eviction_body(pod: dict[str, Any]) -> dict[str, Any]:
    """A ``policy/v1`` Eviction of the pod (its own grace period; preconditioned on its uid)."""
    meta = pod.get("metadata") or {}
    body: dict[str, Any] = {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": meta.get("name", ""), "namespace": meta.get("namespace", "")},
    }
    if meta.get("uid"):
        body["deleteOptions"] = {"preconditions": {"uid": meta["uid"]}}
    return body


def refusal_message(status: dict[str, Any]) -> str:
    """The PDB's words from a 429 Status: its causes' messages (which name the budget), else its message."""
    causes = [c.get("message", "") for c in (status.get("details") or {}).get("causes") or [] if c.get("message")]
    return "; ".join(causes) or str(status.get("message") or "too many requests")


@dataclasses.dataclass(frozen=True)
class DrainEdges:
    """What `drain` calls: the API (through the adapter) and the clock."""

    list_pods: Callable[[str], list[dict[str, Any]]]
    """The node's pods as the API server lists them (``spec.nodeName`` field selector)."""
    evict: Callable[[dict[str, Any]], tuple[Eviction, str]]
    """One eviction: its answer and, for BLOCKED, the PDB's message."""
    monotonic: Callable[[], float]
    sleep: Callable[[float], None]


def drain(
    node_id: str,
    *,
    scope: str,
    gpu_resource: str,
    deadline_s: float,
    backoff_s: float,
    backoff_max_s: float,
    edges: DrainEdges,
) -> DrainReport:
    """Evict the node's chosen pods until none is left; `DrainBlockedError` at the deadline.

    Args:
        node_id: the node.
        scope: "gpu" (pods using the GPU resource) or "all" (every pod but DaemonSets' and mirrors).
        gpu_resource: the extended resource name of a GPU.
        deadline_s: how long, from now, the drain may take.
        backoff_s: the first wait after a refusal (or a pod still terminating); doubles each time.
        backoff_max_s: the longest wait.
        edges: the API and the clock.

    Returns:
        What was evicted.

    Raises:
        DrainBlockedError: pods remain at the deadline; the message names them and the PDB's words.
        Whatever ``edges`` raise (the adapter's unavailable or rejected errors).
    """
    start = edges.monotonic()
    evicted: list[str] = []
    blocked: dict[str, str] = {}
    refusals = 0
    wait_s = backoff_s
    while True:
        remaining = pods_to_evict(edges.list_pods(node_id), scope=scope, gpu_resource=gpu_resource)
        if not remaining:
            return DrainReport(node_id, tuple(evicted), refusals, edges.monotonic() - start)
        left_s = deadline_s - (edges.monotonic() - start)
        if left_s <= 0:
            break
        blocked = {}
        for pod in remaining:
            key = pod_key(pod)
            if key in evicted and (pod.get("metadata") or {}).get("deletionTimestamp"):
                continue  # accepted earlier and terminating: wait for it, do not evict again
            answer, message = edges.evict(pod)
            if answer is Eviction.BLOCKED:
                refusals += 1
                blocked[key] = message
            elif key not in evicted:
                evicted.append(key)
        edges.sleep(min(wait_s, left_s))
        wait_s = min(wait_s * 2, backoff_max_s)
    keys = [pod_key(p) for p in remaining]
    why = "; ".join(f"{key}: {blocked[key]}" for key in keys if key in blocked)
    still = ", ".join(keys[:10]) + (" ..." if len(keys) > 10 else "")
    raise DrainBlockedError(
        f"drain of node {node_id} not finished after {deadline_s:g}s: {len(keys)} pod(s) left ({still})"
        + (f"; refused by a disruption budget: {why}" if why else "; still terminating")
    )
