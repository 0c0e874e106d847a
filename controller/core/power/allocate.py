"""The power allocator: one control period's new GPU caps under the budget tree ("sloshing").

This module owns the decision of what every GPU's cap should be. It does not own how the caps are
applied: `rasd.controller.core.power.apply` turns the targets into decrease-first, confirmed
commands so that the budget holds while they travel.

Each period, per GPU (vectorised over all GPUs at once):

1. Classify against the enforced cap: *capped* (SW power cap clock reason, or draw within
   `capped_threshold_pct` of the cap), *donor* (draw below `lower_band_pct` of the cap), or in band.
   A *settling* GPU (its cap was raised so recently that no whole training step has been measured
   under the new cap) is neither donor nor stranded unless its draw already shows it capped: its draw
   is still the one the old cap allowed, and judging it against the new cap would hand back next
   period the watts it was just given (an oscillation of the controller's own).
2. Demand: a capped GPU asks for one step more; a donor offers its cap down to
   draw / `donor_target_pct` (at most one step per period); an in-band GPU keeps its cap
   (hysteresis). Ineligible GPUs (quarantined, drained) ask for their minimum, releasing the rest to
   the pool; marginal GPUs are limited to `marginal_cap_pct` of their maximum.
3. Grant: every GPU first gets its minimum; then priority classes, highest first, receive their
   floors (a per-GPU least cap, e.g. a straggler's raise: first within its class, see `_grant`),
   then their demand above the minimum, limited by the headroom of their node, rack, row and cluster
   (bottom-up the demand is clipped to each domain's headroom, top-down the granted watts are split
   in proportion). Within a class, what GPUs hold or need (a capped GPU's current cap, anyone
   else's demand) is served before what capped GPUs ask beyond it; a shortage within a tier is
   shared in proportion to the requests. A capped GPU holds at most its class's mean capped hold,
   so when power is short, GPUs of one class converge towards equal caps.
4. Raises are scaled by a seeded random factor in [1 - jitter, 1] and dropped when smaller than
   `min_change_w`, so the controller never raises every GPU by the same amount at the same time;
   the jitter never cuts a granted floor.

The result never exceeds a budget at any level (a final pass checks and, if floating point ever
disagreed, cuts), and every cap is within the GPU's [min, max] constraints.

Pure: no I/O, no logging, no clock reads; randomness comes in as a seeded `numpy.random.Generator`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from rasd.controller.core.power import policy as power_policy
from rasd.controller.core.power import tree as power_tree


@dataclasses.dataclass(frozen=True)
class GpuView:
    """What the allocator knows about one GPU this period (the controller builds it from telemetry)."""

    gpu_uuid: str
    node_id: str
    """The node the GPU is in; must be a node of the budget tree."""
    priority: int
    """Higher is more important (a job's priority class); lower classes are cut first."""
    draw_w: float
    """Recent power draw, W (stale telemetry must be reported as drawing at its cap)."""
    cap_w: float
    """The cap believed in force, W (the apply planner's may-be-in-force value)."""
    min_w: float
    """NVML minimum power limit, W."""
    max_w: float
    """NVML maximum power limit, W."""
    throttled: bool = False
    """The GPU reports the SW power cap clock event reason."""
    eligible: bool = True
    """False for quarantined or drained GPUs: they drop to their minimum and release the rest."""
    marginal: bool = False
    """Health marks the GPU marginal: policy may run it at a lower cap instead of pulling it."""
    reachable: bool = True
    """False while the node's agent is unreachable: its cap is held where it may be (no raise is
    planned for it, and its watts are not handed to anyone else), except to meet a budget."""
    settling: bool = False
    """Its cap was raised and no whole step has been measured under the new cap yet (the edge
    decides how long that takes: about one training step plus the telemetry delay)."""
    floor_w: float | None = None
    """The least cap it should get when the budget has room (a straggler's raise), W; None: its minimum."""


@dataclasses.dataclass(frozen=True, eq=False)
class GpuViews:
    """Columnar form of many `GpuView`s: one numpy array per field, aligned by position."""

    gpu_uuids: tuple[str, ...]
    node_idx: np.ndarray
    """Index of each GPU's node in `PowerTree.index.node_names`."""
    priority: np.ndarray
    draw_w: np.ndarray
    cap_w: np.ndarray
    min_w: np.ndarray
    max_w: np.ndarray
    throttled: np.ndarray
    eligible: np.ndarray
    marginal: np.ndarray
    reachable: np.ndarray | None = None
    """None means every GPU is reachable."""
    settling: np.ndarray | None = None
    """None means no GPU is settling after a raise."""
    floor_w: np.ndarray | None = None
    """The least cap each GPU should get within the budgets' headroom, W; None means every GPU's
    `min_w` (no floor; kept None so that a `replace` of `min_w` never leaves a stale floor)."""

    def __post_init__(self) -> None:
        n = len(self.gpu_uuids)
        for f in dataclasses.fields(self):
            if f.name == "reachable" and self.reachable is None:
                object.__setattr__(self, "reachable", np.ones(n, dtype=bool))
            if f.name == "settling" and self.settling is None:
                object.__setattr__(self, "settling", np.zeros(n, dtype=bool))
            if f.name not in ("gpu_uuids", "floor_w") and np.shape(getattr(self, f.name)) != (n,):
                raise ValueError(f"GpuViews.{f.name} must have shape ({n},)")
        if np.any(self.min_w > self.max_w):
            raise ValueError("GpuViews: min_w above max_w for some GPU")
        if self.floor_w is not None and (np.shape(self.floor_w) != (n,) or np.isnan(self.floor_w).any()):
            raise ValueError(f"GpuViews.floor_w must have shape ({n},) and no NaN")

    def __len__(self) -> int:
        return len(self.gpu_uuids)

    @classmethod
    def from_views(cls, views: Sequence[GpuView], tree: power_tree.PowerTree) -> GpuViews:
        """Build the columnar form.

        Raises:
            ValueError: A GPU's node is not in the tree (its power would be outside every budget).
        """
        node_of = tree.index.node_of_name
        try:
            node_idx = np.array([node_of[v.node_id] for v in views], dtype=np.intp)
        except KeyError as e:
            raise ValueError(f"GPU on node {e.args[0]!r}, which is not in the power tree") from None
        return cls(
            gpu_uuids=tuple(v.gpu_uuid for v in views),
            node_idx=node_idx,
            priority=np.array([v.priority for v in views], dtype=np.int64),
            draw_w=np.array([v.draw_w for v in views], dtype=np.float64),
            cap_w=np.array([v.cap_w for v in views], dtype=np.float64),
            min_w=np.array([v.min_w for v in views], dtype=np.float64),
            max_w=np.array([v.max_w for v in views], dtype=np.float64),
            throttled=np.array([v.throttled for v in views], dtype=bool),
            eligible=np.array([v.eligible for v in views], dtype=bool),
            marginal=np.array([v.marginal for v in views], dtype=bool),
            reachable=np.array([v.reachable for v in views], dtype=bool),
            settling=np.array([v.settling for v in views], dtype=bool),
            floor_w=np.array([v.min_w if v.floor_w is None else v.floor_w for v in views], dtype=np.float64)
            if any(v.floor_w is not None for v in views)
            else None,
        )

    def replace(self, **changes: object) -> GpuViews:
        """Return a copy with some columns replaced (e.g. new draws for the next period)."""
        return dataclasses.replace(self, **changes)


@dataclasses.dataclass(frozen=True, eq=False)
class Allocation:
    """One period's decision: a target cap per GPU, aligned with the input `GpuViews`."""

    caps_w: np.ndarray
    """Target cap per GPU, whole watts (int64), within [min, max] and within every budget."""
    capped: np.ndarray
    """Which GPUs were judged capped (wanting more) this period."""
    demand_w: np.ndarray
    """What each GPU asked for after hysteresis and step limits, W."""
    unmet_w: float
    """Sum of demand not granted, W (0 when every request fit)."""
    stranded_w: float
    """Headroom held by uncapped GPUs while some GPU is capped, W, measured on the input (settling
    GPUs excluded: their headroom was just granted to a measured need)."""
    settling_w: float
    """Headroom held by settling GPUs while some GPU is capped, W: granted, not yet drawn."""
    infeasible: tuple[str, ...]
    """Domains whose minimum caps alone exceed their budget (caps there are held at minimum)."""
    reason: str
    """One sentence for the edge to log."""


def stranded_w(views: GpuViews, capped_threshold_pct: float = 97.0, *, settling: bool = False) -> float:
    """Power held but not drawn by uncapped GPUs while some eligible GPU is capped, W.

    This is the watts sloshing should have moved: sum of max(cap - draw, 0) over eligible GPUs not at
    their cap, counted only when at least one GPU is (throttled, or drawing at least
    `capped_threshold_pct` of its cap). Settling GPUs are left out: the watts they hold were granted
    to a need measured under their previous cap, and the draw that uses them cannot show before the
    next training step. `settling=True` returns those watts instead (what is in transit).
    """
    capped = views.eligible & (views.throttled | (views.draw_w >= views.cap_w * (capped_threshold_pct / 100.0)))
    if not capped.any():
        return 0.0
    free = np.maximum(views.cap_w - views.draw_w, 0.0)
    held = views.eligible & ~capped
    assert views.settling is not None
    which = held & views.settling if settling else held & ~views.settling
    return float(free[which].sum())


def settle_s(step_period_s: float | None, control_period_s: float, telemetry_interval_s: float) -> float:
    """How long a raised GPU is settling: one training step plus the telemetry delay, s.

    A raise shows in the draw only once a compute phase has run under it (the next step, in a
    synchronous job) and its samples have reached the controller (one telemetry batch). Without a
    detected step period, one control period stands in for it.

    Example: 2 s steps, 1 s telemetry batches -> 3 s, i.e. the period after a raise (2 s later)
    does not yet judge the raised GPUs against their new caps; the one after does.
    """
    step = step_period_s if step_period_s is not None and step_period_s > 0 else control_period_s
    return float(step + max(telemetry_interval_s, 0.0))


def draw_window_s(
    configured_s: float,
    control_period_s: float,
    step_period_s: float | None,
    telemetry_interval_s: float,
    *,
    longest_s: float,
) -> float:
    """How far back a GPU's draw (the peak the allocator judges it by) looks, s.

    At least the configured window and one control period, and at least one detected training step
    plus one telemetry batch (the newest samples are that old), so the window always holds a compute
    phase: a window that fits inside a communication trough reads a busy GPU at its trough draw, and
    the donor rule would hand away the watts its next compute phase needs. The step term is limited
    to `longest_s` (the detector's window: one that straddles a load change can read it as a long
    period).

    Example: 5 s configured, 1 s control period, 1 s telemetry: 2 s steps -> 5 s; 10 s steps -> 11 s.
    """
    window = max(configured_s, control_period_s)
    if step_period_s is not None and step_period_s > 0:
        window = max(window, min(step_period_s + max(telemetry_interval_s, 0.0), longest_s))
    return float(window)


def released(quarantined: np.ndarray, idle_for_s: np.ndarray, hold_s: float) -> np.ndarray:
    """Which GPUs release their share to the pool: quarantined ones the work has left, per GPU.

    The work has left a GPU once its utilisation has read 0 for at least `hold_s` (`settle_s`: one
    training step plus the telemetry delay), not at the first idle sample: a scheduler takes a rank
    out of a synchronous job at a step boundary, so a GPU that reads idle for a moment may still owe
    the current step its compute, and a rank dropped to its minimum cap mid-compute stalls every rank
    of the job (in the demo one such cut stretched a 2.02 s step to 2.88 s).

    Example: hold 3 s (2 s steps, 1 s telemetry); a quarantined GPU idle for 1 s keeps its share,
    one idle for 3 s releases it; a GPU that is not quarantined never does, idle or not.

    Args:
        quarantined: The GPU, or its node, is quarantined.
        idle_for_s: How long each GPU's utilisation has read 0, s; nan while it reads busy.
        hold_s: How long a quarantined GPU must read idle before it releases its share, s.
    """
    with np.errstate(invalid="ignore"):
        return np.asarray(quarantined, dtype=bool) & (np.asarray(idle_for_s, dtype=np.float64) >= hold_s)


def allocate(
    tree: power_tree.PowerTree,
    views: GpuViews,
    previous_caps: np.ndarray | None,
    *,
    policy: power_policy.PowerPolicy,
    rng: np.random.Generator,
) -> Allocation:
    """Compute this period's target caps. Pure and vectorised.

    Example (default policy: bands 90/93.5/97 %, step 50 % of range, jitter 20 %): one node with a
    1,200 W budget and two 200-700 W GPUs, both capped at 600 W. GPU a draws 300 W (a donor);
    GPU b draws 600 W and reports SW power cap. a offers max(ceil(300 / 0.935), 600 - 250) = 350 W;
    b asks for 600 + 250 = 850, clipped to 700 W. Minimums take 400 W, leaving 800 W of headroom;
    a's 150 W and b's 500 W both fit. b's 100 W raise is scaled by the jitter draw, say to 91 W:
    -> caps (350, 691), sum 1,041 W <= 1,200 W; the apply planner lowers a, confirms, then raises b.

    Args:
        tree: The budget tree; every GPU's node must be in it.
        views: This period's GPU views (columnar).
        previous_caps: The targets this allocator produced last period (aligned with `views`), the
            reference for hysteresis and step limits; None to use `views.cap_w`.
        policy: Bands, step limits, jitter and marginal cap.
        rng: Seeded generator for the raise jitter.

    Returns:
        The allocation: target caps within every budget and every GPU's [min, max].
    """
    n = len(views)
    if n == 0:
        empty = np.zeros(0, dtype=np.int64)
        return Allocation(empty, np.zeros(0, bool), np.zeros(0), 0.0, 0.0, 0.0, (), "no GPUs to allocate")
    ref = views.cap_w if previous_caps is None else np.asarray(previous_caps, dtype=np.float64)
    lo, hi, step = _limits(views, policy)
    floor = _floor(views, lo, hi)
    capped, donor = _classify(views, policy)
    demand, release = _demand(views, ref, capped, donor, lo, hi, step, policy)
    if floor is not None:
        demand = np.maximum(demand, floor)
    target, infeasible = _grant(tree.index, views, ref, capped, demand, lo, hi, floor)
    target = _jitter_raises(views, ref, target, lo, hi, policy, rng, floor)
    caps = _enforce(np.floor(target), lo, views.node_idx, tree.index)
    unmet = float(np.maximum(demand - caps, 0.0).sum())
    reason = (
        f"{int(capped.sum())} capped, {int(release.sum())} donors, "
        f"{int((~views.eligible).sum())} ineligible of {n} GPUs; unmet demand {unmet:.0f} W"
    )
    if infeasible:
        reason += f"; minimum caps exceed the budget of {', '.join(infeasible)}"
    return Allocation(
        caps_w=caps.astype(np.int64),
        capped=capped,
        demand_w=demand,
        unmet_w=unmet,
        stranded_w=stranded_w(views, policy.capped_threshold_pct),
        settling_w=stranded_w(views, policy.capped_threshold_pct, settling=True),
        infeasible=infeasible,
        reason=reason,
    )


def gpu_headroom_w(tree: power_tree.PowerTree, views: GpuViews, caps_w: np.ndarray) -> np.ndarray:
    """Watts each GPU could still be given under `caps_w` without exceeding any budget, W, never negative.

    Per GPU the least, over its node, rack, row and cluster, of (budget - the sum of the caps there),
    and at most its max - its cap; 0 for an ineligible or unreachable GPU (it gets no raise). Each
    GPU's figure assumes no other GPU takes the same watts: two GPUs of one node share its headroom.

    Example: one node budget 1,200 W, caps (350, 691) of 700 W maxima -> (159, 9): the node has
    159 W left, and the second GPU is 9 W under its maximum.
    """
    caps = np.asarray(caps_w, dtype=np.float64)
    idx = tree.index
    free = [b - s for b, s in zip(idx.level_budgets(), idx.sums(views.node_idx, caps), strict=True)]
    rack = idx.rack_of_node[views.node_idx]
    room = np.minimum(free[0][views.node_idx], free[1][rack])
    room = np.minimum(np.minimum(room, free[2][idx.row_of_rack[rack]]), free[3][0])
    room = np.minimum(room, views.max_w - caps)
    assert views.reachable is not None
    room = np.where(views.eligible & views.reachable, room, 0.0)
    return np.maximum(room, 0.0)


def _limits(views: GpuViews, policy: power_policy.PowerPolicy) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each GPU's (lowest cap, highest cap, hysteresis step), W.

    Whole watts: the wire carries integer limits, and integer budgets make the sums exact. A marginal
    GPU is held to `marginal_cap_pct` of its maximum, an ineligible one to its minimum.
    """
    lo = np.ceil(views.min_w)
    hi = np.floor(views.max_w)
    marginal_hi = np.floor(views.max_w * (policy.marginal_cap_pct / 100.0))
    hi = np.where(views.marginal, np.maximum(lo, np.minimum(hi, marginal_hi)), hi)
    hi = np.where(views.eligible, hi, lo)
    step = np.maximum((views.max_w - views.min_w) * (policy.max_step_pct_of_range / 100.0), policy.min_change_w)
    return lo, hi, step


def _floor(views: GpuViews, lo: np.ndarray, hi: np.ndarray) -> np.ndarray | None:
    """Each GPU's floor within its limits, whole watts; None when no GPU has one above its minimum.

    Never above its highest cap (max, marginal cap, minimum when ineligible), and none for an
    unreachable GPU (its cap is held where it may be until its agent is back).
    """
    if views.floor_w is None:
        return None
    floor = np.where(views.reachable, np.minimum(np.maximum(np.ceil(views.floor_w), lo), hi), lo)
    return floor if bool((floor > lo).any()) else None


def _classify(views: GpuViews, policy: power_policy.PowerPolicy) -> tuple[np.ndarray, np.ndarray]:
    """Step 1: (capped, donor) against the enforced cap, with the hysteresis band between them.

    An unreachable GPU is neither: it holds its cap (assumed drawn) until its agent is back.
    """
    cap, draw = views.cap_w, views.draw_w
    active = views.eligible & views.reachable
    capped = active & (views.throttled | (draw >= cap * (policy.capped_threshold_pct / 100.0)))
    # A settling GPU's draw was measured under its previous, lower cap: it is not a donor yet.
    assert views.settling is not None
    donor = active & ~capped & ~views.settling & (draw < cap * (policy.lower_band_pct / 100.0))
    return capped, donor


def _demand(
    views: GpuViews,
    ref: np.ndarray,
    capped: np.ndarray,
    donor: np.ndarray,
    lo: np.ndarray,
    hi: np.ndarray,
    step: np.ndarray,
    policy: power_policy.PowerPolicy,
) -> tuple[np.ndarray, np.ndarray]:
    """Step 2: (what each GPU asks for, which donors release watts), whole watts within [lo, hi].

    A capped GPU asks one step above its enforced cap (not above a raise still in flight, so raises
    never compound); a donor releases at most one step per period; everyone else keeps its reference.
    """
    cap = views.cap_w
    demand = ref.copy()
    demand = np.where(capped, np.maximum(ref, cap + step), demand)
    donor_target = np.maximum(np.ceil(views.draw_w / (policy.donor_target_pct / 100.0)), cap - step)
    release = donor & (ref - donor_target >= policy.min_change_w)
    demand = np.where(release, donor_target, demand)
    demand = np.where(views.reachable | ~views.eligible, demand, cap)
    return np.floor(np.minimum(np.maximum(demand, lo), hi)), release


def _grant(
    idx: power_tree.TreeIndex,
    views: GpuViews,
    ref: np.ndarray,
    capped: np.ndarray,
    demand: np.ndarray,
    lo: np.ndarray,
    hi: np.ndarray,
    floor: np.ndarray | None = None,
) -> tuple[np.ndarray, tuple[str, ...]]:
    """Step 3: (each GPU's cap before jitter, domains whose minimums exceed their budget).

    Minimums first; then, per priority class from the highest, first the floors (`floor`, above
    the minimums), then what each GPU holds or needs (its current cap if capped, else its demand),
    then what capped GPUs ask beyond it. Serving known needs before speculative asks keeps a
    shortage from squeezing a donor below its draw, which would make it capped next period and
    start an oscillation of the controller's own.

    A floor is served first within its class, not before higher classes: the priority classes are
    the operator's order, and a straggler's raise must not take watts from a more important job.
    Within its class it comes before the holds: a straggler paces its whole synchronous job, so
    watts that lift it speed every rank, and the floor was sized to the headroom the budget had
    (`gpu_headroom_w`), so it takes from the holds only when a budget was cut since. Like every
    tier it is limited by the headroom of each domain above the GPU: a floor never breaks a budget.
    """
    cap = views.cap_w
    budgets = idx.level_budgets()
    lo_sums = idx.sums(views.node_idx, lo)
    headroom = [b - s for b, s in zip(budgets, lo_sums, strict=True)]
    infeasible = _infeasible(idx, headroom)
    headroom = [np.maximum(h, 0.0) for h in headroom]
    hold = np.where(capped, np.minimum(demand, np.minimum(np.maximum(np.maximum(cap, ref), lo), hi)), demand)
    # Fairness: a capped GPU holds at most its class's mean capped hold (plus the hysteresis step);
    # the rest goes into its ask. When power is short, the asks share what is left, so jittered
    # raises do not leave lasting differences between GPUs of one class (in a synchronous job the
    # lowest cap sets the pace).
    classes, class_idx = np.unique(views.priority, return_inverse=True)
    n_capped = np.bincount(class_idx, weights=capped, minlength=len(classes))
    hold_sum = np.bincount(class_idx, weights=np.where(capped, hold, 0.0), minlength=len(classes))
    fair = np.divide(hold_sum, n_capped, out=np.zeros(len(classes)), where=n_capped > 0)
    hold = np.where(capped, np.maximum(np.minimum(hold, fair[class_idx]), lo), hold)
    tiers = (hold - lo, demand - hold)
    if floor is not None:
        hold = np.maximum(hold, floor)  # demand is at least the floor already
        tiers = (floor - lo, hold - floor, demand - hold)
    grant = np.zeros(len(views))
    for p in classes[::-1]:
        in_class = views.priority == p
        for extra in tiers:
            want = np.where(in_class, extra, 0.0)
            if not want.any():
                continue
            g = hierarchical_grant(want, headroom, views.node_idx, idx)
            grant += g
            headroom = [h - s for h, s in zip(headroom, idx.sums(views.node_idx, g), strict=True)]
    return lo + grant, infeasible


def _jitter_raises(
    views: GpuViews,
    ref: np.ndarray,
    target: np.ndarray,
    lo: np.ndarray,
    hi: np.ndarray,
    policy: power_policy.PowerPolicy,
    rng: np.random.Generator,
    floor: np.ndarray | None = None,
) -> np.ndarray:
    """Step 4: scale raises (relative to the previous target) by the seeded jitter; drop the small ones.

    An unreachable GPU is never raised above what may already be in force there. The jitter never
    cuts a floor: a GPU keeps as much of its floor as the grant gave it (never more than granted,
    so every budget still holds).
    """
    reachable = views.reachable
    granted = target
    rise = target - ref
    raising = (rise > 0) & reachable
    jitter = 1.0 - (policy.raise_jitter_pct / 100.0) * rng.random(len(views))
    jittered = np.floor(ref + rise * jitter)
    target = np.where(raising, np.maximum(jittered, lo), target)
    target = np.where(raising & (target - ref < policy.min_change_w), np.maximum(ref, lo), target)
    target = np.where(reachable, target, np.minimum(target, np.maximum(views.cap_w, lo)))
    if floor is not None:
        target = np.maximum(target, np.minimum(granted, floor))
    return np.minimum(np.maximum(target, lo), hi)


def _ratio(num: np.ndarray | float, den: np.ndarray | float) -> np.ndarray:
    """num / den clipped to [0, 1], 0 where den is 0."""
    den_arr = np.asarray(den, dtype=np.float64)
    out = np.zeros(den_arr.shape)
    np.divide(num, den_arr, out=out, where=den_arr > 0)
    np.maximum(out, 0.0, out=out)
    return np.minimum(out, 1.0, out=out)


def hierarchical_grant(
    want: np.ndarray, headroom: list[np.ndarray], node_idx: np.ndarray, idx: power_tree.TreeIndex
) -> np.ndarray:
    """Grant as much of `want` as fits every domain's headroom; whole watts, never above a headroom.

    Bottom-up each domain's demand is clipped to its headroom; top-down the granted total is split
    over children in proportion to their clipped demand, so no child receives more than it could hold.
    """
    h_node, h_rack, h_row, h_cluster = headroom
    want_node = np.bincount(node_idx, weights=want, minlength=len(idx.node_names))
    d_node = np.minimum(want_node, h_node)
    want_rack = np.bincount(idx.rack_of_node, weights=d_node, minlength=len(idx.rack_names))
    d_rack = np.minimum(want_rack, h_rack)
    want_row = np.bincount(idx.row_of_rack, weights=d_rack, minlength=len(idx.row_names))
    d_row = np.minimum(want_row, h_row)
    want_cluster = d_row.sum()
    d_cluster = min(want_cluster, float(h_cluster[0]))

    g_row = d_row * _ratio(d_cluster, want_cluster)
    g_rack = d_rack * _ratio(g_row, want_row)[idx.row_of_rack]
    g_node = d_node * _ratio(g_rack, want_rack)[idx.rack_of_node]
    # Flooring every GPU's share keeps each domain's sum at or below its (integer) headroom.
    return np.floor(want * _ratio(g_node, want_node)[node_idx])


def _infeasible(idx: power_tree.TreeIndex, headroom: list[np.ndarray]) -> tuple[str, ...]:
    names = (idx.node_names, idx.rack_names, idx.row_names, (idx.cluster_name,))
    out: list[str] = []
    for level_names, h in zip(names, headroom, strict=True):
        out.extend(level_names[i] for i in np.flatnonzero(h < 0))
    return tuple(out)


def _enforce(caps: np.ndarray, lo: np.ndarray, node_idx: np.ndarray, idx: power_tree.TreeIndex) -> np.ndarray:
    """Cut caps above their minimum, bottom-up, wherever a domain's sum exceeds its budget.

    The grant already respects every budget; this is the independent last check, so that a
    floating-point surprise can never become an over-budget command.
    """
    budgets = idx.level_budgets()
    sums = idx.sums(node_idx, caps)
    if not any(np.any(s > b) for s, b in zip(sums, budgets, strict=True)):
        return caps
    out = caps.copy()
    # Domain index of each GPU at each level.
    rack = idx.rack_of_node[node_idx]
    owners = (node_idx, rack, idx.row_of_rack[rack], np.zeros(len(caps), dtype=np.intp))
    for level, owner in enumerate(owners):
        sums = idx.sums(node_idx, out)[level]
        above = np.bincount(owner, weights=out - lo, minlength=len(sums))
        excess = np.maximum(sums - budgets[level], 0.0)
        keep = 1.0 - _ratio(excess, above)
        out = np.where(excess[owner] > 0, lo + np.floor((out - lo) * keep[owner]), out)
    return out
