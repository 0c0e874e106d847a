"""Command results into the ladder: an agent's answer, or a controller-side adapter's outcome.

A result goes through `escalation.on_result`; its outbox row is finished with it, a validation run's
verdicts are stored with what the run covered and fed to the SDC ledger, and the ladder's next
actions go into the outbox pending, all in one transaction (`apply`). Results the store could not
take are owed (`owed`) and applied by the next tick: the agent has answered and will not answer
again unless asked, so dropping one would stall the ladder until its timeout climbed a rung for a
repair that worked.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import structlog

from rasd.controller.core import agent_messages as msgs
from rasd.controller.core.remediation import actions, blast_radius, escalation
from rasd.controller.remediation import ledger as ledger_mod
from rasd.controller.remediation import sdc_ledger
from rasd.controller.remediation import state as state_mod
from rasd.controller.store import records, repo
from rasd.controller.store import remediation as rstore

log = structlog.get_logger("rasd.controller")

_OUTCOME_STATUS = {
    msgs.Outcome.SUCCEEDED: "succeeded",
    msgs.Outcome.FAILED: "failed",
    msgs.Outcome.REFUSED: "refused",
    msgs.Outcome.NOT_SUPPORTED: "not_supported",
    msgs.Outcome.TIMED_OUT: "timed_out",
    msgs.Outcome.DRY_RUN: "dry_run",
}
"""A result's outcome → its command's final outbox status (any other: "failed")."""


class Results:
    """Advances the ladder on results (see the module docstring)."""

    def __init__(
        self,
        state: state_mod.LadderState,
        ledger: ledger_mod.Ledger,
        sdc: sdc_ledger.SdcLedger,
    ) -> None:
        """Share state; stage and commit through ledger (which forgets answered commands); feed sdc."""
        self._state = state
        self._ledger = ledger
        self._sdc = sdc
        self.owed: list[tuple[str, msgs.AgentResult]] = []
        """Results that arrived while the store was unavailable, applied by the next tick (`apply_owed`)."""

    async def apply(self, results: Sequence[tuple[str, msgs.AgentResult]]) -> None:
        """Advance the ladder on results and commit them in one transaction (under the decision lock)."""
        state = self._state
        change = rstore.Commit(now_unix_ns=state.clock())
        states: dict[str, escalation.RemediationState] = {}
        new_actions = self.results_into(results, change, states)
        await self._ledger.commit_states(states, new_actions, change)
        self.committed(results)

    def results_into(
        self,
        results: Sequence[tuple[str, msgs.AgentResult]],
        change: rstore.Commit,
        states: dict[str, escalation.RemediationState],
    ) -> list[actions.Action]:
        """`result_into` for each result, an adapter's outcome audited with it; the ladder's follow-ups (pending)."""
        new_actions: list[actions.Action] = []
        for node_id, result in results:
            by_adapter = self._state.running.get(result.command_id)
            if by_adapter is not None:  # audited with its outcome, as a round audits what it records
                ledger_mod.outcome_audit(by_adapter, change, result.outcome, source="automation")
            new_actions += self.result_into(node_id, result, change, states)
        return new_actions

    def committed(self, results: Sequence[tuple[str, msgs.AgentResult]]) -> None:
        """Results whose transaction is done: the adapters' calls they answer are no longer running."""
        for _node_id, result in results:
            self._state.running.pop(result.command_id, None)

    async def apply_owed(self) -> None:
        """Apply the owed results in order, each in its own transaction (under the decision lock).

        Raises:
            repo.STORE_UNAVAILABLE: the store failed again; the rest stay owed, in order.
        """
        owed, self.owed = self.owed, []
        for index, (node_id, result) in enumerate(owed):
            try:
                await self.apply([(node_id, result)])
            except repo.STORE_UNAVAILABLE:
                self.owed[:0] = owed[index:]
                raise

    def result_into(
        self,
        node_id: str,
        result: msgs.AgentResult,
        change: rstore.Commit,
        states: dict[str, escalation.RemediationState],
    ) -> list[actions.Action]:
        """Advance the ladder on a result; record it in change and the new state in states."""
        now_ns = change.now_unix_ns
        state = states.get(node_id) or self._state.state_of(node_id)
        sent = self._state.unanswered.get(result.command_id)
        failed = tuple(sorted({v.gpu_uuid for v in result.verdicts if v.verdict == "fail" and v.gpu_uuid}))
        decision = escalation.on_result(
            state,
            escalation.ActionResult(
                command_id=result.command_id,
                outcome=result.outcome,
                message=result.message,
                validation_verdict=result.validation_verdict,
                failed_gpu_uuids=failed,
            ),
            now_s=now_ns / 1e9,
            policy=self._state.policy.escalation,
        )
        change.command_updates.append(_finished(result, failed, now_ns))
        if result.validation_verdict:
            self._validation_into(node_id, result, sent, state, decision, change)
        self._state.budget = blast_radius.complete(self._state.budget, result.command_id, now_s=now_ns / 1e9)
        self._ledger.close(decision, change, now_ns / 1e9, answered=result.command_id)
        # The command is forgotten (and counted) once change has committed (`Ledger.after_commit`): a
        # commit that fails leaves it tracked, so the result's retry still knows what was sent (a
        # validation's targets and suite). What waited for an adapter left as it returned (`Adapters`).
        self._observe_repairs(decision, now_ns / 1e9)
        log.info(
            "remediation_result",
            node=node_id,
            command_id=result.command_id,
            outcome=result.outcome_name,
            verdict=result.validation_verdict,
            reason=decision.reason,
            next_actions=[a.kind for a in decision.actions],
        )
        states[node_id] = decision.state
        return list(decision.actions)

    def _validation_into(
        self,
        node_id: str,
        result: msgs.AgentResult,
        sent: actions.Action | None,
        state: escalation.RemediationState,
        decision: escalation.Decision,
        change: rstore.Commit,
    ) -> None:
        """A validation run's row (what it covered, each check) and its verdicts in the SDC ledger."""
        now_ns = change.now_unix_ns
        targets = sdc_ledger.validation_targets(sent, self._state.streams.node_gpus(node_id))
        waited = next(
            (t.pending for t in state.tickets if t.pending is not None and t.pending.command_id == result.command_id),
            None,
        )
        change.validations.append(
            records.ValidationRecord(
                validation_id=result.command_id,
                node_id=node_id,
                gpu_uuid=targets[0] if len(targets) == 1 else "",
                verdict=result.validation_verdict,
                # When the ladder sent it (0: no ticket waited for it any more, a stale answer):
                # `operator_release` counts only runs that started after the quarantine.
                started_unix_ns=int((waited.dispatched_at or waited.issued_at) * 1e9) if waited else 0,
                finished_unix_ns=now_ns,
                evidence=_evidence(result, sent),
                suite=sent.suite if isinstance(sent, actions.RunValidation) else "",
            )
        )
        change.docs.update(
            self._sdc.verdicts(
                node_id,
                sdc_ledger.gpu_verdicts(result, targets),
                now=now_ns / 1e9,
                watch=dict(decision.state.sdc_watch),
            )
        )

    def _observe_repairs(self, decision: escalation.Decision, now: float) -> None:
        """``rasd_time_to_repair_seconds`` of each ticket the decision releases after its repair (not forced)."""
        for action in decision.actions:
            ticket = decision.state.ticket(action.ticket_id)
            if isinstance(action, actions.Release) and ticket is not None and not action.forced:
                self._state.metrics.time_to_repair_seconds.observe(max(0.0, now - ticket.opened_at))


def _finished(result: msgs.AgentResult, failed: tuple[str, ...], now_ns: int) -> records.CommandUpdate:
    """The outbox update that finishes a result's command with it."""
    return records.CommandUpdate(
        result.command_id,
        _OUTCOME_STATUS.get(result.outcome, "failed"),
        finished_unix_ns=now_ns,
        result={
            "outcome": result.outcome_name,
            "message": result.message,
            "validation_verdict": result.validation_verdict,
            "failed_gpu_uuids": list(failed),
            "replayed": result.replayed,
        },
    )


def _evidence(result: msgs.AgentResult, sent: actions.Action | None) -> Mapping[str, Any]:
    """A validation run's evidence: what it covered (`operator.validated_gpus`) and each check's verdict.

    Covered is None when the run's command is not known: none, for a release.
    """
    return {
        "covered": {
            "gpu_uuids": list(sent.gpu_uuids),
            "exclude_gpu_uuids": list(sent.exclude_gpu_uuids),
        }
        if isinstance(sent, actions.RunValidation)
        else None,
        "checks": [
            {"check": v.check, "gpu": v.gpu_uuid, "verdict": v.verdict, "evidence": v.evidence} for v in result.verdicts
        ],
    }
