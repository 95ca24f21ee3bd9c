"""One Redis round trip shared by the guards of one call, and writes nobody waits for.

Each guard's happy path needs a Redis read before the body (is the key cached? is the breaker
closed?) and a Redis write after it (cache the result, report the outcome, count the
request). Done one by one that is a round trip per guard; `RedisBatch` queues them in one
non-transactional pipeline instead, so a call costs one read round trip before the body and
at most one write round trip after it, however many guards it has.

Batching changes no decision: reads are only hints (a guard whose read failed or says
anything but "go ahead" makes its own atomic call), and the writes are ones nobody waits for
(their failures were already logged and ignored). Scripts are sent as EVALSHA without
redis-py's per-pipeline `SCRIPT EXISTS` check; a script the server lost is run once more on
its own, which loads it.

Writes queued with `wait=False` (a cache fill, a budget count, a closed breaker's success) are
not even waited for: they are sent on the thread's own connection and their replies are read
at the next batch of that thread, when they have long arrived. Sent means in Redis's socket
before the task returns, so anything that learns of the task's end through Redis (its result,
a later command) finds them applied: Redis reads a connection's commands in order and serves
each readable connection before waiting again. Calls run inline (`apply()`, caller-runs)
always wait, so code that reads Redis right after them sees their writes.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import redis
    from redis.commands.core import Script

logger = logging.getLogger("resilience.batch")

#: A callback receives the command's reply, or the exception it raised.
Then = Callable[[Any], None]


@dataclass
class _Queued:
    args: tuple[Any, ...]
    then: Then
    script: Script | None = None
    keys: Sequence[Any] = ()
    argv: Sequence[Any] = ()
    wait: bool = True

    def deliver(self, reply: Any) -> None:
        """Hand `reply` to the owner; a script the server lost is loaded and run again."""
        from redis.exceptions import NoScriptError

        if isinstance(reply, NoScriptError) and self.script is not None:
            try:
                reply = self.script(keys=list(self.keys), args=list(self.argv))
            except Exception as exc:  # noqa: BLE001 - handed to the owner
                reply = exc
        try:
            self.then(reply)
        except Exception:
            logger.exception("batched Redis reply handler failed")


@dataclass
class RedisBatch:
    """Commands for one Redis client, sent together by `execute()` in one round trip."""

    client: redis.Redis
    queued: list[_Queued] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.queued)

    def command(self, *args: Any, then: Then, wait: bool = True) -> None:
        """Queue a command (`"GET", key`); `then` gets its reply or exception.

        `wait=False`: a write whose reply nobody waits for (see the module docstring).
        """
        self.queued.append(_Queued(args, then, wait=wait))

    def script(self, script: Script, keys: Sequence[Any], args: Sequence[Any], *,
               then: Then, wait: bool = True) -> None:
        """Queue a registered Lua script call; `then` gets its reply or exception."""
        self.queued.append(_Queued(("EVALSHA", script.sha, len(keys), *keys, *args), then,
                                   script, keys, args, wait))

    def execute(self, *, answered: bool = False) -> None:
        """Send everything queued in one round trip and hand each reply to its callback.

        When nothing queued waits (and `answered` is false) the commands are only sent; their
        replies reach the callbacks at this thread's next batch. Never raises: a transport
        error becomes every callback's exception, and a callback that raises is logged.
        """
        queued, self.queued = self.queued, []
        unanswered = _unanswered(self.client)
        unanswered.drain()
        if not queued:
            return
        if not answered and not any(item.wait for item in queued):
            unanswered.send(queued)
            return
        try:
            pipe = self.client.pipeline(transaction=False)
            for item in queued:
                pipe.execute_command(*item.args)
            replies: list[Any] = pipe.execute(raise_on_error=False)
        except Exception as exc:  # noqa: BLE001 - handed to each owner's own policy
            replies = [exc] * len(queued)
        for item, reply in zip(queued, replies, strict=True):
            item.deliver(reply)


class _Unanswered:
    """A thread's own connection for writes whose replies are read one batch later."""

    def __init__(self, client: redis.Redis) -> None:
        pool = client.connection_pool
        self.connection = pool.connection_class(**pool.connection_kwargs)
        self.pid = os.getpid()
        self.pending: list[_Queued] = []

    def send(self, queued: list[_Queued]) -> None:
        try:
            packed = self.connection.pack_commands([item.args for item in queued])
            self.connection.send_packed_command(packed, check_health=False)
        except Exception as exc:  # noqa: BLE001 - handed to each owner's own policy
            self.connection.disconnect()
            for item in queued:
                item.deliver(exc)
            return
        self.pending.extend(queued)

    def drain(self) -> None:
        """Read the replies of what was sent before (already arrived: no waiting)."""
        if not self.pending:
            return
        import redis as redis_lib

        pending, self.pending = self.pending, []
        for index, item in enumerate(pending):
            try:
                reply = self.connection.read_response()
            except redis_lib.ResponseError as exc:  # an error reply; the stream is in step
                reply = exc
            except Exception as exc:  # noqa: BLE001 - the connection broke: all unknown
                self.connection.disconnect()
                for rest in pending[index:]:
                    rest.deliver(exc)
                return
            item.deliver(reply)


_threads = threading.local()


def _unanswered(client: redis.Redis) -> _Unanswered:
    owned: dict[int, _Unanswered] = _threads.__dict__.setdefault("unanswered", {})
    own = owned.get(id(client))
    if own is None or own.pid != os.getpid():
        own = owned[id(client)] = _Unanswered(client)
    return own


def drain_unanswered() -> None:
    """Read every pending reply of this thread (before exit, or before asserting on them)."""
    for own in list(_threads.__dict__.get("unanswered", {}).values()):
        own.drain()


class Batches:
    """A call's batches, one per Redis client (guards normally share the app's client)."""

    def __init__(self) -> None:
        self._by_client: dict[int, RedisBatch] = {}

    def for_client(self, client: redis.Redis) -> RedisBatch:
        batch = self._by_client.get(id(client))
        if batch is None:
            batch = self._by_client[id(client)] = RedisBatch(client)
        return batch

    def execute(self, *, answered: bool = False) -> None:
        """One round trip per client with something queued (`RedisBatch.execute`)."""
        for batch in list(self._by_client.values()):
            batch.execute(answered=answered)
