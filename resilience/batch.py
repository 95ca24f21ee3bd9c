"""One Redis round trip shared by the guards of one call.

Each guard's happy path needs a Redis read before the body (is the key cached? is the breaker
closed?) and a Redis write after it (cache the result, report the outcome, count the
request). Done one by one that is a round trip per guard; `RedisBatch` queues them in one
non-transactional pipeline instead, so a call costs one read round trip before the body and
one write round trip after it, however many guards it has.

Batching changes no decision: reads are only hints (a guard whose read failed or says
anything but "go ahead" makes its own atomic call), and the writes are ones nobody waits for
(their failures were already logged and ignored). Scripts are sent as EVALSHA without
redis-py's per-pipeline `SCRIPT EXISTS` check; a script the server lost is run once more on
its own, which loads it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import redis
    from redis.commands.core import Script

    from resilience.pipeline import Rounds

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


@dataclass
class RedisBatch:
    """Commands for one Redis client, sent together by `execute()` in one round trip."""

    client: redis.Redis
    queued: list[_Queued] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.queued)

    def command(self, *args: Any, then: Then) -> None:
        """Queue a command (`"GET", key`); `then` gets its reply or exception."""
        self.queued.append(_Queued(args, then))

    def script(self, script: Script, keys: Sequence[Any], args: Sequence[Any], *,
               then: Then) -> None:
        """Queue a registered Lua script call; `then` gets its reply or exception."""
        self.queued.append(_Queued(("EVALSHA", script.sha, len(keys), *keys, *args), then,
                                   script, keys, args))

    def execute(self) -> None:
        """Send everything queued in one round trip and hand each reply to its callback.

        Never raises: a transport error becomes every callback's exception, and a callback
        that raises is logged (each owner already treats its command as best effort).
        """
        queued, self.queued = self.queued, []
        if not queued:
            return
        try:
            replies = self._send([item.args for item in queued])
        except Exception as exc:  # noqa: BLE001 - handed to each owner's own policy
            replies = [exc] * len(queued)
        from redis.exceptions import NoScriptError

        for item, reply in zip(queued, replies, strict=True):
            if isinstance(reply, NoScriptError) and item.script is not None:
                try:
                    reply = item.script(keys=list(item.keys), args=list(item.argv))
                except Exception as exc:  # noqa: BLE001 - handed to the owner
                    reply = exc
            try:
                item.then(reply)
            except Exception:
                logger.exception("batched Redis reply handler failed")

    def _send(self, commands: list[tuple[Any, ...]]) -> list[Any]:
        """Write every command at once and read every reply, on one pooled connection.

        What redis-py's non-transactional pipeline does, without its per-call bookkeeping
        (which costs more CPU than the round trip here): error replies become exception
        values, the client's response callbacks apply, and a connection error is retried
        under the client's own retry policy on a fresh connection.
        """
        from redis.exceptions import ResponseError

        client = self.client
        callbacks = client.response_callbacks
        pool = client.connection_pool
        connection = pool.get_connection()

        def send() -> list[Any]:
            connection.send_packed_command(connection.pack_commands(commands))
            replies: list[Any] = []
            for args in commands:
                try:
                    reply = connection.read_response()
                except ResponseError as exc:
                    reply = exc
                else:
                    callback = callbacks.get(args[0])
                    if callback is not None:
                        reply = callback(reply)
                replies.append(reply)
            return replies

        try:
            return connection.retry.call_with_retry(send, lambda _error: connection.disconnect())
        except BaseException:
            connection.disconnect()  # replies may be left unread: never reuse the socket
            raise
        finally:
            pool.release(connection)


def for_client(rounds: Rounds, client: redis.Redis) -> RedisBatch:
    """The `RedisBatch` for `client` in a call's `reads` or `writes`, made on first use.

    This is how a Redis backend opts into batching: it queues its command here instead of
    sending it, and the pipeline executes every round once (see `resilience.pipeline.Call`).
    Keyed by the client's identity; the batch holds the client, so the id cannot be reused
    while the batch lives.
    """
    key = (RedisBatch, id(client))
    batch = rounds.get(key)
    if batch is None:
        batch = rounds[key] = RedisBatch(client)
    return batch  # type: ignore[return-value]
