"""The controller's SDC ledger and the inputs of the rolling sweep.

Edges around the pure rules in `rasd.controller.core.remediation.sdc`; the remediation service owns the lock
and the transactions, and calls in here:

- **Per-GPU results with a suspicion score.** Every accusation and every validation verdict that
  names a GPU is a mark in that GPU's ledger; the ledger's document (``sdc/gpu/<node>/<gpu>``:
  counts, last verdict, watch, score and the bounded marks) is written in the same transaction
  as the ladder decision that the result caused, so the score can never disagree with the store.
  `rasctl sdc list` reads the documents; the score is recomputed at read time so it decays.
- **When each node was last swept** (``sdc/sweep/<node>``), so sweeps rotate across the fleet
  and survive restarts.
- **Which nodes are idle** (`sweep_candidates`): connected, every GPU seen recently and drawing
  under ``idle_power_pct`` of its limit, no ticket and no node command, not held by the budget.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from rasd.controller.core import agent_messages as msgs
from rasd.controller.core import fleet
from rasd.controller.core.remediation import actions, blast_radius, escalation, sdc
from rasd.controller.core.remediation import policy as policy_mod

GPU_PREFIX = "sdc/gpu/"
SWEEP_PREFIX = "sdc/sweep/"
MAX_MARKS = 64
"""Marks kept per GPU (oldest dropped); older ones have decayed to nothing anyway."""
_WORST_FIRST = ("fail", "suspect", "software_drift", "pass")


def gpu_verdicts(result: msgs.AgentResult, targets: Iterable[str]) -> dict[str, str]:
    """Each GPU's verdict in a validation result: its worst check, else the run's verdict.

    The run's verdict applies to a GPU without checks of its own only when it was the only GPU
    checked, or when the run passed as a whole.

    Example: a node run "fail" with a failed V2 check on GPU-3, targets GPU-0..GPU-7 → GPU-3
    "fail", the others "pass" only when they have checks of their own that passed; a GPU with
    no attributed check is left out of a failed node run (we do not know that it was fine).
    """
    per_gpu: dict[str, set[str]] = {}
    for check in result.verdicts:
        if check.gpu_uuid and check.verdict in _WORST_FIRST:
            per_gpu.setdefault(check.gpu_uuid, set()).add(check.verdict)
    out = {gpu: next(v for v in _WORST_FIRST if v in seen) for gpu, seen in per_gpu.items()}
    overall = result.validation_verdict
    target_list = [g for g in targets if g]
    if overall in _WORST_FIRST:
        for gpu in target_list:
            if gpu not in out and (overall == "pass" or len(target_list) == 1):
                out[gpu] = overall
    return out


def validation_targets(action: actions.Action | None, node_gpus: Iterable[str]) -> tuple[str, ...]:
    """The GPUs a RunValidation covered (`scope_targets`); none for any other action."""
    if not isinstance(action, actions.RunValidation):
        return ()
    return scope_targets(action.gpu_uuids, action.exclude_gpu_uuids, node_gpus)


def scope_targets(
    gpu_uuids: Iterable[str], exclude_gpu_uuids: Iterable[str], node_gpus: Iterable[str]
) -> tuple[str, ...]:
    """The GPUs a validation scope covers: the named ones, or the node's minus the excluded."""
    named = tuple(gpu_uuids)
    if named:
        return named
    excluded = set(exclude_gpu_uuids)
    return tuple(g for g in node_gpus if g not in excluded)


class SdcLedger:
    """Per-GPU SDC marks and per-node sweep times, mirrored from the store's documents."""

    def __init__(self, policy: policy_mod.SdcPolicy) -> None:
        self.policy = policy
        self.marks: dict[tuple[str, str], list[sdc.SdcMark]] = {}
        self.last_swept: dict[str, float] = {}

    def load(self, gpu_docs: Mapping[str, Mapping[str, Any]], sweep_docs: Mapping[str, Mapping[str, Any]]) -> None:
        """Rebuild from stored documents (controller start)."""
        for doc in gpu_docs.values():
            key = (str(doc["node_id"]), str(doc["gpu_uuid"]))
            self.marks[key] = [sdc.SdcMark(str(kind), float(at)) for kind, at in doc.get("marks", [])]
        for name, doc in sweep_docs.items():
            self.last_swept[name.removeprefix(SWEEP_PREFIX)] = float(doc["last_swept_at"])

    def _doc(self, node_id: str, gpu_uuid: str, *, now: float, watch_until: float | None) -> dict[str, Any]:
        marks = self.marks.get((node_id, gpu_uuid), [])
        record = sdc.gpu_record(
            marks, now_s=now, half_life_s=self.policy.suspicion_half_life_s, watch_until=watch_until
        )
        return {"node_id": node_id, "gpu_uuid": gpu_uuid, **record}

    def _add(self, node_id: str, gpu_uuid: str, mark: sdc.SdcMark) -> None:
        marks = self.marks.setdefault((node_id, gpu_uuid), [])
        marks.append(mark)
        del marks[:-MAX_MARKS]

    def accusation(self, node_id: str, gpu_uuid: str, *, now: float, watch_until: float | None) -> dict[str, Any]:
        """Record an accusation; returns the documents to commit with it."""
        if not gpu_uuid:
            return {}
        self._add(node_id, gpu_uuid, sdc.SdcMark("accusation", now))
        return {f"{GPU_PREFIX}{node_id}/{gpu_uuid}": self._doc(node_id, gpu_uuid, now=now, watch_until=watch_until)}

    def verdicts(
        self, node_id: str, verdicts: Mapping[str, str], *, now: float, watch: Mapping[str, float]
    ) -> dict[str, Any]:
        """Record one validation run's per-GPU verdicts; returns the documents to commit with it."""
        docs: dict[str, Any] = {}
        for gpu_uuid, verdict in sorted(verdicts.items()):
            self._add(node_id, gpu_uuid, sdc.SdcMark(verdict, now))
            docs[f"{GPU_PREFIX}{node_id}/{gpu_uuid}"] = self._doc(
                node_id, gpu_uuid, now=now, watch_until=watch.get(gpu_uuid)
            )
        return docs

    def swept(self, node_id: str, *, now: float, seed: int, suite: str) -> dict[str, Any]:
        """Record that a sweep started on a node; returns the document to commit with it."""
        self.last_swept[node_id] = now
        return {f"{SWEEP_PREFIX}{node_id}": {"last_swept_at": now, "seed": seed, "suite": suite}}

    def records(self, *, now: float, watch: Mapping[tuple[str, str], float]) -> list[dict[str, Any]]:
        """Every GPU with SDC history, most suspicious first (scores decayed to ``now``)."""
        keys = set(self.marks) | set(watch)
        rows = [self._doc(node, gpu, now=now, watch_until=watch.get((node, gpu))) for node, gpu in keys]
        rows.sort(key=lambda r: (-r["suspicion"], r["node_id"], r["gpu_uuid"]))
        return rows


def watches(node_states: Mapping[str, escalation.RemediationState], *, now: float) -> dict[tuple[str, str], float]:
    """(node, GPU) → watch end, for every GPU under an SDC watch now."""
    return {
        (node_id, gpu): until for node_id, state in node_states.items() for gpu, until in state.sdc_watch if until > now
    }


def sweep_candidates(
    *,
    connected: Iterable[str],
    node_gpus: Mapping[str, Iterable[str]],
    latest: Mapping[str, fleet.GpuLatest],
    node_states: Mapping[str, escalation.RemediationState],
    budget: blast_radius.BudgetState,
    last_swept: Mapping[str, float],
    now_unix_ns: int,
    stale_after_s: float,
    policy: policy_mod.SdcPolicy,
) -> list[sdc.SweepCandidate]:
    """Every connected node as the sweep planner sees it (idle or not, last swept when)."""
    out_of_service = budget.disrupted_nodes()
    candidates = []
    for node_id in sorted(connected):
        state = node_states.get(node_id)
        busy = state is not None and (bool(state.tickets) or bool(state.node_command_id))
        draws = []
        for gpu in node_gpus.get(node_id, ()):
            seen = latest.get(gpu)
            if seen is None:
                draws.append((None, 0.0))
                continue
            seen = fleet.drop_stale_power(seen, now_s=now_unix_ns / 1e9, stale_after_s=stale_after_s)
            draws.append((seen.power_w, float(seen.enforced_power_limit_w or 0)))
        idle = (
            not busy and node_id not in out_of_service and sdc.node_is_idle(draws, idle_power_pct=policy.idle_power_pct)
        )
        candidates.append(sdc.SweepCandidate(node_id, idle, last_swept.get(node_id)))
    return candidates
