"""The power period's status: the budget tree with its sums, the swing now, and the last decision.

This module owns what rasctl's `power status` and the power metrics show (`PowerStatus`), and how one
period's figures become it (`domain_sums`, a tree when read): per domain, the caps that may be in
force (the invariant's left-hand side), this period's targets and the latest draw.

Pure: no I/O, no logging, no clock reads.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence

import numpy as np

from rasd.controller.core.power import apply as power_apply
from rasd.controller.core.power import policy as power_policy
from rasd.controller.core.power import swing
from rasd.controller.core.power import tree as power_tree

RECENT_SWING_S = 10.0
"""How much aggregate power the status's swing figures look back over, s."""

_LEVEL_NO = {"node": 0, "rack": 1, "row": 2, "cluster": 3}
"""Position of each level in `TreeIndex.sums`."""


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


@dataclasses.dataclass(frozen=True, eq=False)
class GpuRoom:
    """What each GPU could still be given after a period: what a straggler's raise is sized to.

    Aligned arrays, one entry per managed GPU; `cap_w` is the higher of the period's target and the
    cap that may be in force (a raise still travelling counts), `headroom_w` is
    `allocate.gpu_headroom_w` under those caps.
    """

    at_unix_s: float
    gpu_uuids: tuple[str, ...]
    cap_w: np.ndarray
    max_w: np.ndarray
    headroom_w: np.ndarray
    capped: np.ndarray
    """The allocator judged it capped (SW power cap reason, or drawing at its cap)."""

    def index(self) -> dict[str, int]:
        """GPU -> its position in the arrays."""
        return {gpu: i for i, gpu in enumerate(self.gpu_uuids)}

    def row(self, i: int) -> tuple[float, float, float, bool]:
        """The GPU at position i: (cap_w, max_w, headroom_w, capped), as plain numbers."""
        return float(self.cap_w[i]), float(self.max_w[i]), float(self.headroom_w[i]), bool(self.capped[i])


@dataclasses.dataclass(frozen=True, eq=False)
class DomainSums:
    """A period's sums per domain and level (`TreeIndex.sums`), made a `DomainStatus` tree when read.

    Only rasctl and a scrape read the tree: built every period, its 12,500 node domains took a
    tenth of the leader's period at fleet scale.
    """

    tree: power_tree.PowerTree
    allocated_w: tuple[np.ndarray, ...]
    target_w: tuple[np.ndarray, ...]
    drawn_w: tuple[np.ndarray, ...]

    def tree_status(self) -> DomainStatus:
        """The budget tree with each domain's sums."""
        idx = self.tree.index
        position = {
            "node": {n: i for i, n in enumerate(idx.node_names)},
            "rack": {n: i for i, n in enumerate(idx.rack_names)},
            "row": {n: i for i, n in enumerate(idx.row_names)},
            "cluster": {idx.cluster_name: 0},
        }
        children: dict[str | None, list[power_tree.Domain]] = {}
        for d in self.tree.domains:
            children.setdefault(d.parent, []).append(d)
        # Python floats per level, read once, not numpy scalars one domain at a time.
        allocated = [level.tolist() for level in self.allocated_w]
        target = [level.tolist() for level in self.target_w]
        drawn = [level.tolist() for level in self.drawn_w]

        def build(d: power_tree.Domain) -> DomainStatus:
            k, i = _LEVEL_NO[d.level], position[d.level][d.name]
            return DomainStatus(
                name=d.name,
                level=d.level,
                budget_w=d.budget_w,
                allocated_w=allocated[k][i],
                target_w=target[k][i],
                drawn_w=drawn[k][i],
                children=tuple([build(c) for c in children.get(d.name, ())]),
            )

        return build(self.tree.domains[0])


@dataclasses.dataclass(frozen=True)
class PowerStatus:
    """The latest period's picture."""

    at_unix_s: float
    sums: DomainSums | None
    """Each domain's sums (None: no period managed GPUs yet); `root` is their tree."""
    swing: swing.SwingReport | None
    smoothing: swing.SmoothingPlan | None
    stranded_w: float
    unmet_w: float
    over_budget: tuple[str, ...]
    reason: str
    periods: int
    unconfirmed_decreases: int = 0
    """GPUs with a cap decrease not confirmed yet (counted at the old cap)."""

    @functools.cached_property
    def root(self) -> DomainStatus | None:
        """The budget tree with each domain's sums, built at the first read (None: no sums)."""
        return None if self.sums is None else self.sums.tree_status()


NOT_STARTED = PowerStatus(0.0, None, None, None, 0.0, 0.0, (), "not started", 0)
"""The status before the first period."""


def domain_sums(
    tree: power_tree.PowerTree,
    state: power_apply.ApplyState,
    targets_w: np.ndarray,
    drawn_w: np.ndarray,
    node_idx: np.ndarray | None = None,
) -> DomainSums:
    """Each domain's sums of may-be-in-force caps, targets and draw (per-GPU arrays).

    node_idx: each GPU's tree node index, when the caller has it (`allocate.GpuViews.node_idx`).
    """
    idx = tree.index
    if node_idx is None:
        node_idx = np.array([idx.node_of_name[g.node_id] for g in state.gpus], dtype=np.intp)
    return DomainSums(
        tree,
        allocated_w=idx.sums(node_idx, power_apply.may_be_in_force_w(state)),
        target_w=idx.sums(node_idx, targets_w.astype(np.float64)),
        drawn_w=idx.sums(node_idx, drawn_w),
    )


def recent_swing(
    rows: Sequence[tuple[int, float, int]], sample_hz: float, policy: power_policy.PowerPolicy
) -> swing.SwingReport | None:
    """The swing in the latest `RECENT_SWING_S` of aggregate power (None: too few buckets to say)."""
    if not rows:
        return None
    series = swing.scaled_series(rows, max(c for _, _, c in rows))
    if len(series) < 4:
        return None
    return swing.detect(series, sample_hz, policy=policy)
