"""The power loop end to end: a real controller and simulated agents over loopback gRPC.

The invariant is checked on the simulated GPUs themselves (the limits they enforce), sampled every
few milliseconds while the loop works: a budget cut is enforced on the GPUs, the watts it frees go
elsewhere only after the decreases are confirmed, and a restarted controller continues the same
apply state (no command id reused, the operator's budget kept).
"""

from __future__ import annotations

import asyncio
import dataclasses
import pathlib
import sys
import time

import grpc
import pytest
import structlog.testing

from rasd.agent import runtime, spool
from rasd.agent import settings as agent_settings
from rasd.agent.gpu import simulated, step_job
from rasd.api.v1 import admin_service_pb2 as admin_pb
from rasd.api.v1 import admin_service_pb2_grpc as admin_grpc
from rasd.controller import server
from rasd.controller.core.power import apply as power_apply
from rasd.controller.core.power import start_smoothing, swing
from rasd.controller.power import loop as power_loop
from rasd.controller.store import remediation as rstore

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "fakes"))
import redfish_stub

FAST_LINK = {
    "telemetry_send_interval_ms": 200,
    "reconnect_initial_s": 0.05,
    "reconnect_max_s": 0.3,
    "heartbeat_interval_ms": 500,
}
TREE = {
    "name": "cluster",
    "budget_w": 4400,
    "rows": [
        {
            "name": "row-0",
            "racks": [
                {"name": "rack-a", "budget_w": 2800, "nodes": [{"name": "node-a"}]},
                {"name": "rack-b", "budget_w": 2800, "nodes": [{"name": "node-b"}]},
            ],
        }
    ],
}
POWER = {"tree": TREE, "policy": {"control_period_s": 0.5, "command_ttl_s": 2.0}, "detect_window_s": 5.0}


def _controller(tmp_path, port, *, power=POWER, bmc=None):
    return server.Controller(
        server.ControllerSettings(
            listen=f"127.0.0.1:{port}",
            db_url=f"sqlite:///{tmp_path / 'rasd.db'}",
            metrics_port=None,
            remediation=False,
            power=power,
            bmc=bmc,
        )
    )


class Fleet:
    """Two simulated nodes of 4 H100s running one synchronous job."""

    def __init__(
        self,
        address: str,
        gpu_model: simulated.SimulatedGpuModel = simulated.H100_SXM,
        *,
        clock_ahead_s: float = 0.0,
    ) -> None:
        workload = simulated.StepWorkload(period_s=1.0)
        ahead_ns = int(clock_ahead_s * 1e9)
        self.job = step_job.StepJob(workload.shape(), seed=1)
        self.backends = {
            n: simulated.SimulatedBackend(n, 4, 1, workload=workload, job=self.job, gpu_model=gpu_model)
            for n in ("node-a", "node-b")
        }
        self.agents = [
            runtime.Agent(
                agent_settings.AgentSettings(
                    node_id=n,
                    link=agent_settings.LinkSettings(controller_address=address, **FAST_LINK),
                    sampling=agent_settings.SamplingSettings(counter_interval_ms=200),
                ),
                b,
                spool.Spool(":memory:"),
                boot_id=f"boot-{n}",
                clock=lambda: time.time_ns() + ahead_ns,
            )
            for n, b in self.backends.items()
        ]
        self.stops = {a.identity.node_id: asyncio.Event() for a in self.agents}
        self.tasks = {
            a.identity.node_id: asyncio.create_task(a.run(self.stops[a.identity.node_id])) for a in self.agents
        }

    async def stop_agent(self, node_id: str) -> None:
        self.stops[node_id].set()
        await self.tasks[node_id]

    def start_agent(self, node_id: str) -> None:
        agent = next(a for a in self.agents if a.identity.node_id == node_id)
        self.stops[node_id] = asyncio.Event()
        self.tasks[node_id] = asyncio.create_task(agent.run(self.stops[node_id]))

    def caps_w(self, node_id: str) -> int:
        return sum(c.enforced_power_limit_w for c in self.backends[node_id].read_counters(1))

    async def close(self) -> None:
        for stop in self.stops.values():
            stop.set()
        await asyncio.gather(*self.tasks.values())


async def _until(predicate, timeout_s=20.0):
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not predicate():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.02)


def _settled(controller) -> bool:
    state = controller.power.state
    return (
        state is not None
        and len(state.gpus) == 8
        and bool((state.pending_seq == power_apply.NO_COMMAND).all())
        and not (state.confirmed_w != state.confirmed_w).any()  # no NaN: every GPU read back
    )


@pytest.mark.parametrize("agent_clock_ahead_s", [0.0, 7200.0], ids=["agents-on-time", "agents-2h-ahead"])
def test_budget_cut_is_enforced_on_the_gpus_and_freed_watts_move_only_after_confirmation(
    tmp_path, free_port, agent_clock_ahead_s
):
    """Also with the agents' clocks 2 h ahead: the loop compares their stamps with its own deadlines."""

    async def scenario():
        controller = _controller(tmp_path, free_port)
        await controller.start()
        fleet = Fleet(controller.address, clock_ahead_s=agent_clock_ahead_s)
        channel = grpc.aio.insecure_channel(controller.address)
        admin = admin_grpc.AdminServiceStub(channel)
        violations: list[str] = []
        budgets = {"cluster": 4400, "node-a": None}
        sampling = True

        async def watch():
            # The invariant on the GPUs themselves, every 2 ms.
            while sampling:
                a, b = fleet.caps_w("node-a"), fleet.caps_w("node-b")
                if a + b > budgets["cluster"]:
                    violations.append(f"cluster {a + b} W > {budgets['cluster']} W")
                if budgets["node-a"] is not None and a > budgets["node-a"]:
                    violations.append(f"node-a {a} W > {budgets['node-a']} W after its cut was enforced")
                # Read-backs and acks are dated in the controller's time, whatever the agents' clocks say.
                state = controller.power.state
                if state is not None and state.confirmed_at_s.max() > time.time() + 1.0:
                    violations.append(f"a read-back dated {state.confirmed_at_s.max() - time.time():.0f} s ahead")
                await asyncio.sleep(0.002)

        try:
            # From the default 700 W caps (5,600 W > 4,400 W) down to the cluster budget.
            await _until(lambda: _settled(controller) and fleet.caps_w("node-a") + fleet.caps_w("node-b") <= 4400)
            watcher = asyncio.create_task(watch())
            status = await admin.GetPowerStatus(admin_pb.GetPowerStatusRequest(), timeout=5)
            assert status.root.domain_id == "cluster" and status.root.budget_w == 4400
            assert status.root.allocated_w <= 4400
            before_b = fleet.caps_w("node-b")
            increases_before = controller.power.stats.increases_sent

            cut_at = asyncio.get_running_loop().time()
            await admin.SetPowerBudget(
                admin_pb.SetPowerBudgetRequest(domain_id="node-a", budget_w=1200, reason="test"), timeout=5
            )
            await _until(lambda: fleet.caps_w("node-a") <= 1200, timeout_s=5)
            enforced_s = asyncio.get_running_loop().time() - cut_at
            budgets["node-a"] = 1200
            # node-b is capped (its GPUs want ~675 W): it gets the freed watts, within the cluster budget.
            await _until(lambda: fleet.caps_w("node-b") > before_b + 200, timeout_s=10)
            await asyncio.sleep(1.0)
            sampling = False
            await watcher
            status = await admin.GetPowerStatus(admin_pb.GetPowerStatusRequest(), timeout=5)
            with pytest.raises(grpc.aio.AioRpcError) as not_found:
                await admin.SetPowerBudget(admin_pb.SetPowerBudgetRequest(domain_id="nope", budget_w=1), timeout=5)
            with pytest.raises(grpc.aio.AioRpcError) as too_low:
                await admin.SetPowerBudget(admin_pb.SetPowerBudgetRequest(domain_id="node-a", budget_w=100), timeout=5)
            return (
                enforced_s,
                controller.power.stats.increases_sent - increases_before,
                violations,
                status,
                not_found.value.code(),
                too_low.value.details(),
            )
        finally:
            await channel.close()
            await fleet.close()
            await controller.stop()

    enforced_s, increases, violations, status, not_found, too_low = asyncio.run(scenario())
    assert enforced_s < 1.0
    assert increases > 0
    assert violations == []
    node_a = status.root.children[0].children[0].children[0]
    assert node_a.domain_id == "node-a" and node_a.budget_w == 1200 and node_a.allocated_w <= 1200
    assert status.root.allocated_w <= 4400 and status.periods > 0
    assert not_found == grpc.StatusCode.NOT_FOUND
    assert "minimum caps" in too_low


def test_a_restarted_controller_continues_the_apply_state_and_keeps_the_operator_budget(tmp_path, free_port):
    async def scenario():
        controller = _controller(tmp_path, free_port)
        await controller.start()
        fleet = Fleet(controller.address)
        try:
            await _until(lambda: _settled(controller))
            await controller.power.set_budget("rack-b", 1600, reason="test")
            await _until(lambda: fleet.caps_w("node-b") <= 1600 and _settled(controller))
            before = controller.power.state
            await controller.stop()

            controller = _controller(tmp_path, free_port)
            await controller.start()
            restored = controller.power.state
            await _until(lambda: _settled(controller))
            after = controller.power.state
            budget = controller.power.tree.domain("rack-b").budget_w
            return before, restored, after, budget, fleet.caps_w("node-b")
        finally:
            await fleet.close()
            await controller.stop()

    before, restored, after, budget, caps_b = asyncio.run(scenario())
    assert restored.epoch == before.epoch and restored.next_seq == before.next_seq
    assert [g.gpu_uuid for g in restored.gpus] == [g.gpu_uuid for g in before.gpus]
    assert after.next_seq >= before.next_seq  # ids continue: never an id an agent already executed
    assert budget == 1600 and caps_b <= 1600


def test_a_restarted_controller_counts_the_caps_of_a_node_whose_agent_has_not_come_back(tmp_path, free_port):
    """node-b's agent is gone when the controller restarts; its GPUs keep their caps all the same.

    Counting only the GPUs whose agents said Hello since the restart gave node-b's watts to node-a:
    the cluster's enforced caps went over its 4,400 W budget.
    """

    async def scenario():
        controller = _controller(tmp_path, free_port)
        await controller.start()
        fleet = Fleet(controller.address)
        try:
            await _until(lambda: _settled(controller) and fleet.caps_w("node-a") + fleet.caps_w("node-b") <= 4400)
            await fleet.stop_agent("node-b")  # an agent crash or a partition: its GPUs keep their caps
            await _until(lambda: "node-b" not in controller.ingest.sessions, timeout_s=60)
            await controller.stop()
            controller = _controller(tmp_path, free_port)
            await controller.start()
            worst_w = 0
            deadline = asyncio.get_running_loop().time() + 6.0  # a dozen periods with node-a back alone
            while asyncio.get_running_loop().time() < deadline:
                worst_w = max(worst_w, fleet.caps_w("node-a") + fleet.caps_w("node-b"))
                await asyncio.sleep(0.01)
            return worst_w, {g.node_id for g in controller.power.state.gpus}, controller.power.stats.periods
        finally:
            await fleet.close()
            await controller.stop()

    worst_w, nodes, periods = asyncio.run(scenario())
    assert periods > 5
    assert nodes == {"node-a", "node-b"}, "node-b's GPUs are still counted"
    assert worst_w <= 4400


def test_an_unreachable_node_is_held_at_its_caps_until_its_bmc_confirms_a_limit(tmp_path, free_port, monkeypatch):
    monkeypatch.setenv("RASD_TEST_BMC_PW", "secret")
    # The BMC first ignores the limit it is sent (accepts the PATCH, reads back no limit), so the
    # node's standing "over budget while unreachable" is observed however slow the machine is; then
    # it honours it.
    stub = redfish_stub.StubRedfish(honour_power_limit=False)
    stub.start()
    bmc_table = {"nodes": {"node-a": {"url": stub.url, "username": "admin", "password_env": "RASD_TEST_BMC_PW"}}}
    power = {**POWER, "bmc_fallback_after_s": 0.5}

    async def scenario():
        controller = _controller(tmp_path, free_port, power=power, bmc=bmc_table)
        await controller.start()
        fleet = Fleet(controller.address)
        loop = controller.power
        try:
            await _until(lambda: _settled(controller))
            held = fleet.caps_w("node-a")
            await fleet.stop_agent("node-a")
            # The stream ends when the controller sees the agent's half-close (or, if that is lost, by
            # the keepalive timeout).
            await _until(lambda: "node-a" not in controller.ingest.sessions, timeout_s=60)
            await loop.set_budget("node-a", 1200, reason="feed maintenance")
            # The agent cannot take the decrease: the node still counts at its caps...
            await _until(lambda: "node-a" in loop.status.over_budget and stub.power_limit_patches, timeout_s=15)
            over_while_unreachable = loop.status.over_budget
            assert loop.stats.bmc_limits == 0, "an unconfirmed BMC limit must not count"
            # ...until the BMC confirms a node limit within the budget.
            stub.honour_power_limit = True
            await _until(lambda: loop.stats.bmc_limits > 0 and not loop.status.over_budget, timeout_s=15)
            node_a = loop.status.root.children[0].children[0].children[0]
            limited = (stub.power_limit_w, node_a.allocated_w)
            fleet.start_agent("node-a")
            # The BMC limit is lifted only once the returning agent's caps are within the budget:
            # never a moment with neither holding node-a (it comes back at its old caps).
            exposed: list[int] = []
            deadline = asyncio.get_running_loop().time() + 15
            while not (stub.power_limit_w is None and fleet.caps_w("node-a") <= 1200):
                assert asyncio.get_running_loop().time() < deadline, "the BMC limit was never lifted"
                if stub.power_limit_w is None and fleet.caps_w("node-a") > 1200:
                    exposed.append(fleet.caps_w("node-a"))
                await asyncio.sleep(0.002)
            assert exposed == [], f"node-a ran over its budget with no BMC limit: {max(exposed)} W"
            return held, over_while_unreachable, limited
        finally:
            await fleet.close()
            await controller.stop()
            stub.stop()

    held, over_while_unreachable, (bmc_limit_w, allocated_w) = asyncio.run(scenario())
    assert held > 1200
    assert "node-a" in over_while_unreachable
    assert bmc_limit_w is not None and bmc_limit_w <= 1200
    assert allocated_w <= 1200


def test_the_power_loop_metrics_pass_promtool(tmp_path, free_port, check_metrics):
    import urllib.request

    async def scrape() -> str:
        controller = server.Controller(
            server.ControllerSettings(
                listen=f"127.0.0.1:{free_port}",
                db_url=f"sqlite:///{tmp_path / 'rasd.db'}",
                metrics_port=0,
                metrics_addr="127.0.0.1",
                remediation=False,
                power=POWER,
            )
        )
        await controller.start()
        fleet = Fleet(controller.address)
        try:
            await _until(lambda: controller.power.stats.periods >= 3 and _settled(controller))
            url = f"http://127.0.0.1:{controller.metrics_port}/metrics"
            return (await asyncio.to_thread(lambda: urllib.request.urlopen(url, timeout=5).read())).decode()
        finally:
            await fleet.close()
            await controller.stop()

    text = asyncio.run(scrape())
    assert 'rasd_power_budget_watts{domain="cluster",level="cluster"} 4400.0' in text
    assert 'rasd_power_budget_watts{domain="rack-a",level="rack"} 2800.0' in text
    assert 'rasd_power_allocated_watts{domain="cluster",level="cluster"}' in text
    assert 'rasd_power_drawn_watts{domain="row-0",level="row"}' in text
    assert 'level="node"' not in text, "nodes are left out (rasd_controller_gpu_power_watts covers them)"
    assert 'rasd_power_smoothing_mode{mode="off"}' in text
    assert "rasd_power_unconfirmed_decreases 0.0" in text
    assert "rasd_power_period_seconds_count" in text
    check_metrics(text)


def test_a_restarted_controller_releases_the_start_profiles_its_predecessor_left_on(tmp_path, free_port):
    """Start profiles are durable state: a controller that took over mid-start still switches them off.

    Here the predecessor stopped while node-a's GPUs carried start profiles (left on the simulated
    GPUs, and in its saved state); no swing shows up, so the new controller releases them after
    `job_start_smoothing_release_s`. Without the saved state it would never know they were on.
    """
    policy = {**POWER["policy"], "job_start_ramp_enabled": True, "job_start_smoothing_release_s": 1.0}
    power = {**POWER, "policy": policy}

    def profiled(fleet: Fleet) -> int:
        return sum(bool(c.power_smoothing_enabled) for c in fleet.backends["node-a"].read_counters(1))

    async def scenario():
        controller = _controller(tmp_path, free_port, power=power)
        await controller.start()
        fleet = Fleet(controller.address, gpu_model=simulated.B200)
        try:
            await _until(lambda: _settled(controller))
            gpus = [g.uuid for g in fleet.backends["node-a"].inventory()]
            for gpu in gpus:  # what the predecessor's start profiles left on the GPUs
                fleet.backends["node-a"].set_power_smoothing(
                    gpu, enabled=True, floor_pct=20.0, ramp_up_w_per_s=100.0, ramp_down_w_per_s=100.0
                )
            left = start_smoothing.StartState(rate_w_per_s=dict.fromkeys(gpus, 100.0))
            docs = rstore.RemediationStore(controller.store.engine)
            # The predecessor's state is these start profiles alone: no swing plan of its own (the job's
            # swing may have been planned for already; this test is about start profiles).
            saved = {power_loop.START_DOC: left.to_mapping(), power_loop.SMOOTHING_DOC: None}
            commit = rstore.Commit(now_unix_ns=time.time_ns(), docs=saved)
            await controller.ingest.store_calls.run_in_store(docs.commit, commit)
            await controller.stop()
            on_at_handover = profiled(fleet)

            controller = _controller(tmp_path, free_port, power=power)
            await controller.start()
            restored = controller.power.start_smoothing_state
            await _until(lambda: profiled(fleet) == 0)
            return on_at_handover, restored, controller.power.start_smoothing_state
        finally:
            await fleet.close()
            await controller.stop()

    on_at_handover, restored, final = asyncio.run(scenario())
    assert on_at_handover == 4
    assert len(restored.rate_w_per_s) == 4  # the new controller knew what was on
    assert not final.active()


PREDECESSOR_PLAN = swing.SmoothingPlan(
    active=True, mode="firmware", floor_w=300.0, floor_pct=30.0, ramp_up_w_per_s=500.0,
    ramp_down_w_per_s=500.0, ramp_down_hysteresis_ms=0.0, job_ramp_w_per_s=100.0, trough_filler_w=None,
    peak_cap_w=None, expected_p2p_w=500.0, expected_attenuation_db=10.0, expected_energy_overhead_pct=2.0,
    reason="the predecessor's plan",
)  # fmt: skip
PREDECESSOR_REPORT = swing.SwingReport(
    sample_hz=10.0, duration_s=5.0, mean_w=4000.0, p2p_w=3000.0, peak_w=5000.0, trough_w=2000.0,
    trough_fraction=0.4, dominant_freq_hz=1.0, period_s=1.0, coherence=0.9, max_ramp_1s_w_per_s=3000.0,
    max_ramp_60s_w_per_s=None, band_power_w2=1e5,
)  # fmt: skip


def _profiled(fleet: Fleet) -> int:
    """GPUs whose power-smoothing profile is on."""
    return sum(bool(c.power_smoothing_enabled) for b in fleet.backends.values() for c in b.read_counters(1))


async def _leave_the_predecessors_plan_on(
    controller: server.Controller, fleet: Fleet
) -> tuple[rstore.RemediationStore, int]:
    """A predecessor stops while its swing plan is in force: the profiles on every GPU, the plan saved.

    Returns the store's documents and how many GPUs carry a profile once it has stopped.
    """
    await _until(lambda: _settled(controller))
    for backend in fleet.backends.values():
        for gpu in backend.inventory():
            backend.set_power_smoothing(
                gpu.uuid, enabled=True, floor_pct=30.0, ramp_up_w_per_s=500.0, ramp_down_w_per_s=500.0
            )
    saved = {"plan": dataclasses.asdict(PREDECESSOR_PLAN), "report": dataclasses.asdict(PREDECESSOR_REPORT)}
    docs = rstore.RemediationStore(controller.store.engine)
    await controller.ingest.store_calls.run_in_store(
        docs.commit, rstore.Commit(now_unix_ns=time.time_ns(), docs={power_loop.SMOOTHING_DOC: saved})
    )
    await controller.stop()
    return docs, _profiled(fleet)


def _end_the_job(fleet: Fleet) -> None:
    """Every rank leaves the job."""
    for rank in range(len(fleet.job.active)):
        fleet.job.set_active(rank, False)


def test_a_restarted_controller_switches_off_at_job_end_the_swing_plan_its_predecessor_left_on(tmp_path, free_port):
    """The detected swing's plan is durable state too: its profiles come off at job end after a restart.

    The predecessor stopped while its plan's profiles were on every GPU (left on the simulated GPUs
    and in its saved state). The new controller first re-sends the plan while the job runs (the
    same profile: nothing changes on the GPUs); when the job ends it switches them off and deletes
    the saved plan. Without the saved plan it would not know they were on, and the GPUs would
    hold the profile's floor through the idle time that follows.
    """

    async def scenario():
        controller = _controller(tmp_path, free_port)
        await controller.start()
        fleet = Fleet(controller.address, gpu_model=simulated.B200)
        try:
            docs, on_at_handover = await _leave_the_predecessors_plan_on(controller, fleet)

            controller = _controller(tmp_path, free_port)
            await controller.start()
            await asyncio.sleep(2.0)  # a few periods with the job running: the plan stays on
            during_job = _profiled(fleet)
            in_force = controller.power.status.smoothing
            _end_the_job(fleet)
            await _until(lambda: _profiled(fleet) == 0)
            left = await controller.ingest.store_calls.run_in_store(docs.load_docs, power_loop.SMOOTHING_DOC)
            return on_at_handover, during_job, in_force, left
        finally:
            await fleet.close()
            await controller.stop()

    on_at_handover, during_job, in_force, left = asyncio.run(scenario())
    assert on_at_handover == 8
    assert during_job == 8, "while the job runs the restored plan stays on"
    assert in_force is not None and in_force.reason == PREDECESSOR_PLAN.reason, "the predecessor's plan, not a new one"
    assert left == {}, "the plan is deleted once it is off"


def test_a_controller_that_starts_after_the_job_ended_switches_off_its_predecessors_swing_plan(tmp_path, free_port):
    """The job ended while no controller ran: the successor sees no swing, only the saved plan shows the profiles."""

    async def scenario():
        controller = _controller(tmp_path, free_port)
        await controller.start()
        fleet = Fleet(controller.address, gpu_model=simulated.B200)
        try:
            docs, on_at_handover = await _leave_the_predecessors_plan_on(controller, fleet)
            _end_the_job(fleet)  # between the two controllers

            controller = _controller(tmp_path, free_port)
            await controller.start()
            await _until(lambda: _profiled(fleet) == 0)
            left = await controller.ingest.store_calls.run_in_store(docs.load_docs, power_loop.SMOOTHING_DOC)
            return on_at_handover, left
        finally:
            await fleet.close()
            await controller.stop()

    on_at_handover, left = asyncio.run(scenario())
    assert on_at_handover == 8
    assert left == {}, "the plan is deleted once it is off"


def test_caps_left_unanswered_are_logged_once_a_period_not_once_a_command(tmp_path, free_port, debug_logs):
    # A replica that stops answering leaves thousands of caps unanswered each period; a log line each
    # once cost the leader more than its period (bench/fleet.py's profile).
    async def scenario():
        controller = _controller(tmp_path, free_port)
        await controller.start()
        fleet = Fleet(controller.address)
        loop = controller.power
        try:
            await _until(lambda: _settled(controller))
            await fleet.stop_agent("node-a")
            await _until(lambda: "node-a" not in controller.ingest.sessions, timeout_s=60)
            with structlog.testing.capture_logs() as logs:
                await loop.set_budget("node-a", 1200, reason="feed maintenance")
                await _until(lambda: any(e["event"] == "power_caps_unanswered" for e in logs), timeout_s=15)
                periods_before = loop.stats.periods
                await _until(lambda: loop.stats.periods >= periods_before + 2, timeout_s=15)
            return logs, loop.stats.periods - periods_before
        finally:
            await fleet.close()
            await controller.stop()

    logs, periods = asyncio.run(scenario())
    per_command = [e for e in logs if e["event"] == "power_cap_unanswered"]
    summaries = [e for e in logs if e["event"] == "power_caps_unanswered"]
    assert per_command == []
    assert summaries and len(summaries) <= periods + 2  # at most one a period
    first = summaries[0]
    assert first["first_nodes"] == ["node-a"] and first["nodes"] == 1 and first["commands"] >= 1
    assert set(first["errors_by_kind"]) <= {"LookupError", "TimeoutError", "ConnectionError"}
