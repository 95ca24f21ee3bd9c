"""Storage of idempotency records: the atomic steps a backend offers the guard.

A record is one row per (task name, key); its state machine (models.py has the table):

    (none) --claim--> in_progress --complete--> succeeded
                          |  \\--fail (non-retryable)--> failed
                          |---release (retryable): lease ends now, row stays in_progress
                          '---reaper (lease expired long ago)--> failed

`complete`, `fail` and `release` match the claim's fencing pair (attempt, owner token): a
holder whose claim was taken over changes nothing. When a claim takes a row over, and
transactional mode (`begin()`): docs/idempotency.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from resilience.holders import Holder

#: Record states, as stored.
IN_PROGRESS = "in_progress"
SUCCEEDED = "succeeded"
FAILED = "failed"
STATES = (IN_PROGRESS, SUCCEEDED, FAILED)

#: The `Holder.kind` of an idempotency claim.
HOLDER_KIND = "idempotency"


@dataclass(frozen=True, kw_only=True, slots=True)
class Claim:
    """The claim a call holds: its key and its fencing pair (attempt, owner token)."""

    task_name: str
    key: str
    attempt: int
    owner: str

    def parameters(self, **extra: Any) -> dict[str, Any]:
        return {"task_name": self.task_name, "key": self.key, "attempt": self.attempt,
                "owner": self.owner, **extra}


@dataclass(frozen=True, kw_only=True, slots=True)
class ClaimResult:
    """What a claim found: the key is now the caller's (`claim`), or someone's record."""

    #: The claim the caller now holds; None when another record stands in the way.
    claim: Claim | None
    attempt: int
    state: str
    fingerprint: str
    result: Any
    error: str | None
    task_id: str | None
    lease_owner: str | None
    #: Seconds until the current holder's lease ends (None when no lease is open).
    lease_remaining_seconds: float | None
    #: Seconds until the record expires (its TTL left).
    expires_in_seconds: float = 0.0

    @property
    def claimed(self) -> bool:
        """The key is now the caller's."""
        return self.claim is not None

    @property
    def live(self) -> bool:
        """Another holder has a claim whose lease has not ended."""
        return (self.state == IN_PROGRESS and self.lease_remaining_seconds is not None
                and self.lease_remaining_seconds > 0)


@dataclass(frozen=True)
class Record:
    """One idempotency record as stored (admin views)."""

    task_name: str
    key: str
    fingerprint: str
    state: str
    result: Any
    error: str | None
    attempt: int
    lease_owner: str | None
    lease_expires_at: datetime | None
    task_id: str | None
    created_at: datetime
    updated_at: datetime
    expires_at: datetime


class Transaction(Protocol):
    """The body's transaction in transactional mode; the guard commits it after the body.

    `close()` always follows, and rolls back whatever was not committed.
    """

    #: What the body receives as its `session` argument.
    session: Any

    def complete(self, claim: Claim | None, result_json: str, ttl_seconds: float) -> bool:
        """Flush the body's writes and record `claim`'s success in this transaction.

        None (a fail-open run holds no claim) flushes only. False when the claim was taken
        over (the caller rolls back).

        Raises:
            StorageError: the database failed or refused the writes.
        """

    def commit(self) -> None:
        """Commit the body's writes and the record together.

        Raises:
            StorageError: the commit failed; nothing (or, unknowably, everything) committed.
        """

    def close(self) -> None:
        """Roll back what was not committed and give the connection back; never raises."""


class IdempotencyBackend(Protocol):
    """Where records live; every step is one atomic store operation."""

    def claim(self, *, task_name: str, key: str, fingerprint: str, owner: str,
              task_id: str | None, lease_seconds: float, ttl_seconds: float) -> ClaimResult:
        """Claim `key` for `owner` (insert, or take over an expired, failed or released
        record of the same arguments), or return the record that stands in the way.

        Raises:
            StoreUnavailable, StoreRejected, StorageError.
        """

    def complete(self, claim: Claim, result_json: str, ttl_seconds: float) -> bool:
        """Record success with its result; False when the claim was taken over (stale)."""

    def fail(self, claim: Claim, error: str, ttl_seconds: float) -> bool:
        """Record a non-retryable failure; False when the claim was taken over."""

    def release(self, claim: Claim) -> bool:
        """End the claim's lease now so a retry can claim at once; False when stale."""

    def begin(self) -> Transaction:
        """Open the body's transaction (transactional mode).

        Raises:
            StorageError: no transaction could be opened (the store is down).
        """

    def unavailable(self, error: BaseException) -> bool:
        """Is `error` (raised by a transactional body) this store being unreachable?"""

    # -- the operator's side (admin, describe) -------------------------------------------
    def read(self, task_name: str, key: str) -> Record | None:
        """The record of `key` under `task_name`, or None."""

    def recent(
        self, *, limit: int, task_name: str | None = None, state: str | None = None
    ) -> list[Record]:
        """The most recently updated records, newest first."""

    def purge(self, task_name: str, key: str, *, force: bool = False) -> bool:
        """Delete one record (an open claim only with `force`); True when deleted."""

    def count_by_state(self) -> dict[str, int]:
        """How many records are in each state (every state present, zeros included)."""

    def holders(self, *, limit: int) -> list[Holder]:
        """Open claims (someone holds the lease, or held it until it lapsed), oldest first."""

