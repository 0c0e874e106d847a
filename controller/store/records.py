"""Typed records of the rows a remediation transaction writes (`remediation.Commit`), and their SQL values.

The services build these; the store alone turns them into column values (`row()`), so a column
renamed or added is a change here and in `schema`, never a dict key spelt in a service. Frozen:
a record is what one decision wrote, never edited afterwards. A field left at its default is
written as the schema's default for that column.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any


def _columns(record: Any) -> dict[str, Any]:
    """A record's fields as column values (a shallow copy: nested documents are shared)."""
    return {field.name: getattr(record, field.name) for field in dataclasses.fields(record)}


@dataclasses.dataclass(frozen=True, slots=True)
class IncidentRecord:
    """An ``incidents`` row: a projection of a correlated incident, closed once its window forgot it."""

    incident_id: str
    node_id: str
    cause: str
    gpu_uuid: str = ""
    component: str = ""
    severity: int = 0
    state: str = "open"
    """"open" or "closed"."""
    opened_unix_ns: int = 0
    closed_unix_ns: int | None = None
    data: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    """The incident as the correlation core stores it (`correlate.Incident.to_dict`)."""

    def row(self) -> dict[str, Any]:
        """The row's column values."""
        return _columns(self)


@dataclasses.dataclass(frozen=True, slots=True)
class TicketRecord:
    """A ``repair_tickets`` row: a projection of a ticket in its node's ladder state."""

    ticket_id: str
    node_id: str
    state: str
    gpu_uuid: str = ""
    incident_id: str = ""
    rung: str = ""
    purpose: str = ""
    reason: str = ""
    opened_unix_ns: int = 0
    updated_unix_ns: int = 0
    closed: bool = False
    steps: list[str] = dataclasses.field(default_factory=list)

    def row(self) -> dict[str, Any]:
        """The row's column values."""
        return _columns(self)


@dataclasses.dataclass(frozen=True, slots=True)
class QuarantineRecord:
    """A quarantine to record (the store adds ``since_unix_ns``, and keeps one per target in force)."""

    node_id: str
    gpu_uuid: str = ""
    port: str = ""
    reason: str = ""
    source: str = "automation"
    """"automation" or the operator who asked."""

    @property
    def target(self) -> tuple[str, str, str]:
        """(node, GPU, port): what a quarantine in force is kept once for."""
        return self.node_id, self.gpu_uuid, self.port

    def row(self, since_unix_ns: int) -> dict[str, Any]:
        """The row's column values, in force since since_unix_ns."""
        return {**_columns(self), "since_unix_ns": since_unix_ns}


@dataclasses.dataclass(frozen=True, slots=True)
class ReleaseRecord:
    """A release of the quarantines in force on a node, GPU or port."""

    node_id: str
    gpu_uuid: str = ""
    port: str = ""
    reason: str = ""
    forced: bool = False


@dataclasses.dataclass(frozen=True, slots=True)
class RmaRecord:
    """An ``rma_tickets`` row, written once (a ticket that exists is left as it is)."""

    rma_id: str
    node_id: str
    gpu_uuid: str = ""
    state: str = "pending"
    reason: str = ""
    evidence: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    opened_unix_ns: int = 0

    def row(self) -> dict[str, Any]:
        """The row's column values."""
        return _columns(self)


@dataclasses.dataclass(frozen=True, slots=True)
class ValidationRecord:
    """A ``validations`` row, inserted or updated by id: the columns left None are not written.

    A run's row is written when it starts (verdict "running") and again when its verdict comes, each
    time with what is known then.
    """

    validation_id: str
    node_id: str
    gpu_uuid: str
    verdict: str
    started_unix_ns: int
    suite: str = ""
    command_id: str | None = None
    finished_unix_ns: int | None = None
    evidence: Mapping[str, Any] | None = None

    def values(self) -> dict[str, Any]:
        """The columns it sets besides the id (those not None)."""
        return {k: v for k, v in _columns(self).items() if v is not None and k != "validation_id"}


@dataclasses.dataclass(frozen=True, slots=True)
class AuditRecord:
    """An ``audit`` row: who did what to which target, why, and how it ended."""

    at_unix_ns: int
    actor: str
    action: str
    node_id: str = ""
    gpu_uuid: str = ""
    reason: str = ""
    outcome: str = ""
    details: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def row(self) -> dict[str, Any]:
        """The row's column values."""
        return _columns(self)


def audit_row(record: AuditRecord | Mapping[str, Any]) -> dict[str, Any]:
    """An audit record's column values; a mapping with the same keys is taken as it is.

    The power loop still writes its audit rows as mappings; they are stored alike.
    """
    return record.row() if isinstance(record, AuditRecord) else dict(record)


@dataclasses.dataclass(frozen=True, slots=True)
class CommandUpdate:
    """A change of an outbox row: its status, and the times and result that go with it (None: left as is).

    An update never touches a command whose status is already final (`remediation.FINAL_STATUSES`).
    """

    command_id: str
    status: str
    dispatched_unix_ns: int | None = None
    finished_unix_ns: int | None = None
    result: Mapping[str, Any] | None = None

    def values(self) -> dict[str, Any]:
        """The columns it sets (those not None)."""
        values: dict[str, Any] = {"status": self.status}
        if self.dispatched_unix_ns is not None:
            values["dispatched_unix_ns"] = self.dispatched_unix_ns
        if self.finished_unix_ns is not None:
            values["finished_unix_ns"] = self.finished_unix_ns
        if self.result is not None:
            values["result"] = self.result
        return values
