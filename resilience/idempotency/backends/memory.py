"""Idempotency records in process memory: one process only (tests, a single-process app).

The same decisions as the PostgreSQL statements, under one lock: a claim inserts or takes
over (expired record, failed record, or an ended lease of the same arguments); completion,
failure and release match the fencing pair. A transaction has no database session (the
body receives None); its completion applies when it commits.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from resilience.errors import StoreUnavailable
from resilience.holders import Holder
from resilience.idempotency.backends import (
    FAILED,
    HOLDER_KIND,
    IN_PROGRESS,
    STATES,
    SUCCEEDED,
    Claim,
    ClaimResult,
    Record,
)


@dataclass
class _Row:
    fingerprint: str
    state: str
    attempt: int
    lease_owner: str | None
    lease_expires_at: float | None
    task_id: str | None
    created_at: float
    updated_at: float
    expires_at: float
    result: Any = None
    error: str | None = None


class MemoryIdempotencyBackend:
    """Records in a dict behind a lock.

    Args:
        clock: seconds since the epoch (injectable, so tests expire leases without waiting).
    """

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self._lock = threading.Lock()
        self._rows: dict[tuple[str, str], _Row] = {}

    def _claimable(self, row: _Row, fingerprint: str, now: float) -> bool:
        """The takeover rule of the claim statement (its WHERE clause)."""
        lease_over = row.lease_expires_at is not None and row.lease_expires_at <= now
        if row.expires_at <= now and (row.state != IN_PROGRESS or lease_over):
            return True
        return row.fingerprint == fingerprint and (
            row.state == FAILED
            or (row.state == IN_PROGRESS and (row.lease_expires_at is None or lease_over))
        )

    def claim(self, *, task_name: str, key: str, fingerprint: str, owner: str,
              task_id: str | None, lease_seconds: float, ttl_seconds: float) -> ClaimResult:
        with self._lock:
            now = self.clock()
            row = self._rows.get((task_name, key))
            taken = row is None or self._claimable(row, fingerprint, now)
            if taken:
                created = now if row is None or row.expires_at <= now else row.created_at
                row = self._rows[(task_name, key)] = _Row(
                    fingerprint=fingerprint, state=IN_PROGRESS,
                    attempt=1 if row is None else row.attempt + 1, lease_owner=owner,
                    lease_expires_at=now + lease_seconds, task_id=task_id, created_at=created,
                    updated_at=now, expires_at=now + ttl_seconds)
            assert row is not None
            claimed = taken or (row.state == IN_PROGRESS and row.lease_owner == owner)
            return ClaimResult(
                claim=Claim(task_name=task_name, key=key, attempt=row.attempt, owner=owner)
                if claimed else None,
                attempt=row.attempt, state=row.state, fingerprint=row.fingerprint,
                result=row.result, error=row.error, task_id=row.task_id,
                lease_owner=row.lease_owner,
                lease_remaining_seconds=None if row.lease_expires_at is None
                else row.lease_expires_at - now,
                expires_in_seconds=row.expires_at - now,
            )

    def _held(self, claim: Claim) -> _Row | None:
        """The row `claim` still holds (its fencing pair matches), else None; under `_lock`."""
        row = self._rows.get((claim.task_name, claim.key))
        if row is None or row.state != IN_PROGRESS or (
                row.attempt, row.lease_owner) != (claim.attempt, claim.owner):
            return None
        return row

    def _finish(self, claim: Claim, **changes: Any) -> bool:
        with self._lock:
            row = self._held(claim)
            if row is None:
                return False
            now = self.clock()
            ttl_seconds = changes.pop("ttl_seconds", None)
            if ttl_seconds is not None:
                changes.update(lease_owner=None, lease_expires_at=None,
                               expires_at=now + ttl_seconds)
            for name, value in changes.items():
                setattr(row, name, value)
            row.updated_at = now
            return True

    def complete(self, claim: Claim, result_json: str, ttl_seconds: float) -> bool:
        return self._finish(claim, state=SUCCEEDED, result=json.loads(result_json), error=None,
                            ttl_seconds=ttl_seconds)

    def fail(self, claim: Claim, error: str, ttl_seconds: float) -> bool:
        return self._finish(claim, state=FAILED, result=None, error=error[:4000],
                            ttl_seconds=ttl_seconds)

    def release(self, claim: Claim) -> bool:
        return self._finish(claim, lease_owner=None, lease_expires_at=self.clock())

    def begin(self) -> MemoryTransaction:
        return MemoryTransaction(self)

    def unavailable(self, error: BaseException) -> bool:
        return isinstance(error, StoreUnavailable)

    # -- the operator's side ---------------------------------------------------------------
    def _record(self, task_name: str, key: str, row: _Row) -> Record:
        fields = dict(vars(row))
        for name in ("lease_expires_at", "created_at", "updated_at", "expires_at"):
            if fields[name] is not None:
                fields[name] = datetime.fromtimestamp(fields[name], UTC)
        return Record(task_name=task_name, key=key, **fields)

    def read(self, task_name: str, key: str) -> Record | None:
        with self._lock:
            row = self._rows.get((task_name, key))
            return None if row is None else self._record(task_name, key, row)

    def recent(
        self, *, limit: int, task_name: str | None = None, state: str | None = None
    ) -> list[Record]:
        with self._lock:
            found = [
                (row.updated_at, self._record(name, key, row))
                for (name, key), row in self._rows.items()
                if task_name in (None, name) and state in (None, row.state)
            ]
        found.sort(key=lambda pair: pair[0], reverse=True)
        return [record for _, record in found[:limit]]

    def purge(self, task_name: str, key: str, *, force: bool = False) -> bool:
        with self._lock:
            row = self._rows.get((task_name, key))
            if row is None or (row.state == IN_PROGRESS and not force):
                return False
            del self._rows[(task_name, key)]
            return True

    def count_by_state(self) -> dict[str, int]:
        counts = dict.fromkeys(STATES, 0)
        with self._lock:
            for row in self._rows.values():
                counts[row.state] += 1
        return counts

    def holders(self, *, limit: int) -> list[Holder]:
        with self._lock:
            now = self.clock()
            open_claims = sorted(
                ((name, key, row) for (name, key), row in self._rows.items()
                 if row.state == IN_PROGRESS and row.lease_owner is not None),
                key=lambda item: item[2].updated_at)
            return [Holder(kind=HOLDER_KIND, key=f"{name}:{key}",
                           owner=row.task_id or row.lease_owner, token=row.attempt,
                           held_seconds=max(0.0, now - row.updated_at),
                           alive=row.lease_expires_at is not None and row.lease_expires_at > now)
                    for name, key, row in open_claims[:limit]]


class MemoryTransaction:
    """A transaction without a database: the completion is staged, applied by `commit`."""

    session: Any = None

    def __init__(self, backend: MemoryIdempotencyBackend) -> None:
        self._backend = backend
        self._staged: tuple[Claim, str, float] | None = None

    def complete(self, claim: Claim | None, result_json: str, ttl_seconds: float) -> bool:
        if claim is None:
            return True
        with self._backend._lock:
            if self._backend._held(claim) is None:
                return False
        self._staged = (claim, result_json, ttl_seconds)
        return True

    def commit(self) -> None:
        if self._staged is not None:
            self._backend.complete(*self._staged)
            self._staged = None

    def close(self) -> None:
        self._staged = None
