"""Redis locks: the lease, the Lua scripts, and a single-node `RedisLock`.

A lock is a Redis string holding a random owner token with a mandatory TTL. Release and
extend are owner-checked in Lua, so a holder whose lease expired can never delete or
prolong the next holder's lock. `Redlock` (redlock.py) runs the same three scripts on N
independent nodes; `run_on_nodes` sends a script to every node before reading any reply,
so N nodes cost about one round trip, not N.
"""

from __future__ import annotations

import os
import secrets
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from resilience.errors import ConfigurationError
from resilience.keys import redis_key
from resilience.scripts import LuaScript
from resilience.stores import wrap_store_errors

if TYPE_CHECKING:
    import redis

#: Namespace of every lock key, so `jobs locks` and operators can find them.
LOCK_NAMESPACE = "resilience:lock"

ACQUIRE = LuaScript.load(__file__, "acquire.lua")
RELEASE = LuaScript.load(__file__, "release.lua")
EXTEND = LuaScript.load(__file__, "extend.lua")


def validate_ttl(ttl_seconds: float) -> float:
    """Refuse a missing or non-positive TTL: a lock without a lease outlives a dead holder.

    Raises:
        ConfigurationError: `ttl_seconds` is not a positive number.
    """
    if isinstance(ttl_seconds, bool) or not isinstance(ttl_seconds, int | float):
        raise ConfigurationError(f"ttl_seconds must be a number, got {ttl_seconds!r}")
    if not ttl_seconds > 0:
        raise ConfigurationError(
            f"ttl_seconds must be > 0, got {ttl_seconds!r}: a lock needs a lease so a dead "
            "holder cannot keep it forever"
        )
    return float(ttl_seconds)


def new_owner_token() -> str:
    """A random owner token; unguessable, so no other process can release our lock."""
    return secrets.token_hex(16)


@dataclass
class Lease:
    """One acquisition of a lock: who owns it and until when (on this process's clock).

    `valid_until` is on the monotonic clock and already discounts the time acquisition took
    and the clock drift allowance; past it, the holder must assume the lock is gone.
    """

    name: str
    owner: str
    ttl_seconds: float
    acquired_at: float
    valid_until: float
    fencing_token: int | None = None
    extensions: int = 0
    clock: Callable[[], float] = field(default=time.monotonic, repr=False)

    def remaining_seconds(self) -> float:
        """Seconds the lease is still valid for (negative when expired)."""
        return self.valid_until - self.clock()

    def valid(self) -> bool:
        return self.remaining_seconds() > 0


def lock_key(name: str) -> str:
    """The Redis key of lock `name`: `resilience:lock:{<name>}` (see `resilience.keys`)."""
    return redis_key(LOCK_NAMESPACE, name)


def describe(client: redis.Redis) -> str:
    """host:port of a client, for error messages."""
    kwargs = client.connection_pool.connection_kwargs
    return f"{kwargs.get('host', '?')}:{kwargs.get('port', '?')}"


class NodeConnections:
    """Free-list of connection sets, one connection per node, kept across calls.

    Taking a whole set at once (instead of one pooled connection per node per call) saves
    the pool's per-checkout health probe, which is a syscall per node; a set is used by one
    thread at a time, so replies never interleave.
    """

    def __init__(self, clients: Sequence[redis.Redis]) -> None:
        self.clients = list(clients)
        self._free: list[list[Any]] = []
        self._guard = threading.Lock()
        self._pid = os.getpid()

    def take(self) -> list[Any]:
        with self._guard:
            if self._pid != os.getpid():  # never share sockets with a forked parent
                self._free, self._pid = [], os.getpid()
            if self._free:
                return self._free.pop()
        return [client.connection_pool.make_connection() for client in self.clients]

    def give_back(self, connections: list[Any]) -> None:
        with self._guard:
            if self._pid == os.getpid():
                self._free.append(connections)

    def close(self) -> None:
        with self._guard:
            for connections in self._free:
                for connection in connections:
                    connection.disconnect()
            self._free = []


def run_on_nodes(
    nodes: NodeConnections, script: LuaScript, key: str, args: Sequence[Any]
) -> list[Any]:
    """Run `script` on every node concurrently: all requests go out before any reply is read.

    Returns one entry per node: the script's reply, or the exception that node raised
    (connection refused, timeout, error reply). Never raises for a node failure, because
    the caller decides by quorum. A connection that failed is disconnected and reconnects
    on its next use.
    """
    from redis.exceptions import NoScriptError

    connections = nodes.take()
    try:
        sent: list[BaseException | None] = []
        for connection in connections:
            try:
                connection.send_command("EVALSHA", script.sha, 1, key, *args)
                sent.append(None)
            except Exception as exc:  # noqa: BLE001 - a dead node is one vote lost
                connection.disconnect()
                sent.append(exc)
        replies: list[Any] = []
        for connection, failure in zip(connections, sent, strict=True):
            if failure is not None:
                replies.append(failure)
                continue
            try:
                try:
                    replies.append(connection.read_response())
                except NoScriptError:
                    # First use of the script on this node (or the node restarted empty).
                    connection.send_command("EVAL", script.text, 1, key, *args)
                    replies.append(connection.read_response())
            except Exception as exc:  # noqa: BLE001 - counted as a failed node by the caller
                connection.disconnect()
                replies.append(exc)
        return replies
    finally:
        nodes.give_back(connections)


class RedisLock:
    """A lock on one Redis node: simple and fast, but that node is a single point of failure.

    Args:
        client: the Redis holding the lock.
        clock: monotonic clock (injectable for tests).
    """

    def __init__(self, client: redis.Redis, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.client = client
        self.clock = clock
        self._node = describe(client)

    def acquire(self, name: str, *, ttl_seconds: float) -> Lease | None:
        """Take lock `name` for `ttl_seconds`; None when another owner holds it.

        Raises:
            ConfigurationError: `ttl_seconds` <= 0.
            StoreUnavailable / StorageError: Redis failed (wraps the cause).
        """
        ttl = validate_ttl(ttl_seconds)
        owner = new_owner_token()
        started = self.clock()
        taken = self._call(ACQUIRE, name, owner, max(1, int(ttl * 1000)))
        if not taken:
            return None
        return Lease(name=name, owner=owner, ttl_seconds=ttl, acquired_at=started,
                     valid_until=started + ttl, clock=self.clock)

    def extend(self, lease: Lease, *, ttl_seconds: float | None = None) -> bool:
        """Reset the lease to `ttl_seconds` (default: its TTL) from now; False when lost."""
        ttl = validate_ttl(ttl_seconds if ttl_seconds is not None else lease.ttl_seconds)
        started = self.clock()
        if not self._call(EXTEND, lease.name, lease.owner, max(1, int(ttl * 1000))):
            return False
        lease.valid_until = started + ttl
        lease.extensions += 1
        return True

    def release(self, lease: Lease) -> bool:
        """Give the lock back; False when it was no longer ours (expired, taken over)."""
        return bool(self._call(RELEASE, lease.name, lease.owner))

    def locked(self, name: str) -> bool:
        """True when someone (anyone) holds lock `name`."""
        key = lock_key(name)
        with wrap_store_errors("checking lock", lock=name, node=self._node):
            return bool(self.client.exists(key))

    def _call(self, script: LuaScript, name: str, *args: Any) -> Any:
        key = lock_key(name)
        with wrap_store_errors("lock", lock=name, node=self._node):
            return script(self.client, [key], args)

