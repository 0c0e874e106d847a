"""Invariant 2 on the agent (exactly-once effects): a command id never acts twice, even across a crash.

A restart or a reset is marked started before it runs: the agent killed in the middle answers the
resend as interrupted instead of running it again. A failed reboot is replayed as failed. Two
deliveries of one id at once run it once.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

from rasd.agent import actions, node_ops, spool
from rasd.agent import settings as agent_settings
from rasd.agent.core import model
from rasd.agent.gpu import simulated


def _lines(path):
    with open(path) as f:
        return f.read().splitlines()


def _cmd(action, command_id):
    return model.Command(command_id, 0, 0, "audit", action)


# --------------------------------------------------------------------------------------------------
# 1. Crash (SIGKILL / power loss) in the middle of a GPU reset, then the controller resends the id.
# --------------------------------------------------------------------------------------------------
_CHILD = textwrap.dedent(
    """
    import sys, time
    from rasd.agent import actions, node_ops, spool
    from rasd.agent import settings as agent_settings
    from rasd.agent.core import model
    from rasd.agent.gpu import simulated

    spool_path, marker = sys.argv[1], sys.argv[2]
    backend = simulated.SimulatedBackend("n", 2, 0)
    uuid = backend.inventory()[0].uuid

    class Ops(node_ops.SimulatedNodeOps):
        def compute_pids(self, gpu_uuid):
            return []
        def reset_gpu(self, gpu_uuid):
            with open(marker, "a") as f:
                f.write("reset\\n")
            time.sleep(120)  # nvidia-smi --gpu-reset in progress: the agent is killed here

    ex = actions.ActionExecutor(
        backend, spool.Spool(spool_path), clock=time.time_ns, ops=Ops(backend),
        settings=agent_settings.ActionSettings(destructive_enabled=True),
    )
    ex.execute(model.Command("reset-1", 0, 0, "audit", model.ResetGpu(uuid)))
    """
)


def test_reset_killed_mid_action_is_not_rerun_on_resend(tmp_path):
    spool_path, marker = str(tmp_path / "spool.db"), str(tmp_path / "resets.log")
    child = subprocess.Popen([sys.executable, "-c", _CHILD, spool_path, marker])
    try:
        deadline = time.monotonic() + 30
        while not (os.path.exists(marker) and _lines(marker)):
            assert time.monotonic() < deadline and child.poll() is None, "child never started the reset"
            time.sleep(0.02)
        os.kill(child.pid, signal.SIGKILL)  # agent process dies mid-reset (OOM kill, watchdog, power loss)
    finally:
        child.wait()

    # The agent restarts with the same state directory; the controller resends the unanswered id.
    backend = simulated.SimulatedBackend("n", 2, 0)
    uuid = backend.inventory()[0].uuid

    class Ops(node_ops.SimulatedNodeOps):
        def compute_pids(self, gpu_uuid):
            return []

        def reset_gpu(self, gpu_uuid):
            with open(marker, "a") as f:
                f.write("reset\n")

    journal = spool.Spool(spool_path)
    assert journal.executed_result("reset-1") is None  # no result: the agent died inside the reset
    ex = actions.ActionExecutor(
        backend,
        journal,
        clock=time.time_ns,
        ops=Ops(backend),
        settings=agent_settings.ActionSettings(destructive_enabled=True),
    )
    result = ex.execute(_cmd(model.ResetGpu(uuid), "reset-1"))
    resets = _lines(marker)
    assert len(resets) == 1, f"GPU reset for one command id ran {len(resets)} times (outcome {result.outcome.name})"
    assert result.outcome is model.ActionOutcome.FAILED and not result.replayed
    assert result.message.startswith("interrupted:") and f"reset GPU {uuid}" in result.message
    # The answer is journaled like any other: the next resend is answered the same, replayed.
    again = ex.execute(_cmd(model.ResetGpu(uuid), "reset-1"))
    assert again.replayed and again.outcome is model.ActionOutcome.FAILED and again.message == result.message
    assert journal.started_command("reset-1") is None
    assert len(_lines(marker)) == 1


# --------------------------------------------------------------------------------------------------
# 1b. Same window for RestartProcess: after the crash the scheduler restarted the job (new pid);
#     the resend kills the NEW job.
# --------------------------------------------------------------------------------------------------
class _Crash(BaseException):
    """Stands for the process dying at this point: nothing after it runs, nothing is journaled."""


def test_restart_interrupted_by_crash_kills_the_rescheduled_job_on_resend(tmp_path):
    path = str(tmp_path / "spool.db")
    backend = simulated.SimulatedBackend("n", 2, 0)
    uuid = backend.inventory()[0].uuid
    killed: list[int] = []
    running = {uuid: [111]}  # the faulty job

    class Ops(node_ops.SimulatedNodeOps):
        crash = True

        def compute_pids(self, gpu_uuid):
            return list(running[gpu_uuid])

        def signal(self, pid, signum):
            killed.append(pid)
            running[uuid] = [p for p in running[uuid] if p != pid]
            if self.crash:
                raise _Crash()

        def pid_alive(self, pid):
            return pid in running[uuid]

    settings = agent_settings.ActionSettings(destructive_enabled=True, kill_poll_s=0.0)
    ticks = itertools.count(1_000)
    ops = Ops(backend)
    ex = actions.ActionExecutor(backend, spool.Spool(path), clock=lambda: next(ticks), ops=ops, settings=settings)
    with contextlib.suppress(_Crash):
        ex.execute(_cmd(model.RestartProcess(uuid, grace_s=0.0), "restart-1"))
    # Agent back up; meanwhile the job was rescheduled onto the GPU as pid 222 (healthy work).
    running[uuid] = [222]
    ops2 = Ops(backend)
    ops2.crash = False
    ex2 = actions.ActionExecutor(backend, spool.Spool(path), clock=lambda: next(ticks), ops=ops2, settings=settings)
    result = ex2.execute(_cmd(model.RestartProcess(uuid, grace_s=0.0), "restart-1"))
    assert killed == [111], f"one restart command signalled {killed}: the rescheduled job 222 was killed"
    assert result.outcome is model.ActionOutcome.FAILED and result.message.startswith("interrupted:")


class _IdleGpuOps(node_ops.SimulatedNodeOps):
    """The simulated node's repairs, with no process left on the GPUs (a reset is allowed)."""

    def compute_pids(self, gpu_uuid):
        return []


def test_a_finished_reset_leaves_no_started_mark(tmp_path):
    backend = simulated.SimulatedBackend("n", 2, 0)
    uuid = backend.inventory()[0].uuid
    journal = spool.Spool(str(tmp_path / "spool.db"))
    ticks = itertools.count(1_000)
    ex = actions.ActionExecutor(
        backend, journal, clock=lambda: next(ticks), ops=_IdleGpuOps(backend),
        settings=agent_settings.ActionSettings(destructive_enabled=True),
    )  # fmt: skip
    result = ex.execute(_cmd(model.ResetGpu(uuid), "reset-1"))
    assert result.outcome is model.ActionOutcome.SUCCEEDED
    assert journal.started_command("reset-1") is None
    assert journal.executed_result("reset-1").outcome is model.ActionOutcome.SUCCEEDED


# --------------------------------------------------------------------------------------------------
# 2. Reboot: the journal says SUCCEEDED before the reboot runs; when the reboot command fails the
#    live answer is FAILED but a resend of the id is answered SUCCEEDED from the journal.
# --------------------------------------------------------------------------------------------------
def test_failed_reboot_is_replayed_as_failed_not_succeeded():
    backend = simulated.SimulatedBackend("n", 2, 0)

    class Ops(node_ops.SimulatedNodeOps):
        def reboot(self):
            raise node_ops.NodeOpError("systemctl reboot: exit 1: Failed to reboot system via logind")

    ticks = itertools.count(1_000)
    ex = actions.ActionExecutor(
        backend,
        spool.Spool(":memory:"),
        clock=lambda: next(ticks),
        ops=Ops(backend),
        settings=agent_settings.ActionSettings(destructive_enabled=True),
    )
    first = ex.execute(_cmd(model.RebootNode(), "boot-1"))
    again = ex.execute(_cmd(model.RebootNode(), "boot-1"))  # first answer lost with the stream
    assert first.outcome is model.ActionOutcome.FAILED
    assert again.outcome is first.outcome, "a resend reports a reboot that never happened as SUCCEEDED"
    assert again.replayed and again.message == first.message


def test_successful_reboot_is_not_repeated_after_restart(tmp_path):
    """Point 2 (reboot loop): the pre-journaled result is durable; a new process replays it."""
    path = str(tmp_path / "spool.db")
    backend = simulated.SimulatedBackend("n", 2, 0)
    ops = node_ops.SimulatedNodeOps(backend)
    ticks = itertools.count(1_000)
    settings = agent_settings.ActionSettings(destructive_enabled=True)
    actions.ActionExecutor(backend, spool.Spool(path), clock=lambda: next(ticks), ops=ops, settings=settings).execute(
        _cmd(model.RebootNode(), "boot-1")
    )
    again = actions.ActionExecutor(
        backend, spool.Spool(path), clock=lambda: next(ticks), ops=ops, settings=settings
    ).execute(_cmd(model.RebootNode(), "boot-1"))
    assert again.replayed and ops.reboots == 1


# --------------------------------------------------------------------------------------------------
# 3. Two deliveries of one id at once: check-then-act in ActionExecutor.execute is not atomic.
# --------------------------------------------------------------------------------------------------
def test_two_concurrent_deliveries_of_one_id_run_once():
    backend = simulated.SimulatedBackend("n", 2, 0)
    uuid = backend.inventory()[0].uuid
    entered = threading.Semaphore(0)
    release = threading.Event()
    resets: list[str] = []

    class Ops(node_ops.SimulatedNodeOps):
        def compute_pids(self, gpu_uuid):
            return []

        def reset_gpu(self, gpu_uuid):
            resets.append(gpu_uuid)
            entered.release()
            release.wait(5)

    ex = actions.ActionExecutor(
        backend,
        spool.Spool(":memory:"),
        clock=time.time_ns,
        ops=Ops(backend),
        settings=agent_settings.ActionSettings(destructive_enabled=True),
    )
    results = []
    threads = [
        threading.Thread(target=lambda: results.append(ex.execute(_cmd(model.ResetGpu(uuid), "reset-1"))))
        for _ in range(2)
    ]
    for t in threads:
        t.start()
    entered.acquire(timeout=5)
    entered.acquire(timeout=1)  # the second delivery gets here too if nothing stops it
    release.set()
    for t in threads:
        t.join(5)
    assert len(resets) == 1, f"one command id reset the GPU {len(resets)} times"
    assert sorted(r.replayed for r in results) == [False, True]
    assert {r.outcome for r in results} == {model.ActionOutcome.SUCCEEDED}


class _HostLikeOps(_IdleGpuOps):
    """A reboot that returns once the shutdown is queued, as systemctl reboot does on a host."""

    reboot_done_on_return = False

    def __init__(self, backend):
        super().__init__(backend)
        self.validations = 0

    def reboot(self):
        self.reboots += 1  # queued: the node goes down a few seconds later

    def run_validation(self, suite, gpu_uuids, seed, timeout_s):
        self.validations += 1
        return super().run_validation(suite, gpu_uuids, seed, timeout_s)


def _host_like(tmp_path, **settings):
    backend = simulated.SimulatedBackend("n", 2, 0)
    ops = _HostLikeOps(backend)
    journal = spool.Spool(str(tmp_path / "spool.db"))
    ex = actions.ActionExecutor(
        backend, journal, clock=time.time_ns, ops=ops,
        settings=agent_settings.ActionSettings(destructive_enabled=True, **settings),
    )  # fmt: skip
    return backend, ops, journal, ex


def test_a_validation_sent_after_the_reboot_waits_for_the_next_boot(tmp_path):
    """The ladder validates once the reboot is answered; a verdict from the old boot releases an unrepaired GPU."""
    backend, ops, journal, ex = _host_like(tmp_path)
    assert ex.execute(_cmd(model.RebootNode(), "reboot-1")).outcome is model.ActionOutcome.SUCCEEDED
    validate = _cmd(model.RunValidation("post-repair", (backend.inventory()[0].uuid,), 7), "validate-1")
    outcome: list[BaseException | model.ActionResult] = []

    def run():
        try:
            outcome.append(ex.execute(validate))
        except BaseException as exc:  # reported below, in the test's thread
            outcome.append(exc)

    worker = threading.Thread(target=run)
    worker.start()
    time.sleep(0.3)
    assert not outcome, "it waits for the node to go down"
    assert ex.wait_idle(5.0)  # the shutdown stops the agent: the waiting command gives up
    worker.join(5)
    assert len(outcome) == 1 and isinstance(outcome[0], actions.CommandDeferred)
    assert ops.validations == 0 and journal.executed_result("validate-1") is None  # the next boot runs it


def test_a_node_that_does_not_go_down_after_its_reboot_fails_what_waited(tmp_path):
    _backend, ops, journal, ex = _host_like(tmp_path, reboot_grace_s=0.2)
    ex.execute(_cmd(model.RebootNode(), "reboot-1"))
    result = ex.execute(_cmd(model.RunValidation("post-repair", (), 7), "validate-1"))
    assert result.outcome is model.ActionOutcome.FAILED and "did not go down" in result.message
    assert ops.validations == 0
    assert journal.executed_result("validate-1").outcome is model.ActionOutcome.FAILED


def _restarted(tmp_path, backend, ops, boot_id, **settings):
    """The agent's executor again, on the same spool, as systemd restarts a crashed agent."""
    return actions.ActionExecutor(
        backend, spool.Spool(str(tmp_path / "spool.db")), clock=time.time_ns, ops=ops,
        settings=agent_settings.ActionSettings(destructive_enabled=True, **settings), boot_id=boot_id,
    )  # fmt: skip


def test_an_agent_restarted_before_the_reboot_still_holds_repairs_for_the_next_boot(tmp_path):
    backend = simulated.SimulatedBackend("n", 2, 0)
    ops = _HostLikeOps(backend)
    first = _restarted(tmp_path, backend, ops, "boot-A", reboot_grace_s=0.3)
    assert first.execute(_cmd(model.RebootNode(), "reboot-1")).outcome is model.ActionOutcome.SUCCEEDED
    # The agent dies and systemd starts it again before the shutdown reaches it: the same boot.
    again = _restarted(tmp_path, backend, ops, "boot-A", reboot_grace_s=0.3)
    result = again.execute(_cmd(model.RunValidation("post-repair", (), 7), "validate-1"))
    assert result.outcome is model.ActionOutcome.FAILED and "did not go down" in result.message
    assert ops.validations == 0
    # The next boot (a new id) runs what it is sent.
    booted = _restarted(tmp_path, backend, ops, "boot-B", reboot_grace_s=0.3)
    assert booted.execute(_cmd(model.RunValidation("post-repair", (), 7), "validate-2")).outcome is (
        model.ActionOutcome.SUCCEEDED
    )
    assert ops.validations == 1


def test_a_reboot_that_fails_to_start_holds_nothing_after_a_restart(tmp_path):
    backend = simulated.SimulatedBackend("n", 2, 0)

    class _Refuses(_HostLikeOps):
        def reboot(self):
            raise node_ops.NodeOpError("systemctl reboot: exit 1")

    ops = _Refuses(backend)
    first = _restarted(tmp_path, backend, ops, "boot-A")
    assert first.execute(_cmd(model.RebootNode(), "reboot-1")).outcome is model.ActionOutcome.FAILED
    again = _restarted(tmp_path, backend, ops, "boot-A")
    assert again.execute(_cmd(model.RunValidation("post-repair", (), 7), "validate-1")).outcome is (
        model.ActionOutcome.SUCCEEDED
    )


def test_an_unknown_boot_id_carries_no_reboot_wait_over(tmp_path):
    """Without the kernel's boot id two boots look alike: a wait carried over could outlive its boot."""
    backend = simulated.SimulatedBackend("n", 2, 0)
    ops = _HostLikeOps(backend)
    _restarted(tmp_path, backend, ops, "").execute(_cmd(model.RebootNode(), "reboot-1"))
    again = _restarted(tmp_path, backend, ops, "")
    assert again.execute(_cmd(model.RunValidation("post-repair", (), 7), "validate-1")).outcome is (
        model.ActionOutcome.SUCCEEDED
    )


def test_the_boot_id_is_the_kernels():
    boot_id = actions.read_boot_id()
    assert boot_id == "" or len(boot_id) == 36  # a UUID where /proc has it
