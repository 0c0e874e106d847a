"""Writes audit records that are not part of a remediation decision: admin calls and denials.

Remediation decisions write their own audit rows in the same transaction as the decision
(``rasd.controller.remediation.service``); this writer covers what happens at the API edge: every
state-changing AdminService call with its outcome, every refused call (unauthenticated, wrong role,
unknown method) and every agent stream refused for speaking as another node. The table is
append-only: nothing in rasd updates or deletes an audit row.

A refused caller chooses what its records say and how often it is refused: one node certificate
wrote 4.9 MB of reasons of its choosing in 15 s, each record a write on the store thread that
ingestion needs. So a denial's record is cut shorter (`DENIED_REASON_CHARS`) and rationed per
caller and overall (`DenialAllowance`); what is not written is counted
(``rasd_audit_denials_dropped_total``) and the caller's next written record says how many of its
denials were left out. Every record names the peer address, and a denial names the certificate
the connection presented even when the call's bearer token was refused.
"""

from __future__ import annotations

import collections
import dataclasses
import time
from collections.abc import Callable, Mapping
from typing import Any

import structlog
from prometheus_client import CollectorRegistry, Counter

from rasd.controller.ingest import service as ingest_mod
from rasd.controller.store import remediation as rstore

log = structlog.get_logger("rasd.controller")

MAX_FIELD = 1024
DENIED_REASON_CHARS = 128
"""A refused call's reason (the request's own, or why it was refused) is cut to this in its record."""


@dataclasses.dataclass
class _Bucket:
    tokens: float
    last_s: float
    dropped: int = 0


class DenialAllowance:
    """How many denied calls get an audit record: a token bucket per caller, and one for all callers.

    Unlike the agent stream's pacing (`rpc.validate_input.TokenBucket`, which makes a sender wait and
    so runs into debt), a refusal over the allowance is not delayed: its record is left out, and a
    caller's bucket never goes below empty. Callers are kept in least-recently-refused order up
    to `max_callers` (a caller forgotten starts with a full bucket again).
    """

    def __init__(
        self,
        *,
        per_caller_burst: int = 20,
        per_caller_per_s: float = 0.2,
        overall_burst: int = 200,
        overall_per_s: float = 20.0,
        max_callers: int = 4096,
    ) -> None:
        """Set the buckets: a caller may be recorded per_caller_burst times at once, then per_caller_per_s."""
        self._per_caller = (float(per_caller_burst), per_caller_per_s)
        self._overall_rate = overall_per_s
        self._overall = _Bucket(float(overall_burst), 0.0)
        self._overall_burst = float(overall_burst)
        self._max_callers = max_callers
        self._callers: collections.OrderedDict[str, _Bucket] = collections.OrderedDict()

    def admit(self, caller: str, now_s: float) -> tuple[bool, int]:
        """Take one record's allowance for caller: (whether to write it, the caller's denials left out before it)."""
        burst, rate = self._per_caller
        bucket = self._callers.pop(caller, None) or _Bucket(burst, now_s)
        self._callers[caller] = bucket
        while len(self._callers) > self._max_callers:
            self._callers.popitem(last=False)
        _refill(bucket, now_s, burst, rate)
        _refill(self._overall, now_s, self._overall_burst, self._overall_rate)
        if bucket.tokens < 1.0 or self._overall.tokens < 1.0:
            bucket.dropped += 1
            return False, 0
        bucket.tokens -= 1.0
        self._overall.tokens -= 1.0
        dropped, bucket.dropped = bucket.dropped, 0
        return True, dropped


def _refill(bucket: _Bucket, now_s: float, burst: float, rate_per_s: float) -> None:
    bucket.tokens = min(burst, bucket.tokens + max(0.0, now_s - bucket.last_s) * rate_per_s)
    bucket.last_s = now_s


def peer_host(peer: str) -> str:
    """The host of a gRPC peer string (``ipv4:10.0.0.5:41234`` → ``ipv4:10.0.0.5``): one caller, whatever its port."""
    host, colon, port = peer.rpartition(":")
    return host if colon and port.isdigit() and host not in ("ipv4", "ipv6") else peer


class AuditLog:
    """Appends audit records through the ingest's single store thread."""

    def __init__(
        self,
        ingest: ingest_mod.Ingest,
        *,
        clock: Callable[[], int] = time.time_ns,
        registry: CollectorRegistry | None = None,
        denials: DenialAllowance | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        """Bind to the ingest (its store and writer thread); registry: where the dropped denials are counted.

        clock: the records' time (unix ns); monotonic: the allowance's (seconds).
        """
        self._ingest = ingest
        self._store = rstore.RemediationStore(ingest.store.engine)
        self._clock = clock
        self._monotonic = monotonic
        self._denials = denials or DenialAllowance()
        self.records_written = 0
        self.denials_dropped = 0
        self._dropped_metric = Counter(
            "rasd_audit_denials_dropped",
            "Refused calls whose audit record was left out: their caller, or all callers, were refused more "
            "often than the audit log records (the caller's next record says how many).",
            registry=registry,
        )

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
            commit = rstore.Commit(now_unix_ns=now_ns, audit=[row])
            await self._ingest.store_calls.run_in_store(self._store.commit, commit)
        except Exception as exc:  # the call's answer must not depend on the audit store; the log keeps it
            log.error("audit_write_failed", error=str(exc), **{k: v for k, v in row.items() if k != "details"})
            return
        self.records_written += 1
        log.info("audit", **{k: v for k, v in row.items() if k != "details"})

    async def record_denial(
        self,
        *,
        actor: str,
        peer: str,
        action: str,
        outcome: str,
        node_id: str = "",
        gpu_uuid: str = "",
        reason: str = "",
        details: Mapping[str, Any] | None = None,
    ) -> bool:
        """Append a refused call's record, within the refused caller's allowance; whether it was written.

        The caller is the actor from the peer's host; the reason is cut to `DENIED_REASON_CHARS`.
        Left out, it is counted; the caller's next record carries ``dropped_before`` in its details.
        """
        admitted, dropped_before = self._denials.admit(f"{actor} {peer_host(peer)}", self._monotonic())
        if not admitted:
            self.denials_dropped += 1
            self._dropped_metric.inc()
            return False
        extra = {"peer": peer[:128], **({"dropped_before": dropped_before} if dropped_before else {})}
        await self.record(
            actor=actor,
            action=action,
            outcome=outcome,
            node_id=node_id[:253],
            gpu_uuid=gpu_uuid[:96],
            reason=reason[:DENIED_REASON_CHARS],
            details={**(details or {}), **extra},
        )
        return True
