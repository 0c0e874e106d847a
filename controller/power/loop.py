"""The controller's power loop: gathers, persists and sends around the pure power period.

Owns the running power manager of this replica: the period state (`core.power.period.PeriodState`:
the budget tree and policy in force, the two-phase apply state, the smoothing plans ...), the
status rasctl shows, and every exchange with the outside. The decisions are `period.step`'s; each
period (`step`, with `now` from the injected clock) the loop:

1. gathers the inputs (`core.power.inputs`): the active quarantines from the store and, with
   several replicas, the other replicas' aggregates (`remote`, `replication.aggregates.FleetReader`),
   then, with no await until `period.step` has run (so they are one consistent picture), the
   ingest's fleet view (inventory, telemetry, streams, boot ids, labels: `_fleet_view`, the one place
   that reads it), the power window as `period.window_reads` asks (`_window_view`), both with the
   other replicas' nodes laid over them (`core.power.remote`), and what came back from earlier
   commands (SetPowerCap acks, unanswered smoothing commands, BMC answers);
2. runs `period.step`;
3. persists, **before** any command leaves, what a restart must know: the apply state when there are
   cap commands (a restart knows every command that may land), the job-start profiles when they
   changed (or a restart would leave them on), a new swing plan (a successor must be able to switch
   it off; deleted once its "off" commands have left);
4. sends the commands (`rasd.controller.wire.power` makes the wire messages): one SetPowerCap per
   node through `send_command` (this replica's streams, or with several replicas the relay to the
   replica holding the node's stream), whose results come back as acks for the next period; the smoothing
   profiles and trough-filler commands; node power limits through the BMC (Redfish PowerLimit), in a
   thread, for unreachable nodes whose caps must come down;
5. logs the period's notes and counts it (stats, metrics); with several replicas, tells them what
   to ship for the next period (`remote.ask`: the windows it read, the tracked GPUs, how often).

The loop also holds the per-GPU floors (`floors`: a straggler's raise, set by the straggler watch's
actions, `core.power.floors`), given to each period as an input, and what the latest period says
each GPU could still be given within the budgets (`power_room`, what the straggler watch sizes a
raise to).

A period runs early when acks let waiting raises go, when a floor is set, when a BMC confirms a
limit, and after a budget or policy change. Start and stop live in `start()`/`stop()` only, so a
leader-election gate wraps exactly these two.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import itertools
import time
import tomllib
import types
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Annotated, Any, Protocol

import pydantic
import structlog
import tomli_w

from rasd.common import aio
from rasd.common import settings as settings_check
from rasd.controller.core import agent_messages as msgs
from rasd.controller.core import aggregates, fleet, straggler_actions
from rasd.controller.core.power import apply as power_apply
from rasd.controller.core.power import commands, fallback, period, start_smoothing, swing
from rasd.controller.core.power import floors as power_floors
from rasd.controller.core.power import inputs as period_inputs
from rasd.controller.core.power import policy as power_policy
from rasd.controller.core.power import remote as remote_inputs
from rasd.controller.core.power import repairs as power_repairs
from rasd.controller.core.power import status as power_status
from rasd.controller.core.power import tree as power_tree
from rasd.controller.core.remediation import actions
from rasd.controller.ingest import service as ingest_mod
from rasd.controller.power import repair_gate
from rasd.controller.store import remediation as rstore
from rasd.controller.store import repo
from rasd.controller.wire import commands as wire_commands
from rasd.controller.wire import power as power_wire

log = structlog.get_logger("rasd.controller.power")

APPLY_DOC = "power/apply"
START_DOC = "power/start_smoothing"
"""The job-start smoothing profiles the GPUs carry (`start_smoothing.StartState`): saved before any
start-profile command leaves, so a restarted controller releases or hands over the profiles it left on."""
SMOOTHING_DOC = "power/smoothing"
"""The detected swing's smoothing plan in force (`swing.SmoothingPlan`, with the `SwingReport` it was
sized from): saved before its first command leaves and deleted once its "off" commands have gone,
so a restarted controller switches off, at job end, the profiles its predecessor put on."""
FLOORS_DOC = "power/floors"
"""The straggler floors in force (`core.power.floors`): saved with the first period that serves a change,
before its commands leave, so the next leader serves them too."""
BUDGETS_DOC = "power/budgets"
POLICY_DOC = "power/policy"

DomainStatus = power_status.DomainStatus
PowerStatus = power_status.PowerStatus
"""The latest period's picture (`core.power.status`), named here for the loop's readers."""

NOT_LEADING = "not running here: this replica does not lead; the power loop runs on the leader"
"""A follower's status reason (with several replicas)."""

StepHook = Callable[[period.PeriodState, period_inputs.PeriodInputs, float, period.Period], None]
"""Called with (state before, inputs, now s, result) right after each `period.step` (a recorder)."""


Positive = Annotated[float, pydantic.Field(gt=0)]
"""A duration or window of the `[power]` table (the settings layer and the chart's schema refuse 0)."""


class PowerSettingsError(ValueError):
    """A bad `[power]` table; the message starts with the offending key's path."""


@dataclasses.dataclass(frozen=True)
class PowerSettings:
    """The `[power]` table of controller.toml."""

    tree: power_tree.PowerTree
    """The budget tree from `[power.tree]`."""
    policy: power_policy.PowerPolicy = dataclasses.field(default_factory=power_policy.PowerPolicy)
    """From `[power.policy]`."""
    telemetry_stale_s: Positive = 5.0
    """A GPU whose last power sample is older than this is treated as drawing at its cap."""
    detect_window_s: Positive = 20.0
    """Unmanaged aggregate power the swing detector needs before it plans smoothing, s."""
    bmc_fallback_after_s: Positive = 10.0
    """A node without a stream this long whose caps must come down gets a BMC power limit."""
    min_step_interval_s: Positive = 0.2
    """Earliest next period after an early wake-up (a budget change, acks with raises waiting)."""
    draw_window_s: Positive = 5.0
    """A GPU's draw is its peak over this long (at least one control period, and stretched to one
    detected step plus a telemetry batch, `power.draw_window_s`): it must span whole training steps,
    or a window that falls in a communication phase makes a busy GPU look idle."""
    repair_wait_s: Positive = 10.0
    """A reset or a reboot waits at most this long for the budget to hold its GPUs' default limits
    (`repair_gate`); then it leaves regardless, logged as an error."""
    seed: int = 0
    """Seed of the raise jitter."""

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], *, prefix: str = "power.") -> PowerSettings:
        """Validate the `[power]` table; errors name the key (e.g. `power.tree.rows[0].budget_w`).

        Raises:
            PowerSettingsError: any bad key or value.
        """
        values = settings_check.typed_values(cls, data, prefix, PowerSettingsError, skip={"tree", "policy"})
        if "tree" not in data:
            raise PowerSettingsError(f"{prefix}tree: required (the budget tree)")
        try:
            values["tree"] = power_tree.PowerTree.from_mapping(data["tree"])
        except power_tree.PowerTreeError as exc:
            raise PowerSettingsError(f"{prefix}tree.{exc.key}: {exc}") from None
        try:
            values["policy"] = power_policy.PowerPolicy.from_mapping(data.get("policy", {}))
        except power_policy.PolicyError as exc:
            raise PowerSettingsError(f"{prefix}policy.{exc.key}: {exc}") from None
        return cls(**values)


def remote_max_age_s(loop: PowerLoop) -> float:
    """How old another replica's aggregate may be and still count: the telemetry's staleness, 1.5 periods at least."""
    return max(loop.settings.telemetry_stale_s, 1.5 * loop.policy.control_period_s)


def _start_prefetch(loop: PowerLoop, remote: RemoteFleet) -> asyncio.Task[None]:
    """`RemoteFleet.prefetch_forever` between periods: replicas ship twice a period, looked for every eighth.

    Only in the half period before the next one: a row that lands earlier is superseded by its
    replica's next before the period reads it, and decoding it anyway was half the leader's decodes
    (at 100,000 GPUs the decodes took two fifths of the leader's event loop). A period that starts
    early (woken by a budget change) decodes what it needs in its own read.
    """

    def every_s() -> float:
        return min(0.25, loop.policy.control_period_s / 8)

    def max_age_s() -> float:
        return remote_max_age_s(loop)

    def due() -> bool:
        return loop.seconds_to_next_step() <= loop.policy.control_period_s / 2

    prefetch = remote.prefetch_forever(every_s=every_s, max_age_s=max_age_s, busy=loop.step_lock.locked, due=due)
    return asyncio.create_task(prefetch, name="rasd-power-prefetch")


class CommandSender(Protocol):
    """Sends a command to a node and waits for its result (`server.Controller.send_command`)."""

    def __call__(
        self, node_id: str, command: wire_commands.Command, *, timeout_s: float = 30.0
    ) -> Awaitable[msgs.AgentResult]:
        """Raises LookupError, TimeoutError or ConnectionError when no result comes back."""
        ...


class RemoteFleet(Protocol):
    """The other replicas' aggregates (`replication.aggregates.FleetReader`), with several replicas."""

    async def read(self, *, max_age_s: float, tracked: frozenset[str] = frozenset()) -> aggregates.FleetAggregate:
        """The other replicas' fresh aggregates, merged."""
        ...

    async def prefetch_forever(
        self,
        *,
        every_s: Callable[[], float],
        max_age_s: Callable[[], float],
        busy: Callable[[], bool],
        due: Callable[[], bool] = lambda: True,
    ) -> None:
        """Decode what lands (every every_s(), while due() and not busy()), so that a `read` finds it decoded."""
        ...

    async def ask(self, reads: aggregates.AggregateReads) -> None:
        """Tell the replicas what to ship for the next period."""
        ...


class BatchSender(Protocol):
    """Sends many commands to their nodes at once, each outcome to on_result as it comes (`Courier.send_many`)."""

    def __call__(
        self,
        commands: Sequence[tuple[str, wire_commands.Command]],
        *,
        timeout_s: float,
        on_result: Callable[[int, msgs.AgentResult | BaseException], None],
    ) -> Awaitable[None]:
        """on_result(index, result or the error `CommandSender` would raise), once per command."""
        ...


UNANSWERED: tuple[type[Exception], ...] = (LookupError, TimeoutError, ConnectionError, *repo.STORE_UNAVAILABLE)
"""A command whose result did not come back: no stream, no answer in time, or the relay's store was out."""


class NodePowerLimiter(Protocol):
    """Out-of-band node power limits (the BMC); calls block, the loop runs them in a thread."""

    def configured(self, node_id: str) -> bool:
        """Whether the node has a BMC to ask."""
        ...

    def set_node_limit(self, node_id: str, limit_w: int | None) -> int | None:
        """Set (None: lift) the node's power limit; returns the limit read back, W (None: no limit)."""
        ...


STATS_HISTORY = 100_000
"""Periods of history `PowerStats` keeps (about 2.3 days at a 2 s period)."""


@dataclasses.dataclass
class Returned:
    """What came back from the loop's commands since the last period: the next period's inputs."""

    acks: list[power_apply.CapAck] = dataclasses.field(default_factory=list)
    node_limit_results: list[period_inputs.NodeLimitResult] = dataclasses.field(default_factory=list)
    start_unanswered: set[str] = dataclasses.field(default_factory=set)
    """GPUs whose start profile went unanswered (sent again, in whichever state is due)."""
    start_answered: set[str] = dataclasses.field(default_factory=set)
    """Nodes that answered a start profile."""
    smoothing_unanswered: set[str] = dataclasses.field(default_factory=set)
    """Nodes whose smoothing command went unanswered (sent again next period)."""

    def take(self) -> tuple[tuple[power_apply.CapAck, ...], tuple[period_inputs.NodeLimitResult, ...],
                            period_inputs.SendOutcomes]:  # fmt: skip
        """(the acks, the BMC limits' results, the send outcomes) for a period's inputs; nothing is left."""
        outcomes = period_inputs.SendOutcomes(
            start_unanswered=frozenset(self.start_unanswered),
            start_answered_nodes=frozenset(self.start_answered),
            smoothing_unanswered_nodes=frozenset(self.smoothing_unanswered),
        )
        taken = (tuple(self.acks), tuple(self.node_limit_results), outcomes)
        self.acks, self.node_limit_results = [], []
        self.start_unanswered, self.start_answered, self.smoothing_unanswered = set(), set(), set()
        return taken

    def requeue(self, inputs: period_inputs.PeriodInputs) -> None:
        """Put back what a failed period took, ahead of what came back since."""
        self.acks[:0] = inputs.acks
        self.node_limit_results[:0] = inputs.node_limit_results
        self.start_unanswered |= inputs.outcomes.start_unanswered
        self.start_answered |= inputs.outcomes.start_answered_nodes
        self.smoothing_unanswered |= inputs.outcomes.smoothing_unanswered_nodes


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
    step_phases_ms: collections.deque[tuple[float, ...]] = dataclasses.field(default_factory=_history)
    """Where each period's `step_ms` went, ms, in the order of `STEP_PHASES`."""

    def count(self, result: period.Period, inputs: period_inputs.PeriodInputs, now: float, marks: list[float]) -> float:
        """Count a period; marks: its start and the ends of its phases but the last. Returns its duration, s."""
        out, status = result.commands, result.status
        assert out.caps is not None
        self.periods += 1
        self.acks += len(inputs.acks)
        self.decreases_sent += len(out.caps.decreases)
        self.increases_sent += len(out.caps.increases)
        self.ramp_parked, self.ramp_ramping = status.ramp_parked, status.ramp_ramping
        self.start_smoothed = status.start_smoothed
        self.stranded_w.append((now, status.stranded_w))
        self.settling_w.append((now, status.settling_w))
        marks = [*marks, time.perf_counter()]
        self.step_ms.append((marks[-1] - marks[0]) * 1000)
        self.step_phases_ms.append(tuple((end - begin) * 1000 for begin, end in itertools.pairwise(marks)))
        return marks[-1] - marks[0]


STEP_PHASES = ("store reads", "remote read", "period", "persist", "send")
"""A period's parts (`PowerStats.step_phases_ms`): the store thread's reads (quarantines, repair
commands), the other replicas' aggregates (read, decode, merge), the inputs and the pure period,
making its state durable, and handing its commands to the senders."""


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
        send_command: CommandSender | None = None,
        send_many: BatchSender | None = None,
        remote: RemoteFleet | None = None,
    ) -> None:
        """Bind to the ingest (telemetry, streams, store thread); nothing runs until start().

        send_command: how commands reach a node (default: this replica's streams, `Ingest.send_command`).
        send_many: how a period's caps reach their nodes, all at once (default: send_command for each).
        remote: with several replicas, the other replicas' aggregates; None: this replica holds every stream.
        """
        self._ingest = ingest
        self._send_command: CommandSender = send_command or ingest.send_command
        self._send_many: BatchSender = send_many or each_alone(self._send_command)
        self._remote = remote
        self._remote_view: aggregates.FleetAggregate = aggregates.EMPTY
        self._tracked: frozenset[str] = frozenset()
        self.settings = settings
        self._docs = rstore.RemediationStore(ingest.store.engine)
        self._limiter = limiter
        self._clock = clock
        self._replica = replica or uuid.uuid4().hex[:6]
        self._config = period_inputs.PeriodConfig(
            telemetry_stale_s=settings.telemetry_stale_s,
            detect_window_s=settings.detect_window_s,
            bmc_fallback_after_s=settings.bmc_fallback_after_s,
            draw_window_s=settings.draw_window_s,
        )
        self._period = fresh_state(settings, self._config, settings.tree, settings.policy, replica=self._replica)
        self._started = False
        self._budget_overrides: dict[str, int | None] = {}
        self._known_gpus: dict[str, fleet.GpuRecord] = {}
        """GPU uuid -> its record in the store at start (GPUs whose agents are not back count too)."""
        self._returned = Returned()
        self._caps_unanswered: list[tuple[str, str]] = []
        """(node, error) of cap commands left unanswered since the last period's log line."""
        self._wake = asyncio.Event()
        self.step_lock = asyncio.Lock()
        """Held by a period and by an operator's change (the other replicas' decodes wait while it is)."""
        self._task: asyncio.Task[None] | None = None
        self._prefetch_task: asyncio.Task[None] | None = None
        self._sends: set[asyncio.Task[None]] = set()
        self._last_step_s = 0.0
        self._next_step_s = 0.0
        """When the timer runs the next period, s (0: at once; a wake may run it sooner)."""
        self._waiting = 0
        self.status: PowerStatus = power_status.NOT_STARTED
        if remote is not None:  # a follower's status says where the loop runs
            self.status = dataclasses.replace(power_status.NOT_STARTED, reason=NOT_LEADING)
        self.stats = PowerStats()
        self.on_step: StepHook | None = None
        self.repairs = repair_gate.RepairHold(wait_s=settings.repair_wait_s)
        """Resets and reboots counted at their GPUs' default limits, held until there is room (`repair_gate`)."""
        self.floors: dict[str, power_floors.Floor] = {}
        self._floors_saved: dict[str, power_floors.Floor] = {}  # as the store has them (`_persist`)
        """GPU -> its floor (a straggler's raise, `core.power.floors`): served within the budgets' headroom."""
        self.room: power_status.GpuRoom | None = None
        """What each GPU could still be given after the latest period (None: no period managed GPUs)."""
        self._room_index: dict[str, int] | None = None
        """GPU -> its position in `room`, built at the first `power_room` call after a period (rare: verdicts)."""

    # -- what the loop holds -------------------------------------------------------------------------
    @property
    def state(self) -> power_apply.ApplyState | None:
        """The two-phase apply state (None before `start()`)."""
        return self._period.apply if self._started else None

    @property
    def tree(self) -> power_tree.PowerTree:
        """The budget tree in force."""
        return self._period.tree

    @property
    def policy(self) -> power_policy.PowerPolicy:
        """The policy in force."""
        return self._period.policy

    @property
    def period_state(self) -> period.PeriodState:
        """Everything the next period starts from (`core.power.period.PeriodState`)."""
        return self._period

    @property
    def start_smoothing_state(self) -> start_smoothing.StartState:
        """The job-start smoothing profiles the loop believes are on the GPUs (`core.power.start_smoothing`)."""
        return self._period.start

    @property
    def running(self) -> bool:
        """Whether the control loop runs (between `start` and `stop`)."""
        return self._task is not None

    def hold_repair(self, action: actions.Action, send: repair_gate.Send) -> bool:
        """Count a reset's or a reboot's GPUs at their default limits; send it once the budget holds them.

        Returns False (the caller sends it) for any other action, and for a node outside the power tree.
        """
        node = action.node_id
        if node not in self.tree.index.node_of_name:
            return False
        repair = power_repairs.repair_for(
            action.kind,
            command_id=action.command_id,
            node_id=node,
            gpu_uuid=getattr(action, "gpu_uuid", ""),
            node_gpus=self._ingest.node_gpus(node),
            boot_id=self._ingest.boot_ids.get(node, ""),
            now_s=self._now(),
        )
        if repair is None:
            return False
        log.info("power_repair_held", command_id=repair.command_id, kind=repair.kind, node=node,
                 gpus=len(repair.gpu_uuids))  # fmt: skip
        self.repairs.add(repair, send)
        self._wake.set()  # a period counts it now, not at the next tick
        return True

    # -- floors (a straggler's raise) ----------------------------------------------------------------
    def set_floor(self, gpu_uuid: str, node_id: str, floor_w: float, reason: str) -> power_floors.Floor:
        """Give gpu_uuid a floor from the next period on (within the budgets' headroom); replaces its last one.

        Raises:
            ValueError: a floor that is not a positive number of watts.
        """
        floor = power_floors.floor(gpu_uuid, node_id, floor_w, reason, now_s=self._now())
        self.floors[gpu_uuid] = floor
        log.info("power_floor_set", gpu=gpu_uuid, node=node_id, floor_w=floor.floor_w, reason=reason,
                 expires_at_s=floor.expires_at_s)  # fmt: skip
        self._wake.set()
        return floor

    def clear_floor(self, gpu_uuid: str, why: str) -> bool:
        """Remove gpu_uuid's floor; False when it had none."""
        if self.floors.pop(gpu_uuid, None) is None:
            return False
        log.info("power_floor_removed", gpu=gpu_uuid, why=why)
        return True

    def power_room(self, gpu_uuid: str) -> straggler_actions.PowerRoom | None:
        """What the latest period says gpu_uuid could still be given; None where this loop does not know.

        None while the loop does not run (a follower replica, stopped), before a period managed GPUs,
        when the latest period is older than two control periods, or for a GPU outside the tree.
        """
        room = self.room
        if room is None or self._task is None or self._now() - room.at_unix_s > 2 * self.policy.control_period_s:
            return None
        if self._room_index is None:
            self._room_index = room.index()
        i = self._room_index.get(gpu_uuid)
        if i is None:
            return None
        cap_w, max_w, headroom_w, capped = room.row(i)
        return straggler_actions.PowerRoom(cap_w=cap_w, max_w=max_w, headroom_w=headroom_w, capped=capped)

    def _set_room(self, room: power_status.GpuRoom | None) -> None:
        self.room, self._room_index = room, None

    # -- lifecycle -----------------------------------------------------------------------------------
    async def start(self) -> None:
        """Load the persisted state (budgets, policy, apply state, smoothing) and start the control loop."""
        docs = await self._ingest.store_calls.run_in_store(lambda: self._docs.load_docs("power/"))
        self._period, overrides = restored_state(settings=self.settings, config=self._config, docs=docs,
                                                 now_s=self._now(), replica=self._replica)  # fmt: skip
        self._budget_overrides.update(overrides)
        self.floors = restored_floors(docs, now_s=self._now())
        self._floors_saved = dict(self.floors)
        # Every GPU the store knows, connected now or not: a node whose agent has not (yet) come back
        # keeps the caps it had, and the allocator must count them (`views.inventory`).
        nodes = await self._ingest.store_calls.run_in_store(self._ingest.store.list_nodes)
        self._known_gpus = {gpu.record.uuid: gpu.record for node in nodes for gpu in node.gpus}
        self._started = True
        self._task = asyncio.create_task(self._run(), name="rasd-power-loop")
        if self._remote is not None:  # other replicas' aggregates decoded as they land, not in a period
            self._prefetch_task = _start_prefetch(self, self._remote)
        log.info("power_loop_started", period_s=self.policy.control_period_s, domains=len(self.tree.domains),
                 gpus_known=len(self._known_gpus))  # fmt: skip

    async def stop(self) -> None:
        """Stop the loop and wait for commands in flight (their acks are dropped; read-backs settle them)."""
        for task in (self._task, self._prefetch_task):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        self._task = self._prefetch_task = None
        self.repairs.release_all("the power loop stopped")
        self._set_room(None)  # a stopped loop (a deposed leader) knows no headroom
        for task in list(self._sends):
            task.cancel()
        await asyncio.gather(*self._sends, return_exceptions=True)
        if self._remote is not None:  # deposed: its last picture would go stale here
            self.status = dataclasses.replace(power_status.NOT_STARTED, reason=NOT_LEADING)
        log.info("power_loop_stopped")

    async def _run(self) -> None:
        while True:
            try:
                await self.step()
            except Exception as exc:  # one bad period must not end power management
                log.exception("power_period_failed", error=str(exc))
            self._next_step_s = self._now() + self.policy.control_period_s
            await aio.wait_event(self._wake, self.policy.control_period_s)
            self._wake.clear()
            gap = self.settings.min_step_interval_s - (self._now() - self._last_step_s)
            if gap > 0:
                await asyncio.sleep(gap)

    def _now(self) -> float:
        return self._clock() / 1e9

    def seconds_to_next_step(self) -> float:
        """How long until the timer runs the next period, s (0 or below: due now)."""
        return self._next_step_s - self._now()

    # -- operator changes ----------------------------------------------------------------------------
    async def set_budget(
        self, domain: str, budget_w: float | None, *, reason: str, actor: str = "operator"
    ) -> power_tree.Domain:
        """Change a domain's budget now (persisted); the loop runs a period at once to enforce a cut.

        Raises:
            power_tree.PowerTreeError: unknown domain or a budget below the minimum caps under it.
        """
        async with self.step_lock:  # not in the middle of a period: it would put the old tree back
            tree = self.tree.with_budget(domain, budget_w)
            new_w = tree.domain(domain).budget_w
            overrides = {**self._budget_overrides, domain: new_w}
            audit = _audit(self._clock(), actor, "set_power_budget", f"{domain}={new_w} W: {reason}")
            await self._save({BUDGETS_DOC: overrides}, audit=audit)
            self._period = period.with_tree(self._period, tree)
            self._budget_overrides = overrides
        log.warning("power_budget_set", domain=domain, budget_w=new_w, reason=reason)
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
        async with self.step_lock:
            audit = _audit(self._clock(), actor, "set_power_policy", reason)
            await self._save({POLICY_DOC: policy.to_mapping()}, audit=audit)
            log.warning("power_policy_set", reason=reason)
            before = self._period
            fleet_view = remote_inputs.fleet_view(self._fleet_view(), self._remote_view)
            self._period, out = period.change_policy(before, policy, fleet_view, self._now())
            _log_notes(out.notes)
            self._send(out, self._now())
            if before.smoothing.plan is not None:
                await self._forget_plan()
        self._wake.set()
        return policy

    def policy_toml(self) -> str:
        """The policy in force as TOML text (`set_policy` accepts it back)."""
        return policy_to_toml(self.policy)

    async def _save(self, docs: dict[str, dict[str, Any] | None], *, audit: dict[str, Any] | None = None) -> None:
        commit = rstore.Commit(now_unix_ns=self._clock(), docs=docs, audit=[audit] if audit else [])
        await self._ingest.store_calls.run_in_store(self._docs.commit, commit)

    async def _forget_plan(self) -> None:
        """Delete the saved swing plan once its "off" commands have left.

        A controller killed before this still has the plan and switches it off again (the same
        command, harmless); so is one whose store refused this.
        """
        try:
            await self._save({SMOOTHING_DOC: None})
        except repo.STORE_UNAVAILABLE as exc:
            log.warning("power_smoothing_plan_not_deleted", error=str(exc))

    # -- one period ----------------------------------------------------------------------------------
    async def step(self) -> power_apply.CapPlan | None:
        """Run one control period now; returns the plan sent (None when there is nothing to manage)."""
        async with self.step_lock:
            return await self._step()

    async def _step(self) -> power_apply.CapPlan | None:
        marks = [time.perf_counter()]  # the ends of the `STEP_PHASES`, after the start
        now = self._now()
        self._last_step_s = now
        assert self._started, "start() first"
        quarantines, statuses = await self._ingest.store_calls.run_beside(self._read_store, self.repairs.nodes_sent())
        marks.append(time.perf_counter())
        await self._read_remote()
        marks.append(time.perf_counter())
        # From here to `period.step`, no await: the inputs are one picture of the ingest.
        before = self._period
        inputs = self._gather(before, now, quarantines, statuses)
        try:
            result = period.step(before, inputs, now)
            if self.on_step is not None:
                self.on_step(before, inputs, now, result)
            _log_notes(result.commands.notes)
            if result.status.power is None:
                self._returned.acks[:0] = inputs.acks  # kept for when there are GPUs to manage
                self._period = result.state
                self.status = dataclasses.replace(self.status, at_unix_s=now, reason=result.status.reason)
                self.repairs.release_all(result.status.reason)
                self._set_room(None)
                return None
            marks.append(time.perf_counter())
            await self._persist(before, result)
            marks.append(time.perf_counter())
        except BaseException:
            self._returned.requeue(inputs)  # nothing of this period happened: its inputs are the next one's
            raise
        self._period = result.state
        self._set_room(result.room)
        plan = result.commands.caps
        assert plan is not None
        self._waiting = plan.waiting
        self._send(result.commands, now)
        # After this period's decreases: a repair leaves once a period that counted it found every budget holding.
        self.repairs.release(inputs.repairing_ids, over_budget=bool(plan.over_budget), now_s=now)
        if before.smoothing.plan is not None and result.state.smoothing.plan is None:
            await self._forget_plan()
        self.status = result.status.power
        self._ingest.metrics.power_period_seconds.observe(self.stats.count(result, inputs, now, marks))
        _log_unanswered(self._caps_unanswered)
        self._caps_unanswered = []
        await self._ask_replicas(before, inputs, now)
        return plan

    def _read_store(self, repair_nodes: set[str]) -> tuple[list[dict[str, Any]], dict[str, str]]:
        """(the active quarantines, command id -> outbox status of the repair nodes' commands): `run_beside`."""
        quarantines = self._docs.quarantines(active_only=True)
        statuses = {c.command_id: c.status for node in repair_nodes for c in self._docs.commands(node_id=node)}
        return quarantines, statuses

    def _gather(
        self, state: period.PeriodState, now: float, quarantines: list[dict[str, Any]], statuses: dict[str, str]
    ) -> period_inputs.PeriodInputs:
        """This period's inputs; takes what came back from earlier commands."""
        remote = self._remote_view
        fleet_view = remote_inputs.fleet_view(self._fleet_view(), remote)
        reads = period.window_reads(state, fleet_view, now)
        quarantined_nodes = frozenset(q["node_id"] for q in quarantines if not q["gpu_uuid"] and not q["port"])
        quarantined_gpus = frozenset(q["gpu_uuid"] for q in quarantines if q["gpu_uuid"])
        floors = power_floors.in_force(
            self.floors, now_s=now, quarantined_gpus=quarantined_gpus, quarantined_nodes=quarantined_nodes
        )
        for gone in self.floors.keys() - floors.keys():
            log.info("power_floor_removed", gpu=gone, why="expired, or the GPU or its node is quarantined")
        self.floors = floors
        self.repairs.settle(statuses, fleet_view.boot_ids, quarantined_nodes)
        repairing, repairing_ids = self.repairs.counted()
        nodes = state.tree.index.node_names
        limiter = self._limiter
        acks, node_limit_results, outcomes = self._returned.take()
        return period_inputs.PeriodInputs(
            fleet=fleet_view,
            window=remote_inputs.window_view(self._window_view(reads), remote, reads),
            quarantined_nodes=quarantined_nodes,
            quarantined_gpus=quarantined_gpus,
            repairing_gpus=repairing,
            repairing_ids=repairing_ids,
            acks=acks,
            node_limit_results=node_limit_results,
            bmc_nodes=frozenset(n for n in nodes if limiter.configured(n)) if limiter is not None else frozenset(),
            outcomes=outcomes,
            floors_w=power_floors.floors_w(floors),
        )

    async def _read_remote(self) -> None:
        """The other replicas' aggregates for this period (with several replicas), in one store read.

        An aggregate older than the telemetry's staleness (and three of the replicas' intervals)
        counts for nothing: a dead replica's nodes are unreachable, their GPUs at their caps.
        """
        if self._remote is None:
            return
        try:
            self._remote_view = await self._remote.read(max_age_s=remote_max_age_s(self), tracked=self._tracked)
        except repo.STORE_UNAVAILABLE as exc:
            # The period runs on what it knows: other replicas' nodes unreachable, counted at their caps.
            log.warning("power_aggregates_unread", error=str(exc))
            self._remote_view = aggregates.EMPTY

    async def _ask_replicas(self, before: period.PeriodState, inputs: period_inputs.PeriodInputs, now: float) -> None:
        """Tell the other replicas what to ship for the next period (when it changed): windows, canaries, how often."""
        if self._remote is None:
            return
        reads = period.window_reads(before, inputs.fleet, now)
        asked = aggregates.AggregateReads(
            # Twice a period: one lands in every period, however their clocks fall.
            interval_s=self.policy.control_period_s / 2,
            draw_window_s=round(now - reads.draw_since_unix_ns / 1e9, 1),
            detect_window_s=self.settings.detect_window_s,
            tracked=self._tracked,
            formats=aggregates.READ_FORMATS,
        )
        try:
            await self._remote.ask(asked)
        except repo.STORE_UNAVAILABLE as exc:
            log.warning("power_aggregate_reads_not_asked", error=str(exc))

    def _controller_ns(self, node_id: str, agent_unix_ns: int) -> int:
        """A stamp of node_id's agent that arrives now, in controller time, wherever its stream ends.

        On another replica's stream, with the agent's clock offset that replica measured (its aggregate).
        """
        if node_id in self._ingest.sessions or self._remote is None:
            return self._ingest.to_controller_ns(node_id, agent_unix_ns)
        stream = self._remote_view.nodes.get(node_id)
        ahead_ns = stream.agent_ahead_ns if stream is not None else None
        corrected = agent_unix_ns - ahead_ns if ahead_ns is not None else agent_unix_ns
        return min(corrected, self._clock())

    def _fleet_view(self) -> period_inputs.FleetView:
        """The ingest's fleet as the period sees it: the one place the loop reads the ingest's state.

        The per-GPU maps are read-only views, not copies: `period.step` runs before the ingest can
        change them (no await in between) and keeps none of them.
        """
        ingest = self._ingest
        tree_nodes = self._period.tree.index.node_names
        nodes = {*ingest.sessions, *tree_nodes, *self._period.smoothing.nodes}
        return period_inputs.FleetView(
            records=types.MappingProxyType(ingest.gpu_records),
            known_records=types.MappingProxyType(self._known_gpus),
            gpu_nodes=types.MappingProxyType(ingest.gpu_nodes),
            node_gpus={node: ingest.node_gpus(node) for node in nodes},
            boot_ids=dict(ingest.boot_ids),
            sessions={node: session.session_id for node, session in ingest.sessions.items()},
            node_labels={node: dict(ingest.node_labels.get(node, {})) for node in tree_nodes},
            latest=types.MappingProxyType(ingest.latest),
            latest_controller_ns=types.MappingProxyType(ingest.latest_controller_ns),
            telemetry_interval_s=ingest.settings.agent_config.get("telemetry_send_interval_ms", 1000) / 1000.0,
        )

    def _window_view(self, reads: period_inputs.WindowReads) -> period_inputs.WindowView:
        """The power window as `reads` asks for it."""
        window = self._ingest.power_window
        detect = reads.detect_since_unix_ns
        return period_inputs.WindowView(
            sample_hz=1e9 / window.bucket_ns,
            draw_peaks_w=window.gpu_max_w(reads.draw_since_unix_ns),
            status_rows=tuple(window.series(since_unix_ns=reads.status_since_unix_ns)),
            swing_rows=tuple(window.series(since_unix_ns=detect, tracked=reads.swing_tracked))
            if detect is not None
            else (),
            straggler_peaks_w=window.gpu_max_w(detect) if detect is not None else None,
        )

    async def _persist(self, before: period.PeriodState, result: period.Period) -> None:
        """Make durable, before any command leaves, what a restart must know of this period."""
        after = result.state
        docs: dict[str, dict[str, Any] | None] = {}
        if result.commands.cap_commands:
            # A restart must know every command that may still land. (Read-backs alone are not saved
            # every period: a restored state that misses some is only more cautious.)
            docs[APPLY_DOC] = after.apply.to_mapping()
        if after.start != before.start:
            # Or a restart would leave start profiles on (filling troughs, an energy cost).
            docs[START_DOC] = after.start.to_mapping()
        plan, report = after.smoothing.plan, after.smoothing.unmanaged
        if plan is not None and plan is not before.smoothing.plan and report is not None:
            docs[SMOOTHING_DOC] = {"plan": dataclasses.asdict(plan), "report": dataclasses.asdict(report)}
        floors = dict(self.floors)  # one set since `_gather` is saved a period early: harmless
        if floors != self._floors_saved:
            docs[FLOORS_DOC] = power_floors.to_mapping(floors)
        if docs:
            await self._save(docs)
            self._floors_saved = floors

    # -- sending -------------------------------------------------------------------------------------
    def _send(self, out: commands.Commands, now: float) -> None:
        """Send a period's (or a policy change's) commands, in order; results come back as inputs."""
        if out.cap_commands:
            self.stats.commands_sent += len(out.cap_commands)
            self._spawn(self._send_caps(out.cap_commands, issued_unix_ns=int(now * 1e9)))
        for command in out.smoothing:
            self.stats.smoothing_commands += int(command.enabled)
            self._spawn(self._send_smoothing(command))
        for profile in out.start_profiles:
            self.stats.start_smoothing_commands += 1
            self._spawn(self._send_start_profile(profile))
        for request in out.node_limits:
            self._spawn(self._set_node_limit(request))
        if out.track_gpus is not None:
            self._ingest.power_window.track(out.track_gpus)
            self._tracked = frozenset(out.track_gpus)

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._sends.add(task)
        task.add_done_callback(self._sends.discard)

    async def _deliver(
        self, command: commands.SetCaps | commands.NodeCommand, *, issued_unix_ns: int | None = None
    ) -> power_wire.CommandResult:
        """Send one command to its node and wait for the answer.

        Raises:
            LookupError, TimeoutError, ConnectionError: no stream to the node, or no answer in time
                (and `repo.STORE_UNAVAILABLE` when the relay to another replica could not be written).
        """
        wire = power_wire.command_to_wire(command, issued_unix_ns=issued_unix_ns or self._clock())
        result = await self._send_command(command.node_id, wire, timeout_s=self.policy.command_ttl_s + 1.0)
        return power_wire.result_from_wire(result)

    async def _send_caps(self, caps: Sequence[commands.SetCaps], *, issued_unix_ns: int) -> None:
        """A period's SetPowerCap commands, one per node, sent together; each ack taken as it comes."""

        def on_result(index: int, outcome: msgs.AgentResult | BaseException) -> None:
            node_id, limits = caps[index].node_id, caps[index].limits
            if isinstance(outcome, BaseException):  # pending until a read-back newer than its deadline
                if not isinstance(outcome, UNANSWERED):
                    log.error("power_cap_send_failed", node=node_id, error=repr(outcome))
                # Logged once a period for all (`_log_unanswered`): a line each cost more than a period.
                self._caps_unanswered.append((node_id, f"{type(outcome).__name__}: {outcome}"))
                return
            result = power_wire.result_from_wire(outcome)
            at_ns = self._controller_ns(node_id, result.finished_unix_ns) if result.finished_unix_ns else self._clock()
            self._returned.acks.extend(power_wire.cap_acks(result, limits, at_ns / 1e9))
            if self._waiting:
                self._wake.set()  # raises wait on these confirmations: do not make them wait a period

        wires = [(c.node_id, power_wire.command_to_wire(c, issued_unix_ns=issued_unix_ns)) for c in caps]
        await self._send_many(wires, timeout_s=self.policy.command_ttl_s + 1.0, on_result=on_result)

    async def _send_smoothing(self, command: commands.NodeCommand) -> None:
        try:
            result = await self._deliver(command)
        except UNANSWERED as exc:
            self._returned.smoothing_unanswered.add(command.node_id)  # sent again next period
            log.info("power_smoothing_unanswered", node=command.node_id, error=str(exc))
            return
        if not result.succeeded:
            log.warning("power_smoothing_not_applied", node=command.node_id, outcome=result.outcome,
                        message=result.message)  # fmt: skip

    async def _send_start_profile(self, command: commands.SetSmoothing) -> None:
        try:
            result = await self._deliver(command)
        except UNANSWERED as exc:
            self._returned.start_unanswered.update(command.gpu_uuids)
            log.info("power_start_smoothing_unanswered", node=command.node_id, error=str(exc))
            return
        if not result.succeeded:
            log.warning("power_start_smoothing_not_applied", node=command.node_id, outcome=result.outcome,
                        message=result.message)  # fmt: skip
        self._returned.start_answered.add(command.node_id)

    async def _set_node_limit(self, request: commands.SetNodeLimit) -> None:
        """Ask the node's BMC for a limit (None: lift it), in a thread; the answer is an input of the next period."""
        assert self._limiter is not None
        node_id, limit_w = request.node_id, request.limit_w
        try:
            read_back_w = await asyncio.to_thread(self._limiter.set_node_limit, node_id, limit_w)
        except Exception as exc:  # an unreachable BMC: the node keeps counting at its last known caps
            log.error("power_bmc_limit_failed", node=node_id, limit_w=limit_w, error=str(exc))
            if limit_w is not None:
                self._ingest.metrics.power_bmc_limits.labels(outcome="failed").inc()
            failed = period_inputs.NodeLimitResult(node_id, limit_w, None, self._now(), request.targets_w, failed=True)
            self._returned.node_limit_results.append(failed)
            return
        result = period_inputs.NodeLimitResult(node_id, limit_w, read_back_w, self._now(), request.targets_w)
        self._returned.node_limit_results.append(result)
        if limit_w is None:
            log.info("power_bmc_limit_lifted", node=node_id)
        elif fallback.confirmed(result):
            self.stats.bmc_limits += 1
            self._ingest.metrics.power_bmc_limits.labels(outcome="confirmed").inc()
            log.warning("power_bmc_limit_confirmed", node=node_id, limit_w=read_back_w)
            self._wake.set()
        else:
            self._ingest.metrics.power_bmc_limits.labels(outcome="not_confirmed").inc()
            log.error("power_bmc_limit_not_confirmed", node=node_id, wanted_w=limit_w, read_back_w=read_back_w)


def fresh_state(
    settings: PowerSettings,
    config: period_inputs.PeriodConfig,
    tree: power_tree.PowerTree,
    policy: power_policy.PowerPolicy,
    *,
    replica: str,
    now_s: float = 0.0,
    apply: power_apply.ApplyState | None = None,
    start: start_smoothing.StartState | None = None,
    plan: tuple[swing.SmoothingPlan, swing.SwingReport] | None = None,
) -> period.PeriodState:
    """A loop's first state: an apply state that knows nothing (unless given) under a new epoch."""
    if apply is None:
        epoch = f"{int(now_s * 1000):x}{replica}"
        apply = power_apply.ApplyState.unknown((), now_s=now_s, policy=policy, epoch=epoch)
    return period.initial_state(config, tree, policy, apply, seed=settings.seed, start=start, plan=plan)


def restored_state(
    *,
    settings: PowerSettings,
    config: period_inputs.PeriodConfig,
    docs: Mapping[str, Any],
    now_s: float,
    replica: str,
) -> tuple[period.PeriodState, dict[str, int | None]]:
    """The state a starting loop continues from, and the operator's budget overrides that held.

    The configured tree and policy with the operator's changes, and the apply state, start profiles
    and swing plan the store kept (a bad one is dropped and logged).
    """
    tree = settings.tree
    overrides: dict[str, int | None] = {}
    for name, budget in (docs.get(BUDGETS_DOC) or {}).items():
        try:
            tree = tree.with_budget(name, budget)
            overrides[name] = budget
        except power_tree.PowerTreeError as exc:
            log.error("power_budget_override_dropped", domain=name, error=str(exc))
    policy = settings.policy
    if docs.get(POLICY_DOC):
        try:
            policy = power_policy.PowerPolicy.from_mapping(docs[POLICY_DOC])
        except power_policy.PolicyError as exc:
            log.error("power_policy_override_dropped", error=str(exc))
    apply = None
    if docs.get(APPLY_DOC):
        try:
            apply = power_apply.ApplyState.from_mapping(docs[APPLY_DOC])
        except (KeyError, ValueError) as exc:
            # Unreadable: start as a fresh state does, every GPU possibly at its maximum with a command
            # that may still land (`ApplyState.unknown`), the most cautious reading of what is in force.
            log.error("power_state_unreadable", doc=APPLY_DOC, error=repr(exc))
        else:
            log.info("power_state_restored", gpus=len(apply.gpus), next_seq=apply.next_seq)
    start = None
    if docs.get(START_DOC):
        try:
            start = start_smoothing.StartState.from_mapping(docs[START_DOC])
        except ValueError as exc:
            log.error("power_start_smoothing_state_dropped", error=str(exc))
        else:
            log.info("power_start_smoothing_restored", gpus=len(start.rate_w_per_s), canaries=len(start.canaries))
    plan = None
    if docs.get(SMOOTHING_DOC):
        try:
            saved = docs[SMOOTHING_DOC]
            plan = swing.SmoothingPlan(**saved["plan"]), swing.SwingReport(**saved["report"])
        except (KeyError, TypeError) as exc:
            log.error("power_smoothing_plan_dropped", error=str(exc))
        else:
            log.info("power_smoothing_restored", mode=plan[0].mode, reason=plan[0].reason)
    state = fresh_state(
        settings, config, tree, policy, replica=replica, now_s=now_s, apply=apply, start=start, plan=plan
    )
    return state, overrides


def each_alone(send_command: CommandSender) -> BatchSender:
    """A `BatchSender` over send_command: each command on its own, all at once (this replica's streams)."""

    async def send_many(
        commands: Sequence[tuple[str, wire_commands.Command]],
        *,
        timeout_s: float,
        on_result: Callable[[int, msgs.AgentResult | BaseException], None],
    ) -> None:
        indexed = [(index, node_id, command) for index, (node_id, command) in enumerate(commands)]
        await aio.send_each(send_command, indexed, timeout_s=timeout_s, on_result=on_result)

    return send_many


def restored_floors(docs: Mapping[str, Any], *, now_s: float) -> dict[str, power_floors.Floor]:
    """The straggler floors the store kept that have not expired (an unreadable document is dropped and logged)."""
    if not docs.get(FLOORS_DOC):
        return {}
    try:
        floors = power_floors.from_mapping(docs[FLOORS_DOC], now_s=now_s)
    except ValueError as exc:
        log.error("power_floors_dropped", error=str(exc))
        return {}
    if floors:
        log.info("power_floors_restored", gpus=len(floors))
    return floors


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


def policy_to_toml(policy: power_policy.PowerPolicy) -> str:
    """A policy as TOML text, one `key = value` per line (`PowerPolicy.from_mapping` reads it back)."""
    return tomli_w.dumps(policy.to_mapping())


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


def _log_unanswered(unanswered: list[tuple[str, str]]) -> None:
    """One line for the caps unanswered in a period, (node, error) each: how many, a few nodes, the errors by kind."""
    if not unanswered:
        return
    nodes = sorted({node for node, _error in unanswered})
    kinds = collections.Counter(error.split(":", 1)[0] for _node, error in unanswered)
    log.info("power_caps_unanswered", commands=len(unanswered), nodes=len(nodes), first_nodes=nodes[:10],
             errors_by_kind=dict(kinds), first_error=unanswered[0][1])  # fmt: skip


def _log_notes(notes: tuple[commands.Note, ...]) -> None:
    """Log a period's notes, each at its own level."""
    for note in notes:
        getattr(log, note.level)(note.event, **note.fields)
