"""Per-GPU floors in the allocator (a straggler's raise, issue #40) and the headroom the loop publishes."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from rasd.controller.core.power import allocate as power
from rasd.controller.core.power import policy as power_policy
from rasd.controller.core.power import tree as power_tree

POLICY = power_policy.PowerPolicy()


def one_node(node_w: float) -> power_tree.PowerTree:
    node = {"name": "n", "budget_w": node_w}
    return power_tree.PowerTree.from_mapping(
        {"budget_w": 100_000, "rows": [{"name": "r", "racks": [{"name": "k", "nodes": [node]}]}]}
    )


def two_gpus(tree, *, floor_a=None, priority_b=0, **a_flags):
    """GPU a and GPU b, both 200-700 W, capped at 600 W and drawing 560 W (in band: each keeps its cap)."""
    return power.GpuViews.from_views(
        [
            power.GpuView("a", "n", 0, draw_w=560, cap_w=600, min_w=200, max_w=700, floor_w=floor_a, **a_flags),
            power.GpuView("b", "n", priority_b, draw_w=560, cap_w=600, min_w=200, max_w=700),
        ],
        tree,
    )


def caps(tree, views, seed=0):
    return power.allocate(tree, views, None, policy=POLICY, rng=np.random.default_rng(seed)).caps_w


def test_a_floor_within_headroom_is_met_and_the_jitter_never_cuts_it():
    tree = one_node(1_400)
    assert list(caps(tree, two_gpus(tree))) == [600, 600]  # in band, no floor: nothing moves
    for seed in range(20):
        got = caps(tree, two_gpus(tree, floor_a=650.0), seed)
        assert list(got) == [650, 600], seed
        assert got.sum() <= 1_400


def test_no_floor_and_floors_at_the_minimum_decide_alike():
    tree = one_node(1_200)
    views = two_gpus(tree, throttled=True)
    at_min = views.replace(floor_w=views.min_w.copy())
    assert list(caps(tree, views, 3)) == list(caps(tree, at_min, 3))


def test_a_floor_is_served_before_its_classs_holds_but_never_breaks_the_budget():
    tree = one_node(1_200)
    got = caps(tree, two_gpus(tree, floor_a=650.0))
    assert list(got) == [650, 550] and got.sum() <= 1_200


def test_a_floor_never_takes_a_higher_classs_watts():
    tree = one_node(1_200)
    got = caps(tree, two_gpus(tree, floor_a=650.0, priority_b=1))
    assert list(got) == [600, 600]


def test_a_floor_stays_under_max_marginal_and_ineligible_limits():
    tree = one_node(10_000)
    assert caps(tree, two_gpus(tree, floor_a=900.0))[0] == 700
    marginal_w = int(np.floor(700 * POLICY.marginal_cap_pct / 100))
    assert caps(tree, two_gpus(tree, floor_a=900.0, marginal=True))[0] == marginal_w
    assert caps(tree, two_gpus(tree, floor_a=900.0, eligible=False))[0] == 200


def test_an_unreachable_gpus_floor_waits_for_its_agent():
    tree = one_node(10_000)
    assert caps(tree, two_gpus(tree, floor_a=680.0, reachable=False))[0] == 600


def test_views_reject_a_misaligned_or_nan_floor():
    tree = one_node(1_200)
    views = two_gpus(tree)
    for bad in (np.array([300.0]), np.array([300.0, np.nan])):
        try:
            views.replace(floor_w=bad)
        except ValueError as exc:
            assert "floor_w" in str(exc)
        else:
            raise AssertionError("accepted a bad floor column")


def _fleet_tree(node_w: float, rack_w: float, cluster_w: float) -> power_tree.PowerTree:
    return power_tree.PowerTree.from_mapping(
        {
            "budget_w": cluster_w,
            "rows": [
                {
                    "name": f"row{r}",
                    "racks": [
                        {
                            "name": f"rack{r}{k}",
                            "budget_w": rack_w,
                            "nodes": [{"name": f"n{r}{k}{n}", "budget_w": node_w} for n in range(2)],
                        }
                        for k in range(2)
                    ],
                }
                for r in range(2)
            ],
        }
    )


@settings(max_examples=150, deadline=None, derandomize=True, database=None)
@given(seed=st.integers(0, 2**32 - 1), frac=st.floats(0.3, 1.1), one_class=st.booleans())
def test_random_floors_hold_every_budget_and_a_floor_that_fits_is_met(seed, frac, one_class):
    rng = np.random.default_rng(seed)
    gpn, nodes = 4, 8
    n = gpn * nodes
    min_w, max_w = 150.0, 700.0
    tree = _fleet_tree(
        node_w=max(frac * gpn * max_w, gpn * min_w),
        rack_w=max(frac * 2 * gpn * max_w, 2 * gpn * min_w),
        cluster_w=max(frac * n * max_w, n * min_w),
    )
    caps_w = rng.uniform(min_w, max_w, n)
    eligible = rng.random(n) < 0.9
    marginal = rng.random(n) < 0.1
    floors = np.where(rng.random(n) < 0.3, rng.uniform(100, 800, n), min_w)
    views = power.GpuViews(
        gpu_uuids=tuple(str(i) for i in range(n)),
        node_idx=np.repeat(np.arange(nodes), gpn),
        priority=np.zeros(n, dtype=np.int64) if one_class else rng.integers(0, 3, n),
        draw_w=caps_w * rng.uniform(0.2, 1.05, n),
        cap_w=caps_w,
        min_w=np.full(n, min_w),
        max_w=np.full(n, max_w),
        throttled=rng.random(n) < 0.3,
        eligible=eligible,
        marginal=marginal,
        floor_w=floors,
    )
    previous = rng.uniform(min_w, max_w, n) if seed % 2 else None
    got = power.allocate(tree, views, previous, policy=POLICY, rng=rng).caps_w
    assert tree.index.over_budget(views.node_idx, got.astype(float)) == []
    assert np.all(got >= min_w) and np.all(got <= max_w)
    hi = np.where(marginal, np.maximum(min_w, np.floor(max_w * POLICY.marginal_cap_pct / 100)), max_w)
    hi = np.where(eligible, hi, min_w)
    want = np.minimum(np.maximum(np.ceil(floors), min_w), hi)
    fits = not tree.index.over_budget(views.node_idx, want)
    if one_class and fits:
        assert np.all(got >= want)


def test_headroom_is_the_tightest_domain_and_the_gpus_own_maximum():
    tree = one_node(1_200)
    views = two_gpus(tree)
    assert list(power.gpu_headroom_w(tree, views, np.array([350.0, 691.0]))) == [159.0, 9.0]
    assert list(power.gpu_headroom_w(tree, views, np.array([600.0, 650.0]))) == [0.0, 0.0]  # over budget: none
    tight = _fleet_tree(node_w=2_800, rack_w=3_000, cluster_w=100_000)
    n = 16
    views = power.GpuViews(
        gpu_uuids=tuple(str(i) for i in range(n)),
        node_idx=np.repeat(np.arange(4), 4),
        priority=np.zeros(n, dtype=np.int64),
        draw_w=np.full(n, 300.0),
        cap_w=np.full(n, 350.0),
        min_w=np.full(n, 150.0),
        max_w=np.full(n, 700.0),
        throttled=np.zeros(n, dtype=bool),
        eligible=np.arange(n) != 0,
        marginal=np.zeros(n, dtype=bool),
    )
    room = power.gpu_headroom_w(tree=tight, views=views, caps_w=np.full(n, 350.0))
    # Node 1,400 W of 2,800 W, but its rack holds two such nodes: 3,000 - 2,800 = 200 W.
    assert room[0] == 0.0 and room[1] == 200.0 and room[15] == 200.0


def test_floors_expire_and_leave_quarantined_gpus_and_nodes():
    from rasd.controller.core.power import floors

    held = {
        "a": floors.floor("a", "n1", 650, "straggler", now_s=100.0, ttl_s=60.0),
        "b": floors.floor("b", "n2", 650, "straggler", now_s=100.0),
        "c": floors.floor("c", "n3", 650, "straggler", now_s=100.0),
    }
    assert set(floors.in_force(held, now_s=159.0)) == {"a", "b", "c"}
    assert set(floors.in_force(held, now_s=160.0, quarantined_gpus={"b"}, quarantined_nodes={"n3"})) == set()
    assert floors.floors_w(held) == {"a": 650.0, "b": 650.0, "c": 650.0}
    for bad, field in (({"floor_w": 0.0}, "floor_w"), ({"expires_at_s": 100.0}, "expires_at_s")):
        try:
            floors.Floor(**{**held["a"].__dict__, **bad})
        except ValueError as exc:
            assert str(exc).startswith(field)
        else:
            raise AssertionError(f"accepted {bad}")
