"""The straggler watch: the shell around `core.straggler` that the ingest feeds with each summary's edges (issue #40).

It owns the scorer's state, the edges not yet cut into steps, and the suspects named so far, with
the node each GPU streams from; it keeps ``rasd_straggler_suspect{node,gpu}`` and
``rasd_straggler_lag_seconds{node,gpu}`` for every suspect, and `rasctl get stragglers` lists them.

Which GPUs step together: nothing in rasd names a job yet (no job or workload label reaches the
controller), so every GPU whose summaries this replica ingests counts as one job, which is what
rasd-sim runs (one `StepJob` over the fleet). A fleet running several jobs needs a job key first;
GPUs with no step swing send no edges and take no part. Edge times are the agents' clocks, which
must agree within a few ms (as the power window's grid already needs). State lives in memory: a
restarted controller starts the scores again.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence

from rasd.controller.core import fleet, straggler
from rasd.controller.observability import metrics as metrics_mod

LIVE_POLICY = straggler.StragglerPolicy(min_spread_s=0.030)
"""The watch's policy: the default but for a 30 ms floor under the step's lag spread. At 10 Hz an edge
is known only to within a sample period (an even error over 100 ms: σ ≈ 29 ms) and the error of
one node's GPUs is shared (one sampling phase). The offline trials spread the nodes over ten phases,
so the step's MAD saw that error; a live fleet's nodes may sample nearly in phase (rasd-sim's agents
share one event loop), the MAD then shrinks to a few ms, and a node sampling 30 ms behind the rest
lagged enough steps in a row to be named: 7 clean GPUs of one node in a 30 s rasd-sim run."""
CUT_EVERY_NS = 500_000_000
"""Pending edges are cut into steps at most this often (controller clock), not at every summary:
sorting them costs ~25 ms at 16,384 GPUs, and 2,048 nodes send 2,048 summaries a second."""
MAX_SUSPECTS = 1024
"""Suspects listed and exported at most (the oldest are kept): a bound on the metric's series."""


@dataclasses.dataclass(frozen=True, slots=True)
class Suspect:
    """A GPU named a straggler: where it is, its verdict, and when (controller clock)."""

    node_id: str
    verdict: straggler.Verdict
    named_unix_ns: int


class StragglerWatch:
    """Judges every step the edges complete; call `add_edges` with each summary's edges."""

    def __init__(
        self,
        controller_metrics: metrics_mod.ControllerMetrics,
        *,
        policy: straggler.StragglerPolicy | None = None,
        grouping: straggler.StepGrouping | None = None,
    ) -> None:
        """Bind to the metrics; `LIVE_POLICY` and the default grouping unless given."""
        self._metrics = controller_metrics
        self.policy = policy or LIVE_POLICY
        self.grouping = grouping or straggler.StepGrouping()
        self._state = straggler.StragglerState()
        self._pending: list[tuple[float, str]] = []
        self._node_of: dict[str, str] = {}
        self._cut_ns = 0  # when the pending edges were last cut into steps
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

        latest: the ingest's view of each GPU's freshest values; its clock event reasons are the evidence.
        """
        if not edges:
            return
        for gpu_uuid, times in edges.items():
            self._node_of[gpu_uuid] = node_id
            self._pending.extend((at / 1e9, gpu_uuid) for at in times)
        if now_ns - self._cut_ns < CUT_EVERY_NS:
            return
        self._cut_ns = now_ns
        steps, self._pending = straggler.complete_steps(self._pending, self.grouping)
        for step in steps:
            signals = {gpu: _signals(latest.get(gpu)) for gpu in step}
            self._state, verdicts = straggler.observe_step(self._state, step, policy=self.policy, signals=signals)
            for verdict in verdicts:
                self._name(verdict, now_ns)
        self._metrics.straggler_steps.inc(len(steps))

    def _name(self, verdict: straggler.Verdict, now_ns: int) -> None:
        if len(self.suspects) >= MAX_SUSPECTS:
            return
        node_id = self._node_of.get(verdict.gpu_uuid, "")
        self.suspects[verdict.gpu_uuid] = Suspect(node_id, verdict, now_ns)
        self._metrics.straggler_suspect.labels(node=node_id, gpu=verdict.gpu_uuid).set(1)
        self._metrics.straggler_lag_seconds.labels(node=node_id, gpu=verdict.gpu_uuid).set(verdict.mean_lag_s)

    def listing(self, keep: Callable[[Suspect], bool] = lambda _: True) -> list[Suspect]:
        """The suspects in the order named (those keep accepts)."""
        return [s for s in self.suspects.values() if keep(s)]


def _signals(latest: fleet.GpuLatest | None) -> tuple[str, ...]:
    return straggler.clock_signals(latest.clock_event_reasons if latest is not None else None)
