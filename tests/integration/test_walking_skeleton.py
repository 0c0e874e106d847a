"""End to end with the real entry points: rasd-controller, two rasd-agent processes and rasctl."""

from __future__ import annotations

import json
import signal
import subprocess
import time


def _start(argv, log_path):
    log = open(log_path, "w")  # noqa: SIM115 - closed by the test after the process ends
    return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL), log


def _rasctl_nodes(venv_bin, address):
    result = subprocess.run(
        [str(venv_bin / "rasctl"), "--controller", address, "nodes", "--json"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    return result.returncode, result.stdout, result.stderr


def test_rasctl_json_reflects_two_agents_gpus_and_power(tmp_path, venv_bin, free_port):
    address = f"127.0.0.1:{free_port}"
    controller, controller_log = _start(
        [
            str(venv_bin / "rasd-controller"),
            "--insecure",
            "--listen",
            address,
            "--metrics-port",
            "-1",
            "--db",
            f"sqlite:///{tmp_path / 'rasd.db'}",
        ],
        tmp_path / "controller.log",
    )
    agents = []
    try:
        for node_id, gpus, seed in (("node-a", 4, 1), ("node-b", 2, 2)):
            agents.append(
                _start(
                    [
                        str(venv_bin / "rasd-agent"),
                        "--insecure",
                        "--backend",
                        "simulated",
                        "--node-id",
                        node_id,
                        "--gpus",
                        str(gpus),
                        "--seed",
                        str(seed),
                        "--label",
                        "rack=r1",
                        "--controller",
                        address,
                        "--state-dir",
                        str(tmp_path / node_id),
                        "--metrics-port",
                        "-1",
                    ],
                    tmp_path / f"{node_id}.log",
                )
            )
        deadline = time.monotonic() + 45
        nodes = []
        while time.monotonic() < deadline:
            code, stdout, _ = _rasctl_nodes(venv_bin, address)
            if code == 0:
                nodes = json.loads(stdout)
                powered = [g for n in nodes for g in n["gpus"] if g.get("power_w", 0) > 0]
                if len(nodes) == 2 and len(powered) == 6:
                    break
            time.sleep(0.5)
        by_id = {n["node_id"]: n for n in nodes}
        assert sorted(by_id) == ["node-a", "node-b"], (tmp_path / "controller.log").read_text()[-2000:]
        assert [len(by_id["node-a"]["gpus"]), len(by_id["node-b"]["gpus"])] == [4, 2]
        for node in nodes:
            assert node["connected"] is True
            assert node["state"] == "healthy"
            assert node["backend"] == "simulated"
            assert node["labels"] == {"rack": "r1"}
            assert node["power_cap_w"] == 700 * len(node["gpus"])
            assert 0 < node["power_draw_w"] <= 700 * len(node["gpus"]) + 50
            for gpu in node["gpus"]:
                assert gpu["uuid"].startswith("GPU-")
                assert 50 < gpu["power_w"] <= 710
                assert gpu["power_limit_w"] == 700

        # The human table shows the same fleet.
        table = subprocess.run(
            [str(venv_bin / "rasctl"), "--controller", address, "nodes"], capture_output=True, text=True, timeout=30
        )
        assert "node-a" in table.stdout and "2 nodes, 6 GPUs" in table.stdout
    finally:
        for process, _ in agents:
            process.send_signal(signal.SIGTERM)
        agent_codes = [process.wait(timeout=20) for process, _ in agents]
        controller.send_signal(signal.SIGTERM)
        controller_code = controller.wait(timeout=20)
        for _, log in [*agents, (controller, controller_log)]:
            log.close()
    assert agent_codes == [0, 0], "agents must exit cleanly on SIGTERM"
    assert controller_code == 0, "the controller must exit cleanly on SIGTERM"
    assert "controller_stopped" in (tmp_path / "controller.log").read_text()


def test_rasctl_reports_an_unreachable_controller(venv_bin, free_port):
    code, _, stderr = _rasctl_nodes(venv_bin, f"127.0.0.1:{free_port}")
    assert code == 3
    assert "UNAVAILABLE" in stderr or "DEADLINE_EXCEEDED" in stderr
