"""The recording file: header, length-delimited entries, cut-short files, bad files, write failures."""

from __future__ import annotations

import pathlib

import pytest

from rasd.api.v1 import agent_service_pb2 as agent_pb
from rasd.api.v1 import commands_pb2 as commands_pb
from rasd.api.v1 import health_pb2 as health_pb
from rasd.controller.core.remediation import actions
from rasd.controller.core.remediation import policy as policy_mod
from rasd.controller.observability import recording


class StepClock:
    def __init__(self, start_ns: int = 1_700_000_000_000_000_000) -> None:
        self.now = start_ns

    def __call__(self) -> int:
        self.now += 1_000_000
        return self.now


def _write_sample(path: pathlib.Path, policy: policy_mod.RemediationPolicy | None = None) -> None:
    recorder = recording.Recorder(path, policy=policy or policy_mod.RemediationPolicy(), clock=StepClock())
    recorder.inbound("s1", "node-1", agent_pb.AgentMessage(hello=agent_pb.Hello(node_id="node-1", boot_id="b")))
    event = health_pb.HealthEvent(seq=1, kind=health_pb.EVENT_KIND_XID, xid=13, message="x" * 300)
    recorder.inbound("s1", "node-1", agent_pb.AgentMessage(events=agent_pb.HealthEventBatch(events=[event])))
    recorder.outbound_command("s1", "node-1", commands_pb.Command(command_id="c1", reset_gpu=commands_pb.ResetGpu()))
    recorder.decisions(
        [actions.ResetGpu(ticket_id="t1", step=1, node_id="node-1", gpu_uuid="GPU-1", reason="xid 48")], 42
    )
    recorder.accusation("node-1", "GPU-2", reason="loss spike", accuser="job", at_unix_ns=43)
    recorder.node_lost(
        "node-2", message="no replica has heard from its agent for 61 s", last_seen_unix_ns=1, at_unix_ns=44
    )
    recorder.closed("s1", "node-1")
    recorder.close()


def test_a_recording_reads_back_entry_for_entry(tmp_path):
    path = tmp_path / "r.rasdrec"
    policy = policy_mod.RemediationPolicy.from_mapping(
        {"escalation": {"max_attempts_reset_gpu": 0}, "classification": {"xid_action_overrides": {"79": "rma"}}}
    )
    _write_sample(path, policy)
    rec = recording.read(path)
    assert path.read_bytes().startswith(recording.MAGIC)
    assert rec.header.format_version == 1 and rec.header.recorder == "rasd-controller"
    assert rec.policy == policy  # the header's policy goes through the same loader as controller.toml
    assert [e.WhichOneof("entry") for e in rec.entries] == [
        "inbound", "inbound", "outbound_command", "decision", "accusation", "node_lost", "closed",
    ]  # fmt: skip
    assert rec.entries[1].inbound.events.events[0].message == "x" * 300
    assert rec.entries[1].session_id == "s1" and rec.entries[1].node_id == "node-1"
    decision = rec.entries[3].decision
    assert decision.kind == "reset_gpu" and decision.step == 1 and rec.entries[3].at_unix_ns == 42
    assert decision.command_id == actions.command_id_for("t1", 1, "reset_gpu")
    assert rec.entries[4].accusation.accuser == "job" and rec.entries[4].at_unix_ns == 43
    lost = rec.entries[5]
    assert (lost.node_id, lost.node_lost.last_seen_unix_ns, lost.at_unix_ns) == ("node-2", 1, 44)
    assert rec.entries[0].at_unix_ns < rec.entries[1].at_unix_ns  # arrival times from the controller clock
    assert rec.truncated_at is None


def test_a_file_cut_mid_entry_keeps_every_whole_entry(tmp_path):
    path = tmp_path / "r.rasdrec"
    _write_sample(path)
    whole = path.read_bytes()
    path.write_bytes(whole[:-3])
    rec = recording.read(path)
    assert len(rec.entries) == 6 and rec.truncated_at is not None and rec.truncated_at < len(whole)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"PK\x03\x04 not a recording", "not a rasd recording"),
        (recording.MAGIC, "header missing or corrupt"),
        (recording.MAGIC + b"\x05abc", "header is corrupt"),
    ],
)
def test_a_file_that_is_not_a_recording_is_refused_with_a_reason(tmp_path, content, message):
    path = tmp_path / "bad.rasdrec"
    path.write_bytes(content)
    with pytest.raises(recording.RecordingError, match=message):
        recording.read(path)


def test_an_unknown_format_version_is_refused(tmp_path):
    from rasd.api.v1 import recording_pb2

    header = recording_pb2.RecordingHeader(format_version=2).SerializeToString()
    path = tmp_path / "v2.rasdrec"
    path.write_bytes(recording.MAGIC + bytes([len(header)]) + header)
    with pytest.raises(recording.RecordingError, match="format_version 2 is not supported"):
        recording.read(path)


def test_a_full_disk_stops_the_recording_and_nothing_else():
    recorder = recording.Recorder(pathlib.Path("/dev/full"), policy=policy_mod.RemediationPolicy(), flush_interval_s=0)
    big = agent_pb.AgentMessage(telemetry=health_pb.TelemetryBatch(power=[health_pb.PowerSeries(power_w=[1.0] * 9000)]))
    for _ in range(40):  # well past the write buffer: the first failed write ends the recording
        recorder.inbound("s", "n", big)
    recorder.close()
    assert recorder.entries == 1


def test_a_restart_with_the_same_path_keeps_the_earlier_recording(tmp_path):
    path = tmp_path / "r.rasdrec"
    _write_sample(path)
    first = path.read_bytes()
    recording.Recorder(path, policy=policy_mod.RemediationPolicy()).close()
    kept = [p for p in tmp_path.iterdir() if p.name.startswith("r.rasdrec.")]
    assert len(kept) == 1 and kept[0].read_bytes() == first
    assert recording.read(path).entries == []


def test_rasd_controller_takes_record():
    from rasd.controller import main

    assert main.build_parser().parse_args(["--record", "run.rasdrec"]).record == pathlib.Path("run.rasdrec")
