"""rasd-sim end to end on a small fleet, and the controller's Prometheus exposition."""

from __future__ import annotations

import asyncio
import gc
import io
import json
import time
import urllib.request

import pytest

from rasd.agent import runtime, spool
from rasd.agent import settings as agent_settings
from rasd.agent.gpu import simulated
from rasd.controller import server
from rasd.sim import main as sim_main
from rasd.sim import scenario


def test_sim_report_is_measured_from_what_happened(tmp_path, capsys):
    custom = tmp_path / "short.toml"
    custom.write_text(
        """
name = "short"
[workload]
period_s = 1.0
[[faults]]
at_s = 1.0
node = 1
gpu = 1
kind = "xid"
xid = 79
message = "NVRM: Xid (PCI:0000:28:00): 79, GPU has fallen off the bus."
[[faults]]
at_s = 2.0
node = 0
gpu = 0
kind = "ecc_dbe"
[[faults]]
at_s = 99.0
node = 0
gpu = 0
kind = "xid"
xid = 13
[[operator]]
at_s = 2.5
action = "set_power_cap"
power_limit_w = 500
"""
    )
    code = sim_main.main(
        ["--nodes", "3", "--gpus-per-node", "2", "--duration-s", "6", "--scenario", str(custom),
         "--out", str(tmp_path / "out"), "--table-interval-s", "2", "--seed", "5"]
    )  # fmt: skip
    printed = capsys.readouterr().out
    assert code == 0
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert (tmp_path / "out" / "report.md").read_text().startswith("# rasd-sim report")
    assert "3 nodes, 6 GPUs" in printed
    # Xid 79 took one GPU off the bus: it is seen, but its draw is unknown once its last sample is stale.
    assert report["fleet"] == report["fleet"] | {"nodes_seen": 3, "gpus_seen": 6}
    assert report["fleet"]["gpus_with_power"] in (5, 6)
    # The fault at 99 s lies beyond the run: it was never injected, so it cannot count.
    assert report["faults"]["injected"] == 2 and report["faults"]["detected"] == 2
    assert report["faults"]["by_kind"] == {
        "xid": {"injected": 1, "detected": 1},
        "ecc_dbe": {"injected": 1, "detected": 1},
    }
    assert report["events_lost"] == 0 and report["agent_events_unacked_at_end"] == 0
    # The sim runs over mutual TLS by default, and the controller counted every stream as such.
    assert report["tls"] is True and report["agent_streams"]["opened"] >= 3
    # Remediation rebooted the node whose GPU fell off the bus (Xid 79 → reboot, never a reset), so by
    # the cap change at 2.5 s every GPU answers again and confirms its cap.
    assert report["commands"]["sent"] == 3 and report["commands"]["read_back_confirmed"] == 3, report["commands"]
    xid79 = next(f for f in report["remediation"]["per_fault"] if f["fault"] == "xid:79")
    assert xid79["first_action"] == "reboot_node" and not xid79["wrong"]
    assert report["remediation"]["wrong_actions"] == 0
    assert report["controller"]["telemetry_samples"] > 6 * 10 * 4
    assert report["power"]["swing_p2p_w_observed"] > 6 * 300  # every GPU swings ≥ 500 W per step


def test_demo_scenario_is_valid():
    demo = scenario.load("demo")
    assert demo.faults and demo.operator
    assert scenario.builtin_names() == ["demo", "job_hang", "straggler"]


def test_bad_scenario_names_the_key(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('[[faults]]\nat_s = 1\nnode = 0\ngpu = 0\nkind = "meteor"\n')
    with pytest.raises(scenario.ScenarioError, match=r"faults\[0\]: fault kind .meteor."):
        scenario.load(str(bad))


def test_controller_metrics_pass_promtool(tmp_path, free_port, check_metrics):

    callbacks_before = len(gc.callbacks)

    async def scrape():
        controller = server.Controller(
            server.ControllerSettings(
                listen=f"127.0.0.1:{free_port}",
                db_url=f"sqlite:///{tmp_path / 'rasd.db'}",
                metrics_port=0,
                metrics_addr="127.0.0.1",
            )
        )
        await controller.start()
        backend = simulated.SimulatedBackend("node-m", 2, 0, workload=simulated.StepWorkload())
        agent = runtime.Agent(
            agent_settings.AgentSettings(
                node_id="node-m",
                link=agent_settings.LinkSettings(controller_address=controller.address, telemetry_send_interval_ms=200),
            ),
            backend,
            spool.Spool(":memory:"),
            boot_id="b",
        )
        stop = asyncio.Event()
        task = asyncio.create_task(agent.run(stop))
        while controller.ingest.samples_ingested < 10:
            await asyncio.sleep(0.05)
        gc.collect()  # a pause the controller's collector times (trigger "threshold": not its own)
        url = f"http://127.0.0.1:{controller.metrics_port}/metrics"
        # The pause is reported on the event loop at the collector's next check (QUIET_CHECK_S): scrape
        # until it shows, so a scrape that beats the check is not taken for a lost pause.
        deadline = time.monotonic() + 10
        while True:
            body = await asyncio.to_thread(lambda: urllib.request.urlopen(url, timeout=5).read())
            timed = b'rasd_gc_pause_seconds_count{generation="2",trigger="threshold"}' in body
            if timed or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.05)
        stop.set()
        await task
        await controller.stop()
        return body

    body = asyncio.run(scrape())
    assert len(gc.callbacks) == callbacks_before  # the controller's collector stopped watching
    text = body.decode()
    assert "rasd_controller_gpu_power_watts{" in text and "rasd_power_samples_total" in text
    assert "rasd_gpu_power_watts" not in text, "the agent's name: a sum over both would count each GPU twice"
    assert "_created" not in text and "rasd_build_info{" in text
    assert 'rasd_gc_pause_seconds_count{generation="2",trigger="threshold"}' in text
    check_metrics(text)


def test_stdout_table_is_shared_with_rasctl():
    from rasd.api.v1 import admin_service_pb2 as admin_pb
    from rasd.cli import views

    out = io.StringIO()
    node = admin_pb.NodeStatus(
        node_id="n1", state=admin_pb.COMPONENT_STATE_HEALTHY, power_draw_w=1234.4, power_cap_w=1400
    )
    node.gpus.add(uuid="GPU-x")
    views.nodes_table([node], 0, out)
    lines = out.getvalue().splitlines()
    assert lines[0].split() == ["NODE", "GPUS", "STATE", "LAST", "SEEN", "DRAW", "W", "CAP", "W"]
    assert lines[1].split() == ["n1", "1", "healthy", "never", "1234", "1400"]
