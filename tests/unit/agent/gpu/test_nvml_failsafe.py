"""The agent's fail-safe cap on the real NVML backend (fake libnvidia-ml): it only ever lowers a limit.

DESIGN.md invariant 6: when the controller has been gone too long the agent lowers every cap to its
safe limit, and never raises one on its own, also when NVML fails a read now and then.
"""

from __future__ import annotations

import asyncio
import socket

import pynvml  # noqa: TID251  (constants for scripting the double)

from rasd.agent import runtime, spool
from rasd.agent import settings as agent_settings


def _unused_address() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{sock.getsockname()[1]}"


def _agent(backend) -> runtime.Agent:
    agent = runtime.Agent(
        agent_settings.AgentSettings(
            node_id="node-f",
            link=agent_settings.LinkSettings(controller_address=_unused_address()),
            failsafe=agent_settings.FailsafeSettings(power_limit_w=450, after_s=0.3),
        ),
        backend,
        spool.Spool(":memory:"),
        boot_id="boot",
    )
    agent.failsafe.disconnected_since -= 1.0  # the controller has been gone longer than failsafe_after_s
    return agent


def test_a_limit_that_cannot_be_read_is_not_set_to_the_safe_cap_until_it_is_read(fake, open_backend):
    backend = open_backend(watch_events=False)
    low, high = (g.uuid for g in backend.inventory())
    backend.set_power_limit(low, 300)  # the controller had it at 300 W, below the 450 W safe cap
    agent = _agent(backend)
    # One transient NVML error on the fail-safe's read of GPU 0's enforced limit.
    fake.inject_following(0, "EnforcedPowerLimit", (), [(pynvml.NVML_ERROR_UNKNOWN, None)])
    asyncio.run(agent.failsafe.check())  # what the sampling loop calls every cycle while disconnected
    assert fake.gpu(0).requested_limit_mw == 300_000  # not raised to 450 W
    assert fake.gpu(1).requested_limit_mw == 450_000  # the GPU it could read is lowered
    # The next cycle reads it: at 300 W, below the safe cap, it stays; the fall-back is then done.
    asyncio.run(agent.failsafe.check())
    assert fake.gpu(0).requested_limit_mw == 300_000
    assert {c.gpu_uuid: c.enforced_power_limit_w for c in backend.read_counters(0)} == {low: 300, high: 450}
    assert agent.stats.failsafe_applied == 1 and agent.failsafe.done
