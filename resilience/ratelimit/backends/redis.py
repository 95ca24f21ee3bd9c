"""Redis limiter backend: one Lua script per decision, on Redis server time.

Every worker sees the same state and every decision is atomic, so limits hold across the
fleet, not per process (Celery's own `rate_limit` is per worker).

Key layout (`resilience.keys.redis_key`): `<prefix>:<kind>:{<key>}` is a limiter and
`<prefix>:<kind>:{<key>}:waiting` its waiting line, the key percent-encoded (or digested
when long) inside the hash tag: no key can name another key's waiting line, and a limiter
and its line share a Redis Cluster slot.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING

from resilience.keys import parse_redis_key, redis_key, redis_key_pattern
from resilience.ratelimit.algorithms import Decision
from resilience.scripts import LuaScript
from resilience.stores import wrap_store_errors

if TYPE_CHECKING:
    import redis


class RedisBackend:
    """Limiter state in Redis.

    Args:
        client: a Redis client, or a callable returning the process's client (fork-safe).
        prefix: key prefix of all limiter state (no `{` or `}`).
    """

    #: One Lua script per decision (see each file's contract comment).
    GCRA = LuaScript.load(__file__, "gcra.lua")
    WINDOW = LuaScript.load(__file__, "window.lua")
    LEASE_ACQUIRE = LuaScript.load(__file__, "lease_acquire.lua")

    def __init__(
        self, client: redis.Redis | Callable[[], redis.Redis], *, prefix: str = "resilience:limits"
    ) -> None:
        self._client = client
        self.prefix = prefix

    @property
    def client(self) -> redis.Redis:
        return self._client() if callable(self._client) else self._client  # type: ignore[return-value]

    def key(self, kind: str, key: str, *suffixes: str) -> str:
        """The Redis key of limiter `key` of `kind` (gcra, window, concurrency); its waiting
        line is that key plus `:waiting`."""
        return redis_key(f"{self.prefix}:{kind}", key, *suffixes)

    def gcra(self, key: str, *, interval_seconds: float, burst: int, cost: int = 1,
             caller: str | None = None) -> Decision:
        full = self.key("gcra", key)
        with wrap_store_errors("rate limit", key=key):
            allowed, retry, now = self.GCRA(
                self.client,
                keys=[full, f"{full}:waiting"],
                args=[round(interval_seconds * 1e6), burst, cost, caller or uuid.uuid4().hex],
            )
        return Decision(bool(int(allowed)), int(retry) / 1e6, int(now) / 1e6)

    def sliding_window(self, key: str, *, limit: int, window_seconds: float,
                       caller: str | None = None) -> Decision:
        full = self.key("window", key)
        with wrap_store_errors("rate limit", key=key):
            allowed, retry, now, used = self.WINDOW(
                self.client,
                keys=[full, f"{full}:waiting"],
                args=[limit, round(window_seconds * 1e6), uuid.uuid4().hex,
                      caller or uuid.uuid4().hex],
            )
        return Decision(bool(int(allowed)), int(retry) / 1e6, int(now) / 1e6, int(used))

    def acquire_lease(
        self, key: str, *, holder: str, limit: int, lease_seconds: float
    ) -> Decision:
        with wrap_store_errors("concurrency limit", key=key):
            allowed, retry, now, used = self.LEASE_ACQUIRE(
                self.client,
                keys=[self.key("concurrency", key)],
                args=[limit, round(lease_seconds * 1e6), holder],
            )
        return Decision(bool(int(allowed)), int(retry) / 1e6, int(now) / 1e6, int(used))

    def release_lease(self, key: str, *, holder: str) -> bool:
        with wrap_store_errors("concurrency limit release", key=key):
            # ZREM alone is atomic; an expired lease may already be gone (reclaimed).
            return bool(self.client.zrem(self.key("concurrency", key), holder))

    def holders(self, key: str) -> dict[str, float]:
        return self.holders_at(self.key("concurrency", key))

    # -- inspection (admin views) ---------------------------------------------------------
    def stored_keys(self, kind: str) -> dict[str, str]:
        """Limiters of `kind` (gcra, window, concurrency) with state in Redis: each key (as
        `resilience.keys.decode_key_part` shows it) and its Redis key."""
        namespace = f"{self.prefix}:{kind}"
        found = {}
        with wrap_store_errors("limiter scan", kind=kind):
            for name in self.client.scan_iter(match=redis_key_pattern(namespace), count=500):
                parsed = parse_redis_key(namespace, name)
                if parsed is not None and not parsed[1]:  # not a waiting line
                    found[parsed[0]] = name
        return found

    def keys(self, kind: str) -> list[str]:
        """Limiter keys of `kind` (gcra, window, concurrency) with state in Redis."""
        return sorted(self.stored_keys(kind))

    def holders_at(self, stored: str) -> dict[str, float]:
        """Live holders of the semaphore stored at Redis key `stored` (see `stored_keys`)."""
        with wrap_store_errors("concurrency limit holders", stored=stored):
            seconds, micros = self.client.time()
            now = seconds * 1_000_000 + micros
            entries = self.client.zrangebyscore(stored, now, "+inf", withscores=True)
        return {holder: score / 1e6 for holder, score in entries}

    def rate_state(self, kind: str, key: str) -> dict[str, float]:
        """Figures of one rate limiter: GCRA's TAT lead or the window's grant count, waiters."""
        return self.rate_state_at(kind, self.key(kind, key))

    def rate_state_at(self, kind: str, stored: str) -> dict[str, float]:
        """`rate_state` of the limiter stored at Redis key `stored` (see `stored_keys`)."""
        with wrap_store_errors("rate limit state", stored=stored):
            seconds, micros = self.client.time()
            now = seconds * 1_000_000 + micros
            waiting = self.client.zcard(f"{stored}:waiting")
            if kind == "gcra":
                tat = float(self.client.get(stored) or now)
                return {"ahead_seconds": max(0.0, (tat - now) / 1e6), "waiting": waiting}
            return {"in_window": self.client.zcard(stored), "waiting": waiting}
