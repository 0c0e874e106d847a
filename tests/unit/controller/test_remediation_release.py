"""`rasctl release` without a ticket (an operator's own quarantine): what a passing validation must have covered.

DESIGN invariant 5: a quarantined GPU or node returns to service only after it passes validation.
The release counts a passing run only if it started after the quarantine and covered what is
released: the GPU, or every GPU of the node not quarantined on its own. Found by the invariant-5
audit: a run of one accused GPU released another GPU, and the whole node, of an operator's
quarantine; so did a stale answer of a run started before the quarantine. And once nothing holds a
node, the disruption budget stops counting it.
"""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client import CollectorRegistry

from rasd.controller import wiring
from rasd.controller.core import agent_messages as msgs
from rasd.controller.core import fleet, straggler_actions
from rasd.controller.core.remediation import events as health
from rasd.controller.observability import metrics
from rasd.controller.store import repo

T0_NS = 1_800_000_000 * 10**9
GPU_A = "GPU-00000000-0000-4000-8000-00000000000a"
GPU_B = "GPU-00000000-0000-4000-8000-00000000000b"
NODE = "node-1"


class _Rig:
    """A two-GPU node's remediation service on a real store, with a settable clock."""

    def __init__(self, url: str) -> None:
        self.now_ns = T0_NS
        self.store = repo.Store.open(url)
        self.wired = wiring.single_replica(self.store, metrics.ControllerMetrics(CollectorRegistry()), clock=self.clock)
        self.ingest = self.wired.ingest
        self.service = self.wired.remediation
        gpus = tuple(
            fleet.GpuRecord(uuid, "H100", f"0000:{18 + i}:00.0", 200, 700, 700, node_id=NODE)
            for i, uuid in enumerate((GPU_A, GPU_B))
        )
        self.store.register_hello(
            fleet.NodeHello(NODE, "boot-1", "0.1.0", NODE, "simulated", {"rack": "r1"}, gpus, 0), T0_NS
        )
        self.ingest.node_labels[NODE] = {"rack": "r1"}

    def clock(self) -> int:
        return self.now_ns

    def run(self, scenario) -> None:
        async def whole() -> None:
            await self.ingest.start()
            try:
                await scenario()
            finally:
                await self.ingest.stop()

        asyncio.run(whole())

    def open_command(self, kind: str):
        (command,) = [
            c
            for c in self.service.store.commands(node_id=NODE)
            if c.kind == kind and c.status in ("pending", "dispatched")
        ]
        return command

    async def answer(self, kind: str, verdict: str = "") -> None:
        command = self.open_command(kind)
        self.now_ns += 60 * 10**9
        await self.service.on_result(
            NODE,
            msgs.AgentResult(command_id=command.command_id, outcome=msgs.Outcome.SUCCEEDED, validation_verdict=verdict),
        )

    async def release(self, gpu_uuid: str = "") -> str:
        self.now_ns += 10**9
        try:
            return await self.service.operator_release(NODE, gpu_uuid, reason="test", force=False, actor="bob")
        except PermissionError as exc:
            return f"refused: {exc}"

    def quarantined(self) -> list[str]:
        return sorted(q["gpu_uuid"] or "node" for q in self.service.store.quarantines(node_id=NODE))


@pytest.fixture
def rig(tmp_path):
    r = _Rig(f"sqlite:///{tmp_path / 'rasd.db'}")
    yield r
    r.store.close()


def test_a_run_of_one_gpu_does_not_release_another_gpu_or_the_node(rig):
    out = {}

    async def scenario() -> None:
        await rig.service.operator_quarantine(NODE, GPU_B, reason="suspect HBM", actor="alice")
        rig.now_ns += 10**9
        await rig.service.accuse(NODE, GPU_A, reason="loss spike", accuser="job-7")  # validates GPU-A only
        await rig.answer("run_validation", "pass")
        out["gpu_b"] = await rig.release(GPU_B)
        await rig.service.operator_quarantine(NODE, "", reason="tray swap", actor="alice")
        out["node"] = await rig.release()
        out["quarantined"] = rig.quarantined()

    rig.run(scenario)
    assert out["gpu_b"].startswith("refused: no passing validation of " + GPU_B), out
    assert out["node"].startswith("refused: no passing validation of the node's GPUs"), out
    assert out["quarantined"] == [GPU_B, "node"]


def test_a_stale_run_started_before_the_quarantine_does_not_release_it(rig):
    out = {}

    async def scenario() -> None:
        await rig.service.accuse(NODE, GPU_A, reason="loss spike", accuser="job-7")
        run = rig.open_command("run_validation")
        rig.now_ns += 10**9
        await rig.service.operator_release(NODE, GPU_A, reason="need it", force=True, actor="bob")  # ticket closes
        rig.now_ns += 10**9
        await rig.service.operator_quarantine(NODE, "", reason="PSU alarm", actor="alice")
        rig.now_ns += 60 * 10**9
        await rig.service.on_result(  # the old run's answer, late: no ticket waits for it
            NODE,
            msgs.AgentResult(command_id=run.command_id, outcome=msgs.Outcome.SUCCEEDED, validation_verdict="pass"),
        )
        out["node"] = await rig.release()

    rig.run(scenario)
    assert out["node"].startswith("refused"), out


def test_a_node_an_operator_held_through_a_repair_leaves_the_budget_once_released(rig):
    out = {}

    async def scenario() -> None:
        await rig.service.operator_quarantine(NODE, "", reason="optics swap booked", actor="alice")
        rig.now_ns += 10**9
        event = repo.StoredEvent(
            node_id=NODE, seq=1, observed_unix_ns=rig.now_ns - 10**6, received_unix_ns=rig.now_ns,
            kind=int(health.EventKind.XID), severity=int(health.Severity.ERROR), gpu_uuid=GPU_A, xid=79,
            message="NVRM: Xid (PCI:0000:18:00): 79", source="kmsg", attributes={},
        )  # fmt: skip
        await rig.service.on_events(NODE, [event], {"rack": "r1"})  # fell off the bus: node quarantine + reboot
        out["counted"] = rig.service.budget.quarantined_nodes
        await rig.answer("reboot_node")
        await rig.answer("run_validation", "pass")  # the node stays quarantined: the operator holds it
        out["held"] = rig.quarantined()
        out["release"] = await rig.release()  # the post-reboot run covered every GPU
        out["budget"] = rig.service.budget.quarantined_nodes
        out["stored"] = rig.service.store.load_doc("budget")["quarantined_nodes"]

    rig.run(scenario)
    assert out["counted"] == (NODE,) and out["held"] == ["node"]
    assert out["release"] == "released after a passing validation"
    assert out["budget"] == () and out["stored"] == [], out


def test_a_stragglers_rungs_go_up_the_ladder_validate_then_quarantine_each_audited(rig):
    """The straggler watch's effects (issue #40): validation holds and tests the GPU, a pass releases it,
    the quarantine rung isolates it for a person; every effect has its audit row."""
    out = {}
    effect = straggler_actions.Effect

    async def scenario() -> None:
        actions = rig.service.stragglers
        await actions.carry_out(effect("notify", GPU_A, NODE, "straggler named: lags 70 ms"))
        out["after_notify"] = [c.kind for c in rig.service.store.commands(node_id=NODE)]
        await actions.carry_out(effect("validate", GPU_A, NODE, "still lags 70 ms: run the validation suite"))
        out["validating"] = rig.quarantined()
        await rig.answer("run_validation", "pass")
        out["released"] = rig.quarantined()
        rig.now_ns += 10 * 10**9
        await actions.carry_out(effect("quarantine", GPU_A, NODE, "still lags 70 ms after its validation"))
        out["quarantined"] = rig.quarantined()
        out["audit"] = [
            (a["action"], a["outcome"]) for a in rig.service.store.audit() if a["actor"] == "straggler-watch"
        ]

    rig.run(scenario)
    assert out["after_notify"] == []  # a notice alone changes nothing on the ladder
    assert out["validating"] == [GPU_A] and out["released"] == [] and out["quarantined"] == [GPU_A]
    assert sorted(out["audit"]) == [
        ("straggler_notify", "recorded"),
        ("straggler_quarantine", "handed to the ladder"),
        ("straggler_validate", "handed to the ladder"),
    ]


def test_a_job_stalls_restart_goes_up_the_ladder_once_and_a_second_replicas_restart_is_recorded_only(rig):
    """Issue #40: the restart rung is the ladder's restart_process on the named GPU (no quarantine); the
    same stall named by another replica, for another GPU, seconds later restarts nothing more."""
    out = {}
    effect = straggler_actions.Effect

    async def scenario() -> None:
        actions = rig.service.stragglers
        why = "the job's steps stopped 31 s ago (period 2.0 s, 15 periods); 15 of 16 GPUs still busy"
        await actions.carry_out(effect("stall", GPU_A, NODE, why))
        await actions.carry_out(effect("restart", GPU_A, NODE, why))
        rig.now_ns += 5 * 10**9
        await actions.carry_out(effect("restart", GPU_B, NODE, why))  # another replica's view of the stall
        out["commands"] = [(c.kind, c.gpu_uuid) for c in rig.service.store.commands(node_id=NODE)]
        out["quarantined"] = rig.quarantined()
        await rig.answer("restart_process")
        rig.now_ns += 200 * 10**9  # a later stall of the restarted job: restarted again
        await actions.carry_out(effect("restart", GPU_B, NODE, why))
        out["later"] = [(c.kind, c.gpu_uuid) for c in rig.service.store.commands(node_id=NODE)]
        out["audit"] = [
            (a["action"], a["gpu_uuid"], a["outcome"])
            for a in rig.service.store.audit()
            if a["actor"] == "straggler-watch"
        ]

    rig.run(scenario)
    assert out["commands"] == [("restart_process", GPU_A)] and out["quarantined"] == []
    assert out["later"] == [("restart_process", GPU_A), ("restart_process", GPU_B)]
    assert sorted(out["audit"]) == sorted(
        [
            ("straggler_stall", GPU_A, "recorded"),
            ("straggler_restart", GPU_A, "handed to the ladder"),
            ("straggler_restart", GPU_B, f"recorded: the job's restart through {GPU_A} is under way"),
            ("straggler_restart", GPU_B, "handed to the ladder"),
        ]
    )


def test_a_stragglers_raise_cap_becomes_a_floor_of_the_power_loop_and_its_later_rungs_remove_it(rig):
    """Issue #40: a raise_cap is handed to the power loop as a floor (audited as applied); a validate,
    quarantine or clear takes the floor away; without a power loop the raise is only recorded."""
    from rasd.controller.core.power import tree as power_tree
    from rasd.controller.power import loop as power_loop

    tree = power_tree.PowerTree.from_mapping(
        {"budget_w": 1400, "rows": [{"name": "r", "racks": [{"name": "k", "nodes": [{"name": NODE}]}]}]}
    )
    loop = power_loop.PowerLoop(rig.ingest, power_loop.PowerSettings(tree=tree))
    assert loop.power_room(GPU_A) is None  # a loop that does not run (a follower's) knows no headroom
    effect = straggler_actions.Effect
    raise_cap = effect("raise_cap", GPU_A, NODE, "power-throttled: cap raised 600 → 650 W within the budget", 650.0)
    out = {}

    async def scenario() -> None:
        actions = rig.service.stragglers
        await actions.carry_out(raise_cap)  # no power loop attached yet
        actions.floors = loop
        await actions.carry_out(raise_cap)
        out["floor"] = loop.floors[GPU_A]
        await actions.carry_out(effect("validate", GPU_A, NODE, "still lags 70 ms: run the validation suite"))
        out["after_validate"] = dict(loop.floors)
        await actions.carry_out(raise_cap)
        await actions.carry_out(effect("clear", GPU_A, NODE, "its lag stayed under the allowance for 10 steps"))
        out["after_clear"] = dict(loop.floors)
        out["audit"] = [
            (a["action"], a["outcome"]) for a in rig.service.store.audit() if a["actor"] == "straggler-watch"
        ]

    rig.run(scenario)
    floor = out["floor"]
    assert (floor.node_id, floor.floor_w, floor.reason) == (NODE, 650.0, raise_cap.reason)
    assert floor.expires_at_s > floor.set_at_s
    assert out["after_validate"] == {} and out["after_clear"] == {}
    assert sorted(out["audit"]) == [
        ("straggler_clear", "recorded"),
        ("straggler_raise_cap", "applied as a floor of 650 W"),
        ("straggler_raise_cap", "applied as a floor of 650 W"),
        ("straggler_raise_cap", "recorded: no power loop runs here"),
        ("straggler_validate", "handed to the ladder"),
    ]


def test_a_floor_outlives_its_leader_once_a_period_served_it(rig):
    """A new leader (or a restarted one) serves the floor its predecessor's period stored, and expiry still ends it."""
    from rasd.controller.core.power import floors as power_floors
    from rasd.controller.core.power import tree as power_tree
    from rasd.controller.power import loop as power_loop

    settings = power_loop.PowerSettings(
        tree=power_tree.PowerTree.from_mapping(
            {"budget_w": 1400, "rows": [{"name": "r", "racks": [{"name": "k", "nodes": [{"name": NODE}]}]}]}
        )
    )
    out = {}

    async def scenario() -> None:
        leader = power_loop.PowerLoop(rig.ingest, settings, clock=rig.clock)
        await leader.start()
        leader.set_floor(GPU_A, NODE, 650.0, "power-braked: raised 600 → 650 W")
        out["plan"] = await leader.step()
        await leader.stop()
        successor = power_loop.PowerLoop(rig.ingest, settings, clock=rig.clock)
        await successor.start()
        out["served"] = dict(successor.floors)
        await successor.stop()
        rig.now_ns += int(power_floors.TTL_S * 1e9)
        late = power_loop.PowerLoop(rig.ingest, settings, clock=rig.clock)
        await late.start()
        out["late"] = dict(late.floors)
        await late.stop()

    rig.run(scenario)
    assert out["plan"] is not None, "the period managed the node's GPUs (and so stored what it served)"
    (floor,) = out["served"].values()
    assert (floor.gpu_uuid, floor.floor_w, floor.reason) == (GPU_A, 650.0, "power-braked: raised 600 → 650 W")
    assert out["late"] == {}
