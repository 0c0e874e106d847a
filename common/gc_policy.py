"""The cyclic garbage collector's settings for rasd's long-running daemons, and when it runs.

The controller keeps a large, long-lived heap: every node's ladder state, the open incidents, the
fleet's labels, SQLAlchemy's compiled statements. rasd's state is made of frozen dataclasses, tuples
and dicts that reference counting frees on its own; the collector is only there for the rare cycle.
Its pauses are what matter: a collection stops the event loop, and every event waiting for a decision
waits for it too. A young collection walks every object that survived since the last one; in a burst
the decider keeps tens of thousands of new objects a second (new incidents, tickets, in-flight calls),
so the collector must run for milliseconds every second whatever the thresholds; only where its
pauses land can be chosen.

- `configure()`: CPython's automatic collections become a backstop (`GEN0_THRESHOLD` young objects).
- `QuietCollector`: collects when the decider is quiet (nothing waits for a decision), as soon as
  `QUIET_MIN_YOUNG` young objects are worth it. Under a steady load it finds the gaps between events
  (several short collections instead of one long pause inside a decision pass); in a burst it waits
  for the burst to end, so no decision waits for it. The older
  generations follow CPython's own rules (`due_generation`), in quiet moments too. Only a burst longer
  than the backstop's reach (`GEN0_THRESHOLD` young objects) meets an automatic collection, labelled
  ``threshold`` in ``rasd_gc_pause_seconds``. Collecting between passes in a burst, so that the
  backstop's single pause would come as ten short ones, raised the burst's p99 instead: the young
  objects a pause walks early are partly ones reference counting would have freed.
- Full collections walk only what is new: after each, `QuietCollector` freezes what survived
  (`gc.freeze()`), so the next one walks the objects promoted since, not the whole long-lived heap
  (every node's stream, session and views). A frozen object that later becomes cyclic garbage is
  not collected until a thaw: once the frozen heap grew by `THAW_GROWTH` since the last thaw, a
  full collection unfreezes everything first (one walk of the whole heap, then frozen again). So
  the frozen heap, live or cyclic garbage, stays within 1 + `THAW_GROWTH` times what the last thaw
  left: nothing leaks without bound. `old_collection` decides, from counts passed in.
- `freeze_startup_heap()`: after start-up has loaded the durable state, one collection and then
  `gc.freeze()`: what start-up built (modules, compiled statements, the loaded state) moves to the
  permanent generation, which no later collection walks. Call it once, after loading.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import gc
import time
from collections.abc import Callable
from typing import Any

GEN0_THRESHOLD = 100_000
"""Net allocations before CPython collects on its own (its default: 700). A backstop: the quiet
collector runs first whenever the decider leaves it a moment."""
GEN1_THRESHOLD = 10
"""Young collections between middle-generation ones (CPython's default)."""
GEN2_THRESHOLD = 10
"""Middle collections between full ones (CPython's default); a full one also waits until the old
generation grew by `OLD_GROWTH` since the last (CPython's rule, which `QuietCollector` keeps too)."""
QUIET_MIN_YOUNG = 10_000
"""Young objects before a quiet collection is worth its pause (~7 ms on a 2-core VM)."""
OLD_GROWTH = 0.25
"""A full collection only once the old generation holds this share of the long-lived (frozen) heap (CPython's
25 %: its rule compares what was promoted since the last full collection with what survived it)."""
THAW_GROWTH = 0.5
"""A full collection thaws the frozen heap first once that grew by this share since the last thaw: what bounds
the cyclic garbage that can wait among frozen objects."""
QUIET_CHECK_S = 0.05
"""How often `QuietCollector` looks for a quiet moment (and reports the pauses timed meanwhile)."""
MAX_UNREPORTED_PAUSES = 10_000
"""Pauses kept for the next report; older ones are dropped (the loop stalled for that long)."""


def configure() -> None:
    """Set the daemon's collection thresholds (call once, early in main)."""
    gc.set_threshold(GEN0_THRESHOLD, GEN1_THRESHOLD, GEN2_THRESHOLD)


def freeze_startup_heap() -> None:
    """Collect once, then move every surviving object out of reach of later collections.

    For what start-up built and keeps for the life of the process; later garbage is collected as
    before. Calling it again freezes what was built since, so call it at start-up only:
    `QuietCollector` freezes after its full collections itself, and thaws to bound what stays frozen.
    """
    gc.collect()
    gc.freeze()


def due_generation(
    counts: tuple[int, int, int],
    *,
    min_young: int = QUIET_MIN_YOUNG,
    middle_every: int = GEN1_THRESHOLD,
    old_every: int = GEN2_THRESHOLD,
) -> int | None:
    """The generation a quiet moment should collect, or None when no collection is worth it yet. Pure.

    counts is `gc.get_count()`: young objects since the last young collection, young collections
    since the last middle one, middle collections since the last full one. As CPython does, the
    oldest generation whose count reached its threshold is collected (with the younger ones); a full
    collection is only a candidate here: `QuietCollector` also checks the old generation's growth.

    Examples: (12_000, 3, 0) → 0; (12_000, 10, 2) → 1; (12_000, 10, 10) → 2; (900, 10, 10) → None.
    """
    young, young_runs, middle_runs = counts
    if young < min_young:
        return None
    if middle_runs >= old_every:
        return 2
    if young_runs >= middle_every:
        return 1
    return 0


def old_collection(old_objects: int, frozen_objects: int, frozen_after_thaw: int) -> str | None:
    """What a due full collection should do: None (skip it), ``"full"`` or ``"thaw"``. Pure.

    old_objects: the old generation's objects (promoted since the last full collection, which froze
    the rest); frozen_objects: the frozen heap now; frozen_after_thaw: the frozen heap the last thaw
    left. A full collection waits until the old generation holds `OLD_GROWTH` of the frozen heap; it
    thaws first (walks everything, so frozen cycles are collected) once the heap, frozen and old
    together, grew by `THAW_GROWTH` since the last thaw.

    Examples: (10_000, 100_000, 100_000) → None; (30_000, 100_000, 100_000) → "full";
    (40_000, 130_000, 100_000) → "thaw"; (5, 0, 0) → "thaw" (nothing frozen: an ordinary full one).
    """
    if old_objects <= frozen_objects * OLD_GROWTH:
        return None
    if frozen_objects + old_objects > frozen_after_thaw * (1 + THAW_GROWTH):
        return "thaw"
    return "full"


class QuietCollector:
    """Runs the collector in the decider's quiet moments, and times every pause of the process.

    `quiet()` says whether nothing waits for a decision now (`RemediationService.quiet`).
    `observe(generation, trigger, seconds)` hears of every collection of the process, on the event
    loop at the next check (`report_pauses`): trigger ``quiet`` for this collector's, ``threshold``
    for any other (CPython's automatic ones, which can land inside a decision pass, and explicit
    ones such as start-up's).
    """

    def __init__(
        self,
        quiet: Callable[[], bool],
        *,
        observe: Callable[[int, str, float], None] | None = None,
        min_young: int = QUIET_MIN_YOUNG,
        check_s: float = QUIET_CHECK_S,
    ) -> None:
        """Nothing runs until `start()` (or a call of `collect_if_quiet`)."""
        self._quiet = quiet
        self._observe = observe
        self._min_young = min_young
        self._check_s = check_s
        self._ours = False
        self._started_at = 0.0
        self._frozen: int | None = None
        """The frozen heap after this collector's last full collection (None: none yet; then what is frozen)."""
        self._frozen_after_thaw = 0
        """The frozen heap after this collector's last thaw (`old_collection`)."""
        self._pauses: collections.deque[tuple[int, str, float]] = collections.deque(maxlen=MAX_UNREPORTED_PAUSES)
        """Pauses timed and not yet handed to observe (generation, trigger, seconds)."""
        self._task: asyncio.Task[None] | None = None
        self.collections = [0, 0, 0]
        """This collector's collections by generation."""
        self.thaws = 0
        """This collector's full collections that unfroze the frozen heap first."""

    def start(self) -> None:
        """Watch every collection and start looking for quiet moments (inside the event loop)."""
        gc.callbacks.append(self._timed)
        self._task = asyncio.create_task(self._run(), name="rasd-quiet-gc")

    async def stop(self) -> None:
        """Stop looking and stop watching (the pauses timed so far are reported); unfreeze what it froze.

        Unfrozen so that a process that goes on without this collector (a test run, a restart in
        place) collects its cycles again; start-up's frozen heap is unfrozen with it.
        """
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        if self._frozen is not None and self.collections[2]:
            gc.unfreeze()
            self._frozen = None
        if self._timed in gc.callbacks:
            gc.callbacks.remove(self._timed)
        self.report_pauses()

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._check_s)
            self.report_pauses()
            self.collect_if_quiet()

    def report_pauses(self) -> None:
        """Hand the pauses timed since the last call to `observe` (outside any collection).

        Not from the gc callback itself: a callback runs wherever an allocation started the
        collection, possibly inside a lock that observing needs (prometheus_client copies a
        metric's children under its lock while a scrape reads it): it would wait on itself.
        """
        while self._pauses:
            generation, trigger, seconds = self._pauses.popleft()
            if self._observe is not None:
                with contextlib.suppress(Exception):  # a metric's failure must not stop the collector
                    self._observe(generation, trigger, seconds)

    def collect_if_quiet(self) -> int | None:
        """Collect now if the decider is quiet and a collection is due; the generation collected, or None."""
        if not self._quiet():
            return None
        generation = due_generation(gc.get_count(), min_young=self._min_young)
        if generation is None:
            return None
        plan = self._old_plan() if generation == 2 else None
        if generation == 2 and plan is None:
            generation = 1
        self._ours = True
        try:
            if plan == "thaw":
                gc.unfreeze()  # the frozen heap back into the old generation: this collection walks it all
            gc.collect(generation)
            if plan is not None:
                gc.freeze()  # what survived stays out of later walks until the next thaw
        finally:
            self._ours = False
        if plan is not None:
            self._frozen = gc.get_freeze_count()
            if plan == "thaw":
                self._frozen_after_thaw = self._frozen
                self.thaws += 1
        self.collections[generation] += 1
        return generation

    def _old_plan(self) -> str | None:
        """`old_collection` for this process now (listing the old generation walks only what is not frozen)."""
        if self._frozen is None:
            self._frozen = self._frozen_after_thaw = gc.get_freeze_count()
        return old_collection(len(gc.get_objects(generation=2)), self._frozen, self._frozen_after_thaw)

    def _timed(self, phase: str, info: dict[str, Any]) -> None:
        # Takes no lock and calls nothing that could (`report_pauses` says why); never raises.
        if phase == "start":
            self._started_at = time.perf_counter()
        elif self._started_at:
            seconds = time.perf_counter() - self._started_at
            self._started_at = 0.0
            self._pauses.append((int(info["generation"]), "quiet" if self._ours else "threshold", seconds))
