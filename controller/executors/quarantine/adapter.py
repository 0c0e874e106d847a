"""What every quarantine adapter shares: the `QuarantineAdapter` protocol, its `QuarantineOutcome`, the errors.

Expected results ("node not found", "already quarantined") are outcomes; failures the caller can retry
raise `QuarantineUnavailableError`, and refusals that a retry cannot fix (RBAC, validation) raise
`QuarantineRejectedError`. Bad settings raise `QuarantineSettingsError` naming the key
(`require`).
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any, Protocol, runtime_checkable

import structlog

from rasd.common import settings as settings_check

log = structlog.get_logger("rasd.controller")


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
    """Kubernetes: whether the Event was created (None: no Event was due, or it is posted after the call)."""

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


def require(ok: bool, path: str, message: str, value: Any) -> None:
    """Raise `QuarantineSettingsError` naming ``path`` unless ``ok``."""
    settings_check.require(ok, path, message, value, QuarantineSettingsError)


def split_items(value: str | None) -> set[str]:
    """The items of a comma-separated list (an annotation value, Slurm's holds); empty items dropped."""
    return {item for item in (value or "").split(",") if item}


def log_executed(kind: str, outcome: QuarantineOutcome) -> None:
    """The audit line of a quarantine or release the adapter carried out (kind: the action's)."""
    log.info(
        "quarantine_executed",
        adapter=outcome.adapter,
        kind=kind,
        node=outcome.node_id,
        target=outcome.target,
        ticket=outcome.ticket_id,
        status=str(outcome.status),
        detail=outcome.detail,
    )


def log_drained(node_id: str, ticket_id: str, report: Any) -> None:
    """The audit line of a drain the adapter carried out."""
    log.info("drain_executed", node=node_id, ticket=ticket_id, detail=str(report))
