"""A recorded lost-node verdict is a replay input: fed to the ladder at its recorded time, never judged again."""

from __future__ import annotations

import asyncio

from rasd.api.v1 import agent_service_pb2 as agent_pb
from rasd.api.v1 import health_pb2 as health_pb
from rasd.controller.core.remediation import policy as policy_mod
from rasd.controller.observability import recording
from rasd.sim import replay

GPU = "GPU-00000000-0000-4000-8000-000000000001"
T0 = 1_800_000_000 * 10**9
S = 10**9


class _Clock:
    """The recorder's clock: the hello arrives at T0, the stream ends a second later."""

    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> int:
        return self.now


def _recording(path) -> recording.Recording:
    clock = _Clock()
    recorder = recording.Recorder(path, policy=policy_mod.RemediationPolicy(), clock=clock)
    hello = agent_pb.Hello(
        node_id="node-1",
        boot_id="boot-1",
        gpus=[health_pb.GpuInfo(uuid=GPU, power_limit_min_w=200, power_limit_max_w=700)],
    )
    recorder.inbound("s1", "node-1", agent_pb.AgentMessage(hello=hello))
    clock.now = T0 + 1 * S
    recorder.closed("s1", "node-1")
    recorder.node_lost(
        "node-1",
        message="no replica has heard from its agent for 61 s",
        last_seen_unix_ns=T0 + S,
        at_unix_ns=T0 + 62 * S,
    )
    clock.now = T0 + 120 * S
    recorder.close()
    return recording.read(path)


def test_the_recorded_verdict_quarantines_the_node_at_its_recorded_time_and_nothing_else_is_judged(tmp_path):
    rec = _recording(tmp_path / "run.rasdrec")
    run = asyncio.run(replay.replay(rec, rec.policy, work_dir=tmp_path))
    assert run.inputs["node_lost"] == 1
    decided = [(d.kind, d.node_id, d.at_unix_ns) for d in run.decisions]
    assert decided == [("quarantine_node", "node-1", T0 + 62 * S), ("notify", "node-1", T0 + 62 * S)]
