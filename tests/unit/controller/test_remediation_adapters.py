"""Controller-side adapters (quarantine through the scheduler, BMC power cycles) never stall the decisions.

They call other systems: a Kubernetes API server (a read, a patch and an Event per quarantine), Slurm's
``scontrol``, a BMC over Redfish whose power cycle is polled until the node is back (minutes). The
service decides every node's events under one lock, so an adapter called under it, one after another,
holds up the whole fleet: a storm of 200 GPU quarantines at 20 ms each is 4 s of nothing decided, and
one power cycle is minutes of it. These tests use real adapters' shape (blocking callables run in
threads) with a controlled latency.
"""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from prometheus_client import CollectorRegistry

from rasd.api.v1 import agent_service_pb2 as agent_pb
from rasd.api.v1 import health_pb2 as health_pb
from rasd.controller import wiring
from rasd.controller.core import agent_messages as msgs
from rasd.controller.core import fleet
from rasd.controller.core.remediation import actions
from rasd.controller.core.remediation import events as health
from rasd.controller.core.remediation import policy as policy_mod
from rasd.controller.executors import quarantine
from rasd.controller.observability import metrics
from rasd.controller.store import repo
from rasd.controller.wire import agent as wire

T0_NS = 1_800_000_000 * 10**9
GPUS = 2


def _node(i: int) -> str:
    return f"node-{i:02d}"


def _gpu(i: int, index: int) -> str:
    return f"GPU-00000000-0000-4000-8000-{i:06d}{index:06d}"


def _hello(i: int) -> fleet.NodeHello:
    node = _node(i)
    gpus = tuple(
        fleet.GpuRecord(_gpu(i, g), "H100", f"0000:{0x18 + g:02x}:00.0", 200, 700, 700, node_id=node)
        for g in range(GPUS)
    )
    return fleet.NodeHello(node, "boot-1", "0.1.0", node, "simulated", {"rack": "r1"}, gpus, 0)


def _xid(i: int, gpu: int, seq: int, xid: int, at_ns: int) -> repo.StoredEvent:
    return repo.StoredEvent(
        node_id=_node(i), seq=seq, observed_unix_ns=at_ns - 10**6, received_unix_ns=at_ns,
        kind=int(health.EventKind.XID), severity=int(health.Severity.ERROR), gpu_uuid=_gpu(i, gpu), xid=xid,
        message=f"NVRM: Xid (PCI:0000:18:00): {xid}", source="kmsg", attributes={},
    )  # fmt: skip


class _Rig:
    def __init__(self, url: str, nodes: int, executors, policy=None) -> None:
        self.now_ns = T0_NS
        self.store = repo.Store.open(url)
        self.wired = wiring.single_replica(
            self.store,
            metrics.ControllerMetrics(CollectorRegistry()),
            ladder=wiring.Ladder(policy=policy or policy_mod.RemediationPolicy(), executors=executors),
            clock=self.clock,
        )
        self.ingest = self.wired.ingest
        self.service = self.wired.remediation
        for i in range(nodes):
            self.store.register_hello(_hello(i), T0_NS)
            self.ingest.node_labels[_node(i)] = {"rack": "r1"}

    def clock(self) -> int:
        return self.now_ns

    def run(self, scenario) -> None:
        async def whole() -> None:
            await self.ingest.start()
            try:
                await scenario()
            finally:
                await self.wired.stop()

        asyncio.run(whole())

    async def xid(self, i: int, xid: int, *, gpu: int = 0, seq: int = 1) -> None:
        await self.service.on_events(_node(i), [_xid(i, gpu, seq, xid, self.now_ns)], {"rack": "r1"})

    def command(self, i: int, kind: str):
        (command,) = [c for c in self.service.store.commands(node_id=_node(i)) if c.kind == kind]
        return command


class _Calls:
    """What the adapters were asked to do, and when (monotonic seconds), from their threads."""

    def __init__(self, latency_s: float) -> None:
        self.latency_s = latency_s
        self.lock = threading.Lock()
        self.calls: list[tuple[str, str, str, float, float]] = []  # (node, kind, target, start, end)

    def __call__(self, action: actions.Action) -> str:
        start = time.monotonic()
        time.sleep(self.latency_s)
        with self.lock:
            self.calls.append((action.node_id, action.kind, getattr(action, "gpu_uuid", ""), start, time.monotonic()))
        return f"{action.kind} done"


class _Gate:
    """An adapter that blocks, as one waiting on an API server or a BMC does, until the test opens it."""

    def __init__(self, answer: str) -> None:
        self.answer = answer
        self.called, self.opened = threading.Event(), threading.Event()

    def __call__(self, action: actions.Action) -> str:
        self.called.set()
        if not self.opened.wait(30):
            raise TimeoutError("the test never let the adapter return")
        return self.answer

    async def wait_called(self) -> bool:
        return await asyncio.to_thread(self.called.wait, 5)


QUARANTINE_KINDS = ("quarantine_node", "quarantine_gpu", "quarantine_port", "release")


@pytest.fixture
def url(tmp_path):
    return f"sqlite:///{tmp_path / 'rasd.db'}"


async def _settled(rig: _Rig, kind: str, count: int, timeout_s: float = 10.0) -> None:
    """Wait until count commands of kind are in the outbox and none is still dispatched (its outcome committed)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        mine = [c for c in rig.service.store.commands(limit=10_000) if c.kind == kind]
        if len(mine) >= count and all(c.status != "dispatched" for c in mine):
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{kind}: outcomes not committed within {timeout_s} s")


async def _open_stream(rig: _Rig, i: int) -> asyncio.Queue:
    """Node i's agent says Hello and its stream opens; returns the queue its commands go out on."""
    infos = [health_pb.GpuInfo(uuid=_gpu(i, g), model="H100", power_limit_min_w=200, power_limit_max_w=700)
             for g in range(GPUS)]  # fmt: skip
    hello = wire.hello_from_wire(agent_pb.Hello(node_id=_node(i), boot_id="boot-1", gpus=infos))
    session, _welcome = await rig.ingest.open_session(hello)  # its ladder hears of it: unanswered commands go
    return session.outbound


def _sent_kinds(queue: asyncio.Queue) -> list[str]:
    kinds = []
    while not queue.empty():
        message = queue.get_nowait()
        if message is not None and message.HasField("command"):
            kinds.append(message.command.WhichOneof("action"))
    return kinds


def test_quarantines_run_at_once_across_nodes_and_in_turn_within_one(url):
    """20 GPU quarantines on 10 nodes at 0.2 s each: about 0.4 s, not 4 s; one node's two in turn."""
    calls = _Calls(latency_s=0.2)
    # Every node at once is a breaker's trip (it counts GPU quarantines); here the adapters' concurrency is tested.
    pol = policy_mod.RemediationPolicy.from_mapping({"disruption": {"breaker_quarantine_pct": 100.0}})
    rig = _Rig(url, 10, dict.fromkeys(QUARANTINE_KINDS, calls), pol)
    took: list[float] = []

    async def scenario() -> None:
        start = time.monotonic()
        # Xid 48 (DBE) on two GPUs of each node: a GPU quarantine, then a reset, for each.
        await asyncio.gather(*(rig.xid(i, 48, gpu=g, seq=g + 1) for i in range(10) for g in range(GPUS)))
        decided = time.monotonic() - start
        assert decided < 1.0, f"deciding waited for the adapters: {decided:.2f} s"
        await _settled(rig, "quarantine_gpu", 20)
        took.append(time.monotonic() - start)

    rig.run(scenario)
    rig.store.close()
    assert len(calls.calls) == 20
    assert all(kind == "quarantine_gpu" for _node_id, kind, *_ in calls.calls)
    assert took[0] < 2.0, f"the quarantines ran one after another: {took[0]:.2f} s for 20 of 0.2 s"
    for i in range(10):
        mine = sorted((c for c in calls.calls if c[0] == _node(i)), key=lambda c: c[3])
        assert len(mine) == 2
        assert mine[0][4] <= mine[1][3], f"{_node(i)}: its two quarantines overlapped"
    for i in range(10):
        for g in range(GPUS):
            quarantine = [
                c
                for c in rig.service.store.commands(node_id=_node(i))
                if c.kind == "quarantine_gpu" and c.gpu_uuid == _gpu(i, g)
            ]
            assert [c.status for c in quarantine] == ["succeeded"]
            assert quarantine[0].result["message"] == "quarantine_gpu done"


def test_one_nodes_adapter_calls_run_in_the_order_they_were_admitted(url):
    calls = _Calls(latency_s=0.05)
    rig = _Rig(url, 1, dict.fromkeys(QUARANTINE_KINDS, calls))

    async def scenario() -> None:
        # Both events are decided in one pass, GPU 0's first: its quarantine is admitted first.
        await asyncio.gather(*(rig.xid(0, 48, gpu=g, seq=g + 1) for g in range(GPUS)))
        await _settled(rig, "quarantine_gpu", 2)

    rig.run(scenario)
    rig.store.close()
    assert [target for _n, _k, target, _s, _e in sorted(calls.calls, key=lambda c: c[3])] == [_gpu(0, 0), _gpu(0, 1)]


def test_a_repair_is_sent_only_once_its_quarantines_adapter_has_returned(url):
    slow_quarantine = _Gate("GPU listed in rasd.io/quarantined-gpus")
    rig = _Rig(url, 1, dict.fromkeys(QUARANTINE_KINDS, slow_quarantine))

    async def scenario() -> None:
        try:
            queue = await _open_stream(rig, 0)
            await asyncio.wait_for(rig.xid(0, 48), timeout=5)
            assert await slow_quarantine.wait_called(), "the quarantine's adapter was never called"
            assert rig.command(0, "reset_gpu").status == "dispatched"
            await asyncio.sleep(0.1)
            assert _sent_kinds(queue) == [], "the reset left before its GPU left scheduling"
        finally:
            slow_quarantine.opened.set()
        await _settled(rig, "quarantine_gpu", 1)
        assert _sent_kinds(queue) == ["reset_gpu"]
        assert rig.command(0, "quarantine_gpu").result["message"] == "GPU listed in rasd.io/quarantined-gpus"
        assert rig.service.stats.decision_latency_kinds.count("reset_gpu") == 1

    rig.run(scenario)
    rig.store.close()


def test_a_failing_adapter_is_a_failed_action_and_its_repair_still_goes(url):
    def broken(action: actions.Action) -> str:
        raise ConnectionError("API server unreachable")

    rig = _Rig(url, 1, dict.fromkeys(QUARANTINE_KINDS, broken))

    async def scenario() -> None:
        queue = await _open_stream(rig, 0)
        await rig.xid(0, 48)
        await _settled(rig, "quarantine_gpu", 1)
        assert _sent_kinds(queue) == ["reset_gpu"]  # as before adapters ran outside the lock: tried first

    rig.run(scenario)
    quarantine = rig.command(0, "quarantine_gpu")
    audited = [(r["action"], r["outcome"]) for r in rig.service.store.audit(limit=100)]
    rig.store.close()
    assert (quarantine.status, quarantine.result["message"]) == ("failed", "ConnectionError: API server unreachable")
    assert ("quarantine_gpu", "ACTION_OUTCOME_FAILED") in audited


def test_a_bmc_power_cycle_in_progress_does_not_hold_up_other_nodes(url):
    """A power cycle is polled until the node is back (minutes): the rest of the fleet is decided meanwhile."""
    power_cycle = _Gate("PowerState went Off and came back On")

    pol = policy_mod.RemediationPolicy.from_mapping({"escalation": {"bmc_power_cycle_enabled": True}})
    rig = _Rig(url, 2, {"power_cycle_bmc": power_cycle}, pol)
    service = rig.service

    async def scenario() -> None:
        try:
            await rig.xid(0, 79)  # fell off the bus: quarantine the node, reboot it
            reboot = rig.command(0, "reboot_node")
            rig.now_ns += 10**9
            # The agent never comes back: the reboot times out, and the BMC rung is next.
            await asyncio.wait_for(
                service.on_result(
                    _node(0), msgs.AgentResult(command_id=reboot.command_id, outcome=msgs.Outcome.TIMED_OUT)
                ),
                timeout=5,
            )
            assert await power_cycle.wait_called(), "the power cycle never started"
            assert rig.command(0, "power_cycle_bmc").status == "dispatched"
            # Another node's fault is decided and its command dispatched while the cycle runs.
            await asyncio.wait_for(rig.xid(1, 13), timeout=5)
            assert rig.command(1, "restart_process").status == "dispatched"
            await asyncio.wait_for(service.tick(), timeout=5)
        finally:
            power_cycle.opened.set()
        for _ in range(500):
            if rig.command(0, "power_cycle_bmc").status != "dispatched":
                break
            await asyncio.sleep(0.01)
        cycle = rig.command(0, "power_cycle_bmc")
        assert cycle.status == "succeeded"
        assert cycle.result["message"] == "PowerState went Off and came back On"
        kinds = [c.kind for c in service.store.commands(node_id=_node(0))]
        assert kinds.count("run_validation") == 1, "the ladder went on: the node is validated after its power cycle"

    rig.run(scenario)
    audited = [(row["action"], row["outcome"]) for row in service.store.audit(limit=1000) if row["node_id"] == _node(0)]
    rig.store.close()
    assert ("power_cycle_bmc", "ACTION_OUTCOME_SUCCEEDED") in audited


def test_a_power_cycle_cut_off_by_a_controller_restart_is_carried_out_by_the_next_one(url):
    """Dispatched, its outcome never committed: the next controller runs it again (the BMC journal dedupes)."""
    stuck = _Gate("too late: this controller is gone")
    ran: list[str] = []

    def quick(action: actions.Action) -> str:
        ran.append(action.command_id)
        return "power cycled"

    pol = policy_mod.RemediationPolicy.from_mapping({"escalation": {"bmc_power_cycle_enabled": True}})
    first = _Rig(url, 1, {"power_cycle_bmc": stuck}, pol)

    async def until_cycling() -> None:
        await first.xid(0, 79)
        reboot = first.command(0, "reboot_node")
        await first.service.on_result(
            _node(0), msgs.AgentResult(command_id=reboot.command_id, outcome=msgs.Outcome.TIMED_OUT)
        )
        assert await stuck.wait_called()

    try:
        first.run(until_cycling)  # stops the service with the cycle still running: a crash as far as the store knows
    finally:
        stuck.opened.set()
    cycle_id = first.command(0, "power_cycle_bmc").command_id
    assert first.command(0, "power_cycle_bmc").status == "dispatched"
    first.store.close()

    second = _Rig(url, 0, {"power_cycle_bmc": quick}, pol)

    async def restart() -> None:
        await second.service.start()
        for _ in range(500):
            if second.command(0, "power_cycle_bmc").status != "dispatched":
                break
            await asyncio.sleep(0.01)

    second.run(restart)
    cycle = second.command(0, "power_cycle_bmc")
    second.store.close()
    assert ran == [cycle_id], "carried out again with the same command id, once"
    assert (cycle.status, cycle.result["message"]) == ("succeeded", "power cycled")


def test_after_a_restart_a_repair_still_waits_for_its_quarantine_carried_out_again(url):
    """Cut off mid-quarantine: the next controller quarantines again before it sends the reset, even on reconnect."""
    stuck, again = _Gate("too late: this controller is gone"), _Gate("already quarantined: nothing changed")

    first = _Rig(url, 1, dict.fromkeys(QUARANTINE_KINDS, stuck))

    async def until_quarantining() -> None:
        await first.xid(0, 48)
        assert await stuck.wait_called()

    try:
        first.run(until_quarantining)
    finally:
        stuck.opened.set()
    assert sorted((c.kind, c.status) for c in first.service.store.commands(node_id=_node(0))) == [
        ("quarantine_gpu", "dispatched"),
        ("reset_gpu", "dispatched"),
    ]
    first.store.close()

    second = _Rig(url, 0, dict.fromkeys(QUARANTINE_KINDS, again))

    async def restart() -> None:
        try:
            await second.service.start()
            assert await again.wait_called(), "the quarantine was not carried out again"
            queue = await _open_stream(second, 0)  # the node reconnects: its unanswered commands are re-sent
            await asyncio.sleep(0.1)
            assert _sent_kinds(queue) == [], "the reset was re-sent before its quarantine was carried out again"
        finally:
            again.opened.set()
        await _settled(second, "quarantine_gpu", 1)
        assert _sent_kinds(queue) == ["reset_gpu"]

    second.run(restart)
    second.store.close()


def test_an_adapter_that_waits_on_nothing_is_called_in_its_dispatch_round(url):
    """Record only (the default): no thread, and its outcome is in the round's own commit."""
    executors = quarantine.executors(quarantine.RecordOnlyQuarantine())
    rig = _Rig(url, 1, executors)

    async def scenario() -> None:
        queue = await _open_stream(rig, 0)
        await rig.xid(0, 48)
        assert rig.service.adapters_busy == 0
        command = rig.command(0, "quarantine_gpu")
        assert command.status == "succeeded"
        assert command.result["message"].startswith("record: quarantine gpu node-00/"), command.result["message"]
        assert _sent_kinds(queue) == ["reset_gpu"]

    rig.run(scenario)
    rig.store.close()
