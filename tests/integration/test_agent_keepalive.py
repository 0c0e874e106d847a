"""An agent finds a controller that went silent without closing its connection, and comes back to it.

A crashed host, a silent partition or a stopped process leaves the agent's TCP connection open with
nobody behind it: no FIN, no RST. Without keepalive pings the stream would hang until TCP gives up,
many minutes, and the node's events would wait in its spool all that time. Here the controller is a
real `rasd-controller` process stopped with SIGSTOP; the agent uses 1 s pings so the test is short.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time

import pytest

from rasd.agent import runtime, spool
from rasd.agent.gpu import simulated
from rasd.common import tls

pytestmark = pytest.mark.timeout(120)


def test_client_keepalive_respects_the_controllers_ping_floor():
    # Pings more often than the server allows without data earn a GOAWAY ("too_many_pings").
    options = dict(tls.channel_options())
    assert options["grpc.keepalive_time_ms"] >= tls.SERVER_MIN_PING_INTERVAL_MS
    assert runtime.LinkSettings(controller_address="x").keepalive_time_s * 1000 == options["grpc.keepalive_time_ms"]


async def _wait_until(predicate, timeout_s: float) -> float:
    started = time.monotonic()
    while not predicate():
        if time.monotonic() - started > timeout_s:
            raise AssertionError(f"not within {timeout_s} s")
        await asyncio.sleep(0.05)
    return time.monotonic() - started


def test_agent_notices_a_stopped_controller_within_the_keepalive_and_reconnects(tmp_path, venv_bin, free_port):
    address = f"127.0.0.1:{free_port}"
    log = (tmp_path / "controller.log").open("w")
    controller = subprocess.Popen(
        [str(venv_bin / "rasd-controller"), "--insecure", "--listen", address, "--metrics-port", "-1",
         "--db", f"sqlite:///{tmp_path / 'rasd.db'}", "--log-level", "warning"],
        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
    )  # fmt: skip

    async def scenario() -> tuple[float, float]:
        agent = runtime.Agent(
            runtime.NodeIdentity("node-ka", "boot-1", "node-ka"),
            simulated.SimulatedBackend("node-ka", 2, 0),
            spool.Spool(":memory:"),
            runtime.LinkSettings(
                controller_address=address,
                keepalive_time_s=1.0,
                keepalive_timeout_s=1.0,
                reconnect_initial_s=0.2,
                reconnect_max_s=0.5,
            ),
        )
        stop = asyncio.Event()
        task = asyncio.create_task(agent.run(stop))
        try:
            await _wait_until(lambda: agent.stats.connected, 30.0)
            await asyncio.sleep(1.5)  # telemetry flowing, pings interleaved with data
            assert agent.stats.connected, "a live controller must not be declared dead by the pings"
            connects = agent.stats.connects
            os.kill(controller.pid, signal.SIGSTOP)
            lost_s = await _wait_until(lambda: not agent.stats.connected, 20.0)
            os.kill(controller.pid, signal.SIGCONT)
            back_s = await _wait_until(lambda: agent.stats.connected and agent.stats.connects > connects, 30.0)
            return lost_s, back_s
        finally:
            stop.set()
            await asyncio.wait_for(task, 15.0)

    try:
        lost_s, back_s = asyncio.run(scenario())
    finally:
        os.kill(controller.pid, signal.SIGCONT)
        controller.terminate()
        controller.wait(timeout=30)
        log.close()
    # 1 s without a frame, then 1 s for the ping's answer, plus the telemetry send tick: well under 6 s.
    assert lost_s < 6.0, lost_s
    assert back_s < 30.0
