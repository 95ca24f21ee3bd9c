"""Redis limiter backend: one Lua script per decision, on Redis server time.

Every worker sees the same state and every decision is atomic, so limits hold across the
fleet, not per process (Celery's own `rate_limit` is per worker).
"""

from __future__ import annotations

import uuid
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from resilience.errors import StorageError, StoreUnavailable
from resilience.ratelimit.algorithms import Decision

if TYPE_CHECKING:
    import redis

_HERE = Path(__file__).parent


def _lua(name: str) -> str:
    return (_HERE / name).read_text()


@contextmanager
def wrapped_errors(what: str, key: str) -> Iterator[None]:
    """Turn a native redis error into StorageError/StoreUnavailable naming the operation."""
    import redis as redis_lib

    try:
        yield
    except (redis_lib.ConnectionError, redis_lib.TimeoutError) as exc:
        raise StoreUnavailable(f"{what} {key!r}: Redis unreachable: {exc}", key=key,
                               cause=repr(exc)) from exc
    except redis_lib.RedisError as exc:
        raise StorageError(f"{what} {key!r}: Redis error: {exc}", key=key,
                           cause=repr(exc)) from exc


class RedisBackend:
    """Limiter state in Redis.

    Args:
        client: a Redis client, or a callable returning the process's client (fork-safe).
        prefix: key prefix of all limiter state.
    """

    #: Lua source, registered once per client.
    GCRA = _lua("gcra.lua")
    WINDOW = _lua("window.lua")
    LEASE_ACQUIRE = _lua("lease_acquire.lua")

    def __init__(
        self, client: redis.Redis | Callable[[], redis.Redis], *, prefix: str = "resilience:limits"
    ) -> None:
        self._client = client
        self.prefix = prefix
        self._scripts: weakref.WeakKeyDictionary[Any, dict[str, Any]] = (
            weakref.WeakKeyDictionary()
        )

    @property
    def client(self) -> redis.Redis:
        return self._client() if callable(self._client) else self._client  # type: ignore[return-value]

    def _script(self, name: str) -> Any:
        client = self.client
        scripts = self._scripts.get(client)
        if scripts is None:
            scripts = {
                "gcra": client.register_script(self.GCRA),
                "window": client.register_script(self.WINDOW),
                "lease": client.register_script(self.LEASE_ACQUIRE),
            }
            self._scripts[client] = scripts
        return scripts[name]

    def key(self, kind: str, key: str) -> str:
        return f"{self.prefix}:{kind}:{key}"

    def gcra(self, key: str, *, interval_seconds: float, burst: int, cost: int = 1,
             caller: str | None = None) -> Decision:
        full = self.key("gcra", key)
        with wrapped_errors("rate limit", full):
            allowed, retry, now = self._script("gcra")(
                keys=[full, f"{full}:waiting"],
                args=[round(interval_seconds * 1e6), burst, cost, caller or uuid.uuid4().hex],
            )
        return Decision(bool(int(allowed)), int(retry) / 1e6, int(now) / 1e6)

    def sliding_window(self, key: str, *, limit: int, window_seconds: float,
                       caller: str | None = None) -> Decision:
        full = self.key("window", key)
        with wrapped_errors("rate limit", full):
            allowed, retry, now, used = self._script("window")(
                keys=[full, f"{full}:waiting"],
                args=[limit, round(window_seconds * 1e6), uuid.uuid4().hex,
                      caller or uuid.uuid4().hex],
            )
        return Decision(bool(int(allowed)), int(retry) / 1e6, int(now) / 1e6, int(used))

    def acquire_lease(
        self, key: str, *, holder: str, limit: int, lease_seconds: float
    ) -> Decision:
        full = self.key("concurrency", key)
        with wrapped_errors("concurrency limit", full):
            allowed, retry, now, used = self._script("lease")(
                keys=[full], args=[limit, round(lease_seconds * 1e6), holder]
            )
        return Decision(bool(int(allowed)), int(retry) / 1e6, int(now) / 1e6, int(used))

    def release_lease(self, key: str, *, holder: str) -> bool:
        full = self.key("concurrency", key)
        with wrapped_errors("concurrency limit release", full):
            # ZREM alone is atomic; an expired lease may already be gone (reclaimed).
            return bool(self.client.zrem(full, holder))

    def holders(self, key: str) -> dict[str, float]:
        full = self.key("concurrency", key)
        with wrapped_errors("concurrency limit holders", full):
            seconds, micros = self.client.time()
            now = seconds * 1_000_000 + micros
            entries = self.client.zrangebyscore(full, now, "+inf", withscores=True)
        return {holder: score / 1e6 for holder, score in entries}

    # -- inspection (admin views) ---------------------------------------------------------
    def keys(self, kind: str) -> list[str]:
        """Limiter keys of `kind` (gcra, window, concurrency) with state in Redis."""
        pattern = f"{self.prefix}:{kind}:*"
        start = len(self.prefix) + len(kind) + 2
        with wrapped_errors("scan", pattern):
            found = {
                name[start:] for name in self.client.scan_iter(match=pattern, count=500)
                if not name.endswith(":waiting")
            }
        return sorted(found)

    def rate_state(self, kind: str, key: str) -> dict[str, float]:
        """Figures of one rate limiter: GCRA's TAT lead or the window's grant count, waiters."""
        full = self.key(kind, key)
        with wrapped_errors("rate limit state", full):
            seconds, micros = self.client.time()
            now = seconds * 1_000_000 + micros
            waiting = self.client.zcard(f"{full}:waiting")
            if kind == "gcra":
                tat = float(self.client.get(full) or now)
                return {"ahead_seconds": max(0.0, (tat - now) / 1e6), "waiting": waiting}
            return {"in_window": self.client.zcard(full), "waiting": waiting}
