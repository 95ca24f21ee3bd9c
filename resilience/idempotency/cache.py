"""Redis fast path: finished keys cached for a short while, one GET for a duplicate.

Cached for `IdempotencyConfig.cache_ttl_seconds` (10 minutes by default), not for the
record's TTL: duplicates mostly arrive within minutes, and a day of keys at a high job rate
would fill Redis with copies of what PostgreSQL already holds.

Not a backend of the records but a hint in front of any of them: the backend stays the
truth, so a miss (flushed Redis, evicted key, Redis down) falls through to the claim, which
finds the record and replays it from there. Only succeeded records are cached; in-progress
and failed ones always go to the backend. Reads and fills join the call's Redis rounds
(`resilience.batch.for_client`): one round trip for every guard's reads, one for the writes.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from resilience.batch import for_client
from resilience.connections import wrap_store_errors
from resilience.keys import redis_key, stored_keys

if TYPE_CHECKING:
    import redis

    from resilience.pipeline import Rounds
    from resilience.stores import Stores

logger = logging.getLogger("resilience.idempotency")

NAMESPACE = "resilience:idempotency"


@dataclass(frozen=True)
class CachedResult:
    """A succeeded record as cached: argument fingerprint, result, original task id."""

    fingerprint: str
    result: Any
    task_id: str | None


def cache_key(task_name: str, key: str) -> str:
    """The Redis key caching `task_name`'s record of `key`: the guard key `task:key`,
    encoded by `resilience.keys.redis_key` (no length or character limit)."""
    return redis_key(NAMESPACE, f"{task_name}:{key}")


class ResultCache:
    """Reads and writes cached results; every Redis error is logged and treated as a miss."""

    def __init__(self, client: redis.Redis) -> None:
        self.client = client

    def get(self, task_name: str, key: str) -> CachedResult | None:
        """The cached result of `key`, or None (miss, or Redis unavailable)."""
        try:
            raw = self.client.get(cache_key(task_name, key))
        except Exception as exc:  # noqa: BLE001 - the cache is optional; PG is the truth
            logger.warning("idempotency cache read failed, using PostgreSQL: %s", exc)
            return None
        return self.parse(raw)

    def get_later(
        self, rounds: Rounds, task_name: str, key: str, then: Callable[[CachedResult | None], None]
    ) -> None:
        """Queue the read of `key` in the call's read round; `then` gets what `get` would."""

        def parsed(reply: Any) -> None:
            if isinstance(reply, BaseException):
                logger.warning("idempotency cache read failed, using PostgreSQL: %s", reply)
                then(None)
            else:
                then(self.parse(reply))

        for_client(rounds, self.client).command("GET", cache_key(task_name, key), then=parsed)

    @staticmethod
    def parse(raw: Any) -> CachedResult | None:
        """A cached payload as a `CachedResult`; None for a miss or an unreadable value."""
        if raw is None:
            return None
        try:
            value = json.loads(raw)
            return CachedResult(value["f"], value["r"], value.get("t"))
        except (ValueError, KeyError, TypeError):
            return None

    def put_later(
        self,
        rounds: Rounds,
        task_name: str,
        key: str,
        *,
        fingerprint: str,
        result_json: str,
        task_id: str | None,
        ttl_seconds: float,
    ) -> None:
        """Cache a succeeded record for `ttl_seconds` (the guard passes its cache TTL,
        never more than the record has left), queued in the call's write round with its
        other after-run writes."""

        def done(reply: Any) -> None:
            if isinstance(reply, BaseException):  # a missed fill costs one PG read later
                logger.warning("idempotency cache write failed: %s", reply)

        # The result is already canonical JSON: splice it in rather than parse and re-dump.
        payload = f'{{"f":{json.dumps(fingerprint)},"t":{json.dumps(task_id)},"r":{result_json}}}'
        for_client(rounds, self.client).command(
            "SET",
            cache_key(task_name, key),
            payload,
            "PX",
            max(1, int(ttl_seconds * 1000)),
            then=done,
        )

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


class NoResultCache:
    """The fast path of stores without Redis (`resilience.stores.MemoryStores`): every read
    misses, nothing is kept; the records themselves answer a duplicate."""

    def get(self, task_name: str, key: str) -> CachedResult | None:
        return None

    def get_later(
        self, rounds: Rounds, task_name: str, key: str, then: Callable[[CachedResult | None], None]
    ) -> None:
        then(None)

    def put_later(self, rounds: Rounds, task_name: str, key: str, **_: Any) -> None:
        return None

    def forget(self, task_name: str, key: str) -> None:
        return None

    def size(self) -> int:
        return 0


def result_cache_for(stores: Stores) -> ResultCache | NoResultCache:
    """The fast path on `stores`: their Redis, or none in memory."""
    return stores.backend("idempotency cache", lambda found: ResultCache(found.redis()),
                          memory=NoResultCache)
