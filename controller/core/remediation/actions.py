"""Remediation effects as data: what the controller wants done, never how.

Decision functions (``escalation``, ``blast_radius``) return these values; the service persists
them in the outbox with the decision, and executors (agent commands, Kubernetes cordon/taint,
Slurm drain, RMA export, notifications) carry them out. Each action is a frozen dataclass named
as a verb.

Idempotency: every action belongs to a repair ticket and a step of that ticket, and its
``command_id`` is a UUID derived (uuid5, a hash) from ``"<ticket_id>/<step>/<kind>"``. A decision
replayed from the same stored state therefore produces the same ids, so the outbox and the agent
can drop repeats.

Scope words used across the core: an action's ``node_id`` is always set; ``gpu_uuid`` empty means
the whole node; ``ib_port`` ("mlx5_0/1") names one InfiniBand port.

Pure: values only, no I/O.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import uuid
from collections.abc import Mapping
from typing import Any, ClassVar

_COMMAND_NAMESPACE = uuid.UUID("6f1d3c2e-6a8b-5b1e-9a57-7261736400c1")
"""Namespace for command ids (fixed forever: changing it changes every id)."""
_COMMAND_NAMESPACE_BYTES = _COMMAND_NAMESPACE.bytes


@functools.cache
def _field_names(cls: type) -> tuple[str, ...]:
    """A dataclass's field names, looked up once per class (``dataclasses.fields`` filters every call)."""
    return tuple(f.name for f in dataclasses.fields(cls))


def command_id_for(ticket_id: str, step: int, kind: str) -> str:
    """The deterministic command id of step ``step`` of ticket ``ticket_id``.

    Example: ``command_id_for("n1/GPU-1/xid:13/7", 0, "restart_process")`` is always the same UUID
    text, so a decision replayed after a controller restart reuses it.

    Args:
        ticket_id: the repair ticket's id.
        step: the ticket's step counter for this action (0, 1, 2, ...).
        kind: the action kind (``Action.kind``).

    Returns:
        UUID text, the form the wire's ``Command.command_id`` uses.
    """
    # ``str(uuid.uuid5(...))`` spelt out: the same SHA-1, version and variant bits and text, without
    # building two UUID objects (a burst makes thousands of ids, and uuid5's objects were a visible share of its CPU).
    digest = bytearray(hashlib.sha1(_COMMAND_NAMESPACE_BYTES + f"{ticket_id}/{step}/{kind}".encode()).digest()[:16])
    digest[6] = (digest[6] & 0x0F) | 0x50  # version 5
    digest[8] = (digest[8] & 0x3F) | 0x80  # RFC 4122 variant
    text = digest.hex()
    return f"{text[:8]}-{text[8:12]}-{text[12:16]}-{text[16:20]}-{text[20:]}"


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Action:
    """Fields every action has: the ticket it belongs to, its step, and where it acts."""

    ticket_id: str
    """The repair ticket (or breaker/pause record) that asked for it."""
    step: int
    """The ticket's step counter; with ticket_id it makes the command id."""
    node_id: str
    """The node it acts on (for fleet-wide notices: "")."""
    reason: str = ""
    """One sentence: why, for the audit log and the agent's log."""

    kind: ClassVar[str] = "action"
    """The action's tag in dicts, the outbox and command ids."""
    node_disruptive: ClassVar[bool] = False
    """True when it takes the whole node out of service (counts against the disruption budget)."""
    gpu_disruptive: ClassVar[bool] = False
    """True when it interrupts work on a GPU (never sent while the GPU's node reboots)."""

    @property
    def key(self) -> str:
        """The readable idempotency key ``<ticket_id>/<step>/<kind>``."""
        return f"{self.ticket_id}/{self.step}/{self.kind}"

    @functools.cached_property
    def command_id(self) -> str:
        """The idempotency key as UUID text (see `command_id_for`); computed once per action."""
        return command_id_for(self.ticket_id, self.step, self.kind)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-friendly dict with a "kind" tag; `from_dict` reverses it.

        Shallow on purpose: every field is a str, number, bool or tuple of str, so there is nothing
        to deep-copy (``dataclasses.asdict`` was a measurable share of a burst's CPU).
        """
        out = {name: getattr(self, name) for name in _field_names(type(self))}
        out["kind"] = self.kind
        return out


@dataclasses.dataclass(frozen=True, kw_only=True)
class RestartProcess(_Action):
    """Restart the workload on one GPU: SIGTERM, then SIGKILL after ``grace_s``."""

    gpu_uuid: str
    grace_s: float = 30.0

    kind = "restart_process"
    gpu_disruptive = True


@dataclasses.dataclass(frozen=True, kw_only=True)
class ResetGpu(_Action):
    """Reset one GPU (the agent refuses while compute processes run on it)."""

    gpu_uuid: str

    kind = "reset_gpu"
    gpu_disruptive = True


@dataclasses.dataclass(frozen=True, kw_only=True)
class RebootNode(_Action):
    """Reboot the node in band, through the agent's configured command."""

    kind = "reboot_node"
    node_disruptive = True


@dataclasses.dataclass(frozen=True, kw_only=True)
class PowerCycleBmc(_Action):
    """Power-cycle the node out of band through its BMC (Redfish hook)."""

    kind = "power_cycle_bmc"
    node_disruptive = True


@dataclasses.dataclass(frozen=True, kw_only=True)
class DrainNode(_Action):
    """Move the node's workload off it before a repair: its pods evicted, disruption budgets honoured.

    Carried out by the scheduler's adapter (Kubernetes: the Eviction API, a PDB's refusal retried
    until ``deadline_s``); an adapter without drains records it. The repair it precedes
    (``repair_kind``) is decided when it succeeds; one not finished by its deadline is the
    ladder's ``EscalationPolicy.drain_on_timeout`` to settle.
    """

    pods: str = "gpu"
    """"gpu": the pods that use a GPU; "all": every pod but DaemonSets' and static ones."""
    deadline_s: float = 600.0
    """How long the drain may take, from when its adapter starts it."""
    repair_kind: str = ""
    """The repair that waits for it ("reset_gpu", "reboot_node", "power_cycle_bmc")."""
    gpu_uuid: str = ""
    """The GPU the repair is for ("" for a node repair); the drain covers the node's pods either way."""

    kind = "drain_node"


@dataclasses.dataclass(frozen=True, kw_only=True)
class QuarantineGpu(_Action):
    """Take one GPU out of scheduling; the node's other GPUs stay schedulable."""

    gpu_uuid: str

    kind = "quarantine_gpu"


@dataclasses.dataclass(frozen=True, kw_only=True)
class QuarantineNode(_Action):
    """Take the whole node out of scheduling (cordon/taint or Slurm drain)."""

    planned: bool = False
    """Planned maintenance (a rolling SDC sweep): it takes disruption budget like any other, but
    is not breakage, so the circuit breaker does not count it as demand."""

    kind = "quarantine_node"
    node_disruptive = True


@dataclasses.dataclass(frozen=True, kw_only=True)
class QuarantinePort(_Action):
    """Isolate one InfiniBand port where the fabric allows; the node keeps its other ports."""

    ib_port: str
    """"device/port", e.g. "mlx5_0/1"."""

    kind = "quarantine_port"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Release(_Action):
    """Return a quarantined GPU, port or node to service (only after a passing validation or by force).

    Scope: ``gpu_uuid`` set → that GPU; ``ib_port`` set → that port; both empty → the node.
    """

    gpu_uuid: str = ""
    ib_port: str = ""
    forced: bool = False
    """True when an operator released it without a passing validation (audited)."""

    kind = "release"


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunValidation(_Action):
    """Run a rasd-validate suite on the node's GPUs; its verdict decides release."""

    suite: str
    """"quick", "accusation" or "post-repair"."""
    gpu_uuids: tuple[str, ...] = ()
    """GPUs to check; empty means every GPU of the node."""
    exclude_gpu_uuids: tuple[str, ...] = ()
    """GPUs to leave out of an all-GPU run (already quarantined for RMA)."""
    seed: int = 0
    """Seed for the checks' data, derived from the command id so replays agree."""

    kind = "run_validation"


@dataclasses.dataclass(frozen=True, kw_only=True)
class OpenRma(_Action):
    """Open an RMA ticket for a GPU (or the node) pending operator approval, with its evidence."""

    gpu_uuid: str = ""
    evidence: tuple[str, ...] = ()
    """The ticket's history: faults seen, actions tried, validation results, one line each."""

    kind = "open_rma"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Notify(_Action):
    """Tell a person: an event, a metric bump and an audit record; nothing changes on the node."""

    severity: str = "warning"
    """"info", "warning", "error" or "critical"."""
    summary: str = ""

    kind = "notify"


Action = (
    RestartProcess
    | ResetGpu
    | RebootNode
    | PowerCycleBmc
    | DrainNode
    | QuarantineGpu
    | QuarantineNode
    | QuarantinePort
    | Release
    | RunValidation
    | OpenRma
    | Notify
)
"""Every action the remediation core can ask for."""

ACTION_TYPES: Mapping[str, type[Action]] = {
    cls.kind: cls
    for cls in (
        RestartProcess,
        ResetGpu,
        RebootNode,
        PowerCycleBmc,
        DrainNode,
        QuarantineGpu,
        QuarantineNode,
        QuarantinePort,
        Release,
        RunValidation,
        OpenRma,
        Notify,
    )
}
"""Action classes by their ``kind`` tag."""


def from_dict(data: Mapping[str, Any]) -> Action:
    """Rebuild an action from its `to_dict` output.

    Args:
        data: the dict, with its "kind" tag.

    Returns:
        The action.

    Raises:
        ValueError: the kind is unknown.
    """
    fields = dict(data)
    kind = fields.pop("kind", "")
    cls = ACTION_TYPES.get(kind)
    if cls is None:
        raise ValueError(f"unknown action kind {kind!r}")
    for name in ("gpu_uuids", "exclude_gpu_uuids", "evidence"):
        if name in fields:
            fields[name] = tuple(fields[name])
    return cls(**fields)


def seed_for(ticket_id: str, step: int) -> int:
    """A deterministic 63-bit validation seed for a ticket step (same replay, same seed)."""
    return uuid.UUID(command_id_for(ticket_id, step, "seed")).int >> 65
