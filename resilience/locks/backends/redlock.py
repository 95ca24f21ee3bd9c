"""Redlock: one lock over N independent Redis nodes, granted by a majority.

Acquisition, timeline of one attempt:

    t0 = monotonic()
    send SET NX PX ttl to all N nodes, then read all replies      (one round trip, not N)
    granted = nodes that answered 1
    validity = ttl - (monotonic() - t0) - drift,  drift = ttl * drift_factor + 2 ms
    granted >= N//2+1 and validity > 0  → held until t0 + ttl - drift on our clock
    otherwise                           → release on ALL nodes (a node may have set the key
                                          even if its reply was lost), wait a random
                                          jittered delay, try again (bounded attempts)

Fewer than a majority of nodes answering is an outage, not contention: `StoreUnavailable`
naming the dead nodes, so the caller fails closed. Redlock's limits (nodes restarting
empty, paused holders) and the fencing tokens that cover them: docs/locks.md.
"""

from __future__ import annotations

import contextlib
import logging
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from resilience.config import check
from resilience.connections.redis import check_redis_url, client_for
from resilience.errors import ConfigurationError, LockError, StoreUnavailable
from resilience.holders import Holder
from resilience.locks.backends import Claimant, Lease, Taken, validate_ttl
from resilience.locks.backends.redis import (
    ACQUIRE,
    EXTEND,
    RELEASE,
    LeaseLock,
    describe,
    lock_key,
    new_owner_token,
    run_on_nodes,
)

if TYPE_CHECKING:
    import redis

    from resilience.locks.backends.postgres import HeldLockRegistry
    from resilience.locks.fencing import FencingTokens
    from resilience.scripts import LuaScript

logger = logging.getLogger("resilience.locks")

#: Fewest nodes that make a majority meaningful (2 nodes cannot survive one failure).
MIN_NODES = 3


def require_node_count(nodes: int) -> None:
    """Refuse fewer than 3 Redlock nodes.

    Raises:
        ConfigurationError: `nodes` < 3.
    """
    if nodes < MIN_NODES:
        raise ConfigurationError(
            f"Redlock needs at least {MIN_NODES} independent Redis nodes, got {nodes}: with "
            "fewer, one node failure loses the lock or blocks it (set REDLOCK_URLS to 3 or 5 "
            "comma-separated redis:// URLs)", nodes=nodes)


@dataclass(frozen=True, kw_only=True)
class RedlockConfig:
    """How hard Redlock tries and how much clock drift it allows.

    Args:
        retry_count: attempts after the first one before giving up (bounded, >= 0).
        retry_delay_seconds: upper bound of the random delay between attempts (full jitter).
        clock_drift_factor: fraction of the TTL assumed lost to clock drift between nodes.
    """

    retry_count: int = 3
    retry_delay_seconds: float = 0.2
    clock_drift_factor: float = 0.01

    def __post_init__(self) -> None:
        check(self, "retry_count", ">= 0", lambda v: v >= 0)
        check(self, "retry_delay_seconds", ">= 0", lambda v: v >= 0)
        check(self, "clock_drift_factor", "in [0, 0.5)", lambda v: 0 <= v < 0.5)


class Redlock(LeaseLock):
    """A lock manager over N >= 3 independent Redis nodes (`REDLOCK_URLS`).

    Args:
        clients: one client per node; short socket timeouts keep a dead node cheap.
        options: retries, jitter and drift allowance.
        clock, sleep, rng: injectable for tests (monotonic seconds, sleep, random in [0, 1)).

    Raises:
        ConfigurationError: fewer than 3 nodes.
    """

    def __init__(self, clients: Sequence[redis.Redis], *, options: RedlockConfig | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep,
                 rng: Callable[[], float] = random.random) -> None:
        require_node_count(len(clients))
        self.clients = list(clients)
        self.options = options or RedlockConfig()
        self.clock, self.sleep, self.rng = clock, sleep, rng

    @property
    def quorum(self) -> int:
        return len(self.clients) // 2 + 1

    @classmethod
    def from_urls(cls, urls: Sequence[str], *, check: bool = True,
                  timeout_seconds: float = 0.5, **kwargs: Any) -> Redlock:
        """Build on the process's clients of the node URLs (`connections.redis.client_for`);
        with `check`, refuse to start when any node is unreachable.

        Raises:
            ConfigurationError: fewer than 3 URLs, or a URL that is not redis://.
            StoreUnavailable: `check` and a node did not answer PING.
        """
        for url in urls:
            check_redis_url(url, "a Redlock node URL")
        clients = [client_for(url, socket_timeout=timeout_seconds,
                              socket_connect_timeout=timeout_seconds) for url in urls]
        lock = cls(clients, **kwargs)
        if check:
            lock.check_nodes()
        return lock

    def check_nodes(self) -> None:
        """PING every node.

        Raises:
            StoreUnavailable: a node did not answer.
        """
        dead = []
        for client in self.clients:
            try:
                client.ping()
            except Exception as exc:  # noqa: BLE001 - reported together below
                dead.append(f"{describe(client)} ({type(exc).__name__}: {exc})")
        if dead:
            raise StoreUnavailable(
                f"Redlock: {len(dead)} of {len(self.clients)} nodes unreachable at start: "
                + "; ".join(dead), unreachable=dead)

    # -- the algorithm (LeaseLock validates, then calls do_*) ----------------------------
    def do_acquire(self, name: str, ttl_seconds: float) -> Lease | None:
        """The bounded attempts of the timeline above, each one fan-out of SET NX PX."""
        key = lock_key(name)
        failures: list[str] = []
        for attempt in range(self.options.retry_count + 1):
            if attempt:
                self.sleep(self.rng() * self.options.retry_delay_seconds)
            owner = new_owner_token()
            replies, started, valid_until = self._round(ACQUIRE, key, owner, ttl_seconds)
            if valid_until is not None:
                return Lease(name=name, owner=owner, ttl_seconds=ttl_seconds,
                             acquired_at=started, valid_until=valid_until, clock=self.clock)
            # Not ours: undo the partial grant everywhere, including nodes whose reply was lost.
            run_on_nodes(self.clients, RELEASE, key, [owner])
            failures = [f"{describe(client)} ({type(reply).__name__}: {reply})"
                        for client, reply in zip(self.clients, replies, strict=True)
                        if isinstance(reply, BaseException)]
        if len(self.clients) - len(failures) < self.quorum:
            raise StoreUnavailable(
                f"Redlock: lock {name!r} unavailable, only {len(self.clients) - len(failures)} "
                f"of {len(self.clients)} nodes answered and {self.quorum} are needed: "
                + "; ".join(failures), key=name, unreachable=failures)
        return None

    def do_extend(self, lease: Lease, ttl_seconds: float) -> bool:
        """One fan-out of the owner-checked PEXPIRE (none for a lease already past its
        validity); False when lost (no quorum or late)."""
        if not lease.valid():
            return False
        _, _, valid_until = self._round(EXTEND, lock_key(lease.name), lease.owner, ttl_seconds)
        if valid_until is None:
            return False
        lease.valid_until = valid_until
        lease.extensions += 1
        return True

    def _round(self, script: LuaScript, key: str, owner: str,
               ttl_seconds: float) -> tuple[list[Any], float, float | None]:
        """One fan-out of `script` (owner, TTL in ms): the replies, when it was sent, and the
        lease's new deadline `t0 + ttl - drift`, None without a quorum or validity left."""
        drift = ttl_seconds * self.options.clock_drift_factor + 0.002
        started = self.clock()
        replies = run_on_nodes(self.clients, script, key,
                               [owner, max(1, int(ttl_seconds * 1000))])
        granted = sum(1 for reply in replies if reply == 1)
        if granted >= self.quorum and ttl_seconds - (self.clock() - started) - drift > 0:
            return replies, started, started + ttl_seconds - drift
        return replies, started, None

    def do_release(self, lease: Lease) -> bool:
        """One fan-out of the owner-checked DEL on every node (also those that may have
        expired it); True when a majority still held our token."""
        replies = run_on_nodes(self.clients, RELEASE, lock_key(lease.name), [lease.owner])
        return sum(1 for reply in replies if reply == 1) >= self.quorum

    def owned(self, lease: Lease) -> bool:
        """True when a majority of nodes still hold `lease`'s token and it has time left."""
        return lease.valid() and self.holders(lease.name).count(lease.owner) >= self.quorum

    def locked(self, name: str) -> bool:
        """True when a majority of nodes hold some owner's token for `name`."""
        return len(self.holders(name)) >= self.quorum

    def holders(self, name: str) -> list[str]:
        """Owner tokens found on the nodes that answered (one per node holding the key)."""
        found = []
        for client in self.clients:
            try:
                value = client.get(lock_key(name))
            except Exception:  # noqa: BLE001 - a dead node holds nothing we can see
                continue
            if value is not None:
                found.append(value.decode() if isinstance(value, bytes) else value)
        return found

    def force_release(self, name: str) -> int:
        """Delete lock `name` on every node whoever holds it (admin); nodes that held it."""
        deleted = 0
        for client in self.clients:
            try:
                deleted += int(client.delete(lock_key(name)))
            except Exception:  # noqa: BLE001 - best effort on a dead node
                continue
        return deleted


class RedlockBackend:
    """`@exclusive`'s store: a Redlock lease, a fencing token and a registry row per holder.

    Args:
        redlock: the lock manager over the nodes.
        registry: where holders are recorded (`HeldLockRegistry`).
        tokens: mints fencing tokens (`FencingTokens`); None: no token.
        ttl_seconds: the lease length of every acquisition (`ExclusiveConfig.ttl_seconds`).
    """

    kind = "exclusive"

    def __init__(self, redlock: Redlock, *, registry: HeldLockRegistry,
                 tokens: FencingTokens | None = None, ttl_seconds: float = 60.0) -> None:
        self.redlock = redlock
        self.registry = registry
        self.tokens = tokens
        self.ttl_seconds = validate_ttl(ttl_seconds)

    def acquire(self, key: str, claimant: Claimant) -> Taken | None:
        """Lease on a quorum, then mint the token and register; undone if either fails."""
        lease = self.redlock.acquire(key, ttl_seconds=self.ttl_seconds)
        if lease is None:
            return None
        try:
            if self.tokens is not None:
                lease.fencing_token = self.tokens.mint(key)
                if not lease.valid():
                    # Minted after the lease ran out: a later holder may hold a smaller
                    # token, so this one must not be used (see fencing.py's timeline).
                    self._give_up(lease)
                    return None
            self.registry.register(key, kind=self.kind, owner=lease.owner, claimant=claimant,
                                   token=lease.fencing_token, ttl_seconds=lease.ttl_seconds)
        except BaseException:
            self._give_up(lease)
            raise
        return Taken(key=key, owner=lease.owner, token=lease.fencing_token, lease=lease)

    def check(self, taken: Taken) -> None:
        """The lease still has time on this process's clock (no round trip)."""
        if taken.lease is not None:
            taken.lease.check()

    def extend(self, taken: Taken) -> bool:
        """Renew the lease on a quorum for its TTL; False when lost."""
        return self.redlock.extend(taken.lease)

    def release(self, taken: Taken) -> None:
        """Release on every node, then delete the registry row (informational: logged)."""
        try:
            self.redlock.release(taken.lease)
        finally:
            try:
                self.registry.unregister(taken.key, taken.owner)
            except Exception as exc:  # noqa: BLE001 - the registry is informational
                logger.warning("exclusive: registry cleanup of %s failed: %s", taken.key, exc)

    def holder(self, key: str) -> Holder | None:
        """The registered holder of `key` (task id, token, since when)."""
        return self.registry.holder(key)

    def holders(self) -> list[Holder]:
        """Every registered exclusive lock, alive while a majority holds its owner's token."""
        return self.registry.holders(
            self.kind, lambda key, owner: owner in self.redlock.holders(key))

    def _give_up(self, lease: Lease) -> None:
        with contextlib.suppress(LockError):
            self.redlock.release(lease)
