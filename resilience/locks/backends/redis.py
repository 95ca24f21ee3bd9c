"""Redis locks: the three Lua scripts, a single-node `RedisLock`, and the node fan-out.

A lock is a Redis string holding a random owner token with a mandatory TTL. Release and
extend are owner-checked in Lua, so a holder whose lease expired can never delete or
prolong the next holder's lock. `Redlock` (redlock.py) runs the same three scripts on N
independent nodes; `run_on_nodes` sends a script to every node before reading any reply,
so N nodes cost about one round trip, not N.
`locked()` says someone holds the name, `owned()` that this lease still does.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from redis.exceptions import NoScriptError

from resilience.connections import StoreBackend, wrap_store_errors
from resilience.errors import LockError, LockNotOwnedError
from resilience.keys import redis_key
from resilience.locks.backends import Lease, validate_ttl
from resilience.scripts import LuaScript

if TYPE_CHECKING:
    import redis

#: Namespace of every lock key, so `jobs locks` and operators can find them.
LOCK_NAMESPACE = "resilience:lock"

#: SET NX PX: take the lock when nobody holds it (acquire.lua has the contract).
ACQUIRE = LuaScript.load(__file__, "acquire.lua")
#: DEL only when the caller still owns it (release.lua).
RELEASE = LuaScript.load(__file__, "release.lua")
#: PEXPIRE only when the caller still owns it (extend.lua).
EXTEND = LuaScript.load(__file__, "extend.lua")


def new_owner_token() -> str:
    """A random owner token; unguessable, so no other process can release our lock."""
    return secrets.token_hex(16)


def lock_key(name: str) -> str:
    """The Redis key of lock `name`: `resilience:lock:{<name>}` (see `resilience.keys`)."""
    return redis_key(LOCK_NAMESPACE, name)


def describe(client: redis.Redis) -> str:
    """host:port of a client, for error messages (a Sentinel client: its service name; a
    Redis Cluster client: its first node and `+cluster`)."""
    pool = getattr(client, "connection_pool", None)
    if pool is None:  # redis.cluster.RedisCluster: a pool per node
        nodes = getattr(getattr(client, "nodes_manager", None), "startup_nodes", None) or {}
        return f"{next(iter(nodes), '?')}+cluster"
    service = getattr(pool, "service_name", None)
    if service is not None:  # redis.sentinel.SentinelConnectionPool
        return f"sentinel:{service}"
    kwargs = pool.connection_kwargs
    return f"{kwargs.get('host', '?')}:{kwargs.get('port', '?')}"


def run_on_nodes(
    clients: Sequence[redis.Redis], script: LuaScript, key: str, args: Sequence[Any]
) -> list[Any]:
    """Run `script` on every node concurrently: all requests go out before any reply is read,
    each on a connection of the node's own pool (a Redis Cluster node, which no single
    connection serves, is called the ordinary way in the reply loop).

    Returns one entry per node: the script's reply, or the exception that node raised
    (connection refused, timeout, error reply). Never raises for a node failure, because
    the caller decides by quorum. A connection that failed is disconnected and reconnects
    on its next use.
    """
    taken: list[tuple[Any, BaseException | None]] = []
    try:
        for client in clients:
            pool = getattr(client, "connection_pool", None)
            if pool is None:
                taken.append((None, None))
                continue
            connection = None
            try:
                connection = pool.get_connection()
                connection.send_command("EVALSHA", script.sha, 1, key, *args)
            except Exception as exc:  # noqa: BLE001 - a dead node is one vote lost
                if connection is not None:
                    connection.disconnect()  # released with the others below
                taken.append((connection, exc))
                continue
            taken.append((connection, None))
        replies: list[Any] = []
        for client, (connection, failure) in zip(clients, taken, strict=True):
            if failure is not None:
                replies.append(failure)
                continue
            try:
                if connection is None:
                    replies.append(script(client, [key], args))
                    continue
                try:
                    replies.append(connection.read_response())
                except NoScriptError:
                    # First use of the script on this node (or the node restarted empty).
                    connection.send_command("EVAL", script.text, 1, key, *args)
                    replies.append(connection.read_response())
            except Exception as exc:  # noqa: BLE001 - counted as a failed node by the caller
                if connection is not None:
                    connection.disconnect()
                replies.append(exc)
        return replies
    finally:
        for client, (connection, _) in zip(clients, taken, strict=False):
            if connection is not None:
                client.connection_pool.release(connection)


class LeaseLock:
    """The public steps of `RedisLock` and `Redlock` (as redis-py's `Lock`): validate, then
    call the subclass's `do_acquire(name, ttl)`, `do_extend(lease, ttl)`, `do_release(lease)`.
    """

    def acquire(self, name: str, *, ttl_seconds: float) -> Lease | None:
        """Take lock `name` for `ttl_seconds`; None when another owner holds it.

        Raises:
            ConfigurationError: `ttl_seconds` <= 0.
            StoreUnavailable / StorageError: Redis failed (Redlock: no quorum answered).
        """
        return self.do_acquire(name, validate_ttl(ttl_seconds))

    def extend(self, lease: Lease | None, *, ttl_seconds: float | None = None) -> bool:
        """Reset the lease to `ttl_seconds` (default: its TTL) from now; False when lost.

        Raises:
            LockError: `lease` is None.  ConfigurationError: `ttl_seconds` <= 0.
        """
        lease = _acquired(lease, "extend")
        return self.do_extend(lease, validate_ttl(
            lease.ttl_seconds if ttl_seconds is None else ttl_seconds))

    def release(self, lease: Lease | None) -> None:
        """Give the lock back.

        Raises:
            LockError: `lease` is None (never acquired).
            LockNotOwnedError: the lock was no longer ours (expired, taken over).
            StorageError: Redis failed (wraps the cause).
        """
        lease = _acquired(lease, "release")
        if not self.do_release(lease):
            raise LockNotOwnedError(
                f"lock {lease.name!r} was no longer held at release (it expired or another "
                "owner took it)", key=lease.name, token=lease.fencing_token)


def _acquired(lease: Lease | None, action: str) -> Lease:
    if lease is None:
        raise LockError(f"cannot {action} a lock that was never acquired")
    return lease


class RedisLock(LeaseLock, StoreBackend):
    """A lock on one Redis node: simple and fast, but that node is a single point of failure.

    Args:
        client: the Redis holding the lock.
        clock: monotonic clock (injectable for tests).
    """

    store_operation = "lock"

    def __init__(self, client: redis.Redis, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.client = client
        self.clock = clock
        self._node = describe(client)

    def do_acquire(self, name: str, ttl_seconds: float) -> Lease | None:
        """One SET NX PX of a new owner token; the lease, or None when the name is taken."""
        owner = new_owner_token()
        started = self.clock()
        if not self._call(ACQUIRE, name, owner, max(1, int(ttl_seconds * 1000))):
            return None
        return Lease(name=name, owner=owner, ttl_seconds=ttl_seconds, acquired_at=started,
                     valid_until=started + ttl_seconds, clock=self.clock)

    def do_extend(self, lease: Lease, ttl_seconds: float) -> bool:
        """One owner-checked PEXPIRE; moves the lease's deadline when it succeeded."""
        started = self.clock()
        if not self._call(EXTEND, lease.name, lease.owner, max(1, int(ttl_seconds * 1000))):
            return False
        lease.valid_until = started + ttl_seconds
        lease.extensions += 1
        return True

    def do_release(self, lease: Lease) -> bool:
        """One owner-checked DEL; False when the lock was not ours any more."""
        return bool(self._call(RELEASE, lease.name, lease.owner))

    def locked(self, name: str) -> bool:
        """True when someone (anyone) holds lock `name`."""
        return bool(self.client.exists(lock_key(name)))

    def owned(self, lease: Lease) -> bool:
        """True when `lease` still holds its lock (its token is the one stored)."""
        value = self.client.get(lock_key(lease.name))
        if isinstance(value, bytes):
            value = value.decode()
        return value == lease.owner

    def _call(self, script: LuaScript, name: str, *args: Any) -> Any:
        with wrap_store_errors("lock", lock=name, node=self._node):
            return script(self.client, [lock_key(name)], args)
