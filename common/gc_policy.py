"""The cyclic garbage collector's settings for rasd's long-running daemons.

The controller keeps a large, long-lived heap: every node's ladder state, the open incidents, the
fleet's labels, SQLAlchemy's compiled statements. CPython's default thresholds (700, 10, 10) run a
young collection every 700 net allocations and, every 100 of those, a full one that walks that whole
heap. Measured in bench/remediation.py (2,000 nodes, a 2,000 events/s burst on SQLite): ~1,200
collections took 2.4 s of the run, and the longest single pause was 313 ms: a full collection that
lands in a decision pass adds all of it to every waiting event's latency. rasd's state is made of
frozen dataclasses, tuples and dicts that reference counting frees on its own; the collector is only
there for the rare cycle, so collecting less often costs little memory.

- `configure()`: young collections every `GEN0_THRESHOLD` allocations, older ones rarer.
- `freeze_startup_heap()`: after start-up has loaded the durable state, one collection and then
  `gc.freeze()`: what start-up built (modules, compiled statements, the loaded state) moves to the
  permanent generation, which no later collection walks. Call it once, after loading.

With both, the same burst ran ~220 collections totalling ~0.55 s, longest ~0.1 s (the explicit one at
start-up). Cycles are still collected, only less often.
"""

from __future__ import annotations

import gc

GEN0_THRESHOLD = 50_000
"""Net allocations between young collections (CPython's default: 700)."""
GEN1_THRESHOLD = 50
"""Young collections between middle-generation ones (default 10)."""
GEN2_THRESHOLD = 100
"""Middle collections between full ones (default 10); CPython also waits until the objects that
survived since the last full one are 25 % of the long-lived heap."""


def configure() -> None:
    """Set the daemon's collection thresholds (call once, early in main)."""
    gc.set_threshold(GEN0_THRESHOLD, GEN1_THRESHOLD, GEN2_THRESHOLD)


def freeze_startup_heap() -> None:
    """Collect once, then move every surviving object out of reach of later collections.

    For what start-up built and keeps for the life of the process; later garbage is collected as
    before. Calling it again freezes what was built since, so call it at start-up only.
    """
    gc.collect()
    gc.freeze()
