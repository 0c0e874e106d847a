"""Leader election by lease: who holds the fleet-wide loops, decided from the lease row. Pure.

One row names the leader (`holder`), how long its lease lasts (`expires_unix_ns`, on the database's
clock) and a fencing token that grows by one with every change of term. The replica that holds an
unexpired lease renews it; any replica may take an expired (or released) lease, and taking it starts
a new term with the next token. Writes made by the fleet-wide loops carry their term's token, and the
store rejects a token that is no longer the lease's: a deposed leader that wakes up late can decide
nothing (DESIGN.md §8).

Times are the database's: every replica reads `now` from the same clock, so no replica's clock skew
can make two of them leader at once. A leader also steps down on its own when it cannot renew in time
(`holds_until`), before any other replica may take over.
"""

from __future__ import annotations

import dataclasses
import enum


@dataclasses.dataclass(frozen=True)
class Lease:
    """The lease row as plain data."""

    holder: str
    """Replica id of the leader ("" after a release)."""
    fencing_token: int
    """Grows by one per term; 0 before the first election."""
    expires_unix_ns: int
    """Database time after which any replica may take the lease."""
    acquired_unix_ns: int = 0
    """When the current term began."""

    def expired(self, now_unix_ns: int) -> bool:
        """Whether another replica may take the lease at now."""
        return not self.holder or now_unix_ns >= self.expires_unix_ns


class Verdict(enum.Enum):
    """What a replica does after looking at the lease."""

    ACQUIRED = "acquired"
    """This replica starts a new term (first election, expired or released lease)."""
    RENEWED = "renewed"
    """This replica stays leader in its current term."""
    FOLLOWING = "following"
    """Another replica holds an unexpired lease."""


@dataclasses.dataclass(frozen=True)
class Decision:
    """One look at the lease: the verdict, the row to write (None: write nothing) and why."""

    verdict: Verdict
    lease: Lease | None
    reason: str

    @property
    def leader(self) -> bool:
        """Whether this replica leads after the decision."""
        return self.verdict is not Verdict.FOLLOWING


def decide(current: Lease | None, *, replica_id: str, now_unix_ns: int, lease_s: float) -> Decision:
    """Renew, take or follow the lease. Pure.

    Worked examples (lease_s = 15):

    - No row yet → ACQUIRED with token 1, expiring at now + 15 s.
    - Row held by this replica, not expired → RENEWED: same token, expiry now + 15 s.
    - Row held by another replica, expiring in 4 s → FOLLOWING, nothing written.
    - Row held by another replica, expired (it stopped renewing) → ACQUIRED with token + 1.
    - Row held by this replica but expired → ACQUIRED with token + 1: a lapsed term is over (this
      replica already stepped down when it could not renew), so it starts a new one from the store.

    Args:
        current: the lease row, None before the first election.
        replica_id: this replica's id (pod name or hostname).
        now_unix_ns: the database's clock.
        lease_s: how long a lease lasts without renewal.
    """
    if not replica_id:
        raise ValueError("replica_id: required")
    if lease_s <= 0:
        raise ValueError(f"lease_s must be > 0, got {lease_s!r}")
    expires = now_unix_ns + int(lease_s * 1e9)
    if current is None:
        return Decision(Verdict.ACQUIRED, Lease(replica_id, 1, expires, now_unix_ns), "first election")
    if current.holder == replica_id and not current.expired(now_unix_ns):
        return Decision(
            Verdict.RENEWED,
            dataclasses.replace(current, expires_unix_ns=expires),
            f"renewed term {current.fencing_token}",
        )
    if current.expired(now_unix_ns):
        token = current.fencing_token + 1
        if not current.holder:
            why = f"lease released by the previous leader; term {token}"
        elif current.holder == replica_id:
            why = f"own term {current.fencing_token} lapsed; term {token}"
        else:
            late_s = (now_unix_ns - current.expires_unix_ns) / 1e9
            why = f"{current.holder} stopped renewing ({late_s:.1f} s past expiry); term {token}"
        return Decision(Verdict.ACQUIRED, Lease(replica_id, token, expires, now_unix_ns), why)
    left_s = (current.expires_unix_ns - now_unix_ns) / 1e9
    return Decision(
        Verdict.FOLLOWING, None, f"{current.holder} leads term {current.fencing_token} ({left_s:.1f} s left)"
    )


def release(current: Lease | None, *, replica_id: str, now_unix_ns: int) -> Lease | None:
    """The row a leader writes when it shuts down cleanly (None: it does not hold the lease).

    The lease expires at once, so a follower takes over on its next look instead of waiting out the
    lease; the token stays, and the next term gets the one after it.
    """
    if current is None or current.holder != replica_id or current.expired(now_unix_ns):
        return None
    return dataclasses.replace(current, holder="", expires_unix_ns=now_unix_ns)


def holds_until(renew_started_monotonic_s: float, lease_s: float, *, margin_s: float) -> float:
    """Until when (local monotonic seconds) a leader may act on a renewal it began at renew_started.

    The database set the expiry to its own now + lease_s, and its now was no earlier than the moment
    the renewal began here; stepping down margin_s before that keeps this replica from acting after
    another one may have taken over, even if the renewal's reply was slow.
    """
    return renew_started_monotonic_s + lease_s - margin_s


def next_look_s(lease: Lease | None, *, leader: bool, now_unix_ns: int, renew_s: float) -> float:
    """How long to wait before the next look at the lease.

    A leader renews every renew_s. A follower looks every renew_s too, but no later than just after
    the current lease expires, so it takes over within the lease time of the leader's last renewal.
    """
    if leader or lease is None or not lease.holder:
        return renew_s
    until_expiry_s = (lease.expires_unix_ns - now_unix_ns) / 1e9
    return max(0.05, min(renew_s, until_expiry_s + 0.05))
