"""DESIGN.md invariant 3, end to end with the real programs: no health event is lost or repeated.

The controller is down for 60 s while faults keep appearing in the kernel log, and the agent is
SIGKILLed and restarted in the middle of it. Afterwards every event is stored exactly once.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time

import pytest

pytestmark = pytest.mark.slow

OUTAGE_S = 60.0
LINE = "3,{seq},{usec},-;NVRM: Xid (PCI:0000:18:00): 13, pid={pid}, name=python, fault number {seq}"


class Fleet:
    def __init__(self, tmp_path, venv_bin, port):
        self.tmp = tmp_path
        self.bin = venv_bin
        self.address = f"127.0.0.1:{port}"
        self.kmsg = tmp_path / "kmsg"
        self.kmsg.write_text("")
        self.next_seq = 1
        self.logs = []

    def _spawn(self, name, argv):
        log = open(self.tmp / f"{name}.log", "a")  # noqa: SIM115 - closed in close()
        self.logs.append(log)
        return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    def controller(self):
        return self._spawn(
            "controller",
            [str(self.bin / "rasd-controller"), "--insecure", "--listen", self.address, "--metrics-port", "-1",
             "--db", f"sqlite:///{self.tmp / 'rasd.db'}"],
        )  # fmt: skip

    def agent(self):
        return self._spawn(
            "agent",
            [str(self.bin / "rasd-agent"), "--insecure", "--backend", "simulated", "--gpus", "2",
             "--node-id", "node-k", "--controller", self.address, "--state-dir", str(self.tmp / "state"),
             "--kernel-log", "kmsg", "--kmsg-path", str(self.kmsg), "--metrics-port", "-1"],
        )  # fmt: skip

    def fault(self, count=1):
        with self.kmsg.open("a") as f:
            for _ in range(count):
                seq = self.next_seq
                f.write(LINE.format(seq=seq, usec=seq * 1000, pid=1000 + seq) + "\n")
                self.next_seq += 1

    def stored(self):
        result = subprocess.run(
            [str(self.bin / "rasctl"), "--controller", self.address, "events", "--json", "--limit", "1000"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        return json.loads(result.stdout) if result.returncode == 0 else None

    def wait_stored(self, count, timeout_s):
        deadline = time.monotonic() + timeout_s
        events = None
        while time.monotonic() < deadline:
            events = self.stored()
            if events is not None and len(events) >= count:
                return events
            time.sleep(0.5)
        raise AssertionError(f"expected {count} stored events, have {events and len(events)}")

    def close(self):
        for log in self.logs:
            log.close()


def test_controller_outage_and_agent_sigkill_lose_and_repeat_nothing(tmp_path, venv_bin, free_port):
    fleet = Fleet(tmp_path, venv_bin, free_port)
    controller = fleet.controller()
    agent = fleet.agent()
    try:
        fleet.fault(3)
        fleet.wait_stored(3, 30)

        controller.kill()  # the controller is gone without a goodbye
        controller.wait()
        outage_started = time.monotonic()
        fleet.fault(2)
        time.sleep(OUTAGE_S / 3)
        agent.send_signal(signal.SIGKILL)  # the agent dies mid-outage with unacked events spooled
        agent.wait()
        fleet.fault(2)  # faults while no agent runs: the kernel keeps them, the cursor finds them
        time.sleep(2)
        agent = fleet.agent()
        time.sleep(2)
        fleet.fault(2)
        time.sleep(max(0.0, OUTAGE_S - (time.monotonic() - outage_started)))

        controller = fleet.controller()
        events = fleet.wait_stored(9, 60)
        time.sleep(3)  # anything duplicated would arrive now
        events = fleet.stored()
    finally:
        for process in (agent, controller):
            process.send_signal(signal.SIGTERM)
        for process in (agent, controller):
            process.wait(timeout=20)
        fleet.close()

    messages = sorted(e["event"]["message"] for e in events)
    numbers = sorted(int(m.rsplit(" ", 1)[1]) for m in messages)
    seqs = sorted(int(e["event"]["seq"]) for e in events)
    print(
        f"\nevents injected 9, stored {len(events)}, distinct {len(set(numbers))}, outage {OUTAGE_S:g} s, agent kills 1"
    )
    assert numbers == list(range(1, 10)), "every kernel fault exactly once"
    assert seqs == list(range(1, 10)), "spool sequence numbers are gap-free and unique"
