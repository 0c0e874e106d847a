"""Quarantine executors: take a node, a GPU or an InfiniBand port out of scheduling, and give it back.

The pure core (`rasd.controller.core.remediation.actions`) decides *that* something is quarantined
(`QuarantineNode`, `QuarantineGpu`, `QuarantinePort`) or released (`Release`); this package carries
it out on the cluster's scheduler through one `QuarantineAdapter`:

- `RecordOnlyQuarantine` (the default): remembers what it was asked and changes nothing.
- `KubernetesQuarantine`: cordon, taint, node condition, annotations and Events, through the official
  ``kubernetes`` client; in the controller it runs in a process of its own (`KubernetesProcess`).
- `SlurmQuarantine`: ``scontrol update nodename=<n> state=drain|resume``.

Every call is idempotent: quarantining twice, or releasing something that is not quarantined, changes
nothing and says so in the returned `QuarantineOutcome`. Expected results ("node not found",
"already quarantined") are outcomes; failures the caller can retry raise
`QuarantineUnavailableError`, and refusals that a retry cannot fix (RBAC, validation) raise
`QuarantineRejectedError`. The calls block (HTTP or a subprocess): the service runs them in a thread
(`executors` gives it the ``kind → callable`` table it takes).

**Never undo someone else's work.** A cordon or a Slurm drain that rasd did not set is never lifted
by a rasd release (NVSentinel #1424: "don't uncordon nodes cordoned by others").

The adapters, one module each: `record` (`RecordOnlyQuarantine`), `k8s` (`KubernetesQuarantine`,
`KubernetesSettings`; `k8s_process`: `KubernetesProcess`) and `slurm` (`SlurmQuarantine`,
`SlurmSettings`); `adapter` holds what they share.
This package re-exports their public names, so callers write ``quarantine.KubernetesQuarantine``.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Callable, Mapping
from typing import Any, Literal

from rasd.common import settings as settings_check
from rasd.controller.core.remediation import actions
from rasd.controller.executors.quarantine.adapter import (
    QuarantineAdapter,
    QuarantineError,
    QuarantineOutcome,
    QuarantineRejectedError,
    QuarantineSettingsError,
    QuarantineUnavailableError,
    Status,
    log_drained,
    log_executed,
)
from rasd.controller.executors.quarantine.k8s import (
    ANN_CORDONED,
    ANN_GPUS,
    ANN_PORTS,
    ANN_QUARANTINED,
    API_CONNECTIONS,
    CONDITION_TYPE,
    STATE_LABEL,
    TAINT_ALL_GPUS,
    TAINT_QUARANTINED,
    KubernetesQuarantine,
    KubernetesSettings,
    api_client,
    label_value,
)
from rasd.controller.executors.quarantine.k8s_drain import DrainBlockedError, DrainReport
from rasd.controller.executors.quarantine.k8s_process import KubernetesProcess
from rasd.controller.executors.quarantine.record import RecordOnlyQuarantine
from rasd.controller.executors.quarantine.slurm import SLURM_REASON_PREFIX, SlurmQuarantine, SlurmSettings, slurm_reason

__all__ = [
    "ADAPTERS",
    "ANN_CORDONED",
    "ANN_GPUS",
    "ANN_PORTS",
    "ANN_QUARANTINED",
    "API_CONNECTIONS",
    "CONDITION_TYPE",
    "SLURM_REASON_PREFIX",
    "STATE_LABEL",
    "TAINT_ALL_GPUS",
    "TAINT_QUARANTINED",
    "DrainBlockedError",
    "DrainReport",
    "KubernetesProcess",
    "KubernetesQuarantine",
    "KubernetesSettings",
    "QuarantineAdapter",
    "QuarantineError",
    "QuarantineOutcome",
    "QuarantineRejectedError",
    "QuarantineSettings",
    "QuarantineSettingsError",
    "QuarantineUnavailableError",
    "RecordOnlyQuarantine",
    "SlurmQuarantine",
    "SlurmSettings",
    "Status",
    "execute",
    "executors",
    "label_value",
    "open_quarantine",
    "slurm_reason",
]

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
    method, args, kwargs = _method_call(action)
    return getattr(adapter, method)(*args, **kwargs)


def _method_call(action: actions.Action) -> tuple[str, tuple[str, ...], dict[str, str]]:
    """The adapter's method that carries out a quarantine or release action, and its arguments."""
    common = {"reason": action.reason, "ticket_id": action.ticket_id}
    if isinstance(action, actions.QuarantineNode):
        return "quarantine_node", (action.node_id,), common
    if isinstance(action, actions.QuarantineGpu):
        return "quarantine_gpu", (action.node_id, action.gpu_uuid), common
    if isinstance(action, actions.QuarantinePort):
        return "quarantine_port", (action.node_id, action.ib_port), common
    if isinstance(action, actions.Release):
        if action.gpu_uuid:
            return "release_gpu", (action.node_id, action.gpu_uuid), common
        if action.ib_port:
            return "release_port", (action.node_id, action.ib_port), common
        return "release_node", (action.node_id,), common
    raise TypeError(f"not a quarantine or release action: {action.kind}")


def executors(adapter: QuarantineAdapter) -> dict[str, Callable[[actions.Action], QuarantineOutcome]]:
    """The ``kind → callable`` table the remediation service takes for controller-side actions.

    Example: ``RemediationService(..., executors={**quarantine.executors(adapter), ...})``; each
    callable returns a `QuarantineOutcome` whose ``str()`` is the action's result message. For an
    adapter with ``call_async`` (`KubernetesProcess`), each callable also has a ``call_async``: the
    same call as a coroutine, which the service awaits on its event loop instead of taking a thread.
    Each call is logged (``quarantine_executed``, ``drain_executed``) here, or by the adapter where it
    says so (``logs_calls``: the child logs its own calls, off the decider's interpreter).
    """
    call_async = getattr(adapter, "call_async", None)
    logs_calls = getattr(adapter, "logs_calls", False)

    def run(action: actions.Action) -> QuarantineOutcome:
        outcome = execute(adapter, action)
        if not logs_calls:
            log_executed(action.kind, outcome)
        return outcome

    async def run_async(action: actions.Action) -> QuarantineOutcome:
        method, args, kwargs = _method_call(action)
        outcome = await call_async(method, *args, **kwargs)
        if not logs_calls:
            log_executed(action.kind, outcome)
        return outcome

    # Whether a call waits on another system: the service calls one that does not (record only)
    # with the decision (or in its dispatch round), without a thread and without a commit of its own
    # for the outcome.
    run.blocking = getattr(adapter, "blocking", True)  # type: ignore[attr-defined]
    if call_async is not None:
        run.call_async = run_async  # type: ignore[attr-defined]
    kinds = (actions.QuarantineNode.kind, actions.QuarantineGpu.kind, actions.QuarantinePort.kind, actions.Release.kind)
    table: dict[str, Callable[[actions.Action], Any]] = dict.fromkeys(kinds, run)
    table.update(_node_state_executors(adapter))
    return table


def _gpu_rma(action: actions.Action) -> str:
    """A GPU's RMA: the node's state label says nothing of one GPU."""
    return f"{action.kind}: a GPU's RMA leaves node {action.node_id}'s state label alone"


def _node_state_executors(adapter: QuarantineAdapter) -> dict[str, Callable[[actions.Action], Any]]:
    """Drains and RMA marks, for an adapter that has them (Kubernetes); others record them (no entry).

    With ``call_async`` on the adapter, each has one too (`executors`): a drain then waits out its
    disruption budgets as a coroutine, not in one of the controller's threads.
    """
    table: dict[str, Callable[[actions.Action], Any]] = {}
    call_async = getattr(adapter, "call_async", None)
    logs_calls = getattr(adapter, "logs_calls", False)
    drain_node = getattr(adapter, "drain_node", None)
    mark_rma = getattr(adapter, "mark_rma", None)
    if drain_node is not None:

        def drain_call(action: actions.Action) -> tuple[str, dict[str, Any]]:
            assert isinstance(action, actions.DrainNode)
            return action.node_id, {
                "reason": action.reason, "ticket_id": action.ticket_id,
                "pods": action.pods, "deadline_s": action.deadline_s,
            }  # fmt: skip

        def drained(action: actions.Action, report: Any) -> Any:
            if not logs_calls:
                log_drained(action.node_id, action.ticket_id, report)
            return report

        def drain(action: actions.Action) -> Any:
            node_id, kwargs = drain_call(action)
            return drained(action, drain_node(node_id, **kwargs))

        async def drain_async(action: actions.Action) -> Any:
            node_id, kwargs = drain_call(action)
            return drained(action, await call_async("drain_node", node_id, **kwargs))

        if call_async is not None:
            drain.call_async = drain_async  # type: ignore[attr-defined]
        table[actions.DrainNode.kind] = drain
    if mark_rma is not None:

        def rma(action: actions.Action) -> Any:
            if getattr(action, "gpu_uuid", ""):
                return _gpu_rma(action)
            return mark_rma(action.node_id, reason=action.reason, ticket_id=action.ticket_id)

        async def rma_async(action: actions.Action) -> Any:
            if getattr(action, "gpu_uuid", ""):
                return _gpu_rma(action)
            return await call_async("mark_rma", action.node_id, reason=action.reason, ticket_id=action.ticket_id)

        if call_async is not None:
            rma.call_async = rma_async  # type: ignore[attr-defined]
        table[actions.OpenRma.kind] = rma
    return table


# --------------------------------------------------------------------------------------------
# Factory


@dataclasses.dataclass(frozen=True)
class QuarantineSettings:
    """The ``[quarantine]`` table: which adapter, and one table of settings per adapter."""

    adapter: Literal["record", "kubernetes", "slurm"] = "record"
    """record (log only), kubernetes (cordon, taint, condition, Events, drains) or slurm (drain)."""
    kubernetes: KubernetesSettings = dataclasses.field(default_factory=KubernetesSettings)
    slurm: SlurmSettings = dataclasses.field(default_factory=SlurmSettings)


ADAPTERS: tuple[str, ...] = typing.get_args(typing.get_type_hints(QuarantineSettings)["adapter"])
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
        else ``kubeconfig``; it runs in a process of its own (`KubernetesProcess`, started by the first
        call or its ``start``) unless ``own_process`` is false.

    Raises:
        QuarantineSettingsError: an unknown key or a bad value, named by its path.
    """
    table = QuarantineSettings(**settings_check.typed_values(QuarantineSettings, settings, prefix,
                                                             QuarantineSettingsError))  # fmt: skip
    adapter, k8s, slurm = table.adapter, table.kubernetes, table.slurm
    k8s.validate(f"{prefix}kubernetes.")
    slurm.validate(f"{prefix}slurm.")
    if adapter == "kubernetes":
        client = api_client(k8s, f"{prefix}kubernetes.")  # here too: a bad kubeconfig is named at once
        if k8s.own_process:
            client.close()
            return KubernetesProcess(k8s)
        return KubernetesQuarantine(client, k8s)
    if adapter == "slurm":
        return SlurmQuarantine(slurm)
    return RecordOnlyQuarantine()
