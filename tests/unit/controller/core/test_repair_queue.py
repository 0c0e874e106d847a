"""The technician queue puts the repairs that return the most capacity per hour first."""

from __future__ import annotations

from rasd.controller.core.remediation import repair_queue


def _ticket(rma_id, node, gpu="", port="", opened=0):
    return {"rma_id": rma_id, "node_id": node, "gpu_uuid": gpu, "port": port, "opened_unix_ns": opened}


def test_worked_example_from_the_module_docstring():
    items = repair_queue.build_items(
        [_ticket("a", "node-7", opened=1), _ticket("b", "node-3", gpu="GPU-5", opened=2),
         _ticket("c", "node-9", gpu="GPU-2", opened=3)],
        node_gpu_counts={"node-7": 8, "node-3": 8, "node-9": 8},
        quarantined_nodes={"node-7", "node-9"},
    )  # fmt: skip
    ordered = repair_queue.order(items)
    assert [i.ticket_id for i in ordered] == ["c", "a", "b"]
    assert [i.gpus_per_hour for i in ordered] == [4.0, 2.0, 0.5]


def test_ties_go_to_the_oldest_ticket():
    items = repair_queue.build_items(
        [_ticket("new", "n1", gpu="g", opened=20), _ticket("old", "n2", gpu="g", opened=10)],
        node_gpu_counts={},
        quarantined_nodes=(),
    )
    assert [i.ticket_id for i in repair_queue.order(items)] == ["old", "new"]


def test_a_port_repair_on_a_serving_node_returns_no_gpus_but_a_held_node_returns_all():
    serving, held = repair_queue.build_items(
        [_ticket("p1", "n1", port="mlx5_0/1"), _ticket("p2", "n2", port="mlx5_0/1")],
        node_gpu_counts={"n1": 8, "n2": 4},
        quarantined_nodes={"n2"},
    )
    assert serving.gpus_returned == 0 and held.gpus_returned == 4
    assert held.gpus_per_hour == 8.0
