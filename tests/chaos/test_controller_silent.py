"""A controller that goes silent without closing its connection: the agent notices and comes back.

A crashed host, a silent partition or a stopped process leaves the agent's TCP connection open with
nobody behind it: no FIN, no RST. Without keepalive pings the stream would hang until TCP gives up,
many minutes, and the node's events would wait in its spool all that time. Here the controller is a
real `rasd-controller` process stopped with SIGSTOP; the agent uses 1 s pings so the test is short.
"""

from __future__ import annotations

import asyncio
import os
import signal

import chaoslib
import pytest

from rasd.agent import runtime, spool
from rasd.agent import settings as agent_settings
from rasd.agent.gpu import simulated

pytestmark = pytest.mark.timeout(120)


async def _run(tmp_path) -> tuple[float, float, bool]:
    controller = chaoslib.ControllerProcess(tmp_path, f"sqlite:///{tmp_path / 'rasd.db'}", chaoslib.free_port())
    controller.start()
    try:
        await controller.wait_ready()
        agent = runtime.Agent(
            agent_settings.AgentSettings(
                node_id="node-ka",
                link=agent_settings.LinkSettings(
                    controller_address=controller.address,
                    keepalive_time_s=1.0,
                    keepalive_timeout_s=1.0,
                    reconnect_initial_s=0.2,
                    reconnect_max_s=0.5,
                ),
            ),
            simulated.SimulatedBackend("node-ka", 2, 0),
            spool.Spool(":memory:"),
            boot_id="boot-1",
        )
        stop = asyncio.Event()
        task = asyncio.create_task(agent.run(stop))
        try:
            await chaoslib.until(lambda: agent.stats.connected, 30, "agent connected")
            await asyncio.sleep(1.5)  # telemetry flowing, pings interleaved with data
            alive_under_pings = agent.stats.connected
            connects = agent.stats.connects
            assert controller.process is not None
            os.kill(controller.process.pid, signal.SIGSTOP)
            try:
                lost_s = await chaoslib.until(lambda: not agent.stats.connected, 20, "stopped controller noticed")
            finally:
                os.kill(controller.process.pid, signal.SIGCONT)
            back_s = await chaoslib.until(
                lambda: agent.stats.connected and agent.stats.connects > connects, 30, "agent reconnected"
            )
            return lost_s, back_s, alive_under_pings
        finally:
            stop.set()
            await asyncio.wait_for(task, 15.0)
    finally:
        controller.close()


def test_agent_notices_a_stopped_controller_within_the_keepalive_and_reconnects(tmp_path, figures):
    lost_s, back_s, alive_under_pings = asyncio.run(_run(tmp_path))
    figures(f"keepalive 1 s + 1 s: stopped controller noticed in {lost_s:.1f} s, reconnected {back_s:.1f} s later")
    assert alive_under_pings, "a live controller must not be declared dead by the pings"
    # 1 s without a frame, then 1 s for the ping's answer, plus the telemetry send tick: well under 6 s.
    assert lost_s < 6.0, lost_s
    assert back_s < 30.0
