"""The operator's side of the locks: who holds what now (`describe`), and `force_release`.

The held-lock registry is informational: each row is checked against the lock itself
(`pg_locks`, the owner token on the Redlock nodes); a dead holder's row is `alive=False`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from resilience.holders import Holder
from resilience.locks.backends.postgres import (
    AdvisoryLockBackend,
    HeldLockRegistry,
    advisory_holders,
)
from resilience.locks.backends.redlock import MIN_NODES, Redlock, RedlockBackend
from resilience.locks.beat import LEADER_KEY

if TYPE_CHECKING:
    from resilience.stores import Stores

#: `Holder.kind` of the beat process holding the leader lock.
BEAT_LEADER = "beat-leader"


def describe(stores: Stores, redlock_urls: Sequence[str] = ()) -> list[Holder]:
    """Every registered lock, oldest first, checked against the real lock; then the beat leader.

    Args:
        stores: the app's stores (the registry and the advisory locks live in PostgreSQL).
        redlock_urls: the Redlock nodes; fewer than 3: exclusive rows cannot be checked and
            are reported not alive.

    Raises:
        StorageError: PostgreSQL failed (wraps the cause).
    """
    registry = HeldLockRegistry(stores.engine)
    found = AdvisoryLockBackend(stores.locks_database_url, engine=stores.engine).holders()
    if len(redlock_urls) >= MIN_NODES:
        redlock = Redlock.from_urls(redlock_urls, check=False)
        found += RedlockBackend(redlock, registry=registry).holders()
    else:
        found += registry.holders(RedlockBackend.kind, lambda _key, _owner: False)
    found.sort(key=lambda holder: -(holder.held_seconds or 0.0))
    return found + advisory_holders(stores.engine, LEADER_KEY, kind=BEAT_LEADER)


def force_release(stores: Stores, key: str, redlock_urls: Sequence[str] = ()) -> str:
    """Release `key` whoever holds it; returns what was done.

    An exclusive lock is deleted on every Redlock node (its holder's next heartbeat or
    checkpoint fails, and its fencing token is older than the next holder's). A singleton
    or the beat leader lock belongs to another session: that session is terminated, which
    frees the lock and makes the holder's checkpoint raise LockNotOwnedError.
    """
    done = []
    if len(redlock_urls) >= MIN_NODES:
        deleted = Redlock.from_urls(redlock_urls, check=False).force_release(key)
        if deleted:
            done.append(f"deleted on {deleted} Redlock node(s)")
    advisory = AdvisoryLockBackend(stores.locks_database_url, engine=stores.engine)
    terminated = advisory.terminate_holders(key)
    if terminated:
        done.append(f"terminated {terminated} PostgreSQL session(s) holding it")
    if HeldLockRegistry(stores.engine).remove(key):
        done.append("registry entry removed")
    return "; ".join(done) or "not held"
