"""The interruption mix of `rasd-sim goodput`: Llama 3's causes, what rasd's agent sees of each, and what fixes it.

Counts: Meta, "The Llama 3 Herd of Models" (arXiv 2407.21783 §3.3.4), 419 unexpected interruptions in
a 54-day snapshot of pre-training on 16,384 H100 GPUs, by cause, as quoted in
shared/reference/ras-anchors.md §6 (the counts, not the published percentages, which do not add up).

What the paper does not say, and this module assumes (each line below says which): the kernel-log
signal each cause leaves (an Xid, a row-remap failure, an IB port flapping, an SDC accusation, or
nothing rasd can see: a software bug, a host part), and the cheapest repair that truly fixes it
(`Variant.fix`). The simulator uses the fix only to answer the ladder's commands and validations the
way the hardware would; which repair to try is the real core's decision.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from rasd.common.vocabulary import EventKind

LLAMA3_DAYS = 54.0
LLAMA3_GPUS = 16_384
LLAMA3_UNEXPECTED = 419

FIX_JOB = "job"
"""Software: restarting the job from its checkpoint is the whole repair."""
FIX_PERSON = "person"
"""Outside what the ladder can do (a cable, a switch port, a host part): a person repairs it."""
LADDER_FIXES = ("restart_process", "reset_gpu", "reboot_node", "power_cycle_bmc", "rma")
"""The ladder's rungs, cheapest first: a fix named by one is repaired by it or any rung above it."""


@dataclasses.dataclass(frozen=True)
class Variant:
    """One way a cause shows up: its share of the cause, the signal rasd sees, and what fixes it."""

    share: float
    signal: str
    """"xid:<n>", "row_remap_failure", "ib_flap", "sdc_suspect", "node_lost" (the agent falls silent: the
    controller's lost-node watch names it), "job_stall" (the straggler watch names a hung job), or ""
    (nothing rasd sees)."""
    fix: str
    """A ladder rung (`LADDER_FIXES`), `FIX_JOB` or `FIX_PERSON`."""
    hangs: bool = False
    """The job hangs rather than crashes: the scheduler hears of it only at the collective's timeout."""
    node_down: bool = False
    """The node itself is gone (a host part): the scheduler sees it NotReady."""

    def rank(self) -> int:
        """The fix's place on the ladder (1 restart .. 5 RMA); 0 when the ladder cannot fix it."""
        return LADDER_FIXES.index(self.fix) + 1 if self.fix in LADDER_FIXES else 0


@dataclasses.dataclass(frozen=True)
class Cause:
    """One row of the Llama 3 table."""

    name: str
    count: int
    variants: tuple[Variant, ...]


HOST_DOWN = Variant(1.0, "node_lost", FIX_PERSON, node_down=True)
"""A host part fails: the node goes down with its agent, which falls silent (no Xid, no event)."""
_HOST = (HOST_DOWN,)

LLAMA3_CAUSES: tuple[Cause, ...] = (
    # Assumed: a faulty GPU falls off the bus (Xid 79); a reboot brings 70 % back, 30 % need replacing.
    Cause("faulty_gpu", 148, (Variant(0.7, "xid:79", "reboot_node"), Variant(0.3, "xid:79", "rma"))),
    # Assumed: an HBM3 double-bit error (Xid 48) that a reset's row remap repairs, 20 % out of spare rows.
    Cause("gpu_hbm3", 72, (Variant(0.8, "xid:48", "reset_gpu"), Variant(0.2, "row_remap_failure", "rma"))),
    Cause("software_bug", 54, (Variant(1.0, "", FIX_JOB),)),
    # Assumed: a bad cable or switch port shows as the node's IB port flapping; a person replaces it.
    Cause("network_switch_cable", 35, (Variant(1.0, "ib_flap", FIX_PERSON),)),
    Cause("host_maintenance", 32, _HOST),
    # Assumed: an SRAM error is uncontained (Xid 95); a reset clears 80 %, the rest recur and are replaced.
    Cause("gpu_sram", 19, (Variant(0.8, "xid:95", "reset_gpu"), Variant(0.2, "xid:95", "rma"))),
    # Assumed: a GSP RPC timeout (Xid 119); a reset clears half, the other half need a reboot.
    Cause("gpu_gsp", 17, (Variant(0.5, "xid:119", "reset_gpu"), Variant(0.5, "xid:119", "reboot_node"))),
    Cause("nic", 7, (Variant(1.0, "ib_flap", FIX_PERSON),)),
    # A hung collective: the job's steps stop while its GPUs spin. rasd's straggler watch names the stall
    # and restarts a rank (the launcher then restarts the job); the baseline waits for the watchdog.
    Cause("nccl_watchdog", 7, (Variant(1.0, "job_stall", "restart_process", hangs=True),)),
    # Assumed: the job's loss-spike check accuses the GPU; it reproduces, so it is replaced.
    Cause("silent_data_corruption", 6, (Variant(1.0, "sdc_suspect", "rma"),)),
    # Assumed: a failed thermal interface overheats the GPU off the bus (Xid 79); the part is replaced.
    Cause("gpu_thermal_interface_sensor", 6, (Variant(1.0, "xid:79", "rma"),)),
    Cause("ssd", 3, _HOST),
    Cause("psu", 3, _HOST),
    Cause("chassis", 2, _HOST),
    Cause("io_board", 2, _HOST),
    Cause("dependency", 2, (Variant(1.0, "", FIX_JOB),)),
    Cause("cpu", 2, _HOST),
    Cause("system_memory", 2, _HOST),
)


def total(causes: tuple[Cause, ...] = LLAMA3_CAUSES) -> int:
    """How many interruptions the table lists (419 for Llama 3's)."""
    return sum(c.count for c in causes)


def rate_per_gpu_s(causes: tuple[Cause, ...] = LLAMA3_CAUSES) -> float:
    """Unexpected interruptions per GPU-second at the table's rate (419 / (16,384 GPUs × 54 days))."""
    return total(causes) / (LLAMA3_GPUS * LLAMA3_DAYS * 86_400.0)


def event_fields(signal: str, gpu_uuid: str) -> tuple[Mapping[str, Any], ...]:
    """What the agent sends for a signal, as `HealthEvent` fields, one mapping per event (an IB flap: six).

    Raises:
        ValueError: the signal is not one this module names (nothing rasd sees is `()`, not asked).
    """
    if signal.startswith("xid:"):
        return ({"kind": EventKind.XID, "xid": int(signal[4:]), "gpu_uuid": gpu_uuid, "source": "kmsg"},)
    if signal == "row_remap_failure":
        return ({"kind": EventKind.ROW_REMAP_FAILURE, "gpu_uuid": gpu_uuid, "source": "nvml"},)
    if signal == "node_lost":  # the controller's own event: its lost-node watch, not the agent
        return ({"kind": EventKind.NODE_LOST, "source": "controller", "message": "no replica hears its agent"},)
    if signal == "job_stall":  # the straggler watch's verdict (`core.stall`), not the agent's
        return (
            {
                "kind": EventKind.STRAGGLER,
                "gpu_uuid": gpu_uuid,
                "source": "straggler",
                "message": "the job's steps stopped; its GPUs still busy: a hung collective",
                "attributes": {"rung": "restart"},
            },
        )
    if signal == "sdc_suspect":
        return ({"kind": EventKind.SDC_SUSPECT, "gpu_uuid": gpu_uuid, "source": "validation"},)
    if signal == "ib_flap":  # three down/up pairs: the classification's default flap limit is six changes
        return tuple(
            {
                "kind": EventKind.IB_LINK_STATE,
                "source": "kmsg",
                "attributes": {"ib_device": "mlx5_0", "ib_port": "1", "ib_state": state},
            }
            for state in ("down", "active") * 3
        )
    raise ValueError(f"unknown fault signal {signal!r}")
