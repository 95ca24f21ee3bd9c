"""One Redis round trip shared by the guards of one call.

A guard's happy path needs a Redis read before the body and a write after it; `RedisBatch`
queues them in one non-transactional pipeline, so a call costs one round trip before the
body and one after, however many guards it has. Batching changes no decision: reads are
hints (a guard whose read failed or says anything but "go ahead" makes its own atomic
call), and nobody waits for the writes. Scripts go as EVALSHA without redis-py's
`SCRIPT EXISTS` check; one the server lost is run once more on its own, which loads it.

On a Redis Cluster the commands are grouped by the master serving each one's first key,
one round trip per master; a MOVED or ASK reply sends that one command again through the
client's own path, which follows the redirection.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from redis.exceptions import AskError, NoScriptError, ResponseError, TryAgainError

from resilience.connections.redis import is_cluster

if TYPE_CHECKING:
    import redis
    from redis.commands.core import Script

logger = logging.getLogger("resilience.batch")


class Round(Protocol):
    """Work a backend queued for a call, sent at once by `execute()` (which never raises)."""

    def execute(self) -> None: ...


#: A call's rounds (`Call.reads`, `Call.writes`), keyed by the backend that owns each (one
#: per Redis client, say).
Rounds = dict[Hashable, Round]

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
        cluster = is_cluster(self.client)
        try:
            commands = [item.args for item in queued]
            replies = (self._send_per_node(commands) if cluster
                       else _send(self.client, commands))
        except Exception as exc:  # noqa: BLE001 - handed to each owner's own policy
            replies = [exc] * len(queued)

        for item, reply in zip(queued, replies, strict=True):
            if cluster and isinstance(reply, AskError | TryAgainError):
                # MOVED is an AskError: the slot lives elsewhere now. The client's own path
                # follows the redirection (and refreshes its slot table on MOVED).
                try:
                    reply = self.client.execute_command(*item.args)
                except Exception as exc:  # noqa: BLE001 - handed to the owner
                    reply = exc
            if isinstance(reply, NoScriptError) and item.script is not None:
                try:
                    reply = item.script(keys=list(item.keys), args=list(item.argv))
                except Exception as exc:  # noqa: BLE001 - handed to the owner
                    reply = exc
            try:
                item.then(reply)
            except Exception:
                logger.exception("batched Redis reply handler failed")

    def _send_per_node(self, commands: list[tuple[Any, ...]]) -> list[Any]:
        """`_send` for a Redis Cluster: the commands grouped by the master serving each
        one's first key (a command without a key goes to the client's default node), one
        pipelined round trip per master. A master that fails makes its own commands'
        replies that error; the others' replies stand."""
        client = self.client
        groups: dict[str, tuple[Any, list[int]]] = {}
        for index, args in enumerate(commands):
            key = first_key(args)
            node = (client.get_node_from_key(key) if key is not None
                    else client.get_default_node())
            groups.setdefault(node.name, (node, []))[1].append(index)
        replies: list[Any] = [None] * len(commands)
        for node, indexes in groups.values():
            try:
                sent = _send(client.get_redis_connection(node),
                             [commands[index] for index in indexes])
            except Exception as exc:  # noqa: BLE001 - this master's commands fail alone
                sent = [exc] * len(indexes)
            for index, reply in zip(indexes, sent, strict=True):
                replies[index] = reply
        return replies


def first_key(args: Sequence[Any]) -> Any:
    """The first key of a command as queued (`"GET", key`, `"EVALSHA", sha, n, *keys, ...`);
    None for a command without one."""
    name = str(args[0]).upper()
    if name in ("EVALSHA", "EVAL", "EVALSHA_RO", "EVAL_RO"):
        return args[3] if len(args) > 3 and int(args[2]) > 0 else None
    if name in ("TIME", "PING", "INFO", "DBSIZE"):
        return None
    return args[1] if len(args) > 1 else None


def _send(client: redis.Redis, commands: list[tuple[Any, ...]]) -> list[Any]:
    """Write every command at once and read every reply, on one pooled connection: redis-py's
    non-transactional pipeline without its per-call bookkeeping (which costs more CPU than
    the round trip here). Error replies become values; the client's retry policy applies."""
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
    """The `RedisBatch` for `client` in a call's `reads` or `writes`, made on first use: how
    a Redis backend opts into batching. Keyed by the client's id, which the batch keeps
    alive."""
    key = (RedisBatch, id(client))
    batch = rounds.get(key)
    if batch is None:
        batch = rounds[key] = RedisBatch(client)
    return batch  # type: ignore[return-value]
