"""What waits in the tier queues, read apart from the worker's consumer.

- `fresh_backlog`: the messages waiting in some queues, read on a broker connection opened
  for the read and closed after it. The consumption watchdog (watchdog.py) asks it, because
  the consumer's own connections are exactly what may be wedged; a broker that a new
  connection cannot reach within the timeout is an outage (None), not a backlog.
- `oldest_ages`: seconds the oldest message of each tier has waited, for
  `jobs_queue_oldest_age_seconds`.

**Where the age comes from.** Neither kombu's envelope (`properties`: delivery tag,
priority, reply-to...) nor Celery's protocol-2 headers (`id`, `task`, `eta`, `expires`,
`retries`, `origin`...) carry a send time, and the deadline guard's `enqueued_at` is kept
across retries and deferrals (it dates the job, not the message: a job retried for an hour
would look an hour old in the queue). So every publish is stamped with `published_at` (epoch
seconds, the producer's clock) by `stamp_published_at`, a `before_task_publish` receiver the
platform app connects: first publishes, retries, deferrals and the outbox relay's publishes
alike. A message restored after its worker died keeps its stamp (it has been waiting to be
done since then). Clock skew between producers and the exporter shifts the age by the skew.

Redis: kombu pushes with LPUSH and the platform's fetch takes from the right, so each
priority list's tail (`LINDEX list -1`) is its oldest message; the tier's age is the oldest
tail's. One pipeline of LINDEX per scrape, no scan. An empty tier is 0 s old; a tier whose
tail carries no stamp (a producer outside the platform) has no age (the series is absent).
RabbitMQ: a queue's head cannot be read without taking it (`basic_get` then a requeue marks
it redelivered and may reorder it), and the broker reports no head age (its management API
and Prometheus plugin give counts and rates only), so the age is not exported there:
autoscale on depth.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from resilience.admission.broker import RedisBrokerDepth, depth_backend_for
from resilience.connections import translate_store_error
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
    """Messages waiting in `queues`, read on a new broker connection closed afterwards.

    Returns None when the broker cannot be reached (or answer) within `timeout_seconds`:
    nothing can reach it, which is an outage, not a stalled consumer.
    """
    queues = list(queues)
    url = app.conf.broker_url or ""
    try:
        if url.startswith(REDIS_SCHEMES):
            return _redis_backlog(app, url, queues, timeout_seconds)
        return _amqp_backlog(app, queues, timeout_seconds)
    except Exception:  # noqa: BLE001 - any failure to read it means: unreachable now
        return None


def _redis_backlog(app: Celery, url: str, queues: list[str], timeout_seconds: float) -> int:
    import redis
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    names = RedisBrokerDepth(url, app.conf.broker_transport_options)
    client = redis.Redis.from_url(url, socket_timeout=timeout_seconds,
                                  socket_connect_timeout=timeout_seconds,
                                  retry=Retry(NoBackoff(), 0))
    try:
        with client.pipeline(transaction=False) as pipe:
            for queue in queues:
                for name in names.lists(queue):
                    pipe.llen(name)
            return sum(int(size) for size in pipe.execute())
    finally:
        client.close()
        client.connection_pool.disconnect()


def _amqp_backlog(app: Celery, queues: list[str], timeout_seconds: float) -> int:
    total = 0
    with app.connection_for_write(connect_timeout=timeout_seconds) as connection:
        connection.ensure_connection(max_retries=1, timeout=timeout_seconds)
        channel = connection.channel()
        try:
            for queue in queues:
                total += int(channel.queue_declare(queue, passive=True).message_count)
        finally:
            channel.close()
    return total


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
    """Seconds the oldest message of each tier has waited (Redis brokers; `{}` on RabbitMQ).

    0.0 for an empty tier; None for a tier whose oldest messages carry no `published_at`.

    Raises:
        StorageError: the broker could not be read.
    """
    backend = depth_backend_for(app)
    if not isinstance(backend, RedisBrokerDepth):
        return {}
    tiers = list(tiers)
    lists = {tier: backend.lists(tier) for tier in tiers}
    try:
        with backend.client().pipeline(transaction=False) as pipe:
            for tier in tiers:
                for name in lists[tier]:
                    pipe.lindex(name, -1)
            tails = iter(pipe.execute())
    except Exception as exc:
        raise translate_store_error(exc, "oldest messages of the tier queues (broker)") from exc
    now = time.time() if now is None else now
    ages: dict[str, float | None] = {}
    for tier in tiers:
        items = [item for item in (next(tails) for _ in lists[tier]) if item is not None]
        stamps = [stamp for stamp in map(published_at, items) if stamp is not None]
        if not items:
            ages[tier] = 0.0
        elif stamps:
            ages[tier] = max(0.0, now - min(stamps))
        else:
            ages[tier] = None
    return ages
