"""The agent as a daemon: Prometheus exporter (checked by promtool), fail-safe cap, sd_notify."""

from __future__ import annotations

import asyncio
import shutil
import socket
import subprocess
import time
import urllib.request

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from rasd.agent import metrics, runtime, spool, systemd
from rasd.agent import settings as agent_settings
from rasd.agent.core import model
from rasd.agent.gpu import simulated
from rasd.api.v1 import commands_pb2 as commands_pb
from rasd.controller import server


def _agent(address: str, failsafe: agent_settings.FailsafeSettings | None = None) -> runtime.Agent:
    backend = simulated.SimulatedBackend("node-d", 2, 0, workload=simulated.StepWorkload())
    return runtime.Agent(
        agent_settings.AgentSettings(
            node_id="node-d",
            link=agent_settings.LinkSettings(controller_address=address, reconnect_initial_s=0.05, reconnect_max_s=0.2),
            failsafe=failsafe or agent_settings.FailsafeSettings(),
        ),
        backend,
        spool.Spool(":memory:"),
        boot_id="boot",
    )


def test_agent_exposition_passes_promtool_and_carries_ras_counters(free_port, check_metrics):
    async def run():
        agent = _agent(f"127.0.0.1:{free_port}")  # nobody listens: the agent samples regardless
        registry = CollectorRegistry()
        metrics.register(registry, agent, "host-d")
        agent.backend.fire(simulated.ScriptedFault(at_s=0, kind="xid", gpu=0, xid=79), 1)
        stop = asyncio.Event()
        task = asyncio.create_task(agent.run(stop))
        while not agent.latest_counters() or agent.stats.events_spooled < 1:
            await asyncio.sleep(0.05)
        stop.set()
        await task
        return generate_latest(registry)

    body = asyncio.run(run())
    text = body.decode()
    for name in (
        "rasd_gpu_power_watts{",
        "rasd_gpu_ecc_errors_total{",
        "rasd_gpu_remapped_rows_pending{",
        "rasd_gpu_nvlink_errors_total{",
        'rasd_agent_xid_events_total{node="node-d",xid="79"} 1.0',
        "rasd_agent_spool_depth{",
        'Hostname="host-d"',
        'gpu="1"',  # the index (GPU 0 fell off the bus with its Xid 79)
    ):
        assert name in text, name
    check_metrics(text)


def test_failsafe_lowers_caps_after_the_outage_and_never_raises(free_port):
    async def run():
        agent = _agent(f"127.0.0.1:{free_port}", agent_settings.FailsafeSettings(power_limit_w=450, after_s=0.3))
        low, high = (g.uuid for g in agent.backend.inventory())
        agent.backend.set_power_limit(low, 300)  # already below the safe cap: must stay at 300
        stop = asyncio.Event()
        task = asyncio.create_task(agent.run(stop))
        while agent.stats.failsafe_applied < 1:
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.3)
        stop.set()
        await task
        return agent, {c.gpu_uuid: c.enforced_power_limit_w for c in agent.backend.read_counters(0)}, low, high

    agent, limits, low, high = asyncio.run(run())
    assert limits == {low: 300, high: 450}
    assert agent.stats.failsafe_applied == 1


def test_notifier_speaks_sd_notify_and_is_silent_outside_systemd(tmp_path, monkeypatch):
    path = str(tmp_path / "notify.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as server:
        server.bind(path)
        monkeypatch.setenv("WATCHDOG_USEC", "60000000")
        notifier = systemd.Notifier(path)
        assert notifier.watchdog_interval_s == 30.0
        assert notifier.ready("streaming") and notifier.watchdog() and notifier.stopping()
        received = [server.recv(256).decode() for _ in range(3)]
    assert received == ["READY=1\nSTATUS=streaming", "WATCHDOG=1", "STOPPING=1"]
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    assert not systemd.Notifier().enabled and not systemd.Notifier().ready()


def test_unit_file_verifies_with_systemd_analyze(repo_root, tmp_path):
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze not installed")
    unit = tmp_path / "rasd-agent.service"
    text = (repo_root / "agent/packaging/rasd-agent.service").read_text()
    # Point ExecStart at a binary that exists here so verify checks the unit, not our install path.
    unit.write_text(text.replace("/usr/local/bin/rasd-agent", shutil.which("true") or "/bin/true"))
    result = subprocess.run([analyze, "verify", str(unit)], capture_output=True, text=True, timeout=60)
    problems = [line for line in result.stderr.splitlines() if "rasd-agent.service" in line]
    assert problems == [], result.stderr


def test_standalone_agent_serves_metrics_over_http(tmp_path, venv_bin, free_port):
    metrics_port = free_port
    process = subprocess.Popen(
        [str(venv_bin / "rasd-agent"), "--insecure", "--backend", "simulated", "--gpus", "1", "--node-id", "node-h",
         "--controller", "127.0.0.1:1", "--state-dir", str(tmp_path), "--metrics-port", str(metrics_port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        body = b""
        for _ in range(100):
            try:
                body = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=2).read()
                if b"rasd_gpu_power_watts{" in body:
                    break
            except OSError:
                pass
            asyncio.run(asyncio.sleep(0.1))
        assert b'rasd_agent_controller_connected{node="node-h"} 0.0' in body
    finally:
        process.terminate()
        assert process.wait(timeout=20) == 0


def test_observations_are_counted_per_kind(free_port):
    agent = _agent(f"127.0.0.1:{free_port}")
    agent.observe([model.Observation(model.EventKind.ECC_DBE, 1, "dbe", "test", gpu_uuid="GPU-x")])
    assert agent.event_counts() == {("ECC_DBE", ""): 1}


def test_a_cap_raise_still_slewing_stops_where_it_is_when_the_controller_goes(free_port, tmp_path):
    """Invariant 6: the agent never raises a cap on its own, so a raise ordered by a controller it no
    longer hears stops moving; the controller that takes over reads the limit, not a target it never sent."""

    async def run():
        controller = server.Controller(
            server.ControllerSettings(
                listen=f"127.0.0.1:{free_port}", db_url=f"sqlite:///{tmp_path / 'c.db'}", metrics_port=None
            )
        )
        await controller.start()
        agent = _agent(f"127.0.0.1:{free_port}")
        gpu = agent.backend.inventory()[0].uuid
        agent.backend.set_power_limit(gpu, 300)
        stop = asyncio.Event()
        task = asyncio.create_task(agent.run(stop))
        try:
            while "node-d" not in controller.ingest.sessions:
                await asyncio.sleep(0.05)
            raise_cap = commands_pb.Command(
                command_id="raise-1",
                issued_unix_ns=time.time_ns(),
                deadline_unix_ns=time.time_ns() + 30 * 10**9,
                set_power_cap=commands_pb.SetPowerCap(
                    limits=[commands_pb.GpuPowerLimit(gpu_uuid=gpu, power_limit_w=700, max_raise_w_per_s=40.0)]
                ),
            )
            result = await controller.ingest.send_command("node-d", raise_cap, timeout_s=10)
            assert result.outcome == commands_pb.ACTION_OUTCOME_SUCCEEDED
            assert agent._executor.slew_targets() == {gpu: 700}
            await asyncio.sleep(0.5)  # the limit is moving up at 40 W/s
        finally:
            await controller.stop()
        while agent.stats.connected:
            await asyncio.sleep(0.05)
        stopped_at = agent.backend.read_counters(0)[0].enforced_power_limit_w
        await asyncio.sleep(0.6)  # six slew steps: none may move it
        after = agent.backend.read_counters(0)[0].enforced_power_limit_w
        targets = agent._executor.slew_targets()
        stop.set()
        await task
        return stopped_at, after, targets

    stopped_at, after, targets = asyncio.run(run())
    assert targets == {}
    assert 300 < stopped_at < 700 and after == stopped_at
