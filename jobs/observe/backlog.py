"""What waits in the tier queues, read apart from the worker's consumer: `fresh_backlog` (on
a connection of its own: the consumer's may be wedged) and `oldest_ages` (Redis brokers
only). See docs/observe.md (The oldest message's age).
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

from redis.backoff import NoBackoff
from redis.retry import Retry

from resilience.admission.broker import RedisBrokerDepth, depth_backend_for
from resilience.connections import translate_store_error
from resilience.connections.redis import redis_from_url
from resilience.headers import finite_seconds

if TYPE_CHECKING:
    from celery import Celery

#: Header stamped on every publish: epoch seconds of the publish (the producer's clock).
PUBLISHED_AT_HEADER = "published_at"
REDIS_SCHEMES = ("redis://", "rediss://", "unix://")


def stamp_published_at(headers: dict[str, Any] | None = None, **_: Any) -> None:
    """`before_task_publish` receiver: stamp the message with the time it is published."""
    if isinstance(headers, dict):
        headers[PUBLISHED_AT_HEADER] = time.time()


def fresh_backlog(app: Celery, queues: Iterable[str], *, timeout_seconds: float) -> int | None:
    """Messages waiting in `queues`, read on a new broker connection closed afterwards; None
    when the broker cannot be reached within `timeout_seconds` (an outage, not a stall)."""
    queues = list(queues)
    url = app.conf.broker_url or ""
    try:
        if url.startswith(REDIS_SCHEMES):
            return _redis_backlog(app, url, queues, timeout_seconds)
        return _amqp_backlog(app, queues, timeout_seconds)
    except Exception:  # noqa: BLE001 - any failure to read it means: unreachable now
        return None


def per_list(client: Any, lists: dict[str, list[str]], command: str,
             *args: Any) -> dict[str, list[Any]]:
    """`command` on every list of `lists` (key -> lists) in one pipeline: key -> replies."""
    with client.pipeline(transaction=False) as pipe:
        for names in lists.values():
            for name in names:
                getattr(pipe, command)(name, *args)
        replies = iter(pipe.execute())
    return {key: [next(replies) for _ in names] for key, names in lists.items()}


@contextlib.contextmanager
def quick_redis(url: str, timeout_seconds: float) -> Iterator[Any]:
    """A Redis client of its own for one quick read, closed after: short timeouts and no
    retries (redis-py's default retries with backoff made a down Redis cost seconds)."""
    client = redis_from_url(url, socket_connect_timeout=timeout_seconds,
                            socket_timeout=timeout_seconds, retry=Retry(NoBackoff(), 0))
    try:
        yield client
    finally:
        client.close()


def _redis_backlog(app: Celery, url: str, queues: list[str], timeout_seconds: float) -> int:
    names = RedisBrokerDepth(url, app.conf.broker_transport_options)
    with quick_redis(url, timeout_seconds) as client:
        lists = {queue: names.lists(queue) for queue in queues}
        return sum(int(size) for sizes in per_list(client, lists, "llen").values()
                   for size in sizes)


def _amqp_backlog(app: Celery, queues: list[str], timeout_seconds: float) -> int:
    with app.connection_for_write(connect_timeout=timeout_seconds) as connection:
        connection.ensure_connection(max_retries=1, timeout=timeout_seconds)
        with connection.channel() as channel:
            return sum(int(channel.queue_declare(queue, passive=True).message_count)
                       for queue in queues)


def published_at(item: bytes | str | None) -> float | None:
    """The `published_at` stamp of a raw kombu message on a Redis list, or None."""
    if item is None:
        return None
    try:
        envelope = json.loads(item)
    except ValueError:
        return None
    headers = envelope.get("headers") if isinstance(envelope, dict) else None
    return finite_seconds(headers.get(PUBLISHED_AT_HEADER)) if isinstance(headers, dict) else None


def oldest_ages(app: Celery, tiers: Iterable[str], *,
                now: float | None = None) -> dict[str, float | None]:
    """Seconds the oldest message of each tier has waited (Redis brokers; `{}` on RabbitMQ):
    0.0 for an empty tier, None for one whose oldest messages carry no `published_at`.

    Raises:
        StorageError: the broker could not be read.
    """
    backend = depth_backend_for(app)
    if not isinstance(backend, RedisBrokerDepth):
        return {}
    lists = {tier: backend.lists(tier) for tier in tiers}
    try:
        tails = per_list(backend.client(), lists, "lindex", -1)
    except Exception as exc:
        raise translate_store_error(exc, "oldest messages of the tier queues (broker)") from exc
    now = time.time() if now is None else now
    ages: dict[str, float | None] = {}
    for tier, replies in tails.items():
        items = [item for item in replies if item is not None]
        stamps = [stamp for stamp in map(published_at, items) if stamp is not None]
        ages[tier] = max(0.0, now - min(stamps)) if stamps else None if items else 0.0
    return ages
