"""Node state operators can select: the ``rasd.io/state`` label and the ``RasdHealthy`` condition (pure).

What `KubernetesQuarantine` writes so that ``kubectl get nodes -l rasd.io/state=quarantined`` and
node-problem-detector style tooling see what rasd does:

- label ``rasd.io/state``: ``healthy`` (released, or never held), ``quarantined`` (a node quarantine
  holds it), ``repairing`` (a drain for a reset or reboot started; it stays until the release or an
  RMA), ``rma`` (an RMA is open for the node). A GPU or port quarantine leaves the node's label alone:
  the node stays schedulable.
- condition ``RasdHealthy`` in ``status.conditions``, NPD style: always present once rasd has seen
  the node, ``False`` while rasd holds the node, ``True`` after the release (never deleted), with a
  reason, a message and ``lastHeartbeatTime`` (each write, and `heartbeat`); ``lastTransitionTime``
  changes only when the status does.

Topology for the blast radius (`topology_of`): the Node's own labels, under the keys the settings
name (defaults: ``topology.kubernetes.io/zone`` → ``zone``, GPU Feature Discovery's
``nvidia.com/gpu.clique`` → ``nvlink_domain``, ``rasd.io/rack`` → ``rack``), which the ladder lays
over the agent's agent.toml labels (those stay the fallback outside Kubernetes).

Every function here is a pure function of the node as read and ``now`` (RFC 3339 text).
"""

from __future__ import annotations

from typing import Any

STATE_LABEL = "rasd.io/state"
"""Node label: the node's state as rasd sees it (`STATES`)."""
HEALTHY, QUARANTINED, REPAIRING, RMA = "healthy", "quarantined", "repairing", "rma"
STATES = (HEALTHY, QUARANTINED, REPAIRING, RMA)
"""Values of `STATE_LABEL`."""
HELD_STATES = frozenset({QUARANTINED, REPAIRING, RMA})
"""States in which rasd holds the node out of scheduling."""
CONDITION_TYPE = "RasdHealthy"
"""Node condition type rasd owns: False while rasd holds the node, True otherwise; never deleted."""


def state_of(node: dict[str, Any]) -> str:
    """The node's ``rasd.io/state`` label ("" when absent)."""
    return str(((node.get("metadata") or {}).get("labels") or {}).get(STATE_LABEL, ""))


def condition_of(node: dict[str, Any]) -> dict[str, Any] | None:
    """The node's ``RasdHealthy`` condition, or None."""
    for condition in (node.get("status") or {}).get("conditions") or []:
        if condition.get("type") == CONDITION_TYPE:
            return condition
    return None


def label_patch(state: str) -> dict[str, Any]:
    """The metadata part of a strategic-merge patch that sets the state label."""
    return {"labels": {STATE_LABEL: state}}


def condition_patch(node: dict[str, Any], *, healthy: bool, reason: str, message: str, now: str) -> dict[str, Any]:
    """A ``/status`` strategic-merge patch writing ``RasdHealthy`` (merged by ``type``).

    ``lastTransitionTime`` is ``now`` only when the status changes (or the condition is new), as
    the kubelet and NPD keep it; ``lastHeartbeatTime`` is always ``now``.
    """
    status = "True" if healthy else "False"
    previous = condition_of(node)
    transition = now if previous is None or previous.get("status") != status else previous.get("lastTransitionTime")
    condition = {
        "type": CONDITION_TYPE,
        "status": status,
        "reason": reason,
        "message": message[:1024],
        "lastHeartbeatTime": now,
        "lastTransitionTime": transition or now,
    }
    return {"status": {"conditions": [condition]}}


def heartbeat_patch(node: dict[str, Any], *, now: str) -> dict[str, Any]:
    """The periodic ``/status`` patch: refresh ``lastHeartbeatTime``, or make the condition present.

    A node rasd has never written gets ``True`` (reason ``RasdNoFault``) unless its label says rasd
    holds it; an existing condition keeps its status, reason and message.
    """
    previous = condition_of(node)
    if previous is None:
        held = state_of(node) in HELD_STATES
        return condition_patch(
            node,
            healthy=not held,
            reason="RasdHeld" if held else "RasdNoFault",
            message=f"rasd holds the node ({state_of(node)})" if held else "rasd has no open fault on this node",
            now=now,
        )
    return {"status": {"conditions": [{"type": CONDITION_TYPE, "lastHeartbeatTime": now}]}}


def topology_of(node: dict[str, Any], keys: dict[str, str]) -> dict[str, str]:
    """The blast-radius domains a Node's labels give: ``{domain: value}`` for each ``domain → label key``.

    Example: ``topology_of(node, {"nvlink_domain": "nvidia.com/gpu.clique"})`` →
    ``{"nvlink_domain": "<cluster uuid>.<clique id>"}``; a key that is empty or absent on the node gives nothing.
    """
    labels = (node.get("metadata") or {}).get("labels") or {}
    return {domain: str(labels[key]) for domain, key in keys.items() if key and labels.get(key)}
