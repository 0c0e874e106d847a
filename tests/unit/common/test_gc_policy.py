"""rasd.common.gc_policy: the daemons' collector thresholds and the frozen start-up heap."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from rasd.common import gc_policy


@pytest.fixture
def restore_gc() -> Iterator[None]:
    """Leave the test process's collector as it was found."""
    thresholds = gc.get_threshold()
    try:
        yield
    finally:
        gc.unfreeze()
        gc.set_threshold(*thresholds)


def test_configure_sets_the_daemon_thresholds(restore_gc: None) -> None:
    gc_policy.configure()
    assert gc.get_threshold() == (gc_policy.GEN0_THRESHOLD, gc_policy.GEN1_THRESHOLD, gc_policy.GEN2_THRESHOLD)
    assert gc.isenabled()  # rarer, never off: cycles are still collected


def test_freeze_moves_the_start_up_heap_out_of_later_collections(restore_gc: None) -> None:
    gc.unfreeze()
    kept = [{"node": i, "tickets": [i]} for i in range(1_000)]  # the loaded state start-up keeps
    gc_policy.freeze_startup_heap()
    frozen = gc.get_freeze_count()
    assert frozen >= len(kept)
    assert gc.get_count()[0] < 100  # the collection before the freeze left the young generation empty


def test_a_cycle_made_after_the_freeze_is_still_collected(restore_gc: None) -> None:
    gc_policy.configure()
    gc_policy.freeze_startup_heap()

    class Node:
        peer: object = None

    a, b = Node(), Node()
    a.peer, b.peer = b, a
    del a, b
    assert gc.collect() >= 2
