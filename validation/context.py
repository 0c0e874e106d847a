"""What every run() adapter receives: the devices, seed, budget and the optional node-side hooks.

The hooks are how the suite learns about the node without importing the agent (the components never
import each other): on a node the agent passes telemetry values in (``--health-json`` or a callable);
standalone, every hook defaults to "unknown" and the checks that need it say so.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping

from rasd.validation.faults import FaultInjector
from rasd.validation.runtime import Budget, Device


@dataclasses.dataclass(frozen=True)
class HealthSnapshot:
    """V0's input for one GPU. ``None`` in a field means "not known here", never "zero".

    Attributes:
        row_remap_failure: NVML ``RemappedRows.failureOccurred`` (an RMA criterion).
        row_remap_pending: NVML ``RemappedRows.isPending`` (needs a GPU reset before testing).
        sram_threshold_exceeded: NVML ``EccSramErrorStatus.bThresholdExceeded`` (an RMA criterion).
        new_xids: XID codes seen on this GPU since the previous validation run.
        new_uncorrectable_ecc: uncorrectable ECC errors since the previous run.
        new_correctable_ecc: correctable ECC errors since the previous run.
    """

    row_remap_failure: bool | None = None
    row_remap_pending: bool | None = None
    sram_threshold_exceeded: bool | None = None
    new_xids: tuple[int, ...] | None = None
    new_uncorrectable_ecc: int | None = None
    new_correctable_ecc: int | None = None

    @classmethod
    def from_json(cls, data: Mapping[str, object]) -> HealthSnapshot:
        """Build from the ``--health-json`` per-GPU object; unknown keys are rejected.

        Raises:
            ValueError: on a key that is not a field.
        """
        fields = {f.name for f in dataclasses.fields(cls)}
        extra = set(data) - fields
        if extra:
            raise ValueError(f"unknown health fields {sorted(extra)}; expected a subset of {sorted(fields)}")
        values = dict(data)
        if values.get("new_xids") is not None:
            values["new_xids"] = tuple(int(x) for x in values["new_xids"])  # type: ignore[attr-defined]
        return cls(**values)  # type: ignore[arg-type]


@dataclasses.dataclass(frozen=True)
class EccCounts:
    """Volatile ECC counters of one GPU, sampled by the ECC watch around the memory test."""

    correctable: int
    uncorrectable: int


# gpu -> snapshot, or None when the source cannot say anything about that GPU.
HealthProvider = Callable[[int], HealthSnapshot | None]
# gpu -> counters, or None when ECC counters are not readable (CPU, no NVML).
EccProbe = Callable[[int], EccCounts | None]


@dataclasses.dataclass
class RunContext:
    """Inputs shared by every check's run() in one suite run.

    Attributes:
        devices: the GPUs (or CPU slots) under test.
        seed: the suite seed; each check derives its own streams from it.
        budget: the deadline this check must respect.
        injector: fault injection hook, or None on a real validation run.
        health: V0's telemetry source; None = unknown, V0 is skipped with that reason.
        ecc_probe: V4's ECC watch; None = not available, reported as such.
        golden_path: V2's golden store file; None = no golden, peers only.
        sleep: how idle phases wait (V3 pulsed stress); injectable so tests never sleep.
    """

    devices: list[Device]
    seed: int
    budget: Budget
    injector: FaultInjector | None = None
    health: HealthProvider | None = None
    ecc_probe: EccProbe | None = None
    golden_path: str | None = None
    sleep: Callable[[float], None] = time.sleep

    def injects(self, check: str) -> FaultInjector | None:
        """The injector if it targets ``check``, else None."""
        if self.injector is not None and self.injector.applies(check):
            return self.injector
        return None
