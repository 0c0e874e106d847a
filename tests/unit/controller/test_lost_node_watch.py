"""The leader's lost-node watch on a real store: a node no replica hears from is quarantined for a person, once.

The last-seen times are the store's, as every replica writes them (`Store.touch_nodes`); the watch's
NODE_LOST event goes through the real ladder (classify → escalate → blast radius → quarantine).
"""

from __future__ import annotations

import asyncio

import pytest
import sqlalchemy as sa
from prometheus_client import CollectorRegistry

from rasd.controller import wiring
from rasd.controller.core import agent_messages as msgs
from rasd.controller.core import fleet
from rasd.controller.core.remediation import policy as policy_mod
from rasd.controller.observability import metrics
from rasd.controller.store import repo

T0_NS = 1_800_000_000 * 10**9
S = 10**9


def _hello(node: str) -> fleet.NodeHello:
    gpu = f"GPU-00000000-0000-4000-8000-{int(node.rsplit('-', 1)[1]):012d}"
    gpus = (fleet.GpuRecord(gpu, "H100", "0000:18:00.0", 200, 700, 700, node_id=node),)
    return fleet.NodeHello(node, f"boot-{node}", "0.1.0", node, "simulated", {"rack": "r1"}, gpus, 0)


class _Rig:
    def __init__(self, url: str, nodes: int, *, lost: policy_mod.LostNodePolicy | None = None) -> None:
        self.now_ns = T0_NS
        self.store = repo.Store.open(url)
        self.registry = CollectorRegistry()
        pol = policy_mod.RemediationPolicy(lost_nodes=lost or policy_mod.LostNodePolicy())
        self.wired = wiring.single_replica(
            self.store,
            metrics.ControllerMetrics(self.registry),
            ladder=wiring.Ladder(policy=pol),
            clock=lambda: self.now_ns,
        )
        self.service = self.wired.remediation
        for index in range(nodes):
            self.store.register_hello(_hello(f"node-{index}"), T0_NS)

    def heard_from(self, *nodes: str) -> None:
        """A replica's flush: these nodes sent something now."""
        self.store.touch_nodes(dict.fromkeys(nodes, self.now_ns))

    def metric(self, name: str) -> float | None:
        return self.registry.get_sample_value(name)

    def run(self, scenario) -> None:
        async def whole() -> None:
            await self.wired.ingest.start()
            await self.service.start()
            try:
                await scenario()
            finally:
                await self.service.stop()
                await self.wired.ingest.stop()

        asyncio.run(whole())


@pytest.fixture
def rig(store_url):
    rig = _Rig(store_url, 3)
    yield rig
    rig.store.close()


def test_a_silent_node_is_quarantined_for_a_person_once_and_the_others_are_left_alone(rig):
    named: list[tuple[str, ...]] = []

    async def scenario() -> None:
        watch = rig.service.lost_nodes
        rig.now_ns += 30 * S
        rig.heard_from("node-0", "node-1", "node-2")
        rig.now_ns += 59 * S
        rig.heard_from("node-0", "node-2")
        named.append(await watch.check_once())  # node-1: silent 59 s
        rig.now_ns += 1 * S
        named.append(await watch.check_once())  # 60 s
        rig.now_ns += 10 * S
        rig.heard_from("node-0", "node-2")
        named.append(await watch.check_once())  # named once only

    rig.run(scenario)
    assert named == [(), ("node-1",), ()]
    (quarantine,) = rig.service.store.quarantines()
    assert (quarantine["node_id"], quarantine["gpu_uuid"], quarantine["port"]) == ("node-1", "", "")
    (ticket,) = rig.service.store.tickets(open_only=True)
    assert ticket["node_id"] == "node-1" and ticket["state"] == "awaiting_operator"
    assert "node lost: no replica has heard from its agent for 60 s" in ticket["steps"][0]
    audit = [row for row in rig.service.store.audit() if row["actor"] == "lost-node-watch"]
    assert [(row["action"], row["node_id"], row["outcome"]) for row in audit] == [
        ("node_lost", "node-1", "handed to the ladder")
    ]
    assert rig.metric("rasd_nodes_named_lost_total") == 1
    assert rig.metric("rasd_lost_nodes") == 1
    assert rig.metric("rasd_lost_node_storm") == 0


def test_a_job_stall_has_the_leader_look_at_once_and_take_a_node_silent_20_s_for_lost(rig):
    """Issue #40: a dead host hangs the job it runs; the straggler watch's "stall" (carried out by the
    leader's straggler actions) runs one check with stalled_lost_after_s (20 s) instead of 60 s."""
    from rasd.controller.core import straggler_actions

    named: list[tuple[str, ...]] = []

    async def scenario() -> None:
        watch = rig.service.lost_nodes
        rig.now_ns += 30 * S
        rig.heard_from("node-0", "node-1", "node-2")
        rig.now_ns += 19 * S
        rig.heard_from("node-0", "node-2")
        named.append(await watch.check_stalled())  # node-1 silent 19 s: not yet
        rig.now_ns += 2 * S
        named.append(await watch.check_once())  # the periodic check still waits for 60 s
        why = "the job's steps stopped 31 s ago; node node-1 fell silent: its host may be down"
        await rig.service.stragglers.carry_out(straggler_actions.Effect("stall", "GPU-x", "node-0", why))

    rig.run(scenario)
    assert named == [(), ()]
    (quarantine,) = rig.service.store.quarantines()
    assert quarantine["node_id"] == "node-1"
    (ticket,) = rig.service.store.tickets(open_only=True)
    assert (
        "no replica has heard from its agent for 21 s (lost after 20 s while the job it runs is stalled)"
        in (ticket["steps"][0])
    )
    assert policy_mod.LostNodePolicy().stalled_lost_after_s == 20.0
    with pytest.raises(policy_mod.PolicyError, match=r"lost_nodes\.stalled_lost_after_s"):
        policy_mod.LostNodePolicy.from_mapping({"stalled_lost_after_s": 5.0})


def test_a_lost_node_that_streams_again_is_validated_then_released_and_left_to_a_person_when_it_relapses(rig):
    steps: list[object] = []

    async def scenario() -> None:
        watch, store = rig.service.lost_nodes, rig.service.store
        rig.now_ns += 60 * S
        rig.heard_from("node-0", "node-2")
        assert await watch.check_once() == ("node-1",)
        rig.now_ns += 600 * S  # the host rebooted by itself: its agent streams again
        rig.heard_from("node-0", "node-1", "node-2")
        await watch.check_once()
        (run,) = [c for c in store.commands(node_id="node-1") if c.kind == "run_validation"]
        steps.append([q["node_id"] for q in store.quarantines()])  # still held while it validates
        await rig.service.on_result(
            "node-1",
            msgs.AgentResult(command_id=run.command_id, outcome=msgs.Outcome.SUCCEEDED, validation_verdict="pass"),
        )
        steps.append(store.quarantines())
        rig.now_ns += 60 * S  # lost again, and back again, the same day
        rig.heard_from("node-0", "node-2")
        assert await watch.check_once() == ("node-1",)
        rig.now_ns += 60 * S
        rig.heard_from("node-0", "node-1", "node-2")
        await watch.check_once()
        steps.append([c.kind for c in store.commands(node_id="node-1") if c.kind == "run_validation"])

    rig.run(scenario)
    held_while_validating, after_pass, validations = steps
    assert held_while_validating == ["node-1"]
    assert after_pass == []
    assert validations == ["run_validation"]  # the relapse was not validated: a person looks at it
    asked = [a for a in rig.service.store.audit(limit=1000) if a["actor"] == "lost-node-watch"]
    assert [(a["action"], a["node_id"]) for a in asked] == [
        ("node_lost", "node-1"),
        ("release", "node-1"),  # asked once: validation first, then the ladder released it
        ("node_lost", "node-1"),
    ]


def test_a_lost_node_the_store_could_not_take_is_named_again_at_the_next_check(rig):
    named: list[tuple[str, ...]] = []

    async def scenario() -> None:
        watch, store = rig.service.lost_nodes, rig.service.store
        commit = store.commit

        def unreachable(change):
            raise sa.exc.OperationalError("COMMIT", {}, ConnectionError("database unreachable"))

        rig.now_ns += 60 * S
        rig.heard_from("node-0", "node-2")
        store.commit = unreachable
        with pytest.raises(sa.exc.OperationalError):
            await watch.check_once()
        store.commit = commit
        rig.now_ns += 10 * S
        rig.heard_from("node-0", "node-2")
        named.append(await watch.check_once())

    rig.run(scenario)
    assert named == [("node-1",)]
    assert [q["node_id"] for q in rig.service.store.quarantines()] == ["node-1"]


def test_a_node_the_ladder_holds_or_is_rebooting_is_not_named_lost(rig):
    named: list[tuple[str, ...]] = []

    async def scenario() -> None:
        await rig.service.operator_quarantine("node-2", "", reason="maintenance", actor="ops")
        rig.now_ns += 600 * S
        rig.heard_from("node-0", "node-1")
        named.append(await rig.service.lost_nodes.check_once())

    rig.run(scenario)
    assert named == [()]
    assert rig.metric("rasd_lost_nodes") == 1  # silent, counted, but the ladder already holds it


def test_a_whole_fleet_falling_silent_at_once_is_a_storm_and_nothing_is_quarantined(store_url):
    rig = _Rig(store_url, 20, lost=policy_mod.LostNodePolicy(storm_min_nodes=4))
    named: list[tuple[str, ...]] = []

    async def scenario() -> None:
        rig.now_ns += 120 * S  # nobody heard from: the controller's side is suspect, not 20 hosts
        named.append(await rig.service.lost_nodes.check_once())

    try:
        rig.run(scenario)
        assert named == [()]
        assert rig.service.store.quarantines() == []
        assert rig.metric("rasd_lost_node_storm") == 1
        assert rig.metric("rasd_lost_nodes") == 20
    finally:
        rig.store.close()


def test_the_watch_can_be_switched_off(store_url):
    rig = _Rig(store_url, 1, lost=policy_mod.LostNodePolicy(enabled=False))

    async def scenario() -> None:
        assert rig.service.lost_nodes._task is None  # no loop runs; check_once is still there for a person

    try:
        rig.run(scenario)
    finally:
        rig.store.close()
