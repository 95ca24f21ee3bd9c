"""Connections to the shared stores (Redis, PostgreSQL), one set per process.

Guards reach the stores through the `Stores` registered on the Celery app, so `resilience`
works with any app. Clients are created lazily and re-created after a fork: a prefork
child must never reuse its parent's sockets.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from resilience.errors import ConfigurationError

if TYPE_CHECKING:
    import redis
    from celery import Celery
    from sqlalchemy.engine import Engine

_ATTRIBUTE = "resilience_stores"


class Stores:
    """Where guard state lives: one Redis, one PostgreSQL, and the Redlock nodes.

    Args:
        redis_url: shared guard state (breakers, budgets, limits, fast paths).
        database_url: durable state (idempotency records, fencing counters, advisory locks).
        redlock_urls: independent Redis nodes for Redlock (3 or more for a real quorum).
    """

    def __init__(
        self,
        *,
        redis_url: str,
        database_url: str,
        redlock_urls: Sequence[str] = (),
        socket_timeout_seconds: float = 5.0,
    ) -> None:
        if not redis_url.startswith(("redis://", "rediss://", "unix://")):
            raise ConfigurationError(
                f"redis_url must start with redis://, rediss:// or unix://, got {redis_url!r}"
            )
        if not database_url.startswith(("postgresql", "postgres://")):
            raise ConfigurationError(
                "database_url must be a PostgreSQL URL (postgresql://user@host:port/db), "
                f"got scheme {database_url.split(':', 1)[0]!r}"
            )
        self.redis_url = redis_url
        self.database_url = _sqlalchemy_url(database_url)
        self.redlock_urls = tuple(redlock_urls)
        self.socket_timeout_seconds = socket_timeout_seconds
        self._lock = threading.Lock()
        self._pid = -1
        self._cache: dict[str, Any] = {}

    def _per_process(self) -> dict[str, Any]:
        if self._pid != os.getpid():
            with self._lock:
                if self._pid != os.getpid():
                    engine = self._cache.get("engine")
                    if engine is not None:
                        # close=False: never touch the parent's connections from the child.
                        engine.dispose(close=False)
                    self._cache = {}
                    self._pid = os.getpid()
        return self._cache

    def redis(self) -> redis.Redis:
        """The process's client for the shared Redis (decoded responses)."""
        cache = self._per_process()
        client = cache.get("redis")
        if client is None:
            import redis as redis_lib

            client = redis_lib.Redis.from_url(
                self.redis_url,
                decode_responses=True,
                socket_timeout=self.socket_timeout_seconds,
                socket_connect_timeout=self.socket_timeout_seconds,
                health_check_interval=30,
            )
            cache["redis"] = client
        return client

    def redlock_clients(self) -> list[redis.Redis]:
        """One client per Redlock node, short timeouts so a dead node costs little."""
        cache = self._per_process()
        clients = cache.get("redlock")
        if clients is None:
            import redis as redis_lib

            clients = [
                redis_lib.Redis.from_url(
                    url, decode_responses=True, socket_timeout=0.5, socket_connect_timeout=0.5
                )
                for url in self.redlock_urls
            ]
            cache["redlock"] = clients
        return clients

    def engine(self) -> Engine:
        """The process's SQLAlchemy engine for the durable store."""
        cache = self._per_process()
        engine = cache.get("engine")
        if engine is None:
            from sqlalchemy import create_engine

            engine = create_engine(
                self.database_url,
                pool_pre_ping=True,
                pool_size=5,
                max_overflow=5,
                connect_args={"connect_timeout": int(max(1, self.socket_timeout_seconds))},
            )
            cache["engine"] = engine
        return engine


def _sqlalchemy_url(url: str) -> str:
    """Pin the psycopg2 driver so `postgresql://` and `postgres://` both work."""
    for prefix in ("postgresql+psycopg2://", "postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+psycopg2://" + url[len(prefix) :]
    return url


def install(app: Celery, stores: Stores) -> Stores:
    """Register `stores` on `app` so guards of the app's tasks find them."""
    setattr(app, _ATTRIBUTE, stores)
    return stores


def stores_for(app: Celery) -> Stores:
    """The stores registered on `app`.

    Raises:
        ConfigurationError: `install()` was never called for this app.
    """
    stores = getattr(app, _ATTRIBUTE, None)
    if stores is None:
        raise ConfigurationError(
            f"no stores configured for Celery app {app.main!r}: call "
            "resilience.stores.install(app, Stores(redis_url=..., database_url=...))"
        )
    return stores
