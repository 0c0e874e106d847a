"""The controller's power loop: the I/O around the pure power core, one control period at a time.

Owns the running power manager of this replica: the budget tree and policy in force (config, then
the operator's run-time changes), the two-phase apply state (`core.power.apply.ApplyState`), the
smoothing plan, and the status rasctl shows. Each period (`step`, with `now` from the injected clock):

1. inventory: the GPUs of the tree's nodes as their agents announced them (a node that came back
   with a new boot id is forgotten: its limits reset to default);
2. fold in what came back: SetPowerCap results (acks with read-backs) and the enforced limits in
   telemetry (`power_apply.record`);
3. views: each GPU's draw is its peak over a window of at least one control period, the configured
   draw window and one detected step plus a telemetry batch (`power.draw_window_s`: a window inside
   a communication trough would read a busy GPU at its trough; an idle GPU counts its latest draw;
   stale telemetry: drawing at the cap that may be in force), SW-power-cap throttling, quarantined
   GPUs and nodes that have read idle for a step plus a telemetry batch are ineligible (they
   release their share: `power.released`), nodes without a stream are unreachable (held where they
   may be), GPUs whose cap went up less than one detected step plus one telemetry batch ago are
   settling (their draw cannot show the raise yet: `power.settle_s`);
4. `power.allocate`, then the aggregate ramp-rate limit on raises (`swing.limit_aggregate_raise`),
   then (policy `job_start_ramp_enabled`) the job-start ceiling (`power_ramp.job_start_ramp`): GPUs
   idle for `job_start_idle_s` are parked at the start cap, and when their job starts their caps
   rise at the aggregate ramp limit shared among them (less what the start profiles of step 7
   reserve); it only lowers targets, and each ramping GPU's raise goes out with its share of the
   limit as a rate the agent slews at;
5. `power_apply.plan`: decreases first; raises only into slack that counts unconfirmed decreases as
   not applied; the new apply state is persisted **before** any command leaves, so a restart knows
   every command that may land;
6. send one SetPowerCap per node through the ingest; results come back as acks for the next period;
7. smoothing: once a window of unmanaged aggregate power shows a coherent swing, `swing.plan_smoothing`
   chooses a profile and SetPowerSmoothing goes to every GPU that supports it; where the GPUs have
   no smoothing hardware the plan is emulated: SetTroughFiller asks every node's trough-filler hook
   to hold the floor, and a peak cap (when the policy allows one) lowers the targets of step 4;
   either is switched off when the job stops (utilisation gone; the filler ramps its floor down at
   the job ramp) and re-planned after a policy change; the plan is saved (`SMOOTHING_DOC`) before its
   first command leaves, so a restarted controller keeps it while the job runs and switches it off
   when the job stops; the detector's window starts after the last
   period a busy GPU was under a job-start ceiling (power under the start ramp is not the unmanaged
   swing). Job-start smoothing (`core.power.start_smoothing`, with the job-start ramp): GPUs with smoothing
   hardware that start a job get a start profile at once (ramp rates = their share of the ramp
   limit, the firmware's lowest floor), except a few canaries; while start profiles are in force the
   detector reads the canaries' sum (`PowerWindow.track`), scaled to the job, since the profiles
   mask the swing everywhere else; the plan's profile then replaces the start profiles (no command
   switches them off first), or they are switched off `job_start_smoothing_release_s` after the cap
   ramp when no swing showed up;
8. nodes unreachable for `bmc_fallback_after_s` whose caps must come down get a node power limit
   through the BMC (Redfish PowerLimit); once the BMC confirms it, the node counts at that limit.

Start and stop live in `start()`/`stop()` only, so a leader-election gate wraps exactly these two.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import time
import tomllib
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import numpy as np
import structlog

from rasd.api.v1 import commands_pb2 as commands_pb
from rasd.common import aio
from rasd.common import settings as settings_check
from rasd.controller.core import fleet
from rasd.controller.core.power import allocate as power
from rasd.controller.core.power import apply as power_apply
from rasd.controller.core.power import policy as power_policy
from rasd.controller.core.power import ramp as power_ramp
from rasd.controller.core.power import start_smoothing, swing
from rasd.controller.core.power import tree as power_tree
from rasd.controller.ingest import service as ingest_mod
from rasd.controller.store import remediation as rstore
from rasd.controller.store import repo

log = structlog.get_logger("rasd.controller.power")

SW_POWER_CAP = 0x4
"""NVML clock event reason: clocks held down by the software power cap."""

APPLY_DOC = "power/apply"
START_DOC = "power/start_smoothing"
"""The job-start smoothing profiles the GPUs carry (`start_smoothing.StartState`): saved before any
start-profile command leaves, so a restarted controller releases or hands over the profiles it left on."""
SMOOTHING_DOC = "power/smoothing"
"""The detected swing's smoothing plan in force (`swing.SmoothingPlan`, with the `SwingReport` it was
sized from): saved before its first command leaves and deleted once its "off" commands have gone,
so a restarted controller switches off, at job end, the profiles its predecessor put on."""
SMOOTHING_RESTORE_COVERAGE = 0.8
"""Share of the managed GPUs whose telemetry must be in before a restored plan is judged (job running
or stopped): right after a restart, GPUs without telemetry yet would read as idle."""
BUDGETS_DOC = "power/budgets"
POLICY_DOC = "power/policy"
NOT_EXECUTED = frozenset(
    {
        commands_pb.ACTION_OUTCOME_TIMED_OUT,
        commands_pb.ACTION_OUTCOME_REFUSED,
        commands_pb.ACTION_OUTCOME_DRY_RUN,
        commands_pb.ACTION_OUTCOME_NOT_SUPPORTED,
    }
)
"""Outcomes after which the agent did not and will not change the limit (an ack without read-back)."""


class PowerSettingsError(ValueError):
    """A bad `[power]` table; the message starts with the offending key's path."""


@dataclasses.dataclass(frozen=True)
class PowerSettings:
    """The `[power]` table of controller.toml."""

    tree: power_tree.PowerTree
    """The budget tree from `[power.tree]`."""
    policy: power_policy.PowerPolicy = dataclasses.field(default_factory=power_policy.PowerPolicy)
    """From `[power.policy]`."""
    telemetry_stale_s: float = 5.0
    """A GPU whose last power sample is older than this is treated as drawing at its cap."""
    detect_window_s: float = 20.0
    """Unmanaged aggregate power the swing detector needs before it plans smoothing, s."""
    bmc_fallback_after_s: float = 10.0
    """A node without a stream this long whose caps must come down gets a BMC power limit."""
    min_step_interval_s: float = 0.2
    """Earliest next period after an early wake-up (a budget change, acks with raises waiting)."""
    draw_window_s: float = 5.0
    """A GPU's draw is its peak over this long (at least one control period, and stretched to one
    detected step plus a telemetry batch, `power.draw_window_s`): it must span whole training steps,
    or a window that falls in a communication phase makes a busy GPU look idle."""
    seed: int = 0
    """Seed of the raise jitter."""

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], *, prefix: str = "power.") -> PowerSettings:
        """Validate the `[power]` table; errors name the key (e.g. `power.tree.rows[0].budget_w`).

        Raises:
            PowerSettingsError: any bad key or value.
        """
        scalars = {k: v for k, v in data.items() if k not in ("tree", "policy")}
        values = settings_check.typed_values(_ScalarSettings, scalars, prefix, PowerSettingsError)
        if "tree" not in data:
            raise PowerSettingsError(f"{prefix}tree: required (the budget tree)")
        try:
            tree = power_tree.PowerTree.from_mapping(data["tree"])
        except power_tree.PowerTreeError as exc:
            raise PowerSettingsError(f"{prefix}tree.{exc.key}: {exc}") from None
        try:
            policy = power_policy.PowerPolicy.from_mapping(data.get("policy", {}))
        except power_policy.PolicyError as exc:
            raise PowerSettingsError(f"{prefix}policy.{exc.key}: {exc}") from None
        settings = cls(tree=tree, policy=policy, **values)
        for key in (
            "telemetry_stale_s",
            "detect_window_s",
            "bmc_fallback_after_s",
            "min_step_interval_s",
            "draw_window_s",
        ):
            settings_check.require(getattr(settings, key) > 0, f"{prefix}{key}", "must be > 0",
                                   getattr(settings, key), PowerSettingsError)  # fmt: skip
        return settings


@dataclasses.dataclass(frozen=True)
class _ScalarSettings:
    """The scalar keys of `[power]`, for the shared settings checker."""

    telemetry_stale_s: float = 5.0
    detect_window_s: float = 20.0
    bmc_fallback_after_s: float = 10.0
    min_step_interval_s: float = 0.2
    draw_window_s: float = 5.0
    seed: int = 0


class NodePowerLimiter(Protocol):
    """Out-of-band node power limits (the BMC); calls block, the loop runs them in a thread."""

    def configured(self, node_id: str) -> bool:
        """Whether the node has a BMC to ask."""
        ...

    def set_node_limit(self, node_id: str, limit_w: int | None) -> int | None:
        """Set (None: lift) the node's power limit; returns the limit read back, W (None: no limit)."""
        ...


@dataclasses.dataclass(frozen=True)
class DomainStatus:
    """One domain of the tree as rasctl shows it."""

    name: str
    level: str
    budget_w: int | None
    allocated_w: float
    """Sum of caps that may be in force below it (the invariant's left-hand side), W."""
    target_w: float
    """Sum of this period's target caps, W."""
    drawn_w: float
    """Sum of the latest draw, W."""
    children: tuple[DomainStatus, ...]

    @property
    def headroom_w(self) -> float | None:
        """budget - allocated; None without an own budget."""
        return None if self.budget_w is None else self.budget_w - self.allocated_w


@dataclasses.dataclass(frozen=True)
class PowerStatus:
    """The latest period's picture."""

    at_unix_s: float
    root: DomainStatus | None
    swing: swing.SwingReport | None
    smoothing: swing.SmoothingPlan | None
    stranded_w: float
    unmet_w: float
    over_budget: tuple[str, ...]
    reason: str
    periods: int
    unconfirmed_decreases: int = 0
    """GPUs with a cap decrease not confirmed yet (counted at the old cap)."""


STATS_HISTORY = 100_000
"""Periods of history `PowerStats` keeps (about 2.3 days at a 2 s period)."""


def _history() -> collections.deque[Any]:
    return collections.deque(maxlen=STATS_HISTORY)


@dataclasses.dataclass
class PowerStats:
    """Counters for tests, the simulator and metrics."""

    periods: int = 0
    commands_sent: int = 0
    decreases_sent: int = 0
    increases_sent: int = 0
    acks: int = 0
    smoothing_commands: int = 0
    bmc_limits: int = 0
    ramp_parked: int = 0
    """GPUs parked at the job-start cap in the latest period."""
    ramp_ramping: int = 0
    """GPUs whose job-start ceiling rose in the latest period."""
    start_smoothed: int = 0
    """GPUs under a job-start smoothing profile after the latest period."""
    start_smoothing_commands: int = 0
    """SetPowerSmoothing commands sent for start profiles (on and off)."""
    # Bounded: a controller runs for months, a period every few seconds.
    stranded_w: collections.deque[tuple[float, float]] = dataclasses.field(default_factory=_history)
    """(period time s, stranded W) for the latest periods."""
    settling_w: collections.deque[tuple[float, float]] = dataclasses.field(default_factory=_history)
    """(period time s, W granted by a raise and not yet drawn) for the latest periods."""
    step_ms: collections.deque[float] = dataclasses.field(default_factory=_history)


class PowerLoop:
    """The running power manager of one replica. `await start()`, then `await stop()`."""

    def __init__(
        self,
        ingest: ingest_mod.Ingest,
        settings: PowerSettings,
        *,
        limiter: NodePowerLimiter | None = None,
        clock: Callable[[], int] = time.time_ns,
        replica: str = "",
    ) -> None:
        """Bind to the ingest (telemetry, streams, store thread); nothing runs until start()."""
        self._ingest = ingest
        self.settings = settings
        self._docs = rstore.RemediationStore(ingest.store.engine)
        self._limiter = limiter
        self._clock = clock
        self._replica = replica or uuid.uuid4().hex[:6]
        self._configured_tree = settings.tree
        self.tree = settings.tree
        self.policy = settings.policy
        self._budget_overrides: dict[str, int | None] = {}
        self.state: power_apply.ApplyState | None = None
        self._known_gpus: dict[str, fleet.GpuRecord] = {}
        """GPU uuid → its record in the store at start (`_inventory`)."""
        self._targets: np.ndarray | None = None
        self._acks: list[power_apply.CapAck] = []
        self._boot_ids: dict[str, str] = {}
        self._rng = np.random.default_rng(settings.seed)
        self._wake = asyncio.Event()
        self._step_lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None
        self._sends: set[asyncio.Task[None]] = set()
        self._last_step_s = 0.0
        self._waiting = 0
        self._smoothing: swing.SmoothingPlan | None = None
        self._smoothing_unmanaged: swing.SwingReport | None = None
        self._smoothing_nodes: dict[str, str] = {}
        self._smoothing_sent_s: dict[str, float] = {}
        self._smoothing_off_since_s: float | None = None
        self._smoothing_restored = False
        """The plan came from the store: which nodes carry it is not known until telemetry is in."""
        self._unreachable_since: dict[str, float] = {}
        self._bmc_limits: dict[str, int] = {}
        self._bmc_confirmed: dict[str, tuple[float, dict[str, int]]] = {}
        """node -> (when the BMC confirmed its limit, the GPU targets that limit covers)."""
        self._bmc_in_flight: set[str] = set()
        self._raised_at_s: dict[str, float] = {}
        self._idle_since_s: dict[str, float] = {}
        """GPU -> when the counters sample that began its current run of 0 % utilisation was taken."""
        self._ramp = power_ramp.RampState()
        self._ramped_at_s: float | None = None
        """When a busy GPU was last under a job-start ceiling: the swing detector's window starts after it."""
        self._ramp_rng = np.random.default_rng([settings.seed, 1])
        """GPU -> when its may-be-in-force cap last went up (it settles until a step ran under it)."""
        self._start = start_smoothing.StartState()
        self._start_unsent: set[str] = set()
        """GPUs whose start-profile command went unanswered: sent again next period."""
        self._start_p2p_w: float | None = None
        """The unmanaged swing the detector last estimated from the canaries, W."""
        self.status = PowerStatus(0.0, None, None, None, 0.0, 0.0, (), "not started", 0)
        self.stats = PowerStats()
        self.on_period: Callable[[float, power_apply.ApplyState, np.ndarray], None] | None = None
        """Called after each period with (now s, state, targets): the simulator's probe."""

    @property
    def start_smoothing_state(self) -> start_smoothing.StartState:
        """The job-start smoothing profiles the loop believes are on the GPUs (`core.power.start_smoothing`)."""
        return self._start

    # -- lifecycle -----------------------------------------------------------------------------------
    async def start(self) -> None:
        """Load the persisted state (budgets, policy, apply state) and start the control loop."""
        docs = await self._ingest.run_in_store(lambda: self._docs.load_docs("power/"))
        now = self._now()
        budgets = docs.get(BUDGETS_DOC) or {}
        for name, budget in budgets.items():
            try:
                self.tree = self.tree.with_budget(name, budget)
                self._budget_overrides[name] = budget
            except power_tree.PowerTreeError as exc:
                log.error("power_budget_override_dropped", domain=name, error=str(exc))
        if docs.get(POLICY_DOC):
            try:
                self.policy = power_policy.PowerPolicy.from_mapping(docs[POLICY_DOC])
            except power_policy.PolicyError as exc:
                log.error("power_policy_override_dropped", error=str(exc))
        if docs.get(APPLY_DOC):
            self.state = power_apply.ApplyState.from_mapping(docs[APPLY_DOC])
            log.info("power_state_restored", gpus=len(self.state.gpus), next_seq=self.state.next_seq)
        else:
            self.state = power_apply.ApplyState.unknown(
                (), now_s=now, policy=self.policy, epoch=f"{int(now * 1000):x}{self._replica}"
            )
        if docs.get(START_DOC):
            try:
                self._start = start_smoothing.StartState.from_mapping(docs[START_DOC])
            except ValueError as exc:
                log.error("power_start_smoothing_state_dropped", error=str(exc))
            else:
                log.info("power_start_smoothing_restored", gpus=len(self._start.rate_w_per_s),
                         canaries=len(self._start.canaries))  # fmt: skip
        if docs.get(SMOOTHING_DOC):
            try:
                self._smoothing = swing.SmoothingPlan(**docs[SMOOTHING_DOC]["plan"])
                self._smoothing_unmanaged = swing.SwingReport(**docs[SMOOTHING_DOC]["report"])
            except (KeyError, TypeError) as exc:
                self._smoothing = self._smoothing_unmanaged = None
                log.error("power_smoothing_plan_dropped", error=str(exc))
            else:
                self._smoothing_restored = True
                log.info("power_smoothing_restored", mode=self._smoothing.mode, reason=self._smoothing.reason)
        # Every GPU the store knows, connected now or not: a node whose agent has not (yet) come back
        # keeps the caps it had, and the allocator must count them (`_inventory`).
        nodes = await self._ingest.run_in_store(self._ingest.store.list_nodes)
        self._known_gpus = {gpu.record.uuid: gpu.record for node in nodes for gpu in node.gpus}
        self._task = asyncio.create_task(self._run(), name="rasd-power-loop")
        log.info(
            "power_loop_started",
            period_s=self.policy.control_period_s,
            domains=len(self.tree.domains),
            gpus_known=len(self._known_gpus),
        )

    async def stop(self) -> None:
        """Stop the loop and wait for commands in flight (their acks are dropped; read-backs settle them)."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        for task in list(self._sends):
            task.cancel()
        await asyncio.gather(*self._sends, return_exceptions=True)
        log.info("power_loop_stopped")

    async def _run(self) -> None:
        while True:
            try:
                await self.step()
            except Exception as exc:  # one bad period must not end power management
                log.exception("power_period_failed", error=str(exc))
            period = self.policy.control_period_s
            await aio.wait_event(self._wake, period)
            self._wake.clear()
            gap = self.settings.min_step_interval_s - (self._now() - self._last_step_s)
            if gap > 0:
                await asyncio.sleep(gap)

    def _now(self) -> float:
        return self._clock() / 1e9

    # -- operator changes ----------------------------------------------------------------------------
    async def set_budget(
        self, domain: str, budget_w: float | None, *, reason: str, actor: str = "operator"
    ) -> power_tree.Domain:
        """Change a domain's budget now (persisted); the loop runs a period at once to enforce a cut.

        Raises:
            power_tree.PowerTreeError: unknown domain or a budget below the minimum caps under it.
        """
        tree = self.tree.with_budget(domain, budget_w)
        overrides = {**self._budget_overrides, domain: tree.domain(domain).budget_w}
        new_w = tree.domain(domain).budget_w
        await self._save(
            {BUDGETS_DOC: overrides},
            audit=_audit(self._clock(), actor, "set_power_budget", f"{domain}={new_w} W: {reason}"),
        )
        self.tree, self._budget_overrides = tree, overrides
        log.warning("power_budget_set", domain=domain, budget_w=tree.domain(domain).budget_w, reason=reason)
        if self._task is not None:
            await self.step()  # a cut is enforced now, not at the next period
        return tree.domain(domain)

    async def set_policy(
        self, mapping: Mapping[str, Any], *, reason: str, actor: str = "operator"
    ) -> power_policy.PowerPolicy:
        """Replace the policy (persisted); smoothing is switched off and planned again from fresh data.

        Raises:
            power_policy.PolicyError: naming the offending key.
        """
        policy = power_policy.PowerPolicy.from_mapping(mapping)
        await self._save(
            {POLICY_DOC: policy.to_mapping()}, audit=_audit(self._clock(), actor, "set_power_policy", reason)
        )
        self.policy = policy
        log.warning("power_policy_set", reason=reason)
        if self._smoothing is not None:
            await self._disable_smoothing("policy changed")
        self._smoothing_off_since_s = self._now()
        self._wake.set()
        return policy

    def policy_toml(self) -> str:
        """The policy in force as TOML text (`set_policy` accepts it back)."""
        return policy_to_toml(self.policy)

    async def _save(self, docs: dict[str, dict[str, Any] | None], *, audit: dict[str, Any] | None = None) -> None:
        commit = rstore.Commit(now_unix_ns=self._clock(), docs=docs, audit=[audit] if audit else [])
        await self._ingest.run_in_store(self._docs.commit, commit)

    # -- one period ----------------------------------------------------------------------------------
    async def step(self) -> power_apply.CapPlan | None:
        """Run one control period now; returns the plan sent (None when there is nothing to manage)."""
        async with self._step_lock:
            return await self._step()

    async def _step(self) -> power_apply.CapPlan | None:
        started = time.perf_counter()
        now = self._now()
        self._last_step_s = now
        policy = self.policy
        assert self.state is not None, "start() first"
        gpus = self._inventory()
        if not gpus:
            self.status = dataclasses.replace(self.status, at_unix_s=now, reason="no GPUs in the power tree yet")
            return None
        state = self._sync_inventory(gpus, now)
        acks, self._acks = self._acks, []
        self.stats.acks += len(acks)
        state = power_apply.record(state, acks=acks, readbacks=self._readbacks(state), policy=policy)
        state = self._apply_bmc_confirmations(state)
        views, draw_known, drawn = await self._views(state, now)
        previous = self._targets if self._targets is not None and len(self._targets) == len(state.gpus) else None
        allocation = power.allocate(self.tree, views, previous, policy=policy, rng=self._rng)
        reference = previous if previous is not None else views.cap_w
        targets = swing.limit_aggregate_raise(
            reference, allocation.caps_w, policy.control_period_s, policy.ramp_limit_w_per_s
        ).astype(np.int64)
        ramp = power_ramp.job_start_ramp(
            self._ramp,
            gpu_uuids=[g.gpu_uuid for g in state.gpus],
            idle=self._idle(state),
            targets_w=targets,
            min_w=state.min_w,
            max_w=state.max_w,
            now_s=now,
            policy=policy,
            rng=self._ramp_rng,
            reserved_w_per_s=start_smoothing.reserved_w_per_s(self._start, self._ramp.ramping_gpus()),
        )
        # Parking and the start ramp only lower targets: every budget that held still holds.
        self._ramp, targets = ramp.state, ramp.targets_w
        self.stats.ramp_parked, self.stats.ramp_ramping = ramp.parked, ramp.ramping
        if ramp.starting:
            self._ramped_at_s = now
        if self._smoothing is not None and self._smoothing.peak_cap_w is not None:
            # Emulated smoothing's peak cap rides on the caps: it only lowers targets, so every
            # budget still holds, and the two-phase apply carries it like any decrease.
            targets = swing.apply_peak_cap(targets, self._smoothing.peak_cap_w, state.min_w)
        new_state, plan = power_apply.plan(
            state, targets, self.tree, now_s=now, policy=policy, raise_rates_w_per_s=ramp.raise_rates_w_per_s
        )
        raised = power_apply.may_be_in_force_w(new_state) > power_apply.may_be_in_force_w(state)
        for i in np.flatnonzero(raised):
            self._raised_at_s[new_state.gpus[i].gpu_uuid] = now
        if plan.decreases or plan.increases:
            # Durable before anything leaves: a restart must know every command that may still land.
            # (Read-backs alone are not saved every period: a restored state that misses some is only
            # more cautious, and fresh read-backs settle it.)
            await self._save({APPLY_DOC: new_state.to_mapping()})
        self.state, self._targets = new_state, targets
        self._waiting = plan.waiting
        self._send(plan, now)
        await self._smooth(now, state)
        await self._start_smoothing(now, state, ramp)
        await self._bmc_fallback(new_state, targets, now)
        self._status(now, new_state, targets, drawn, draw_known, allocation, plan)
        self.stats.periods += 1
        self.stats.stranded_w.append((now, allocation.stranded_w))
        self.stats.settling_w.append((now, allocation.settling_w))
        self.stats.step_ms.append((time.perf_counter() - started) * 1000)
        self._ingest.metrics.power_period_seconds.observe(time.perf_counter() - started)
        if self.on_period is not None:
            self.on_period(now, new_state, targets)
        if plan.decreases or plan.increases or plan.over_budget:
            log.info("power_period", reason=plan.reason, allocation=allocation.reason)
        return plan

    def _inventory(self) -> list[power_apply.GpuLimits]:
        """The GPUs of the tree's nodes whose caps count: every one known, whether its agent is here or not.

        A GPU is known from its node's Hello to this process, from the store (every Hello since the
        first, read at start), or from the restored apply state. Counting only the GPUs whose agents
        had said Hello since a restart dropped the others' caps from every sum: their budget went to
        the nodes that came back first while they still ran at their old caps.
        """
        nodes = set(self.tree.index.node_names)
        records = {**self._known_gpus, **self._ingest.gpu_records}  # this process's Hellos are newest
        out: dict[str, power_apply.GpuLimits] = {}
        for gpu_uuid, record in records.items():
            if record.node_id not in nodes:
                continue
            node_now = self._ingest.gpu_nodes.get(gpu_uuid)
            if node_now is not None and node_now != record.node_id:
                continue  # moved to another node: counted under that node's record
            out[gpu_uuid] = power_apply.GpuLimits(
                gpu_uuid, record.node_id, int(record.power_limit_min_w), int(record.power_limit_max_w)
            )
        if self.state is not None:
            for known in self.state.gpus:
                if known.gpu_uuid not in records and known.node_id in nodes:
                    out[known.gpu_uuid] = known
        return sorted(out.values(), key=lambda g: (g.node_id, g.gpu_uuid))

    def _sync_inventory(self, gpus: Sequence[power_apply.GpuLimits], now: float) -> power_apply.ApplyState:
        state = self.state
        assert state is not None
        if tuple(gpus) != state.gpus:
            state = state.with_gpus(gpus, now_s=now, policy=self.policy)
            self._targets = None
            mins: dict[str, float] = {}
            for g in gpus:
                mins[g.node_id] = mins.get(g.node_id, 0) + g.min_w
            try:
                self.tree = self.tree.with_node_mins(mins)
            except power_tree.PowerTreeError as exc:
                log.error("power_tree_minimums_rejected", error=str(exc))
        for node_id, boot_id in self._ingest.boot_ids.items():
            known = self._boot_ids.get(node_id)
            if known is not None and known != boot_id:
                # NVML limits do not survive a reboot: the node's caps are unknown again.
                state = power_apply.forget_node(state, node_id, now_s=now, policy=self.policy)
                self._smoothing_nodes.pop(node_id, None)
                log.info("power_node_rebooted", node=node_id)
            self._boot_ids[node_id] = boot_id
        return state

    def _readbacks(self, state: power_apply.ApplyState) -> list[power_apply.CapReadback]:
        latest = self._ingest.latest
        sampled_ns = self._ingest.latest_controller_ns
        out = []
        for g in state.gpus:
            reading = latest.get(g.gpu_uuid)
            if reading is not None and reading.enforced_power_limit_w is not None and reading.counters_unix_ns:
                # A raise the agent is still slewing gets to its target without another command:
                # that is the most that may be in force (power_apply's module doc).
                in_force_w = power_apply.in_force_w(reading.enforced_power_limit_w, reading.power_limit_slew_target_w)
                # In controller time: the apply state compares it with deadlines this clock set.
                at_ns = sampled_ns.get(g.gpu_uuid, min(reading.counters_unix_ns, self._clock()))
                out.append(power_apply.CapReadback(g.gpu_uuid, in_force_w, at_ns / 1e9))
        return out

    async def _views(self, state: power_apply.ApplyState, now: float) -> tuple[power.GpuViews, np.ndarray, np.ndarray]:
        policy = self.policy
        bound = power_apply.may_be_in_force_w(state)
        # The step period as the detector measured it on unmanaged power (a recent window that holds a
        # load change reads the change as a long period).
        detected = self._smoothing_unmanaged
        step_s = detected.period_s if detected is not None else None
        telemetry_s = self._ingest.settings.agent_config.get("telemetry_send_interval_ms", 1000) / 1000.0
        window_s = power.draw_window_s(
            self.settings.draw_window_s,
            policy.control_period_s,
            step_s,
            telemetry_s,
            longest_s=self.settings.detect_window_s,
        )
        peaks = self._ingest.power_window.gpu_max_w(int((now - window_s) * 1e9))
        latest = self._ingest.latest
        stale_ns = int((now - self.settings.telemetry_stale_s) * 1e9)
        n = len(state.gpus)
        draw = np.empty(n)
        drawn = np.zeros(n)
        known = np.zeros(n, dtype=bool)
        throttled = np.zeros(n, dtype=bool)
        ramping = self._ramp.ramping_gpus()
        for i, g in enumerate(state.gpus):
            reading = latest.get(g.gpu_uuid)
            fresh = reading is not None and reading.power_w is not None and reading.power_sample_unix_ns >= stale_ns
            peak = peaks.get(g.gpu_uuid)
            if fresh and peak is not None:
                # An idle GPU (no utilisation: its job stopped or left) needs what it draws now; the
                # window's peak would hold its watts for a whole window after a load change.
                idle = reading.utilization_gpu_pct == 0  # type: ignore[union-attr]
                draw[i] = reading.power_w if idle else peak  # type: ignore[union-attr]
                known[i] = True
                drawn[i] = reading.power_w or 0.0  # type: ignore[union-attr]
            else:
                draw[i] = bound[i]  # stale telemetry: drawing at the cap that may be in force
            if reading is not None and reading.clock_event_reasons is not None:
                throttled[i] = bool(reading.clock_event_reasons & SW_POWER_CAP)
            # A GPU whose job-start ramp is still rising is held by its ceiling, and its limit lags
            # what the budget counts (the agent slews it): by the draw it would look uncapped and
            # get no raise, stalling its ramp.
            if g.gpu_uuid in ramping:
                throttled[i] = True
        reachable = np.array([g.node_id in self._ingest.sessions for g in state.gpus], dtype=bool)
        # Settling: the step, at most the configured draw window.
        settle = power.settle_s(
            min(step_s, self.settings.draw_window_s) if step_s is not None else None,
            policy.control_period_s,
            telemetry_s,
        )
        settling = np.array([now - self._raised_at_s.get(g.gpu_uuid, -np.inf) < settle for g in state.gpus])
        # A quarantined GPU releases its share once it has read idle for as long as a raise settles:
        # one step plus the telemetry delay (the scheduler takes a rank out at a step boundary).
        eligible = await self._eligible(state, now, hold_s=settle)
        views = power.GpuViews(
            gpu_uuids=tuple(g.gpu_uuid for g in state.gpus),
            node_idx=np.array([self.tree.index.node_of_name[g.node_id] for g in state.gpus], dtype=np.intp),
            priority=np.array([_priority(self._ingest.node_labels.get(g.node_id, {})) for g in state.gpus]),
            draw_w=draw,
            cap_w=bound,
            min_w=state.min_w,
            max_w=state.max_w,
            throttled=throttled,
            eligible=eligible,
            marginal=np.zeros(n, dtype=bool),
            reachable=reachable,
            settling=settling,
        )
        return views, known, drawn

    async def _eligible(self, state: power_apply.ApplyState, now: float, *, hold_s: float) -> np.ndarray:
        """False for quarantined GPUs (or GPUs of quarantined nodes) the work has left: they release their share.

        A quarantined GPU the job still runs on keeps its cap until its utilisation has read 0 for
        `hold_s` (`power.released`): in a synchronous job, dropping one rank to its minimum cap while
        it still computes stalls every rank's step, and one idle sample does not say the step is done
        with it.
        """
        rows = await self._ingest.run_in_store(lambda: self._docs.quarantines(active_only=True))
        nodes = {q["node_id"] for q in rows if not q["gpu_uuid"] and not q["port"]}
        gpus = {q["gpu_uuid"] for q in rows if q["gpu_uuid"]}
        idle_for = self._idle_for_s(state, now)
        quarantined = np.array([g.node_id in nodes or g.gpu_uuid in gpus for g in state.gpus], dtype=bool)
        return ~power.released(quarantined, idle_for, hold_s)

    def _idle_for_s(self, state: power_apply.ApplyState, now: float) -> np.ndarray:
        """How long each GPU's utilisation has read 0 (or not been reported), s; nan while it reads busy."""
        latest = self._ingest.latest
        since: dict[str, float] = {}
        out = np.full(len(state.gpus), np.nan)
        for i, g in enumerate(state.gpus):
            reading = latest.get(g.gpu_uuid)
            if reading is not None and reading.utilization_gpu_pct:
                continue
            sampled = reading.counters_unix_ns / 1e9 if reading is not None and reading.counters_unix_ns else now
            since[g.gpu_uuid] = self._idle_since_s.get(g.gpu_uuid, min(sampled, now))
            out[i] = now - since[g.gpu_uuid]
        self._idle_since_s = since
        return out

    # -- sending -------------------------------------------------------------------------------------
    def _send(self, plan: power_apply.CapPlan, now: float) -> None:
        groups: dict[str, list[power_apply.CapCommand]] = {}
        # Decreases first on the wire too (they were admitted first).
        for command in (*plan.decreases, *plan.increases):
            groups.setdefault(command.node_id, []).append(command)
        self.stats.decreases_sent += len(plan.decreases)
        self.stats.increases_sent += len(plan.increases)
        for node_id, commands in groups.items():
            wire = commands_pb.Command(
                command_id=commands[0].command_id,
                issued_unix_ns=int(now * 1e9),
                deadline_unix_ns=int(commands[0].deadline_s * 1e9),
                reason=plan.reason,
                set_power_cap=commands_pb.SetPowerCap(
                    limits=[
                        commands_pb.GpuPowerLimit(
                            gpu_uuid=c.gpu_uuid, power_limit_w=c.limit_w, max_raise_w_per_s=c.max_raise_w_per_s
                        )
                        for c in commands
                    ]
                ),
            )
            self.stats.commands_sent += 1
            self._spawn(self._send_caps(node_id, wire, commands))

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._sends.add(task)
        task.add_done_callback(self._sends.discard)

    async def _send_caps(self, node_id: str, wire: commands_pb.Command, commands: list[power_apply.CapCommand]) -> None:
        try:
            result = await self._ingest.send_command(node_id, wire, timeout_s=self.policy.command_ttl_s + 1.0)
        except (LookupError, TimeoutError, ConnectionError) as exc:
            # No answer: the command stays pending until a read-back newer than its deadline.
            log.info("power_cap_unanswered", node=node_id, command_id=wire.command_id, error=str(exc))
            return
        # A slewing raise is confirmed at its target (see power_apply): the agent has taken it.
        read = {
            limit.gpu_uuid: power_apply.in_force_w(limit.power_limit_w, limit.slew_target_w)
            for limit in result.enforced_limits
        }
        at_s = (
            self._ingest.to_controller_ns(node_id, result.finished_unix_ns)
            if result.finished_unix_ns
            else self._clock()
        ) / 1e9
        for c in commands:
            if c.gpu_uuid in read:
                self._acks.append(power_apply.CapAck(c.command_id, c.gpu_uuid, float(read[c.gpu_uuid]), at_s))
            elif result.outcome in NOT_EXECUTED:
                self._acks.append(power_apply.CapAck(c.command_id, c.gpu_uuid, None, at_s))
        if self._waiting:
            self._wake.set()  # raises wait on these confirmations: do not make them wait a period

    # -- smoothing -----------------------------------------------------------------------------------
    async def _smooth(self, now: float, state: power_apply.ApplyState) -> None:
        policy = self.policy
        if self._smoothing_restored:
            latest = self._ingest.latest
            reporting = sum(1 for g in state.gpus if g.gpu_uuid in latest)
            if reporting < SMOOTHING_RESTORE_COVERAGE * len(state.gpus):
                return  # judged once the fleet's telemetry is back, or reconnecting GPUs read as idle
            # The predecessor's nodes are not known: every node now connected gets the plan again
            # (the same profile, harmless) or, if the job stopped, its "off".
            self._smoothing_restored = False
            self._smoothing_nodes = dict.fromkeys(self._ingest.sessions, "restored")
        running = self._job_running(state)
        if self._smoothing is not None:
            if not running:
                await self._disable_smoothing("the job stopped")
                self._smoothing_off_since_s = now
                return
            self._send_smoothing(self._smoothing, only_new=True)
            return
        if not running:
            return
        window = self.settings.detect_window_s
        since = now - window
        if self._smoothing_off_since_s is not None:
            since = max(since, self._smoothing_off_since_s + 1.0)
        if self._ramped_at_s is not None:
            # Power under a rising start ramp is not the unmanaged swing the plan must be sized from.
            since = max(since, self._ramped_at_s + 1.0)
        # Under start profiles the aggregate is masked (the profiles' ramp rates hold the swing
        # down): the canaries, kept without one, show the unmanaged swing, scaled to the job.
        masked = self._start.active()
        if masked and not self._start.canaries:
            log.info("power_swing_masked", reason="start profiles and no canary GPUs: the plan waits for their release")
            return
        rows = self._ingest.power_window.series(since_unix_ns=int(since * 1e9), tracked=masked)
        if not rows:
            return
        full = max(count for _, _, count in rows)
        expected = len(self._start.canaries) if masked else len(state.gpus)
        n_gpus = len(self._start.rate_w_per_s) + len(self._start.canaries) if masked else full
        series = _scaled_series(rows, full) * (n_gpus / full)
        sample_hz = 1e9 / self._ingest.power_window.bucket_ns
        if len(series) < 0.5 * window * sample_hz or full < 0.8 * expected:
            log.info("power_swing_window_incomplete", buckets=len(series), gpus_reporting=full, canaries=masked)
            return
        report = swing.detect(series, sample_hz, policy=policy)
        tdp = float(np.median(state.max_w))
        records = self._ingest.gpu_records
        supported = all(records[g.gpu_uuid].power_smoothing_supported for g in state.gpus if g.gpu_uuid in records)
        plan = swing.plan_smoothing(report, n_gpus=n_gpus, tdp_w=tdp, firmware_supported=supported, policy=policy)
        self._smoothing_unmanaged = report
        if masked:
            self._start_p2p_w = report.p2p_w
        if not plan.active:
            log.info("power_smoothing_not_needed", reason=plan.reason, p2p_w=round(report.p2p_w))
            return
        plan = self._ramp_for_the_straggler(plan, report, state, now)
        # Durable before any profile leaves: a successor must be able to switch it off.
        await self._save({SMOOTHING_DOC: {"plan": dataclasses.asdict(plan), "report": dataclasses.asdict(report)}})
        self._smoothing = plan
        self._smoothing_nodes = {}
        log.info("power_smoothing_planned", reason=plan.reason, floor_w=round(plan.floor_w, 1),
                    ramp_w_per_s=round(plan.ramp_up_w_per_s, 1))  # fmt: skip
        self._send_smoothing(plan, only_new=False)

    async def _start_smoothing(self, now: float, state: power_apply.ApplyState, ramp: power_ramp.RampDecision) -> None:
        """Start profiles (`core.power.start_smoothing`): on at once for GPUs that start a job.

        Handed over to the swing plan (no command: its profile replaces them), off after the release time.
        """
        none = np.zeros(len(state.gpus), dtype=bool)
        records = self._ingest.gpu_records
        decision = start_smoothing.decide(
            self._start,
            gpu_uuids=[g.gpu_uuid for g in state.gpus],
            supported=np.array(
                [(r := records.get(g.gpu_uuid)) is not None and r.power_smoothing_supported for g in state.gpus],
                dtype=bool,
            ),
            started=ramp.started if ramp.started is not None else none,
            starting=ramp.under_ceiling if ramp.under_ceiling is not None else none,
            parked=ramp.parked_mask if ramp.parked_mask is not None else none,
            max_w=state.max_w,
            detected_active=self._smoothing is not None,
            unmanaged_p2p_w=self._start_p2p_w,
            now_s=now,
            policy=self.policy,
        )
        held = decision.state.rate_w_per_s
        apply = dict(decision.apply_w_per_s)
        release = set(decision.release)
        for gpu in self._start_unsent:  # unanswered last time: again, in whichever state it should be now
            if gpu in held:
                apply.setdefault(gpu, held[gpu])
            elif decision.handed_over == 0 and gpu not in decision.state.canaries:
                release.add(gpu)
        self._start_unsent = set()
        if decision.state != self._start:
            # Durable before anything leaves: a restart must know which GPUs carry a start profile, or
            # it would leave them on (filling troughs, an energy cost) until the next job start.
            await self._save({START_DOC: decision.state.to_mapping()})
        self._start = decision.state
        if not decision.state.active():
            self._start_p2p_w = None
        self._ingest.power_window.track(decision.state.canaries)
        self.stats.start_smoothed = len(held)
        if decision.handed_over:
            log.info("power_start_smoothing_handed_over", gpus=decision.handed_over)
        node_of = {g.gpu_uuid: g.node_id for g in state.gpus}
        groups: dict[tuple[str, float | None], list[str]] = {}
        for gpu, rate in apply.items():
            groups.setdefault((node_of[gpu], rate), []).append(gpu)
        for gpu in sorted(release):
            if gpu in node_of:
                groups.setdefault((node_of[gpu], None), []).append(gpu)
        if groups:
            log.info("power_start_smoothing", reason=decision.reason, on=len(apply), off=len(release))
        for (node_id, rate), gpus in groups.items():
            profile = (
                commands_pb.SetPowerSmoothing(gpu_uuids=gpus, enabled=False)
                if rate is None
                else commands_pb.SetPowerSmoothing(
                    gpu_uuids=gpus,
                    enabled=True,
                    floor_pct=self.policy.floor_min_pct,
                    ramp_up_w_per_s=rate,
                    ramp_down_w_per_s=rate,
                )
            )
            command = commands_pb.Command(
                command_id=uuid.uuid4().hex,
                issued_unix_ns=self._clock(),
                deadline_unix_ns=self._clock() + int(self.policy.command_ttl_s * 1e9),
                reason="job-start smoothing" if rate is not None else "job-start smoothing released",
                set_power_smoothing=profile,
            )
            self.stats.start_smoothing_commands += 1
            self._spawn(self._send_start_profile(node_id, command, gpus))

    async def _send_start_profile(self, node_id: str, command: commands_pb.Command, gpus: list[str]) -> None:
        try:
            result = await self._ingest.send_command(node_id, command, timeout_s=self.policy.command_ttl_s + 1.0)
        except (LookupError, TimeoutError, ConnectionError) as exc:
            self._start_unsent.update(gpus)
            log.info("power_start_smoothing_unanswered", node=node_id, error=str(exc))
            return
        if result.outcome != commands_pb.ACTION_OUTCOME_SUCCEEDED:
            log.warning("power_start_smoothing_not_applied", node=node_id, outcome=result.outcome,
                        message=result.message)  # fmt: skip
        if self._smoothing is not None:
            # The swing plan took over while this start profile was in flight: it may have landed
            # after the plan's profile, so the plan goes to this node again next period.
            self._smoothing_nodes.pop(node_id, None)

    def _ramp_for_the_straggler(
        self, plan: swing.SmoothingPlan, report: swing.SwingReport, state: power_apply.ApplyState, now: float
    ) -> swing.SmoothingPlan:
        """Size the ramp rate for the highest-drawing rank, not the mean one.

        `plan_smoothing` sizes the ramp-up so the *mean* GPU loses at most `step_time_cost_max_pct` of
        a step; but a synchronous step waits for its slowest rank, which is the one with the most to
        climb from the floor. Same formula, with the 99th percentile of the GPUs' peak draw.
        """
        if plan.mode != "firmware" or plan.floor_w <= 0:
            return plan
        since_ns = int((now - self.settings.detect_window_s) * 1e9)
        peaks = self._ingest.power_window.gpu_max_w(since_ns)
        values = [peaks[g.gpu_uuid] for g in state.gpus if g.gpu_uuid in peaks]
        if not values:
            return plan
        peak = float(np.percentile(values, 99))
        kept = peak - plan.floor_w
        cost = self.policy.step_time_cost_max_pct / 100.0
        if kept <= 0 or cost <= 0:
            return plan
        ramp = kept**2 / (2.0 * cost * (report.period_s or 1.0) * peak)
        if ramp <= plan.ramp_up_w_per_s:
            return plan
        return dataclasses.replace(plan, ramp_up_w_per_s=ramp, ramp_down_w_per_s=ramp)

    def _idle(self, state: power_apply.ApplyState) -> np.ndarray:
        """True for each GPU whose latest reading shows no utilisation (no job runs on it)."""
        latest = self._ingest.latest
        return np.array(
            [(r := latest.get(g.gpu_uuid)) is not None and r.utilization_gpu_pct == 0 for g in state.gpus], dtype=bool
        )

    def _job_running(self, state: power_apply.ApplyState) -> bool:
        """At least half the managed GPUs report utilisation (the job runs)."""
        latest = self._ingest.latest
        busy = sum(
            1
            for g in state.gpus
            if (r := latest.get(g.gpu_uuid)) is not None
            and r.utilization_gpu_pct is not None
            and r.utilization_gpu_pct > 0
        )
        return busy >= 0.5 * len(state.gpus)

    def _smoothing_command(
        self, plan: swing.SmoothingPlan, gpus: list[str], *, enabled: bool, reason: str
    ) -> commands_pb.Command:
        """The wire command that switches `plan`'s node-side smoothing on (or off) on some GPUs.

        Firmware: the GPUs' power-smoothing profile. Emulated: the node's trough-filler hook (off, it
        lowers its floor at the job ramp, a soft landing). A peak cap needs no command: it rides on
        the caps (`_step`).
        """
        action: dict[str, Any]
        if plan.mode == "firmware":
            profile = (
                commands_pb.SetPowerSmoothing(
                    gpu_uuids=gpus,
                    enabled=True,
                    floor_pct=plan.floor_pct,
                    ramp_up_w_per_s=plan.ramp_up_w_per_s,
                    ramp_down_w_per_s=plan.ramp_down_w_per_s,
                )
                if enabled
                else commands_pb.SetPowerSmoothing(gpu_uuids=gpus, enabled=False)
            )
            action = {"set_power_smoothing": profile}
        else:
            action = {
                "set_trough_filler": commands_pb.SetTroughFiller(
                    gpu_uuids=gpus,
                    enabled=enabled,
                    floor_w=plan.trough_filler_w or 0.0,
                    ramp_down_w_per_s=plan.job_ramp_w_per_s,
                )
            }
        return commands_pb.Command(
            command_id=uuid.uuid4().hex,
            issued_unix_ns=self._clock(),
            deadline_unix_ns=self._clock() + int(self.policy.command_ttl_s * 1e9),
            reason=reason,
            **action,
        )

    def _smoothing_gpus(self, plan: swing.SmoothingPlan, node_id: str) -> list[str]:
        """The node's GPUs the plan's command goes to.

        Firmware profiles only where the GPU has the hardware; the trough filler on every GPU; none
        for a peak cap alone.
        """
        records = self._ingest.gpu_records
        gpus = [u for u in self._ingest.node_gpus(node_id) if u in records]
        if plan.mode == "firmware":
            return [u for u in gpus if records[u].power_smoothing_supported]
        return gpus if plan.trough_filler_w else []

    def _send_smoothing(self, plan: swing.SmoothingPlan, *, only_new: bool) -> None:
        latest = self._ingest.latest
        for node_id, session in list(self._ingest.sessions.items()):
            # Keyed by the stream: a node that reconnected may have rebooted, which clears the profile.
            key = f"{plan.reason}/{session.session_id}"
            sent_at = self._smoothing_sent_s.get(node_id, 0.0)
            # A GPU reset or reboot also clears it: telemetry says so (read after the profile was sent).
            lost = any(
                (r := latest.get(u)) is not None
                and r.power_smoothing_enabled is False
                and self._ingest.latest_controller_ns.get(u, 0) / 1e9 > sent_at + 1.0
                for u in self._ingest.node_gpus(node_id)
            )
            if only_new and self._smoothing_nodes.get(node_id) == key and not lost:
                continue
            gpus = self._smoothing_gpus(plan, node_id)
            if not gpus:
                continue
            self._smoothing_nodes[node_id] = key
            self._smoothing_sent_s[node_id] = self._now()
            command = self._smoothing_command(plan, gpus, enabled=True, reason=plan.reason)
            self.stats.smoothing_commands += 1
            self._spawn(self._send_smoothing_to(node_id, command))

    async def _send_smoothing_to(self, node_id: str, command: commands_pb.Command) -> None:
        try:
            result = await self._ingest.send_command(node_id, command, timeout_s=self.policy.command_ttl_s + 1.0)
        except (LookupError, TimeoutError, ConnectionError) as exc:
            self._smoothing_nodes.pop(node_id, None)  # try again next period
            log.info("power_smoothing_unanswered", node=node_id, error=str(exc))
            return
        if result.outcome != commands_pb.ACTION_OUTCOME_SUCCEEDED:
            log.warning("power_smoothing_not_applied", node=node_id, outcome=result.outcome, message=result.message)

    async def _disable_smoothing(self, why: str) -> None:
        log.warning("power_smoothing_off", reason=why)
        plan, self._smoothing = self._smoothing, None
        self._smoothing_restored = False
        if plan is None:
            return
        if not self._smoothing_nodes:  # restored and never judged: every connected node
            self._smoothing_nodes = dict.fromkeys(self._ingest.sessions, "restored")
        for node_id in list(self._smoothing_nodes):
            gpus = self._smoothing_gpus(plan, node_id)
            if not gpus:
                continue
            command = self._smoothing_command(plan, gpus, enabled=False, reason=why)
            self._spawn(self._send_smoothing_to(node_id, command))
        self._smoothing_nodes = {}
        # Deleted after the "off" commands left: a controller killed before this still has the plan,
        # and switches it off again (the same command, harmless). So is one whose store refused this.
        try:
            await self._save({SMOOTHING_DOC: None})
        except repo.STORE_UNAVAILABLE as exc:
            log.warning("power_smoothing_plan_not_deleted", error=str(exc))

    # -- out of band ---------------------------------------------------------------------------------
    def _apply_bmc_confirmations(self, state: power_apply.ApplyState) -> power_apply.ApplyState:
        """A node whose BMC confirmed a limit counts at that limit while its agent is away.

        The limit caps the node's total draw, and budgets stop at the node level, so the node's GPUs
        are recorded at their targets (which sum to at most the limit) as read-backs at the time the
        BMC confirmed it. The agent's own read-backs, once it is back, are newer and replace them.
        """
        readbacks = []
        for node_id, (at_s, targets) in self._bmc_confirmed.items():
            if node_id in self._ingest.sessions:
                continue
            for gpu_uuid, target in targets.items():
                # Not what the GPU enforces: its agent may still hold a higher cap, and the decrease
                # it was sent has not landed. It stays pending (`_bmc_fallback` lifts the limit
                # only once the agent, back, has confirmed caps within it).
                readbacks.append(power_apply.CapReadback(gpu_uuid, float(target), at_s, settles_commands=False))
        return power_apply.record(state, readbacks=readbacks, policy=self.policy) if readbacks else state

    async def _bmc_fallback(self, state: power_apply.ApplyState, targets: np.ndarray, now: float) -> None:
        if self._limiter is None:
            return
        bound = power_apply.may_be_in_force_w(state)
        by_node: dict[str, list[int]] = {}
        for i, g in enumerate(state.gpus):
            by_node.setdefault(g.node_id, []).append(i)
        for node_id, idx in by_node.items():
            if node_id in self._ingest.sessions:
                self._unreachable_since.pop(node_id, None)
                limit_w = self._bmc_limits.get(node_id)
                if limit_w is not None and node_id not in self._bmc_in_flight:
                    # The agent is back: the out-of-band limit goes once the caps it holds are known
                    # and within the limit (no command to its GPUs unanswered). Lifted at once, the
                    # node ran at its old caps, over its budget, until its decreases landed.
                    settled = bool((state.pending_seq[idx] == power_apply.NO_COMMAND).all())
                    if settled and bound[idx].sum() <= limit_w:
                        self._bmc_in_flight.add(node_id)
                        self._spawn(self._bmc_set(node_id, None, {}))
                continue
            since = self._unreachable_since.setdefault(node_id, now)
            if now - since < self.settings.bmc_fallback_after_s or node_id in self._bmc_in_flight:
                continue
            want = int(sum(int(targets[i]) for i in idx))
            if bound[idx].sum() <= want or self._bmc_limits.get(node_id) == want:
                continue
            if not self._limiter.configured(node_id):
                continue
            self._bmc_in_flight.add(node_id)
            self._spawn(self._bmc_set(node_id, want, {state.gpus[i].gpu_uuid: int(targets[i]) for i in idx}))

    async def _bmc_set(self, node_id: str, limit_w: int | None, targets: dict[str, int]) -> None:
        assert self._limiter is not None
        try:
            confirmed = await asyncio.to_thread(self._limiter.set_node_limit, node_id, limit_w)
        except Exception as exc:  # an unreachable BMC: the node keeps counting at its last known caps
            log.error("power_bmc_limit_failed", node=node_id, limit_w=limit_w, error=str(exc))
            if limit_w is not None:
                self._ingest.metrics.power_bmc_limits.labels(outcome="failed").inc()
            return
        finally:
            self._bmc_in_flight.discard(node_id)
        if limit_w is None:
            self._bmc_limits.pop(node_id, None)
            self._bmc_confirmed.pop(node_id, None)
            log.info("power_bmc_limit_lifted", node=node_id)
            return
        if confirmed is not None and confirmed <= limit_w:
            self._bmc_limits[node_id] = limit_w
            self._bmc_confirmed[node_id] = (self._now(), targets)
            self.stats.bmc_limits += 1
            self._ingest.metrics.power_bmc_limits.labels(outcome="confirmed").inc()
            log.warning("power_bmc_limit_confirmed", node=node_id, limit_w=confirmed)
            self._wake.set()
        else:
            self._ingest.metrics.power_bmc_limits.labels(outcome="not_confirmed").inc()
            log.error("power_bmc_limit_not_confirmed", node=node_id, wanted_w=limit_w, read_back_w=confirmed)

    # -- status --------------------------------------------------------------------------------------
    def _status(
        self,
        now: float,
        state: power_apply.ApplyState,
        targets: np.ndarray,
        drawn: np.ndarray,
        draw_known: np.ndarray,
        allocation: power.Allocation,
        plan: power_apply.CapPlan,
    ) -> None:
        idx = self.tree.index
        node_idx = np.array([idx.node_of_name[g.node_id] for g in state.gpus], dtype=np.intp)
        sums = {
            "allocated": idx.sums(node_idx, power_apply.may_be_in_force_w(state)),
            "target": idx.sums(node_idx, targets.astype(np.float64)),
            "drawn": idx.sums(node_idx, np.where(draw_known, drawn, 0.0)),
        }
        position = {
            "node": {n: i for i, n in enumerate(idx.node_names)},
            "rack": {n: i for i, n in enumerate(idx.rack_names)},
            "row": {n: i for i, n in enumerate(idx.row_names)},
            "cluster": {idx.cluster_name: 0},
        }
        level_no = {"node": 0, "rack": 1, "row": 2, "cluster": 3}
        children: dict[str | None, list[power_tree.Domain]] = {}
        for d in self.tree.domains:
            children.setdefault(d.parent, []).append(d)

        def build(d: power_tree.Domain) -> DomainStatus:
            k, i = level_no[d.level], position[d.level][d.name]
            return DomainStatus(
                name=d.name,
                level=d.level,
                budget_w=d.budget_w,
                allocated_w=float(sums["allocated"][k][i]),
                target_w=float(sums["target"][k][i]),
                drawn_w=float(sums["drawn"][k][i]),
                children=tuple(build(c) for c in children.get(d.name, [])),
            )

        recent = None
        rows = self._ingest.power_window.series(since_unix_ns=int((now - 10.0) * 1e9))
        if rows:
            series = _scaled_series(rows, max(c for _, _, c in rows))
            if len(series) >= 4:
                recent = swing.detect(series, 1e9 / self._ingest.power_window.bucket_ns, policy=self.policy)
        self.status = PowerStatus(
            at_unix_s=now,
            root=build(self.tree.domains[0]),
            swing=recent,
            smoothing=self._smoothing,
            stranded_w=allocation.stranded_w,
            unmet_w=allocation.unmet_w,
            over_budget=plan.over_budget,
            reason=f"{plan.reason}; {allocation.reason}",
            periods=self.stats.periods + 1,
            unconfirmed_decreases=power_apply.unconfirmed_decreases(state),
        )


def _scaled_series(rows: Sequence[tuple[int, float, int]], full: int) -> np.ndarray:
    """Aggregate power per bucket, each scaled up to the full GPU count.

    A busy agent can miss a 100 ms bucket; dropping every incomplete bucket would leave nothing at
    scale, and keeping it unscaled would show a dip that is not there. Buckets with fewer than half
    the GPUs are dropped.
    """
    return np.array([total * full / count for _, total, count in rows if count >= 0.5 * full])


def _audit(now_ns: int, actor: str, action: str, reason: str) -> dict[str, Any]:
    """An audit row (same shape as the remediation service's), written with the change it records."""
    return {
        "at_unix_ns": now_ns,
        "actor": actor,
        "action": action,
        "node_id": "",
        "gpu_uuid": "",
        "reason": reason[:1000],
        "outcome": "ok",
        "details": {},
    }


def _priority(labels: Mapping[str, str]) -> int:
    """A node's priority class from its `power-priority` label (default 0)."""
    try:
        return int(labels.get("power-priority", "0"))
    except ValueError:
        return 0


def policy_to_toml(policy: power_policy.PowerPolicy) -> str:
    """A policy as TOML text, one `key = value` per line (`PowerPolicy.from_mapping` reads it back)."""
    lines = []
    for key, value in policy.to_mapping().items():
        if isinstance(value, bool):
            lines.append(f"{key} = {'true' if value else 'false'}")
        else:
            lines.append(f"{key} = {value!r}")
    return "\n".join(lines) + "\n"


def policy_from_toml(text: str) -> dict[str, Any]:
    """Parse policy TOML text (a bare table, or one under `[power.policy]`).

    Raises:
        power_policy.PolicyError: not valid TOML.
    """
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise power_policy.PolicyError("<toml>", str(exc)) from None
    if set(data) == {"power"} and isinstance(data["power"], dict) and set(data["power"]) == {"policy"}:
        data = data["power"]["policy"]
    return data
