"""NVIDIA's XID catalog as data: what each Xid means and what NVIDIA says to do about it.

The catalog ships inside the package (``rasd/common/data/nvidia-xid-catalog.csv``, copied verbatim from
NVIDIA's "Xid catalog" workbook, XIDs sheet) together with the resolution-bucket glossary and the
NVLink5 (Xid 144-150) register decode sheet. This module reads them once and turns NVIDIA's
resolution buckets into rasd's own repair-ladder words for the controller's classifier (which
``rasctl kmsg classify`` runs too).

Bucket mapping (catalog "Resolution Bucket (Immediate Action)" -> ``recommended_action``,
``default_severity``); the reasons come from ``nvidia-xid-resolution-buckets.csv``:

=========================  ==================  ========  ==============================================
bucket                     recommended_action  severity  why
=========================  ==================  ========  ==============================================
IGNORE                     none                info      "No Action required"
RESTART_APP                restart_process     error     "application should be restarted; RESET_GPU
                                                         or RESTART_BM is not deemed necessary"
RESET_GPU                  reset_gpu           fatal     GPU unusable until reset
RESTART_BM                 reboot_node         fatal     "system should be restarted" (e.g. Xid 79)
RESTART_VM                 reboot_node         fatal     VM owning the GPU must restart; on bare metal
                                                         the node is the VM
WORKFLOW_XID_48            reset_gpu           fatal     DBE: "Solo: RESET_GPU; w/ 63 or 64:
                                                         DRAIN_AND_RESET" (both reset the GPU)
WORKFLOW_XID_45            none                warning   "Not Solo: IGNORE (follow guidance in other
                                                         Xid)"; Xid 45 is the secondary cleanup
WORKFLOW_NVLINK_ERR        reset_gpu           fatal     Xid 74: NVLink fatal error; registers say
                                                         more but the link is down until reset
WORKFLOW_NVLINK5_ERR       reset_gpu           fatal     Xid 144-150 default; ``decode_nvlink5`` gives
                                                         the exact bucket from IntrInfo/ErrorStatus
XID_154                    (recovery action)   (idem)    "Follow XID 154 reported guidance": see
                                                         ``RecoveryAction``; "investigate"/"warning"
                                                         when the action text is unknown
CONTACT_SUPPORT            contact_support     error     NVIDIA support must look at it
UPDATE_SWFW                investigate         warning   driver/firmware mismatch, not a GPU fault
CHECK_MECHANICALS          investigate         warning   seating / aux power: a person must look
CHECK_UVM                  investigate         warning   "If UVM/vGPU ... RESET_GPU; otherwise IGNORE"
(empty, e.g. Xid 162-172)  investigate         warning   NVIDIA has not assigned a bucket yet
=========================  ==================  ========  ==============================================

Recovery action (NVML field 230, Xid 154) -> (recommended_action, severity):
NONE -> none/info, GPU_RESET -> reset_gpu/fatal, NODE_REBOOT -> reboot_node/fatal,
DRAIN_P2P -> restart_process/warning (stop the P2P processes, then the GPU reports the next action;
DCGM rates it WARN), DRAIN_AND_RESET -> reset_gpu/fatal, RECOVER_IMEX_DOMAIN -> investigate/error,
BUS_RESET -> reset_gpu/fatal, SYSTEM_REBOOT -> reboot_node/fatal.
"""

from __future__ import annotations

import csv
import dataclasses
import enum
import functools
import importlib.resources
import io
import re
from collections.abc import Iterator

_DATA_PACKAGE = "rasd.common"
_CATALOG_FILE = "data/nvidia-xid-catalog.csv"
_NVLINK5_FILE = "data/nvidia-xid-nvlink5-decode.csv"

RECOMMENDED_ACTIONS = (
    "none",
    "restart_process",
    "reset_gpu",
    "reboot_node",
    "rma",
    "contact_support",
    "investigate",
)
SEVERITIES = ("info", "warning", "error", "fatal")


@dataclasses.dataclass(frozen=True)
class XidEntry:
    """One row of NVIDIA's XID catalog."""

    xid: int
    mnemonic: str
    description: str
    immediate_action: str
    investigatory_action: str
    xid154_linkage: str
    applies_to: frozenset[str]
    trigger_conditions: str


class XidCatalog:
    """All catalog entries, looked up by Xid number, with the NVLink5 decode sheet that refines Xid 144-150."""

    def __init__(self, entries: tuple[XidEntry, ...], nvlink5_rules: tuple[Nvlink5Rule, ...] = ()) -> None:
        """Index the entries; nvlink5_rules: NVIDIA's "XID 144-150 Decode" sheet (empty: not decoded)."""
        self._entries = tuple(sorted(entries, key=lambda e: e.xid))
        self._by_xid = {e.xid: e for e in self._entries}
        self.nvlink5_rules = nvlink5_rules

    def get(self, xid: int) -> XidEntry | None:
        """The entry for ``xid``, or None when NVIDIA's catalog does not list it."""
        return self._by_xid.get(xid)

    def __contains__(self, xid: object) -> bool:
        return xid in self._by_xid

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[XidEntry]:
        return iter(self._entries)

    def entries(self) -> tuple[XidEntry, ...]:
        """Every entry, sorted by Xid number."""
        return self._entries


def _norm(text: str) -> str:
    """Collapse the workbook's embedded newlines and runs of spaces into single spaces."""
    return " ".join(text.split())


def parse_catalog_csv(text: str) -> XidCatalog:
    """Build a catalog from the CSV text of NVIDIA's XIDs sheet.

    Columns are found by header name, not position, because NVIDIA adds product columns
    ("Applies to <product>") as new GPUs ship.

    Args:
        text: the whole CSV file.

    Returns:
        The catalog; rows whose Code is not an integer are skipped.
    """
    reader = csv.reader(io.StringIO(text, newline=""))
    header = [_norm(h) for h in next(reader)]

    def col(prefix: str) -> int:
        for i, h in enumerate(header):
            if h.startswith(prefix):
                return i
        raise ValueError(f"XID catalog has no column starting with {prefix!r}")

    code_i, mnem_i, desc_i = col("Code"), col("Mnemonic"), col("Description")
    imm_i = col("Resolution Bucket (Immediate")
    inv_i = col("Resolution Bucket (Investigatory")
    link_i, trig_i = col("Xid 154 linkage"), col("Trigger Conditions")
    products = {i: h.removeprefix("Applies to").strip() for i, h in enumerate(header) if h.startswith("Applies to")}
    entries = []
    for row in reader:
        if len(row) < len(header) or not row[code_i].strip().isdigit():
            continue
        entries.append(
            XidEntry(
                xid=int(row[code_i]),
                mnemonic=_norm(row[mnem_i]),
                description=_norm(row[desc_i]),
                immediate_action=_norm(row[imm_i]),
                investigatory_action=row[inv_i].strip(),
                xid154_linkage=_norm(row[link_i]),
                applies_to=frozenset(p for i, p in products.items() if row[i].strip().upper() == "YES"),
                trigger_conditions=row[trig_i].strip(),
            )
        )
    return XidCatalog(tuple(entries))


@functools.cache
def load_catalog() -> XidCatalog:
    """The packaged catalog with the packaged NVLink5 decode sheet, parsed once per process."""
    text = importlib.resources.files(_DATA_PACKAGE).joinpath(_CATALOG_FILE).read_text(encoding="utf-8")
    return XidCatalog(parse_catalog_csv(text).entries(), nvlink5_rules=load_nvlink5_rules())


class RecoveryAction(enum.IntEnum):
    """GPU recovery action: NVML field 230 (NVML_FI_DEV_GET_GPU_RECOVERY_ACTION) and Xid 154 values."""

    NONE = 0
    GPU_RESET = 1
    NODE_REBOOT = 2
    DRAIN_P2P = 3
    DRAIN_AND_RESET = 4
    # Newer drivers / pynvml 13.6xx (see shared/reference/nvml-api.md §6.1).
    RECOVER_IMEX_DOMAIN = 5
    BUS_RESET = 6
    SYSTEM_REBOOT = 7


# Keys are lower-cased text with everything but letters removed, so "Node Reboot Required",
# "NODE_REBOOT" and "node reboot" all match.
_RECOVERY_TEXT = {
    "none": RecoveryAction.NONE,
    "gpureset": RecoveryAction.GPU_RESET,
    "gpuresetrequired": RecoveryAction.GPU_RESET,
    "nodereboot": RecoveryAction.NODE_REBOOT,
    "noderebootrequired": RecoveryAction.NODE_REBOOT,
    "drainpp": RecoveryAction.DRAIN_P2P,
    "drainppandreset": RecoveryAction.DRAIN_AND_RESET,
    "drainandreset": RecoveryAction.DRAIN_AND_RESET,
    "drainandresetrequired": RecoveryAction.DRAIN_AND_RESET,
    "drainandresetrecommended": RecoveryAction.DRAIN_AND_RESET,
    "drainppandresetgpu": RecoveryAction.DRAIN_AND_RESET,
    "drainppandresetrequired": RecoveryAction.DRAIN_AND_RESET,
    "drainpprequired": RecoveryAction.DRAIN_P2P,
    "recoverimexdomain": RecoveryAction.RECOVER_IMEX_DOMAIN,
    "busreset": RecoveryAction.BUS_RESET,
    "busresetrequired": RecoveryAction.BUS_RESET,
    "systemreboot": RecoveryAction.SYSTEM_REBOOT,
    "systemrebootrequired": RecoveryAction.SYSTEM_REBOOT,
    # Wordings seen in the wild for the same values (driver builds differ).
    "osreboot": RecoveryAction.NODE_REBOOT,
    "pfflr": RecoveryAction.GPU_RESET,
    "reset": RecoveryAction.GPU_RESET,
    "reboot": RecoveryAction.NODE_REBOOT,
}


def parse_recovery_action_text(text: str) -> RecoveryAction | None:
    """Turn a recovery-action name as the driver prints it into a RecoveryAction.

    Accepts the Xid 154 parenthesised names ("None", "GPU Reset Required", "Node Reboot Required",
    "Drain P2P", "Drain and Reset") and the NVML constant names ("NODE_REBOOT"), any case.

    Args:
        text: the name, with or without surrounding spaces or parentheses.

    Returns:
        The action, or None when the text names no known action.
    """
    key = re.sub(r"[^a-z]", "", text.lower())
    return _RECOVERY_TEXT.get(key)


_RECOVERY_POLICY: dict[RecoveryAction, tuple[str, str]] = {
    RecoveryAction.NONE: ("none", "info"),
    RecoveryAction.GPU_RESET: ("reset_gpu", "fatal"),
    RecoveryAction.NODE_REBOOT: ("reboot_node", "fatal"),
    RecoveryAction.DRAIN_P2P: ("restart_process", "warning"),
    RecoveryAction.DRAIN_AND_RESET: ("reset_gpu", "fatal"),
    RecoveryAction.RECOVER_IMEX_DOMAIN: ("investigate", "error"),
    RecoveryAction.BUS_RESET: ("reset_gpu", "fatal"),
    RecoveryAction.SYSTEM_REBOOT: ("reboot_node", "fatal"),
}

_BUCKET_POLICY: dict[str, tuple[str, str]] = {
    "IGNORE": ("none", "info"),
    "RESTART_APP": ("restart_process", "error"),
    "RESET_GPU": ("reset_gpu", "fatal"),
    "RESTART_BM": ("reboot_node", "fatal"),
    "RESTART_VM": ("reboot_node", "fatal"),
    "WORKFLOW_XID_48": ("reset_gpu", "fatal"),
    "WORKFLOW_XID_45": ("none", "warning"),
    "WORKFLOW_NVLINK_ERR": ("reset_gpu", "fatal"),
    "WORKFLOW_NVLINK5_ERR": ("reset_gpu", "fatal"),
    "CONTACT_SUPPORT": ("contact_support", "error"),
    "UPDATE_SWFW": ("investigate", "warning"),
    # NVLink5 decode-sheet buckets (see decode_nvlink5).
    "XID_154_EVAL": ("restart_process", "error"),
}

_UNKNOWN_POLICY = ("investigate", "warning")


def bucket_policy(bucket: str, recovery_action: RecoveryAction | None = None) -> tuple[str, str]:
    """(recommended_action, severity) for a resolution-bucket name; the table is in the module docstring.

    Args:
        bucket: a "Resolution Bucket (Immediate Action)" value, e.g. "RESET_GPU".
        recovery_action: for the XID_154 bucket, the action the driver reported.

    Returns:
        The rasd action word and severity.
    """
    name = _norm(bucket).upper()
    if name == "XID_154":
        if recovery_action is None:
            return _UNKNOWN_POLICY
        return _RECOVERY_POLICY[recovery_action]
    if name in _BUCKET_POLICY:
        return _BUCKET_POLICY[name]
    return _UNKNOWN_POLICY  # CHECK_*, empty and any bucket NVIDIA adds later


def recovery_action_policy(action: RecoveryAction) -> tuple[str, str]:
    """(recommended_action, severity) for a GPU recovery action (NVML field 230 or Xid 154)."""
    return _RECOVERY_POLICY[action]


def recommended_action(entry: XidEntry, recovery_action: RecoveryAction | None = None) -> str:
    """The repair word (rung of the rasd ladder) for a catalog entry.

    Args:
        entry: the catalog row.
        recovery_action: for Xid 154, the action parsed from the message; ignored otherwise.

    Returns:
        One of RECOMMENDED_ACTIONS.
    """
    return bucket_policy(entry.immediate_action, recovery_action)[0]


def default_severity(entry: XidEntry, recovery_action: RecoveryAction | None = None) -> str:
    """The severity of a catalog entry when nothing else is known ("info" .. "fatal").

    Args:
        entry: the catalog row.
        recovery_action: for Xid 154, the action parsed from the message; ignored otherwise.

    Returns:
        One of SEVERITIES.
    """
    return bucket_policy(entry.immediate_action, recovery_action)[1]


@dataclasses.dataclass(frozen=True)
class Nvlink5Rule:
    """One row of NVIDIA's "XID 144-150 Decode" sheet.

    Masks are 32 characters, most significant bit first; "-" is a bit the rule does not look at.
    V1 masks apply to drivers before R575, V2 masks to R575 and later.
    """

    xid: int
    subcode_v1: str
    subcode_v2: str
    intr_mask_v1: str
    intr_mask_v2: str
    error_status: frozenset[int]  # empty: any value
    immediate_action: str
    action2_mask_v1: str
    action2_mask_v2: str
    action2: str
    investigatory_action: str
    severity: str


@dataclasses.dataclass(frozen=True)
class Nvlink5Decode:
    """What the decode sheet says about one Xid 144-150 message."""

    rule: Nvlink5Rule
    driver_format: str  # "V1" (<R575) or "V2" (>=R575)
    immediate_action: str  # the rule's bucket, or its Action 2 when the action-2 mask matched

    @property
    def subcode(self) -> str:
        """The subcode name in the driver format that matched."""
        return self.rule.subcode_v1 if self.driver_format == "V1" else self.rule.subcode_v2


def _mask_matches(mask: str, value: int) -> bool:
    if len(mask) != 32:
        return False
    bits = format(value & 0xFFFFFFFF, "032b")
    return all(m in ("-", b) for m, b in zip(mask, bits, strict=True))


def parse_nvlink5_csv(text: str) -> tuple[Nvlink5Rule, ...]:
    """Parse the "XID 144-150 Decode" sheet (columns by position, as NVIDIA publishes them).

    Args:
        text: the whole CSV file.

    Returns:
        The rules in sheet order; rows without an integer Xid are skipped.
    """
    rules = []
    reader = csv.reader(io.StringIO(text, newline=""))
    next(reader)
    for row in reader:
        if len(row) < 11 or not row[0].strip().isdigit():
            continue
        names = [n.strip() for n in row[1].split("/")]
        statuses = frozenset(int(s, 16) for s in re.findall(r"0x[0-9a-fA-F]+", row[4]))
        rules.append(
            Nvlink5Rule(
                xid=int(row[0]),
                subcode_v1=names[0],
                subcode_v2=names[-1],
                intr_mask_v1=row[2].strip(),
                intr_mask_v2=row[3].strip(),
                error_status=statuses,
                immediate_action=_norm(row[5]),
                action2_mask_v1=row[6].strip(),
                action2_mask_v2=row[7].strip(),
                action2=_norm(row[8]),
                investigatory_action=_norm(row[9]),
                severity=_norm(row[10]),
            )
        )
    return tuple(rules)


@functools.cache
def load_nvlink5_rules() -> tuple[Nvlink5Rule, ...]:
    """The packaged NVLink5 decode sheet, parsed once per process."""
    text = importlib.resources.files(_DATA_PACKAGE).joinpath(_NVLINK5_FILE).read_text(encoding="utf-8")
    return parse_nvlink5_csv(text)


def decode_nvlink5(
    xid: int,
    intr_info: int,
    error_status: int,
    *,
    subcode: str = "",
    rules: tuple[Nvlink5Rule, ...] | None = None,
) -> Nvlink5Decode | None:
    """Find the decode-sheet row for an Xid 144-150 message.

    The message does not say which driver format it uses, so both masks are tried. The subcode
    text printed in the message (e.g. "NETIR_LINK_EVT" in V1, "NETIR_LINK_DOWN" in V2) narrows it
    down when it is given: a format whose subcode name differs from the text is skipped.

    Example: Xid 149 "NETIR_LINK_EVT Fatal ... (0x025001c6 0x00000000 ...)": V1 subcode bits [9:5]
    match NETIR_LINK_EVT and bits [25:20] = 0b100101, so the row is RESET_GPU /
    INVESTIGATE_PEER_DEVICE.

    Args:
        xid: 144..150.
        intr_info: the first register in the parentheses.
        error_status: the second register.
        subcode: the subcode word printed before the fatality, or "" when unknown.
        rules: the decode sheet; the packaged one when None.

    Returns:
        The first matching row, or None when no row matches (report it: NVIDIA asks for a bug).
    """
    sheet = load_nvlink5_rules() if rules is None else rules
    wanted = subcode.strip().upper()
    found = _decode_nvlink5(sheet, xid, intr_info, error_status, wanted)
    if found is None and wanted:
        # A driver may print a subcode name the sheet spells differently; the registers decide.
        found = _decode_nvlink5(sheet, xid, intr_info, error_status, "")
    return found


def _decode_nvlink5(
    sheet: tuple[Nvlink5Rule, ...], xid: int, intr_info: int, error_status: int, wanted: str
) -> Nvlink5Decode | None:
    for rule in sheet:
        if rule.xid != xid:
            continue
        if rule.error_status and error_status not in rule.error_status:
            continue
        for fmt, mask, name, a2_mask in (
            ("V1", rule.intr_mask_v1, rule.subcode_v1, rule.action2_mask_v1),
            ("V2", rule.intr_mask_v2, rule.subcode_v2, rule.action2_mask_v2),
        ):
            if wanted and wanted != name.upper():
                continue
            if _mask_matches(a2_mask, intr_info) and rule.action2:
                return Nvlink5Decode(rule, fmt, rule.action2)
            if _mask_matches(mask, intr_info):
                return Nvlink5Decode(rule, fmt, rule.immediate_action)
    return None
