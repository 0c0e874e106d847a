"""bench/fleet.py: the budget tree it gives the leader, and the budget check it makes of the caps."""

from __future__ import annotations

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3] / "bench"))
import fleet  # bench/ is scripts, not a package

from rasd.controller.core.power import tree as power_tree


def test_the_tree_holds_every_node_once_in_racks_under_a_tighter_cluster_budget():
    spec = fleet.tree(1000)
    racks = [rack for row in spec["rows"] for rack in row["racks"]]
    names = [node["name"] for rack in racks for node in rack["nodes"]]
    assert sorted(names) == [fleet.node_name(n) for n in range(1000)]
    assert len(racks) == 63 and len(spec["rows"]) == 2
    assert spec["budget_w"] == int(0.95 * sum(rack["budget_w"] for rack in racks))
    power_tree.PowerTree.from_mapping(spec)  # the leader's [power.tree] parses it


def test_the_budget_check_names_a_rack_over_its_budget():
    replica = fleet.Replica("ingest-0", range(32))
    capped = {gpu: 500 for gpu in replica.limits}
    replica.limits.update(capped)
    assert fleet._budget_check([replica], 32) == (True, [])
    replica.limits[fleet.gpu_uuids(3)[0]] = 700 + 16 * 8 * (fleet.GPU_BUDGET_W - 500)
    held, over = fleet._budget_check([replica], 32)
    assert not held and over == ["rack-0"]
