"""Invariant 2 through the real Agent runtime over gRPC on loopback: a command id acts once.

The test controller does what controller/remediation/service.py `node_connected` does: on every new stream
of a node it resends that node's dispatched but unanswered commands with the same id.
"""

from __future__ import annotations

import asyncio
import threading

import grpc

from rasd.agent import node_ops, runtime, spool
from rasd.agent import settings as agent_settings
from rasd.agent.core import model
from rasd.agent.gpu import simulated
from rasd.api.v1 import agent_service_pb2 as agent_pb
from rasd.api.v1 import agent_service_pb2_grpc as agent_grpc
from rasd.api.v1 import commands_pb2 as commands_pb

FAST_LINK = {
    "telemetry_send_interval_ms": 200,
    "reconnect_initial_s": 0.05,
    "reconnect_max_s": 0.1,
    "heartbeat_interval_ms": 500,
}


class BlockingResetOps(node_ops.SimulatedNodeOps):
    """nvidia-smi --gpu-reset that takes a while (it may take up to CommandSettings.timeout_s = 120 s)."""

    def __init__(self, backend):
        super().__init__(backend)
        self.resets = 0
        self.concurrent_max = 0
        self._in = 0
        self._lock = threading.Lock()
        self.started = threading.Event()
        self.release = threading.Event()

    def compute_pids(self, gpu_uuid):
        return []

    def reset_gpu(self, gpu_uuid):
        with self._lock:
            self.resets += 1
            self._in += 1
            self.concurrent_max = max(self.concurrent_max, self._in)
        self.started.set()
        self.release.wait(10)
        with self._lock:
            self._in -= 1


class ResendingController(agent_grpc.AgentServiceServicer):
    """Stream 1: send the reset, end the stream once the agent runs it. Every later stream: resend it."""

    def __init__(self, command, ops):
        self.command = command
        self.ops = ops
        self.streams = 0
        self.results: list[commands_pb.ActionResult] = []
        self.second_stream_open = asyncio.Event()

    async def Connect(self, request_iterator, context):
        self.streams += 1
        n = self.streams
        hello = await context.read()
        assert hello.HasField("hello")
        await context.write(agent_pb.ControllerMessage(welcome=agent_pb.Welcome(acked_seq=0, session_id=f"s{n}")))
        await context.write(agent_pb.ControllerMessage(command=self.command))
        if n == 1:
            # The stream breaks while the command runs (controller restart, failover, keepalive timeout).
            while not self.ops.started.is_set():
                await asyncio.sleep(0.01)
            return
        self.second_stream_open.set()
        await _collect_results(context, self.results)


async def _collect_results(context, results: list[commands_pb.ActionResult]) -> None:
    """Keep the agent's results, in arrival order, until the stream ends."""
    while True:
        message = await context.read()
        if message is grpc.aio.EOF:
            return
        if message.HasField("action_result"):
            results.append(message.action_result)


def _reset_rig() -> tuple[simulated.SimulatedBackend, BlockingResetOps, ResendingController]:
    """A node whose GPU reset blocks until released, and a controller that sends (and resends) it."""
    backend = simulated.SimulatedBackend("node-1", 2, 0)
    ops = BlockingResetOps(backend)
    command = _command()
    command.reset_gpu.gpu_uuid = backend.inventory()[0].uuid
    return backend, ops, ResendingController(command, ops)


def _command():
    return commands_pb.Command(command_id="reset-1", reason="audit", reset_gpu=commands_pb.ResetGpu(gpu_uuid="X"))


async def _start_server(servicer):
    server = grpc.aio.server()
    agent_grpc.add_AgentServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, port


def _agent(port, path, ops, backend):
    return runtime.Agent(
        agent_settings.AgentSettings(
            node_id="node-1",
            link=agent_settings.LinkSettings(controller_address=f"127.0.0.1:{port}", **FAST_LINK),
            actions=agent_settings.ActionSettings(destructive_enabled=True),
        ),
        backend,
        spool.Spool(path),
        boot_id="boot-1",
        ops=ops,
    )


def test_resend_on_reconnect_while_the_first_delivery_still_runs_does_not_run_it_twice(tmp_path):
    async def scenario():
        backend, ops, ctl = _reset_rig()
        server, port = await _start_server(ctl)
        agent = _agent(port, str(tmp_path / "spool.db"), ops, backend)
        stop = asyncio.Event()
        task = asyncio.create_task(agent.run(stop))
        await asyncio.wait_for(ctl.second_stream_open.wait(), 10)
        await asyncio.sleep(1.0)  # the resend reaches the agent while the first reset still runs
        ops.release.set()
        for _ in range(100):
            if ctl.results:
                break
            await asyncio.sleep(0.05)
        stop.set()
        await task
        await server.stop(None)
        return ops, ctl

    ops, ctl = asyncio.run(scenario())
    assert ops.resets == 1, f"command reset-1 reset the GPU {ops.resets} times ({ops.concurrent_max} at once)"
    # The resend waited for the first run and was answered with its result.
    assert [(r.outcome, r.replayed) for r in ctl.results] == [(commands_pb.ACTION_OUTCOME_SUCCEEDED, True)]


def test_a_stop_during_an_action_lets_it_write_its_result(tmp_path):
    """SIGTERM (systemctl restart rasd-agent, a package upgrade) while a reset runs: agent/main.py
    closes the journal once agent.run returns, and run waits for the command's worker first."""
    path = str(tmp_path / "spool.db")

    async def scenario():
        backend, ops, ctl = _reset_rig()
        ctl.streams = 1  # every stream behaves as the resending one: keep it open
        server, port = await _start_server(ctl)
        agent = _agent(port, path, ops, backend)
        stop = asyncio.Event()
        task = asyncio.create_task(agent.run(stop))
        await asyncio.to_thread(ops.started.wait, 10)
        stop.set()  # the SIGTERM handler in agent/main.py
        threading.Timer(0.5, ops.release.set).start()  # the reset ends after the stop began
        await task
        agent.spool.close()  # agent/main.py: `finally: ... journal.close()`
        await server.stop(None)
        return ops

    ops = asyncio.run(scenario())
    stored = spool.Spool(path).executed_result("reset-1")
    assert ops.resets == 1
    assert stored is not None and stored.outcome is model.ActionOutcome.SUCCEEDED, (
        "the reset ran but its result is not in the journal: the resend would be answered as interrupted"
    )


class BlockingValidationOps(node_ops.SimulatedNodeOps):
    """rasd-validate that runs until released (a real suite runs for minutes)."""

    def __init__(self, backend):
        super().__init__(backend)
        self.started = threading.Event()
        self.release = threading.Event()

    def run_validation(self, suite, gpu_uuids, seed, timeout_s):
        self.started.set()
        self.release.wait(10)
        return super().run_validation(suite, gpu_uuids, seed, timeout_s)


class InOrderController(agent_grpc.AgentServiceServicer):
    """Sends its commands in order on the first stream and keeps the results in arrival order."""

    def __init__(self, commands):
        self.commands = commands
        self.results: list[commands_pb.ActionResult] = []

    async def Connect(self, request_iterator, context):
        await context.read()  # the Hello
        await context.write(agent_pb.ControllerMessage(welcome=agent_pb.Welcome(acked_seq=0, session_id="s1")))
        for command in self.commands:
            await context.write(agent_pb.ControllerMessage(command=command))
        await _collect_results(context, self.results)


def test_a_power_cap_behind_a_long_validation_runs_at_once(tmp_path):
    """A cap read only after a minutes-long validation ran late: after the controller had settled it."""

    async def scenario():
        backend = simulated.SimulatedBackend("node-1", 2, 0)
        ops = BlockingValidationOps(backend)
        gpu = backend.inventory()[0].uuid
        validate = commands_pb.Command(
            command_id="validate-1", run_validation=commands_pb.RunValidation(suite="quick", gpu_uuids=[gpu])
        )
        cap = commands_pb.Command(
            command_id="cap-1",
            set_power_cap=commands_pb.SetPowerCap(limits=[commands_pb.GpuPowerLimit(gpu_uuid=gpu, power_limit_w=400)]),
        )
        ctl = InOrderController([validate, cap])
        server, port = await _start_server(ctl)
        agent = _agent(port, str(tmp_path / "spool.db"), ops, backend)
        stop = asyncio.Event()
        task = asyncio.create_task(agent.run(stop))
        try:
            await asyncio.to_thread(ops.started.wait, 10)
            for _ in range(200):
                if ctl.results:
                    break
                await asyncio.sleep(0.02)
            while_validating = [r.command_id for r in ctl.results]
            ops.release.set()
            for _ in range(200):
                if len(ctl.results) == 2:
                    break
                await asyncio.sleep(0.02)
        finally:
            ops.release.set()
            stop.set()
            await task
            await server.stop(None)
        return while_validating, ctl.results, backend

    while_validating, results, backend = asyncio.run(scenario())
    assert while_validating == ["cap-1"], "the cap ran while the validation still ran"
    assert [r.command_id for r in results] == ["cap-1", "validate-1"]
    assert all(r.outcome == commands_pb.ACTION_OUTCOME_SUCCEEDED for r in results)
    assert backend.read_counters(0)[0].enforced_power_limit_w == 400
