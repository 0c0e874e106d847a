"""The simulated GPU backend: seeded, deterministic GPUs that train in lock-step.

Product code, not a test helper: `rasd-sim`, `make demo`, the integration tests and dev laptops all
run agents on it. Every reading is a pure function of (seed, node, GPU, time) plus the caps that
were set, so two runs with the same seed and clock produce the same numbers.

Workload model (step-synchronous data-parallel training, see shared/reference/power-anchors.md and
`rasd.agent.gpu.step_job`): every GPU ("rank") alternates between a compute phase (about TDP) and a
communication phase (near idle); a step ends only after its slowest rank, so the fleet's draw swings
together. Each rank has its own fixed compute/communication levels and a 5–20 ms jitter per step; a
cap below demand slows the rank's compute (simple DVFS model; a cap set mid-compute re-times the
rest of the phase from the instant the injected clock gives it), a power-smoothing floor raises the
trough and its ramp rates slow the transitions. Checkpoint stalls, job start and job stop are part
of the workload. Draw never exceeds the enforced cap: a capped GPU is clock-throttled and reports
the SW_POWER_CAP clock event reason. Agents that share one `step_job.StepJob` (as in `rasd-sim`)
run one job across nodes.

Faults are scripted (`ScriptedFault`, loadable from a TOML scenario with `load_faults()`) or injected
directly (`inject()`). A fault changes the GPU the way the real one would show it: an XID or a
fallen-off-bus message appears as an observation (as the kernel log would report it), while ECC,
row-remap, NVLink, PCIe, recovery-action, thermal and power faults only move counters, which the
agent's health evaluator must notice, exactly as on a real GPU. An Xid that an uncorrectable error
raises (48, 94, 95) moves the DBE counter too, unless the fault is ``bare``: then the scenario says
exactly what the GPU reported, and scripts the counter change (an ``ecc_dbe`` fault) on its own, in
the order and at the time it wants. An IB flap names its port and the timing of each flap. An SDC
GPU shows nothing at all: only validation can catch it. `reset_gpu()` and `reboot()` clear what a
reset or reboot clears; a GPU whose work stopped (`set_workload`) draws its idle power.

What goes wrong with the repairs themselves (`ActionFault`: an action that fails, one that hangs
past its deadline, a reboot that never comes back, a BMC that does not answer) is scripted too;
``rasd.agent.node_ops.SimulatedNodeOps`` and rasd-sim's simulated BMC carry it out.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import pathlib
import random
import tomllib
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from rasd.agent import gpu
from rasd.agent.core import model
from rasd.agent.gpu import step_job

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
B200 = SimulatedGpuModel(
    name="NVIDIA B200",
    power_limit_min_w=200,
    power_limit_max_w=1000,
    power_limit_default_w=1000,
    memory_total_mib=183359,
    power_smoothing_supported=True,
)


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
    """Time anchor shared by the whole fleet; the first step starts at anchor + start_after_s."""
    start_after_s: float = 0.0
    """Job start, seconds after the anchor (idle before)."""
    stop_after_s: float | None = None
    """Job stop, seconds after the anchor (idle after); None: runs forever."""
    checkpoint_every_steps: int = 0
    """Every this many steps the job stalls to write a checkpoint (0: never)."""
    checkpoint_s: float = 0.0
    """Length of a checkpoint stall (ranks idle at their communication level)."""

    def shape(self, idle_w: float = 70.0) -> step_job.JobShape:
        """The timing part, for a `step_job.StepJob`."""
        return step_job.JobShape(
            period_s=self.period_s,
            compute_fraction=self.compute_fraction,
            rank_jitter_s=self.rank_jitter_s,
            anchor_unix_s=self.anchor_unix_s,
            start_after_s=self.start_after_s,
            stop_after_s=self.stop_after_s,
            checkpoint_every_steps=self.checkpoint_every_steps,
            checkpoint_s=self.checkpoint_s,
            idle_w=idle_w,
        )

    def __post_init__(self) -> None:
        if not self.period_s > 0:
            raise ValueError(f"StepWorkload.period_s must be > 0, got {self.period_s}")
        if not 0 < self.compute_fraction < 1:
            raise ValueError(f"StepWorkload.compute_fraction must be in (0, 1), got {self.compute_fraction}")


# Fault kind → the event kind the agent should end up reporting (None: silent, validation only).
FAULT_EVENT_KINDS: Mapping[str, model.EventKind | None] = {
    "xid": model.EventKind.XID,
    "ecc_dbe": model.EventKind.ECC_DBE,
    "row_remap_pending": model.EventKind.ROW_REMAP_PENDING,
    "row_remap_failure": model.EventKind.ROW_REMAP_FAILURE,
    "fallen_off_bus": model.EventKind.FALLEN_OFF_BUS,
    "gpu_lost": model.EventKind.GPU_LOST,
    "nvlink_crc_storm": model.EventKind.NVLINK_ERRORS,
    "pcie_replay": model.EventKind.PCIE_REPLAY,
    "ib_link_flap": model.EventKind.IB_LINK_STATE,
    "power_excursion": model.EventKind.POWER_EXCURSION,
    "recovery_action": model.EventKind.RECOVERY_ACTION,
    "thermal": model.EventKind.THERMAL,
    "sdc": None,
    # Stragglers (issue #40): the GPU runs `slowdown` slower and the whole job waits for it every step.
    # A power brake holds its draw below its compute demand: no event, only its clock event reasons
    # (HW power brake) and its power edges show it ("straggler" is its first name).
    "straggler": None,
    "power_brake": None,
    # Thermal throttling: clocks held down to keep the temperature target (draw and speed fall as under
    # a brake); its clock reasons say thermal and it runs hot, and the agent reports the thermal slowdown.
    "thermal_throttle": model.EventKind.THERMAL,
    # A PCIe link trained down (width or generation below its max): the input copy before each step's
    # compute takes longer, so the compute starts late; full clocks, no clock reason.
    "pcie_downtrain": None,
    # A slow node (host CPU, memory, data loader): every GPU of the node starts its compute late; no
    # GPU signal at all.
    "slow_node": None,
    # A hung collective (issue #40, goodput): the job's steps stop; the other ranks spin in NCCL at
    # 100 % utilization while this GPU's rank (stuck: its process stopped issuing work) idles. Until a
    # rank's process is restarted (the launcher then restarts the job) or the run ends.
    "job_hang": None,
}
NODE_LEVEL_FAULTS = frozenset({"ib_link_flap"})
STRAGGLER_FAULTS = frozenset({"straggler", "power_brake", "thermal_throttle", "pcie_downtrain", "slow_node"})
"""Fault kinds that make a straggler (`slowdown`): slow_node makes one of every GPU of its node."""
JOB_FAULTS = frozenset({"job_hang"})
"""Fault kinds of the job, not of a GPU: the step watch names them (`core.stall`), not an event or validation."""
THROTTLED_TEMPERATURE_C = 88
"""What a thermal_throttle GPU reports: above an H100's 87 C slowdown target, under its 92 C HW slowdown."""
PCIE_MAX = (16, 5)
"""Every simulated GPU's PCIe link at its best: x16, Gen5 (an H100 SXM's)."""
PCIE_DOWNTRAINED = (4, 5)
"""A pcie_downtrain fault's link: x4 (a quarter of the lanes trained), Gen5."""


@dataclasses.dataclass(frozen=True)
class ScriptedFault:
    """One fault a simulated node suffers at_s seconds after its backend starts."""

    at_s: float
    kind: str
    gpu: int = 0
    """GPU index on the node (ignored for node-level faults)."""
    xid: int | None = None
    message: str = ""
    duration_s: float = 10.0
    """How long a storm, excursion or thermal episode lasts."""
    count: int = 3
    """Flaps in an ib_link_flap."""
    value: int = 2
    """recovery_action: the NVML recovery action (2 = node reboot required)."""
    bare: bool = False
    """xid: only the kernel-log line, no simulated side effect (no DBE count for 48/94/95, no lost GPU
    for 79, no remap for 63/64): the scenario states exactly what the GPU reported."""
    ib_port: str = "mlx5_0/1"
    """ib_link_flap: the port that flaps, "device/port"."""
    flap_down_s: float = 1.0
    """ib_link_flap: how long the link stays DOWN in each flap before it is ACTIVE again."""
    flap_every_s: float = 2.0
    """ib_link_flap: from one flap's DOWN to the next's (count flaps), unless flap_at_s says."""
    flap_at_s: tuple[float, ...] = ()
    """ib_link_flap: each flap's DOWN, seconds after at_s (overrides count and flap_every_s)."""
    slowdown: float = 0.05
    """Straggler kinds (`STRAGGLER_FAULTS`): how much longer the GPU's compute phase lasts (0.05: 5 %
    slower), for the rest of the run; slow_node: every GPU of the node."""

    def __post_init__(self) -> None:
        if self.kind not in FAULT_EVENT_KINDS:
            raise ValueError(f"fault kind {self.kind!r} is not one of {', '.join(FAULT_EVENT_KINDS)}")
        if self.kind == "xid" and (self.xid is None or not 0 < self.xid < 1000):
            raise ValueError(f"an xid fault needs xid in 1..999, got {self.xid!r}")
        for name in ("at_s", "duration_s", "flap_down_s", "flap_every_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ValueError(f"{name} must be a number, got {value!r}")
        if self.at_s < 0 or self.duration_s <= 0 or self.count < 1:
            raise ValueError("at_s must be ≥ 0, duration_s > 0 and count ≥ 1")
        if not isinstance(self.bare, bool):
            raise ValueError(f"bare must be true or false, got {self.bare!r}")
        if self.bare and self.kind != "xid":
            raise ValueError(f"bare applies to an xid fault only, not {self.kind!r}")
        if isinstance(self.slowdown, bool) or not isinstance(self.slowdown, int | float) or not 0 < self.slowdown < 1:
            raise ValueError(f"slowdown must be a number in (0, 1), got {self.slowdown!r}")
        self._check_flaps()

    def _check_flaps(self) -> None:
        device, _, port = self.ib_port.partition("/") if isinstance(self.ib_port, str) else ("", "", "")
        if not device or not port or "/" in port:
            raise ValueError(f'ib_port must be "device/port" (e.g. "mlx5_0/1"), got {self.ib_port!r}')
        if not self.flap_down_s > 0 or not self.flap_every_s > self.flap_down_s:
            raise ValueError(
                f"flap_down_s must be > 0 and flap_every_s > flap_down_s, got {self.flap_down_s!r} and "
                f"{self.flap_every_s!r}"
            )
        offsets = self.flap_at_s
        if not isinstance(offsets, tuple) or not all(
            isinstance(o, int | float) and not isinstance(o, bool) and o >= 0 for o in offsets
        ):
            raise ValueError(f"flap_at_s must be a list of seconds ≥ 0, got {offsets!r}")
        for before, after in itertools.pairwise(offsets):
            if after - before <= self.flap_down_s:
                raise ValueError(
                    f"flap_at_s must rise by more than flap_down_s ({self.flap_down_s:g} s) per flap, got {offsets!r}"
                )

    def flap_offsets_s(self) -> tuple[float, ...]:
        """Each flap's DOWN, seconds after at_s (ib_link_flap)."""
        return self.flap_at_s or tuple(i * self.flap_every_s for i in range(self.count))

    @property
    def expected_event_kind(self) -> model.EventKind | None:
        """What the agent must report for this fault; None for a silent (SDC) fault."""
        return FAULT_EVENT_KINDS[self.kind]


def parse_fault(data: Mapping[str, Any], where: str) -> ScriptedFault:
    """One fault from a TOML table; errors name the key."""
    allowed = {f.name for f in dataclasses.fields(ScriptedFault)} | {"node"}
    unknown = set(data) - allowed
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {', '.join(sorted(unknown))}")
    fields = {k: v for k, v in data.items() if k != "node"}
    if isinstance(fields.get("flap_at_s"), list):
        fields["flap_at_s"] = tuple(fields["flap_at_s"])
    try:
        return ScriptedFault(**fields)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{where}: {exc}") from None


ACTION_FAULT_OUTCOMES: Mapping[str, frozenset[str]] = {
    "restart_process": frozenset({"fail", "hang", "slow", "stuck"}),
    "reset_gpu": frozenset({"fail", "hang", "slow"}),
    "reboot_node": frozenset({"fail", "hang", "slow", "never_returns"}),
    "run_validation": frozenset({"fail", "hang", "slow", "verdict_fail"}),
    "power_cycle_bmc": frozenset({"fail", "hang", "slow", "no_answer"}),
}
"""Repair action → what can go wrong with it on a simulated node:

- fail: the operation errors (the agent answers FAILED; the BMC raises);
- hang: it blocks past its deadline (``hang_s``, then it fails), so the ladder's timeout answers for it;
- slow: it takes ``hang_s`` and then works;
- stuck: the GPU's processes survive SIGTERM and SIGKILL (uninterruptible), so a reset stays refused;
- never_returns: the node goes down for the reboot and stays down until a BMC power cycle;
- verdict_fail: the validation runs and the GPUs it checks fail it;
- no_answer: the BMC cannot be reached (its Redfish request times out)."""


@dataclasses.dataclass(frozen=True)
class ActionFault:
    """What goes wrong with a repair action on one simulated node (``[[action_faults]]`` of a scenario)."""

    action: str
    """One of `ACTION_FAULT_OUTCOMES`."""
    outcome: str
    gpu: int | None = None
    """Only this GPU's actions (restart, reset, validation); None: any."""
    skip: int = 0
    """Let this many matching actions through first (the first reset works, the second fails)."""
    times: int = 1
    """How many matching actions it hits after those; 0: every one."""
    hang_s: float = 3600.0
    """hang: how long the operation blocks before it fails; slow: how long it takes (rasd-sim ends every
    wait when it stops)."""
    message: str = ""

    def __post_init__(self) -> None:
        outcomes = ACTION_FAULT_OUTCOMES.get(self.action)
        if outcomes is None:
            raise ValueError(f"action {self.action!r} is not one of {', '.join(ACTION_FAULT_OUTCOMES)}")
        if self.outcome not in outcomes:
            raise ValueError(f"outcome {self.outcome!r} of {self.action} is not one of {', '.join(sorted(outcomes))}")
        for name in ("skip", "times"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be an integer ≥ 0, got {value!r}")
        if self.gpu is not None and (isinstance(self.gpu, bool) or not isinstance(self.gpu, int) or self.gpu < 0):
            raise ValueError(f"gpu must be a GPU index ≥ 0, got {self.gpu!r}")
        if isinstance(self.hang_s, bool) or not isinstance(self.hang_s, int | float) or not self.hang_s > 0:
            raise ValueError(f"hang_s must be a number > 0, got {self.hang_s!r}")
        if not isinstance(self.message, str):
            raise ValueError(f"message must be a string, got {self.message!r}")

    def describe(self) -> str:
        """What it does, for an error message: "reset_gpu fails"."""
        return self.message or f"simulated: {self.action} {self.outcome.replace('_', ' ')}"


def parse_action_fault(data: Mapping[str, Any], where: str) -> ActionFault:
    """One ``[[action_faults]]`` table (``node`` is the scenario's); errors name the table and the key."""
    allowed = {f.name for f in dataclasses.fields(ActionFault)} | {"node"}
    unknown = set(data) - allowed
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {', '.join(sorted(unknown))}")
    try:
        return ActionFault(**{k: v for k, v in data.items() if k != "node"})
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{where}: {exc}") from None


def load_faults(path: str | pathlib.Path) -> tuple[ScriptedFault, ...]:
    """The `[[faults]]` of a TOML scenario file (at_s, kind, gpu, xid, message, duration_s, count, value)."""
    try:
        data = tomllib.loads(pathlib.Path(path).read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ValueError(f"scenario {path}: {exc}") from None
    return tuple(parse_fault(f, f"{path}: faults[{i}]") for i, f in enumerate(data.get("faults", [])))


@dataclasses.dataclass(frozen=True)
class FiredFault:
    """Ground truth: a scripted fault that happened, when, and to which GPU."""

    fault: ScriptedFault
    fired_unix_ns: int
    gpu_uuid: str


@dataclasses.dataclass
class _SimGpu:
    info: model.GpuInfo
    rank: int
    """Index of this GPU's rank in the job (-1 without a workload)."""
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
    remapped_correctable: int = 0
    sdc: bool = False
    brake_w: float | None = None
    """A straggler's power brake or thermal throttle: its job's cap is held at or below this (None: none)."""
    throttled: bool = False
    """The brake is thermal (thermal_throttle): SW thermal clock reason and a hot GPU, not a power brake."""
    pcie_link: tuple[int, int] = PCIE_MAX
    """Current PCIe link width (lanes) and generation."""
    smoothing_enabled: bool = False
    smoothing_floor_w: float = 0.0
    filler_floor_w: float = 0.0
    """The node-side trough filler's floor (emulated smoothing), W; 0: off."""
    filler_release: tuple[float, float, int | None] | None = None
    """A trough filler being switched off slowly: (floor it started from W, W/s, start ns or None
    until the next reading)."""
    ramp_w_per_s: tuple[float, float] = (0.0, 0.0)
    """The firmware profile's ramp-up and ramp-down rates while enabled (0: unlimited)."""
    nvlink_crc: int = 0
    crc_storm_until_ns: int = 0
    crc_storm_from_ns: int = 0
    excursion_until_ns: int = 0
    thermal_until_ns: int = 0


def simulated_gpu_uuid(seed: int, node_id: str, index: int) -> str:
    """Deterministic, well-formed GPU UUID for one simulated GPU."""
    rng = random.Random(f"{seed}/{node_id}/{index}")
    return "GPU-" + str(uuid.UUID(int=rng.getrandbits(128), version=4))


class SimulatedBackend:
    """Deterministic fake GPUs for one node. Satisfies `rasd.agent.gpu.GpuBackend`."""

    name = "simulated"
    power_sample_buffer = False
    """Draw is computed when read (a cap set since changes it), so the agent polls `read_power`."""

    def __init__(
        self,
        node_id: str,
        gpu_count: int,
        seed: int,
        *,
        workload: StepWorkload | None = None,
        gpu_model: SimulatedGpuModel = H100_SXM,
        faults: Sequence[ScriptedFault] = (),
        epoch_unix_ns: int | None = None,
        job: step_job.StepJob | None = None,
        clock: Callable[[], int] | None = None,
    ) -> None:
        """Create gpu_count simulated GPUs for node_id.

        Args:
            node_id: the node these GPUs belong to (part of every GPU's identity).
            gpu_count: number of GPUs, 1..64.
            seed: makes levels, jitter, UUIDs and noise reproducible.
            workload: the training job; None means the GPUs idle.
            gpu_model: the simulated product.
            faults: scripted faults; at_s counts from epoch_unix_ns.
            epoch_unix_ns: time zero of the script; None means the first reading's time.
            job: a job shared with other nodes' backends (rasd-sim); None: this node runs its own
                job built from workload.
            clock: unix ns, the clock the readings use; it stamps a cap change, which re-times the
                job's compute from that instant (the setters take no time, as NVML's do not). None:
                the time of the latest reading (deterministic for callers that pass reading times,
                at most one reading interval early).
        """
        if not 1 <= gpu_count <= 64:
            raise ValueError(f"gpu_count must be in 1..64, got {gpu_count}")
        self._seed = seed
        self._workload = workload
        self._model = gpu_model
        self._pending: list[model.Observation] = []
        self._gpus: dict[str, _SimGpu] = {}
        self._script = sorted(faults, key=lambda f: f.at_s)
        self._epoch_ns = epoch_unix_ns
        self._clock = clock
        self._last_reading_ns = 0
        self._delayed: list[tuple[int, model.Observation]] = []
        self._stopped: set[str] = set()
        """GPUs whose share of the job `set_workload` stopped."""
        self.fired: list[FiredFault] = []
        """Every scripted or injected fault that happened, in order (the simulator's ground truth)."""
        rng = random.Random(f"{seed}/{node_id}")
        if workload is not None and job is None:
            job = step_job.StepJob(workload.shape(gpu_model.idle_w), seed)
        self._job = job
        levels: list[tuple[float, float]] = []
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
            levels.append((rng.uniform(compute_lo, compute_hi), rng.uniform(comm_lo, comm_hi)))
            self._gpus[info.uuid] = _SimGpu(info=info, rank=-1, enforced_limit_w=gpu_model.power_limit_default_w)
        if job is not None:
            ranks = job.add_ranks(
                [c for c, _ in levels], [m for _, m in levels], [gpu_model.power_limit_default_w] * gpu_count
            )
            for sim, rank in zip(self._gpus.values(), ranks, strict=True):
                sim.rank = rank

    # -- GpuBackend -------------------------------------------------------------------------
    def inventory(self) -> Sequence[model.GpuInfo]:
        """The node's GPUs in index order."""
        return tuple(g.info for g in self._gpus.values())

    def read_power(self, now_unix_ns: int) -> Sequence[model.PowerReading]:
        """Instant draw of every GPU that is not lost; integrates energy as a side effect."""
        self._advance(now_unix_ns)
        self._release_fillers(now_unix_ns)
        readings = []
        base = self._node_draw_w(now_unix_ns)
        for sim in self._gpus.values():
            if sim.lost:
                continue
            power_w = self._draw_w(sim, now_unix_ns, base.get(sim.info.uuid))
            if sim.last_energy_ns is not None and now_unix_ns > sim.last_energy_ns:
                sim.energy_mj += power_w * (now_unix_ns - sim.last_energy_ns) / 1e6
            sim.last_energy_ns = now_unix_ns
            readings.append(model.PowerReading(sim.info.uuid, now_unix_ns, power_w))
        return readings

    def read_power_samples(self, now_unix_ns: int) -> Sequence[model.PowerSamples]:
        """None: the simulated GPUs keep no sample buffer (`power_sample_buffer` is False)."""
        return ()

    def read_counters(self, now_unix_ns: int) -> Sequence[model.GpuCounters]:
        """Counters of every GPU that is not lost."""
        self._advance(now_unix_ns)
        counters = []
        for sim in self._gpus.values():
            if sim.lost:
                continue
            demand_w = self._demand_w(sim, now_unix_ns)
            draw_w = min(demand_w, sim.enforced_limit_w)
            reasons = model.ClockEventReason(0)
            if demand_w > sim.enforced_limit_w:
                reasons |= model.ClockEventReason.SW_POWER_CAP
            if now_unix_ns < sim.thermal_until_ns:
                reasons |= model.ClockEventReason.HW_THERMAL_SLOWDOWN
            if sim.brake_w is not None:
                reasons |= (
                    model.ClockEventReason.SW_THERMAL_SLOWDOWN
                    if sim.throttled
                    else model.ClockEventReason.HW_POWER_BRAKE_SLOWDOWN
                )
            temperature_c = int(32 + 48 * draw_w / self._model.power_limit_max_w)
            if self._workload is None:
                reasons |= model.ClockEventReason.GPU_IDLE
            counters.append(
                model.GpuCounters(
                    gpu_uuid=sim.info.uuid,
                    sample_unix_ns=now_unix_ns,
                    enforced_power_limit_w=sim.enforced_limit_w,
                    requested_power_limit_w=sim.enforced_limit_w,
                    total_energy_mj=int(sim.energy_mj),
                    temperature_c=max(temperature_c, THROTTLED_TEMPERATURE_C) if sim.throttled else temperature_c,
                    utilization_gpu_pct=self._utilization_pct(sim, now_unix_ns, demand_w),
                    clock_event_reasons=int(reasons),
                    ecc_sbe_volatile=sim.ecc_sbe,
                    ecc_dbe_volatile=sim.ecc_dbe,
                    ecc_sbe_aggregate=sim.ecc_sbe,
                    ecc_dbe_aggregate=sim.ecc_dbe,
                    retired_pages_sbe=0,
                    retired_pages_dbe=sim.retired_pages_dbe,
                    retired_pages_pending=False,
                    remapped_rows_correctable=sim.remapped_correctable,
                    remapped_rows_uncorrectable=sim.remapped_uncorrectable,
                    remapped_rows_pending=sim.remap_pending,
                    remapped_rows_failure=sim.remap_failure,
                    pcie_replay_count=sim.pcie_replay,
                    recovery_action=sim.recovery_action,
                    nvlinks=tuple(
                        model.NvLinkCounters(link, True, self._crc(sim, now_unix_ns) if link == 0 else 0, 0, 0)
                        for link in range(self._model.nvlink_count)
                    ),
                    power_smoothing_enabled=sim.smoothing_enabled if self._model.power_smoothing_supported else None,
                    pcie_link_width=sim.pcie_link[0],
                    pcie_link_width_max=PCIE_MAX[0],
                    pcie_link_gen=sim.pcie_link[1],
                    pcie_link_gen_max=PCIE_MAX[1],
                )
            )
        return counters

    def poll_events(self, now_unix_ns: int, timeout_s: float) -> Sequence[model.Observation]:
        """Observations since the last poll; never blocks (simulated time does not pass)."""
        self._advance(now_unix_ns)
        due = [obs for at_ns, obs in self._delayed if at_ns <= now_unix_ns]
        self._delayed = [(at_ns, obs) for at_ns, obs in self._delayed if at_ns > now_unix_ns]
        pending, self._pending = [*self._pending, *due], []
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
        self._set_limit(sim, int(power_limit_w))
        return sim.enforced_limit_w

    def set_power_smoothing(
        self, gpu_uuid: str, *, enabled: bool, floor_pct: float, ramp_up_w_per_s: float, ramp_down_w_per_s: float
    ) -> None:
        """Hold draw at or above floor_pct of the default limit and slew at the ramp rates while enabled.

        Only GPUs that support it (Blackwell and newer); the floor and ramps shape the draw through
        the job model (`step_job`).
        """
        sim = self._gpu(gpu_uuid)
        if not self._model.power_smoothing_supported:
            raise gpu.NotSupported(f"{self._model.name} has no power-smoothing hardware")
        if not 0 <= floor_pct <= 100 or ramp_up_w_per_s < 0 or ramp_down_w_per_s < 0:
            raise gpu.InvalidValue(f"power-smoothing profile out of range: floor {floor_pct}%")
        sim.smoothing_floor_w = self._model.power_limit_default_w * floor_pct / 100 if enabled else 0.0
        sim.smoothing_enabled = enabled
        sim.ramp_w_per_s = (ramp_up_w_per_s, ramp_down_w_per_s) if enabled else (0.0, 0.0)
        self._shape_draw(sim)

    def fill_troughs(self, gpu_uuid: str, floor_w: float, ramp_down_w_per_s: float = 0.0) -> None:
        """The simulated trough-filler hook: filler work holds the draw at floor_w (0: off).

        It acts during communication phases (and while the job is stopped). Any GPU can run it; like
        a firmware floor it costs energy, not step time. Switched off with a ramp, the floor falls at
        ramp_down_w_per_s from the next reading on (the soft landing at job end), until the idle draw.
        """
        for name, value in (("floor_w", floor_w), ("ramp_down_w_per_s", ramp_down_w_per_s)):
            if not math.isfinite(value) or value < 0:
                raise gpu.InvalidValue(f"trough filler {name} out of range: {value}")
        sim = self._gpu(gpu_uuid)
        if floor_w == 0 and ramp_down_w_per_s > 0 and sim.filler_floor_w > 0:
            sim.filler_release = (sim.filler_floor_w, float(ramp_down_w_per_s), None)
            return
        sim.filler_release = None
        sim.filler_floor_w = min(float(floor_w), float(self._model.power_limit_max_w))
        self._shape_draw(sim)

    def _release_fillers(self, now_unix_ns: int) -> None:
        """Lower the floor of every trough filler that is being switched off with a ramp."""
        for sim in self._gpus.values():
            if sim.filler_release is None:
                continue
            from_w, rate, start_ns = sim.filler_release
            if start_ns is None:
                sim.filler_release = (from_w, rate, now_unix_ns)
                continue
            floor = from_w - rate * max(now_unix_ns - start_ns, 0) / NS_PER_S
            if floor <= self._model.idle_w:
                floor, sim.filler_release = 0.0, None
            sim.filler_floor_w = floor
            self._shape_draw(sim)

    def _shape_draw(self, sim: _SimGpu) -> None:
        """Hand the job the GPU's floor (the higher of firmware profile and trough filler) and ramps."""
        if self._job is not None and sim.rank >= 0:
            up, down = sim.ramp_w_per_s
            now_ns = self._clock() if self._clock is not None else self._last_reading_ns
            self._job.set_smoothing(
                sim.rank,
                floor_w=max(sim.smoothing_floor_w, sim.filler_floor_w),
                ramp_up_w_per_s=up,
                ramp_down_w_per_s=down,
                at_s=now_ns / NS_PER_S,
            )

    def close(self) -> None:
        """Nothing to release."""

    # -- fault injection --------------------------------------------------------------------
    def inject(self, observation: model.Observation) -> None:
        """Queue an observation exactly as given for the next poll (tests; no counter effect)."""
        self._pending.append(observation)

    def fire(self, fault: ScriptedFault, now_unix_ns: int) -> FiredFault:
        """Make a fault happen now: change the GPU's state and queue what the node would report."""
        gpus = list(self._gpus.values())
        sim = gpus[fault.gpu % len(gpus)]
        uuid_ = "" if fault.kind in NODE_LEVEL_FAULTS else sim.info.uuid
        pci = {"pci": sim.info.pci_bus_id}

        def report(kind: model.EventKind, message: str, **attributes: str) -> None:
            self._pending.append(
                model.Observation(
                    kind, now_unix_ns, message, "simulated", uuid_, fault.xid, attributes={**pci, **attributes}
                )
            )

        kind = fault.kind
        if kind == "xid" and fault.bare:
            report(model.EventKind.XID, fault.message or f"NVRM: Xid (PCI:{sim.info.pci_bus_id}): {fault.xid}")
        elif kind == "xid":
            xid = fault.xid or 0
            if xid == 79:
                sim.lost = True
            elif xid in (48, 94, 95):
                sim.ecc_dbe += 1
            elif xid == 63:
                sim.remap_pending = True
            elif xid == 64:
                sim.remap_failure = True
            report(model.EventKind.XID, fault.message or f"NVRM: Xid (PCI:{sim.info.pci_bus_id}): {xid}")
        elif kind == "fallen_off_bus":
            sim.lost = True
            report(
                model.EventKind.FALLEN_OFF_BUS,
                fault.message or f"NVRM: GPU {sim.info.pci_bus_id}: GPU has fallen off the bus.",
            )
        elif kind == "gpu_lost":
            sim.lost = True
            report(model.EventKind.GPU_LOST, fault.message or "NVML: GPU is lost")
        elif kind == "ecc_dbe":
            sim.ecc_dbe += 1
        elif kind == "row_remap_pending":
            sim.remap_pending = True
        elif kind == "row_remap_failure":
            sim.remap_failure = True
            sim.remapped_uncorrectable = max(sim.remapped_uncorrectable, 512)
        elif kind == "pcie_replay":
            sim.pcie_replay += 10_000
        elif kind == "nvlink_crc_storm":
            sim.crc_storm_from_ns = now_unix_ns
            sim.crc_storm_until_ns = now_unix_ns + int(fault.duration_s * NS_PER_S)
        elif kind == "power_excursion":
            sim.excursion_until_ns = now_unix_ns + int(fault.duration_s * NS_PER_S)
        elif kind == "thermal":
            sim.thermal_until_ns = now_unix_ns + int(fault.duration_s * NS_PER_S)
        elif kind == "recovery_action":
            sim.recovery_action = fault.value
        elif kind == "sdc":
            sim.sdc = True
        elif kind in STRAGGLER_FAULTS:
            return self._slow_down(fault, sim, now_unix_ns)
        elif kind == "job_hang" and self._job is not None and sim.rank >= 0:
            self._job.hang(now_unix_ns / NS_PER_S, stuck_ranks=[sim.rank])
        elif kind == "ib_link_flap":
            self._flap(fault, now_unix_ns)
        if uuid_ and self.workload_crashed(uuid_):
            self.set_workload(uuid_, running=False)  # its application died: the GPU idles from now on
        fired = FiredFault(fault, now_unix_ns, uuid_)
        self.fired.append(fired)
        return fired

    def _slow_down(self, fault: ScriptedFault, sim: _SimGpu, now_unix_ns: int) -> FiredFault:
        """A straggler fault: the GPU (slow_node: every GPU of the node, each recorded) `slowdown` slower."""
        slowed = list(self._gpus.values()) if fault.kind == "slow_node" else [sim]
        fired = [FiredFault(fault, now_unix_ns, each.info.uuid) for each in slowed]
        self.fired.extend(fired)
        if self._job is None or sim.rank < 0:
            return fired[0]
        if fault.kind in ("straggler", "power_brake", "thermal_throttle"):
            sim.brake_w = float(self._job.compute_w[sim.rank]) / (1.0 + fault.slowdown)
            sim.throttled = fault.kind == "thermal_throttle"
            self._set_limit(sim, sim.enforced_limit_w)
            return fired[0]
        if fault.kind == "pcie_downtrain":
            sim.pcie_link = PCIE_DOWNTRAINED
        shape = self._job.shape
        for each in slowed:  # the compute starts late by `slowdown` of the compute phase
            self._job.set_start_delay(each.rank, fault.slowdown * shape.compute_fraction * shape.period_s)
        return fired[0]

    def _flap(self, fault: ScriptedFault, now_unix_ns: int) -> None:
        """Queue an IB flap's link states: each flap DOWN, then ACTIVE flap_down_s later, as mlx5 logs them."""
        device, _, port = fault.ib_port.partition("/")
        for down_s in fault.flap_offsets_s():
            for offset_s, state in ((down_s, "DOWN"), (down_s + fault.flap_down_s, "ACTIVE")):
                at_ns = now_unix_ns + int(offset_s * NS_PER_S)
                observation = model.Observation(
                    model.EventKind.IB_LINK_STATE,
                    at_ns,
                    f"mlx5_core 0000:c1:00.0 {device}: Port {port} Link {state}",
                    "simulated",
                    attributes={"ib_device": device, "ib_port": port, "ib_state": state},
                )
                self._delayed.append((at_ns, observation))

    def set_workload(self, gpu_uuid: str, *, running: bool) -> None:
        """Start or stop the GPU's share of the job: a GPU whose process is gone draws its idle power.

        Only what this call stopped is started again (a load change of rasd-sim's power scenarios
        stops ranks of its own).
        """
        sim = self._gpu(gpu_uuid)
        if self._job is None or sim.rank < 0 or running == (gpu_uuid not in self._stopped):
            return
        now_s = (self._clock() if self._clock is not None else self._last_reading_ns) / NS_PER_S
        if not running and self._job.hung_busy(sim.rank, now_s) is not None:
            # A hung job's rank ended: its launcher restarts every rank from the checkpoint, this
            # one's too (a new process the simulation does not track), and the job steps again.
            self._job.resume(now_s)
            return
        if running:
            self._stopped.discard(gpu_uuid)
        else:
            self._stopped.add(gpu_uuid)
        self._job.set_active(sim.rank, running)

    def stopped_gpus(self) -> frozenset[str]:
        """The GPUs whose share of the job `set_workload` stopped."""
        return frozenset(self._stopped)

    def power_off(self) -> None:
        """The node is down (a reboot that never came back): no GPU answers until `reboot`."""
        for sim in self._gpus.values():
            sim.lost = True

    def reset_gpu(self, gpu_uuid: str) -> None:
        """What a GPU reset clears: volatile ECC, a pending remap (applied), the recovery action.

        A lost GPU cannot be reset (it needs a reboot); an SDC defect is hardware and stays.
        """
        sim = self._gpu(gpu_uuid)
        if sim.lost:
            raise gpu.GpuLost(f"{gpu_uuid} is lost: a reset cannot reach it")
        if sim.remap_pending:
            sim.remap_pending = False
            sim.remapped_correctable += 1
        sim.ecc_dbe = sim.ecc_sbe = 0
        sim.recovery_action = 0
        self._set_limit(sim, self._model.power_limit_default_w)
        if sim.smoothing_enabled:  # a reset restores the driver's defaults: the profile is gone
            self.set_power_smoothing(gpu_uuid, enabled=False, floor_pct=0.0, ramp_up_w_per_s=0.0, ramp_down_w_per_s=0.0)

    def reboot(self) -> None:
        """What a node reboot clears: lost GPUs come back, volatile state is gone, caps return to default.

        The workload starts again on every GPU whose process had stopped (`set_workload`).
        """
        for gpu_uuid in list(self._stopped):
            self.set_workload(gpu_uuid, running=True)
        for sim in self._gpus.values():
            sim.lost = False
            if sim.remap_pending:
                sim.remap_pending = False
                sim.remapped_correctable += 1
            sim.ecc_dbe = sim.ecc_sbe = 0
            sim.recovery_action = 0
            sim.crc_storm_until_ns = sim.excursion_until_ns = sim.thermal_until_ns = 0
            if sim.filler_floor_w or sim.filler_release:  # the hook's filler processes died with the node
                self.fill_troughs(sim.info.uuid, 0.0)
            self._set_limit(sim, self._model.power_limit_default_w)
            if sim.smoothing_enabled:
                self.set_power_smoothing(
                    sim.info.uuid, enabled=False, floor_pct=0.0, ramp_up_w_per_s=0.0, ramp_down_w_per_s=0.0
                )

    def workload_crashed(self, gpu_uuid: str) -> bool:
        """Whether the GPU's CUDA application died on its fault (uncorrectable errors, lost GPU).

        A double-bit error, a pending or failed row remap after an uncorrectable error, or a GPU that
        left the bus ends the process that was using it; correctable faults do not.
        """
        sim = self._gpu(gpu_uuid)
        return sim.lost or sim.ecc_dbe > 0 or sim.remap_pending or sim.remap_failure

    def sdc_gpus(self) -> frozenset[str]:
        """UUIDs of GPUs that silently corrupt data (what validation must find)."""
        return frozenset(uuid_ for uuid_, sim in self._gpus.items() if sim.sdc)

    def _advance(self, now_unix_ns: int) -> None:
        """Fire every scripted fault that is due."""
        self._last_reading_ns = max(self._last_reading_ns, now_unix_ns)
        if self._epoch_ns is None:
            self._epoch_ns = now_unix_ns
        while self._script and self._epoch_ns + int(self._script[0].at_s * NS_PER_S) <= now_unix_ns:
            fault = self._script.pop(0)
            self.fire(fault, self._epoch_ns + int(fault.at_s * NS_PER_S))

    def _crc(self, sim: _SimGpu, now_unix_ns: int) -> int:
        """Link 0's CRC counter: 1000 errors/s during a storm, frozen after it."""
        if not sim.crc_storm_from_ns:
            return sim.nvlink_crc
        end_ns = min(now_unix_ns, sim.crc_storm_until_ns)
        return sim.nvlink_crc + max(0, (end_ns - sim.crc_storm_from_ns) // 1_000_000)

    # -- the power model --------------------------------------------------------------------
    def _gpu(self, gpu_uuid: str) -> _SimGpu:
        try:
            return self._gpus[gpu_uuid]
        except KeyError:
            raise gpu.GpuNotFound(f"no GPU {gpu_uuid} on this node") from None

    def _set_limit(self, sim: _SimGpu, limit_w: int) -> None:
        sim.enforced_limit_w = limit_w
        if self._job is not None and sim.rank >= 0:
            now_ns = self._clock() if self._clock is not None else self._last_reading_ns
            self._job.set_cap(sim.rank, min(limit_w, sim.brake_w or limit_w), now_ns / NS_PER_S)

    def _job_running(self, now_unix_ns: int, sim: _SimGpu | None = None) -> bool:
        """Whether the job runs (on this GPU, when given: an evicted GPU runs nothing)."""
        if self._job is None or not self._job.running(now_unix_ns / NS_PER_S):
            return False
        return sim is None or sim.rank < 0 or bool(self._job.active[sim.rank])

    def _utilization_pct(self, sim: _SimGpu, now_unix_ns: int, demand_w: float) -> int:
        """What NVML's utilization reads: busy computing, lower communicating, 0 idle.

        A hung job's waiting ranks spin in NCCL's kernels at 100 % and its stuck rank idles (`StepJob.hang`).
        """
        if not self._job_running(now_unix_ns, sim):
            return 0
        assert self._job is not None
        hung_busy = self._job.hung_busy(sim.rank, now_unix_ns / NS_PER_S) if sim.rank >= 0 else None
        if hung_busy is not None:
            return 100 if hung_busy else 0
        return 100 if demand_w > 400 else 35

    @property
    def job(self) -> step_job.StepJob | None:
        """The training job these GPUs run (shared with other nodes in rasd-sim)."""
        return self._job

    def _demand_w(self, sim: _SimGpu, now_unix_ns: int) -> float:
        """What the workload would draw uncapped at this instant."""
        if self._job is None or sim.rank < 0:
            return self._model.idle_w
        return float(self._job.demand_w(np.array([sim.rank]), now_unix_ns / NS_PER_S)[0])

    def _node_draw_w(self, now_unix_ns: int) -> dict[str, float]:
        """Every rank's draw on this node at once (one vectorised job evaluation per reading)."""
        if self._job is None:
            return {}
        ranked = [sim for sim in self._gpus.values() if sim.rank >= 0]
        draws = self._job.draw_w(np.array([sim.rank for sim in ranked]), now_unix_ns / NS_PER_S)
        return {sim.info.uuid: float(w) for sim, w in zip(ranked, draws, strict=True)}

    def _draw_w(self, sim: _SimGpu, now_unix_ns: int, base_w: float | None = None) -> float:
        """Demand, throttled to the cap, plus deterministic measurement noise.

        During a power excursion the GPU ignores its cap (as a firmware fault would) and draws 30%
        over it.
        """
        if now_unix_ns < sim.excursion_until_ns:
            base_w = sim.enforced_limit_w * 1.3
        else:
            base_w = self._base_draw_w(sim, now_unix_ns) if base_w is None else base_w
        noise_amplitude_w = self._workload.noise_w if self._workload else 1.0
        # Tuples of ints hash deterministically (no PYTHONHASHSEED salt), so noise is reproducible.
        bucket = now_unix_ns // 10_000_000
        unit = (hash((self._seed, bucket, sim.info.pci_bus_id)) % 20001) / 10000.0 - 1.0
        return max(0.0, round(base_w + noise_amplitude_w * unit, 2))

    def _base_draw_w(self, sim: _SimGpu, now_unix_ns: int) -> float:
        if self._job is None or sim.rank < 0:
            return min(max(self._model.idle_w, sim.smoothing_floor_w, sim.filler_floor_w), sim.enforced_limit_w)
        return float(self._job.draw_w(np.array([sim.rank]), now_unix_ns / NS_PER_S)[0])
