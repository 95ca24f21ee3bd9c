"""kombu's Redis transport with reliable fetch, and one client object per channel.

**Reliable fetch.** kombu's Redis channel takes a message with BRPOP and records it as
unacknowledged (the `unacked` hash and its time index) in a second command when it hands the
message to the consumer. A worker's main process killed between the two loses the message:
it is in neither the queue nor the unacked hash, so no visibility restore brings it back.
Here the taking and the recording are one Lua script (`fetch.lua`), writing exactly the
record kombu's QoS writes, so everything kombu does afterwards is unchanged: `acks_late`,
prefetch, ETA messages held unacknowledged, `restore_visible` after the visibility timeout,
restore at warm shutdown. The blocking wait that BRPOP gave is kept without taking anything:
`BLMOVE q q RIGHT RIGHT` moves a list's last item onto its own tail, which leaves the list as
it was and returns once the list has an item; the script then takes the oldest message of
the first non-empty list. Sidekiq Pro's super_fetch moves each job into a private working
list instead; kombu already keeps a working set (the unacked hash) and recovers it, so the
platform closes the window into it rather than adding a second one. The wait watches the first
queue of kombu's round-robin cycle; a message on another queue of a multi-queue worker (or a
priority sub-list) is taken on the next wake-up, at most `brpop_timeout` (1 s) later. A tier
worker consumes one queue, so it never waits. An item that is not kombu JSON is moved to
the list `jobs:unreadable` with an error logged, rather than crashing the consumer.

**Guarded publish.** A message whose headers carry the enqueue guards' requests (the tier's
bound, a unique key: `resilience.publish`) is pushed by one script that checks them first, so
a guarded `.delay()` is one round trip, as a plain one is, and both checks are exact. The
headers are removed before the message is stored.

**One client object.**
kombu's Redis channel builds a new `redis.Redis` object for every publish, fanout event and
queue-size query (`Channel.conn_or_acquire`). The client shares the channel's connection
pool, so that was cheap; since redis-py 8 each construction also copies every response
callback into a new case-insensitive dict, about 60 µs. With task events on (Flower needs
them) a worker's main process publishes three events per job, and that construction alone
took a quarter of its CPU under load (py-spy, `python -m bench idempotency`).

A `redis.Redis` object holds no connection of its own here (it takes one from the pool per
command) and is thread-safe, so the channel keeps one. The asynchronous client (the BRPOP
poller's) is left as kombu builds it. Selected by `jobs.platform.celery_config` for
redis:// brokers only (rediss:// and RabbitMQ keep kombu's own transport).
"""

from __future__ import annotations

import logging
from time import monotonic, time
from typing import Any

from kombu.transport import redis as kombu_redis
from kombu.utils.encoding import bytes_to_str
from kombu.utils.json import dumps, loads

from resilience.publish import BOUND_HEADER, UNIQUE_HEADER, push
from resilience.scripts import LuaScript

logger = logging.getLogger("jobs.broker")

FETCH = LuaScript.load(__file__, "fetch.lua")
#: Where an item that is not kombu JSON is set aside (inspect it with LRANGE).
UNREADABLE_KEY = "jobs:unreadable"


class QoS(kombu_redis.QoS):
    """kombu's Redis QoS, skipping the unacked record `fetch.lua` already wrote."""

    def append(self, message: Any, delivery_tag: Any) -> None:
        recorded = self.channel.recorded
        if delivery_tag in recorded:
            recorded.discard(delivery_tag)
            kombu_redis.virtual.QoS.append(self, message, delivery_tag)
            return
        super().append(message, delivery_tag)


class Channel(kombu_redis.Channel):
    """A Redis channel with reliable fetch that reuses its synchronous client."""

    QoS = QoS
    _shared_client: Any = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        #: Delivery tags fetch.lua recorded as unacknowledged, until QoS.append sees them.
        self.recorded: set[str] = set()
        self._fetch_keys: list[str] = []
        self._no_ack_tags: set[Any] = set()
        super().__init__(*args, **kwargs)

    @property
    def reliable(self) -> bool:
        """Whether this channel fetches reliably; otherwise it is kombu's BRPOP as it was.

        Only consumers that acknowledge want a record: a no-ack consumer (Celery's control
        replies) never acknowledges, so a record would be restored as a duplicate. A key
        prefix would have to be applied to the script's keys by hand (kombu's prefixing
        client does it for its own commands only).
        """
        return not self.global_keyprefix and not self._no_ack_tags

    def basic_consume(self, queue: str, *args: Any, **kwargs: Any) -> Any:
        no_ack = kwargs.get("no_ack", args[0] if args else False)
        tag = kwargs.get("consumer_tag", args[2] if len(args) > 2 else None)
        if no_ack:
            self._no_ack_tags.add(tag)
        return super().basic_consume(queue, *args, **kwargs)

    def basic_cancel(self, consumer_tag: Any) -> Any:
        self._no_ack_tags.discard(consumer_tag)
        return super().basic_cancel(consumer_tag)

    def _brpop_start(self, timeout: float | None = None) -> None:
        if not self.reliable:
            return super()._brpop_start(timeout)
        if timeout is None:
            timeout = self.brpop_timeout
        queues = self._queue_cycle.consume(len(self.active_queues))
        if not queues:
            return None
        self._fetch_keys = [self._q_for_pri(queue, priority) for priority in self.priority_steps
                            for queue in queues]
        first = self._fetch_keys[0]
        self._in_poll = self.client.connection
        self._brpop_sent_at = monotonic()
        # Waits for the list to have an item and moves nothing (see the module docstring).
        self.client.connection.send_command("BLMOVE", first, first, "RIGHT", "RIGHT",
                                            timeout or 0)
        return None

    def _brpop_read(self, **options: Any) -> bool:
        if not self.reliable:
            return super()._brpop_read(**options)
        try:
            try:
                self.client.parse_response(self.client.connection, "BLMOVE", **options)
            except self.connection_errors:
                self.client.connection.disconnect()
                raise
        finally:
            self._in_poll = None
            flush = getattr(self, "_flush_brpop_reauth", None)
            if flush is not None:
                flush()
        fetched = self._fetch(self._fetch_keys)
        if fetched is None:
            raise kombu_redis.Empty()
        queue, message = fetched
        self._queue_cycle.rotate(queue)
        self.connection._deliver(message, queue)
        return True

    def _put(self, queue: str, message: Any, **kwargs: Any) -> None:
        """Publish; a message carrying the enqueue guards' headers (`resilience.publish`) is
        pushed by one script that checks its unique key and its queue's bound first.

        Raises:
            QueueFull, DuplicateJob: the script refused the message; nothing was pushed.
        """
        headers = message.get("headers")
        if not isinstance(headers, dict):
            return super()._put(queue, message, **kwargs)
        bound = headers.pop(BOUND_HEADER, None)
        unique = headers.pop(UNIQUE_HEADER, None)
        if (bound is None and unique is None) or kwargs.get("_publish_batch") is not None \
                or self.global_keyprefix:
            return super()._put(queue, message, **kwargs)
        priority = self._get_message_priority(message, reverse=False)
        with self.conn_or_acquire() as client:
            push(client, target=self._q_for_pri(queue, priority),
                 lists=[self._q_for_pri(queue, step) for step in self.priority_steps],
                 payload=dumps(message), bound=bound, unique=unique)
            if self._expires and queue in self._expires:
                for step in self.priority_steps:
                    client.pexpire(self._q_for_pri(queue, step), self._expires[queue])
        return None

    def _fetch(self, keys: list[str]) -> tuple[str, Any] | None:
        """Take the oldest message of the first non-empty list, recorded as unacked."""
        if not keys:
            return None
        with self.conn_or_acquire() as client:
            while True:
                reply = FETCH(client, keys=[self.unacked_key, self.unacked_index_key,
                                            UNREADABLE_KEY, *keys], args=[repr(time())])
                if not reply:
                    return None
                key, item, tag = (bytes_to_str(part) for part in reply)
                queue = key.rsplit(self.sep, 1)[0]
                if tag == "unreadable":
                    logger.error("an item of queue %r is not a kombu message; moved to the "
                                 "Redis list %r", queue, UNREADABLE_KEY)
                    continue
                self.recorded.add(tag)
                return queue, loads(item)

    def _create_client(self, asynchronous: bool = False) -> Any:
        if asynchronous:
            return super()._create_client(asynchronous=True)
        client = self._shared_client
        if client is None or client.connection_pool is not self.pool:
            client = self._shared_client = super()._create_client()
        return client


class Transport(kombu_redis.Transport):
    """kombu's Redis transport with `Channel` above; everything else unchanged."""

    Channel = Channel
    #: `_put` runs the enqueue guards' checks in the push (`resilience.publish`).
    guarded_publish = True
