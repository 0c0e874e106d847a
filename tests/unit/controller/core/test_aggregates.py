"""What a replica ships the leader, and how the leader combines them (`core.aggregates`), pure."""

from __future__ import annotations

import dataclasses
import json
import math
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rasd.controller.core import aggregates, binary_columns, fleet

NOW_NS = 1_800_000_000 * 10**9


def _record(gpu: str, node: str, **fields) -> fleet.GpuRecord:
    return fleet.GpuRecord(gpu, "H100", "00000000:17:00.0", 200, 700, 700, node_id=node, **fields)


def _stream(node: str, gpus: tuple[str, ...], *, opened_ns: int = NOW_NS - 10**9, ahead_ns=None):
    return aggregates.NodeStream(node, f"s-{node}-{opened_ns}", opened_ns, f"boot-{node}", {"rack": "r1"}, gpus,
                                 ahead_ns)  # fmt: skip


def _aggregate(replica: str, nodes: dict[str, tuple[str, ...]], *, built_ns: int = NOW_NS, watts: float = 400.0,
               opened_ns: int = NOW_NS - 10**9, series=(), tracked=frozenset(), tracked_series=()):  # fmt: skip
    gpus = {g: node for node, gs in nodes.items() for g in gs}
    reading = fleet.GpuLatest(power_w=watts, power_sample_unix_ns=built_ns - 10**8, enforced_power_limit_w=700,
                              utilization_gpu_pct=90, counters_unix_ns=built_ns - 10**8)  # fmt: skip
    return aggregates.ReplicaAggregate(
        replica_id=replica,
        built_unix_ns=built_ns,
        interval_s=1.5,
        nodes={n: _stream(n, gs, opened_ns=opened_ns) for n, gs in nodes.items()},
        records={g: _record(g, n) for g, n in gpus.items()},
        latest=dict.fromkeys(gpus, reading),
        latest_controller_ns=dict.fromkeys(gpus, built_ns - 10**8),
        draw_window_s=5.0,
        draw_peaks_w=dict.fromkeys(gpus, watts + 50),
        detect_window_s=20.0,
        detect_peaks_w=dict.fromkeys(gpus, watts + 100),
        series=series,
        tracked=tracked,
        tracked_series=tracked_series,
    )


@pytest.mark.parametrize("version", aggregates.READ_FORMATS)
def test_an_aggregate_survives_its_encoding_field_for_field(version):
    record = _record("g1", "n1", serial="S1", power_smoothing_supported=True, labels={"numa_node": "0"})
    reading = fleet.GpuLatest(
        power_w=512.5,
        power_sample_unix_ns=NOW_NS,
        enforced_power_limit_w=650,
        clock_event_reasons=4,
        counters_unix_ns=NOW_NS - 5,
        power_limit_slew_target_w=690,
    )
    original = aggregates.ReplicaAggregate(
        replica_id="ctl-b",
        built_unix_ns=NOW_NS,
        interval_s=1.5,
        nodes={"n1": _stream("n1", ("g1", "g2"), ahead_ns=-7_000_000)},
        records={"g1": record, "g2": _record("g2", "n1")},
        latest={"g1": reading},  # g2 has not reported yet
        latest_controller_ns={"g1": NOW_NS - 9},
        draw_window_s=5.0,
        draw_peaks_w={"g1": 600.0},
        detect_window_s=20.0,
        detect_peaks_w={"g1": 640.0, "g2": 100.0},
        series=((NOW_NS - 10**8, 1112.5, 2),),
        tracked=frozenset({"g2"}),
        tracked_series=((NOW_NS - 10**8, 100.0, 1),),
    )
    back = aggregates.decode(aggregates.encode(original, version=version))
    for field in dataclasses.fields(original):
        if field.name != "latest_block":  # built by the decode (the original was built in code)
            assert getattr(back, field.name) == getattr(original, field.name), field.name
    block = back.latest_block
    assert block is not None and block.gpu_uuids == ["g1"]
    limits = [block.enforced_w[0], block.slew_target_w[0], block.power_w[0], block.clock_event_reasons[0]]
    assert limits == [650, 690, 512.5, 4]
    assert [block.counters_ns[0], block.power_sample_ns[0], block.controller_ns[0]] == [NOW_NS - 5, NOW_NS, NOW_NS - 9]
    assert math.isnan(block.utilization_pct[0]), "not reported"


def test_a_field_this_controller_does_not_know_is_left_out_and_a_missing_one_takes_its_default():
    """A replica of another version in a rolling update: its aggregate still reads, in JSON and in binary."""
    aggregate = _aggregate("b", {"n1": ("g1",)})
    inventory, rest = aggregates.split(aggregates.encode(aggregate, version=2))
    doc = json.loads(zlib.decompress(rest))
    doc["latest"]["power_mean_w"] = [410.0]  # a newer replica's field
    del doc["latest"]["temperature_c"]
    back = aggregates.decode(_framed(inventory, doc))
    assert back.latest["g1"].power_w == 400.0 and back.latest["g1"].temperature_c is None
    parts = _v3_parts(aggregate)
    parts.groups["latest"]["power_mean_w"] = [410.0]
    del parts.groups["latest"]["temperature_c"], parts.groups["latest"]["power_w"]
    back = aggregates.decode(parts.payload())
    assert back.latest["g1"].power_w is None and back.latest["g1"].enforced_power_limit_w == 700
    assert math.isnan(back.latest_block.power_w[0]) and back.latest_block.enforced_w[0] == 700


def _framed(inventory: bytes, doc) -> bytes:
    return len(inventory).to_bytes(4, "big") + inventory + zlib.compress(json.dumps(doc).encode())


def test_the_inventory_part_is_decoded_once_and_given_back_while_it_is_unchanged():
    """A replica's GPUs change only when its streams do: the leader keeps their records decoded."""
    first = _aggregate("b", {"n1": ("g1", "g2")}, watts=400.0)
    again = _aggregate("b", {"n1": ("g1", "g2")}, watts=500.0, built_ns=NOW_NS + 10**9)
    inventory = aggregates.encode_records(first.records)
    payload = aggregates.encode(again, records=inventory)
    assert aggregates.split(payload)[0] == inventory == aggregates.split(aggregates.encode(first))[0]
    records = aggregates.decode_records(inventory)
    back = aggregates.decode(payload, records=records)
    assert back.records is records and back.latest["g1"].power_w == 500.0


NO_GPUS = aggregates.encode_records({})
NO_GPUS_HEAD = len(NO_GPUS).to_bytes(4, "big") + NO_GPUS


@pytest.mark.parametrize(
    ("payload", "complaint"),
    [
        (b"not zlib", "not an encoded aggregate"),
        (_framed(b"", {"version": 99}), "aggregate format version 99; this controller reads 1, 2, 3"),
        (_framed(b"", {"version": 3}), "aggregate format version 3; this controller reads"),  # 3 is binary
        (NO_GPUS_HEAD + b"RAG\x09", "aggregate format version 9; this controller reads"),
        (NO_GPUS_HEAD + b"RAG\x01", "aggregate format version 1; this controller reads"),  # 1 is JSON
        (NO_GPUS_HEAD + b"RAG", "aggregate format version None"),
        (_framed(NO_GPUS, {"version": 1, "replica_id": "ctl-x"}), "damaged aggregate from 'ctl-x'"),
        (_framed(b"\x00junk", {"version": 1}), "not an encoded aggregate"),
    ],
)
def test_an_aggregate_that_cannot_be_read_is_refused_with_why(payload, complaint):
    with pytest.raises(aggregates.AggregateFormatError, match=complaint):
        aggregates.decode(payload)


def _v2_doc(aggregate: aggregates.ReplicaAggregate) -> tuple[bytes, dict]:
    inventory, rest = aggregates.split(aggregates.encode(aggregate, version=2))
    return inventory, json.loads(zlib.decompress(rest))


def test_format_2_names_each_gpu_once_and_reads_back_what_format_1_does():
    """A stream's GPU without a record, a GPU without a reading: rows into the one list of uuids."""
    aggregate = _aggregate("b", {"n1": ("g1", "g2"), "n2": ("g3",)})
    aggregate = dataclasses.replace(
        aggregate,
        nodes={**aggregate.nodes, "n3": _stream("n3", ("g9", "g1"))},  # g9: no record (its Hello raced the build)
        latest={g: r for g, r in aggregate.latest.items() if g != "g2"},
        latest_controller_ns={g: ns for g, ns in aggregate.latest_controller_ns.items() if g != "g2"},
    )
    _inventory, doc = _v2_doc(aggregate)
    assert doc["gpus"] == ["g1", "g2", "g3", "g9"] and doc["latest"]["rows"] == [0, 2]
    assert doc["nodes"]["gpu_rows"] == [[0, 1], [2], [3, 0]] and "gpu_uuid" not in doc["latest"]
    one, two = (aggregates.decode(aggregates.encode(aggregate, version=v)) for v in (1, 2))
    for field in dataclasses.fields(one):
        if field.name != "latest_block":
            assert getattr(two, field.name) == getattr(one, field.name), field.name
    assert two.latest_block is not None and two.latest_block.gpu_uuids == ["g1", "g3"]
    uuids = {f"n{i}": tuple(f"GPU-{i:08x}-0000-4000-8000-{g:012x}" for g in range(8)) for i in range(50)}
    whole = _aggregate("c", uuids)  # uuids of a real GPU's length
    _, whole_doc = _v2_doc(whole)
    assert whole_doc["latest"]["rows"] is None, "every GPU reported: no rows at all"
    sizes = [len(zlib.decompress(aggregates.split(aggregates.encode(whole, version=v))[1])) for v in (1, 2)]
    assert sizes[1] < 0.75 * sizes[0], sizes


@pytest.mark.parametrize(
    ("damage", "complaint"),
    [
        (lambda doc: doc["latest"].update(rows=[0, 7]), "outside the 3 GPUs listed"),
        (lambda doc: doc["latest"].update(rows=[-1, 0]), "outside the 3 GPUs listed"),
        (lambda doc: doc["nodes"].update(gpu_rows=[[0, 1], [5]]), "outside the 3 GPUs listed"),
        (lambda doc: doc["peaks"].update(draw_w=[1.0] * 4), "4 peaks for the 3 GPUs listed"),
        (lambda doc: doc["peaks"].update(detect_w=[1.0]), "damaged aggregate"),
        (lambda doc: doc.pop("gpus"), "damaged aggregate"),
    ],
)
def test_a_damaged_format_2_aggregate_is_refused_with_why(damage, complaint):
    inventory, doc = _v2_doc(_aggregate("b", {"n1": ("g1", "g2"), "n2": ("g3",)}))
    doc["latest"]["rows"] = [0, 1, 2]  # explicit rows, which the damage may change
    assert aggregates.decode(_framed(inventory, doc)).latest.keys() == {"g1", "g2", "g3"}
    damage(doc)
    with pytest.raises(aggregates.AggregateFormatError, match=complaint):
        aggregates.decode(_framed(inventory, doc))


@dataclasses.dataclass
class _V3:
    """A format 3 aggregate taken apart (the layout `aggregates.encode` documents), to damage and put together."""

    inventory: bytes
    streams: dict
    header: dict
    specs: dict
    groups: dict
    streams_part: bytes | None = None
    """Bytes to send as the streams part instead of `streams` encoded."""
    after_columns: bytes = b""

    def payload(self) -> bytes:
        streams_part = self.streams_part or zlib.compress(json.dumps(self.streams).encode())
        specs, data = {}, []
        for group, columns in self.groups.items():
            specs[group], packed = binary_columns.pack(columns)
            data.append(packed)
        header = json.dumps({**self.header, "columns": specs}).encode()
        readings = zlib.compress(len(header).to_bytes(4, "big") + header + b"".join(data) + self.after_columns)
        head = len(self.inventory).to_bytes(4, "big") + self.inventory + b"RAG\x03"
        return head + len(streams_part).to_bytes(4, "big") + streams_part + readings


def _v3_parts(aggregate: aggregates.ReplicaAggregate) -> _V3:
    inventory, rest = aggregates.split(aggregates.encode(aggregate, version=3))
    assert rest[:4] == b"RAG\x03"
    size = int.from_bytes(rest[4:8], "big")
    streams = json.loads(zlib.decompress(rest[8 : 8 + size]))
    body = zlib.decompress(rest[8 + size :])
    header_size = int.from_bytes(body[:4], "big")
    header = json.loads(body[4 : 4 + header_size])
    specs = header.pop("columns")
    groups, offset = {}, 4 + header_size
    for group in ("latest", "peaks", "rows"):
        columns, used = binary_columns.unpack(specs[group], memoryview(body)[offset:])
        groups[group] = {name: column.values for name, column in columns.items()}
        offset += used
    assert offset == len(body)
    return _V3(inventory, streams, header, specs, groups)


def test_format_3_carries_the_numbers_raw_and_reads_back_what_format_2_does():
    """The same aggregate as format 2's test; the readings' numbers as 8-byte values, a NaN included."""
    aggregate = _aggregate("b", {"n1": ("g1", "g2"), "n2": ("g3",)})
    nan_reading = aggregate.latest["g3"]._replace(power_w=math.nan, pcie_link=fleet.PcieLink(8, 16, 4, 5))
    aggregate = dataclasses.replace(
        aggregate,
        nodes={**aggregate.nodes, "n3": _stream("n3", ("g9", "g1"))},  # g9: no record (its Hello raced the build)
        latest={"g1": aggregate.latest["g1"], "g3": nan_reading},
        latest_controller_ns={g: ns for g, ns in aggregate.latest_controller_ns.items() if g != "g2"},
    )
    parts = _v3_parts(aggregate)
    assert parts.streams["gpus"] == ["g1", "g2", "g3", "g9"] and parts.groups["rows"] == {"rows": [0, 2]}
    assert parts.streams["nodes"]["gpu_rows"] == [[0, 1], [2], [3, 0]]
    kinds = {spec["name"]: spec["kind"] for group in parts.specs.values() for spec in group}
    assert (
        kinds["power_w"] == kinds["draw_w"] == "f8" and kinds["power_sample_unix_ns"] == kinds["controller_ns"] == "i8"
    )
    assert kinds["temperature_c"] == "none" and kinds["pcie_link"] == "json"
    two, three = (aggregates.decode(aggregates.encode(aggregate, version=v)) for v in (2, 3))
    for field in dataclasses.fields(two):
        if field.name not in ("latest", "latest_block"):
            assert getattr(three, field.name) == getattr(two, field.name), field.name
    assert three.latest["g1"] == aggregate.latest["g1"] and three.latest["g3"].pcie_link == nan_reading.pcie_link
    assert math.isnan(three.latest["g3"].power_w), "a NaN crosses as a NaN"
    assert type(three.latest["g1"].enforced_power_limit_w) is int and type(three.latest["g1"].power_w) is float
    for name in aggregates.BLOCK_COLUMNS:
        assert getattr(three.latest_block, name).tolist() == pytest.approx(
            getattr(two.latest_block, name).tolist(), nan_ok=True
        ), name
    assert three.latest_block.gpu_uuids == ["g1", "g3"]


def test_format_3_decodes_its_streams_part_once_while_it_is_unchanged():
    """A replica's streams change when nodes come and go; the leader keeps them decoded by the part's bytes."""
    memo = aggregates.DecodeMemo()
    first = aggregates.decode(aggregates.encode(_aggregate("b", {"n1": ("g1",)}), version=3), memo=memo)
    again = aggregates.decode(
        aggregates.encode(_aggregate("b", {"n1": ("g1",)}, watts=500.0, built_ns=NOW_NS + 10**9), version=3), memo=memo
    )
    assert again.nodes is first.nodes and again.latest["g1"].power_w == 500.0
    moved = aggregates.decode(
        aggregates.encode(_aggregate("b", {"n1": ("g1",)}, opened_ns=NOW_NS), version=3), memo=memo
    )
    assert moved.nodes["n1"].opened_unix_ns == NOW_NS, "a new stream: the part is decoded again"
    # A leader that reads format 2 for a while (a rolling upgrade), then 3 again: no stale streams.
    aggregates.decode(aggregates.encode(_aggregate("b", {"n2": ("g2",)}), version=2), memo=memo)
    back = aggregates.decode(
        aggregates.encode(_aggregate("b", {"n1": ("g1",)}, opened_ns=NOW_NS), version=3), memo=memo
    )
    assert set(back.nodes) == {"n1"}


def _short_streams_part(parts: _V3) -> bytes:
    payload = parts.payload()
    head = 4 + len(parts.inventory) + 4
    return payload[:head] + (10**6).to_bytes(4, "big") + payload[head + 4 :]


@pytest.mark.parametrize(
    ("damage", "complaint"),
    [
        (lambda p: p.groups.update(rows={"rows": [0, 7]}), "outside the 3 GPUs listed"),
        (lambda p: p.groups.update(rows={"rows": [-1, 0]}), "outside the 3 GPUs listed"),
        (lambda p: p.streams["nodes"].update(gpu_rows=[[0, 1], [5]]), "outside the 3 GPUs listed"),
        (lambda p: p.streams.update(gpus="g1"), "not a list of uuids"),
        (lambda p: p.groups["peaks"].update(draw_w=[1.0] * 4), "4 peaks for the 3 GPUs listed"),
        (lambda p: p.groups["peaks"].update(detect_w=[1.0]), "damaged aggregate from 'b'"),
        (lambda p: p.groups["latest"].update(power_w=[1.0]), "damaged aggregate from 'b'"),
        (lambda p: p.groups["latest"].pop("controller_ns"), "damaged aggregate from 'b'"),
        (lambda p: setattr(p, "after_columns", b"\x00" * 8), "8 bytes after the columns"),
        (lambda p: setattr(p, "streams_part", b"junk"), "not an encoded aggregate"),
        (lambda p: _short_streams_part(p), "a streams part of 1000000 bytes announced"),
        (lambda p: p.payload()[:-9], "not an encoded aggregate: the readings part"),
    ],
)
def test_a_damaged_format_3_aggregate_is_refused_with_why(damage, complaint):
    parts = _v3_parts(_aggregate("b", {"n1": ("g1", "g2"), "n2": ("g3",)}))
    parts.groups["rows"] = {"rows": [0, 1, 2]}  # explicit rows, which the damage may change
    assert aggregates.decode(parts.payload()).latest.keys() == {"g1", "g2", "g3"}
    damaged = damage(parts)
    with pytest.raises(aggregates.AggregateFormatError, match=complaint):
        aggregates.decode(damaged if isinstance(damaged, bytes) else parts.payload())


def test_an_aggregate_older_than_the_age_limit_and_the_readers_own_count_for_nothing():
    old = _aggregate("dead", {"n1": ("g1",)}, built_ns=NOW_NS - 20 * 10**9)
    own = _aggregate("leader", {"n2": ("g2",)})
    live = _aggregate("b", {"n3": ("g3",)}, built_ns=NOW_NS - 4 * 10**9)
    kept = aggregates.fresh([old, own, live], now_unix_ns=NOW_NS, max_age_s=5.0, exclude="leader")
    assert [a.replica_id for a in kept] == ["b"]


def test_a_node_on_two_replicas_is_the_newest_streams_and_its_gpus_its_data():
    """The node moved from c to b (c has not noticed its stream died): b's data, not c's older one."""
    old = _aggregate("c", {"n1": ("g1",), "n2": ("g2",)}, opened_ns=NOW_NS - 60 * 10**9, watts=100.0)
    new = _aggregate("b", {"n1": ("g1",)}, opened_ns=NOW_NS - 2 * 10**9, watts=500.0)
    merged = aggregates.merge([old, new])
    assert merged.holders == {"n1": "b", "n2": "c"}
    assert merged.nodes["n1"].session_id == new.nodes["n1"].session_id
    assert merged.latest["g1"].power_w == 500.0 and merged.latest["g2"].power_w == 100.0
    # A GPU's peak over the window is the highest either replica saw (its samples landed on both).
    assert merged.draw_peaks_w == {"g1": 550.0, "g2": 150.0}
    assert merged.replicas == ("b", "c")


def _merged_fields(merged: aggregates.FleetAggregate) -> dict:
    return {f.name: getattr(merged, f.name) for f in dataclasses.fields(merged) if f.name != "latest_block"}


@pytest.mark.parametrize("moved", [False, True], ids=["each node on one replica", "a node on two replicas"])
def test_a_merge_keeps_the_streams_and_inventory_merged_while_no_replica_changed_them(moved):
    """The leader merges six replicas' 100,000 records each period; while their streams and inventory
    are the objects it merged last (its decode gives them back unchanged), it takes them from its memo."""
    c_nodes = {"n1": ("g1",), "n2": ("g2",)} if moved else {"n2": ("g2",)}
    c = _aggregate("c", c_nodes, opened_ns=NOW_NS - 60 * 10**9, watts=100.0)
    b = _aggregate("b", {"n1": ("g1",), "n3": ("g3", "g4")}, opened_ns=NOW_NS - 2 * 10**9, watts=500.0)
    memo = aggregates.MergeMemo()
    first = aggregates.merge([b, c], memo=memo)
    assert _merged_fields(first) == _merged_fields(aggregates.merge([b, c])), "the same merge as without a memo"
    assert first.gpu_nodes == {"g1": "n1", "g2": "n2", "g3": "n3", "g4": "n3"}
    later = [dataclasses.replace(agg, latest={g: r._replace(power_w=600.0) for g, r in agg.latest.items()})
             for agg in (b, c)]  # fmt: skip
    second = aggregates.merge(later, memo=memo)  # a second later: new readings, the same streams
    assert second.records is first.records and second.nodes is first.nodes
    assert {r.power_w for r in second.latest.values()} == {600.0}
    assert _merged_fields(second) == _merged_fields(aggregates.merge(later))
    d = _aggregate("d", {"n5": ("g5",)})
    third = aggregates.merge([*later, d], memo=memo)  # another replica's streams: merged again
    assert third.records is not first.records and set(third.records) == {"g1", "g2", "g3", "g4", "g5"}
    assert _merged_fields(third) == _merged_fields(aggregates.merge([*later, d]))
    assert aggregates.merge([d, *later], memo=memo).holders == third.holders, "another order: merged again"


def _peak_maxima_by_loop(sources, records):
    """The per-GPU comparison `peak_maxima` must agree with, order included."""
    out = {}
    for source in sources:
        for gpu_uuid, peak_w in source.items():
            if gpu_uuid in records and peak_w > out.get(gpu_uuid, -math.inf):
                out[gpu_uuid] = peak_w
    return out


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.dictionaries(
            st.sampled_from(["g1", "g2", "g3", "g4", "g5"]),
            st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-5, 900)),
            max_size=5,
        ),
        max_size=4,
    ),
    st.frozensets(st.sampled_from(["g1", "g2", "g3", "g4", "g5"])),
)
def test_peak_maxima_taken_whole_equal_the_per_gpu_comparison_order_included(sources, known):
    records = dict.fromkeys(sorted(known))
    merged = aggregates.peak_maxima(sources, records)
    expected = _peak_maxima_by_loop(sources, records)
    assert list(merged.items()) == list(expected.items())  # a NaN peak is in neither


def test_a_peak_seen_by_two_replicas_is_the_higher_and_one_without_a_record_or_samples_is_left_out():
    assert aggregates.peak_maxima([{"g1": 500.0}, {"g1": 550.0, "g2": 10.0}], dict.fromkeys(["g1", "g2"])) == {
        "g1": 550.0, "g2": 10.0}  # fmt: skip
    assert aggregates.peak_maxima([{"g1": 500.0, "gx": 9.0}, {"g2": 10.0}], dict.fromkeys(["g1", "g2"])) == {
        "g1": 500.0, "g2": 10.0}  # fmt: skip
    assert aggregates.peak_maxima([{"g1": -math.inf, "g2": 10.0}], dict.fromkeys(["g1", "g2"])) == {"g2": 10.0}


def test_series_are_summed_per_bucket_and_complete_only_up_to_the_oldest_aggregate():
    t0 = NOW_NS - 10**9
    b = _aggregate("b", {"n1": ("g1",)}, built_ns=NOW_NS, series=((t0, 400.0, 1), (t0 + 10**8, 410.0, 1)))
    c = _aggregate("c", {"n2": ("g2",)}, built_ns=NOW_NS - 10**8, series=((t0, 300.0, 1),))
    merged = aggregates.merge([b, c])
    assert merged.series == ((t0, 700.0, 2), (t0 + 10**8, 410.0, 1))
    assert merged.complete_until_ns == NOW_NS - 10**8
    other_grid = aggregates.ReplicaAggregate(**{**c.__dict__, "bucket_ns": 250_000_000})
    assert aggregates.merge([b, other_grid]).series == b.series, "another bucket grid cannot be summed"


def test_the_tracked_series_counts_only_replicas_that_track_what_the_leader_asked():
    t0 = NOW_NS - 10**9
    asked = frozenset({"g1", "g2"})
    b = _aggregate("b", {"n1": ("g1",)}, series=((t0, 1.0, 1),), tracked=asked, tracked_series=((t0, 400.0, 1),))
    c = _aggregate("c", {"n2": ("g2",)}, series=((t0, 1.0, 1),), tracked=frozenset({"g9"}),
                   tracked_series=((t0, 999.0, 1),))  # fmt: skip
    merged = aggregates.merge([b, c], tracked=asked)
    assert merged.tracked_series == ((t0, 400.0, 1),), "c has not read the leader's new canaries yet"
    assert aggregates.merge([b, c]).tracked_series == ()


def test_overlaid_latest_keeps_the_local_streams_and_takes_the_newest_reading_per_family():
    local = {
        "g1": fleet.GpuLatest(power_w=1.0, power_sample_unix_ns=NOW_NS + 10**9),  # held here: kept as is
        "g2": fleet.GpuLatest(
            power_w=2.0,
            power_sample_unix_ns=NOW_NS - 10**10,
            counters_unix_ns=NOW_NS + 10**9,
            enforced_power_limit_w=300,
        ),
    }
    merged = aggregates.merge([_aggregate("b", {"n1": ("g1",), "n2": ("g2",)})])
    out = aggregates.overlay_latest(local, merged, local_nodes=["n1"])
    assert out["g1"] == local["g1"]
    assert out["g2"].power_w == 400.0, "the remote power sample is newer"
    assert out["g2"].enforced_power_limit_w == 300, "the local counters are newer"


def test_aggregate_reads_round_trip_and_a_bad_one_names_what_is_wrong():
    reads = aggregates.AggregateReads(interval_s=1.5, draw_window_s=5.0, detect_window_s=20.0, tracked=frozenset("a"))
    assert aggregates.AggregateReads.from_mapping(reads.to_mapping()) == reads
    with pytest.raises(aggregates.AggregateFormatError, match="interval_s"):
        aggregates.AggregateReads.from_mapping({"draw_window_s": 1, "detect_window_s": 1})
    with pytest.raises(aggregates.AggregateFormatError, match="must be > 0"):
        aggregates.AggregateReads.from_mapping({"interval_s": 0, "draw_window_s": 1, "detect_window_s": 1})
    with pytest.raises(aggregates.AggregateFormatError, match="no format listed"):
        aggregates.AggregateReads.from_mapping({**reads.to_mapping(), "formats": []})


def test_a_replica_ships_the_newest_format_the_leader_reads_and_format_1_to_a_leader_that_lists_none():
    """A leader before format 2 wrote its reads without `formats`: its replicas keep shipping what it reads."""
    asked_by_old_leader = {"interval_s": 1.5, "draw_window_s": 5.0, "detect_window_s": 20.0, "tracked": []}
    old = aggregates.AggregateReads.from_mapping(asked_by_old_leader)
    assert old.formats == (1,) and aggregates.write_format(old) == 1
    new = dataclasses.replace(old, formats=aggregates.READ_FORMATS)
    assert aggregates.AggregateReads.from_mapping(new.to_mapping()) == new and aggregates.write_format(new) == 3
    assert aggregates.write_format(dataclasses.replace(old, formats=(2, 1))) == 2, "a leader of format 2's version"
    assert aggregates.write_format(dataclasses.replace(old, formats=(4, 1))) == 1, "a format it does not write"
    with pytest.raises(ValueError, match="writes"):
        aggregates.encode(_aggregate("b", {"n1": ("g1",)}), version=4)


@pytest.mark.parametrize("version", aggregates.READ_FORMATS)
def test_a_remote_gpus_pcie_link_and_streams_come_back_as_they_were_sent(version):
    """The PCIe link crosses as a JSON list and is read back as a PcieLink; unchanged streams come from the memo."""
    from rasd.controller.core import aggregates as agg
    from rasd.controller.core import fleet as fl

    link = fl.PcieLink(8, 16, 4, 5)
    latest = fl.GpuLatest(power_w=300.0, power_sample_unix_ns=5, enforced_power_limit_w=700, counters_unix_ns=5,
                          pcie_link=link)  # fmt: skip
    record = fl.GpuRecord("g1", "H100", "00000000:18:00.0", 200, 700, 700, node_id="n1")
    stream = agg.NodeStream("n1", "s1", 1, "b1", {"rack": "r1"}, ("g1",), 0)
    sent = agg.ReplicaAggregate("r1", 10, 1.5, {"n1": stream}, {"g1": record}, {"g1": latest}, {"g1": 9}, 5.0,
                                {"g1": 300.0}, 20.0, {"g1": 310.0})  # fmt: skip
    memo = agg.DecodeMemo()
    first = agg.decode(agg.encode(sent, version=version), memo=memo)
    second = agg.decode(agg.encode(sent, version=version), memo=memo)
    assert first.latest["g1"] == latest
    assert isinstance(first.latest["g1"].pcie_link, fl.PcieLink) and first.latest["g1"].pcie_link.downtrained
    assert first.nodes == {"n1": stream}
    assert second.nodes is first.nodes
    assert second.draw_peaks_w == {"g1": 300.0} and second.detect_peaks_w == {"g1": 310.0}


def test_readings_built_in_bulk_are_the_values_the_constructor_builds_and_stay_frozen():
    link = fleet.PcieLink(16, 16, 5, 5)
    rows = [(612.5, 7, 700, 61, 98, 4, 9, True, 650, link), (None, 0, None, None, None, None, 0, None, None, None)]
    built = fleet.latest_rows(list(zip(*rows, strict=True)))
    assert built == [fleet.GpuLatest(*row) for row in rows]
    assert [hash(r) for r in built] == [hash(fleet.GpuLatest(*row)) for row in rows]
    with pytest.raises(AttributeError):
        built[0].power_w = 1.0  # type: ignore[misc]
    with pytest.raises(TypeError):
        fleet.latest_row(rows[0][:-1])  # a row short of a field
    with pytest.raises(ValueError, match="9 columns"):
        fleet.latest_rows(list(zip(*rows, strict=True))[:-1])
    with pytest.raises(ValueError):
        fleet.latest_rows([[1.0], *[[None, None]] * 9])  # columns of different lengths
