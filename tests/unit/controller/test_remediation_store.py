"""The remediation store's batched writes give the same rows as writing one by one (SQLite and PostgreSQL)."""

from __future__ import annotations

from rasd.controller.store import remediation as rstore


def _record(command_id: str) -> rstore.CommandRecord:
    return rstore.CommandRecord(
        command_id=command_id, node_id="node-1", gpu_uuid="", ticket_id="t", kind="reset_gpu", payload={"k": 1},
        status="pending", reason="why", created_unix_ns=1, dispatched_unix_ns=None, finished_unix_ns=None,
        result=None,
    )  # fmt: skip


def _audit(n: int) -> dict:
    return {"at_unix_ns": 10, "actor": "automation", "action": f"a{n}", "node_id": "node-1", "gpu_uuid": "",
            "reason": "r", "outcome": "dispatched", "details": {}}  # fmt: skip


def test_outbox_updates_in_one_commit_apply_in_order_and_never_reopen_a_final_command(store):
    remediation = rstore.RemediationStore(store.engine)
    remediation.commit(rstore.Commit(now_unix_ns=1, new_commands=[_record(f"c{i}") for i in range(4)]))
    remediation.commit(
        rstore.Commit(
            now_unix_ns=2,
            command_updates=[
                ("c0", {"status": "dispatched", "dispatched_unix_ns": 2}),
                ("c0", {"status": "succeeded", "finished_unix_ns": 3, "result": {"outcome": "ok"}}),
                ("c0", {"status": "cancelled"}),  # after a final status: ignored, as one by one
                ("c1", {"status": "cancelled"}),
                ("c2", {"status": "dispatched", "dispatched_unix_ns": 2}),
                ("unknown", {"status": "dispatched", "dispatched_unix_ns": 2}),
            ],
            audit=[_audit(n) for n in range(3)],
        )
    )
    remediation.commit(rstore.Commit(now_unix_ns=3, command_updates=[("c1", {"status": "dispatched"})]))
    rows = {r.command_id: r for r in remediation.commands()}
    assert set(rows) == {"c0", "c1", "c2", "c3"}
    assert (rows["c0"].status, rows["c0"].dispatched_unix_ns, rows["c0"].finished_unix_ns) == ("succeeded", 2, 3)
    assert rows["c0"].result == {"outcome": "ok"}
    assert rows["c1"].status == "cancelled", "a cancelled command is final: a later dispatch does not reopen it"
    assert (rows["c2"].status, rows["c2"].dispatched_unix_ns) == ("dispatched", 2)
    assert rows["c3"].status == "pending"
    audit = sorted(remediation.audit(), key=lambda a: a["id"])
    assert [a["action"] for a in audit] == ["a0", "a1", "a2"], "audit rows keep the decision's order"


def test_quarantine_counts_are_per_scope_and_leave_released_ones_out(store):
    remediation = rstore.RemediationStore(store.engine)
    remediation.commit(
        rstore.Commit(
            now_unix_ns=5,
            quarantines=[
                {"node_id": "n1", "gpu_uuid": "GPU-a", "port": "", "reason": "x", "source": "automation"},
                {"node_id": "n1", "gpu_uuid": "GPU-b", "port": "", "reason": "x", "source": "automation"},
                {"node_id": "n1", "gpu_uuid": "", "port": "mlx5_0/1", "reason": "x", "source": "automation"},
                {"node_id": "n2", "gpu_uuid": "", "port": "", "reason": "x", "source": "automation"},
            ],
        )
    )
    assert remediation.quarantine_counts() == {"node": 1, "gpu": 2, "port": 1}
    remediation.commit(
        rstore.Commit(now_unix_ns=6, releases=[{"node_id": "n1", "gpu_uuid": "GPU-a", "port": "", "reason": "ok"}])
    )
    assert remediation.quarantine_counts() == {"node": 1, "gpu": 1, "port": 1}


def test_incident_data_is_read_back_by_id(store):
    remediation = rstore.RemediationStore(store.engine)
    row = {"incident_id": "n1/GPU-a/xid:13/1", "node_id": "n1", "gpu_uuid": "GPU-a", "cause": "xid:13",
           "component": "gpu", "severity": 3, "state": "open", "opened_unix_ns": 1,
           "data": {"event_count": 2}}  # fmt: skip
    remediation.commit(rstore.Commit(now_unix_ns=1, incidents=[row]))
    assert remediation.incident_data(["n1/GPU-a/xid:13/1", "missing"]) == {"n1/GPU-a/xid:13/1": {"event_count": 2}}
