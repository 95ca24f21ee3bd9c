"""Guarded publish: enqueue guards that let the broker transport do their check in the push.

A guarded `.delay()` used to cost a round trip per enqueue guard (the unique key, the tier's
admission reservation and its release) on top of the publish. When the app's broker
transport declares `guarded_publish` (the platform's `jobs.broker.Transport` does), those
guards put what they need in message headers instead, and the transport runs `publish.lua`:
the unique key, the depth bound and the LPUSH in one script. A guarded `.delay()` then costs
the round trip a plain one does, and both checks are exact (nothing can slip in between).

The transport stores a copy of the message without the headers (`guard_requests`), never
changing the caller's: kombu retries a publish after a connection error with the same
headers (`publish(retry=True)`, Celery's default), so every attempt runs the checks. It
answers a refusal by raising from the publish: `QueueFull` (the bound) or `DuplicateJob`
(the unique key, with the holder's task id). The guard that asked turns it into its
policy in `give_back` (see `resilience.pipeline.EnqueuePipeline`). Other transports ignore
nothing: the guards see `guarded_publish(app)` is False and keep their own round trips.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any

from resilience.errors import DuplicateJob, QueueFull
from resilience.scripts import LuaScript

if TYPE_CHECKING:
    import redis
    from celery import Celery

#: Header of a bounded publish: {"limit": int, "queue": str, "reservations": key}.
BOUND_HEADER = "x-resilience-bound"
#: Header of a unique publish: {"key": str, "task_id": str, "ttl_ms": int}.
UNIQUE_HEADER = "x-resilience-unique"
HEADERS = (BOUND_HEADER, UNIQUE_HEADER)

PUBLISH = LuaScript.load(__file__, "publish.lua")

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
            from kombu.utils.imports import symbol_by_name

            supported = bool(getattr(symbol_by_name(transport), "guarded_publish", False))
        _SUPPORTED[app] = supported
    return supported


def broker_redis(app: Celery) -> redis.Redis:
    """The broker's Redis client of this process (where unique keys live with guarded publish)."""
    from resilience.bulkhead.backends.broker import depth_backend_for

    return depth_backend_for(app).client()  # type: ignore[union-attr]


def guard_requests(message: dict[str, Any]) -> tuple[dict[str, Any], Any, Any]:
    """Split a kombu message into what is stored and the guards' requests it carries.

    Returns `(stored, bound, unique)`: `stored` is `message` itself when it carries no
    request, else a copy whose headers lack them; `message` and its headers are never
    changed, so a retried publish of the same message asks again.
    """
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
    status, depth, reserved, holder = PUBLISH(
        client,
        keys=[target, bound["reservations"] if bound else target,
              unique["key"] if unique else target, *lists],
        args=[limit, payload, unique["task_id"] if unique else "",
              int(unique["ttl_ms"]) if unique else 0],
    )
    status = int(status)
    if status == 2:
        holder = holder.decode() if isinstance(holder, bytes) else str(holder)
        raise DuplicateJob(
            f"a job with this key is already queued or running (task id {holder})",
            key=unique["key"] if unique else None, task_id=holder,
        )
    if status == 0:
        queue = str(bound.get("queue", target)) if bound else target
        raise QueueFull(
            f"queue {queue!r} is full: {int(depth)} messages waiting (+{int(reserved)} being "
            f"published), limit {limit}",
            queue=queue, depth=int(depth), reserved=int(reserved), limit=limit,
        )
