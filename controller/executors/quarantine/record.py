"""The record-only quarantine adapter (the default): remembers what it was asked and changes nothing."""

from __future__ import annotations

import threading

from rasd.controller.executors.quarantine.adapter import QuarantineOutcome, Status


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
