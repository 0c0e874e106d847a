"""`rasd-controller --ingest-workers 2` on a real PostgreSQL: one port, two processes, one power loop over every node.

The real program with a `[power]` table whose budgets bind, and swarm agents (each its own TCP
connection): SO_REUSEPORT spreads their streams over both workers; the worker that holds the lease
caps every node, the other worker's through the aggregates it ships and the relay. When the parent
is SIGKILLed, the workers stop by themselves.

PostgreSQL comes from RASD_TEST_POSTGRES_URL; without it the test is skipped with a message.
"""

from __future__ import annotations

import asyncio
import os
import pathlib
import signal
import subprocess
import sys
import time
import urllib.request

import pytest

from rasd.sim import swarm

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "bench"))
import replicas  # bench/ is scripts, not a package

pytestmark = pytest.mark.slow

SETUP = replicas.Setup(nodes=16, gpus_per_node=8)


def _children(pid: int) -> set[int]:
    """The pids whose parent is pid (from /proc)."""
    found = set()
    for entry in pathlib.Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.add(int(entry.name))
    return found


def _streams(metrics_port: int) -> int:
    """A worker's open agent streams, from its Prometheus endpoint."""
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5) as response:
        text = response.read().decode()
    return int(float(next(line.split()[1] for line in text.splitlines() if line.startswith("rasd_agent_streams "))))


def _alive(pid: int) -> bool:
    try:
        stat = pathlib.Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


async def _capped_everywhere(fleet: swarm.Swarm, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if all(any(cid.startswith("cap-") for _at, cid, _kind in a.stats.commands) for a in fleet.agents):
            return
        await asyncio.sleep(0.2)
    missing = [a.node_id for a in fleet.agents if not any(c.startswith("cap-") for _t, c, _k in a.stats.commands)]
    raise AssertionError(f"no cap reached {missing}")


def test_two_ingest_workers_share_the_port_and_the_leader_caps_every_node(postgres_schema_url, tmp_path, free_port):
    port, metrics_port = free_port, free_port + 10
    config = tmp_path / "controller.toml"
    config.write_text(
        replicas.CONFIG.format(name="pod", lease_s=SETUP.lease_s, renew_s=SETUP.renew_s,
                               relay_poll_s=SETUP.relay_poll_s, control_period_s=SETUP.control_period_s,
                               command_ttl_s=SETUP.command_ttl_s)
        + replicas._toml_tree(SETUP.tree())
    )  # fmt: skip
    log = (tmp_path / "controller.log").open("w")
    parent = subprocess.Popen(
        [str(pathlib.Path(sys.executable).parent / "rasd-controller"), "--insecure", "--listen", f"127.0.0.1:{port}",
         "--metrics-port", str(metrics_port), "--db", postgres_schema_url, "--config", str(config),
         "--no-remediation", "--ingest-workers", "2"],
        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
    )  # fmt: skip

    async def scenario() -> list[int]:
        fleet = swarm.Swarm(
            SETUP.node_ids(),
            swarm.SwarmSettings(controller_address=f"127.0.0.1:{port}", reconnect_initial_s=0.2, reconnect_max_s=1.0),
        )
        stop = asyncio.Event()
        runner = asyncio.create_task(fleet.run(stop))
        try:
            await _capped_everywhere(fleet, timeout_s=90.0)
            return [_streams(metrics_port), _streams(metrics_port + 1)]
        finally:
            stop.set()
            await runner

    try:
        per_worker = asyncio.run(scenario())
        workers = _children(parent.pid)
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        deadline = time.monotonic() + 15.0
        while any(_alive(pid) for pid in workers) and time.monotonic() < deadline:
            time.sleep(0.2)
        left = [pid for pid in workers if _alive(pid)]
        for pid in left:  # never leave one behind
            os.kill(pid, signal.SIGKILL)
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
        log.close()
    tail = (tmp_path / "controller.log").read_text()[-3000:]
    assert sum(per_worker) == SETUP.nodes and min(per_worker) > 0, (per_worker, tail)
    assert len(workers) >= 2, tail
    assert not left, f"workers {left} outlived their parent"
