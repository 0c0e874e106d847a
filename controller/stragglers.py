"""The straggler watch: the shell around `core.straggler` that the ingest feeds with each summary's edges (issue #40).

It owns the scorer's state, the edges not yet cut into steps, and the suspects named so far, with
the node each GPU streams from; it keeps ``rasd_straggler_suspect{node,gpu}`` and
``rasd_straggler_lag_seconds{node,gpu}`` for every suspect, and `rasctl get stragglers` lists them.

Each suspect opens a case of `core.straggler_actions` (notify, raise its cap, validate, quarantine, by
policy: controller.toml's ``[stragglers.actions]``); its effects count in
``rasd_straggler_actions_total{action}`` and go to `actuator`: the ladder's
`remediation.stragglers.StragglerActions` on a single replica; with several, the relay, which keeps
them in the store for the leader to carry out (`replication.relay.Relay.take_straggler_effects`);
none: counted and listed only. A cleared case resets the GPU's score and removes its series.

The same steps give the job's rhythm (`core.stall`): when its edges stop while its GPUs stay busy (a
hung collective), the watch names the stall once (``rasd_job_stalled``, ``rasd_job_stalls_total``),
with a "stall" effect (audit) and, by ``[stragglers.stall]``'s ``restart``, a "restart" effect: the
ladder restarts the suspect rank's processes, so the job's launcher restarts the job from its
checkpoint minutes before the collective's own timeout would. The check runs with the cut, on every
summary, edges or none: a hung job's summaries carry none.

Which GPUs step together: nothing in rasd names a job yet (no job or workload label reaches the
controller), so every GPU whose summaries this replica ingests counts as one job, which is what
rasd-sim runs (one `StepJob` over the fleet). A fleet running several jobs needs a job key first;
GPUs with no step swing send no edges and take no part. Edge times are the agents' clocks, which
must agree within a few ms (as the power window's grid already needs). State lives in memory: a
restarted controller starts the scores again.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import statistics
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from rasd.common import settings
from rasd.controller.core import fleet, stall, straggler, straggler_actions
from rasd.controller.observability import metrics as metrics_mod

LIVE_POLICY = straggler.StragglerPolicy(min_spread_s=0.030)
"""The watch's policy: the default but for a 30 ms floor under the step's lag spread. At 10 Hz an edge
is known only to within a sample period (an even error over 100 ms: σ ≈ 29 ms) and the error of
one node's GPUs is shared (one sampling phase). The offline trials spread the nodes over ten phases,
so the step's MAD saw that error; a live fleet's nodes may sample nearly in phase (rasd-sim's agents
share one event loop), the MAD then shrinks to a few ms, and a node sampling 30 ms behind the rest
lagged enough steps in a row to be named: 7 clean GPUs of one node in a 30 s rasd-sim run."""
SILENT_NODE_NS = 10_000_000_000
"""A node no summary came from for this long is silent to the stall check (`stall.GpuNow.heard`): summaries
come every second, and the lost-node watch takes a node for lost only after 60 s."""
CUT_EVERY_NS = 500_000_000
"""Pending edges are cut into steps at most this often (controller clock), not at every summary:
sorting them costs ~25 ms at 16,384 GPUs, and 2,048 nodes send 2,048 summaries a second."""
ACTION_POLICY = straggler_actions.ActionPolicy()
"""The actions' rungs and the steps between them: the defaults."""
MAX_STALLS = 64
"""Stalls kept for the record (`StragglerWatch.stalls`, rasd-sim's report): the newest."""
MAX_SUSPECTS = 1024
"""Suspects listed and exported at most (the oldest are kept): a bound on the metric's series."""


@dataclasses.dataclass(frozen=True, slots=True)
class Suspect:
    """A GPU named a straggler: where it is, its verdict, and when (controller clock)."""

    node_id: str
    verdict: straggler.Verdict
    named_unix_ns: int
    action: str = ""
    """Its case's rung (`straggler_actions.Rung`), "" before any."""
    action_reason: str = ""
    """The last action's reason."""


@dataclasses.dataclass(frozen=True)
class StragglerSettings:
    """controller.toml's ``[stragglers]``: what makes a suspect, how edges form steps, what is done."""

    detection: straggler.StragglerPolicy = LIVE_POLICY
    """``[stragglers.detection]``: allowance, threshold, spread floor, fewest GPUs per step."""
    steps: straggler.StepGrouping = dataclasses.field(default_factory=straggler.StepGrouping)
    """``[stragglers.steps]``: the gap between steps' edges, how long a step settles, edges kept."""
    actions: straggler_actions.ActionPolicy = ACTION_POLICY
    """``[stragglers.actions]``: which rungs run (raise_cap, validate, quarantine) and the steps between."""
    stall: stall.StallPolicy = dataclasses.field(default_factory=stall.StallPolicy)
    """``[stragglers.stall]``: how long a busy job's steps may stop before it is stalled; restart or only notify."""

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], *, prefix: str = "stragglers.") -> StragglerSettings:
        """Build from a TOML table; a key left out keeps its default (the watch's, not the dataclass's).

        Raises:
            ValueError: one line per bad key, each naming its path (``stragglers.actions.steps_per_rung``).
        """
        values: dict[str, Any] = {}
        for table in ("detection", "steps", "actions", "stall"):
            default = getattr(cls(), table)
            given = data.get(table, {})
            try:
                typed = settings.typed_values(type(default), given, f"{prefix}{table}.", ValueError)
                values[table] = dataclasses.replace(default, **typed)
            except ValueError as exc:
                text = str(exc)
                raise ValueError(text if text.startswith(prefix) else f"{prefix}{table}.{text}") from None
        unknown = sorted(set(data) - set(values))
        if unknown:
            raise ValueError(f"{prefix}{unknown[0]}: unknown setting (known: detection, steps, actions, stall)")
        return cls(**values)


class StragglerWatch:
    """Judges every step the edges complete; call `add_edges` with each summary's edges."""

    @classmethod
    def of(cls, controller_metrics: metrics_mod.ControllerMetrics, settings: StragglerSettings) -> StragglerWatch:
        """The watch controller.toml's ``[stragglers]`` describes."""
        return cls(
            controller_metrics,
            policy=settings.detection,
            grouping=settings.steps,
            action_policy=settings.actions,
            stall_policy=settings.stall,
        )

    def __init__(
        self,
        controller_metrics: metrics_mod.ControllerMetrics,
        *,
        policy: straggler.StragglerPolicy | None = None,
        grouping: straggler.StepGrouping | None = None,
        action_policy: straggler_actions.ActionPolicy | None = None,
        stall_policy: stall.StallPolicy | None = None,
    ) -> None:
        """Bind to the metrics; `LIVE_POLICY`, the default grouping, `ACTION_POLICY` and stall policy unless given."""
        self._metrics = controller_metrics
        self.policy = policy or LIVE_POLICY
        self.action_policy = action_policy or ACTION_POLICY
        self.cases: dict[str, straggler_actions.Case] = {}
        """GPU -> its open case (a suspect not yet cleared)."""
        self.actuator: Callable[[Sequence[straggler_actions.Effect]], None] | None = None
        """Carries the effects out (`StragglerActions.take`; `Relay.take_straggler_effects` with several replicas)."""
        self.room: Callable[[str], straggler_actions.PowerRoom | None] | None = None
        """GPU -> what the power budget could still give it (the power loop's `power_room`); None: no
        power loop runs here, and a case's "raise cap" says its headroom is not known."""
        self.grouping = grouping or straggler.StepGrouping()
        self.stall_policy = stall_policy or stall.StallPolicy()
        self.rhythm = stall.Rhythm()
        """The job's recent steps and its stall, if one is named (`core.stall`)."""
        self.stalls: collections.deque[tuple[int, str, stall.StallVerdict]] = collections.deque(maxlen=MAX_STALLS)
        """The stalls named, oldest first: when (controller clock, ns), the suspect's node, the verdict."""
        self._state = straggler.StragglerState()
        self._pending: list[tuple[float, str]] = []
        self._node_of: dict[str, str] = {}
        self._gpus_of: dict[str, dict[str, None]] = {}  # node -> its GPUs that sent edges, in order
        self._cut_ns = 0  # when the pending edges were last cut into steps
        self._heard_ns: dict[str, int] = {}  # node -> when its last summary came (controller clock)
        self._newest_edge_s = 0.0  # the newest edge of any summary, cut or not (agent clock)
        self.suspects: dict[str, Suspect] = {}
        """GPU -> its suspect record, in the order named."""

    @property
    def steps_judged(self) -> int:
        """Steps the scorer has judged since the controller started."""
        return self._state.steps_judged

    def add_edges(
        self,
        node_id: str,
        edges: Mapping[str, Sequence[int]],
        now_ns: int,
        latest: Mapping[str, fleet.GpuLatest],
    ) -> None:
        """One summary's edges (GPU -> Unix ns, agent clock): judge the steps they complete.

        latest: the ingest's view of each GPU's freshest values: a named GPU's clock event reasons,
            temperature and PCIe link are its evidence (with its node's lag, `_corroborated`).
        """
        self._heard_ns[node_id] = now_ns
        for gpu_uuid, times in edges.items():
            if self._node_of.get(gpu_uuid) != node_id:
                self._node_of[gpu_uuid] = node_id
                self._gpus_of.setdefault(node_id, {})[gpu_uuid] = None
            self._pending.extend((at / 1e9, gpu_uuid) for at in times)
            self._newest_edge_s = max(self._newest_edge_s, max(times, default=0) / 1e9)
        if self._newest_edge_s > self.rhythm.newest_edge_s and self.rhythm.stalled_at_s is not None:
            self._stall_over()
        if now_ns - self._cut_ns < CUT_EVERY_NS:
            return
        self._cut_ns = now_ns
        steps, self._pending = straggler.complete_steps(self._pending, self.grouping)
        for step in steps:
            self._state, verdicts = straggler.observe_step(self._state, step, policy=self.policy)
            self._act_on(step, [self._corroborated(v, latest) for v in verdicts], now_ns)
        self._metrics.straggler_steps.inc(len(steps))
        medians = [statistics.median(step.values()) for step in steps]
        self.rhythm = stall.observe(self.rhythm, medians, self._newest_edge_s, policy=self.stall_policy)
        if stall.due(self.rhythm, now_s=now_ns / 1e9, policy=self.stall_policy):
            self._check_stall(now_ns, latest)

    def _check_stall(self, now_ns: int, latest: Mapping[str, fleet.GpuLatest]) -> None:
        """Judge a silent rhythm by the job's GPUs' utilization and draw; a new stall's effects carried out."""
        heard = {node for node, at_ns in self._heard_ns.items() if now_ns - at_ns <= SILENT_NODE_NS}
        gpus_now = {}
        for gpu, node_id in self._node_of.items():
            reading = latest.get(gpu) or fleet.GpuLatest()
            gpus_now[gpu] = stall.GpuNow(
                reading.utilization_gpu_pct,
                reading.power_w,
                reading.enforced_power_limit_w,
                node_id,
                heard=node_id in heard,
            )
        self.rhythm, verdict = stall.check(self.rhythm, gpus_now, now_s=now_ns / 1e9, policy=self.stall_policy)
        if verdict is None:
            return
        node_id = self.node_of(verdict.suspect_gpu)
        self.stalls.append((now_ns, node_id, verdict))
        self._metrics.job_stalled.set(1)
        self._metrics.job_stalls.inc()
        effects = [straggler_actions.Effect("stall", verdict.suspect_gpu, node_id, verdict.reason)]
        # A silent node is the lost-node watch's: a restart now would hang again on the dead host.
        if self.stall_policy.restart and not verdict.silent_nodes:
            effects.append(straggler_actions.Effect("restart", verdict.suspect_gpu, node_id, verdict.reason))
        self._carry_out(effects)

    def _stall_over(self) -> None:
        """An edge arrived after the stall's last: the job steps again (resumed, or restarted)."""
        self.rhythm = dataclasses.replace(self.rhythm, stalled_at_s=None)
        self._metrics.job_stalled.set(0)

    def _act_on(self, step: Mapping[str, float], verdicts: Sequence[straggler.Verdict], now_ns: int) -> None:
        """The cases' next rungs after this step, then a case for each new suspect; their effects carried out."""
        effects: list[straggler_actions.Effect] = []
        if self.cases and len(step) >= self.policy.min_gpus:
            self.cases, climbed = straggler_actions.on_step(
                self.cases,
                straggler.step_lags(step),
                now_s=now_ns / 1e9,
                policy=self.action_policy,
                allowance_s=self.policy.allowance_s,
            )
            effects.extend(climbed)
        for verdict in verdicts:
            if not self._name(verdict, now_ns):
                continue
            node_id = self.suspects[verdict.gpu_uuid].node_id
            power = self.room(verdict.gpu_uuid) if self.room is not None else None
            self.cases, opened = straggler_actions.open_case(
                self.cases, verdict, node_id, now_s=now_ns / 1e9, policy=self.action_policy, power=power
            )
            effects.extend(opened)
        self._carry_out(effects)

    def released(self, gpu_uuid: str, why: str) -> None:
        """The ladder released or repaired gpu_uuid: its case clears and its score starts again."""
        self.cases, effects = straggler_actions.on_released(self.cases, gpu_uuid, why=why)
        self._carry_out(effects)

    def _carry_out(self, effects: Sequence[straggler_actions.Effect]) -> None:
        for effect in effects:
            self._metrics.straggler_actions.labels(action=effect.kind).inc()
            if effect.kind == "clear":
                self._clear(effect.gpu_uuid)
            elif (suspect := self.suspects.get(effect.gpu_uuid)) is not None:
                case = self.cases.get(effect.gpu_uuid)
                rung = case.rung.value if case is not None else suspect.action
                self.suspects[effect.gpu_uuid] = dataclasses.replace(suspect, action=rung, action_reason=effect.reason)
        if effects and self.actuator is not None:
            self.actuator(effects)

    def _clear(self, gpu_uuid: str) -> None:
        """Forget a suspect: its score, its listing and its metric series."""
        self._state = straggler.forget(self._state, gpu_uuid)
        suspect = self.suspects.pop(gpu_uuid, None)
        if suspect is None:
            return
        for gauge in (self._metrics.straggler_suspect, self._metrics.straggler_lag_seconds):
            with contextlib.suppress(KeyError):  # never set (the suspects' bound)
                gauge.remove(suspect.node_id, gpu_uuid)

    def _name(self, verdict: straggler.Verdict, now_ns: int) -> bool:
        if len(self.suspects) >= MAX_SUSPECTS:
            return False
        node_id = self._node_of.get(verdict.gpu_uuid, "")
        self.suspects[verdict.gpu_uuid] = Suspect(node_id, verdict, now_ns)
        self._metrics.straggler_suspect.labels(node=node_id, gpu=verdict.gpu_uuid).set(1)
        self._metrics.straggler_lag_seconds.labels(node=node_id, gpu=verdict.gpu_uuid).set(verdict.mean_lag_s)
        return True

    def node_of(self, gpu_uuid: str) -> str:
        """The node gpu_uuid's edges last came from ("" if none did)."""
        return self._node_of.get(gpu_uuid, "")

    @property
    def stall(self) -> stall.StallVerdict | None:
        """The current stall's verdict (None: the job steps, or was never seen to): the last one named."""
        return self.stalls[-1][2] if self.rhythm.stalled_at_s is not None and self.stalls else None

    def stalled_at_unix_ns(self) -> int:
        """When the current stall was named (controller clock); 0 while the job steps."""
        return self.stalls[-1][0] if self.stall is not None else 0

    def listing(self, keep: Callable[[Suspect], bool] = lambda _: True) -> list[Suspect]:
        """The suspects in the order named (those keep accepts)."""
        return [s for s in self.suspects.values() if keep(s)]

    def _corroborated(self, verdict: straggler.Verdict, latest: Mapping[str, fleet.GpuLatest]) -> straggler.Verdict:
        """The verdict naming its evidence: the GPU's own signals (latest view), or its whole node lagging.

        Gathered only for the GPUs a step named (a few per job), not for every GPU of every step.
        """
        gpu = latest.get(verdict.gpu_uuid)
        evidence = (
            straggler.gpu_signals(gpu.clock_event_reasons, gpu.temperature_c, gpu.pcie_link) if gpu is not None else ()
        )
        node_id = self._node_of.get(verdict.gpu_uuid, "")
        node_wide = straggler.node_wide_signal(node_id, tuple(self._gpus_of.get(node_id, ())), self._state, self.policy)
        return straggler.with_evidence(verdict, (*evidence, *node_wide))
