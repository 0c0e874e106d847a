"""rasd.common.gc_policy: the daemons' collector thresholds, the frozen start-up heap, and the quiet collector."""

from __future__ import annotations

import asyncio
import gc
import threading
import weakref
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


@pytest.fixture
def manual_gc(restore_gc: None) -> Iterator[None]:
    """Automatic collections off, so that only the test's own collections move the counts."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


class _Box:
    """A container object that CPython allocates afresh every time (lists and dicts come from free lists,
    which the collector's allocation count does not see)."""

    __slots__ = ("value",)

    def __init__(self, value: int) -> None:
        self.value = value


def _young(count: int) -> list[_Box]:
    """count new container objects, alive while the caller keeps the list."""
    return [_Box(i) for i in range(count)]


@pytest.mark.parametrize(
    ("counts", "due"),
    [
        ((900, 10, 10), None),  # not enough young objects for any collection to be worth its pause
        ((12_000, 0, 0), 0),
        ((12_000, 9, 9), 0),
        ((12_000, 10, 2), 1),  # ten young collections since the last middle one
        ((12_000, 10, 10), 2),  # ten middle ones since the last full one (growth is the collector's check)
        ((12_000, 3, 10), 2),
    ],
)
def test_due_generation_follows_cpythons_order(counts: tuple[int, int, int], due: int | None) -> None:
    assert gc_policy.due_generation(counts, min_young=10_000, middle_every=10, old_every=10) == due


def test_configure_makes_cpythons_own_collections_a_backstop(restore_gc: None) -> None:
    gc_policy.configure()
    assert gc.get_threshold()[0] == gc_policy.GEN0_THRESHOLD
    assert gc_policy.GEN0_THRESHOLD > 5 * gc_policy.QUIET_MIN_YOUNG  # the quiet collector runs first


def test_nothing_is_collected_while_a_decision_waits(manual_gc: None) -> None:
    collector = gc_policy.QuietCollector(lambda: False, min_young=100)
    kept = _young(500)
    assert collector.collect_if_quiet() is None
    assert gc.get_count()[0] >= len(kept)  # the young generation was not walked
    assert collector.collections == [0, 0, 0]


def test_a_quiet_moment_collects_the_young_generation_and_its_cycles(manual_gc: None) -> None:
    collector = gc_policy.QuietCollector(lambda: True, min_young=100)
    assert collector.collect_if_quiet() is None  # nothing worth a pause yet

    class Node:
        peer: object = None

    a, b = Node(), Node()
    a.peer, b.peer = b, a
    watch = weakref.ref(a)
    del a, b
    kept = _young(200)
    assert collector.collect_if_quiet() == 0
    assert watch() is None  # the cycle is gone
    assert gc.get_count()[0] < 10
    assert collector.collections == [1, 0, 0]
    assert len(kept) == 200


@pytest.mark.parametrize(
    ("old", "frozen", "frozen_after_thaw", "plan"),
    [
        (10_000, 100_000, 100_000, None),  # the old generation is under a quarter of the frozen heap
        (25_000, 100_000, 100_000, None),
        (30_000, 100_000, 100_000, "full"),  # walks the 30,000, freezes the survivors
        (40_000, 130_000, 100_000, "thaw"),  # 170,000 > 1.5 × 100,000: walk everything once
        (60_000, 100_000, 100_000, "thaw"),
        (5, 0, 0, "thaw"),  # nothing frozen yet: an ordinary full collection (then frozen)
        (0, 0, 0, None),
    ],
)
def test_old_collection_waits_for_growth_and_thaws_past_its_bound(
    old: int, frozen: int, frozen_after_thaw: int, plan: str | None
) -> None:
    assert gc_policy.old_collection(old, frozen, frozen_after_thaw) == plan


def test_older_generations_follow_in_quiet_moments_and_a_full_one_freezes_its_survivors(manual_gc: None) -> None:
    gc.unfreeze()
    collector = gc_policy.QuietCollector(lambda: True, min_young=50)
    generations = []
    kept = []
    for _ in range(gc_policy.GEN1_THRESHOLD * gc_policy.GEN2_THRESHOLD + gc_policy.GEN1_THRESHOLD + 1):
        kept.append(_young(60))  # survivors: the old generation grows
        generations.append(collector.collect_if_quiet())
    assert None not in generations
    # Every eleventh is a middle collection (ten young ones since the last), as CPython orders them.
    assert generations[: gc_policy.GEN1_THRESHOLD + 1] == [0] * gc_policy.GEN1_THRESHOLD + [1]
    # After ten middle ones a full one (nothing was frozen: it thaws nothing and freezes the survivors).
    assert generations[-1] == 2
    assert generations.count(2) == 1
    assert generations.count(1) == gc_policy.GEN2_THRESHOLD
    assert collector.collections == [generations.count(0), gc_policy.GEN2_THRESHOLD, 1]
    assert gc.get_freeze_count() >= sum(len(k) for k in kept)
    assert gc.get_objects(generation=2) == []  # the next full collection walks only what comes after


def test_a_full_collection_is_skipped_while_the_old_generation_is_small_beside_the_frozen_heap(
    manual_gc: None,
) -> None:
    collector = gc_policy.QuietCollector(lambda: True, min_young=50)
    ballast = _young(20_000)  # a large long-lived heap
    gc_policy.freeze_startup_heap()
    generations = []
    for _ in range(gc_policy.GEN1_THRESHOLD * gc_policy.GEN2_THRESHOLD + gc_policy.GEN1_THRESHOLD + 5):
        garbage = _young(60)  # dies before the collection: nothing is promoted
        del garbage
        junk = _young(60)
        generations.append(collector.collect_if_quiet())
        del junk
    assert 2 not in generations  # due by the counts, but the old generation is no quarter of the frozen heap
    assert generations.count(1) >= gc_policy.GEN2_THRESHOLD
    assert len(ballast) == 20_000


def _full(collector: gc_policy.QuietCollector, survivors: list[list[_Box]], per_round: int = 60) -> int:
    """Quiet collections until the collector runs a full one; the survivors are kept in `survivors`."""
    for _ in range(10_000):
        survivors.append(_young(per_round))
        if collector.collect_if_quiet() == 2:
            return collector.thaws
    raise AssertionError("no full collection")


class _Peer:
    peer: object = None


def test_a_cycle_made_after_the_collector_froze_the_heap_is_still_collected(manual_gc: None) -> None:
    gc.unfreeze()
    collector = gc_policy.QuietCollector(lambda: True, min_young=50)
    kept: list[list[_Box]] = []
    _full(collector, kept)
    assert gc.get_freeze_count() > 0
    a, b = _Peer(), _Peer()
    a.peer, b.peer = b, a
    watch = weakref.ref(a)
    del a, b
    kept.append(_young(100))
    assert collector.collect_if_quiet() == 0  # a young collection: the frozen heap is not walked
    assert watch() is None


def test_a_frozen_cycle_that_became_garbage_is_collected_at_the_next_thaw(manual_gc: None) -> None:
    gc.unfreeze()
    collector = gc_policy.QuietCollector(lambda: True, min_young=50)
    kept: list[list[_Box]] = []
    a, b = _Peer(), _Peer()  # a node's session: alive, so a full collection freezes it
    a.peer, b.peer = b, a
    watch = weakref.ref(a)
    thaws = _full(collector, kept)
    assert gc.get_freeze_count() > 0
    del a, b  # the node left: its cycle is garbage, but frozen
    assert watch() is not None
    while collector.thaws == thaws:  # the heap grows: full collections, then (past THAW_GROWTH) a thaw
        assert watch() is not None  # the full collections before it walk only what is not frozen
        _full(collector, kept)
    assert watch() is None
    assert gc.get_objects(generation=2) == []  # frozen again after the thaw


def test_every_pause_is_timed_with_its_trigger(manual_gc: None) -> None:
    seen: list[tuple[int, str, float]] = []
    quiet = [False]

    async def scenario() -> gc_policy.QuietCollector:
        collector = gc_policy.QuietCollector(
            lambda: quiet[0], observe=lambda g, trigger, s: seen.append((g, trigger, s)), min_young=100, check_s=0.005
        )
        collector.start()
        try:
            kept = _young(300)
            await asyncio.sleep(0.03)
            assert seen == []  # a decision "waited" all along
            quiet[0] = True
            await asyncio.sleep(0.05)  # the loop finds the quiet moment
            gc.collect(1)  # anyone else's collection
            assert len(kept) == 300
        finally:
            await collector.stop()
        return collector

    collector = asyncio.run(scenario())
    assert collector.collections[0] >= 1
    assert seen[0][:2] == (0, "quiet")
    assert seen[-1][:2] == (1, "threshold")
    assert all(seconds >= 0 for _g, _t, seconds in seen)
    count = len(seen)
    gc.collect()
    assert len(seen) == count  # stopped: no longer watching


def test_a_pause_is_reported_outside_the_collection_that_made_it(manual_gc: None) -> None:
    """A collection starts wherever an allocation tips the count, possibly inside a lock that observing
    needs (prometheus_client copies a metric's children under its lock while a scrape reads it): the
    callback only notes the pause; `observe` runs later, on the loop."""
    lock = threading.Lock()
    could_lock: list[bool] = []

    def observe(_generation: int, _trigger: str, _seconds: float) -> None:
        acquired = lock.acquire(blocking=False)
        could_lock.append(acquired)
        if acquired:
            lock.release()

    async def scenario() -> None:
        collector = gc_policy.QuietCollector(lambda: False, observe=observe, check_s=3600)
        collector.start()
        try:
            with lock:
                gc.collect()  # as if the scrape thread's allocation had started it
                assert could_lock == []  # nothing observed inside the collection
            collector.report_pauses()
        finally:
            await collector.stop()

    asyncio.run(scenario())
    assert could_lock == [True]


def test_stopping_unfreezes_what_the_collector_froze(manual_gc: None) -> None:
    gc.unfreeze()

    async def scenario() -> None:
        collector = gc_policy.QuietCollector(lambda: True, min_young=50, check_s=60)
        collector.start()
        kept: list[list[_Box]] = []
        _full(collector, kept)
        assert gc.get_freeze_count() > 0
        await collector.stop()

    asyncio.run(scenario())
    assert gc.get_freeze_count() == 0  # the process collects its cycles as before
