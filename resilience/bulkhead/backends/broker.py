"""Queue depth from the broker: Redis (atomic admission script) or RabbitMQ (passive declare).

Redis: kombu's Redis transport keeps one list per priority step (`queue`, `queue\\x06\\x163`,
`queue\\x06\\x166`, `queue\\x06\\x169`) and pushes with LPUSH; messages a worker has reserved
(prefetched, ETA/countdown) sit in its unacked hash and are not counted. The admission
script reads every list plus the in-flight reservations in one atomic step, so producers
admitted through it never push the queue past the limit (overshoot 0); a reservation whose
producer died mid-publish is freed after its TTL.

Bounded publish (Redis, one round trip): when the app's broker transport does the guards'
checks in the push (`resilience.publish`), the guard puts the limit in the message's
`BOUND_HEADER` instead of reserving, so the bound is exact and a guarded `.delay()` costs
the one round trip a plain one does. A full queue raises `QueueFull` from the publish.

RabbitMQ: a passive `queue_declare` returns the ready count; the check and the publish
are two steps, so N concurrent producers can overshoot by at most N - 1.
"""

from __future__ import annotations

import os
import threading
import uuid
import weakref
from typing import TYPE_CHECKING, Any

from resilience.bulkhead.backends import Admission
from resilience.errors import StorageError
from resilience.keys import redis_key
from resilience.scripts import LuaScript
from resilience.stores import translate_store_error

if TYPE_CHECKING:
    import redis
    from celery import Celery

#: kombu's Redis transport defaults (kombu.transport.redis.PRIORITY_STEPS, Channel.sep).
PRIORITY_STEPS = (0, 3, 6, 9)
PRIORITY_SEPARATOR = "\x06\x16"

RESERVATIONS_PREFIX = "resilience:admission"


def _wrap(what: str, exc: Exception) -> StorageError:
    return translate_store_error(exc, f"{what} (broker)")


class RedisBrokerDepth:
    """Depth and atomic admission on a Redis broker.

    Args:
        broker_url: the Celery broker URL (redis://host:port/db).
        transport_options: the app's `broker_transport_options` (priority steps, key prefix).
    """

    overshoot_bound = "0 for producers admitted through this guard (reservation TTL aside)"
    ADMIT = LuaScript.load(__file__, "admit.lua")

    def __init__(self, broker_url: str, transport_options: dict[str, Any] | None = None,
                 *, bounded_publish: bool = False) -> None:
        options = dict(transport_options or {})
        self.broker_url = broker_url
        #: The transport enforces `BOUND_HEADER` itself (one round trip, no reservation).
        self.bounded_publish = bounded_publish
        self.priority_steps = tuple(options.get("priority_steps") or PRIORITY_STEPS)
        self.separator = options.get("sep", PRIORITY_SEPARATOR)
        self.prefix = options.get("global_keyprefix", "")
        self._reservation_keys: dict[str, str] = {}
        self._lock = threading.Lock()
        self._pid = -1
        self._client: redis.Redis | None = None

    def client(self) -> redis.Redis:
        """The process's broker client (re-created after a fork)."""
        if self._pid != os.getpid() or self._client is None:
            with self._lock:
                if self._pid != os.getpid() or self._client is None:
                    import redis as redis_lib

                    self._client = redis_lib.Redis.from_url(
                        self.broker_url, decode_responses=True,
                        socket_timeout=5, socket_connect_timeout=5,
                    )
                    self._pid = os.getpid()
        return self._client

    def lists(self, queue: str) -> list[str]:
        """The Redis lists holding `queue`'s messages, one per priority step."""
        names = []
        for step in self.priority_steps:
            name = f"{queue}{self.separator}{step}" if step else queue
            names.append(self.prefix + name)
        return names

    def reservations_key(self, queue: str) -> str:
        """`<global_keyprefix>resilience:admission:{<queue>}` (see `resilience.keys`); the
        queue's own lists keep the names kombu gives them."""
        return redis_key(self.prefix + RESERVATIONS_PREFIX, queue)

    def depth(self, queue: str) -> int:
        try:
            with self.client().pipeline(transaction=False) as pipe:
                for name in self.lists(queue):
                    pipe.llen(name)
                return sum(int(size) for size in pipe.execute())
        except Exception as exc:
            raise _wrap(f"depth of queue {queue!r}", exc) from exc

    def bound(self, queue: str, limit: int) -> dict[str, Any]:
        """The `BOUND_HEADER` value asking the transport to keep `queue` within `limit`."""
        key = self._reservation_keys.get(queue)
        if key is None:
            key = self._reservation_keys[queue] = self.reservations_key(queue)
        return {"limit": limit, "queue": queue, "reservations": key}

    def try_admit(self, queue: str, *, limit: int, reservation: str,
                  reservation_ttl_seconds: float) -> Admission:
        client = self.client()
        try:
            admitted, depth, reserved = self.ADMIT(
                client,
                keys=[self.reservations_key(queue), *self.lists(queue)],
                args=[limit, reservation, round(reservation_ttl_seconds * 1e6)],
            )
        except Exception as exc:
            raise _wrap(f"admission to queue {queue!r}", exc) from exc
        return Admission(bool(int(admitted)), int(depth), int(reserved))

    def release(self, queue: str, reservation: str) -> None:
        try:
            self.client().zrem(self.reservations_key(queue), reservation)
        except Exception as exc:
            raise _wrap(f"release of admission to {queue!r}", exc) from exc

    def reserved(self, queue: str) -> int:
        """In-flight reservations (admitted publishes not yet confirmed)."""
        try:
            client = self.client()
            seconds, micros = client.time()
            return int(client.zcount(self.reservations_key(queue),
                                     seconds * 1_000_000 + micros, "+inf"))
        except Exception as exc:
            raise _wrap(f"reservations of queue {queue!r}", exc) from exc


class AmqpBrokerDepth:
    """Depth on RabbitMQ by passive queue_declare; admission is check-then-publish."""

    overshoot_bound = "concurrent producers - 1 (check and publish are two steps)"

    def __init__(self, app: Celery) -> None:
        self.app = app

    def depth(self, queue: str) -> int:
        try:
            with self.app.connection_for_write() as connection:
                _, count, _ = connection.default_channel.queue_declare(queue, passive=True)
                return int(count)
        except Exception as exc:
            raise StorageError(f"depth of queue {queue!r}: broker error: {exc}",
                               cause=repr(exc)) from exc

    def try_admit(self, queue: str, *, limit: int, reservation: str,
                  reservation_ttl_seconds: float) -> Admission:
        depth = self.depth(queue)
        return Admission(depth < limit, depth)

    def release(self, queue: str, reservation: str) -> None:
        """Nothing reserved on RabbitMQ."""


_BACKENDS: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()


def depth_backend_for(app: Celery) -> RedisBrokerDepth | AmqpBrokerDepth:
    """The depth backend matching `app`'s broker, one per app."""
    backend = _BACKENDS.get(app)
    if backend is None:
        url = app.conf.broker_url or ""
        if url.startswith(("redis://", "rediss://", "unix://")):
            from resilience.publish import guarded_publish

            backend = RedisBrokerDepth(url, app.conf.broker_transport_options,
                                       bounded_publish=guarded_publish(app))
        else:
            backend = AmqpBrokerDepth(app)
        _BACKENDS[app] = backend
    return backend


def new_reservation() -> str:
    return uuid.uuid4().hex
