import math

import numpy as np
import pytest

from rasd.controller.core.power import tree as power_tree


def small_tree_mapping() -> dict:
    return {
        "name": "dc",
        "budget_w": 10_000,
        "rows": [
            {
                "name": "row-a",
                "budget_w": 6_000,
                "racks": [
                    {
                        "name": "rack-a1",
                        "budget_w": 3_500,
                        "nodes": [
                            {"name": "n1", "budget_w": 2_000, "min_w": 800},
                            {"name": "n2", "budget_w": 2_000, "min_w": 800},
                        ],
                    },
                    {"name": "rack-a2", "nodes": [{"name": "n3", "min_w": 400}]},
                ],
            },
            {"name": "row-b", "racks": [{"name": "rack-b1", "nodes": [{"name": "n4"}]}]},
        ],
    }


def test_from_mapping_builds_every_level_and_rolls_up_minimums():
    tree = power_tree.PowerTree.from_mapping(small_tree_mapping())
    assert [d.level for d in tree.domains].count("node") == 4
    assert tree.domain("rack-a1").min_w == 1_600
    assert tree.domain("row-a").min_w == 2_000
    assert tree.domain("dc").min_w == 2_000
    assert tree.domain("rack-a2").budget_w is None
    assert tree.ancestors("n3") == ("rack-a2", "row-a", "dc")
    idx = tree.index
    assert idx.node_names == ("n1", "n2", "n3", "n4")
    assert list(idx.rack_of_node) == [0, 0, 1, 2]
    assert list(idx.row_of_rack) == [0, 0, 1]
    assert math.isinf(idx.rack_budget_w[1])


def test_sums_and_over_budget_cover_every_level():
    tree = power_tree.PowerTree.from_mapping(small_tree_mapping())
    node_idx = np.array([0, 0, 1, 2, 3])
    caps = np.array([1_000.0, 1_001.0, 1_500.0, 3_000.0, 4_000.0])
    by_node, by_rack, by_row, cluster = tree.index.sums(node_idx, caps)
    assert list(by_node) == [2_001, 1_500, 3_000, 4_000]
    assert list(by_rack) == [3_501, 3_000, 4_000]
    assert list(by_row) == [6_501, 4_000]
    assert cluster[0] == 10_501
    assert tree.index.over_budget(node_idx, caps) == ["n1", "rack-a1", "row-a", "dc"]


@pytest.mark.parametrize(
    ("patch", "key"),
    [
        (lambda m: m["rows"][0]["racks"][0]["nodes"][1].update(budget_w="lots"), "rows[0].racks[0].nodes[1].budget_w"),
        (lambda m: m["rows"][1]["racks"][0]["nodes"][0].update(colour="red"), "rows[1].racks[0].nodes[0].colour"),
        (lambda m: m["rows"][0]["racks"][1].update(nodes=[]), "rows[0].racks[1].nodes"),
        (lambda m: m["rows"][0].update(budget_w=-1), "rows[0].budget_w"),
        (lambda m: m["rows"][0]["racks"][0]["nodes"][0].update(min_w=True), "rows[0].racks[0].nodes[0].min_w"),
        (lambda m: m.pop("budget_w"), "budget_w"),
        (lambda m: m["rows"][1].update(name=""), "rows[1].name"),
        (lambda m: m["rows"][1]["racks"][0]["nodes"][0].update(name="n1"), "n1"),
    ],
)
def test_from_mapping_names_the_offending_key(patch, key):
    mapping = small_tree_mapping()
    patch(mapping)
    with pytest.raises(power_tree.PowerTreeError) as err:
        power_tree.PowerTree.from_mapping(mapping)
    assert err.value.key == key
    assert key in str(err.value)


def test_budget_below_the_sum_of_childrens_minimum_caps_is_rejected():
    mapping = small_tree_mapping()
    mapping["rows"][0]["racks"][0]["budget_w"] = 1_500
    with pytest.raises(power_tree.PowerTreeError, match=r"rack-a1: budget 1500 W is below .* \(1600 W\)"):
        power_tree.PowerTree.from_mapping(mapping)


def test_with_budget_returns_a_new_tree_and_leaves_the_old_one():
    tree = power_tree.PowerTree.from_mapping(small_tree_mapping())
    cut = tree.with_budget("row-a", 4_000.9)
    assert cut.domain("row-a").budget_w == 4_000
    assert tree.domain("row-a").budget_w == 6_000
    assert cut.index.row_budget_w[0] == 4_000
    with pytest.raises(power_tree.PowerTreeError, match="below the sum of the minimum caps"):
        tree.with_budget("row-a", 1_999)
    with pytest.raises(power_tree.PowerTreeError, match="no such domain"):
        tree.with_budget("row-z", 1_000)
    with pytest.raises(power_tree.PowerTreeError, match="needs a budget"):
        tree.with_budget("dc", None)
    assert tree.with_budget("rack-a1", None).domain("rack-a1").budget_w is None


def test_with_node_mins_rolls_up_and_rejects_a_minimum_above_a_budget():
    tree = power_tree.PowerTree.from_mapping(small_tree_mapping())
    updated = tree.with_node_mins({"n4": 1_000, "n3": 450.2})
    assert updated.domain("n3").min_w == 451
    assert updated.domain("dc").min_w == 800 + 800 + 451 + 1_000
    with pytest.raises(power_tree.PowerTreeError, match="n1"):
        tree.with_node_mins({"n1": 2_500})
    with pytest.raises(power_tree.PowerTreeError, match="no such node"):
        tree.with_node_mins({"rack-a1": 10})


def test_to_mapping_round_trips():
    tree = power_tree.PowerTree.from_mapping(small_tree_mapping())
    again = power_tree.PowerTree.from_mapping(tree.to_mapping())
    assert again.domains == tree.domains
