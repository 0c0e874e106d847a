"""Invariant 3 under fire: agents cut off from the controller for 60 s, and SIGKILLed mid-spool.

Three real `rasd-agent` processes (simulated GPUs, kernel-log faults from a kmsg file each) reach a
real `rasd-controller` through a TCP proxy. The proxy black-holes every connection for 60 s (a
network partition: nothing gets through, nothing is closed; each side finds out from its own
timeouts) while faults keep appearing in the kernel logs. During the cut, two agents are SIGKILLed
right after a burst of faults lands in their kernel log (mid-spool: some lines read, some spooled,
some not yet) and started again.

After the heal, for every node: each injected fault is stored exactly once, the stored seqs are
exactly the agent's spool seqs 1..head (no gap, no duplicate), and the agent's spool is fully acked.
The 60 s is real time on purpose: it is longer than the controller's keepalive (30 s + 10 s), so the
controller drops the dead streams while the agents still believe in theirs, as in a real partition.
"""

from __future__ import annotations

import asyncio
import collections
import signal
import sqlite3
import subprocess
import time

import chaoslib
import pytest

pytestmark = pytest.mark.slow

CUT_S = 60.0
AGENTS = 3
LINE = "3,{seq},{usec},-;NVRM: Xid (PCI:0000:18:00): 13, pid={pid}, name=python, chaos fault {node} {seq}"


class KernelLog:
    """One node's kmsg file; each fault line carries its number, the ground truth to find in the store."""

    def __init__(self, path, node_id: str) -> None:
        self.path = path
        self.node_id = node_id
        self.path.write_text("")
        self.injected = 0

    def fault(self, count: int = 1) -> None:
        with self.path.open("a") as f:
            for _ in range(count):
                self.injected += 1
                seq = self.injected
                f.write(LINE.format(seq=seq, usec=seq * 1000, pid=1000 + seq, node=self.node_id) + "\n")


def _agent(tmp_path, node_id: str, kmsg, address: str) -> subprocess.Popen[bytes]:
    with open(tmp_path / f"{node_id}.log", "ab") as log:  # the child keeps its own descriptor
        return subprocess.Popen(
            [str(chaoslib.VENV_BIN / "rasd-agent"), "--insecure", "--backend", "simulated", "--gpus", "2",
             "--node-id", node_id, "--controller", address, "--state-dir", str(tmp_path / node_id),
             "--kernel-log", "kmsg", "--kmsg-path", str(kmsg.path), "--metrics-port", "-1", "--log-level", "info"],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        )  # fmt: skip


def _stored(db_path) -> dict[str, list[tuple[int, str]]]:
    connection = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True, timeout=30)
    try:
        rows = connection.execute("SELECT node_id, seq, message FROM health_events").fetchall()
    finally:
        connection.close()
    out: dict[str, list[tuple[int, str]]] = collections.defaultdict(list)
    for node_id, seq, message in rows:
        out[node_id].append((seq, message))
    return out


def _spool_positions(state_dir) -> tuple[int, int]:
    """(head seq, acked seq) of a stopped agent's spool."""
    connection = sqlite3.connect(str(state_dir / "spool.db"))
    try:
        head = connection.execute("SELECT seq FROM sqlite_sequence WHERE name = 'events'").fetchone()
        acked = connection.execute("SELECT value FROM meta WHERE key = 'acked_seq'").fetchone()
    finally:
        connection.close()
    return (int(head[0]) if head else 0), (int(acked[0]) if acked else 0)


def test_a_60_s_partition_and_agent_sigkills_mid_spool_lose_nothing(tmp_path, figures):
    db_path = tmp_path / "rasd.db"
    controller = chaoslib.ControllerProcess(tmp_path, f"sqlite:///{db_path}", chaoslib.free_port())
    controller.start()
    asyncio.run(controller.wait_ready())
    proxy = chaoslib.TcpProxy(controller.port)
    address = f"127.0.0.1:{proxy.port}"
    nodes = [f"node-p{i}" for i in range(AGENTS)]
    logs = {n: KernelLog(tmp_path / f"{n}.kmsg", n) for n in nodes}
    agents = {n: _agent(tmp_path, n, logs[n], address) for n in nodes}
    kills = 0

    def stored_count(node_id: str) -> int:
        return len(_stored(db_path).get(node_id, []))

    def wait_all_stored(timeout_s: float) -> float:
        started = time.monotonic()
        while any(stored_count(n) < logs[n].injected for n in nodes):
            if time.monotonic() - started > timeout_s:
                have = {n: (stored_count(n), logs[n].injected) for n in nodes}
                raise AssertionError(f"not every fault stored within {timeout_s} s (stored, injected): {have}")
            time.sleep(0.5)
        return time.monotonic() - started

    try:
        for n in nodes:
            logs[n].fault(3)
        wait_all_stored(60)

        proxy.cut()
        cut_at = time.monotonic()
        schedule = {10.0: nodes[0], 30.0: nodes[1]}  # seconds into the cut → agent to SIGKILL
        while (elapsed := time.monotonic() - cut_at) < CUT_S:
            for n in nodes:
                logs[n].fault()
            for at_s, victim in list(schedule.items()):
                if elapsed >= at_s:
                    del schedule[at_s]
                    logs[victim].fault(40)  # a burst, and the agent dies while spooling it
                    time.sleep(0.02)
                    agents[victim].send_signal(signal.SIGKILL)
                    agents[victim].wait()
                    kills += 1
                    logs[victim].fault(2)  # the kernel keeps logging while no agent runs
                    time.sleep(1.0)
                    agents[victim] = _agent(tmp_path, victim, logs[victim], address)
            time.sleep(2.0)
        stored_during_cut = {n: stored_count(n) for n in nodes}
        proxy.heal()
        catch_up_s = wait_all_stored(90)
        time.sleep(3)  # anything resent twice would land now
        stored = _stored(db_path)
    finally:
        for process in agents.values():
            process.send_signal(signal.SIGTERM)
        for process in agents.values():
            process.wait(timeout=20)
        proxy.close()
        controller.close()

    injected = sum(logs[n].injected for n in nodes)
    lost = duplicated = 0
    for n in nodes:
        numbers = collections.Counter(int(message.rsplit(" ", 1)[1]) for _seq, message in stored[n])
        lost += sum(1 for k in range(1, logs[n].injected + 1) if numbers[k] == 0)
        duplicated += sum(c - 1 for c in numbers.values() if c > 1)
    figures(
        f"agents {AGENTS}, cut {CUT_S:g} s (stored during cut {sum(stored_during_cut.values())}), "
        f"agent SIGKILLs {kills}, "
        f"faults injected {injected}, stored {sum(len(v) for v in stored.values())}, lost {lost}, "
        f"duplicates {duplicated}, caught up {catch_up_s:.1f} s after heal"
    )
    assert kills == 2
    assert lost == 0 and duplicated == 0
    for n in nodes:
        head, acked = _spool_positions(tmp_path / n)
        seqs = sorted(seq for seq, _ in stored[n])
        assert seqs == list(range(1, head + 1)), f"{n}: stored seqs are the agent's spool seqs 1..{head}, once each"
        assert acked == head, f"{n}: the agent's spool is fully acked ({acked} of {head})"
