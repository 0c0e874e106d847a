"""Each replica's aggregate, built from its ingest and shipped to the leader; the leader's read of them all.

The fleet-wide loops (power, SDC sweeps) run on the leader over every node, but telemetry stays on
the replica whose stream received it. This module is that path, through the store
(`store.aggregates`), in three small parts another ingest (a worker process) reuses as they are:

- `build(ingest, reads, replica_id=, now_unix_ns=)`: one replica's `core.aggregates.ReplicaAggregate`
  from its ingest's fleet view (sessions, inventory, `latest`, the power window), over the windows
  the leader asked for;
- `Shipper`: on every replica that does not lead, builds and upserts its aggregate every
  `AggregateReads.interval_s` (half the leader's control period: at least one lands in every
  period), reading in the same transaction what the leader asks for next (windows, tracked GPUs,
  interval), and starts summing the tracked GPUs on their own when asked;
- `FleetReader`: on the leader, reads every other replica's aggregate in one query, drops the ones
  too old to trust (a dead replica's) and merges the rest (`core.aggregates.merge`); the power loop
  also tells the replicas what to ship (`ask`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import structlog

from rasd.controller.core import aggregates, fleet
from rasd.controller.core.power import status as power_status
from rasd.controller.ingest import service as ingest_mod
from rasd.controller.replication import leader as leader_mod
from rasd.controller.store import aggregates as aggregate_store

log = structlog.get_logger("rasd.controller")

IDLE_INTERVAL_S = 5.0
"""How often a replica ships when the leader has not asked (no power loop: the sweeps' idleness)."""


def build(
    ingest: ingest_mod.Ingest, reads: aggregates.AggregateReads, *, replica_id: str, now_unix_ns: int
) -> aggregates.ReplicaAggregate:
    """The aggregate of the streams this ingest holds now, over the windows `reads` asks for.

    Reads the ingest's fleet view only (sessions, `node_gpus`, `gpu_records`, `boot_ids`,
    `node_labels`, `latest`, `latest_controller_ns`, `power_window`), so it holds for any ingest.
    """
    nodes = {
        node_id: aggregates.NodeStream(
            node_id=node_id,
            session_id=session.session_id,
            opened_unix_ns=session.opened_unix_ns,
            boot_id=ingest.boot_ids.get(node_id, ""),
            labels=dict(ingest.node_labels.get(node_id, {})),
            gpu_uuids=ingest.node_gpus(node_id),
            agent_ahead_ns=session.agent_ahead_ns,
        )
        for node_id, session in ingest.sessions.items()
    }
    gpus = [gpu_uuid for stream in nodes.values() for gpu_uuid in stream.gpu_uuids]
    records, latest, controller_ns = ingest.gpu_records, ingest.latest, ingest.latest_controller_ns
    window = ingest.power_window
    draw_peaks = window.gpu_max_w(now_unix_ns - int(reads.draw_window_s * 1e9))
    detect_peaks = window.gpu_max_w(now_unix_ns - int(reads.detect_window_s * 1e9))
    # The detector's window and the status's recent swing, plus one interval of lag.
    series_since = now_unix_ns - int((max(reads.detect_window_s, power_status.RECENT_SWING_S) + reads.interval_s) * 1e9)
    tracked = bool(reads.tracked)
    return aggregates.ReplicaAggregate(
        replica_id=replica_id,
        built_unix_ns=now_unix_ns,
        interval_s=reads.interval_s,
        nodes=nodes,
        records={g: records[g] for g in gpus if g in records},
        latest={g: latest[g] for g in gpus if g in latest},
        latest_controller_ns={g: controller_ns[g] for g in gpus if g in controller_ns},
        draw_window_s=reads.draw_window_s,
        draw_peaks_w={g: draw_peaks[g] for g in gpus if g in draw_peaks},
        detect_window_s=reads.detect_window_s,
        detect_peaks_w={g: detect_peaks[g] for g in gpus if g in detect_peaks},
        bucket_ns=window.bucket_ns,
        series=tuple(window.series(since_unix_ns=series_since)),
        tracked=reads.tracked,
        tracked_series=tuple(window.series(since_unix_ns=series_since, tracked=True)) if tracked else (),
    )


class Shipper:
    """Ships this replica's aggregate to the leader while it does not lead (see the module docstring)."""

    def __init__(
        self,
        ingest: ingest_mod.Ingest,
        store: aggregate_store.AggregateStore,
        leadership: leader_mod.Leadership,
        *,
        defaults: aggregates.AggregateReads,
        clock: Callable[[], int] = time.time_ns,
    ) -> None:
        """Build from ingest, write through store (on the ingest's store thread); defaults until the leader asks."""
        self._ingest = ingest
        self._store = store
        self._leadership = leadership
        self.reads = defaults
        self._clock = clock
        self._task: asyncio.Task[None] | None = None
        self._inventory: tuple[frozenset[tuple[str, str]], bytes] | None = None
        """(the streams, their GPUs' encoded records): encoded again only when the streams change."""
        self.shipped = 0

    async def ship_once(self) -> aggregates.ReplicaAggregate:
        """Build and upsert the aggregate now; take up what the leader asks for next."""
        aggregate = build(self._ingest, self.reads, replica_id=self._leadership.replica_id, now_unix_ns=self._clock())
        streams = frozenset((node_id, s.session_id) for node_id, s in aggregate.nodes.items())
        known = self._inventory[1] if self._inventory is not None and self._inventory[0] == streams else None
        store = self._store

        version = aggregates.write_format(self.reads)  # the newest the leader reads

        def publish() -> tuple[bytes, dict[str, object] | None]:
            records = aggregates.encode_records(aggregate.records) if known is None else known
            payload = aggregates.encode(aggregate, records=records, version=version)
            return records, store.publish(aggregate.replica_id, built_unix_ns=aggregate.built_unix_ns,
                                          format_version=version, payload=payload)  # fmt: skip

        records, asked = await self._ingest.store_calls.run_in_store(publish)
        self._inventory = (streams, records)
        self.shipped += 1
        if asked is not None:
            self._take(asked)
        return aggregate

    def _take(self, asked: dict[str, object]) -> None:
        try:
            reads = aggregates.AggregateReads.from_mapping(asked)
        except aggregates.AggregateFormatError as exc:
            log.warning("aggregate_reads_unreadable", error=str(exc))
            return
        if reads.tracked != self.reads.tracked:
            self._ingest.power_window.track(reads.tracked)
        self.reads = reads

    def start(self) -> None:
        """Ship every interval from now on (skipped while this replica leads: its loops read its own ingest)."""
        self._task = asyncio.create_task(self._run(), name="rasd-aggregate-shipper")

    async def stop(self) -> None:
        """Stop shipping and withdraw this replica's aggregate: its nodes are no longer held here."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        try:
            await self._ingest.store_calls.run_in_store(self._store.forget, self._leadership.replica_id)
        except Exception as exc:  # it ages out at the leader anyway
            log.warning("aggregate_withdraw_failed", error=str(exc), error_type=type(exc).__name__)

    async def _run(self) -> None:
        while True:
            if not self._leadership.is_leader():
                try:
                    await self.ship_once()
                except Exception as exc:  # the store may be briefly unavailable; the next round retries
                    log.warning("aggregate_ship_failed", error=str(exc), error_type=type(exc).__name__)
            await asyncio.sleep(self.reads.interval_s)


class FleetReader:
    """The leader's read of the other replicas' aggregates (and what it asks them to ship)."""

    def __init__(
        self,
        ingest: ingest_mod.Ingest,
        store: aggregate_store.AggregateStore,
        replica_id: str,
        *,
        clock: Callable[[], int] = time.time_ns,
    ) -> None:
        """Read through store on the ingest's store thread; leave out replica_id's own aggregate."""
        self._ingest = ingest
        self.store = store
        self.replica_id = replica_id
        self._clock = clock
        self._asked: aggregates.AggregateReads | None = None
        self._refused: set[tuple[str, int]] = set()
        self._inventories: dict[str, tuple[bytes, dict[str, fleet.GpuRecord]]] = {}
        """Replica -> (its encoded inventory, decoded): decoded again only when it changes."""
        self._memos: dict[str, aggregates.DecodeMemo] = {}
        """Replica -> what its last decode kept (its streams, decoded again only when they change)."""
        self._decoded: dict[str, tuple[int, aggregates.ReplicaAggregate]] = {}
        """Replica -> (built ns of its row, its aggregate decoded): each row is decoded once."""
        self._merge_memo = aggregates.MergeMemo()
        """The replicas' streams and inventory merged, again only when some replica's changed."""
        self._reading = asyncio.Lock()
        self.decodes = 0
        """Aggregates decoded so far (each row once, by `prefetch` or by `read`)."""
        self.latest: aggregates.FleetAggregate = aggregates.EMPTY
        """The last merge read (the power loop dates remote agents' stamps with its streams)."""

    async def read(self, *, max_age_s: float, tracked: frozenset[str] = frozenset()) -> aggregates.FleetAggregate:
        """The other replicas' fresh aggregates, merged (the payloads not decoded yet fetched and decoded)."""
        now = self._clock()
        current = await self._current(max_age_s, now)
        fresh = aggregates.fresh(current, now_unix_ns=now, max_age_s=max_age_s, exclude=self.replica_id)
        self.latest = aggregates.merge(
            fresh, tracked=tracked, bucket_ns=self._ingest.power_window.bucket_ns, memo=self._merge_memo
        )
        return self.latest

    async def prefetch_forever(
        self,
        *,
        every_s: Callable[[], float],
        max_age_s: Callable[[], float],
        busy: Callable[[], bool],
        due: Callable[[], bool] = lambda: True,
    ) -> None:
        """Every every_s(), decode the aggregates that landed since the last look, so that `read` finds them decoded.

        The power loop runs it beside its periods: six aggregates are a good part of a 100,000-GPU
        period's read. Each row is decoded once, here or in `read`, whichever sees it first; `read`
        still takes any newer row. Only while due() (the power loop: in the half period before its
        next, when a row landing is the one that period reads), and not while busy() (a period
        runs); a period that starts meanwhile waits for one aggregate's decode at most: the rest
        are left to its `read`.
        """
        while True:
            try:
                if due() and not busy():
                    await self._current(max_age_s(), self._clock(), yield_to=busy)
            except Exception as exc:  # the store may be briefly unavailable: the period's own read retries
                log.warning("aggregates_prefetch_failed", error=str(exc), error_type=type(exc).__name__)
            await asyncio.sleep(every_s())

    async def _current(
        self, max_age_s: float, now: int, *, yield_to: Callable[[], bool] | None = None
    ) -> list[aggregates.ReplicaAggregate]:
        """Every other replica's latest aggregate built within max_age_s, decoded (in replica order).

        The new rows are decoded on the event loop, one at a time (a replica's aggregate at 2,048
        nodes takes about 13 ms in format 3). A decode in a thread took up to 40 times as long: it
        shares the interpreter with everything else the loop runs meanwhile (under a cap wave, the
        relay's results), while the period waits for it. With yield_to (the prefetch),
        the loop runs its other tasks between two rows, and the decoding stops once yield_to() says
        a period started: the period's `read` decodes the rest itself, without waiting for them.
        """
        since = now - int(max_age_s * 1e9)
        store, exclude = self.store, self.replica_id
        async with self._reading:  # `read` and `prefetch` one at a time: a row is decoded once
            known = {replica: built_ns for replica, (built_ns, _agg) in self._decoded.items()}
            stamps, rows = await self._ingest.store_calls.run_beside(
                lambda: store.changed_aggregates(exclude=exclude, built_since_unix_ns=since, known=known)
            )
            for row in rows:
                if yield_to is not None:
                    await asyncio.sleep(0)
                    if yield_to():
                        break
                self._decode(*row)
            for replica in [r for r in self._decoded if r not in stamps]:  # its row is gone: so is its aggregate
                del self._decoded[replica]
                self._memos.pop(replica, None)
                self._inventories.pop(replica, None)
            return [
                agg for replica, (built_ns, agg) in sorted(self._decoded.items())
                if stamps.get(replica) == built_ns and built_ns >= since
            ]  # fmt: skip

    def _decode(self, replica_id: str, built_ns: int, version: int, payload: bytes) -> None:
        """Decode one row into `_decoded`, with its built ns.

        One that cannot be read is logged (once per replica and format) and left out.
        """
        try:
            inventory, _rest = aggregates.split(payload)
            known = self._inventories.get(replica_id)
            if known is None or known[0] != inventory:
                known = self._inventories[replica_id] = (inventory, aggregates.decode_records(inventory))
            memo = self._memos.setdefault(replica_id, aggregates.DecodeMemo())
            self._decoded[replica_id] = (built_ns, aggregates.decode(payload, records=known[1], memo=memo))
            self.decodes += 1
        except aggregates.AggregateFormatError as exc:
            if (replica_id, version) not in self._refused:  # not every period
                self._refused.add((replica_id, version))
                log.error("aggregate_refused", replica=replica_id, format_version=version, error=str(exc))

    async def ask(self, reads: aggregates.AggregateReads) -> None:
        """Tell the replicas what to ship, when it changed since the last time this leader asked."""
        if reads == self._asked:
            return
        store, now = self.store, self._clock()
        await self._ingest.store_calls.run_in_store(lambda: store.ask(reads.to_mapping(), now_unix_ns=now))
        self._asked = reads
