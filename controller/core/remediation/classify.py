"""Classification: one health event → which component is at fault, how bad, and what would fix it.

Sources, in the order they are consulted:

1. Memory evidence that no repair can fix, on any GPU event that carries it: a row-remap failure,
   uncorrectable remapped rows ≥ ``remapped_rows_uncorrectable_rma`` (512) or retired pages ≥
   ``retired_pages_rma`` (63) → RMA.
2. The GPU recovery action NVML reports (field 230, ``HealthEvent.recovery_action``) and Xid 154,
   whose message carries the same value as text ("... to 0x2 (Node Reboot Required)").
3. NVIDIA's XID catalog (``rasd.common.xid_catalog``): the "immediate action" bucket gives the
   recommended action and default severity; ``xid_action_overrides`` in the policy replaces it
   per Xid, and Xid 79 (fallen off the bus) is always at least a reboot. For Xid 144-150
   (NVLink5) whose kernel-log facts carry the registers (IntrInfo, ErrorStatus; ``kernel_log_of``),
   NVIDIA's register decode sheet (``catalog.nvlink5_rules``) gives the bucket instead.
4. Counter thresholds: volatile DBE → reset; row-remap pending → reset (applies the remap) once the
   GPU is idle (``reset_when_idle``, as Xid 94's reset; ``COUNTER_FAULTS_NAMED_BY_XID``: an Xid that names a
   counter's error decides instead of it);
   remapped rows and retired pages below the RMA limits → stay in service; corrected-ECC rate →
   warning; NVLink CRC rate and link down → reset; PCIe replay rate → a person looks (reseat).
5. NVSwitch SXids: the driver's "Fatal"/"Non-fatal" word from the kernel-log facts (else the
   source's severity) → a person looks at the switch tray, at ERROR or WARNING.
6. IB link flaps: ``ib_flap_state_changes`` state changes of one port within ``ib_flap_window_s``
   → quarantine the node (or only the port, ``ib_flap_isolation = "port"``). The count over the
   window comes from ``correlate``, which keeps the history; this module only judges it.
7. The controller's own verdicts: a straggler's rung (``STRAGGLER``) → validate or isolate the GPU, or
   restart a hung job's rank (rung ``restart``); a lost node (``NODE_LOST``, `lost_nodes`: no replica
   hears its agent) → quarantine it for a person.

The result's ``fault_key`` says what "the same fault" means for correlation ("xid:13",
"ecc_dbe", "nvlink_down:3", "ib_flap"), and its ``action`` is a `RecommendedAction` word that the
escalation ladder turns into a starting rung.

Pure: no I/O, no logging, no clock reads. The catalog is passed in as a value (callers load it
once with ``xid_catalog.load_catalog()``); nothing here reads a file.
"""

from __future__ import annotations

import dataclasses
import enum
import re
from collections.abc import Callable, Mapping
from typing import Any

from rasd.common import xid_catalog
from rasd.common.vocabulary import EventKind, Severity
from rasd.controller.core.remediation import events as health
from rasd.controller.core.remediation import policy


class Component(enum.StrEnum):
    """The part of the machine a fault lives in (and therefore the smallest thing to isolate)."""

    GPU = "gpu"
    NODE = "node"
    NVLINK = "nvlink"
    IB_PORT = "ib_port"
    PCIE = "pcie"


class RecommendedAction(enum.StrEnum):
    """What the evidence says would fix the fault; the ladder turns it into a starting rung.

    The first seven words are ``xid_catalog.RECOMMENDED_ACTIONS``; the rest are the controller's.
    """

    NONE = "none"
    """Observe only: the component stays in service."""
    RESTART_PROCESS = "restart_process"
    RESET_GPU = "reset_gpu"
    REBOOT_NODE = "reboot_node"
    RMA = "rma"
    CONTACT_SUPPORT = "contact_support"
    """NVIDIA (or the vendor) must look; automation isolates and waits for a person."""
    INVESTIGATE = "investigate"
    """A person must look (mechanicals, firmware, unknown Xid); automation isolates if severe."""
    QUARANTINE_NODE = "quarantine_node"
    """Take the node out of service and wait for a person (e.g. an IB flap storm)."""
    QUARANTINE_PORT = "quarantine_port"
    """Isolate one IB port; the node keeps working on its other ports."""
    VALIDATE = "validate"
    """Hold the GPU and run the accusation suite (suspected silent data corruption)."""


@dataclasses.dataclass(frozen=True)
class Classification:
    """What one event means."""

    component: Component
    severity: Severity
    action: RecommendedAction
    reason: str
    """One sentence, citing the evidence."""
    fault_key: str
    """What "the same fault" means for dedupe: "xid:13", "ecc_dbe", "nvlink_down:3", "ib_flap"."""
    reset_when_idle: bool = False
    """A GPU reset is owed (it applies a pending row remap or page retirement) but only once the GPU has no
    work: the ladder waits for the GPU to drain and never stops work for it. Xid 94 (contained: restart
    the application, reset "when convenient"), a pending row remap, a pending page retirement."""

    def to_dict(self) -> dict[str, Any]:
        """A JSON-friendly dict; `from_dict` reverses it."""
        out = {
            "component": self.component.value,
            "severity": self.severity.name,
            "action": self.action.value,
            "reason": self.reason,
            "fault_key": self.fault_key,
        }
        if self.reset_when_idle:
            out["reset_when_idle"] = True
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Classification:
        """Rebuild from `to_dict` output."""
        return cls(
            component=Component(data["component"]),
            severity=Severity[data["severity"]],
            action=RecommendedAction(data["action"]),
            reason=data["reason"],
            fault_key=data["fault_key"],
            reset_when_idle=bool(data.get("reset_when_idle", False)),
        )


COUNTER_FAULTS_NAMED_BY_XID: Mapping[str, frozenset[int]] = {
    "ecc_dbe": frozenset({48, 94, 95}),
    "row_remap_pending": frozenset({48, 94, 95}),
}
"""Faults seen in a counter (fault_key) → the Xids that report the same memory error from the kernel log.

The counter says an uncorrectable error happened; the Xid says what it did: 48 (a DBE: reset), 94
(contained to one application: restart it, the rest may continue) or 95 (uncontained: reset). When
both are seen on one GPU they are one incident (``correlate``), and the Xid, the more specific
evidence, decides the repair; a counter seen first waits ``counter_hold_s`` for it (``escalation``)."""


_SEVERITY_WORDS = {
    "info": Severity.INFO,
    "warning": Severity.WARNING,
    "error": Severity.ERROR,
    "fatal": Severity.FATAL,
}

_NVLINK_XIDS = frozenset({74, 136, 137, 144, 145, 146, 147, 148, 149, 150, 155})
"""Xids raised by the NVLink fabric rather than the GPU's engines."""

_FALLEN_OFF_BUS_XID = 79
_CONTAINED_XID = 94
"""NVIDIA: "contained to one application ... must be restarted. All other applications ... are unaffected. It is
recommended to reset the GPU when convenient. Applications can continue to be run until the reset can be
performed." The catalog's bucket (RESTART_APP) is the repair; the reset waits for the drain."""
_RECOVERY_XID = 154
_NVLINK5_XIDS = (144, 150)
"""The Xids NVIDIA's NVLink5 register decode sheet covers (first, last)."""

_RECOVERY_TEXT = re.compile(r"\(([^()]*)\)\s*$")
"""The last parenthesised name in an Xid 154 line: '... to 0x2 (Node Reboot Required)'."""


def _action_word(word: str) -> RecommendedAction:
    try:
        return RecommendedAction(word)
    except ValueError:
        return RecommendedAction.INVESTIGATE


def recovery_action_of(event: health.HealthEvent) -> xid_catalog.RecoveryAction | None:
    """The GPU recovery action an event reports, from the NVML field or the Xid 154 text.

    Example: an Xid 154 event with message "GPU recovery action changed from 0x0 (None) to 0x2
    (Node Reboot Required)" → ``RecoveryAction.NODE_REBOOT``.

    Args:
        event: the event; ``recovery_action`` wins over its kernel-log facts, then the attributes and the
            message text.

    Returns:
        The action, or None when the event carries none that is known.
    """
    if event.recovery_action is not None:
        try:
            return xid_catalog.RecoveryAction(event.recovery_action)
        except ValueError:
            return None
    facts = health.kernel_log_of(event)
    if facts is not None and facts.recovery_action is not None:
        return facts.recovery_action
    text = event.attributes.get("recovery_action", "")
    if text:
        if text.isdigit():
            try:
                return xid_catalog.RecoveryAction(int(text))
            except ValueError:
                return None
        return xid_catalog.parse_recovery_action_text(text)
    match = _RECOVERY_TEXT.search(event.message)
    if match:
        return xid_catalog.parse_recovery_action_text(match.group(1))
    return None


def _memory_rma(event: health.HealthEvent, pol: policy.ClassificationPolicy) -> str:
    """The reason the event's memory evidence means RMA, or "" when it does not."""
    if event.kind is EventKind.ROW_REMAP_FAILURE:
        return "row remapping failed: the bank has no spare rows left, so no reset can repair it"
    unc = event.remapped_rows_uncorrectable
    if unc is not None and unc >= pol.remapped_rows_uncorrectable_rma:
        return (
            f"{unc} rows remapped for uncorrectable errors (limit {pol.remapped_rows_uncorrectable_rma}): "
            "spare capacity is used up"
        )
    pages = event.retired_pages
    if pages is not None and pages >= pol.retired_pages_rma:
        return f"{pages} retired pages (limit {pol.retired_pages_rma}): the GPU is out of spare pages"
    return ""


def classify(
    event: health.HealthEvent,
    *,
    catalog: xid_catalog.XidCatalog,
    policy: policy.ClassificationPolicy,
    ib_state_changes_in_window: int = 0,
    nvlink5_rules: tuple[xid_catalog.Nvlink5Rule, ...] | None = None,
) -> Classification:
    """Classify one event. Pure.

    Examples (default policy, NVIDIA's catalog):

    - Xid 13 on GPU-1 → (gpu, ERROR, restart_process, "xid:13"): bucket RESTART_APP.
    - Xid 79 → (gpu, FATAL, reboot_node): the GPU fell off the bus; a reset cannot reach it.
    - Xid 154 "... (Node Reboot Required)" → (gpu, FATAL, reboot_node, "recovery_action").
    - Xid 149 whose kernel-log facts carry the registers (0x025001c6, 0x0) and subcode NETIR_LINK_EVT
      → (nvlink, FATAL, reset_gpu): NVIDIA's NVLink5 decode sheet says RESET_GPU.
    - ROW_REMAP_FAILURE → (gpu, FATAL, rma): no spare rows, nothing on the ladder can fix it.
    - ROW_REMAP_PENDING with 3 uncorrectable remapped rows → (gpu, WARNING, reset_gpu): the reset
      applies the remap and the GPU stays in service afterwards.
    - IB_LINK_STATE with ``ib_state_changes_in_window=6`` → (ib_port, ERROR, quarantine_node,
      "ib_flap").

    Args:
        event: the observation.
        catalog: NVIDIA's XID catalog (a value; load it once), with its NVLink5 decode sheet.
        policy: thresholds.
        ib_state_changes_in_window: for IB_LINK_STATE events, how many state changes the event's
            port had within ``policy.ib_flap_window_s``, this one included (from ``correlate``).
        nvlink5_rules: NVIDIA's Xid 144-150 decode sheet, when it should not be the catalog's
            (``catalog.nvlink5_rules``). An Xid 144-150 event whose kernel-log facts
            (``health.kernel_log_of``) carry at least two registers (IntrInfo, ErrorStatus) and
            optionally the subcode takes the decoded row's bucket instead of the catalog's default
            "reset_gpu".

    Returns:
        The classification; never raises for unknown input (it says "investigate" instead).
    """
    if event.gpu_uuid:
        rma_reason = _memory_rma(event, policy)
        if rma_reason:
            return Classification(Component.GPU, Severity.FATAL, RecommendedAction.RMA, rma_reason, "memory_exhausted")
    kind = event.kind
    if kind is EventKind.RECOVERY_ACTION or (kind is EventKind.XID and event.xid == _RECOVERY_XID):
        return _classify_recovery_action(event)
    if kind is EventKind.XID:
        rules = catalog.nvlink5_rules if nvlink5_rules is None else nvlink5_rules
        return _classify_xid(event, catalog, policy, rules)
    if kind is EventKind.IB_LINK_STATE:
        return _classify_ib(event, policy, ib_state_changes_in_window)
    by_kind = _BY_KIND.get(kind)
    if by_kind is not None:
        return by_kind(event, policy)
    return Classification(
        Component.GPU if event.gpu_uuid else Component.NODE,
        Severity.INFO,
        RecommendedAction.NONE,
        f"event kind {kind.name} carries nothing to act on",
        kind.name.lower(),
    )


def _classify_sxid(event: health.HealthEvent, pol: policy.ClassificationPolicy) -> Classification:
    facts = health.kernel_log_of(event)
    if facts is not None and facts.sxid_fatal is not None:
        severe = facts.sxid_fatal  # the driver's own "Fatal"/"Non-fatal"
    else:
        severe = event.severity >= Severity.ERROR  # a source that rated it without saying why
    sxid = event.xid if event.xid is not None or facts is None else facts.sxid
    return Classification(
        Component.NODE,
        Severity.ERROR if severe else Severity.WARNING,
        RecommendedAction.INVESTIGATE,
        f"NVSwitch SXID {sxid}: the switch tray needs a person's look",
        f"sxid:{sxid}",
    )


def _classify_ecc_dbe(event: health.HealthEvent, pol: policy.ClassificationPolicy) -> Classification:
    return Classification(
        Component.GPU,
        Severity.ERROR,
        RecommendedAction.RESET_GPU,
        "volatile double-bit ECC error: a GPU reset clears it and applies any pending remap",
        "ecc_dbe",
    )


def _classify_ecc_sbe_rate(event: health.HealthEvent, pol: policy.ClassificationPolicy) -> Classification:
    rate = event.ecc_sbe_rate_per_s
    if rate is not None and rate < pol.ecc_sbe_rate_warn_per_s:
        return Classification(
            Component.GPU,
            Severity.INFO,
            RecommendedAction.NONE,
            f"corrected ECC rate {rate:g}/s is below {pol.ecc_sbe_rate_warn_per_s:g}/s",
            "ecc_sbe_rate",
        )
    shown = "above threshold" if rate is None else f"{rate:g}/s"
    return Classification(
        Component.GPU,
        Severity.WARNING,
        RecommendedAction.NONE,
        f"corrected ECC rate {shown}: errors are corrected, so the GPU stays in service and is watched",
        "ecc_sbe_rate",
    )


def _classify_row_remap_pending(event: health.HealthEvent, pol: policy.ClassificationPolicy) -> Classification:
    rows = event.remapped_rows_uncorrectable
    spare = "" if rows is None else f" ({rows} uncorrectable remapped rows, within spare capacity)"
    return Classification(
        Component.GPU,
        Severity.WARNING,
        RecommendedAction.RESET_GPU,
        f"a row remap is pending{spare}: a GPU reset applies it once the GPU is idle, and the GPU stays in service",
        "row_remap_pending",
        reset_when_idle=True,
    )


def _classify_retired_pages(event: health.HealthEvent, pol: policy.ClassificationPolicy) -> Classification:
    if event.retired_pages_pending:
        return Classification(
            Component.GPU,
            Severity.WARNING,
            RecommendedAction.RESET_GPU,
            "a page retirement is pending: a GPU reset applies it once the GPU is idle",
            "retired_pages_pending",
            reset_when_idle=True,
        )
    return Classification(
        Component.GPU,
        Severity.INFO,
        RecommendedAction.NONE,
        f"retired pages {event.retired_pages if event.retired_pages is not None else '?'} are below "
        f"{pol.retired_pages_rma}: within spare capacity, the GPU stays in service",
        "retired_pages",
    )


def _classify_off_bus(event: health.HealthEvent, pol: policy.ClassificationPolicy) -> Classification:
    return Classification(
        Component.GPU,
        Severity.FATAL,
        RecommendedAction.REBOOT_NODE,
        "the GPU is gone from the bus: a reset cannot reach it, the node must reboot",
        "off_bus",
    )


def _classify_nvlink_down(event: health.HealthEvent, pol: policy.ClassificationPolicy) -> Classification:
    link = event.nvlink or "?"
    return Classification(
        Component.NVLINK,
        Severity.ERROR,
        RecommendedAction.RESET_GPU,
        f"NVLink {link} went down: a GPU reset retrains it",
        f"nvlink_down:{link}",
    )


def _classify_nvlink_errors(event: health.HealthEvent, pol: policy.ClassificationPolicy) -> Classification:
    rate = event.nvlink_crc_rate_per_s
    if rate is not None and rate >= pol.nvlink_crc_rate_per_s:
        return Classification(
            Component.NVLINK,
            Severity.ERROR,
            RecommendedAction.RESET_GPU,
            f"NVLink CRC errors at {rate:g}/s (limit {pol.nvlink_crc_rate_per_s:g}/s): a reset retrains it",
            "nvlink_crc",
        )
    return Classification(
        Component.NVLINK,
        Severity.WARNING,
        RecommendedAction.NONE,
        f"NVLink errors below {pol.nvlink_crc_rate_per_s:g}/s CRC: watched, the link stays in service",
        "nvlink_crc",
    )


def _classify_pcie_replay(event: health.HealthEvent, pol: policy.ClassificationPolicy) -> Classification:
    rate = event.pcie_replay_rate_per_s
    if rate is not None and rate >= pol.pcie_replay_rate_per_s:
        return Classification(
            Component.PCIE,
            Severity.ERROR,
            RecommendedAction.INVESTIGATE,
            f"PCIe replays at {rate:g}/s (limit {pol.pcie_replay_rate_per_s:g}/s): the link is marginal, "
            "a person must reseat or inspect it",
            "pcie_replay",
        )
    return Classification(
        Component.PCIE,
        Severity.WARNING,
        RecommendedAction.NONE,
        f"PCIe replays below {pol.pcie_replay_rate_per_s:g}/s: watched",
        "pcie_replay",
    )


def _classify_sdc_suspect(event: health.HealthEvent, pol: policy.ClassificationPolicy) -> Classification:
    return Classification(
        Component.GPU,
        Severity.ERROR,
        RecommendedAction.VALIDATE,
        "the GPU is accused of silent data corruption: hold it and run the accusation suite",
        "sdc",
    )


def _classify_straggler(event: health.HealthEvent, pol: policy.ClassificationPolicy) -> Classification:
    """The straggler watch's rungs (issue #40).

    "validate" holds the GPU for the accusation suite (a pass releases it); "quarantine" isolates it for
    a person, so the scheduler replaces it meanwhile; "restart" (the job's steps stopped while its GPUs
    spin, `core.stall`) restarts the suspect rank's processes, so the job's launcher restarts the job
    from its checkpoint before the collective's own timeout does.
    """
    rung = event.attributes.get("rung", "quarantine")
    if rung == "restart":
        return Classification(
            Component.GPU,
            Severity.ERROR,
            RecommendedAction.RESTART_PROCESS,
            f"job stalled: {event.message}; restart the rank so the job restarts from its checkpoint",
            "job_stall",
        )
    if rung == "validate":
        return Classification(
            Component.GPU,
            Severity.ERROR,
            RecommendedAction.VALIDATE,
            f"straggler: {event.message}; hold it and run the validation suite",
            "straggler:validate",
        )
    return Classification(
        Component.GPU,
        Severity.ERROR,
        RecommendedAction.INVESTIGATE,
        f"straggler: {event.message}; quarantined for a person",
        "straggler:quarantine",
    )


def _classify_node_lost(event: health.HealthEvent, pol: policy.ClassificationPolicy) -> Classification:
    """The lost-node watch's verdict (`lost_nodes`): the whole node is isolated for a person.

    Nothing on the node can be commanded while its agent is silent, so no rung of the ladder applies; the
    quarantine makes the scheduler move the work off it now rather than at its own NotReady timeout.
    """
    return Classification(
        Component.NODE,
        Severity.FATAL,
        RecommendedAction.QUARANTINE_NODE,
        f"node lost: {event.message}; quarantined for a person",
        "node_lost",
    )


def _classify_power_or_thermal(event: health.HealthEvent, pol: policy.ClassificationPolicy) -> Classification:
    name = event.kind.name.lower()
    return Classification(
        Component.GPU,
        Severity.WARNING,
        RecommendedAction.NONE,
        f"{name}: the power controller handles it; no repair",
        name,
    )


_BY_KIND: Mapping[EventKind, Callable[[health.HealthEvent, policy.ClassificationPolicy], Classification]] = {
    EventKind.SXID: _classify_sxid,
    EventKind.ECC_DBE: _classify_ecc_dbe,
    EventKind.ECC_SBE_RATE: _classify_ecc_sbe_rate,
    EventKind.ROW_REMAP_PENDING: _classify_row_remap_pending,
    EventKind.RETIRED_PAGES: _classify_retired_pages,
    EventKind.FALLEN_OFF_BUS: _classify_off_bus,
    EventKind.GPU_LOST: _classify_off_bus,
    EventKind.NVLINK_DOWN: _classify_nvlink_down,
    EventKind.NVLINK_ERRORS: _classify_nvlink_errors,
    EventKind.PCIE_REPLAY: _classify_pcie_replay,
    EventKind.SDC_SUSPECT: _classify_sdc_suspect,
    EventKind.STRAGGLER: _classify_straggler,
    EventKind.NODE_LOST: _classify_node_lost,
    EventKind.POWER_EXCURSION: _classify_power_or_thermal,
    EventKind.THERMAL: _classify_power_or_thermal,
}
"""The event kinds whose classification needs nothing but the event and the thresholds."""


def _classify_recovery_action(event: health.HealthEvent) -> Classification:
    action = recovery_action_of(event)
    source = "Xid 154" if event.xid == _RECOVERY_XID else "NVML recovery action"
    if action is None:
        return Classification(
            Component.GPU,
            Severity.WARNING,
            RecommendedAction.INVESTIGATE,
            f"{source} names no recovery action rasd knows: a person must read it",
            "recovery_action",
        )
    word, severity = xid_catalog.recovery_action_policy(action)
    return Classification(
        Component.GPU,
        _SEVERITY_WORDS[severity],
        _action_word(word),
        f"{source} says {action.name}: the driver asks for {word}",
        "recovery_action",
    )


def _decode_nvlink5(
    event: health.HealthEvent, rules: tuple[xid_catalog.Nvlink5Rule, ...]
) -> xid_catalog.Nvlink5Decode | None:
    """The decode-sheet row for an Xid 144-150 event from its kernel-log facts, or None when it cannot be decoded."""
    if not rules or event.xid is None or not _NVLINK5_XIDS[0] <= event.xid <= _NVLINK5_XIDS[1]:
        return None
    facts = health.kernel_log_of(event)
    if facts is None or len(facts.registers) < 2:
        return None
    intr_info, error_status = facts.registers[0], facts.registers[1]
    return xid_catalog.decode_nvlink5(event.xid, intr_info, error_status, subcode=facts.nvlink_subcode, rules=rules)


def _classify_xid(
    event: health.HealthEvent,
    catalog: xid_catalog.XidCatalog,
    pol: policy.ClassificationPolicy,
    nvlink5_rules: tuple[xid_catalog.Nvlink5Rule, ...],
) -> Classification:
    xid = event.xid
    key = f"xid:{xid}"
    component = Component.NVLINK if xid in _NVLINK_XIDS else Component.GPU
    entry = catalog.get(xid) if xid is not None else None
    if entry is None:
        return Classification(
            component,
            Severity.WARNING,
            RecommendedAction.INVESTIGATE,
            f"Xid {xid} is not in NVIDIA's catalog: a person must look",
            key,
        )
    action = _action_word(xid_catalog.recommended_action(entry))
    severity = _SEVERITY_WORDS.get(xid_catalog.default_severity(entry), Severity.WARNING)
    reason = f"Xid {xid} ({entry.mnemonic}): NVIDIA bucket {entry.immediate_action or 'unassigned'} → {action}"
    decoded = _decode_nvlink5(event, nvlink5_rules)
    if decoded is not None:
        word, severity_word = xid_catalog.bucket_policy(decoded.immediate_action)
        action = _action_word(word)
        severity = _SEVERITY_WORDS.get(severity_word, Severity.WARNING)
        reason = (
            f"Xid {xid} {decoded.subcode} ({decoded.rule.severity}, {decoded.driver_format} registers): "
            f"NVIDIA's NVLink5 decode bucket {decoded.immediate_action} → {action}"
        )
    override = pol.xid_action_overrides.get(xid) if xid is not None else None
    if override is not None:
        action = _action_word(override)
        reason = f"Xid {xid} ({entry.mnemonic}): site policy overrides NVIDIA's bucket → {action}"
    if xid == _FALLEN_OFF_BUS_XID and action in (
        RecommendedAction.NONE,
        RecommendedAction.RESTART_PROCESS,
        RecommendedAction.RESET_GPU,
    ):
        # The GPU is unreachable on PCIe: nothing below a reboot can work, whatever the table says.
        action = RecommendedAction.REBOOT_NODE
        severity = Severity.FATAL
        reason = f"Xid {xid}: the GPU fell off the bus, a reset cannot reach it, the node must reboot"
    if xid == _CONTAINED_XID and action is RecommendedAction.RESTART_PROCESS:
        reason += "; the GPU is reset to remap the row once it is idle, the other applications continue"
        return Classification(component, severity, action, reason, key, reset_when_idle=True)
    return Classification(component, severity, action, reason, key)


def _classify_ib(event: health.HealthEvent, pol: policy.ClassificationPolicy, state_changes: int) -> Classification:
    port = event.ib_port or "?"
    if state_changes >= pol.ib_flap_state_changes:
        if pol.ib_flap_isolation == "port":
            return Classification(
                Component.IB_PORT,
                Severity.ERROR,
                RecommendedAction.QUARANTINE_PORT,
                f"IB port {port} changed state {state_changes} times in {pol.ib_flap_window_s:g}s: "
                "isolate the port, the node keeps its others",
                f"ib_flap:{port}",
            )
        return Classification(
            Component.IB_PORT,
            Severity.ERROR,
            RecommendedAction.QUARANTINE_NODE,
            f"IB port {port} changed state {state_changes} times in {pol.ib_flap_window_s:g}s: "
            "quarantine the node until a person checks the link",
            "ib_flap",
        )
    facts = health.kernel_log_of(event)
    state = facts.ib_state if facts is not None and facts.ib_state else event.attributes.get("ib_state", "?")
    return Classification(
        Component.IB_PORT,
        Severity.INFO,
        RecommendedAction.NONE,
        f"IB port {port} is {state} ({state_changes} state changes in the window): below the flap limit",
        f"ib_state:{port}",
    )
