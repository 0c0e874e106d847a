"""The replay's decision diff: alignment per ticket, pairing, flags; the policy overlay."""

from __future__ import annotations

import pytest

from rasd.controller.core.remediation import actions
from rasd.controller.core.remediation import policy as policy_mod
from rasd.sim import replay

T0 = 1_700_000_000_000_000_000


def _d(action: actions.Action, at_s: float) -> replay.DecisionRecord:
    return replay.DecisionRecord.from_action(action, T0 + int(at_s * 1e9))


def test_identical_decisions_make_no_row():
    a = actions.RestartProcess(ticket_id="t", step=0, node_id="n", gpu_uuid="GPU-1")
    assert replay.diff([_d(a, 1)], [_d(a, 1.2)], started_unix_ns=T0) == []


def test_a_changed_rung_pairs_repair_with_repair_and_flags_what_follows_a_synthesized_result():
    recorded = [_d(actions.RestartProcess(ticket_id="t", step=0, node_id="n", gpu_uuid="GPU-1"), 1)]
    replayed = [
        _d(actions.QuarantineGpu(ticket_id="t", step=0, node_id="n", gpu_uuid="GPU-1"), 1),
        _d(actions.ResetGpu(ticket_id="t", step=1, node_id="n", gpu_uuid="GPU-1", reason="budget spent"), 1),
        _d(actions.RunValidation(ticket_id="t", step=2, node_id="n", gpu_uuids=("GPU-1",), suite="post-repair"), 3),
    ]
    rows = replay.diff(recorded, replayed, started_unix_ns=T0, synthesized_tickets={"t": T0 + int(2e9)})
    assert [(r["change"], r["recorded_action"], r["replayed_action"], r["depends_on_synthesized"]) for r in rows] == [
        ("only_replayed", "", "quarantine_gpu", False),
        ("changed", "restart_process", "reset_gpu", False),
        ("only_replayed", "", "run_validation(post-repair)", True),
    ]
    assert rows[1]["reason"] == "budget spent" and rows[2]["gpu_uuid"] == "GPU-1"


def test_the_same_actions_at_other_steps_are_the_same_decisions():
    """A ladder that skips a rung reaches the same reboot at an earlier step: only the skipped part differs."""
    recorded = [
        _d(actions.ResetGpu(ticket_id="t", step=0, node_id="n", gpu_uuid="GPU-1"), 1),
        _d(actions.RebootNode(ticket_id="t", step=1, node_id="n"), 2),
        _d(actions.Release(ticket_id="t", step=2, node_id="n"), 3),
    ]
    replayed = [
        _d(actions.RebootNode(ticket_id="t", step=0, node_id="n"), 1),
        _d(actions.Release(ticket_id="t", step=1, node_id="n"), 2),
    ]
    rows = replay.diff(recorded, replayed, started_unix_ns=T0)
    assert [(r["change"], r["recorded_action"], r["replayed_action"]) for r in rows] == [
        ("only_recorded", "reset_gpu", ""),
    ]


def test_a_release_of_the_node_is_not_a_release_of_the_gpu():
    rec = [_d(actions.Release(ticket_id="t", step=0, node_id="n", gpu_uuid="GPU-1"), 1)]
    rep = [_d(actions.Release(ticket_id="t", step=0, node_id="n"), 1)]
    rows = replay.diff(rec, rep, started_unix_ns=T0)
    assert [(r["recorded_action"], r["replayed_action"]) for r in rows] == [("release(gpu)", "release(node)")]


def test_a_policy_file_overrides_only_what_it_names(tmp_path):
    recorded = policy_mod.RemediationPolicy.from_mapping({"disruption": {"max_disrupted_nodes_pct": 50.0}})
    path = tmp_path / "p.toml"
    path.write_text("[remediation.escalation]\nmax_attempts_reset_gpu = 0\n[quarantine]\nadapter = 'record'\n")
    merged = replay.overlay_policy(recorded, replay.load_policy_overrides(path))
    assert merged.escalation.max_attempts_reset_gpu == 0
    assert merged.disruption.max_disrupted_nodes_pct == 50.0


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[quarantine]\nadapter = 'record'\n", "no \\[remediation\\] table"),
        ("[remediation.escalaton]\n", "remediation.escalaton: unknown setting"),
        ("[remediation\n", "p.toml"),
    ],
)
def test_a_bad_policy_file_is_refused_by_name(tmp_path, text, message):
    path = tmp_path / "p.toml"
    path.write_text(text)
    with pytest.raises(replay.PolicyFileError, match=message):
        replay.load_policy_overrides(path)
