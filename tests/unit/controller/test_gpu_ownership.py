"""A GPU changes node only on evidence that it moved, never by another node's claim (issue #37 item 11)."""

from __future__ import annotations

import pytest

from rasd.controller.core import fleet
from rasd.controller.store import repo

A = "GPU-0000000a-0000-4000-8000-00000000000a"
B = "GPU-0000000b-0000-4000-8000-00000000000b"
C = "GPU-0000000c-0000-4000-8000-00000000000c"


def _hello(node_id, *gpus):
    records = tuple(fleet.GpuRecord(g, "H100", f"0000:{i:02x}:00.0", 200, 700, 700, node_id=node_id)
                    for i, g in enumerate(gpus))  # fmt: skip
    return fleet.NodeHello(node_id, "boot", "0.1.0", node_id, "simulated", {}, records, 0, "")


def _owners(store):
    return {gpu.record.uuid: node.node_id for node in store.list_nodes() for gpu in node.gpus}


def test_an_offline_nodes_gpus_cannot_be_claimed_by_another_nodes_hello(store):
    store.register_hello(_hello("victim", A, B), 100, certified=True)
    store.mark_disconnected("victim", 110)
    with pytest.raises(repo.GpuClaimRefused) as refused:
        store.register_hello(_hello("claimant", C, A), 200, certified=True)
    assert (refused.value.field, refused.value.gpu_uuid, refused.value.owner) == ("hello.gpus[1].uuid", A, "victim")
    assert "claimant" not in {n.node_id for n in store.list_nodes()}  # nothing of the refused Hello
    assert _owners(store) == {A: "victim", B: "victim"}
    assert store.register_hello(_hello("victim", A, B), 300, certified=True).acked_seq == 0  # the owner is welcome back


def test_a_gpu_moves_once_its_node_no_longer_lists_it(store):
    store.register_hello(_hello("old", A, B), 100, certified=True)
    store.register_hello(_hello("old", B), 200, certified=True)  # A was taken out of "old"
    store.register_hello(_hello("new", A), 300, certified=True)
    assert _owners(store) == {A: "new", B: "old"}
    with pytest.raises(repo.GpuClaimRefused):  # and "old" cannot take it back by naming it
        store.register_hello(_hello("old", A, B), 400, certified=True)


def test_an_operator_can_say_a_gpu_moved(store):
    store.register_hello(_hello("old", A), 100, certified=True)
    store.mark_disconnected("old", 110)
    assert not store.forget_gpu_owner(A, "new")  # not new's
    assert store.forget_gpu_owner(A, "old")
    assert not store.forget_gpu_owner(C, "old")
    store.register_hello(_hello("new", A), 200, certified=True)
    assert _owners(store) == {A: "new"}


def test_in_one_group_a_claim_is_refused_alone(store):
    outcomes = store.register_hellos(
        [(_hello("first", A), 1, True), (_hello("second", A, B), 2, True), (_hello("third", C), 3, True),
         (_hello("first", B), 4, True)]
    )  # fmt: skip
    assert isinstance(outcomes[1], repo.GpuClaimRefused) and outcomes[1].owner == "first"
    assert all(isinstance(o, repo.HelloOutcome) for o in (outcomes[0], outcomes[2], outcomes[3]))
    # "first" left A out of its second Hello: A is no longer listed, B is now first's.
    assert _owners(store) == {A: "first", B: "first", C: "third"}
    store.register_hello(_hello("second", A), 5, certified=True)
    assert _owners(store)[A] == "second"


def test_without_a_certificate_a_hello_is_not_held_to_the_rule(store):
    """A plaintext Hello may name any node, the owner itself included: refusing its claims protects nothing."""
    store.register_hello(_hello("old", A), 100, certified=True)
    store.register_hello(_hello("new", A), 200)
    assert _owners(store) == {A: "new"}
