"""kombu's Redis transport with reliable fetch, guarded publish and one client per channel.

Taking a message and recording it as unacknowledged are one script (`fetch.lua`): with
kombu's BRPOP and a second command, a main process killed between them lost the message. A
redelivery is recorded under a fresh tag, so a late ack removes only its own hold. The script
cannot block, so an idle channel waits on one connection per list, blocked in
`BLMOVE list list RIGHT RIGHT` (it takes nothing), and fetches on any reply. A publish with
the enqueue guards' headers is checked and pushed by one script. See docs/production.md
("The Redis broker transport") for the design, its costs, and which channels keep BRPOP.
"""

from __future__ import annotations

import contextlib
import logging
from functools import partial
from time import time
from typing import Any

from kombu.transport import redis as kombu_redis
from kombu.utils.encoding import bytes_to_str
from kombu.utils.json import dumps, loads
from kombu.utils.uuid import uuid
from redis.exceptions import NoScriptError

from resilience.admission.broker import guard_requests, push
from resilience.errors import ConfigurationError
from resilience.scripts import LuaScript

logger = logging.getLogger("jobs.broker")

FETCH = LuaScript.load(__file__, "fetch.lua")
#: Where an item that is not kombu JSON is set aside (inspect it with LRANGE).
UNREADABLE_KEY = "jobs:unreadable"
#: Poller type of a waiter: `(WAIT, list key)` (kombu's own types are 'BRPOP' and 'LISTEN').
WAIT = "WAIT"
#: What the consuming connection has in flight when it is the fetch script.
_FETCHING = "FETCH"


class QoS(kombu_redis.QoS):
    """kombu's Redis QoS, skipping the unacked record `fetch.lua` already wrote."""

    def append(self, message: Any, delivery_tag: Any) -> None:
        recorded = self.channel.recorded
        if delivery_tag in recorded:
            recorded.discard(delivery_tag)
            kombu_redis.virtual.QoS.append(self, message, delivery_tag)
            return
        super().append(message, delivery_tag)


class Waiter:
    """One list's wait: a connection of its own, blocked in `BLMOVE key key RIGHT RIGHT`.

    It stands where kombu's poller expects a client (`.connection`), so the poller and
    Celery's event loop register, poll and forget it as they do the BRPOP connection.
    """

    __slots__ = ("armed", "connection", "fileno", "key", "sent_at")

    def __init__(self, key: str, connection: Any) -> None:
        self.key = key
        self.connection = connection
        self.armed = False
        self.sent_at = 0.0
        self.fileno: int | None = None

    @property
    def kind(self) -> tuple[str, str]:
        """This waiter's type in the poller's maps and in the channel's `handlers`."""
        return (WAIT, self.key)


def _is_wait(kind: Any) -> bool:
    return isinstance(kind, tuple) and kind[:1] == (WAIT,)


class Poller(kombu_redis.MultiChannelPoller):
    """kombu's poller; a waiter's reply is read even while the channel cannot consume.

    Reading a waiter takes nothing (the reply only says "fetch now"), and a reply left
    unread would keep its socket readable and spin the event loop. In the event loop a
    waiter's read returns quietly; in `drain_events` it raises `Empty`, so the drain goes
    on to the fetch instead of returning with nothing delivered.
    """

    def on_readable(self, fileno: int) -> Any:
        found = self._fd_to_chan.get(fileno)
        if found is not None and _is_wait(found[1]):
            channel, kind = found
            return channel.handlers[kind]()
        return super().on_readable(fileno)

    def handle_event(self, fileno: int, event: int) -> Any:
        found = self._fd_to_chan.get(fileno)
        if found is not None and _is_wait(found[1]):
            channel, kind = found
            channel.handlers[kind]()
            raise kombu_redis.Empty()
        return super().handle_event(fileno, event)


class Channel(kombu_redis.Channel):
    """A Redis channel with reliable fetch that reuses its synchronous client."""

    QoS = QoS
    _shared_client: Any = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        #: Delivery tags fetch.lua recorded as unacknowledged, until QoS.append sees them.
        self.recorded: set[str] = set()
        self._fetch_keys: list[str] = []
        self._no_ack_tags: set[Any] = set()
        #: Whether the next poll sends the fetch script rather than waiting: at start,
        #: after a delivery, and when a waiter saw its list non-empty.
        self._fetch_due = True
        #: What the consuming connection has in flight (`_FETCHING` or None: kombu's BRPOP).
        self._in_flight: str | None = None
        self._waiters: dict[str, Waiter] = {}
        super().__init__(*args, **kwargs)

    @property
    def reliable(self) -> bool:
        """Whether this channel fetches reliably; otherwise it is kombu's BRPOP as it was.

        A no-ack consumer (Celery's control replies) never acknowledges, so its record would
        be restored as a duplicate; kombu's prefixing client prefixes only its own commands.
        """
        return not self.global_keyprefix and not self._no_ack_tags

    def basic_consume(self, queue: str, *args: Any, **kwargs: Any) -> Any:
        no_ack = kwargs.get("no_ack", args[0] if args else False)
        tag = kwargs.get("consumer_tag", args[2] if len(args) > 2 else None)
        if no_ack:
            self._no_ack_tags.add(tag)
        self._fetch_due = True  # a new queue may hold messages already
        return super().basic_consume(queue, *args, **kwargs)

    def basic_cancel(self, consumer_tag: Any) -> Any:
        self._no_ack_tags.discard(consumer_tag)
        return super().basic_cancel(consumer_tag)

    # -- fetch -------------------------------------------------------------------------
    def _brpop_start(self, timeout: float | None = None) -> None:
        """Fetch now if a fetch is due, else make sure every watched list has a waiter."""
        if not self.reliable:
            self._drop_waiters()
            return super()._brpop_start(timeout)
        if timeout is None:
            timeout = self.brpop_timeout
        queues = self._queue_cycle.consume(len(self.active_queues))
        if not queues:
            return None
        self._fetch_keys = list(dict.fromkeys(
            self._q_for_pri(queue, priority) for priority in self.priority_steps
            for queue in queues))
        if self._fetch_due:
            self._fetch_due = False
            self._send_fetch(self._fetch_keys)
        else:
            self._arm_waiters(self._fetch_keys, timeout)
        return None

    def _send_fetch(self, keys: list[str]) -> None:
        connection = self.client.connection
        sock = connection._sock
        check_health = getattr(connection, "check_health", None)
        if check_health is not None:
            # After a long wait this connection is idle, and redis-py pings an idle
            # connection before a command, reconnecting if the ping fails: done here, a new
            # socket is registered with the poller (inside the send it would not be).
            check_health()
            if connection._sock is not sock:
                self.connection.cycle._register(self, self.client, "BRPOP")
        self._in_poll = connection
        self._in_flight = _FETCHING
        # kombu's clock (its BRPOP health check compares against it).
        self._brpop_sent_at = kombu_redis.monotonic()
        connection.send_command(
            "EVALSHA", FETCH.sha, 3 + len(keys), self.unacked_key, self.unacked_index_key,
            UNREADABLE_KEY, *keys, repr(time()), uuid())

    def _brpop_read(self, **options: Any) -> bool:
        """Read the fetch script's reply and deliver its message (kombu's BRPOP reply when
        the channel is not reliable)."""
        if self._in_flight != _FETCHING:
            return super()._brpop_read(**options)
        self._in_flight = None
        fetched = None
        try:
            try:
                reply = self.client.parse_response(self.client.connection, "EVALSHA",
                                                   **options)
            except self.connection_errors:
                self.client.connection.disconnect()
                raise
            except NoScriptError:
                # A new, restarted or flushed server: fetch again at once, synchronously
                # (the script object loads itself), so a waiting message is delivered on
                # this tick rather than after the next wake-up.
                reply = None
                fetched = self._fetch(self._fetch_keys)
        finally:
            self._in_poll = None
            self._flush_brpop_reauth()
        if fetched is None and reply:
            self._fetch_due = True
            fetched = self._taken(reply)
        if fetched is None:
            raise kombu_redis.Empty()  # every list empty (the waiters take over), or unreadable
        queue, message = fetched
        self._fetch_due = True
        self._queue_cycle.rotate(queue)
        self.connection._deliver(message, queue)
        return True

    def _fetch(self, keys: list[str]) -> tuple[str, Any] | None:
        """The fetch, synchronously on the channel's shared client."""
        with self.conn_or_acquire() as client:
            while reply := FETCH(client, keys=[self.unacked_key, self.unacked_index_key,
                                               UNREADABLE_KEY, *keys],
                                 args=[repr(time()), uuid()]):
                if (taken := self._taken(reply)) is not None:
                    return taken
        return None

    def _taken(self, reply: Any) -> tuple[str, Any] | None:
        """The queue and message of a fetch script's reply; None for an item that is not a
        kombu message (the script moved it to `UNREADABLE_KEY`)."""
        key, item, tag = (bytes_to_str(part) for part in reply)
        queue = key.rsplit(self.sep, 1)[0]
        if tag == "unreadable":
            logger.error("an item of queue %r is not a kombu message; moved to the Redis "
                         "list %r", queue, UNREADABLE_KEY)
            return None
        self.recorded.add(tag)
        return queue, loads(item)

    # -- wait --------------------------------------------------------------------------
    def _arm_waiters(self, keys: list[str], timeout: float) -> None:
        """Block a waiter on each of `keys` that is not blocked already; drop the others."""
        for waiter in [waiter for key, waiter in self._waiters.items() if key not in keys]:
            self._drop_waiter(waiter)
        now = kombu_redis.monotonic()
        overdue = (timeout or 0) + (self.health_check_interval or 0)
        for key in keys:
            waiter = self._waiters.get(key) or self._new_waiter(key)
            if waiter.armed:
                # A half-open connection never answers, and no socket timeout applies to
                # the event loop: drop one whose reply is overdue (kombu does so for BRPOP).
                if timeout and self.health_check_interval and now - waiter.sent_at > overdue \
                        and not kombu_redis._socket_readable(waiter.connection._sock):
                    logger.warning("Redis wait on %r got no reply for %.0f s; reconnecting",
                                   key, now - waiter.sent_at)
                    self._drop_waiter(waiter)
                continue
            waiter.connection.send_command("BLMOVE", key, key, "RIGHT", "RIGHT", timeout or 0)
            waiter.armed = True
            waiter.sent_at = now

    def _new_waiter(self, key: str) -> Waiter:
        pool = self.async_pool
        # Outside the pool: a waiter holds its connection for good, and a worker watching
        # several queues would otherwise exhaust the pool's `max_connections`. The class is
        # the pool's, which tells the channel when the connection drops.
        waiter = Waiter(key, pool.connection_class(**pool.connection_kwargs))
        # Registering connects; a broker that is down raises here, with nothing kept.
        self.connection.cycle._register(self, waiter, waiter.kind)
        waiter.fileno = waiter.connection._sock.fileno()
        self._waiters[key] = waiter
        self.handlers[waiter.kind] = partial(self._wait_read, key)
        return waiter

    def _wait_read(self, key: str) -> None:
        """A waiter answered: its list has an item (fetch now) or its wait timed out. A
        waiter delivers nothing itself."""
        waiter = self._waiters.get(key)
        if waiter is None:
            return
        waiter.armed = False
        try:
            reply = self.client.parse_response(waiter.connection, "BLMOVE")
        except self.connection_errors:
            # Nothing is lost with a waiter. Drop it and fetch: a broker that is really
            # gone fails the fetch on the consuming connection, which kombu recovers.
            logger.debug("Redis wait on %r failed; reconnecting", key, exc_info=True)
            self._drop_waiter(waiter)
            self._fetch_due = True
            return
        if reply is not None:
            self._fetch_due = True

    def _drop_waiter(self, waiter: Waiter) -> None:
        self._forget_waiter(waiter)
        waiter.connection.disconnect()

    def _forget_waiter(self, waiter: Waiter) -> None:
        """Remove a waiter from the channel and from the poller (before or after its socket
        closed: a closed socket has left epoll already)."""
        if self._waiters.get(waiter.key) is waiter:
            del self._waiters[waiter.key]
        self.handlers.pop(waiter.kind, None)
        connection = self.connection
        cycle = getattr(connection, "cycle", None) if connection else None
        if cycle is None:
            return
        ident = (self, waiter, waiter.kind)
        cycle._chan_to_sock.pop(ident, None)
        if waiter.fileno is not None and cycle._fd_to_chan.get(waiter.fileno) == (
                self, waiter.kind):
            del cycle._fd_to_chan[waiter.fileno]
            with contextlib.suppress(Exception):
                cycle._unregister_from_poll(waiter.fileno)

    def _drop_waiters(self) -> None:
        for waiter in list(self._waiters.values()):
            self._drop_waiter(waiter)

    def _on_connection_disconnect(self, connection: Any) -> None:
        for waiter in list(self._waiters.values()):
            if waiter.connection is connection:
                self._forget_waiter(waiter)
        if self._in_poll is connection:
            # A fetch whose reply is lost left its message recorded as unacked (restored
            # after the visibility timeout); the next connection fetches at once.
            self._in_flight = None
            self._fetch_due = True
        super()._on_connection_disconnect(connection)

    def _after_fork(self) -> None:
        # A child shares the parent's poller: close the inherited sockets without touching
        # it (unregistering would unregister them for the parent too).
        for waiter in list(self._waiters.values()):
            self._waiters.pop(waiter.key, None)
            self.handlers.pop(waiter.kind, None)
            sock, waiter.connection._sock = waiter.connection._sock, None
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.close()
        super()._after_fork()

    def close(self) -> None:
        if not self.closed:
            self._drop_waiters()
        super().close()

    # -- publish -----------------------------------------------------------------------
    def _put(self, queue: str, message: Any, **kwargs: Any) -> None:
        """Publish; a message with the enqueue guards' headers is pushed by one script that
        checks its unique key and its queue's bound first (a copy without them is stored, so
        a publish kombu retries is checked again).

        Raises:
            QueueFull, DuplicateJob: the script refused the message; nothing was pushed.
            ConfigurationError: guard headers on a channel with a `global_keyprefix`.
        """
        stored, bound, unique = guard_requests(message)
        if bound is None and unique is None:
            return super()._put(queue, stored, **kwargs)
        if self.global_keyprefix:
            raise ConfigurationError(
                "guarded publish (x-resilience-* headers) is not supported with the broker "
                f"option global_keyprefix={self.global_keyprefix!r}; the enqueue guards "
                "check on their own there (resilience.admission.broker.guarded_publish)")
        batch = kwargs.get("_publish_batch")
        if batch is not None:
            # The checks answer now, so the message cannot wait in the batch; what the
            # batch holds goes first, keeping the order of publication.
            batch.flush()
        priority = self._get_message_priority(stored, reverse=False)
        with self.conn_or_acquire() as client:
            push(client, target=self._q_for_pri(queue, priority),
                 lists=[self._q_for_pri(queue, step) for step in self.priority_steps],
                 payload=dumps(stored), bound=bound, unique=unique)
            if self._expires and queue in self._expires:
                for step in self.priority_steps:
                    client.pexpire(self._q_for_pri(queue, step), self._expires[queue])
        return None

    def _create_client(self, asynchronous: bool = False) -> Any:
        if asynchronous:
            return super()._create_client(asynchronous=True)
        client = self._shared_client
        if getattr(client, "connection_pool", None) is not self.pool:
            client = self._shared_client = super()._create_client()
        return client


class Transport(kombu_redis.Transport):
    """kombu's Redis transport with `Channel` and `Poller` above; everything else unchanged."""

    Channel = Channel
    #: `_put` runs the enqueue guards' checks in the push (`resilience.admission.broker`).
    guarded_publish = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.cycle = Poller()
