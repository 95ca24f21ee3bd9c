"""The Redis fast path in front of an idempotency backend: one GET answers a duplicate.

`CachedBackend` is the backend the guard binds: the records' backend (PostgreSQL, or memory)
with succeeded keys cached in Redis in front of it. The records stay the truth, so a miss
(flushed Redis, evicted key, Redis down) falls through to the claim, which replays from the
record. Reads and fills join the call's Redis rounds (`resilience.batch.for_client`). Why a
result is cached for `cache_ttl_seconds` and not the record's TTL, and why `cache="auto"`
reads the cache only while a task's keys replay: docs/idempotency.md ("Cache mode",
"Cache TTL").
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

from resilience.batch import for_client
from resilience.connections import wrap_store_errors
from resilience.idempotency.backends import (
    SUCCEEDED,
    Claim,
    ClaimResult,
    IdempotencyBackend,
)
from resilience.idempotency.backends.memory import MemoryIdempotencyBackend
from resilience.idempotency.backends.postgres import backend_for
from resilience.idempotency.config import DEFAULT_CACHE_TTL_SECONDS
from resilience.keys import GuardKey, canonical_json, redis_key, stored_keys

if TYPE_CHECKING:
    import redis

    from resilience.batch import Rounds
    from resilience.pipeline import Call
    from resilience.stores import Stores

logger = logging.getLogger("resilience.idempotency")

NAMESPACE = "resilience:idempotency"
#: With `cache="auto"`, how long the fast path stays on for a task in a process after one
#: of its keys was replayed (from the cache or from the records).
HOT_SECONDS = 60.0
#: With `cache="auto"`, how many fresh keys in a row (no replay between them) turn the fast
#: path off again before `HOT_SECONDS`: duplicates have stopped arriving.
HOT_FRESH_CALLS = 8


@dataclass(frozen=True)
class CachedResult:
    """A succeeded record as cached: argument fingerprint, result, original task id."""

    fingerprint: str
    result: Any
    task_id: str | None


@dataclass(frozen=True, kw_only=True, slots=True)
class CacheHit(ClaimResult):
    """A claim the fast path answered: a succeeded record, nothing claimed."""


def cache_key(task_name: str, key: str) -> str:
    """The Redis key caching `task_name`'s record of `key` (`resilience.keys.redis_key`)."""
    return redis_key(NAMESPACE, f"{task_name}:{key}")


class ResultCache:
    """Reads and writes cached results; every Redis error is logged and treated as a miss.

    Args:
        client: returns the process's Redis client (`Stores.redis`; called on each use, so
            a forked child uses its own).
    """

    def __init__(self, client: Callable[[], redis.Redis]) -> None:
        self._client = client

    @property
    def client(self) -> redis.Redis:
        return self._client()

    def get(self, task_name: str, key: str) -> CachedResult | None:
        """The cached result of `key`, or None (miss, or Redis unavailable)."""
        try:
            raw = self.client.get(cache_key(task_name, key))
        except Exception as exc:  # noqa: BLE001 - the cache is optional; PG is the truth
            raw = exc
        return self.parse(raw)

    def get_later(
        self, rounds: Rounds, task_name: str, key: str, then: Callable[[CachedResult | None], None]
    ) -> None:
        """Queue the read of `key` in the call's read round; `then` gets what `get` would."""
        for_client(rounds, self.client).command("GET", cache_key(task_name, key),
                                                then=lambda reply: then(self.parse(reply)))

    @staticmethod
    def parse(raw: Any) -> CachedResult | None:
        """A cached payload (or the read's error) as a `CachedResult`; None for a miss, an
        unreadable value or a failed read (logged)."""
        if isinstance(raw, BaseException):
            logger.warning("idempotency cache read failed, using PostgreSQL: %s", raw)
            return None
        if raw is None:
            return None
        try:
            value = json.loads(raw)
            return CachedResult(value["f"], value["r"], value.get("t"))
        except (ValueError, KeyError, TypeError):
            return None

    def put_later(self, rounds: Rounds, task_name: str, key: str, *, fingerprint: str,
                  result_json: str, task_id: str | None, ttl_seconds: float) -> None:
        """Cache a succeeded record for `ttl_seconds` (never more than the record has left),
        queued in the call's write round with its other after-run writes."""

        def done(reply: Any) -> None:
            if isinstance(reply, BaseException):  # a missed fill costs one PG read later
                logger.warning("idempotency cache write failed: %s", reply)

        # The result is already canonical JSON: splice it in rather than parse and re-dump.
        payload = f'{{"f":{json.dumps(fingerprint)},"t":{json.dumps(task_id)},"r":{result_json}}}'
        for_client(rounds, self.client).command(
            "SET", cache_key(task_name, key), payload, "PX", max(1, int(ttl_seconds * 1000)),
            then=done)

    def forget(self, task_name: str, key: str) -> None:
        """Drop a cached key (admin purge)."""
        try:
            self.client.delete(cache_key(task_name, key))
        except Exception as exc:  # noqa: BLE001 - the cached copy expires with its TTL anyway
            logger.warning("idempotency cache delete failed: %s", exc)

    def size(self) -> int:
        """How many results are cached now: one SCAN, which walks the *whole* keyspace
        (~170 ms per 200k keys). Explicit admin use only (`jobs idempotency status
        --count-cache`), never a periodic path (metrics, status, web pages).

        Raises:
            StoreUnavailable, StorageError.
        """
        with wrap_store_errors("idempotency cache size"):
            return len(stored_keys(self.client, NAMESPACE, suffixed=True))


class CachedBackend:
    """An idempotency backend with the Redis fast path in front; what the guard binds.

    `claim` asks the cache first and fills it after a replay from the records, `complete`
    (or `succeeded`, after a transaction's commit) fills it after a completion, `purge`
    drops the cached copy; the other steps are the records' own (`records`, for the
    operator's reads). One per guard: the "auto" state is a task's.

    Args:
        records: where the records live (the truth).
        cache: the fast path; None for none (in-memory stores).
        mode: `IdempotencyConfig.cache`: True, False (no fast path) or "auto".
        ttl_seconds: how long a result stays cached (`IdempotencyConfig.cache_ttl_seconds`).
    """

    def __init__(self, records: IdempotencyBackend, cache: ResultCache | None, *,
                 mode: bool | str = True,
                 ttl_seconds: float = DEFAULT_CACHE_TTL_SECONDS) -> None:
        self.records = records
        self.cache = cache if mode else None
        self.mode = mode
        self.ttl_seconds = ttl_seconds
        #: `mode="auto"`: monotonic time until which the fast path is on in this process
        #: (0 once `HOT_FRESH_CALLS` fresh keys were claimed since the last replay).
        self._hot_until = 0.0
        self._fresh_in_a_row = 0
        # The records' own steps, bound once: no wrapper frame, and no `__getattr__` (it
        # slows every attribute of the hot path).
        self.fail = records.fail
        self.release = records.release
        self.begin = records.begin
        self.unavailable = records.unavailable

    def cache_on(self) -> bool:
        """Whether a call reads and fills the fast path now."""
        return self.cache is not None and (
            self.mode != "auto" or (self._hot_until > 0 and time.monotonic() < self._hot_until))

    def prefetch(self, call: Call, key: GuardKey) -> None:
        """Queue the cache read of `key` in the call's read round (while the fast path is
        on), for `claim` to use."""
        if self.cache_on():
            arrived: list[CachedResult | None] = []
            call.slots[self] = arrived
            self.cache.get_later(call.reads, key.namespace, key.value, arrived.append)

    def claim(self, call: Call, key: GuardKey, *, owner: str, lease_seconds: float,
              ttl_seconds: float) -> ClaimResult:
        """Claim `key` for `owner` (`IdempotencyBackend.claim`); a cached succeeded record
        answers first, as a `CacheHit`.

        Raises:
            StoreUnavailable, StoreRejected, StorageError: from the records.
        """
        if self.cache is not None:
            arrived = call.slots.pop(self, None)  # the prefetched read, if there was one
            cached = (arrived[0] if arrived
                      else self.cache.get(key.namespace, key.value) if self.cache_on()
                      else None)
            if cached is not None:
                if cached.fingerprint == key.fingerprint:
                    self._replayed()
                return CacheHit(claim=None, attempt=0, state=SUCCEEDED,
                                fingerprint=cached.fingerprint, result=cached.result,
                                error=None, task_id=cached.task_id, lease_owner=None,
                                lease_remaining_seconds=None)
        found = self.records.claim(
            task_name=key.namespace, key=key.value, fingerprint=key.fingerprint, owner=owner,
            task_id=call.task_id, lease_seconds=lease_seconds, ttl_seconds=ttl_seconds,
        )
        if found.claim is not None:
            self._fresh_in_a_row += 1
            if self._fresh_in_a_row >= HOT_FRESH_CALLS:
                self._hot_until = 0.0
        elif found.state == SUCCEEDED and found.fingerprint == key.fingerprint:
            self._replayed()
            # Warm the fast path so the next duplicate costs one Redis round trip.
            ttl = min(found.expires_in_seconds, self.ttl_seconds)
            if self.cache is not None and ttl > 0:
                self._fill(call, key, canonical_json(found.result), found.task_id, ttl)
        return found

    def complete(self, call: Call, key: GuardKey, claim: Claim, result_json: str,
                 ttl_seconds: float) -> bool:
        """Record success (`IdempotencyBackend.complete`), then `succeeded`; False when the
        claim was taken over (stale).

        Raises:
            StoreUnavailable, StoreRejected, StorageError: from the records.
        """
        done = self.records.complete(claim, result_json, ttl_seconds)
        if done and self.cache_on():
            self._fill(call, key, result_json, call.task_id, self.ttl_seconds)
        return done

    def succeeded(self, call: Call, key: GuardKey, result_json: str) -> None:
        """`key`'s record holds `result_json` now: cache it while the fast path is on."""
        if self.cache_on():
            self._fill(call, key, result_json, call.task_id, self.ttl_seconds)

    def _fill(self, call: Call, key: GuardKey, result_json: str, task_id: str | None,
              ttl_seconds: float) -> None:
        assert self.cache is not None
        self.cache.put_later(call.writes, key.namespace, key.value, fingerprint=key.fingerprint,
                             result_json=result_json, task_id=task_id, ttl_seconds=ttl_seconds)

    def _replayed(self) -> None:
        self._hot_until = time.monotonic() + HOT_SECONDS
        self._fresh_in_a_row = 0

    # -- the operator's side ---------------------------------------------------------------
    def purge(self, task_name: str, key: str, *, force: bool = False) -> bool:
        """Delete one record and its cached copy so the key runs again (an open claim only
        with `force`); True when a record was deleted."""
        deleted = self.records.purge(task_name, key, force=force)
        if self.cache is not None:
            self.cache.forget(task_name, key)
        return deleted


def cached_backend(stores: Stores, records: IdempotencyBackend | None = None, *,
                   cache: bool | str = True, cache_ttl_seconds: float = DEFAULT_CACHE_TTL_SECONDS,
                   **postgres: Any) -> CachedBackend:
    """`records` (None: `backend_for(**postgres)` of `stores`, or memory) behind the Redis
    fast path of `stores` (none in memory stores)."""
    if records is None:
        records = stores.backend("idempotency", partial(backend_for, **postgres),
                                 memory=MemoryIdempotencyBackend,
                                 variant=tuple(sorted(postgres.items())))
    found = stores.backend("idempotency cache", lambda real: ResultCache(real.redis),
                           memory=lambda: None)
    return CachedBackend(records, found, mode=cache, ttl_seconds=cache_ttl_seconds)
