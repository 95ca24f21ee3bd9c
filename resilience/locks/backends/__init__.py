"""Storage of the locks: the few atomic steps the lock flow (`resilience.locks.guards`) needs.

A backend hands the flow a `Taken` per acquisition and gets it back to check, extend and
release it; holders are reported as `resilience.holders.Holder`s. `AdvisoryLockBackend`
(postgres.py) serves `@singleton`, `RedlockBackend` (redlock.py) `@exclusive`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from resilience.errors import ConfigurationError, LockNotOwnedError
from resilience.holders import Holder


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


@dataclass
class Lease:
    """One acquisition of an expiring lock: who owns it and until when (on this process's clock).

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
        """True while the lease has time left on this process's clock."""
        return self.remaining_seconds() > 0

    def check(self, why: str = "") -> None:
        """Raise LockNotOwnedError once the lease is past its deadline (`why` says more)."""
        if not self.valid():
            raise LockNotOwnedError(
                f"lock {self.name!r} lease expired {-self.remaining_seconds():.3f}s ago{why}; "
                "stopping before commit", key=self.name, token=self.fencing_token)


@dataclass(frozen=True)
class Claimant:
    """Who asks for a lock: recorded in the registry and named in holder reports."""

    task_id: str | None
    task_name: str
    #: The body receives the fencing token: its minting must survive a PostgreSQL crash.
    fenced: bool = False


@dataclass
class Taken:
    """One acquisition, as a backend hands it to the flow and gets it back.

    Args:
        key: the lock key (`GuardKey.full`).
        owner: the store's owner of the lock (advisory: the backend pid; Redlock: the token).
        token: the fencing token minted for this acquisition, if any.
        lease: the expiring lease a heartbeat renews (Redlock); None for a session lock.
        handle: the backend's own state (the advisory session), opaque to the flow.
    """

    key: str
    owner: str
    token: int | None = None
    lease: Lease | None = None
    handle: Any = field(default=None, repr=False)


class LockBackend(Protocol):
    """Where locks live; each step is one store operation (a statement, a script fan-out)."""

    #: The kind of lock it holds, as `Holder.kind` reports it ("singleton", "exclusive").
    kind: str

    def acquire(self, key: str, claimant: Claimant) -> Taken | None:
        """Take `key` without waiting and register the holder; None when another holds it.

        Raises:
            StorageError: the store failed (a `StoreUnavailable` when it may work later).
        """

    def check(self, taken: Taken) -> None:
        """Raises LockNotOwnedError when `taken` is no longer held (called before a commit)."""

    def extend(self, taken: Taken) -> bool:
        """Renew an expiring lock for its TTL; False when it is lost."""

    def release(self, taken: Taken) -> None:
        """Give `taken` back and unregister it.

        Raises:
            LockNotOwnedError: it was no longer held (expired, taken over, session gone).
        """

    def holder(self, key: str) -> Holder | None:
        """Who holds `key` now, or None (refusals name the holder)."""

    def holders(self) -> list[Holder]:
        """Every registered lock of this kind, `alive` checked against the lock itself."""


class SessionLockBackend(LockBackend, Protocol):
    """A backend whose locks live as long as a session (advisory locks): the guard watches
    that session while the body runs (`resilience.locks.watcher`)."""

    def probe(self, taken: Taken) -> None:
        """One cheap statement on `taken`'s session.

        Raises:
            StorageError: the session is gone.  LockNotOwnedError: it moved.
        """

    def abandon(self, taken: Taken) -> None:
        """Give up `taken`, known lost, without waiting on its session (closed aside)."""
