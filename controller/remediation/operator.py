"""Operator commands on the ladder: pause, quarantine, release, validate, accuse, approve an RMA.

Each is recorded and audited in the transaction that carries it out, under the decision lock where
it changes the ladder or the budget (``rasctl`` through the AdminService).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from rasd.controller.core import agent_messages as msgs
from rasd.controller.core.remediation import actions, blast_radius, escalation, sdc
from rasd.controller.core.remediation import events as health
from rasd.controller.remediation import adapters as adapters_mod
from rasd.controller.remediation import decider as decider_mod
from rasd.controller.remediation import dispatch as dispatch_mod
from rasd.controller.remediation import ledger as ledger_mod
from rasd.controller.remediation import outlet as outlet_mod
from rasd.controller.remediation import sdc_ledger
from rasd.controller.remediation import state as state_mod
from rasd.controller.store import records, repo
from rasd.controller.store import remediation as rstore


def validated_gpus(run: Mapping[str, Any], node_gpus: Iterable[str]) -> set[str]:
    """The GPUs a stored validation run covered, of node_gpus (the node's GPUs).

    The ladder's runs keep their scope (``evidence["covered"]``: the GPUs named, or the node's but
    those excluded; None when the run's command was not known, which covers none); an operator's
    ``rasctl validate`` ran on its one GPU, or on every GPU of the node when it named none.
    """
    evidence = run.get("evidence") or {}
    if "covered" in evidence:
        covered = evidence["covered"]
        if covered is None:
            return set()
        return set(sdc_ledger.scope_targets(covered["gpu_uuids"], covered["exclude_gpu_uuids"], node_gpus))
    return {run["gpu_uuid"]} if run["gpu_uuid"] else set(node_gpus)


class OperatorCommands:
    """What an operator can ask of the ladder (see the module docstring)."""

    def __init__(
        self,
        state: state_mod.LadderState,
        ledger: ledger_mod.Ledger,
        dispatcher: dispatch_mod.Dispatcher,
        adapters: adapters_mod.Adapters,
        decider: decider_mod.Decider,
        *,
        node_store: repo.Store,
        outlet: outlet_mod.CommandOutlet,
        recorder: outlet_mod.DecisionRecorder,
        sdc_records: sdc_ledger.SdcLedger,
    ) -> None:
        """Share state and the service's parts; read nodes from node_store; validate through outlet."""
        self._state = state
        self._ledger = ledger
        self._dispatcher = dispatcher
        self._adapters = adapters
        self._decider = decider
        self._nodes = node_store
        self._outlet = outlet
        self._recorder = recorder
        self._sdc = sdc_records
        self._background: set[asyncio.Task[None]] = set()

    async def set_paused(
        self, paused: bool, *, reason: str, actor: str, at_unix_ns: int | None = None
    ) -> blast_radius.BudgetState:
        """Pause automation, or resume it (which also resets a tripped breaker). at_unix_ns: as for `release`."""
        state = self._state
        async with state.lock:
            now_ns = state.clock() if at_unix_ns is None else at_unix_ns
            what = "pause" if paused else "resume"
            with self._recorded("", "", action=what, reason=reason, actor=actor, at_unix_ns=now_ns):
                if paused:
                    state.budget = blast_radius.pause(state.budget, now_s=now_ns / 1e9, reason=reason)
                else:
                    state.budget = blast_radius.resume(state.budget, now_s=now_ns / 1e9, policy=state.policy.disruption)
                change = rstore.Commit(now_unix_ns=now_ns)
                self._ledger.export_budget()
                budget = self._ledger.stage_budget(change)
                change.audit.append(ledger_mod.audit_record(now_ns, actor, what, "", "", reason, "ok"))
                await self._ledger.commit(change)
                state.budget_stored = budget
                if not paused:
                    await self._dispatcher.dispatch_locked()
                return state.budget

    async def quarantine(
        self, node_id: str, gpu_uuid: str, *, reason: str, actor: str, at_unix_ns: int | None = None
    ) -> None:
        """Take a node or GPU out of scheduling by hand (recorded, audited, through the adapter).

        The node's ladder state keeps the operator's hold, committed with the record: a ticket that
        quarantined the same target earlier, or does later, leaves it quarantined when it releases
        (`escalation.operator_holds`). Only `release` lifts it. at_unix_ns: as for `release`.
        """
        state = self._state
        async with state.lock:
            now_ns = state.clock() if at_unix_ns is None else at_unix_ns
            with self._recorded(node_id, gpu_uuid, action="quarantine", reason=reason, actor=actor, at_unix_ns=now_ns):
                ticket_id = f"operator/{now_ns}"
                common = {"ticket_id": ticket_id, "step": 0, "node_id": node_id, "reason": reason}
                action = (
                    actions.QuarantineGpu(**common, gpu_uuid=gpu_uuid) if gpu_uuid else actions.QuarantineNode(**common)
                )
                change = rstore.Commit(now_unix_ns=now_ns)
                self._dispatcher.record_controller_side(action, change, source=actor)
                outcome, _message = await self._adapters.execute(action)
                ledger_mod.outcome_audit(action, change, outcome, source=actor)
                hold = f"gpu:{gpu_uuid}" if gpu_uuid else "node"
                held = escalation.operator_holds(state.state_of(node_id), hold, held=True)
                await self._ledger.commit_states({node_id: held}, [], change)
                await self._ledger.export_quarantines()

    async def release(
        self, node_id: str, gpu_uuid: str, *, reason: str, force: bool, actor: str, at_unix_ns: int | None = None
    ) -> str:
        """Return a node or GPU to service: through its ticket's validation, or by force (audited).

        at_unix_ns: when it was asked (default now); a replay passes the recorded time (see `accuse`).

        Returns:
            What happened, one sentence.

        Raises:
            LookupError: nothing is quarantined there.
            PermissionError: no passing validation since the quarantine and force is not set.
        """
        state = self._state
        async with state.lock:
            now_ns = state.clock() if at_unix_ns is None else at_unix_ns
            with self._recorded(node_id, gpu_uuid, action="release", reason=reason, actor=actor, at_unix_ns=now_ns,
                                force=force):  # fmt: skip
                return await self._release_locked(node_id, gpu_uuid, reason=reason, force=force, actor=actor,
                                                  now_ns=now_ns)  # fmt: skip

    async def _release_locked(
        self, node_id: str, gpu_uuid: str, *, reason: str, force: bool, actor: str, now_ns: int
    ) -> str:
        """`release` under the ladder's lock."""
        state = self._state
        hold = f"gpu:{gpu_uuid}" if gpu_uuid else "node"
        ladder = state.node_states.get(node_id)
        ticket = next((t for t in (ladder.tickets if ladder else ()) if hold in t.held), None)
        change = rstore.Commit(now_unix_ns=now_ns)
        outcome = "forced" if force else "requested"
        change.audit.append(ledger_mod.audit_record(now_ns, actor, "release", node_id, gpu_uuid, reason, outcome))
        if ticket is not None and ladder is not None:
            decision = escalation.operator_release(
                ladder, ticket.ticket_id, now_s=now_ns / 1e9, policy=state.policy.escalation, force=force, hold=hold
            )
            self._ledger.close(decision, change, now_ns / 1e9)
            await self._ledger.commit_states({node_id: decision.state}, list(decision.actions), change)
            await self._dispatcher.dispatch_locked()
            return decision.reason
        await self._check_releasable(node_id, gpu_uuid, force=force)
        release = actions.Release(
            ticket_id=f"operator/{now_ns}", step=0, node_id=node_id, gpu_uuid=gpu_uuid, reason=reason, forced=force
        )
        # The record, and the node out of the disruption budget's count if automation had put it there.
        self._dispatcher.record_controller_side(release, change, source=actor)
        if ladder is not None and hold in ladder.operator_holds:
            unheld = escalation.operator_holds(ladder, hold, held=False)
            await self._ledger.commit_states({node_id: unheld}, [], change)
        else:
            await self._ledger.commit_with_budget(change)
        await self._ledger.export_quarantines()
        if "release" in self._adapters.executors:
            await self._adapters.call_raising(release)
        return "released" + (" by force, without validation" if force else " after a passing validation")

    @contextlib.contextmanager
    def _recorded(
        self, node_id: str, gpu_uuid: str, *, action: str, reason: str, actor: str, at_unix_ns: int, force: bool = False
    ) -> Iterator[None]:
        """Record an operator's action once it is taken, or refused: a replay asks the same, whatever came of it."""
        try:
            yield
        finally:
            self._recorder.operator_action(
                node_id, gpu_uuid, action=action, reason=reason, actor=actor, force=force, at_unix_ns=at_unix_ns
            )

    async def _check_releasable(self, node_id: str, gpu_uuid: str, *, force: bool) -> None:
        """Raise unless node_id (or its gpu_uuid) is quarantined and, without force, validated since.

        Raises:
            LookupError: nothing is quarantined there.
            PermissionError: no passing validation since the quarantine and force is not set.
        """
        store = self._ledger.store
        active = await self._ledger.run(lambda: store.quarantines(node_id=node_id))
        mine = [q for q in active if q["gpu_uuid"] == gpu_uuid and not q["port"]]
        if not mine:
            raise LookupError(f"{node_id}{'/' + gpu_uuid if gpu_uuid else ''} is not quarantined")
        if force:
            return
        since = min(q["since_unix_ns"] for q in mine)
        # What must have passed: the GPU, or for the node every GPU (from the store: the node
        # may not be connected) not quarantined on its own.
        nodes = await self._ledger.run(lambda: self._nodes.list_nodes([node_id]))
        node_gpus = [g.record.uuid for n in nodes for g in n.gpus]
        held_gpus = {q["gpu_uuid"] for q in active if q["gpu_uuid"] and not q["port"]}
        needed = {gpu_uuid} if gpu_uuid else set(node_gpus) - held_gpus
        runs = await self._ledger.run(lambda: store.validations(node_id=node_id))
        passed = [
            v for v in runs if v["verdict"] == "pass" and (v["started_unix_ns"] or 0) >= since
            and needed <= validated_gpus(v, node_gpus)
        ]  # fmt: skip
        if not passed:
            raise PermissionError(
                "no passing validation of "
                + (gpu_uuid or "the node's GPUs")
                + " started since the quarantine: run `rasctl validate` or --force"
            )

    async def validate(self, node_id: str, gpu_uuid: str, *, suite: str, seed: int, actor: str) -> str:
        """Start a validation run on a node or GPU; its verdict is stored when it comes back."""
        state = self._state
        now_ns = state.clock()
        timeout_s = state.policy.escalation.validation_timeout_s
        run = msgs.ValidationRun(
            command_id=f"manual-{now_ns}",
            node_id=node_id,
            gpu_uuids=(gpu_uuid,) if gpu_uuid else (),
            suite=suite,
            seed=seed,
            reason=f"operator {actor} asked for validation",
            issued_unix_ns=now_ns,
            deadline_unix_ns=now_ns + int(timeout_s * 1e9),
        )
        if not await self._outlet.reachable(node_id):
            raise ConnectionError(f"node {node_id!r} has no open agent stream")
        change = rstore.Commit(now_unix_ns=now_ns)
        change.validations.append(_validation_row(run, gpu_uuid, verdict="running"))
        change.audit.append(ledger_mod.audit_record(now_ns, actor, "validate", node_id, gpu_uuid, suite, "started"))
        await self._ledger.commit(change)
        task = asyncio.create_task(self._wait_for_verdict(run, gpu_uuid, timeout_s=timeout_s))
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return run.command_id

    async def _wait_for_verdict(self, run: msgs.ValidationRun, gpu_uuid: str, *, timeout_s: float) -> None:
        """Send the run, wait for its result, and store its verdict (an error when none came)."""
        try:
            result = await self._outlet.validate(run.node_id, run, timeout_s=timeout_s)
            verdict, evidence = (
                result.validation_verdict or "error",
                {
                    "message": result.message,
                    "checks": [{"check": v.check, "gpu": v.gpu_uuid, "verdict": v.verdict} for v in result.verdicts],
                },
            )
        except (TimeoutError, ConnectionError, LookupError) as exc:
            verdict, evidence = "error", {"message": str(exc)}
        done = rstore.Commit(now_unix_ns=self._state.clock())
        done.validations.append(
            _validation_row(run, gpu_uuid, verdict=verdict, evidence=evidence, finished_unix_ns=done.now_unix_ns)
        )
        await self._ledger.commit(done)

    async def accuse(
        self, node_id: str, gpu_uuid: str, *, reason: str, accuser: str, at_unix_ns: int | None = None
    ) -> None:
        """An SDC accusation (operator or training job): it enters the ladder like any health event.

        at_unix_ns: when it was made (default now). A replay passes the recorded time: the recording
        keeps entries in the order they were written, and one written while the accusation's commit
        ran can precede it with a later time, which the replay's clock has then passed.
        """
        state = self._state
        now_ns = state.clock() if at_unix_ns is None else at_unix_ns
        event = repo.controller_event(
            node_id,
            int(health.EventKind.SDC_SUSPECT),
            int(health.Severity.ERROR),
            now_unix_ns=now_ns,
            message=reason,
            source="accusation",
            gpu_uuid=gpu_uuid,
            attributes={"accuser": accuser},
        )
        watched = sdc.watched_until(dict(state.state_of(node_id).sdc_watch), gpu_uuid, now_s=now_ns / 1e9)
        change = rstore.Commit(
            now_unix_ns=now_ns,
            audit=[ledger_mod.audit_record(now_ns, accuser, "accuse_sdc", node_id, gpu_uuid, reason, "accepted")],
        )
        change.docs.update(self._sdc.accusation(node_id, gpu_uuid, now=now_ns / 1e9, watch_until=watched))
        await self._ledger.commit(change)
        self._recorder.accusation(node_id, gpu_uuid, reason=reason, accuser=accuser, at_unix_ns=now_ns)
        await self._decider.on_events(node_id, [event], state.streams.node_labels.get(node_id, {}))

    async def approve_rma(self, rma_id: str, *, actor: str) -> dict[str, Any] | None:
        """Approve a pending RMA ticket (audited)."""
        now_ns = self._state.clock()
        store = self._ledger.store
        approved = await self._ledger.run(lambda: store.approve_rma(rma_id, actor=actor, now_unix_ns=now_ns))
        if approved is not None:
            row = ledger_mod.audit_record(
                now_ns, actor, "approve_rma", approved["node_id"], approved["gpu_uuid"], rma_id, "approved"
            )
            await self._ledger.commit(rstore.Commit(now_unix_ns=now_ns, audit=[row]))
        return approved


def _validation_row(
    run: msgs.ValidationRun,
    gpu_uuid: str,
    *,
    verdict: str,
    evidence: Mapping[str, Any] | None = None,
    finished_unix_ns: int | None = None,
) -> records.ValidationRecord:
    """An operator's validation run's row: when it starts (verdict "running"), then with its verdict."""
    return records.ValidationRecord(
        validation_id=run.command_id,
        node_id=run.node_id,
        gpu_uuid=gpu_uuid,
        verdict=verdict,
        started_unix_ns=run.issued_unix_ns,
        suite=run.suite,
        command_id=run.command_id,
        finished_unix_ns=finished_unix_ns,
        evidence=evidence,
    )
