"""Action values: deterministic idempotency keys and lossless dicts."""

from __future__ import annotations

import json
import uuid

import hypothesis
import pytest

from rasd.controller.core.remediation import actions

EXAMPLES = [
    actions.RestartProcess(ticket_id="t", step=0, node_id="n1", gpu_uuid="GPU-1", grace_s=5.0),
    actions.ResetGpu(ticket_id="t", step=1, node_id="n1", gpu_uuid="GPU-1"),
    actions.RebootNode(ticket_id="t", step=2, node_id="n1", reason="why"),
    actions.PowerCycleBmc(ticket_id="t", step=3, node_id="n1"),
    actions.QuarantineGpu(ticket_id="t", step=4, node_id="n1", gpu_uuid="GPU-1"),
    actions.QuarantineNode(ticket_id="t", step=5, node_id="n1"),
    actions.QuarantinePort(ticket_id="t", step=6, node_id="n1", ib_port="mlx5_0/1"),
    actions.Release(ticket_id="t", step=7, node_id="n1", gpu_uuid="GPU-1", forced=True),
    actions.RunValidation(
        ticket_id="t", step=8, node_id="n1", suite="post-repair", exclude_gpu_uuids=("GPU-2",), seed=3
    ),
    actions.OpenRma(ticket_id="t", step=9, node_id="n1", gpu_uuid="GPU-1", evidence=("a", "b")),
    actions.Notify(ticket_id="t", step=10, node_id="n1", severity="error", summary="s"),
    actions.DrainNode(ticket_id="t", step=11, node_id="n1", pods="all", deadline_s=30.0, repair_kind="reboot_node"),
]


@pytest.mark.parametrize("action", EXAMPLES, ids=lambda a: a.kind)
def test_actions_round_trip_through_json(action):
    assert actions.from_dict(json.loads(json.dumps(action.to_dict()))) == action


def test_every_action_type_has_an_example_and_a_unique_kind():
    assert {a.kind for a in EXAMPLES} == set(actions.ACTION_TYPES)


def test_command_ids_are_uuids_derived_from_ticket_step_and_kind():
    a = actions.ResetGpu(ticket_id="n1/GPU-1/xid:95/7@1", step=1, node_id="n1", gpu_uuid="GPU-1")
    same = actions.ResetGpu(ticket_id="n1/GPU-1/xid:95/7@1", step=1, node_id="n1", gpu_uuid="GPU-1", reason="other")
    assert a.command_id == same.command_id
    assert uuid.UUID(a.command_id).version == 5
    assert a.key == "n1/GPU-1/xid:95/7@1/1/reset_gpu"
    ids = {x.command_id for x in EXAMPLES}
    assert len(ids) == len(EXAMPLES)
    assert actions.command_id_for("t", 1, "reset_gpu") != actions.command_id_for("t", 2, "reset_gpu")


def test_disruption_flags():
    assert {a.kind for a in EXAMPLES if a.node_disruptive} == {"reboot_node", "power_cycle_bmc", "quarantine_node"}
    assert {a.kind for a in EXAMPLES if a.gpu_disruptive} == {"restart_process", "reset_gpu"}


def test_unknown_kinds_are_rejected():
    with pytest.raises(ValueError, match="unknown action kind"):
        actions.from_dict({"kind": "format_disk", "ticket_id": "t", "step": 0, "node_id": "n"})


def test_validation_seeds_are_deterministic_and_non_negative():
    assert actions.seed_for("t", 3) == actions.seed_for("t", 3) >= 0
    assert actions.seed_for("t", 3) != actions.seed_for("t", 4)


@hypothesis.given(
    ticket_id=hypothesis.strategies.text(max_size=120),
    step=hypothesis.strategies.integers(min_value=0, max_value=10**9),
    kind=hypothesis.strategies.sampled_from(["restart_process", "reset_gpu", "reboot_node", "run_validation"]),
)
def test_command_ids_are_exactly_uuid5_of_the_key(ticket_id, step, kind):
    """The hand-written uuid5 must give the ids earlier releases stored: a restart re-sends by them."""
    expected = str(uuid.uuid5(uuid.UUID("6f1d3c2e-6a8b-5b1e-9a57-7261736400c1"), f"{ticket_id}/{step}/{kind}"))
    assert actions.command_id_for(ticket_id, step, kind) == expected
