"""Slurm quarantine adapter: ``scontrol update nodename=<n> state=drain|resume``.

Slurm drains whole nodes only. A GPU or port quarantine **falls back to a node drain** (the outcome's
``applied_scope`` is ``"node"``); per-GPU marking through ``gres`` is not implemented. Because one
drain can hold several quarantines, rasd writes what it holds into its drain reason::

    rasd: <reason> (<ticket>) {holds=node,gpu:GPU-1,port:mlx5_0/1}

and a release removes one hold; the node is resumed only when the last one goes. rasd recognises its
own drain by the ``rasd: `` prefix of ``Reason=`` in ``scontrol show node``. A drain set by someone
else is never resumed: if rasd quarantines a node someone already drained, their reason is kept in
rasd's (``{prior=<their reason>}``) and a release restores it (the node stays drained) instead of
resuming.
"""

from __future__ import annotations

import dataclasses
import re
import shutil
import subprocess
import threading

from rasd.controller.executors.quarantine.adapter import (
    QuarantineOutcome,
    QuarantineRejectedError,
    QuarantineUnavailableError,
    Status,
    require,
    split_items,
)

SLURM_REASON_PREFIX = "rasd: "
"""How a Slurm drain reason written by rasd starts."""


@dataclasses.dataclass(frozen=True)
class SlurmSettings:
    """Where scontrol is and how long it may take."""

    scontrol: str = "scontrol"
    """The scontrol program: a path, or a name looked up on PATH."""
    timeout_s: float = 30.0
    """Timeout of one scontrol run."""

    def validate(self, prefix: str) -> None:
        """Check values; raise `QuarantineSettingsError` naming the key."""
        require(bool(self.scontrol), f"{prefix}scontrol", "must not be empty", self.scontrol)
        require(self.timeout_s > 0, f"{prefix}timeout_s", "must be > 0", self.timeout_s)


@dataclasses.dataclass(frozen=True)
class _SlurmNode:
    state: str
    reason: str
    """``Reason=`` without Slurm's trailing ``[user@time]``; "" when none."""

    @property
    def drained(self) -> bool:
        return "DRAIN" in self.state.upper()

    @property
    def ours(self) -> bool:
        return self.drained and self.reason.startswith(SLURM_REASON_PREFIX)


_HOLDS = re.compile(r"\{holds=([^}]*)\}")
_PRIOR = re.compile(r"\{prior=(.*)\}\s*$")
_SLURM_STAMP = re.compile(r"\s*\[[^\[\]]*@[^\[\]]*\]\s*$")


def slurm_reason(reason: str, ticket_id: str, holds: set[str], prior: str = "") -> str:
    """The drain reason rasd writes, e.g. ``rasd: xid 79 (t1) {holds=gpu:GPU-1,node}``.

    Args:
        reason: the latest quarantine's reason (braces are replaced: they delimit rasd's fields).
        ticket_id: the latest quarantine's ticket.
        holds: what rasd holds with this drain ("node", "gpu:<uuid>", "port:<name>").
        prior: someone else's drain reason that rasd's replaced, restored on release.

    Returns:
        One line for ``scontrol update ... reason=<it>``.
    """
    clean = " ".join(reason.replace("{", "(").replace("}", ")").split())
    text = f"{SLURM_REASON_PREFIX}{clean} ({ticket_id}) {{holds={','.join(sorted(holds))}}}"
    if prior:
        text += f" {{prior={' '.join(prior.split())}}}"
    return text


class SlurmQuarantine:
    """Quarantine by draining Slurm nodes with ``scontrol``; GPUs and ports fall back to a node drain.

    Args:
        settings: the scontrol program and timeout.
    """

    name = "slurm"

    def __init__(self, settings: SlurmSettings | None = None) -> None:
        self._settings = settings or SlurmSettings()
        # Read-modify-write of a drain reason: serialise rasd's own calls (one controller leader).
        self._lock = threading.Lock()

    def quarantine_node(self, node_id: str, *, reason: str, ticket_id: str) -> QuarantineOutcome:
        """Drain the node (hold "node")."""
        return self._hold("node", node_id, "", "node", reason, ticket_id)

    def quarantine_gpu(self, node_id: str, gpu_uuid: str, *, reason: str, ticket_id: str) -> QuarantineOutcome:
        """Drain the whole node for one GPU (Slurm drains nodes; no per-GPU gres marking)."""
        return self._hold("gpu", node_id, gpu_uuid, f"gpu:{gpu_uuid}", reason, ticket_id)

    def quarantine_port(self, node_id: str, port: str, *, reason: str, ticket_id: str) -> QuarantineOutcome:
        """Drain the whole node for one port (Slurm has no port scheduling)."""
        return self._hold("port", node_id, port, f"port:{port}", reason, ticket_id)

    def release_node(self, node_id: str, *, reason: str, ticket_id: str) -> QuarantineOutcome:
        """Drop the "node" hold; resume only when rasd's drain holds nothing else."""
        return self._unhold("node", node_id, "", "node", reason, ticket_id)

    def release_gpu(self, node_id: str, gpu_uuid: str, *, reason: str, ticket_id: str) -> QuarantineOutcome:
        """Drop the GPU's hold; resume only when rasd's drain holds nothing else."""
        return self._unhold("gpu", node_id, gpu_uuid, f"gpu:{gpu_uuid}", reason, ticket_id)

    def release_port(self, node_id: str, port: str, *, reason: str, ticket_id: str) -> QuarantineOutcome:
        """Drop the port's hold; resume only when rasd's drain holds nothing else."""
        return self._unhold("port", node_id, port, f"port:{port}", reason, ticket_id)

    def close(self) -> None:
        """Nothing to close."""

    # ---- internals ------------------------------------------------------------------------

    def _hold(self, scope: str, node_id: str, target: str, hold: str, reason: str, ticket_id: str) -> QuarantineOutcome:
        def outcome(status: Status, detail: str, *, applied: bool = False, kept: tuple[str, ...] = ()):
            return QuarantineOutcome(
                self.name, "quarantine", scope, node_id, target, ticket_id, status, detail,
                applied_scope="node" if applied else "", kept=kept,
            )  # fmt: skip

        fallback = "" if scope == "node" else " (Slurm drains whole nodes: node drain for this " + scope + ")"
        with self._lock:
            node = self._show(node_id)
            if node is None:
                return outcome(Status.NODE_NOT_FOUND, "scontrol does not know the node; nothing changed")
            if node.ours:
                holds = _holds(node.reason)
                if hold in holds:
                    return outcome(Status.ALREADY_QUARANTINED, f"already drained by rasd ({node.reason})")
                prior = _prior(node.reason)
                self._update(node_id, "drain", slurm_reason(reason, ticket_id, holds | {hold}, prior))
                return outcome(Status.QUARANTINED, f"added to rasd's drain{fallback}: {reason}", applied=True)
            prior = node.reason if node.drained else ""
            self._update(node_id, "drain", slurm_reason(reason, ticket_id, {hold}, prior))
            if prior:
                kept = (f"drain set by someone else ({prior}); restored on release",)
                return outcome(Status.QUARANTINED, f"drained by rasd{fallback}: {reason}", applied=True, kept=kept)
            return outcome(Status.QUARANTINED, f"drained{fallback}: {reason}", applied=True)

    def _unhold(
        self, scope: str, node_id: str, target: str, hold: str, reason: str, ticket_id: str
    ) -> QuarantineOutcome:
        def outcome(status: Status, detail: str, *, applied: bool = False, kept: tuple[str, ...] = ()):
            return QuarantineOutcome(
                self.name, "release", scope, node_id, target, ticket_id, status, detail,
                applied_scope="node" if applied else "", kept=kept,
            )  # fmt: skip

        with self._lock:
            node = self._show(node_id)
            if node is None:
                return outcome(Status.NODE_NOT_FOUND, "scontrol does not know the node; nothing changed")
            if not node.ours:
                kept = (f"drain set by someone else ({node.reason})",) if node.drained else ()
                return outcome(Status.NOT_QUARANTINED, "rasd holds no drain on this node; nothing changed", kept=kept)
            holds = _holds(node.reason)
            if hold not in holds:
                return outcome(
                    Status.NOT_QUARANTINED, f"rasd's drain does not hold {hold} ({node.reason}); nothing changed"
                )
            rest = holds - {hold}
            prior = _prior(node.reason)
            if rest:
                self._update(node_id, "drain", _replace_holds(node.reason, rest))
                return outcome(
                    Status.RELEASED,
                    f"node stays drained, rasd still holds {','.join(sorted(rest))}: {reason}",
                    applied=True,
                )
            if prior:
                self._update(node_id, "drain", prior)
                kept = (f"drain set by someone else ({prior})",)
                return outcome(Status.RELEASED, f"restored the earlier drain reason: {reason}", applied=True, kept=kept)
            self._update(node_id, "resume", "")
            return outcome(Status.RELEASED, f"resumed: {reason}", applied=True)

    def _run(self, *argv: str) -> subprocess.CompletedProcess[str]:
        program = self._settings.scontrol
        resolved = program if "/" in program else shutil.which(program)
        if resolved is None:
            raise QuarantineUnavailableError(f"scontrol program {program!r} not found on PATH")
        try:
            return subprocess.run(
                [resolved, *argv], capture_output=True, text=True, timeout=self._settings.timeout_s, check=False
            )
        except subprocess.TimeoutExpired as exc:
            raise QuarantineUnavailableError(
                f"scontrol {argv[0]} timed out after {self._settings.timeout_s} s"
            ) from exc
        except OSError as exc:
            raise QuarantineUnavailableError(f"cannot run scontrol ({resolved}): {exc}") from exc

    def _show(self, node_id: str) -> _SlurmNode | None:
        done = self._run("show", "node", node_id)
        text = done.stdout + done.stderr
        if done.returncode != 0:
            if "not found" in text.lower() or "invalid node name" in text.lower():
                return None
            raise QuarantineUnavailableError(f"scontrol show node {node_id} failed ({done.returncode}): {text.strip()}")
        return _parse_show(text)

    def _update(self, node_id: str, state: str, reason: str) -> None:
        argv = ["update", f"nodename={node_id}", f"state={state}"]
        if reason:
            argv.append(f"reason={reason}")
        done = self._run(*argv)
        if done.returncode != 0:
            text = (done.stdout + done.stderr).strip()
            if any(word in text.lower() for word in ("invalid", "denied", "not authorized")):
                raise QuarantineRejectedError(f"scontrol update {node_id} state={state} refused: {text}")
            raise QuarantineUnavailableError(
                f"scontrol update {node_id} state={state} failed ({done.returncode}): {text}"
            )


def _parse_show(text: str) -> _SlurmNode:
    """Parse ``scontrol show node``: ``State=`` is a token; ``Reason=`` runs to the end of its line."""
    state = ""
    reason = ""
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("Reason="):
            reason = _SLURM_STAMP.sub("", stripped[len("Reason=") :]).strip()
            continue
        for token in stripped.split():
            if token.startswith("State="):
                state = token[len("State=") :]
    if reason in ("(null)", "None"):
        reason = ""
    return _SlurmNode(state, reason)


def _holds(reason: str) -> set[str]:
    found = _HOLDS.search(reason)
    return split_items(found.group(1)) if found else {"node"}


def _prior(reason: str) -> str:
    found = _PRIOR.search(reason)
    return found.group(1) if found else ""


def _replace_holds(reason: str, holds: set[str]) -> str:
    value = ",".join(sorted(holds))
    if _HOLDS.search(reason):
        return _HOLDS.sub(lambda _m: f"{{holds={value}}}", reason, count=1)
    return f"{reason} {{holds={value}}}"
