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

RabbitMQ: when the tier queue is declared with `x-max-length` at the limit and
`x-overflow: reject-publish`, and the connection uses publisher confirms (the platform
declares both: `jobs.platform.queue_arguments`), the broker itself refuses the publish that
would pass the limit: the guard adds nothing to the publish (no round trip of its own) and
turns the nack (`amqp.exceptions.MessageNacked`) into `QueueFull`, so the bound is exact.
A queue without those arguments (or a task limit that differs from the queue's) falls back
to a passive `queue_declare` (ready count) before publishing: two steps, so N concurrent
producers can overshoot by at most N - 1. RabbitMQ's bound holds for every publish,
republishes too; `GuardedTask` sends a refused republish to the outbox (nothing is lost).
"""

from __future__ import annotations

import os
import threading
import uuid
import weakref
from typing import TYPE_CHECKING, Any

from resilience.bulkhead.backends import Admission

from resilience.connections import translate_store_error
from resilience.errors import QueueFull, StorageError
from resilience.keys import redis_key
from resilience.scripts import LuaScript

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

    def transport_bound(self, queue: str, limit: int) -> dict[str, Any] | None:
        """The `BOUND_HEADER` value asking the transport to keep `queue` within `limit`;
        None when the transport does not bound publishes (the guard reserves instead)."""
        if not self.bounded_publish:
            return None
        key = self._reservation_keys.get(queue)
        if key is None:
            key = self._reservation_keys[queue] = self.reservations_key(queue)
        return {"limit": limit, "queue": queue, "reservations": key}

    def refusal(self, error: BaseException, queue: str, limit: int) -> QueueFull | None:
        """The transport's own refusal (`QueueFull` from `publish.lua`), else None."""
        return error if isinstance(error, QueueFull) else None

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
    """Depth on RabbitMQ by passive queue_declare; the bound is the queue's own
    `x-max-length` with `reject-publish` and publisher confirms (see the module docstring),
    else check-then-publish."""

    overshoot_bound = ("0 where the queue is declared with x-max-length = the limit and "
                       "reject-publish under publisher confirms; else concurrent producers - 1")

    def __init__(self, app: Celery) -> None:
        self.app = app
        self._limits: dict[str, int | None] = {}

    def queue_limit(self, queue: str) -> int | None:
        """The `x-max-length` RabbitMQ enforces on `queue` by refusing publishes (declared
        with `reject-publish`, published with confirms), or None."""
        if queue not in self._limits:
            self._limits[queue] = None
            options = self.app.conf.broker_transport_options or {}
            declared = {q.name: q for q in (self.app.conf.task_queues or ())}
            arguments = getattr(declared.get(queue), "queue_arguments", None) or {}
            if (options.get("confirm_publish") and arguments.get("x-max-length") is not None
                    and arguments.get("x-overflow") == "reject-publish"):
                self._limits[queue] = int(arguments["x-max-length"])
        return self._limits[queue]

    def transport_bound(self, queue: str, limit: int) -> dict[str, Any] | None:
        """`{}` (nothing to add to the message) when RabbitMQ refuses publishes past
        exactly `limit`; None otherwise (the guard checks the depth first)."""
        return {} if self.queue_limit(queue) == limit else None

    def refusal(self, error: BaseException, queue: str, limit: int) -> QueueFull | None:
        """A nacked publish to a queue RabbitMQ bounds is a full queue, else None."""
        if isinstance(error, QueueFull):
            return error
        if self.queue_limit(queue) is None or not _nacked(error):
            return None
        return QueueFull(
            f"queue {queue!r} is full: RabbitMQ refused the publish (x-max-length "
            f"{self.queue_limit(queue)}, reject-publish)",
            queue=queue, depth=self.queue_limit(queue), reserved=0, limit=limit,
        )

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


def _nacked(error: BaseException) -> bool:
    try:
        from amqp.exceptions import MessageNacked
    except ImportError:  # py-amqp is kombu's dependency; absent, nothing was nacked
        return False
    # kombu counts a nack as a recoverable connection error: its publish retries, then
    # raises its own OperationalError from the nack.
    seen: BaseException | None = error
    for _ in range(5):
        if seen is None:
            return False
        if isinstance(seen, MessageNacked):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


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
