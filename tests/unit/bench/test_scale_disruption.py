"""bench/scale.py's disruption audit from the store: node repairs asked, sent, still waiting; most nodes out at once."""

from __future__ import annotations

import pathlib
import sys

import sqlalchemy as sa

from rasd.controller.store import repo, schema

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3] / "bench"))
import scale as scale_bench  # bench/ is scripts, not a package


def _command(command_id: str, node_id: str, kind: str, status: str) -> schema.CommandRow:
    return schema.CommandRow(command_id=command_id, node_id=node_id, kind=kind, payload={}, status=status)


def _quarantine(node_id: str, since_s: int, released_s: int | None, gpu_uuid: str = "") -> schema.QuarantineRow:
    released = None if released_s is None else released_s * 10**9
    return schema.QuarantineRow(
        node_id=node_id, gpu_uuid=gpu_uuid, since_unix_ns=since_s * 10**9, released_unix_ns=released
    )


def test_the_audit_counts_nodes_not_commands_and_the_most_nodes_out_at_once(tmp_path):
    url = f"sqlite:///{tmp_path / 'scale.db'}"
    store = repo.Store.open(url)
    with sa.orm.Session(store.engine) as session, session.begin():
        session.add_all(
            [
                _command("q1", "node-1", "quarantine_node", "succeeded"),
                _command("r1", "node-1", "reboot_node", "succeeded"),
                _command("q2", "node-2", "quarantine_node", "dispatched"),
                _command("r2", "node-2", "reboot_node", "dispatched"),
                _command("q3", "node-3", "quarantine_node", "pending"),  # never admitted
                _command("r3", "node-3", "reboot_node", "pending"),
                _command("g1", "node-4", "reset_gpu", "pending"),  # a GPU repair is not a node repair
                # node-1 out 10-20 s, node-2 15-40 s, node-5 30 s on: at most two at once.
                _quarantine("node-1", 10, 20),
                _quarantine("node-2", 15, 40),
                _quarantine("node-5", 30, None),
                _quarantine("node-6", 12, None, gpu_uuid="GPU-6"),  # a GPU quarantine leaves its node in service
            ]
        )
    store.close()
    assert scale_bench.disruption(url, 2048) == {
        "node_repairs": 3,
        "node_repairs_sent": 2,
        "node_repairs_waiting": 1,
        "most_nodes_out": 2,
        "cluster_cap": 8,
    }
    assert scale_bench.disruption(url, 100)["cluster_cap"] == 5  # 5 % of 100 nodes is below 8
