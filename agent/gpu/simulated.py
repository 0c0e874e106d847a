"""The simulated GPU backend: seeded, deterministic GPUs that train in lock-step.

Product code, not a test helper: `rasd-sim`, `make demo`, the integration tests and dev laptops all
run agents on it. Every reading is a pure function of (seed, node, GPU, time) plus the caps that
were set, so two runs with the same seed and clock produce the same numbers.

Workload model (step-synchronous data-parallel training, see shared/reference/power-anchors.md):
every GPU of every node alternates between a compute phase (about TDP) and a communication phase
(near idle) with the same period and phase anchor across the fleet, so the fleet's draw swings
together. Each GPU ("rank") has its own fixed compute/communication levels and a 5–20 ms phase
jitter. Draw never exceeds the enforced cap: a capped GPU is clock-throttled and reports the
SW_POWER_CAP clock event reason. Fault injection (XIDs, ECC, lost GPUs) enters through `inject()`;
scenario files that script faults build on it.
"""

from __future__ import annotations

import dataclasses
import random
import uuid
from collections.abc import Sequence

from rasd.agent import gpu
from rasd.agent.core import model

NS_PER_S = 1_000_000_000


@dataclasses.dataclass(frozen=True)
class SimulatedGpuModel:
    """Static properties of the simulated GPU product."""

    name: str = "NVIDIA H100 80GB HBM3"
    power_limit_min_w: int = 200
    power_limit_max_w: int = 700
    power_limit_default_w: int = 700
    memory_total_mib: int = 81559
    nvlink_count: int = 18
    idle_w: float = 70.0
    power_smoothing_supported: bool = False


H100_SXM = SimulatedGpuModel()


@dataclasses.dataclass(frozen=True)
class StepWorkload:
    """A synchronous training job: every rank computes, then communicates, in one shared period."""

    period_s: float = 2.0
    """Length of one training step."""
    compute_fraction: float = 0.7
    """Share of the step spent in the compute phase."""
    compute_w: tuple[float, float] = (650.0, 700.0)
    """Range from which each rank draws its compute-phase power."""
    comm_w: tuple[float, float] = (100.0, 150.0)
    """Range from which each rank draws its communication-phase power."""
    rank_jitter_s: tuple[float, float] = (0.005, 0.020)
    """Range of each rank's fixed phase offset."""
    noise_w: float = 8.0
    """Peak amplitude of per-sample measurement noise."""
    anchor_unix_s: float = 0.0
    """Phase anchor shared by the whole fleet; step k starts at anchor + k * period."""

    def __post_init__(self) -> None:
        if not self.period_s > 0:
            raise ValueError(f"StepWorkload.period_s must be > 0, got {self.period_s}")
        if not 0 < self.compute_fraction < 1:
            raise ValueError(f"StepWorkload.compute_fraction must be in (0, 1), got {self.compute_fraction}")


@dataclasses.dataclass
class _SimGpu:
    info: model.GpuInfo
    compute_w: float
    comm_w: float
    jitter_s: float
    enforced_limit_w: int
    lost: bool = False
    energy_mj: float = 0.0
    last_energy_ns: int | None = None
    ecc_sbe: int = 0
    ecc_dbe: int = 0
    remap_pending: bool = False
    remap_failure: bool = False
    remapped_uncorrectable: int = 0
    retired_pages_dbe: int = 0
    pcie_replay: int = 0
    recovery_action: int = 0


def simulated_gpu_uuid(seed: int, node_id: str, index: int) -> str:
    """Deterministic, well-formed GPU UUID for one simulated GPU."""
    rng = random.Random(f"{seed}/{node_id}/{index}")
    return "GPU-" + str(uuid.UUID(int=rng.getrandbits(128), version=4))


class SimulatedBackend:
    """Deterministic fake GPUs for one node. Satisfies `rasd.agent.gpu.GpuBackend`."""

    name = "simulated"

    def __init__(
        self,
        node_id: str,
        gpu_count: int,
        seed: int,
        *,
        workload: StepWorkload | None = None,
        gpu_model: SimulatedGpuModel = H100_SXM,
    ) -> None:
        """Create gpu_count simulated GPUs for node_id.

        Args:
            node_id: the node these GPUs belong to (part of every GPU's identity).
            gpu_count: number of GPUs, 1..64.
            seed: makes levels, jitter, UUIDs and noise reproducible.
            workload: the training job; None means the GPUs idle.
            gpu_model: the simulated product.
        """
        if not 1 <= gpu_count <= 64:
            raise ValueError(f"gpu_count must be in 1..64, got {gpu_count}")
        self._seed = seed
        self._workload = workload
        self._model = gpu_model
        self._pending: list[model.Observation] = []
        self._gpus: dict[str, _SimGpu] = {}
        rng = random.Random(f"{seed}/{node_id}")
        for index in range(gpu_count):
            info = model.GpuInfo(
                uuid=simulated_gpu_uuid(seed, node_id, index),
                model=gpu_model.name,
                pci_bus_id=f"00000000:{0x18 + 0x10 * index:02X}:00.0",
                power_limit_min_w=gpu_model.power_limit_min_w,
                power_limit_max_w=gpu_model.power_limit_max_w,
                power_limit_default_w=gpu_model.power_limit_default_w,
                serial=f"SIM{seed:04d}{index:02d}{rng.randrange(10**6):06d}",
                vbios_version="96.00.99.00.01",
                memory_total_mib=gpu_model.memory_total_mib,
                power_smoothing_supported=gpu_model.power_smoothing_supported,
                labels={"index": str(index)},
            )
            compute_lo, compute_hi = workload.compute_w if workload else (0.0, 0.0)
            comm_lo, comm_hi = workload.comm_w if workload else (0.0, 0.0)
            jitter_lo, jitter_hi = workload.rank_jitter_s if workload else (0.0, 0.0)
            self._gpus[info.uuid] = _SimGpu(
                info=info,
                compute_w=rng.uniform(compute_lo, compute_hi),
                comm_w=rng.uniform(comm_lo, comm_hi),
                jitter_s=rng.uniform(jitter_lo, jitter_hi),
                enforced_limit_w=gpu_model.power_limit_default_w,
            )

    # -- GpuBackend -------------------------------------------------------------------------
    def inventory(self) -> Sequence[model.GpuInfo]:
        """The node's GPUs in index order."""
        return tuple(g.info for g in self._gpus.values())

    def read_power(self, now_unix_ns: int) -> Sequence[model.PowerReading]:
        """Instant draw of every GPU that is not lost; integrates energy as a side effect."""
        readings = []
        for sim in self._gpus.values():
            if sim.lost:
                continue
            power_w = self._draw_w(sim, now_unix_ns)
            if sim.last_energy_ns is not None and now_unix_ns > sim.last_energy_ns:
                sim.energy_mj += power_w * (now_unix_ns - sim.last_energy_ns) / 1e6
            sim.last_energy_ns = now_unix_ns
            readings.append(model.PowerReading(sim.info.uuid, now_unix_ns, power_w))
        return readings

    def read_counters(self, now_unix_ns: int) -> Sequence[model.GpuCounters]:
        """Counters of every GPU that is not lost."""
        counters = []
        for sim in self._gpus.values():
            if sim.lost:
                continue
            demand_w = self._demand_w(sim, now_unix_ns)
            draw_w = min(demand_w, sim.enforced_limit_w)
            reasons = model.ClockEventReason(0)
            if demand_w > sim.enforced_limit_w:
                reasons |= model.ClockEventReason.SW_POWER_CAP
            if self._workload is None:
                reasons |= model.ClockEventReason.GPU_IDLE
            counters.append(
                model.GpuCounters(
                    gpu_uuid=sim.info.uuid,
                    sample_unix_ns=now_unix_ns,
                    enforced_power_limit_w=sim.enforced_limit_w,
                    requested_power_limit_w=sim.enforced_limit_w,
                    total_energy_mj=int(sim.energy_mj),
                    temperature_c=int(32 + 48 * draw_w / self._model.power_limit_max_w),
                    utilization_gpu_pct=0 if self._workload is None else (100 if demand_w > 400 else 35),
                    clock_event_reasons=int(reasons),
                    ecc_sbe_volatile=sim.ecc_sbe,
                    ecc_dbe_volatile=sim.ecc_dbe,
                    ecc_sbe_aggregate=sim.ecc_sbe,
                    ecc_dbe_aggregate=sim.ecc_dbe,
                    retired_pages_sbe=0,
                    retired_pages_dbe=sim.retired_pages_dbe,
                    retired_pages_pending=False,
                    remapped_rows_correctable=0,
                    remapped_rows_uncorrectable=sim.remapped_uncorrectable,
                    remapped_rows_pending=sim.remap_pending,
                    remapped_rows_failure=sim.remap_failure,
                    pcie_replay_count=sim.pcie_replay,
                    recovery_action=sim.recovery_action,
                    nvlinks=tuple(
                        model.NvLinkCounters(link, True, 0, 0, 0) for link in range(self._model.nvlink_count)
                    ),
                    power_smoothing_enabled=False if self._model.power_smoothing_supported else None,
                )
            )
        return counters

    def poll_events(self, now_unix_ns: int, timeout_s: float) -> Sequence[model.Observation]:
        """Observations injected since the last poll; never blocks (simulated time does not pass)."""
        pending, self._pending = self._pending, []
        return pending

    def set_power_limit(self, gpu_uuid: str, power_limit_w: int) -> int:
        """Set a GPU's limit inside its constraints and return the enforced limit read back."""
        sim = self._gpu(gpu_uuid)
        if sim.lost:
            raise gpu.GpuLost(f"{gpu_uuid} is lost")
        info = sim.info
        if not info.power_limit_min_w <= power_limit_w <= info.power_limit_max_w:
            raise gpu.InvalidValue(
                f"power limit {power_limit_w} W for {gpu_uuid} is outside "
                f"[{info.power_limit_min_w}, {info.power_limit_max_w}] W"
            )
        sim.enforced_limit_w = int(power_limit_w)
        return sim.enforced_limit_w

    def close(self) -> None:
        """Nothing to release."""

    # -- fault injection --------------------------------------------------------------------
    def inject(self, observation: model.Observation) -> None:
        """Queue an observation for the next poll and apply its effect on the GPU's counters."""
        sim = self._gpus.get(observation.gpu_uuid)
        if sim is not None:
            kind = observation.kind
            if kind in (model.EventKind.GPU_LOST, model.EventKind.FALLEN_OFF_BUS):
                sim.lost = True
            elif kind is model.EventKind.ECC_DBE:
                sim.ecc_dbe += 1
            elif kind is model.EventKind.ROW_REMAP_PENDING:
                sim.remap_pending = True
            elif kind is model.EventKind.ROW_REMAP_FAILURE:
                sim.remap_failure = True
            elif kind is model.EventKind.PCIE_REPLAY:
                sim.pcie_replay += 100
        self._pending.append(observation)

    # -- the power model --------------------------------------------------------------------
    def _gpu(self, gpu_uuid: str) -> _SimGpu:
        try:
            return self._gpus[gpu_uuid]
        except KeyError:
            raise gpu.GpuNotFound(f"no GPU {gpu_uuid} on this node") from None

    def _demand_w(self, sim: _SimGpu, now_unix_ns: int) -> float:
        """What the workload would draw uncapped at this instant."""
        workload = self._workload
        if workload is None:
            return self._model.idle_w
        t_s = now_unix_ns / NS_PER_S - workload.anchor_unix_s - sim.jitter_s
        phase = (t_s / workload.period_s) % 1.0
        return sim.compute_w if phase < workload.compute_fraction else sim.comm_w

    def _draw_w(self, sim: _SimGpu, now_unix_ns: int) -> float:
        """Demand, throttled to the cap, plus deterministic measurement noise."""
        base_w = min(self._demand_w(sim, now_unix_ns), sim.enforced_limit_w)
        noise_amplitude_w = self._workload.noise_w if self._workload else 1.0
        # Tuples of ints hash deterministically (no PYTHONHASHSEED salt), so noise is reproducible.
        bucket = now_unix_ns // 10_000_000
        unit = (hash((self._seed, bucket, sim.info.pci_bus_id)) % 20001) / 10000.0 - 1.0
        return max(0.0, round(base_w + noise_amplitude_w * unit, 2))
