"""NVIDIA's XID catalog as data: what each Xid means and what NVIDIA says to do about it.

The catalog ships inside the package (``rasd/common/data/nvidia-xid-catalog.csv``, copied verbatim from
NVIDIA's "Xid catalog" workbook, XIDs sheet) together with the resolution-bucket glossary and the
NVLink5 (Xid 144-150) register decode sheet. This module reads them once and turns NVIDIA's
resolution buckets into rasd's own repair-ladder words, so the agent's ``rasctl kmsg classify`` and
the controller's classifier agree.

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
    """All catalog entries, looked up by Xid number."""

    def __init__(self, entries: tuple[XidEntry, ...]) -> None:
        self._entries = tuple(sorted(entries, key=lambda e: e.xid))
        self._by_xid = {e.xid: e for e in self._entries}

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
        return next(i for i, h in enumerate(header) if h.startswith(prefix))

    code_i, mnem_i, desc_i = col("Code"), col("Mnemonic"), col("Description")
    imm_i = col("Resolution Bucket (Immediate")
    inv_i = col("Resolution Bucket (Investigatory")
    link_i, trig_i = col("Xid 154 linkage"), col("Trigger Conditions")
    products = {
        i: h.removeprefix("Applies to").strip() for i, h in enumerate(header) if h.startswith("Applies to")
    }
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
    """The packaged catalog, parsed once per process."""
    text = importlib.resources.files(_DATA_PACKAGE).joinpath(_CATALOG_FILE).read_text(encoding="utf-8")
    return parse_catalog_csv(text)


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
