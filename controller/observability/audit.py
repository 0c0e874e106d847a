"""Writes audit records that are not part of a remediation decision: admin calls and denials.

Remediation decisions write their own audit rows in the same transaction as the decision
(``rasd.controller.remediation.service``); this writer covers what happens at the API edge: every
state-changing AdminService call with its outcome, every refused call (unauthenticated, wrong role,
unknown method) and every agent stream refused for speaking as another node. The table is
append-only: nothing in rasd updates or deletes an audit row.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

import structlog

from rasd.controller.ingest import service as ingest_mod
from rasd.controller.store import remediation as rstore

log = structlog.get_logger("rasd.controller")

MAX_FIELD = 1024


class AuditLog:
    """Appends audit records through the ingest's single store thread."""

    def __init__(self, ingest: ingest_mod.Ingest, *, clock: Callable[[], int] = time.time_ns) -> None:
        """Bind to the ingest (its store and writer thread)."""
        self._ingest = ingest
        self._store = rstore.RemediationStore(ingest.store.engine)
        self._clock = clock
        self.records_written = 0

    async def record(
        self,
        *,
        actor: str,
        action: str,
        outcome: str,
        node_id: str = "",
        gpu_uuid: str = "",
        reason: str = "",
        details: Mapping[str, Any] | None = None,
    ) -> None:
        """Append one record: who, what, to which target, why, and how it ended (now)."""
        now_ns = self._clock()
        row = {
            "at_unix_ns": now_ns,
            "actor": actor[:128],
            "action": action[:64],
            "node_id": node_id[:253],
            "gpu_uuid": gpu_uuid[:96],
            "reason": reason[:MAX_FIELD],
            "outcome": outcome[:64],
            "details": dict(details or {}),
        }
        try:
            await self._ingest.run_in_store(self._store.commit, rstore.Commit(now_unix_ns=now_ns, audit=[row]))
        except Exception as exc:  # the call's answer must not depend on the audit store; the log keeps it
            log.error("audit_write_failed", error=str(exc), **{k: v for k, v in row.items() if k != "details"})
            return
        self.records_written += 1
        log.info("audit", **{k: v for k, v in row.items() if k != "details"})
