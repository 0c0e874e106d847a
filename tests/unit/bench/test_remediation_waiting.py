"""bench/remediation.py's diagnostic adapter that only waits: shaped as the Kubernetes one, costing no CPU."""

from __future__ import annotations

import pathlib
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3] / "bench"))
import remediation  # bench/ is scripts, not a package

from rasd.controller.core.remediation import actions
from rasd.controller.executors import quarantine
from rasd.controller.remediation import adapters


def test_the_waiting_adapter_blocks_for_a_read_and_a_patch_then_records():
    table = quarantine.executors(remediation.WaitingQuarantine(api_latency_ms=5))
    run = table[actions.QuarantineGpu.kind]
    assert adapters.blocking(run), "called in an adapter thread once its decision is durable, as Kubernetes is"
    action = actions.QuarantineGpu(ticket_id="t1", step=1, node_id="node-1", reason="xid 48", gpu_uuid="GPU-1")
    started = time.perf_counter()
    outcome = run(action)
    assert time.perf_counter() - started >= 0.010, "two 5 ms answers"
    assert outcome.status is quarantine.Status.QUARANTINED and outcome.recorded_only


def test_a_waiting_run_writes_a_section_of_its_own():
    args = remediation._parser().parse_args(["--quarantine", "waiting"])
    assert args.quarantine == "waiting"
    assert remediation.WAITING_SECTION not in (remediation.SECTION, remediation.KUBERNETES_SECTION)
