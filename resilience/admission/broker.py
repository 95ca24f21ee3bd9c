"""The broker as admission's store: queue depth, reservations, and the guarded publish.

Redis: `admit.lua` sums kombu's priority lists and the in-flight reservations in one atomic
step (overshoot 0). With a transport that declares `guarded_publish` (`jobs.broker`), the
guards put the tier's bound (`BOUND_HEADER`) and `@unique`'s key (`UNIQUE_HEADER`) in
headers and `publish.lua` checks both in the push itself; the stored message lacks them
(`guard_requests`), the caller's never changes (kombu retries with the same headers).
RabbitMQ: a queue declared with `x-max-length` and `reject-publish`, with publisher
confirms, refuses the publish itself (a nack becomes `QueueFull`); otherwise a passive
`queue_declare` before publishing (N producers overshoot by at most N - 1).
See docs/overload.md, "Admission under concurrent producers".
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from kombu.utils.imports import symbol_by_name

from resilience.connections import translate_store_error
from resilience.connections.redis import client_for
from resilience.errors import DuplicateJob, QueueFull, StorageError
from resilience.keys import redis_key
from resilience.scripts import LuaScript

if TYPE_CHECKING:
    import redis
    from celery import Celery

#: kombu's Redis transport defaults (kombu.transport.redis.PRIORITY_STEPS, Channel.sep).
PRIORITY_STEPS = (0, 3, 6, 9)
PRIORITY_SEPARATOR = "\x06\x16"

RESERVATIONS_PREFIX = "resilience:admission"
#: Header of a bounded publish: {"limit": int, "queue": str, "reservations": key}.
BOUND_HEADER = "x-resilience-bound"
#: Header of a unique publish: {"key": str, "task_id": str, "ttl_ms": int}.
UNIQUE_HEADER = "x-resilience-unique"
HEADERS = (BOUND_HEADER, UNIQUE_HEADER)


@dataclass(frozen=True)
class Admission:
    """One admission decision: `depth` messages waiting plus `reserved` being published."""

    admitted: bool
    depth: int
    reserved: int = 0


class DepthBackend(Protocol):
    """Reads queue depth and admits publishes against a limit."""

    def depth(self, queue: str) -> int:
        """Messages waiting in `queue`."""

    def try_admit(self, queue: str, *, limit: int, reservation: str,
                  reservation_ttl_seconds: float) -> Admission:
        """Admit one publish if depth plus in-flight reservations stays within `limit`."""

    def release(self, queue: str, reservation: str) -> None:
        """The reserved publish finished (it is in the queue now, or it failed)."""

    def transport_bound(self, queue: str, limit: int) -> dict[str, Any] | None:
        """The `BOUND_HEADER` value (`{}`: none to send) when the broker keeps `queue`
        within `limit` itself as it takes the publish; None: `try_admit` / `release`."""

    def refusal(self, error: BaseException, queue: str, limit: int) -> Exception | None:
        """The publish error as `QueueFull` when the broker refused a full queue, else None."""


def _wrap(what: str, exc: Exception) -> StorageError:
    return translate_store_error(exc, f"{what} (broker)")


class RedisBrokerDepth:
    """Depth and atomic admission on a Redis broker.

    Args:
        broker_url: the Celery broker URL (redis://host:port/db).
        transport_options: the app's `broker_transport_options` (priority steps, key prefix).
    """

    ADMIT = LuaScript.load(__file__, "admit.lua")
    PUBLISH = LuaScript.load(__file__, "publish.lua")

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

    def client(self) -> redis.Redis:
        """The process's broker client (`client_for`: a forked child makes its own)."""
        return client_for(self.broker_url, decode_responses=True, socket_timeout=5,
                          socket_connect_timeout=5)

    def lists(self, queue: str) -> list[str]:
        """The Redis lists holding `queue`'s messages, one per priority step."""
        return [self.prefix + (f"{queue}{self.separator}{step}" if step else queue)
                for step in self.priority_steps]

    def reservations_key(self, queue: str) -> str:
        """`<global_keyprefix>resilience:admission:{<queue>}` (see `resilience.keys`)."""
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
                client, keys=[self.reservations_key(queue), *self.lists(queue)],
                args=[limit, reservation, round(reservation_ttl_seconds * 1e6)])
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
    """Depth on RabbitMQ by passive queue_declare; the bound is the queue's own (see the
    module docstring), else check-then-publish."""

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
            queue=queue, depth=self.queue_limit(queue), reserved=0, limit=limit)

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
            backend = RedisBrokerDepth(url, app.conf.broker_transport_options,
                                       bounded_publish=guarded_publish(app))
        else:
            backend = AmqpBrokerDepth(app)
        _BACKENDS[app] = backend
    return backend


_SUPPORTED: weakref.WeakKeyDictionary[Any, bool] = weakref.WeakKeyDictionary()


def guarded_publish(app: Celery) -> bool:
    """Whether `app`'s broker transport runs the guards' checks in the push (cached)."""
    supported = _SUPPORTED.get(app)
    if supported is None:
        transport = app.conf.broker_transport
        url = app.conf.broker_url or ""
        supported = False
        # A transport class, or "module:Class"; kombu's aliases ("redis") never do.
        # A key prefix is not applied to the script's keys, so such a transport pushes the
        # plain way and the guards must keep their own round trips (jobs.broker does too).
        prefixed = bool((app.conf.broker_transport_options or {}).get("global_keyprefix"))
        if url.startswith(("redis://", "unix://")) and not prefixed and transport and (
                not isinstance(transport, str) or ":" in transport):
            supported = bool(getattr(symbol_by_name(transport), "guarded_publish", False))
        _SUPPORTED[app] = supported
    return supported


def broker_redis(app: Celery) -> redis.Redis:
    """The broker's Redis client of this process (where unique keys live with guarded publish)."""
    return depth_backend_for(app).client()  # type: ignore[union-attr]


def guard_requests(message: dict[str, Any]) -> tuple[dict[str, Any], Any, Any]:
    """`(stored, bound, unique)`: the guards' requests a kombu message carries, and what is
    stored: `message` itself without any, else a copy without them (`message` never
    changes, so a retried publish asks again)."""
    headers = message.get("headers")
    if not isinstance(headers, dict) or not any(header in headers for header in HEADERS):
        return message, None, None
    stored = {**message,
              "headers": {name: value for name, value in headers.items()
                          if name not in HEADERS}}
    return stored, headers.get(BOUND_HEADER), headers.get(UNIQUE_HEADER)


def push(client: redis.Redis, *, target: str, lists: list[str], payload: str,
         bound: dict[str, Any] | None = None, unique: dict[str, Any] | None = None) -> None:
    """LPUSH `payload` onto `target` if the unique key is free and the queue below its bound.

    The transport's half of a guarded publish; `lists` are all of the queue's lists.

    Raises:
        DuplicateJob: the unique key names a queued job (`task_id`); nothing was pushed.
        QueueFull: the queue is at its limit; nothing was pushed.
    """
    limit = int(bound["limit"]) if bound else 0
    status, depth, reserved, holder = RedisBrokerDepth.PUBLISH(
        client,
        keys=[target, bound["reservations"] if bound else target,
              unique["key"] if unique else target, *lists],
        args=[limit, payload, unique["task_id"] if unique else "",
              int(unique["ttl_ms"]) if unique else 0])
    status = int(status)
    if status == 2:
        holder = holder.decode() if isinstance(holder, bytes) else str(holder)
        raise DuplicateJob(
            f"a job with this key is already queued or running (task id {holder})",
            key=unique["key"] if unique else None, task_id=holder)
    if status == 0:
        queue = str(bound.get("queue", target)) if bound else target
        raise QueueFull(
            f"queue {queue!r} is full: {int(depth)} messages waiting (+{int(reserved)} being "
            f"published), limit {limit}",
            queue=queue, depth=int(depth), reserved=int(reserved), limit=limit)
