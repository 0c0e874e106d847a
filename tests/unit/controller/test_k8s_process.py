"""The Kubernetes adapter in its own process (`KubernetesProcess`): the same outcomes and errors as in
the controller's process, Events posted after the call returns, a lost child replaced; the real
``kubernetes`` client in the child, over HTTP to the fake API server of tests/fakes/kube_api.py."""

from __future__ import annotations

import asyncio
import os
import pathlib
import signal
import sys
import threading
import time

import kubernetes.client
import pytest

from rasd.common import logging as rasd_logging
from rasd.controller.core.remediation import actions
from rasd.controller.executors import quarantine

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "fakes"))
import kube_api

TICKET = "n1/GPU-1/xid:79/3"


@pytest.fixture(scope="module")
def shared_api():
    fake = kube_api.FakeKubeApi()
    fake.start()
    yield fake
    fake.stop()


@pytest.fixture(scope="module")
def shared_child(shared_api):
    """One child for the tests that do not end it (starting one imports the client: seconds on a busy machine)."""
    adapter = quarantine.open_quarantine({"adapter": "kubernetes", "kubernetes": {"host": shared_api.url}})
    yield adapter
    adapter.close()


@pytest.fixture
def api(shared_api):
    """The shared fake server with node n1 (2 GPUs) as new, no pods, no Events, no latency."""
    shared_api.latency_s, shared_api.unavailable = 0.0, False
    shared_api.nodes.clear()
    shared_api.pods.clear()
    shared_api.events.clear()
    shared_api.add_node("n1", gpus=2)
    return shared_api


@pytest.fixture
def child(shared_child, api):
    return shared_child


@pytest.fixture
def own_child(api):
    adapter = quarantine.open_quarantine({"adapter": "kubernetes", "kubernetes": {"host": api.url}})
    yield adapter
    adapter.close()


def _wait_for(check, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_open_quarantine_runs_the_kubernetes_adapter_in_its_own_process(api, child):
    assert isinstance(child, quarantine.KubernetesProcess)

    outcome = child.quarantine_node("n1", reason="Xid 79: fell off the bus", ticket_id=TICKET)

    assert child.pid not in (None, os.getpid())
    assert outcome.status is quarantine.Status.QUARANTINED and outcome.changed
    node = api.node("n1")
    assert node["spec"]["unschedulable"] is True
    assert node["metadata"]["labels"]["rasd.io/state"] == "quarantined"
    assert node["metadata"]["annotations"]["rasd.io/quarantined"] == TICKET
    assert [c["status"] for c in node["status"]["conditions"] if c["type"] == "RasdHealthy"] == ["False"]
    _wait_for(lambda: len(api.events) == 1)
    assert api.events[0]["reason"] == "RasdQuarantined"
    assert child.quarantine_node("n1", reason="r", ticket_id="t2").status is quarantine.Status.ALREADY_QUARANTINED


def test_the_call_returns_before_its_event_is_posted(api, child):
    child.start()
    api.latency_s = 0.3  # read and patch: 0.6 s; the Event a further 0.3 s

    outcome = child.quarantine_gpu("n1", "GPU-1", reason="Xid 94", ticket_id=TICKET)

    assert outcome.status is quarantine.Status.QUARANTINED
    assert outcome.event_posted is None, "posted after the call"
    assert api.events == [], "the repair waiting for this call does not wait for the Event"
    _wait_for(lambda: [e["reason"] for e in api.events] == ["RasdGpuQuarantined"])


def test_in_process_post_later_defers_the_event_to_the_callable_it_is_given(api):
    later = []
    adapter = quarantine.KubernetesQuarantine(
        kubernetes.client.ApiClient(kubernetes.client.Configuration(host=api.url)), post_later=later.append
    )
    try:
        outcome = adapter.quarantine_port("n1", "mlx5_0/1", reason="flaps", ticket_id=TICKET)
        assert outcome.status is quarantine.Status.QUARANTINED and outcome.event_posted is None
        assert api.events == [] and len(later) == 1

        assert later[0]() is True
        assert [e["reason"] for e in api.events] == ["RasdPortQuarantined"]
    finally:
        adapter.close()


def test_outcomes_and_errors_come_back_as_in_process(api, child):
    assert child.release_node("nope", reason="r", ticket_id=TICKET).status is quarantine.Status.NODE_NOT_FOUND
    api.unavailable = True
    with pytest.raises(quarantine.QuarantineUnavailableError, match="HTTP 503"):
        child.quarantine_gpu("n1", "GPU-1", reason="r", ticket_id=TICKET)
    api.unavailable = False
    api.add_pod("default", "job", node="n1", gpus=1)
    report = child.drain_node("n1", reason="reset", ticket_id=TICKET, pods="gpu", deadline_s=5)
    assert isinstance(report, quarantine.DrainReport) and report.evicted == ("default/job",)
    assert set(child.sync_nodes(["n1"])) == {"n1"}


def test_the_executors_table_goes_through_the_child(api, child):
    table = quarantine.executors(child)
    action = actions.QuarantineGpu(ticket_id=TICKET, step=1, node_id="n1", reason="Xid 94", gpu_uuid="GPU-2")

    result = table[action.kind](action)

    assert result.status is quarantine.Status.QUARANTINED
    assert table[action.kind].blocking is True
    assert api.node("n1")["metadata"]["annotations"]["rasd.io/quarantined-gpus"] == "GPU-2"
    _wait_for(lambda: len(api.events) == 1)  # posted after the call: none is left to land in the next test


def test_a_lost_child_fails_its_call_as_unavailable_and_the_next_call_starts_another(api, own_child):
    child = own_child
    assert child.pid is None, "no child until the first call"
    child.start()
    api.latency_s = 2.0
    pid = child.pid
    assert pid is not None

    failures = []

    def call():
        try:
            child.quarantine_node("n1", reason="r", ticket_id=TICKET)
        except quarantine.QuarantineError as exc:
            failures.append(exc)

    caller = threading.Thread(target=call)
    caller.start()
    time.sleep(0.5)
    os.kill(pid, signal.SIGKILL)
    caller.join(timeout=10)

    assert [type(f) for f in failures] == [quarantine.QuarantineUnavailableError]
    api.latency_s = 0.0
    assert child.quarantine_node("n1", reason="r", ticket_id=TICKET).status is quarantine.Status.QUARANTINED
    assert child.started == 2 and child.pid != pid


def test_own_process_false_keeps_the_adapter_in_this_process(api):
    adapter = quarantine.open_quarantine(
        {"adapter": "kubernetes", "kubernetes": {"host": api.url, "own_process": False}}
    )
    try:
        assert isinstance(adapter, quarantine.KubernetesQuarantine)
        assert adapter.quarantine_node("n1", reason="r", ticket_id=TICKET).event_posted is True
    finally:
        adapter.close()


def test_close_lets_the_calls_in_flight_finish(api, own_child):
    own_child.start()
    api.latency_s = 0.3
    outcomes = []
    caller = threading.Thread(
        target=lambda: outcomes.append(own_child.quarantine_gpu("n1", "GPU-1", reason="r", ticket_id=TICKET))
    )
    caller.start()
    time.sleep(0.2)

    own_child.close()
    caller.join(timeout=10)

    assert [o.status for o in outcomes] == [quarantine.Status.QUARANTINED]
    assert own_child.pid is None


def test_call_async_gives_the_same_outcomes_and_errors_on_the_loop(api, child):
    async def scenario():
        calls = [child.call_async("quarantine_gpu", "n1", f"GPU-{i}", reason="r", ticket_id=TICKET) for i in (1, 2)]
        outcomes = await asyncio.gather(*calls)
        missing = await child.call_async("release_node", "nope", reason="r", ticket_id=TICKET)
        # The child posts a quarantine's Event after the call has answered; let both land before the
        # API goes away, or the second Event meets the 503 meant for the third call.
        await asyncio.to_thread(_wait_for, lambda: len(api.events) == 2)
        api.unavailable = True
        try:
            await child.call_async("quarantine_node", "n1", reason="r", ticket_id=TICKET)
        except quarantine.QuarantineUnavailableError as exc:
            unavailable = exc
        api.unavailable = False
        with pytest.raises(ValueError, match="not a method"):
            await child.call_async("close")
        return outcomes, missing, unavailable

    outcomes, missing, unavailable = asyncio.run(scenario())

    assert [o.status for o in outcomes] == [quarantine.Status.QUARANTINED] * 2
    assert missing.status is quarantine.Status.NODE_NOT_FOUND
    assert "HTTP 503" in str(unavailable)
    assert api.node("n1")["metadata"]["annotations"]["rasd.io/quarantined-gpus"] == "GPU-1,GPU-2"
    assert len(api.events) == 2


def test_the_executors_await_the_child_on_the_loop(api, child):
    table = quarantine.executors(child)
    quarantine_gpu = actions.QuarantineGpu(ticket_id=TICKET, step=1, node_id="n1", reason="Xid 94", gpu_uuid="GPU-2")
    rma = actions.OpenRma(ticket_id=TICKET, step=2, node_id="n1", reason="Xid 79 again")
    in_process = quarantine.executors(quarantine.RecordOnlyQuarantine())

    async def scenario():
        return await table[quarantine_gpu.kind].call_async(quarantine_gpu), await table[rma.kind].call_async(rma)

    outcome, marked = asyncio.run(scenario())

    assert outcome.status is quarantine.Status.QUARANTINED
    assert api.node("n1")["metadata"]["labels"]["rasd.io/state"] == "rma", marked
    assert not hasattr(in_process[quarantine_gpu.kind], "call_async"), "a thread's adapter has no coroutine"
    _wait_for(lambda: len(api.events) == 2)


def test_call_async_starts_a_child_off_the_loop_and_fails_as_unavailable_when_it_dies(api, own_child):
    child = own_child
    api.latency_s = 1.0

    async def scenario():
        ticks = 0

        async def ticking():  # the loop keeps running while the child starts and the call waits
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0.01)

        ticker = asyncio.create_task(ticking())
        asked_before = len(api.requests)
        call = asyncio.create_task(child.call_async("quarantine_node", "n1", reason="r", ticket_id=TICKET))
        while child.pid is None or len(api.requests) == asked_before:  # the call waits on its answer
            await asyncio.sleep(0.01)
        os.kill(child.pid, signal.SIGKILL)
        with pytest.raises(quarantine.QuarantineUnavailableError):
            await call
        api.latency_s = 0.0
        again = await child.call_async("quarantine_node", "n1", reason="r", ticket_id=TICKET)
        ticker.cancel()
        return ticks, again

    ticks, again = asyncio.run(scenario())

    assert again.status is quarantine.Status.QUARANTINED
    assert child.started == 2
    assert ticks > 10


def test_a_cancelled_async_caller_leaves_the_answer_reader_unharmed(api, child):
    api.latency_s = 0.3

    async def scenario():
        call = asyncio.create_task(child.call_async("quarantine_gpu", "n1", "GPU-1", reason="r", ticket_id=TICKET))
        await asyncio.sleep(0.1)
        call.cancel()
        await asyncio.gather(call, return_exceptions=True)
        await asyncio.sleep(0.4)  # its answer arrives for no one

    asyncio.run(scenario())
    api.latency_s = 0.0

    assert child.quarantine_gpu("n1", "GPU-2", reason="r", ticket_id=TICKET).status is quarantine.Status.QUARANTINED


def test_the_child_logs_each_call_it_carries_out_once(api, restore_logging, capfd):
    # The child logs at this process's level: info here, whatever an earlier test in this worker left.
    rasd_logging.configure("info", json=True)
    own_child = quarantine.open_quarantine({"adapter": "kubernetes", "kubernetes": {"host": api.url}})
    table = quarantine.executors(own_child)
    action = actions.QuarantineGpu(ticket_id=TICKET, step=1, node_id="n1", reason="Xid 94", gpu_uuid="GPU-2")

    table[action.kind](action)
    asyncio.run(table[action.kind].call_async(action))
    own_child.close()  # the child's stderr is flushed as it ends

    lines = [line for line in capfd.readouterr().err.splitlines() if "quarantine_executed" in line]
    assert len(lines) == 2, lines  # one a call: the child's, not the executors' as well
    assert all('"kind":"quarantine_gpu"' in line and TICKET in line for line in lines), lines


def test_a_loop_that_ends_while_its_channel_is_handed_over_leaves_the_child_serving(api, own_child):
    """The handing thread sends its own copy of the socket: the loop's end closing its copy cannot split the
    control message from the descriptor that must follow it (the child then read the next call's first
    byte as the descriptor's, and died)."""
    own_child.start()
    own_child._lock.acquire()  # the handover waits here until the loop has ended
    threading.Timer(0.5, own_child._lock.release).start()

    async def scenario():
        call = asyncio.create_task(own_child.call_async("quarantine_gpu", "n1", "GPU-1", reason="r", ticket_id=TICKET))
        await asyncio.sleep(0.1)
        call.cancel()  # and the loop ends, cancelling the channel's opening mid-handover

    asyncio.run(scenario())
    pid = own_child.pid

    assert own_child.quarantine_gpu("n1", "GPU-2", reason="r", ticket_id=TICKET).status is quarantine.Status.QUARANTINED
    assert own_child.pid == pid and own_child.started == 1
