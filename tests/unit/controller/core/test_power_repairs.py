"""Which repairs the power period counts at their GPUs' default limits, when they leave, when they stop counting."""

from __future__ import annotations

import dataclasses

import pytest

from rasd.controller.core.power import repairs
from rasd.controller.store import remediation as rstore

NOW = 1_800_000_000.0


def _reset(**changes) -> repairs.Repair:
    repair = repairs.repair_for(
        "reset_gpu", command_id="c-reset", node_id="n", gpu_uuid="g1", node_gpus=("g0", "g1"), boot_id="b1", now_s=NOW
    )
    assert repair is not None
    return dataclasses.replace(repair, **changes)


def _reboot(**changes) -> repairs.Repair:
    repair = repairs.repair_for(
        "reboot_node", command_id="c-reboot", node_id="n", gpu_uuid="", node_gpus=("g0", "g1"), boot_id="b1", now_s=NOW
    )
    assert repair is not None
    return dataclasses.replace(repair, **changes)


def test_a_reset_counts_its_gpu_and_a_reboot_every_gpu_of_its_node():
    assert _reset().gpu_uuids == {"g1"} and _reboot().gpu_uuids == {"g0", "g1"}
    assert repairs.counted([_reset(), _reboot()]) == {"g0", "g1"}


@pytest.mark.parametrize("kind", ["restart_process", "run_validation", "quarantine_gpu", "power_cycle_bmc"])
def test_other_commands_leave_limits_alone(kind):
    assert repairs.repair_for(kind, command_id="c", node_id="n", gpu_uuid="g", node_gpus=("g",), boot_id="",
                              now_s=NOW) is None  # fmt: skip


def test_the_store_and_the_core_agree_on_which_statuses_are_final():
    assert repairs.FINAL_STATUSES == rstore.FINAL_STATUSES


def test_a_repair_leaves_once_a_period_that_counted_it_found_the_budget_holding():
    held = [_reset(), _reboot()]
    assert repairs.due(held, {"c-reset", "c-reboot"}, over_budget=True, now_s=NOW + 1, wait_s=10) == ((), ())
    # Handed over after the period gathered its inputs: that period did not count it.
    assert repairs.due(held, {"c-reset"}, over_budget=False, now_s=NOW + 1, wait_s=10) == (("c-reset",), ())
    assert repairs.due([_reset(sent=True)], {"c-reset"}, over_budget=False, now_s=NOW + 1, wait_s=10) == ((), ())


def test_a_repair_that_finds_no_room_leaves_after_the_wait():
    assert repairs.due([_reset()], {"c-reset"}, over_budget=True, now_s=NOW + 10, wait_s=10) == ((), ("c-reset",))


def _settle(repair: repairs.Repair, status: str | None, *, boot_id="b1", quarantined=("n",)) -> bool:
    """Whether the repair is still counted."""
    statuses = {} if status is None else {repair.command_id: status}
    kept = repairs.settle([repair], statuses=statuses, boot_ids={"n": boot_id}, quarantined_nodes=quarantined)
    return bool(kept)


@pytest.mark.parametrize(
    ("repair", "status", "boot_id", "quarantined", "counted"),
    [
        (_reset(), None, "b1", ("n",), True),  # not sent yet: always counted
        (_reset(sent=True), "dispatched", "b1", ("n",), True),
        (_reset(sent=True), "succeeded", "b1", ("n",), False),  # the agent put the cap back before answering
        (_reset(sent=True), "refused", "b1", ("n",), False),
        (_reboot(sent=True), "dispatched", "b1", ("n",), True),
        (_reboot(sent=True), "succeeded", "b1", ("n",), True),  # "reboot started": the node may not be back yet
        (_reboot(sent=True), "succeeded", "b2", ("n",), False),  # back under a new boot id: the period forgets it
        (_reboot(sent=True), "dispatched", "b2", ("n",), False),
        (_reboot(sent=True), "succeeded", "b1", (), False),  # validated after its reboot and released
        (_reboot(sent=True), "failed", "b1", ("n",), False),  # no reboot happened
        (_reboot(sent=True), "dry_run", "b1", ("n",), False),
    ],
)
def test_what_settles_a_repair(repair, status, boot_id, quarantined, counted):
    assert _settle(repair, status, boot_id=boot_id, quarantined=quarantined) is counted


def test_a_sent_repair_without_an_outbox_row_has_nothing_to_wait_on():
    kept = repairs.settle([_reset(sent=True)], statuses={}, boot_ids={}, quarantined_nodes=())
    assert kept == ()
