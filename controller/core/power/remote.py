"""The power period's inputs over every node: the leader's own view with the other replicas' laid over it.

With several replicas the loop runs on the leader, whose ingest holds only its own streams. This
module owns how the other replicas' aggregates (`core.aggregates.FleetAggregate`) complete the
period's inputs (`inputs.FleetView`, `inputs.WindowView`), so that `period.step` sees every node as
if its stream ended here:

- a node whose stream the leader holds keeps the leader's view exactly; a node held by another
  replica gets that replica's stream (session, boot id, labels, GPUs), records and telemetry (the
  newest per family, `fleet.merge_latest`), and its controller-time sample stamps;
- each GPU's draw peak (and the detector's per-GPU peak) is the highest either side saw;
- the aggregate series are summed per bucket, and cut where the oldest aggregate ends: a bucket
  after it would hold only some replicas' GPUs and show a dip that is not there.

A node no fresh aggregate names is not in `sessions`: unreachable, its GPUs counted at the cap that
may be in force, as for a node whose agent is gone.

Pure: no I/O, no logging, no clock reads.
"""

from __future__ import annotations

import types
from collections.abc import Mapping
from typing import Any

from rasd.controller.core import aggregates, fleet
from rasd.controller.core.power import inputs as period_inputs


def _remote_nodes(
    local: period_inputs.FleetView, remote: aggregates.FleetAggregate
) -> dict[str, aggregates.NodeStream]:
    """The other replicas' nodes whose streams the leader does not hold itself."""
    return {node_id: stream for node_id, stream in remote.nodes.items() if node_id not in local.sessions}


def fleet_view(local: period_inputs.FleetView, remote: aggregates.FleetAggregate) -> period_inputs.FleetView:
    """The leader's fleet view with the other replicas' nodes laid over it (see the module docstring).

    Whole mappings are laid over the leader's, and only the GPUs both sides know are taken one by
    one: 100,000 remote GPUs each period, where a GPU-by-GPU pass was a tenth of the period.
    """
    nodes = _remote_nodes(local, remote)
    if not nodes:
        return local
    own = _own_gpus(nodes, remote)
    records = {**local.records, **_less(remote.records, own)}
    gpu_nodes = dict(local.gpu_nodes)
    if len(nodes) == len(remote.nodes) and len(remote.gpu_nodes):  # every remote node: its GPUs as merged
        gpu_nodes.update(remote.gpu_nodes)
    else:
        gpu_nodes.update((g, stream.node_id) for stream in nodes.values() for g in stream.gpu_uuids)
    remote_latest = _less(remote.latest, own)
    latest = {**local.latest, **remote_latest}
    for gpu_uuid in local.latest.keys() & remote_latest.keys():  # newest per family
        latest[gpu_uuid] = fleet.merge_latest(local.latest[gpu_uuid], remote_latest[gpu_uuid])
    remote_ns = _less(remote.latest_controller_ns, own)
    controller_ns = {**local.latest_controller_ns, **remote_ns}
    # The later of the two sides' times, and never below 0 (a time the leader does not know is 0).
    if min(remote_ns.values(), default=0) < 0:
        controller_ns.update((g, 0) for g, at_ns in remote_ns.items() if at_ns < 0)
    local_ns = local.latest_controller_ns
    for gpu_uuid in local_ns.keys() & remote_ns.keys():
        controller_ns[gpu_uuid] = max(remote_ns[gpu_uuid], local_ns[gpu_uuid])
    return period_inputs.FleetView(
        records=types.MappingProxyType(records),
        known_records=local.known_records,
        gpu_nodes=types.MappingProxyType(gpu_nodes),
        node_gpus={**local.node_gpus, **{n: s.gpu_uuids for n, s in nodes.items()}},
        boot_ids={**local.boot_ids, **{n: s.boot_id for n, s in nodes.items()}},
        sessions={**local.sessions, **{n: s.session_id for n, s in nodes.items()}},
        node_labels={**local.node_labels, **{n: s.labels for n, s in nodes.items()}},
        latest=types.MappingProxyType(latest),
        latest_controller_ns=types.MappingProxyType(controller_ns),
        telemetry_interval_s=local.telemetry_interval_s,
        latest_block=_block(local, own, remote),
    )


def _own_gpus(nodes: Mapping[str, aggregates.NodeStream], remote: aggregates.FleetAggregate) -> set[str]:
    """The remote GPUs of the nodes the leader holds itself (and no other remote node names): its own view's."""
    own = {g for node_id in remote.nodes.keys() - nodes.keys() for g in remote.nodes[node_id].gpu_uuids}
    if own:  # a GPU also under a node held elsewhere is that node's (mostly there is none: no pass over all)
        own.difference_update(g for stream in nodes.values() for g in stream.gpu_uuids)
    return own


def _less(mapping: Mapping[str, Any], gpu_uuids: set[str]) -> Mapping[str, Any]:
    """mapping without gpu_uuids (itself when there are none to leave out, as mostly)."""
    if not gpu_uuids:
        return mapping
    return {g: value for g, value in mapping.items() if g not in gpu_uuids}


def _block(
    local: period_inputs.FleetView, own: set[str], remote: aggregates.FleetAggregate
) -> aggregates.LatestBlock | None:
    """The remote block's rows whose readings the view took from the remote side unchanged (see `fleet_view`).

    Left out: the GPUs of nodes the leader holds itself, and those the leader has a reading or a
    controller time of (their reading is merged with the leader's, their time the later one).
    Controller times below 0 read as 0, as `fleet_view` sets them.
    """
    block = remote.latest_block
    if block is None:
        return None
    mixed = (local.latest.keys() | local.latest_controller_ns.keys()) & block.row_of.keys()
    return block.without([*own, *mixed]).controller_ns_from_zero()


def _peaks(local: Mapping[str, float], remote: Mapping[str, float]) -> dict[str, float]:
    if not local:  # the leader holds no stream: the remote peaks that count (a NaN never does), copied whole
        return aggregates.peak_maxima([remote], remote)
    out = dict(local)
    for gpu_uuid, peak_w in remote.items():
        if peak_w > out.get(gpu_uuid, float("-inf")):
            out[gpu_uuid] = peak_w
    return out


def _summed(
    local: period_inputs.Rows, remote: period_inputs.Rows, since_ns: int, until_ns: int | None
) -> period_inputs.Rows:
    """Local and remote rows from since_ns, summed per bucket, up to (not including) until_ns."""
    by_bucket: dict[int, list[float]] = {}
    for rows in (local, remote):
        for start_ns, watts, gpus in rows:
            if start_ns < since_ns or (until_ns is not None and start_ns >= until_ns):
                continue
            cell = by_bucket.setdefault(start_ns, [0.0, 0])
            cell[0] += watts
            cell[1] += gpus
    return tuple((start, total, int(count)) for start, (total, count) in sorted(by_bucket.items()))


def window_view(
    local: period_inputs.WindowView,
    remote: aggregates.FleetAggregate,
    reads: period_inputs.WindowReads,
) -> period_inputs.WindowView:
    """The leader's power window with the other replicas' peaks and series added (see the module docstring).

    `local` was read as `reads` asked; the remote peaks are over the windows the leader asked the
    replicas for (`aggregates.AggregateReads`), ending when each aggregate was built.
    """
    if not remote.nodes and not remote.series:
        return local
    until = remote.complete_until_ns
    detect = reads.detect_since_unix_ns
    remote_swing = remote.tracked_series if reads.swing_tracked else remote.series
    return period_inputs.WindowView(
        sample_hz=local.sample_hz,
        draw_peaks_w=_peaks(local.draw_peaks_w, remote.draw_peaks_w),
        status_rows=_summed(local.status_rows, remote.series, reads.status_since_unix_ns, until),
        swing_rows=_summed(local.swing_rows, remote_swing, detect, until) if detect is not None else (),
        straggler_peaks_w=_peaks(local.straggler_peaks_w, remote.detect_peaks_w)
        if local.straggler_peaks_w is not None
        else None,
    )
