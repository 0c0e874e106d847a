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


def test_once_the_job_ends_the_even_nodes_gpus_idle_and_the_odd_nodes_stay_busy():
    from rasd.controller.core import aggregates

    replica = fleet.Replica("ingest-0", range(4))
    reads = aggregates.AggregateReads(interval_s=1.5, draw_window_s=5.0, detect_window_s=20.0)
    replica.job_ended = True
    shipped = aggregates.decode(replica.aggregate(reads))
    idle = {g for n in (0, 2) for g in fleet.gpu_uuids(n)}
    assert {g for g, r in shipped.latest.items() if r.utilization_gpu_pct == 0} == idle
    assert all(shipped.latest[g].power_w == fleet.IDLE_W and shipped.draw_peaks_w[g] == fleet.IDLE_W for g in idle)
    assert all(r.power_w >= 600 for g, r in shipped.latest.items() if g not in idle)
