"""The operator's side of idempotency: show, list and purge records; describe live state.

`jobs idempotency ...` and the status snapshot read through the backend, so its errors
arrive wrapped (`StoreUnavailable`, `StorageError`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from resilience.errors import StorageError
from resilience.holders import Holder
from resilience.idempotency.backends import Record
from resilience.idempotency.backends.cached import CachedBackend, cached_backend

if TYPE_CHECKING:
    from resilience.stores import Stores

logger = logging.getLogger("resilience.idempotency")


@dataclass(frozen=True)
class IdempotencyState:
    """What is on now: records by state, the open claims' holders, the cache's size.

    Args:
        by_state: record count per state (every state, zeros included).
        holders: open claims, oldest first (at most the limit asked for).
        cached_results: results in the Redis cache; None when not counted or unreadable.
    """

    by_state: dict[str, int]
    holders: list[Holder] = field(default_factory=list)
    cached_results: int | None = None

    @property
    def total(self) -> int:
        return sum(self.by_state.values())

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready fields (status views, `--json`)."""
        return {"by_state": dict(self.by_state), "total": self.total,
                "holders": [holder.as_dict() for holder in self.holders],
                "cached_results": self.cached_results}


class IdempotencyRecords:
    """Show, list and purge records, and describe live state.

    Args:
        backend: where the records live, behind their result cache (a purge drops the
            cached copy too).
    """

    def __init__(self, backend: CachedBackend) -> None:
        self.backend = backend

    def find(self, task_name: str, key: str) -> Record | None:
        return self.backend.records.read(task_name, key)

    def recent(self, *, limit: int = 20, task_name: str | None = None,
               state: str | None = None) -> list[Record]:
        """The most recently updated records, newest first, optionally of one task or state."""
        return self.backend.records.recent(limit=limit, task_name=task_name, state=state)

    def purge(self, task_name: str, key: str, *, force: bool = False) -> bool:
        """Delete one record and its cached copy so the key runs again; an open claim only
        with `force`. Returns True when a record was deleted."""
        return self.backend.purge(task_name, key, force=force)

    def count_by_state(self, *, exact: bool = False) -> dict[str, int]:
        """Records per state (every state, zeros included); without `exact`, estimated
        where the backend can (PostgreSQL: finished states from the planner's statistics)."""
        records = self.backend.records
        estimate = None if exact else getattr(records, "estimate_by_state", None)
        return estimate() if estimate is not None else records.count_by_state()

    def describe(self, *, holders_limit: int = 20, cache_size: bool = True,
                 exact_counts: bool = False) -> IdempotencyState:
        """Records by state, the oldest open claims, and (when asked) the cache's size.

        Args:
            holders_limit: most open claims listed.
            cache_size: count the cached results (one SCAN of the cache's keys).
            exact_counts: count finished records exactly (a full scan on a large table);
                by default they are estimated (`count_by_state`).

        Raises:
            StoreUnavailable, StorageError: the records cannot be read (an unreadable
                cache only leaves `cached_results` None).
        """
        cached: int | None = None
        if cache_size:
            cache = self.backend.cache
            try:
                cached = 0 if cache is None else cache.size()
            except StorageError as exc:
                logger.warning("idempotency cache size unknown: %s", exc)
        return IdempotencyState(by_state=self.count_by_state(exact=exact_counts),
                                holders=self.backend.records.holders(limit=holders_limit),
                                cached_results=cached)


def records_for(stores: Stores) -> IdempotencyRecords:
    """The records of `stores`: PostgreSQL, with the Redis result cache."""
    return IdempotencyRecords(cached_backend(stores))


def describe(stores: Stores, **options: Any) -> IdempotencyState:
    """Live idempotency state of `stores` (options: `IdempotencyRecords.describe`)."""
    return records_for(stores).describe(**options)
