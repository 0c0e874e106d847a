"""What one replica tells the leader about the streams it holds, and the fleet the leader makes of them.

With several replicas, an agent's stream (and so its telemetry) ends at any of them, while the
fleet-wide loops (the power period, the rolling SDC sweeps) run on the leader over every node. Each
replica therefore ships the leader a `ReplicaAggregate` at least once per control period: per node
it holds, the stream (session, boot id, labels, GPUs, the agent's clock offset); per GPU of those
nodes, its inventory record (power-limit constraints), its freshest telemetry (draw, enforced limit
and read-back, throttle reasons, utilisation), when that was sampled in controller time, and its
peak draw over the windows the leader asked for (`AggregateReads`); and the replica's share of the
fleet's 10 Hz aggregate power (`PowerWindow.series` rows: aligned buckets the leader sums).

The leader keeps its own streams' view as it is and lays the other replicas' aggregates over it
(`merge`, then `overlay_latest` and `core.power.remote`):

- a node held by the leader itself is the leader's; a node held elsewhere is the one whose stream
  opened last (two replicas may both hold one for a moment while a dead stream is noticed);
- a GPU's telemetry is the newest per family (`fleet.merge_latest`), so an older aggregate never
  rolls a newer reading back;
- aggregates older than `max_age_s` count for nothing (`fresh`): a dead replica's nodes become
  unreachable and their GPUs count at the cap that may be in force (invariant 1 does not depend on
  any aggregate: it is the apply state's);
- the summed series stops where the oldest aggregate stops (`complete_until_ns`): later buckets
  would hold only some replicas' GPUs.

On the wire between replicas (the store, `encode`/`decode`) an aggregate is compressed columns:
one per field over the GPUs, the fields named as `GpuLatest` and `GpuRecord` name them, so a field
added to either travels without a change here, and a replica of another version leaves out what it
does not know (a missing field takes its default). The inventory (the GPUs' records) is a part of
its own, which changes only when streams come and go: the shipper encodes it, and the leader
decodes it, once per change. The formats:

- 1: the rest is one JSON document, every GPU named by its uuid in each list;
- 2: the same, the GPUs' uuids listed once and named by row elsewhere (half the text);
- 3: the streams (with the uuids) a part of their own, which the leader decodes once per change
  (`DecodeMemo`), and the readings and peaks `binary_columns`: numbers as raw 8-byte values
  behind a small JSON header (half the leader's decode of format 2, a NaN crossing as a NaN).

A replica ships the newest format the leader lists among those it reads (`AggregateReads.formats`,
`write_format`), so a leader of an older version keeps getting one it reads in a rolling upgrade.

Pure: no I/O, no logging, no clock reads.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import zlib
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import orjson

from rasd.controller.core import binary_columns, fleet

FORMAT_VERSION = 3
"""The newest encoding this controller writes, bumped when the encoded form changes incompatibly.

The formats are in the module docstring. A replica writes the newest the leader reads
(`write_format`), so a leader of an older version gets one it reads (1 from a leader that never
listed what it reads); a leader refuses a version it does not know."""
READ_FORMATS = (1, 2, 3)
"""The encodings this controller reads (a leader lists them in its `AggregateReads.formats`)."""

Rows = tuple[tuple[int, float, int], ...]
"""`fleet.PowerWindow.series` rows: (bucket start unix ns, summed W, GPUs reporting)."""

_RECORD_FIELDS = tuple(f.name for f in dataclasses.fields(fleet.GpuRecord))
_LATEST_FIELDS = fleet.LATEST_FIELDS


NO_NS = np.iinfo(np.int64).min
"""A controller time column's value where no controller time is known."""


@dataclasses.dataclass(frozen=True, eq=False)
class LatestBlock:
    """Many GPUs' latest readings as columns: the fields the power period reads, rows in `gpu_uuids` order.

    The replicas ship their readings in columns. The leader built a `GpuLatest` per GPU from them,
    and each period `views.latest_columns` turned the 100,000 readings back into columns, a sixth
    of the period. A block keeps the columns as they were decoded, through `merge` and
    `core.power.remote`, for GPUs whose reading in the fleet view is exactly the block's row. The
    view's mappings still hold every reading, for the readers that go GPU by GPU.

    Values as `views.LatestColumns` holds them: nan for a missing float, 0 for a missing slew
    target or clock event reasons, `NO_NS` for an unknown controller time.
    """

    gpu_uuids: list[str]
    """The GPUs' uuids, in row order."""
    enforced_w: np.ndarray
    """The enforced power limit, W (nan: none)."""
    slew_target_w: np.ndarray
    """The target of a raise the agent is still slewing, W (0: none)."""
    counters_ns: np.ndarray
    """When the counters were read, agent time (0: never)."""
    power_w: np.ndarray
    """The latest draw, W (nan: none)."""
    power_sample_ns: np.ndarray
    """When the draw was sampled (0: never)."""
    utilization_pct: np.ndarray
    """GPU utilisation, % (nan: not reported)."""
    clock_event_reasons: np.ndarray
    """NVML clock event reasons (0: none reported)."""
    controller_ns: np.ndarray
    """The counters' time in controller time (`NO_NS`: not known)."""

    @functools.cached_property
    def row_of(self) -> dict[str, int]:
        """GPU uuid -> its row."""
        return dict(zip(self.gpu_uuids, range(len(self.gpu_uuids)), strict=True))

    def rows(self, gpu_uuids: Sequence[str]) -> np.ndarray:
        """Each GPU's row (-1: not in the block)."""
        get = self.row_of.get
        return np.array([get(u, -1) for u in gpu_uuids], dtype=np.intp)

    def take(self, rows: np.ndarray) -> LatestBlock:
        """A block of these rows, in this order."""
        rows_list = rows.tolist()
        uuids = self.gpu_uuids
        return LatestBlock(
            gpu_uuids=[uuids[i] for i in rows_list],
            **{name: getattr(self, name)[rows] for name in BLOCK_COLUMNS},
        )

    def without(self, gpu_uuids: Collection[str]) -> LatestBlock:
        """This block less the rows of gpu_uuids (itself when it holds none of them)."""
        row_of = self.row_of
        drop = [row_of[u] for u in gpu_uuids if u in row_of]
        if not drop:
            return self
        keep = np.ones(len(self.gpu_uuids), dtype=bool)
        keep[drop] = False
        return self.take(np.flatnonzero(keep))

    def controller_ns_from_zero(self) -> LatestBlock:
        """The block with every known controller time below 0 raised to 0 (as `core.power.remote` lays times over)."""
        known = self.controller_ns != NO_NS
        if not np.any(known & (self.controller_ns < 0)):
            return self
        return dataclasses.replace(self, controller_ns=np.where(known, np.maximum(self.controller_ns, 0), NO_NS))

    @classmethod
    def joined(cls, blocks: Sequence[LatestBlock]) -> LatestBlock:
        """The blocks' rows one after the other."""
        if len(blocks) == 1:
            return blocks[0]
        return cls(
            gpu_uuids=[u for block in blocks for u in block.gpu_uuids],
            **{name: np.concatenate([getattr(b, name) for b in blocks]) for name in BLOCK_COLUMNS},
        )


BLOCK_COLUMNS = tuple(f.name for f in dataclasses.fields(LatestBlock) if f.name != "gpu_uuids")
"""`LatestBlock`'s array columns (`views.LatestColumns` holds them too, aligned with its GPUs)."""


class AggregateFormatError(ValueError):
    """An encoded aggregate that cannot be read (another format version, or damaged)."""


@dataclasses.dataclass(frozen=True)
class AggregateReads:
    """What the leader asks every replica to ship: the windows its period reads and how often.

    The leader's power loop writes it when it changes; without one a replica ships its defaults.
    """

    interval_s: float
    """Ship at least this often, s (half the leader's control period: one lands in every period)."""
    draw_window_s: float
    """Each GPU's peak draw over this long (`period.window_reads`' draw window)."""
    detect_window_s: float
    """Each GPU's peak draw, and the aggregate series, over this long (the swing detector's window)."""
    tracked: frozenset[str] = frozenset()
    """GPUs summed on their own as well (the power loop's canaries, `PowerWindow.track`)."""
    formats: tuple[int, ...] = (1,)
    """The encodings the leader reads (`READ_FORMATS`); a leader of a version before 2 listed none and reads 1."""

    def to_mapping(self) -> dict[str, Any]:
        """Plain data for the store (`from_mapping` reads it back)."""
        return {
            "interval_s": self.interval_s,
            "draw_window_s": self.draw_window_s,
            "detect_window_s": self.detect_window_s,
            "tracked": sorted(self.tracked),
            "formats": list(self.formats),
        }

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> AggregateReads:
        """Rebuild from `to_mapping`'s data.

        Raises:
            AggregateFormatError: a field missing or of the wrong kind.
        """
        try:
            reads = cls(
                interval_s=float(data["interval_s"]),
                draw_window_s=float(data["draw_window_s"]),
                detect_window_s=float(data["detect_window_s"]),
                tracked=frozenset(str(g) for g in data.get("tracked", ())),
                formats=tuple(int(v) for v in data.get("formats", (1,))),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise AggregateFormatError(f"aggregate reads: {exc!r}") from None
        if min(reads.interval_s, reads.draw_window_s, reads.detect_window_s) <= 0:
            raise AggregateFormatError(f"aggregate reads: every window and the interval must be > 0: {data!r}")
        if not reads.formats:
            raise AggregateFormatError(f"aggregate reads: no format listed: {data!r}")
        return reads


def write_format(reads: AggregateReads) -> int:
    """The encoding to ship a leader that asked for reads: the newest both read (1 when none is shared).

    Example: a leader of this version lists (1, 2) → 2; one before version 2 listed nothing → 1.
    """
    return max(set(reads.formats) & set(READ_FORMATS), default=1)


@dataclasses.dataclass(frozen=True)
class NodeStream:
    """A node's open stream on the replica that ships it."""

    node_id: str
    session_id: str
    opened_unix_ns: int
    """When the stream opened, the shipping replica's clock: the newest stream of a node wins."""
    boot_id: str
    labels: Mapping[str, str]
    gpu_uuids: tuple[str, ...]
    """The GPUs of its last Hello."""
    agent_ahead_ns: int | None
    """How far the agent's clock runs ahead of the controllers' at least (`Session.agent_ahead_ns`):
    the leader dates the agent's stamps (a command's result) in controller time with it."""


@dataclasses.dataclass(frozen=True, eq=False)
class ReplicaAggregate:
    """What one replica ships the leader (see the module docstring)."""

    replica_id: str
    built_unix_ns: int
    """When it was built, on the shipping replica's clock."""
    interval_s: float
    """How often the replica ships (an aggregate much older is of a replica that stopped)."""
    nodes: Mapping[str, NodeStream]
    records: Mapping[str, fleet.GpuRecord]
    """GPU uuid -> its record, for the GPUs of `nodes`."""
    latest: Mapping[str, fleet.GpuLatest]
    """GPU uuid -> its freshest telemetry (the agent's stamps), for the GPUs of `nodes` that reported."""
    latest_controller_ns: Mapping[str, int]
    """GPU uuid -> when its latest counters were sampled, controller time."""
    draw_window_s: float
    draw_peaks_w: Mapping[str, float]
    """GPU uuid -> its highest sample over `draw_window_s` before `built_unix_ns`."""
    detect_window_s: float
    detect_peaks_w: Mapping[str, float]
    """GPU uuid -> its highest sample over `detect_window_s` before `built_unix_ns`."""
    bucket_ns: int = 100_000_000
    series: Rows = ()
    """This replica's share of the fleet's aggregate power over `detect_window_s` (and the status's span)."""
    tracked: frozenset[str] = frozenset()
    """The GPUs `tracked_series` sums (as `AggregateReads.tracked` asked when it was built)."""
    tracked_series: Rows = ()
    latest_block: LatestBlock | None = None
    """`latest` and `latest_controller_ns` as columns, row for row (None: not built; decoded aggregates have one)."""


@dataclasses.dataclass(frozen=True, eq=False)
class FleetAggregate:
    """The other replicas' aggregates combined: their nodes, GPUs and summed power (see `merge`)."""

    nodes: Mapping[str, NodeStream] = dataclasses.field(default_factory=dict)
    """Node -> its newest stream among the replicas."""
    holders: Mapping[str, str] = dataclasses.field(default_factory=dict)
    """Node -> the replica that holds that stream."""
    records: Mapping[str, fleet.GpuRecord] = dataclasses.field(default_factory=dict)
    latest: Mapping[str, fleet.GpuLatest] = dataclasses.field(default_factory=dict)
    latest_controller_ns: Mapping[str, int] = dataclasses.field(default_factory=dict)
    draw_peaks_w: Mapping[str, float] = dataclasses.field(default_factory=dict)
    detect_peaks_w: Mapping[str, float] = dataclasses.field(default_factory=dict)
    series: Rows = ()
    tracked_series: Rows = ()
    """Summed over the replicas whose tracked set was the one asked for; the others' GPUs are missing."""
    complete_until_ns: int | None = None
    """Buckets starting at or after this lack some replica's share (None: no replica ships a series)."""
    replicas: tuple[str, ...] = ()
    latest_block: LatestBlock | None = None
    """`latest` and `latest_controller_ns` as columns, row for row (None: some aggregate had none,
    or a node's stream moved between replicas; the readers then go by the mappings)."""
    gpu_nodes: Mapping[str, str] = dataclasses.field(default_factory=dict)
    """GPU uuid -> the node of `nodes` whose stream names it (the last such node, in `nodes` order)."""

    def node_of(self, gpu_uuid: str) -> str | None:
        """The node a GPU belongs to, by its record (None: not a GPU of these nodes)."""
        record = self.records.get(gpu_uuid)
        return record.node_id if record is not None else None


EMPTY = FleetAggregate()
"""No other replica (one replica, or none shipped)."""


def fresh(
    aggregates: Iterable[ReplicaAggregate], *, now_unix_ns: int, max_age_s: float, exclude: str = ""
) -> list[ReplicaAggregate]:
    """The aggregates young enough to count (and not of `exclude`, the reading replica itself).

    Example: a replica SIGKILLed 20 s ago left its last aggregate in the store; with max_age_s 5 it
    counts for nothing, so its nodes are unreachable and their GPUs count at their caps.
    """
    oldest_ns = now_unix_ns - int(max_age_s * 1e9)
    return [a for a in aggregates if a.replica_id != exclude and a.built_unix_ns >= oldest_ns]


def _sum_rows(shares: Sequence[Rows]) -> Rows:
    """Rows of several replicas summed per bucket (W and GPUs reporting), in time order."""
    by_bucket: dict[int, list[float]] = {}
    for rows in shares:
        for start_ns, watts, gpus in rows:
            cell = by_bucket.setdefault(start_ns, [0.0, 0])
            cell[0] += watts
            cell[1] += gpus
    return tuple((start, total, int(count)) for start, (total, count) in sorted(by_bucket.items()))


@dataclasses.dataclass
class MergeMemo:
    """What a leader keeps from one merge to the next: the other replicas' streams and inventory merged.

    A replica's streams and inventory change only when nodes come and go, and the leader's decode
    gives the same objects back while they are unchanged (`DecodeMemo`, `decode_records`). While
    every aggregate's are the ones merged last, `merge` takes the merged nodes, holders and records
    from here instead of building the 100,000 records' mapping again each period.
    """

    sources: tuple[tuple[str, Mapping[str, NodeStream], Mapping[str, fleet.GpuRecord]], ...] = ()
    """(replica, its nodes, its records) of each aggregate last merged, in order (compared by identity)."""
    streams: _MergedStreams | None = None


@dataclasses.dataclass(frozen=True)
class _MergedStreams:
    nodes: dict[str, NodeStream]
    holders: dict[str, int]
    """Node -> the index of the aggregate holding its newest stream."""
    records: dict[str, fleet.GpuRecord]
    gpu_nodes: dict[str, str]
    gpu_order: tuple[list[str], ...] | None
    """Each aggregate's GPUs in its streams' order, when every node is in one aggregate only (None: a
    stream moved between replicas, and the readings are taken node by node)."""


def _same_sources(memo: MergeMemo, sources: tuple[tuple[str, Mapping[str, Any], Mapping[str, Any]], ...]) -> bool:
    return len(memo.sources) == len(sources) and all(
        a[0] == b[0] and a[1] is b[1] and a[2] is b[2] for a, b in zip(memo.sources, sources, strict=True)
    )


def _merged_streams(aggregates: Sequence[ReplicaAggregate]) -> _MergedStreams:
    """Each node from its newest stream, and its GPUs' records from the aggregate that holds it."""
    nodes: dict[str, NodeStream] = {}
    holders: dict[str, int] = {}
    for index, agg in enumerate(aggregates):
        for node_id, stream in agg.nodes.items():
            held = nodes.get(node_id)
            if held is None or stream.opened_unix_ns > held.opened_unix_ns:
                nodes[node_id], holders[node_id] = stream, index
    records: dict[str, fleet.GpuRecord] = {}
    gpu_order: tuple[list[str], ...] | None = None
    if len(nodes) == sum(len(agg.nodes) for agg in aggregates):
        # Every node in one aggregate only (no stream moved between replicas): `nodes` lists each
        # aggregate's nodes in turn, so each aggregate's GPUs can be taken whole, in the same order.
        gpu_order = tuple([g for stream in agg.nodes.values() for g in stream.gpu_uuids] for agg in aggregates)
        for agg, gpu_uuids in zip(aggregates, gpu_order, strict=True):
            _take(gpu_uuids, agg.records, records)
    else:
        for node_id, stream in nodes.items():
            _take(list(stream.gpu_uuids), aggregates[holders[node_id]].records, records)
    gpu_nodes = {g: stream.node_id for stream in nodes.values() for g in stream.gpu_uuids}
    return _MergedStreams(nodes, holders, records, gpu_nodes, gpu_order)


def merge(
    aggregates: Sequence[ReplicaAggregate],
    *,
    tracked: frozenset[str] = frozenset(),
    bucket_ns: int = 100_000_000,
    memo: MergeMemo | None = None,
) -> FleetAggregate:
    """Combine replicas' aggregates: each node from its newest stream, series summed per bucket.

    Args:
        aggregates: Fresh aggregates of the other replicas (`fresh`).
        tracked: The GPUs the leader wants summed on their own now; a replica that tracked another
            set (it has not read the leader's new reads yet) adds nothing to `tracked_series`.
        bucket_ns: The leader's bucket; a series on another grid cannot be summed with its own and
            is left out (the detector then sees too few GPUs reporting and waits).
        memo: The caller's memo (None: none): the streams and inventory are merged again only when
            some aggregate's changed, and the memo is updated then.

    Returns:
        The combined view (`EMPTY` for no aggregate).
    """
    if not aggregates:
        return EMPTY
    sources = tuple((agg.replica_id, agg.nodes, agg.records) for agg in aggregates)
    if memo is not None and memo.streams is not None and _same_sources(memo, sources):
        streams = memo.streams
    else:
        streams = _merged_streams(aggregates)
        if memo is not None:
            memo.sources, memo.streams = sources, streams
    latest: dict[str, fleet.GpuLatest] = {}
    controller_ns: dict[str, int] = {}
    if streams.gpu_order is not None:
        for agg, gpu_uuids in zip(aggregates, streams.gpu_order, strict=True):
            _take(gpu_uuids, agg.latest, latest)
            _take(gpu_uuids, agg.latest_controller_ns, controller_ns)
    else:
        for node_id, stream in streams.nodes.items():
            holder, gpu_uuids = aggregates[streams.holders[node_id]], list(stream.gpu_uuids)
            _take(gpu_uuids, holder.latest, latest)
            _take(gpu_uuids, holder.latest_controller_ns, controller_ns)
    draw = peak_maxima([agg.draw_peaks_w for agg in aggregates], streams.records)
    detect = peak_maxima([agg.detect_peaks_w for agg in aggregates], streams.records)
    with_series = [agg for agg in aggregates if agg.series and agg.bucket_ns == bucket_ns]
    blocks = [agg.latest_block for agg in aggregates if agg.latest_block is not None]
    # Every reading taken, each from one aggregate only (no stream moved, no GPU twice): the
    # aggregates' blocks, one after the other, hold exactly the merged mappings' values.
    whole = len(blocks) == len(aggregates) and len(latest) == sum(len(b.gpu_uuids) for b in blocks)
    return FleetAggregate(
        nodes=streams.nodes,
        holders={node_id: aggregates[index].replica_id for node_id, index in streams.holders.items()},
        records=streams.records,
        latest=latest,
        latest_controller_ns=controller_ns,
        draw_peaks_w=draw,
        detect_peaks_w=detect,
        series=_sum_rows([agg.series for agg in with_series]),
        tracked_series=_sum_rows([agg.tracked_series for agg in with_series if agg.tracked == tracked])
        if tracked
        else (),
        complete_until_ns=min((agg.built_unix_ns for agg in with_series), default=None),
        replicas=tuple(sorted(agg.replica_id for agg in aggregates)),
        latest_block=LatestBlock.joined(blocks) if whole else None,
        gpu_nodes=streams.gpu_nodes,
    )


def peak_maxima(sources: Sequence[Mapping[str, float]], records: Mapping[str, Any]) -> dict[str, float]:
    """A GPU's peak over the window, wherever its samples landed: the highest of the sources' peaks.

    Only GPUs in `records` count, and a peak must be above -inf (a NaN never is). In the usual
    case each GPU's samples landed on one replica only: the sources are then joined whole and the
    GPUs that do not count taken out (C-level updates, one array check and a key-set difference
    instead of a comparison per GPU and source, 200,000 at fleet scale), which gives the same
    mapping, in the same order, as the loop. A GPU without samples in the window (-inf) or
    without a record no longer sends every GPU down the loop.
    """
    joined: dict[str, float] = {}
    for source in sources:
        joined.update(source)
    if len(joined) == sum(len(source) for source in sources):
        peaks_w = np.fromiter(joined.values(), dtype=np.float64, count=len(joined))
        out_of_count = np.flatnonzero(~(peaks_w > -np.inf)).tolist()
        if out_of_count:
            keys = list(joined)
            for i in out_of_count:
                del joined[keys[i]]
        if joined.keys() <= records.keys():  # as mostly: no set of the difference to build
            return joined
        for gpu_uuid in joined.keys() - records.keys():
            del joined[gpu_uuid]
        return joined
    out: dict[str, float] = {}
    for source in sources:
        for gpu_uuid, peak_w in source.items():
            if gpu_uuid in records and peak_w > out.get(gpu_uuid, -math.inf):
                out[gpu_uuid] = peak_w
    return out


def _take(gpu_uuids: list[str], source: Mapping[str, Any], into: dict[str, Any]) -> None:
    """Add gpu_uuids' values in source (where it has one) to into, in that order.

    A source that holds exactly those GPUs in that order (a replica's own aggregate, as it is
    built) is added whole: one C-level update instead of 100,000 lookups at fleet scale.
    """
    if len(source) == len(gpu_uuids) and list(source) == gpu_uuids:
        into.update(source)
        return
    for gpu_uuid in gpu_uuids:
        if (value := source.get(gpu_uuid)) is not None:
            into[gpu_uuid] = value


def overlay_latest(
    local: Mapping[str, fleet.GpuLatest], remote: FleetAggregate, *, local_nodes: Iterable[str] = ()
) -> dict[str, fleet.GpuLatest]:
    """This replica's latest telemetry with the other replicas' laid over it, newest per family.

    GPUs of `local_nodes` (whose streams this replica holds) keep this replica's reading as it is.
    """
    held = set(local_nodes)
    out = dict(local)
    for gpu_uuid, reading in remote.latest.items():
        if remote.node_of(gpu_uuid) in held:
            continue
        out[gpu_uuid] = fleet.merge_latest(local.get(gpu_uuid), reading)
    return out


# -- encoding -------------------------------------------------------------------------------------------


def _columns(items: Sequence[Any], names: Sequence[str]) -> dict[str, list[Any]]:
    return {name: [getattr(item, name) for item in items] for name in names}


def _latest_columns(readings: Sequence[fleet.GpuLatest]) -> dict[str, list[Any]]:
    """The readings' fields as columns.

    A reading is a tuple, so one C-level transposition does it; a getattr per value was half an encode.
    """
    if not readings:
        return {name: [] for name in _LATEST_FIELDS}
    return dict(zip(_LATEST_FIELDS, map(list, zip(*readings, strict=True)), strict=True))


def _rows_out(rows: Rows) -> list[list[Any]]:
    return [[int(s), float(w), int(n)] for s, w, n in rows]


def _rows_in(data: Any) -> Rows:
    return tuple((int(s), float(w), int(n)) for s, w, n in data)


def _compressed(doc: Mapping[str, Any]) -> bytes:
    return zlib.compress(json.dumps(doc, separators=(",", ":")).encode(), 1)


def _document(blob: bytes) -> Any:
    try:
        text = zlib.decompress(blob)
    except zlib.error as exc:
        raise AggregateFormatError(f"not an encoded aggregate: {exc}") from None
    return _parsed(text)


def _parsed(text: bytes) -> Any:
    """The JSON text's value.

    Raises:
        AggregateFormatError: no JSON.
    """
    try:
        # orjson reads the leader's 100,000 GPUs' columns in a third of the time json takes.
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        pass  # the standard library's extensions (NaN, Infinity), which json.dumps writes and orjson refuses
    try:
        return json.loads(text)
    except ValueError as exc:
        raise AggregateFormatError(f"not an encoded aggregate: {exc}") from None


def encode_records(records: Mapping[str, fleet.GpuRecord]) -> bytes:
    """The inventory part of an encoded aggregate: it changes only when streams come and go.

    `encode` takes it back, so a replica encodes it once per change of its streams, and a reader
    decodes it once per change (`decode_records`, keyed by the bytes).
    """
    gpus = sorted(records)
    doc = {**_columns([records[g] for g in gpus], _RECORD_FIELDS), "labels": [dict(records[g].labels) for g in gpus]}
    return _compressed(doc)


def encode(aggregate: ReplicaAggregate, *, records: bytes | None = None, version: int = FORMAT_VERSION) -> bytes:
    """The aggregate as bytes for the store (see the module docstring), in encoding version (`write_format`).

    The inventory part (`encode_records`; pass it when it is unchanged) behind its length (4 bytes,
    big-endian), then the rest: in formats 1 and 2 one compressed JSON document; in format 3
    `_BINARY_MAGIC` and the version byte, the streams part (compressed JSON, behind its length) and
    the readings part (`_readings_part`).

    Raises:
        ValueError: a version this controller does not write.
    """
    if version not in READ_FORMATS:
        raise ValueError(f"aggregate format version {version}; this controller writes {READ_FORMATS}")
    records = encode_records(aggregate.records) if records is None else records
    gpus = sorted(aggregate.records)
    reported = [g for g in gpus if g in aggregate.latest]
    streams = list(aggregate.nodes.values())
    nodes = {
        **_columns(streams, ("node_id", "session_id", "opened_unix_ns", "boot_id", "agent_ahead_ns")),
        "labels": [dict(s.labels) for s in streams],
    }
    latest = {
        **_latest_columns([aggregate.latest[g] for g in reported]),
        "controller_ns": [aggregate.latest_controller_ns.get(g) for g in reported],
    }
    peaks = {
        "draw_w": [aggregate.draw_peaks_w.get(g) for g in gpus],
        "detect_w": [aggregate.detect_peaks_w.get(g) for g in gpus],
    }
    doc: dict[str, Any] = {
        "version": version,
        "replica_id": aggregate.replica_id,
        "built_unix_ns": aggregate.built_unix_ns,
        "interval_s": aggregate.interval_s,
        "bucket_ns": aggregate.bucket_ns,
        "draw_window_s": aggregate.draw_window_s,
        "detect_window_s": aggregate.detect_window_s,
        "series": _rows_out(aggregate.series),
        "tracked": sorted(aggregate.tracked),
        "tracked_series": _rows_out(aggregate.tracked_series),
    }
    head = len(records).to_bytes(4, "big") + records
    if version == 1:
        nodes["gpu_uuids"] = [list(s.gpu_uuids) for s in streams]
        return head + _compressed({**doc, "nodes": nodes, "latest": {**latest, "gpu_uuid": reported},
                                   "peaks": {**peaks, "gpu_uuid": gpus}})  # fmt: skip
    # The record GPUs in order (the peaks' rows), then any GPU a stream names without a record.
    listed = gpus + sorted({g for s in streams for g in s.gpu_uuids}.difference(aggregate.records))
    row = dict(zip(listed, range(len(listed)), strict=True))
    nodes["gpu_rows"] = [[row[g] for g in s.gpu_uuids] for s in streams]
    rows = None if len(reported) == len(listed) else [row[g] for g in reported]
    if version == 2:
        return head + _compressed({**doc, "gpus": listed, "nodes": nodes, "latest": {**latest, "rows": rows},
                                   "peaks": peaks})  # fmt: skip
    streams_part = _compressed({"gpus": listed, "nodes": nodes})
    return (
        head
        + _BINARY_MAGIC
        + bytes([version])
        + len(streams_part).to_bytes(4, "big")
        + streams_part
        + _readings_part(doc, latest, peaks, rows)
    )


_BINARY_MAGIC = b"RAG"
"""The start of a format 3 aggregate's rest (a compressed JSON document starts with 0x78)."""


def _readings_part(doc: dict[str, Any], latest: dict[str, list[Any]], peaks: dict[str, list[Any]],
                   rows: list[int] | None) -> bytes:  # fmt: skip
    """Format 3's readings: compressed, a JSON header (doc and the columns' specs) behind its length, then the columns.

    The readings, the peaks and the rows of the GPUs that reported are `binary_columns` (numbers
    as raw 8-byte values), in that order.
    """
    groups = {"latest": latest, "peaks": peaks, "rows": {} if rows is None else {"rows": rows}}
    specs: dict[str, list[dict[str, Any]]] = {}
    data: list[bytes] = []
    for group, columns in groups.items():
        specs[group], packed = binary_columns.pack(columns)
        data.append(packed)
    header = json.dumps({**doc, "columns": specs}, separators=(",", ":")).encode()
    return zlib.compress(len(header).to_bytes(4, "big") + header + b"".join(data), 1)


def split(payload: bytes) -> tuple[bytes, bytes]:
    """(the inventory part, the rest) of an encoded aggregate.

    Raises:
        AggregateFormatError: bytes too short for the parts they announce.
    """
    size = int.from_bytes(payload[:4], "big")
    if len(payload) < 4 + size:
        raise AggregateFormatError(f"not an encoded aggregate: {len(payload)} bytes, the inventory alone {size}")
    return payload[4 : 4 + size], payload[4 + size :]


def decode_records(blob: bytes) -> dict[str, fleet.GpuRecord]:
    """The inventory part (`encode_records`) as GPU uuid -> record.

    Raises:
        AggregateFormatError: bytes that are no encoded inventory.
    """
    columns = _document(blob)
    try:
        known = [name for name in _RECORD_FIELDS if name in columns]
        rows = zip(*(columns[name] for name in known), strict=True)
        records = [fleet.GpuRecord(**dict(zip(known, row, strict=True))) for row in rows]
    except (KeyError, TypeError, ValueError) as exc:
        raise AggregateFormatError(f"damaged inventory in an aggregate: {exc!r}") from None
    return {r.uuid: r for r in records}


@dataclasses.dataclass
class DecodeMemo:
    """What a reader keeps between two decodes of one replica's aggregates: the node streams, decoded once.

    A replica's streams change only when nodes come and go, and building a `NodeStream` per node
    of every replica each period cost the leader a tenth of a second at 12,500 nodes.
    """

    node_columns: Any = None
    """The node columns as last decoded, with format 2's GPU list (equal ones give equal streams)."""
    nodes: Mapping[str, NodeStream] = dataclasses.field(default_factory=dict)
    streams_part: bytes | None = None
    """Format 3's streams part as `nodes` and `gpus` were last decoded from it (None: from format 2's columns)."""
    gpus: list[str] = dataclasses.field(default_factory=list)
    """Format 3's GPUs' uuids, as the streams part lists them."""


def decode(
    payload: bytes, *, records: Mapping[str, fleet.GpuRecord] | None = None, memo: DecodeMemo | None = None
) -> ReplicaAggregate:
    """The aggregate `encode` made.

    records: the inventory part already decoded (`decode_records` of `split(payload)[0]`, which the
    caller found unchanged); None decodes it here.
    memo: the caller's memo for this replica (None: none); the streams are taken from it while the
    node columns (format 3: the streams part) are unchanged, and it is updated otherwise.

    Raises:
        AggregateFormatError: another format version, or bytes that are no aggregate.
    """
    inventory, rest = split(payload)
    doc: Any = None
    if rest[: len(_BINARY_MAGIC)] == _BINARY_MAGIC:
        version: Any = rest[len(_BINARY_MAGIC)] if len(rest) > len(_BINARY_MAGIC) else None
        readable = version in READ_FORMATS and version not in _JSON_FORMATS
    else:
        doc = _document(rest)
        version = doc.get("version") if isinstance(doc, dict) else None
        readable = version in _JSON_FORMATS
    if not readable:
        known = ", ".join(map(str, READ_FORMATS))
        raise AggregateFormatError(f"aggregate format version {version!r}; this controller reads {known}")
    if records is None:
        records = decode_records(inventory)
    memo = DecodeMemo() if memo is None else memo
    if doc is None:
        return _decode_binary(rest[len(_BINARY_MAGIC) + 1 :], records, memo)
    try:
        return _decoded(doc, records, memo)
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise AggregateFormatError(f"damaged aggregate from {doc.get('replica_id')!r}: {exc!r}") from None


_JSON_FORMATS = (1, 2)
"""The formats whose rest is one JSON document (3 and later: `_BINARY_MAGIC`, the version, parts)."""


def _decode_binary(parts: bytes, records: Mapping[str, fleet.GpuRecord], memo: DecodeMemo) -> ReplicaAggregate:
    """A format 3 aggregate from what follows its version byte: the streams part, then the readings part.

    Raises:
        AggregateFormatError: parts that are not what `encode` writes.
    """
    size = int.from_bytes(parts[:4], "big")
    streams_part = parts[4 : 4 + size]
    if len(parts) < 4 or len(streams_part) != size:
        raise AggregateFormatError(
            f"not an encoded aggregate: a streams part of {size} bytes announced, {len(streams_part)} there"
        )
    try:
        body = zlib.decompress(parts[4 + size :])
    except zlib.error as exc:
        raise AggregateFormatError(f"not an encoded aggregate: the readings part: {exc}") from None
    header_size = int.from_bytes(body[:4], "big")
    header = _parsed(body[4 : 4 + header_size])
    if not isinstance(header, dict):
        raise AggregateFormatError(f"not an encoded aggregate: a readings header of {type(header).__name__}")
    try:
        nodes, gpus = _memo_streams(streams_part, memo)
        return _decoded_binary(header, memoryview(body)[4 + header_size :], nodes, gpus, records)
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise AggregateFormatError(f"damaged aggregate from {header.get('replica_id')!r}: {exc!r}") from None


def _memo_streams(streams_part: bytes, memo: DecodeMemo) -> tuple[Mapping[str, NodeStream], list[str]]:
    """(the node streams, the GPUs' uuids) of a format 3 streams part, from memo while the part is unchanged."""
    if memo.streams_part != streams_part:
        doc = _document(streams_part)
        gpus = doc["gpus"]
        if not isinstance(gpus, list) or not all(isinstance(g, str) for g in gpus):
            raise TypeError("the GPUs listed are not a list of uuids")
        _streams(doc["nodes"], gpus, memo)
        memo.streams_part, memo.gpus = streams_part, gpus
    return memo.nodes, memo.gpus


_LATEST_DEFAULTS = fleet.GpuLatest._field_defaults


def _readings(columns: Mapping[str, list[Any]], count: int) -> list[fleet.GpuLatest]:
    """The `GpuLatest` of each row, built positionally (the leader builds one per GPU of every replica each period).

    A field the sender did not know takes its default; one this controller does not know is left out.
    """
    fields = [columns[name] if name in columns else [_LATEST_DEFAULTS[name]] * count for name in _LATEST_FIELDS]
    links = fields[_PCIE_LINK]
    if links.count(None) != len(links):
        # JSON carries the NamedTuple as a list; the view's readers take its fields by name.
        fields[_PCIE_LINK] = [None if link is None else fleet.PcieLink(*link) for link in links]
    return fleet.latest_rows(fields)


_PCIE_LINK = _LATEST_FIELDS.index("pcie_link")


_DTYPE_OF = {int: np.dtype(np.int64), float: np.dtype(np.float64)}


def _present(keys: list[Any], column: binary_columns.Column, kind: type) -> dict[Any, Any]:
    """keys -> kind(value), leaving out the keys whose value is None (null in the JSON)."""
    values = column.values
    if column.array is not None and column.array.dtype == _DTYPE_OF[kind]:  # format 3: values of kind already
        if column.nulls is None:
            return dict(zip(keys, values, strict=True))
        return {k: v for k, v in zip(keys, values, strict=True) if v is not None}
    if None in values:
        return {k: kind(v) for k, v in zip(keys, values, strict=True) if v is not None}
    return dict(zip(keys, map(kind, values), strict=True))


def _streams(node_cols: Mapping[str, Any], gpus: list[str] | None, memo: DecodeMemo) -> Mapping[str, NodeStream]:
    """The node streams of the node columns, from memo while they are unchanged.

    gpus: format 2's list of the GPUs, which the columns name by row (None: format 1, by uuid).
    """
    if memo.node_columns == (node_cols, gpus):
        return memo.nodes
    gpu_lists = node_cols["gpu_uuids"] if gpus is None else [_named(gpus, rows) for rows in node_cols["gpu_rows"]]
    streams = [
        NodeStream(
            node_id=str(node_id),
            session_id=str(node_cols["session_id"][i]),
            opened_unix_ns=int(node_cols["opened_unix_ns"][i]),
            boot_id=str(node_cols["boot_id"][i]),
            labels=dict(node_cols["labels"][i]),
            gpu_uuids=tuple(gpu_lists[i]),
            agent_ahead_ns=node_cols["agent_ahead_ns"][i],
        )
        for i, node_id in enumerate(node_cols["node_id"])
    ]
    memo.node_columns, memo.nodes = (node_cols, gpus), {s.node_id: s for s in streams}
    memo.streams_part = None  # `nodes` are these columns' now (`_memo_streams` sets the part it decoded)
    return memo.nodes


def _named(gpus: list[str], rows: list[int]) -> list[str]:
    """The uuids of gpus' rows (format 2).

    Raises:
        IndexError: a row outside the list (a negative one too, which Python would read from the end).
    """
    if rows and (min(rows) < 0 or max(rows) >= len(gpus)):
        raise IndexError(f"GPU rows {min(rows)}..{max(rows)} outside the {len(gpus)} GPUs listed")
    return [gpus[i] for i in rows]


def _peak_gpus(gpus: list[str], count: int) -> list[str]:
    """The GPUs of count peaks (formats 2 and 3): the first of the GPUs listed, the records' GPUs.

    Raises:
        ValueError: more peaks than GPUs listed.
    """
    if count > len(gpus):
        raise ValueError(f"{count} peaks for the {len(gpus)} GPUs listed")
    return gpus[:count]


def _block(columns: Mapping[str, binary_columns.Column], reported: list[str]) -> LatestBlock:
    """The readings' columns as `LatestBlock` holds them: each value as `views.latest_columns` reads a `GpuLatest`'s."""

    def column(name: str, dtype: type, fill: Any) -> np.ndarray:
        if name in columns:
            return columns[name].filled(dtype, fill)
        default = _LATEST_DEFAULTS[name]
        return np.full(len(reported), fill if default is None else default, dtype=dtype)

    return LatestBlock(
        gpu_uuids=list(reported),
        # As the object path reads a reading: None is nan for a float, 0 for a slew target or
        # clock event reasons (a NaN stays a NaN).
        enforced_w=column("enforced_power_limit_w", np.float64, math.nan),
        slew_target_w=column("power_limit_slew_target_w", np.float64, 0.0),
        counters_ns=column("counters_unix_ns", np.int64, 0),
        power_w=column("power_w", np.float64, math.nan),
        power_sample_ns=column("power_sample_unix_ns", np.int64, 0),
        utilization_pct=column("utilization_gpu_pct", np.float64, math.nan),
        clock_event_reasons=column("clock_event_reasons", np.int64, 0),
        controller_ns=columns["controller_ns"].filled(np.int64, NO_NS),
    )


def _decoded(doc: Mapping[str, Any], records: Mapping[str, fleet.GpuRecord], memo: DecodeMemo) -> ReplicaAggregate:
    """Formats 1 and 2: everything in the one JSON document."""
    latest_cols = doc["latest"]
    peaks = doc["peaks"]
    gpus: list[str] | None = None
    if doc["version"] == 1:
        reported, peak_gpus = latest_cols["gpu_uuid"], peaks["gpu_uuid"]
    else:
        gpus = doc["gpus"]
        rows = latest_cols["rows"]
        reported = gpus if rows is None else _named(gpus, rows)
        peak_gpus = _peak_gpus(gpus, len(peaks["draw_w"]))
    nodes = _streams(doc["nodes"], gpus, memo)
    listed = {name: binary_columns.Column(values, None, None) for name, values in latest_cols.items()}
    for name in ("gpu_uuid", "rows"):
        listed.pop(name, None)
    peak_columns = {name: binary_columns.Column(peaks[name], None, None) for name in ("draw_w", "detect_w")}
    return _aggregate_of(doc, nodes, records, (reported, listed), (peak_gpus, peak_columns))


def _decoded_binary(
    header: Mapping[str, Any],
    data: memoryview,
    nodes: Mapping[str, NodeStream],
    gpus: list[str],
    records: Mapping[str, fleet.GpuRecord],
) -> ReplicaAggregate:
    """Format 3: the header, the columns in data, and the streams and GPUs of the streams part."""
    groups: dict[str, dict[str, binary_columns.Column]] = {}
    offset = 0
    for group in ("latest", "peaks", "rows"):
        groups[group], used = binary_columns.unpack(header["columns"][group], data[offset:])
        offset += used
    if offset != len(data):
        raise ValueError(f"{len(data) - offset} bytes after the columns")
    rows = groups["rows"].get("rows")
    reported = gpus if rows is None else _named(gpus, rows.values)
    peaks = groups["peaks"]
    peak_gpus = _peak_gpus(gpus, len(peaks["draw_w"].values))
    return _aggregate_of(header, nodes, records, (reported, groups["latest"]), (peak_gpus, peaks))


def _aggregate_of(
    doc: Mapping[str, Any],
    nodes: Mapping[str, NodeStream],
    records: Mapping[str, fleet.GpuRecord],
    latest_of: tuple[list[str], Mapping[str, binary_columns.Column]],
    peaks_of: tuple[list[str], Mapping[str, binary_columns.Column]],
) -> ReplicaAggregate:
    """The aggregate of a decoded document (or header): latest_of and peaks_of are (their GPUs, their columns)."""
    reported, latest_cols = latest_of
    peak_gpus, peaks = peaks_of
    readings = _readings({name: column.values for name, column in latest_cols.items()}, len(reported))
    latest = dict(zip(reported, readings, strict=True))
    return ReplicaAggregate(
        replica_id=str(doc["replica_id"]),
        built_unix_ns=int(doc["built_unix_ns"]),
        interval_s=float(doc["interval_s"]),
        nodes=nodes,
        records=records,
        latest=latest,
        latest_controller_ns=_present(reported, latest_cols["controller_ns"], int),
        draw_window_s=float(doc["draw_window_s"]),
        draw_peaks_w=_present(peak_gpus, peaks["draw_w"], float),
        detect_window_s=float(doc["detect_window_s"]),
        detect_peaks_w=_present(peak_gpus, peaks["detect_w"], float),
        bucket_ns=int(doc["bucket_ns"]),
        series=_rows_in(doc["series"]),
        tracked=frozenset(doc["tracked"]),
        tracked_series=_rows_in(doc["tracked_series"]),
        # A GPU named twice is one reading in `latest`: the rows would not match it row for row.
        latest_block=_block(latest_cols, reported) if len(latest) == len(reported) else None,
    )
