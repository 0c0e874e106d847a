"""`rasd-sim goodput`: weeks of a step-synchronous training job under faults, and its effective training time ratio.

A discrete-event simulation (no wall clock, no network): faults arrive at Llama 3's rate and mix
(`goodput_faults`) on the nodes a job spans; the job stops, loses its work since the last checkpoint,
waits until every fault that stopped it is known and its node is out of the job (or the fault is
fixed in place), takes a spare node for each node out, and restarts. ETTR is the share of wall time
whose work was kept.

Two ways to run the same faults (same seed, same draws):

- **rasd** (`goodput_rasd.RasdArm`): the agent's events go through the real pure core, the same calls
  the controller makes: `escalation.handle_event` (classify → correlate → decide), `blast_radius.admit`,
  `escalation.on_result`, `tick`, `operator_release`. The simulator only carries out the admitted
  commands and answers them the way the hardware would (`goodput_faults.Variant.fix`).
- **baseline**: no automation; a person looks after ``manual_delay_s``, takes the node out and repairs
  it right the first time (generous to the baseline).

What rasd cannot see (a software bug) is handled the same way in both: the scheduler sees the crash
(``crash_detect_s``). A hung collective ends at the job's watchdog (``nccl_timeout_s``) in the
baseline; rasd's straggler watch names the stall ``stall_detect_s`` after it (the real `core.stall`
rule over ``step_s`` steps) and its STRAGGLER "restart" event goes through the core like any other:
the restart_process it decides, answered after its repair time, ends the hang (the watchdog still
does, if that comes first). A dead host (``node_down``) sends nothing either, but its agent falls
silent: rasd's lost-node watch quarantines it after ``lost_node_detect_s``, or, when the job it hangs
is named stalled, at the stall (`LostNodeWatch.check_stalled`: silent ``stalled_lost_after_s``); the
baseline's scheduler sees it NotReady after ``not_ready_s``; a person repairs it in both. The stall
needs the job's rhythm: it must have run ``min_steps`` steps since its last restart.
"""

from __future__ import annotations

import collections
import dataclasses
import heapq
import itertools
import math
import random
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from rasd.controller import stragglers
from rasd.controller.core import stall
from rasd.controller.core.remediation import policy as policy_mod
from rasd.sim import goodput_faults as gf

_LOST = policy_mod.LostNodePolicy()
_STALL = stall.StallPolicy()
LLAMA3_STEP_S = 6.0
"""Llama 3 405B's step, derived (not published): 6 x 405e9 parameters x 16M tokens a batch over 16,384
H100s at about 400 TFLOPS each (the paper's 38-43 % MFU) is about 6 s."""


def stall_detect_s(step_s: float, policy: stall.StallPolicy | None = None) -> float:
    """How long after a job's last edge the straggler watch names its stall (`stall.detection_delay_s`).

    Checked at every cut of the watch (`stragglers.CUT_EVERY_NS`), as the controller does.
    """
    return stall.detection_delay_s(step_s, policy or stall.StallPolicy(), stragglers.CUT_EVERY_NS / 1e9)


PHASES = ("running", "detection", "repair", "restart")
"""The job's phases; wall time is split among them (the lost work is taken out of "running")."""


@dataclasses.dataclass(frozen=True)
class Params:
    """The job, the fleet and the times; every default is an assumption the report prints."""

    gpus: int = gf.LLAMA3_GPUS
    gpus_per_node: int = 8
    spare_nodes: int = 32
    nodes_per_rack: int = 4
    days: float = gf.LLAMA3_DAYS
    seed: int = 0
    rate_scale: float = 1.0
    """Multiplies Llama 3's interruption rate (1.0: 419 per 54 days on 16,384 GPUs)."""
    checkpoint_interval_s: float = 300.0
    restart_s: float = 180.0
    """Job restart: reschedule, load the checkpoint, rebuild the communicators (Meta FT-HSDP: about 3 min)."""
    detect_s: float = 5.0
    """rasd: kernel-log line → agent → controller decision (the job is stopped by the quarantine)."""
    crash_detect_s: float = 60.0
    """The scheduler sees a crashed job and requeues it."""
    nccl_timeout_s: float = 600.0
    """A hung collective ends at the watchdog (PyTorch's NCCL default: 10 min)."""
    step_s: float = LLAMA3_STEP_S
    """The job's step; rasd's stall detection waits a number of them (`stall.StallPolicy`)."""
    stall_detect_s: float | None = None
    """rasd: a hang's edges stop → the straggler watch names the stall; None: `stall_detect_s(step_s)`
    (30 s at the defaults: 5 steps of 6 s, and the policy's 30 s floor, checked every 0.5 s)."""
    not_ready_s: float = 300.0
    """The scheduler sees a dead node NotReady and reschedules without it."""
    lost_node_detect_s: float = _LOST.lost_after_s + _LOST.check_interval_s
    """rasd: a dead host's agent falls silent → the leader's lost-node watch quarantines it, at most
    ``lost_after_s`` plus one ``check_interval_s`` later (`LostNodePolicy`'s defaults: 60 + 10 s)."""
    manual_delay_s: float = 3600.0
    """A person answers the page, finds the node and starts the repair."""
    manual_repair_s: float = 4 * 3600.0
    """A person's own repair (a cable, a switch port, a host part)."""
    validation_s: float = 900.0
    rma_s: float = 5 * 86_400.0
    """An RMA'd GPU or node is replaced and back after this long."""
    repair_s: Mapping[str, float] = dataclasses.field(
        default_factory=lambda: {
            "restart_process": 60.0,
            "reset_gpu": 120.0,
            "reboot_node": 900.0,
            "power_cycle_bmc": 1200.0,
        }
    )

    def __post_init__(self) -> None:
        """Reject values the simulation cannot mean, naming the parameter."""
        if self.gpus < self.gpus_per_node or self.gpus % self.gpus_per_node:
            raise ValueError(f"gpus: {self.gpus} is not a positive multiple of gpus_per_node {self.gpus_per_node}")
        for name in ("days", "checkpoint_interval_s", "rate_scale"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name}: must be > 0, got {getattr(self, name)}")
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if field.name.endswith("_s") and isinstance(value, float) and value < 0:
                raise ValueError(f"{field.name}: must be >= 0, got {value}")
        if self.spare_nodes < 0 or self.nodes_per_rack < 1:
            raise ValueError("spare_nodes must be >= 0 and nodes_per_rack >= 1")

    @property
    def job_nodes(self) -> int:
        """Nodes the job spans."""
        return self.gpus // self.gpus_per_node

    @property
    def hang_detect_s(self) -> float:
        """rasd's time from a hang to the stall's verdict."""
        return self.stall_detect_s if self.stall_detect_s is not None else stall_detect_s(self.step_s)

    def person_fix_s(self, fix: str) -> float:
        """How long a person's repair of a fix takes, validation included."""
        if fix == "rma":
            return self.rma_s
        if fix in self.repair_s:
            return self.repair_s[fix] + self.validation_s
        return self.manual_repair_s


@dataclasses.dataclass
class Fault:
    """One injected fault; where it lands is drawn up front, so both arms get the same."""

    fault_id: int
    at: float
    cause: str
    variant: gf.Variant
    rank: int
    """Which of the job's nodes (in node order) it hits."""
    gpu: int
    node: int = -1
    detected: bool = False
    fixed: bool = False
    interrupted: bool = False
    """It stopped a running job (an interruption); otherwise it hit a job already down."""


def draw_faults(params: Params) -> list[Fault]:
    """The faults of one run: a Poisson process at the table's rate, causes in the table's proportions."""
    rng = random.Random(params.seed)
    rate = gf.rate_per_gpu_s() * params.gpus * params.rate_scale
    causes = gf.LLAMA3_CAUSES
    weights = [c.count for c in causes]
    end_s = params.days * 86_400.0
    faults: list[Fault] = []
    at = rng.expovariate(rate)
    while at < end_s:
        cause = rng.choices(causes, weights)[0]
        variant = rng.choices(cause.variants, [v.share for v in cause.variants])[0]
        rank, gpu = rng.randrange(params.job_nodes), rng.randrange(params.gpus_per_node)
        faults.append(Fault(len(faults), at, cause.name, variant, rank, gpu))
        at += rng.expovariate(rate)
    return faults


class Arm(Protocol):
    """How faults rasd's agent can see are handled (rasd's core, or a person)."""

    name: str

    def detected(self, fault: Fault, now: float) -> None:
        """The fault is known (its detection delay is over)."""

    def summary(self) -> dict[str, Any]:
        """What the arm did, for the report."""


def node_id(index: int) -> str:
    """The simulated node's name."""
    return f"node-{index:05d}"


def gpu_uuid(node: int, gpu: int) -> str:
    """The simulated GPU's UUID-like name."""
    return f"GPU-{node:05d}-{gpu}"


class World:
    """The event queue, the nodes and the job; an arm acts on it through hold/unhold/fix/at."""

    def __init__(self, params: Params) -> None:
        """An idle fleet: the job on the first ``job_nodes`` nodes, the rest spares."""
        self.params = params
        self.now = 0.0
        self._queue: list[tuple[float, int, Callable[..., None], tuple[Any, ...]]] = []
        self._seq = itertools.count()
        total = params.job_nodes + params.spare_nodes
        self.holds: list[set[str]] = [set() for _ in range(total)]
        self.faults_on: list[list[Fault]] = [[] for _ in range(total)]
        self.job = set(range(params.job_nodes))
        self.spares = set(range(params.job_nodes, total))
        self.blockers: dict[int, Fault] = {}
        self.struck: list[Fault] = []
        self.phase = "restart"
        self.phase_since = 0.0
        self.run_since = 0.0
        self._restart_token = 0
        self.time_s: collections.Counter[str] = collections.Counter()
        self.lost_work_s = 0.0
        self.people = 0
        """Repairs a person did (the baseline's, and rasd's fallback when automation left a fault alone)."""
        self._start_restart()

    @property
    def total_nodes(self) -> int:
        """Job nodes plus spares."""
        return len(self.holds)

    def at(self, when: float, fn: Callable[..., None], *args: Any) -> None:
        """Run fn(*args) at simulated time when (never before now)."""
        heapq.heappush(self._queue, (max(when, self.now), next(self._seq), fn, args))

    def run_until(self, end_s: float) -> None:
        """Process every event up to end_s, then close the books at end_s."""
        while self._queue and self._queue[0][0] <= end_s:
            when, _, fn, args = heapq.heappop(self._queue)
            self.now = when
            fn(*args)
        self.now = end_s
        self._set_phase(self.phase)

    # The job -------------------------------------------------------------------------------

    def strike(self, fault: Fault, arm: Arm) -> None:
        """A fault lands on the job's rank-th node: the job stops; its detection is scheduled."""
        if not self.job:
            return  # every node is out and no spare is left: nothing runs that could fault
        fault.node = sorted(self.job)[fault.rank % len(self.job)]
        self.faults_on[fault.node].append(fault)
        self.struck.append(fault)
        if self.phase == "running":
            fault.interrupted = True
            self.lost_work_s += (self.now - self.run_since) % self.params.checkpoint_interval_s
        self.blockers[fault.fault_id] = fault
        if fault.variant.hangs and arm.name == "rasd":
            # The job's own timeout, should rasd's restart not have ended the hang by then; scheduled
            # first, so that at a tie (no rhythm: nothing names the stall) the watchdog ends it.
            self.at(self.now + self.params.nccl_timeout_s, self._watchdog, fault)
        self.at(self.now + self._detect_delay_s(fault, arm), self._detected, fault, arm)
        self._reevaluate()

    def _detect_delay_s(self, fault: Fault, arm: Arm) -> float:
        """How long after it strikes the fault is detected, by whom the arm has (a query: it schedules nothing)."""
        p = self.params
        stalled_s = p.hang_detect_s if self._has_rhythm() else math.inf  # when rasd names the job's stall
        if fault.variant.hangs:
            if arm.name != "rasd":
                return p.nccl_timeout_s
            return min(stalled_s, p.nccl_timeout_s)
        if fault.variant.node_down:
            if arm.name != "rasd":
                return p.not_ready_s
            # At the stall the leader looks at once: the node, silent since it died, is lost if that is
            # stalled_lost_after_s already; otherwise the periodic check names it.
            at_stall_s = stalled_s if stalled_s >= _LOST.stalled_lost_after_s else math.inf
            return min(p.lost_node_detect_s, at_stall_s, p.not_ready_s)
        if fault.variant.signal and arm.name == "rasd":
            return p.detect_s
        return p.crash_detect_s

    def _has_rhythm(self) -> bool:
        """Whether the job has stepped long enough since its restart for the straggler watch to know its rhythm."""
        return self.phase == "running" and self.now - self.run_since >= _STALL.min_steps * self.params.step_s

    def _watchdog(self, fault: Fault) -> None:
        """The job's own collective timeout: a hang nothing ended by now ends here (the job restarts)."""
        if not fault.fixed:
            self.fix(fault)

    def _detected(self, fault: Fault, arm: Arm) -> None:
        fault.detected = True
        if fault.variant.fix == gf.FIX_JOB or (fault.variant.hangs and arm.name != "rasd"):
            self.fix(fault)
        elif fault.variant.node_down and arm.name != "rasd":  # NotReady: gone until a person repairs it
            key = f"down:{fault.fault_id}"
            self.people += 1
            self.hold(fault.node, key)
            self.at(self.now + self.params.manual_delay_s + self.params.manual_repair_s, self._person_done, fault, key)
        else:
            arm.detected(fault, self.now)
        self._reevaluate()

    def _start_restart(self) -> None:
        self._restart_token += 1
        self._set_phase("restart")
        self.at(self.now + self.params.restart_s, self._restarted, self._restart_token)

    def _restarted(self, token: int) -> None:
        if token == self._restart_token and self.phase == "restart":
            self._set_phase("running")
            self.run_since = self.now

    def _set_phase(self, phase: str) -> None:
        self.time_s[self.phase] += self.now - self.phase_since
        self.phase, self.phase_since = phase, self.now

    def _reevaluate(self) -> None:
        """Drop the blockers that no longer block; pick the job's phase."""
        for fid, fault in list(self.blockers.items()):
            if fault.fixed or fault.node not in self.job:
                del self.blockers[fid]
        if not self.blockers and len(self.job) == self.params.job_nodes:
            if self.phase not in ("running", "restart"):
                self._start_restart()
            return
        waiting = "detection" if any(not f.detected for f in self.blockers.values()) else "repair"
        if self.phase != waiting:
            self._restart_token += 1  # a restart under way is abandoned
            self._set_phase(waiting)

    # Nodes ---------------------------------------------------------------------------------

    def hold(self, node: int, key: str) -> None:
        """Take node out of service for key (a quarantine, a person's repair, a dead host)."""
        self.holds[node].add(key)
        self.job.discard(node)
        self.spares.discard(node)
        self._refill()
        self._reevaluate()

    def unhold(self, node: int, key: str) -> None:
        """Lift key's hold; a node with none left is a spare again (or joins a short job)."""
        self.holds[node].discard(key)
        if not self.holds[node] and node not in self.job:
            self.spares.add(node)
            self._refill()
        self._reevaluate()

    def _refill(self) -> None:
        while len(self.job) < self.params.job_nodes and self.spares:
            spare = min(self.spares)
            self.spares.discard(spare)
            self.job.add(spare)

    def fix(self, fault: Fault) -> None:
        """The fault is repaired."""
        fault.fixed = True
        self._reevaluate()

    def person_repair(self, fault: Fault) -> None:
        """A person takes the fault's node out and repairs the fault right (unless it is fixed already)."""
        if fault.fixed:
            return
        self.people += 1
        key = f"person:{fault.fault_id}"
        self.hold(fault.node, key)
        self.at(self.now + self.params.person_fix_s(fault.variant.fix), self._person_done, fault, key)

    def _person_done(self, fault: Fault, key: str) -> None:
        fault.fixed = True
        self.unhold(fault.node, key)

    def unfixed(self, node: int) -> list[Fault]:
        """The faults on node not repaired yet."""
        return [f for f in self.faults_on[node] if not f.fixed]


@dataclasses.dataclass(frozen=True)
class ArmResult:
    """One arm's outcome."""

    name: str
    ettr: float
    time_lost_h: Mapping[str, float]
    progress_h: float
    wall_h: float
    people: int
    interruptions: Mapping[str, int]
    """Faults that stopped a running job, by cause."""
    faults_while_down: int
    """Faults that hit the job while it was already stopped (no work lost to them)."""
    detail: Mapping[str, Any]


def simulate(params: Params, faults: list[Fault], make_arm: Callable[[World], Arm]) -> ArmResult:
    """Run one arm over the faults (copies: the list is shared by both arms) and account the wall time."""
    world = World(params)
    arm = make_arm(world)
    for fault in faults:
        world.at(fault.at, world.strike, dataclasses.replace(fault), arm)
    end_s = params.days * 86_400.0
    world.run_until(end_s)
    progress_s = world.time_s["running"] - world.lost_work_s
    lost = {
        "detection": world.time_s["detection"],
        "repair": world.time_s["repair"],
        "restart": world.time_s["restart"],
        "lost_work": world.lost_work_s,
    }
    assert math.isclose(progress_s + sum(lost.values()), end_s, rel_tol=1e-9), (progress_s, lost, end_s)
    return ArmResult(
        name=arm.name,
        ettr=progress_s / end_s,
        time_lost_h={k: v / 3600.0 for k, v in lost.items()},
        progress_h=progress_s / 3600.0,
        wall_h=end_s / 3600.0,
        people=world.people,
        interruptions=dict(collections.Counter(f.cause for f in world.struck if f.interrupted)),
        faults_while_down=sum(1 for f in world.struck if not f.interrupted),
        detail=arm.summary(),
    )


class BaselineArm:
    """No automation: a person repairs every fault rasd could have seen, after ``manual_delay_s``."""

    name = "baseline"

    def __init__(self, world: World) -> None:
        """Act on world."""
        self._world = world

    def detected(self, fault: Fault, now: float) -> None:
        """The page goes out; a person comes after the delay."""
        self._world.at(now + self._world.params.manual_delay_s, self._world.person_repair, fault)

    def summary(self) -> dict[str, Any]:
        """Nothing beyond the people count."""
        return {}
