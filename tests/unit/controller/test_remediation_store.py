"""The remediation store's batched writes give the same rows as writing one by one (SQLite and PostgreSQL)."""

from __future__ import annotations

import dataclasses

from rasd.controller.core import fleet
from rasd.controller.core.remediation import events as health
from rasd.controller.store import records, repo
from rasd.controller.store import remediation as rstore


def _record(command_id: str) -> rstore.CommandRecord:
    return rstore.CommandRecord(
        command_id=command_id, node_id="node-1", gpu_uuid="", ticket_id="t", kind="reset_gpu", payload={"k": 1},
        status="pending", reason="why", created_unix_ns=1, dispatched_unix_ns=None, finished_unix_ns=None,
        result=None,
    )  # fmt: skip


def _audit(n: int) -> records.AuditRecord:
    return records.AuditRecord(at_unix_ns=10, actor="automation", action=f"a{n}", node_id="node-1", gpu_uuid="",
                               reason="r", outcome="dispatched")  # fmt: skip


def test_outbox_updates_in_one_commit_apply_in_order_and_never_reopen_a_final_command(store):
    remediation = rstore.RemediationStore(store.engine)
    remediation.commit(rstore.Commit(now_unix_ns=1, new_commands=[_record(f"c{i}") for i in range(4)]))
    remediation.commit(
        rstore.Commit(
            now_unix_ns=2,
            command_updates=[
                records.CommandUpdate("c0", "dispatched", dispatched_unix_ns=2),
                records.CommandUpdate("c0", "succeeded", finished_unix_ns=3, result={"outcome": "ok"}),
                records.CommandUpdate("c0", "cancelled"),  # after a final status: ignored, as one by one
                records.CommandUpdate("c1", "cancelled"),
                records.CommandUpdate("c2", "dispatched", dispatched_unix_ns=2),
                records.CommandUpdate("unknown", "dispatched", dispatched_unix_ns=2),
            ],
            audit=[_audit(n) for n in range(3)],
        )
    )
    remediation.commit(rstore.Commit(now_unix_ns=3, command_updates=[records.CommandUpdate("c1", "dispatched")]))
    rows = {r.command_id: r for r in remediation.commands()}
    assert set(rows) == {"c0", "c1", "c2", "c3"}
    assert (rows["c0"].status, rows["c0"].dispatched_unix_ns, rows["c0"].finished_unix_ns) == ("succeeded", 2, 3)
    assert rows["c0"].result == {"outcome": "ok"}
    assert rows["c1"].status == "cancelled", "a cancelled command is final: a later dispatch does not reopen it"
    assert (rows["c2"].status, rows["c2"].dispatched_unix_ns) == ("dispatched", 2)
    assert rows["c3"].status == "pending"
    audit = sorted(remediation.audit(), key=lambda a: a["id"])
    assert [a["action"] for a in audit] == ["a0", "a1", "a2"], "audit rows keep the decision's order"


def test_a_replicas_outbox_read_is_its_own_nodes_commands_all_of_them_oldest_first(store, monkeypatch):
    monkeypatch.setattr(rstore, "OUTBOX_NODES_PER_QUERY", 2)  # several queries, merged in time order
    remediation = rstore.RemediationStore(store.engine)
    new = [
        dataclasses.replace(_record(f"c{i}"), node_id=f"node-{i % 5}", created_unix_ns=100 - i, status="dispatched")
        for i in range(12)
    ]
    remediation.commit(rstore.Commit(now_unix_ns=1, new_commands=new))

    mine = remediation.commands(statuses=("dispatched",), node_ids=["node-1", "node-3", "node-4"], limit=None)

    assert [(c.command_id, c.node_id) for c in mine] == [
        ("c11", "node-1"), ("c9", "node-4"), ("c8", "node-3"), ("c6", "node-1"), ("c4", "node-4"), ("c3", "node-3"),
        ("c1", "node-1"),
    ]  # fmt: skip
    assert len(remediation.commands(statuses=("dispatched",), node_ids=["node-1"], limit=2)) == 2
    assert len(remediation.commands(statuses=("dispatched",), limit=None)) == 12


def test_quarantine_counts_are_per_scope_and_leave_released_ones_out(store):
    remediation = rstore.RemediationStore(store.engine)
    remediation.commit(
        rstore.Commit(
            now_unix_ns=5,
            quarantines=[
                records.QuarantineRecord(node_id="n1", gpu_uuid="GPU-a", port="", reason="x", source="automation"),
                records.QuarantineRecord(node_id="n1", gpu_uuid="GPU-b", port="", reason="x", source="automation"),
                records.QuarantineRecord(node_id="n1", gpu_uuid="", port="mlx5_0/1", reason="x", source="automation"),
                records.QuarantineRecord(node_id="n2", gpu_uuid="", port="", reason="x", source="automation"),
            ],
        )
    )
    assert remediation.quarantine_counts() == {"node": 1, "gpu": 2, "port": 1}
    remediation.commit(
        rstore.Commit(
            now_unix_ns=6, releases=[records.ReleaseRecord(node_id="n1", gpu_uuid="GPU-a", port="", reason="ok")]
        )
    )
    assert remediation.quarantine_counts() == {"node": 1, "gpu": 1, "port": 1}


def test_incident_data_is_read_back_by_id(store):
    remediation = rstore.RemediationStore(store.engine)
    row = records.IncidentRecord(incident_id="n1/GPU-a/xid:13/1", node_id="n1", gpu_uuid="GPU-a", cause="xid:13",
                                 component="gpu", severity=3, state="open", opened_unix_ns=1,
                                 data={"event_count": 2})  # fmt: skip
    remediation.commit(rstore.Commit(now_unix_ns=1, incidents=[row]))
    assert remediation.incident_data(["n1/GPU-a/xid:13/1", "missing"]) == {"n1/GPU-a/xid:13/1": {"event_count": 2}}


def test_each_nodes_latest_incident_opening_is_read_back_open_or_closed(store):
    remediation = rstore.RemediationStore(store.engine)
    assert remediation.latest_incident_opened() == {}
    opened = [
        ("n1", "xid:13", 5 * 10**18, "closed"),
        ("n1", "xid:31", 7 * 10**18, "open"),
        ("n2", "ib_flap", 6, "open"),
    ]
    rows = [
        records.IncidentRecord(incident_id=f"{node}/-/{cause}/1", node_id=node, cause=cause, state=state,
                               opened_unix_ns=at, data={})
        for node, cause, at, state in opened
    ]  # fmt: skip
    remediation.commit(rstore.Commit(now_unix_ns=1, incidents=rows))
    assert remediation.latest_incident_opened() == {"n1": 7 * 10**18, "n2": 6}


def test_the_events_left_to_replay_are_read_many_nodes_per_query_and_per_node_in_seq_order(store):
    """Start-up reads each node's events after its watermark, in its current spool epoch, many nodes per query."""
    now = 1_800_000_000 * 10**9
    nodes = 2 * rstore.UNPROCESSED_NODES_PER_QUERY + 50

    def hello(n: int, spool_head_seq: int) -> fleet.NodeHello:
        gpu = fleet.GpuRecord(f"GPU-{n:08d}-0000-4000-8000-000000000001", "H100", "0000:18:00.0",
                              200, 700, 700, node_id=f"node-{n}")  # fmt: skip
        return fleet.NodeHello(f"node-{n}", "boot-1", "0.1.0", f"node-{n}", "simulated", {"rack": f"r{n % 7}"},
                               (gpu,), spool_head_seq)  # fmt: skip

    def events(n: int, seqs: range) -> list[repo.StoredEvent]:
        stored = [
            repo.StoredEvent(node_id=f"node-{n}", seq=seq, observed_unix_ns=now, received_unix_ns=now + seq,
                             kind=int(health.EventKind.XID), severity=int(health.Severity.ERROR), gpu_uuid="",
                             xid=13, message=f"seq {seq}", source="kmsg", attributes={})
            for seq in seqs
        ]  # fmt: skip
        return stored

    expected: dict[str, list[int]] = {}
    marks: dict[str, int] = {}
    for n in range(nodes):
        store.register_hello(hello(n, 0), now)
        store.append_events(f"node-{n}", events(n, range(1, 5)))
        case = n % 4
        if case == 0:  # nothing consumed yet: all four
            expected[f"node-{n}"] = [1, 2, 3, 4]
        elif case == 1:  # consumed up to 2
            marks[f"node-{n}"], expected[f"node-{n}"] = 2, [3, 4]
        elif case == 2:  # all consumed
            marks[f"node-{n}"] = 4
        else:  # consumed up to 4, then the spool was reset: the new epoch's events, from 1
            marks[f"node-{n}"] = 4
    remediation = rstore.RemediationStore(store.engine)
    remediation.commit(rstore.Commit(now_unix_ns=now, processed_seq=marks))
    for n in range(3, nodes, 4):
        assert store.register_hello(hello(n, 0), now).spool_reset
        store.append_events(f"node-{n}", events(n, range(1, 3)))
        expected[f"node-{n}"] = [1, 2]

    backlog = remediation.unprocessed_events()
    assert {node: [e.seq for e in stored] for node, (_labels, stored) in backlog.items()} == expected
    assert all(labels == {"rack": f"r{int(node.split('-')[1]) % 7}"} for node, (labels, _) in backlog.items())
    assert all(e.node_id == node for node, (_labels, stored) in backlog.items() for e in stored)


def test_a_quarantine_given_only_its_target_is_recorded_with_every_default(store):
    remediation = rstore.RemediationStore(store.engine)
    remediation.commit(
        rstore.Commit(
            now_unix_ns=5,
            quarantines=[records.QuarantineRecord(node_id="n1", gpu_uuid="GPU-a"), records.QuarantineRecord("n2")],
        )
    )
    rows = {(q["node_id"], q["gpu_uuid"]): q for q in remediation.quarantines()}
    assert set(rows) == {("n1", "GPU-a"), ("n2", "")}
    for q in rows.values():
        assert (q["port"], q["source"], q["since_unix_ns"], q["forced"], q["released_unix_ns"]) == (
            "",
            "automation",
            5,
            False,
            None,
        )
