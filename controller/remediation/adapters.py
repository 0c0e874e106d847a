"""Controller-side actions' adapters (quarantine, release, RMA, notice, BMC power cycle), off the decider's path.

An adapter that waits on another system (a scheduler's API, Slurm, a BMC) is called once the
commit that records its action dispatched is done, outside the decision lock: at once across nodes
and in turn within one; in a thread, or awaited on the loop where the adapter has ``call_async``
(the Kubernetes adapter's own process: no thread of this process wakes for the call). A repair of
the same ticket waits until its quarantine's adapter has returned (`Sender.hold`). The adapters'
outcomes come back as results, handed to the decider (`deliver`, given by the service), whose next
pass commits all that returned meanwhile with the events waiting. An adapter whose calls wait on
nothing (``blocking = False``: record only) and an action without one are carried out with the
decision, or in the dispatch round that admits them (`execute_now`). An adapter failure is a failed
action, never a crash.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from rasd.controller.core import agent_messages as msgs
from rasd.controller.core.remediation import actions
from rasd.controller.remediation import sender as sender_mod
from rasd.controller.remediation import state as state_mod

LONG_ADAPTER_KINDS = frozenset({"power_cycle_bmc", "drain_node"})
"""Controller-side actions whose adapter takes minutes (a BMC power cycle is polled until the node is
back; a drain retries a disruption budget's refusals until its deadline): their own threads
(`LONG_ADAPTER_THREADS`), so that they never hold up a quarantine's."""
ADAPTER_THREADS = 16
"""Adapter calls in flight at once (quarantines and releases through the scheduler's API, RMA hooks):
a storm dispatches hundreds a second, each a few round trips to the API server."""
LONG_ADAPTER_THREADS = 32
"""BMC power cycles in flight at once; node-level, so the disruption budget bounds them first."""

Executor = Callable[[actions.Action], Any]
"""An adapter: called with the action, returns a message (its outcome's), raises when it failed."""
Outcome = tuple[msgs.Outcome, str]
"""An adapter call's outcome and message."""
Deliver = Callable[[list[tuple[str, msgs.AgentResult]]], None]
"""Takes adapters' outcomes (node, result) to be committed as results (`Decider.take_outcomes`)."""


def blocking(executor: Executor) -> bool:
    """Whether an adapter's calls wait on another system (`quarantine.executors` sets ``blocking``; default yes)."""
    return getattr(executor, "blocking", True)


async def call(
    executor: Executor,
    action: actions.Action,
    pool: concurrent.futures.Executor,
    *,
    called: Callable[[], None] | None = None,
) -> Any:
    """One adapter call: awaited on this loop if the adapter has ``call_async``, else in a thread of pool.

    called: run as the adapter is called (in the thread, after any wait for one). Raises what the
    adapter raised.
    """
    call_async = getattr(executor, "call_async", None)
    if call_async is not None:
        if called is not None:
            called()
        return await call_async(action)

    def in_thread(action: actions.Action) -> Any:
        if called is not None:
            called()
        return executor(action)

    in_context = functools.partial(contextvars.copy_context().run, in_thread, action)  # as asyncio.to_thread does
    return await asyncio.get_running_loop().run_in_executor(pool, in_context)


class Adapters:
    """The controller-side adapters by action kind, their threads, and the calls in flight."""

    def __init__(
        self,
        state: state_mod.LadderState,
        sender: sender_mod.Sender,
        executors: Mapping[str, Executor],
        *,
        deliver: Deliver,
    ) -> None:
        """Share state; release held repairs through sender; deliver: takes the outcomes (see `Deliver`)."""
        self._state = state
        self._sender = sender
        self.executors = dict(executors)
        self._deliver = deliver
        # Threads start when first needed: a controller whose adapter only records never starts one.
        self._threads = concurrent.futures.ThreadPoolExecutor(ADAPTER_THREADS, "rasd-adapter")
        self._long_threads = concurrent.futures.ThreadPoolExecutor(LONG_ADAPTER_THREADS, "rasd-adapter-long")
        self._tasks: set[asyncio.Task[None]] = set()
        self._node_calls: dict[str, tuple[asyncio.Lock, list[int]]] = {}
        """Node → the lock its adapter calls take in turn, and how many wait for it (the entry goes at 0)."""

    @property
    def busy(self) -> int:
        """Adapter calls whose outcome is not committed yet, plus the repairs that wait for one (`Sender.hold`)."""
        return len(self._state.running) + len(self._state.held_by)

    def leaves_after_commit(self, action: actions.Action) -> bool:
        """Whether an admitted action leaves once its dispatch has committed: agent commands and adapters' calls.

        An adapter whose calls wait on nothing (``blocking = False`` on the callable: record only) is
        called in the dispatch round instead, as an action without one is recorded there: a thread
        and a commit for its outcome would cost a burst more than the call.
        """
        if action.kind in state_mod.AGENT_KINDS:
            return True
        executor = self.executors.get(action.kind)
        return executor is not None and blocking(executor)

    async def stop(self) -> None:
        """Stop waiting for adapters in flight; their threads run on, their outcomes unrecorded by this term."""
        for task in list(self._tasks):
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    def start(self, action: actions.Action) -> None:
        """Call a dispatched controller-side action's adapter outside the decision lock (`_run`)."""
        state = self._state
        if action.command_id in state.running:
            return  # called already this term: its outcome comes once
        state.running[action.command_id] = action
        state.adapter_of_ticket[action.ticket_id] = action.command_id
        task = asyncio.create_task(self._run(action), name=f"rasd-adapter-{action.kind}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run(self, action: actions.Action) -> None:
        """The adapter, after the node's calls before it (one node's in order; nodes at once), then its outcome."""
        lock, waiting = self._node_calls.setdefault(action.node_id, (asyncio.Lock(), [0]))
        waiting[0] += 1
        called_ns: list[int] = []
        try:
            async with lock:
                outcome, message = await self.execute(action, called_ns=called_ns)
        finally:
            waiting[0] -= 1
            if waiting[0] == 0:
                self._node_calls.pop(action.node_id, None)
        self._sender.note_handed_over(action, at_ns=called_ns[0] if called_ns else None)
        if self._state.adapter_of_ticket.get(action.ticket_id) == action.command_id:
            del self._state.adapter_of_ticket[action.ticket_id]
        # Whatever the outcome: the quarantine was tried first, as the ladder asked (a failed one
        # does not stop its repair; it is in the audit log).
        self._sender.send_held(action.command_id)
        result = msgs.AgentResult(command_id=action.command_id, outcome=outcome, message=message)
        self._deliver([(action.node_id, result)])

    async def execute(self, action: actions.Action, *, called_ns: list[int] | None = None) -> Outcome:
        """Call a controller-side action's adapter (they wait on other systems); its outcome and message.

        Awaited here if the adapter has ``call_async``, else in a thread. Without an adapter the
        record is the action. called_ns: gets the clock's reading as the adapter is called.
        """
        executor = self.executors.get(action.kind)
        if executor is None or not blocking(executor):
            return self.execute_now(action)
        clock = self._state.clock
        called = (lambda: called_ns.append(clock())) if called_ns is not None else None
        try:
            message = str(await call(executor, action, self._pool(action), called=called))
        except Exception as exc:  # an adapter failure is a failed action, never a crash
            return msgs.Outcome.FAILED, f"{type(exc).__name__}: {exc}"
        return msgs.Outcome.SUCCEEDED, message or f"{action.kind} recorded"

    async def call_raising(self, action: actions.Action) -> Any:
        """The action's adapter (there must be one), raising what it raised: for a caller that reports it (rasctl)."""
        executor = self.executors[action.kind]
        if not blocking(executor):
            return executor(action)
        return await call(executor, action, self._pool(action))

    def _pool(self, action: actions.Action) -> concurrent.futures.ThreadPoolExecutor:
        """The threads an action's adapter runs in when it has no ``call_async`` (long calls have their own)."""
        return self._long_threads if action.kind in LONG_ADAPTER_KINDS else self._threads

    def execute_now(self, action: actions.Action) -> Outcome:
        """`execute` for an action whose adapter waits on nothing (`leaves_after_commit` is False): called here."""
        executor = self.executors.get(action.kind)
        if executor is None:
            if isinstance(action, actions.PowerCycleBmc):
                return msgs.Outcome.NOT_SUPPORTED, "no BMC power-cycle hook configured"
            return msgs.Outcome.SUCCEEDED, f"{action.kind} recorded"
        try:
            message = str(executor(action))
        except Exception as exc:  # an adapter failure is a failed action, never a crash
            return msgs.Outcome.FAILED, f"{type(exc).__name__}: {exc}"
        return msgs.Outcome.SUCCEEDED, message or f"{action.kind} recorded"

    def start_all(self, dispatched: Sequence[actions.Action]) -> None:
        """Start the adapters of the dispatched controller-side actions among dispatched."""
        for action in dispatched:
            if action.kind not in state_mod.AGENT_KINDS:
                self.start(action)
