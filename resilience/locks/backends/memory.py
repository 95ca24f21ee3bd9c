"""In-memory locks and fencing tokens (`resilience_stores = "memory"`, `resilience.testing`).

One process, thread-safe; what a unit test can observe behaves as on the servers
(docs/library.md says how), except that a fencing mark is advanced at once: it does not
roll back with the caller's transaction. `MemoryStores.reset()` empties them between tests.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from resilience.errors import LockNotOwnedError
from resilience.holders import Holder
from resilience.locks.backends import Claimant, Lease, Taken, validate_ttl

if TYPE_CHECKING:
    from resilience.stores import Stores

#: `Stores.backend` kind of the fencing counter shared by singletons and exclusive locks.
FENCING_KIND = "fencing"


class MemoryFencingTokens:
    """The in-memory twin of `FencingTokens`: a counter and per-key high-water marks."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last = 0
        self.marks: dict[str, int] = {}

    def mint(self, key: str) -> int:
        """A new token, larger than every token minted before (for any key)."""
        with self._lock:
            self._last += 1
            return self._last

    def advance(self, key: str, token: int) -> int | None:
        """Raise `key`'s mark to `token` at once (equal passes); the newer mark that refuses
        it, or None when admitted (`FencingTokens.guard_write` raises)."""
        with self._lock:
            newest = self.marks.get(key)
            if newest is not None and newest > token:
                return newest
            self.marks[key] = token
            return None


def memory_fencing(stores: Stores) -> MemoryFencingTokens:
    """The fencing twin of in-memory `stores` (one per stores, made on first use)."""
    return stores.backend(FENCING_KIND, _no_server, memory=MemoryFencingTokens)


def _no_server(stores: Stores) -> Any:
    raise AssertionError("memory_fencing is for in-memory stores only")


@dataclass
class _Entry:
    owner: str
    claimant: Claimant
    token: int | None
    acquired_at: float
    lease: Lease | None


class MemoryLockBackend:
    """Locks of one kind ("singleton" or "exclusive") in this process's memory.

    `Stores.backend(kind, ..., memory=...)` hands out one per kind; an `@exclusive` guard
    uses `leased(ttl_seconds)`, a view on the same table whose acquisitions expire.

    Args:
        kind: "singleton" (no expiry) or "exclusive".
        stores: the in-memory stores (their fencing twin mints the tokens).
        clock: monotonic seconds (injectable).
    """

    def __init__(self, kind: str, stores: Stores,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.kind = kind
        self.stores = stores
        self.clock = clock
        self.ttl_seconds: float | None = None
        self.fencing = True
        self._lock = threading.Lock()
        self._held: dict[str, _Entry] = {}

    def leased(self, ttl_seconds: float, *, fencing: bool = True) -> MemoryLockBackend:
        """A view on this table whose acquisitions are leases of `ttl_seconds`."""
        view = object.__new__(MemoryLockBackend)
        view.__dict__.update(self.__dict__)  # the same lock and table
        view.ttl_seconds = validate_ttl(ttl_seconds)
        view.fencing = fencing
        return view

    def _alive(self, entry: _Entry) -> bool:
        return entry.lease is None or entry.lease.valid()

    def acquire(self, key: str, claimant: Claimant) -> Taken | None:
        """Take `key` unless a live holder has it (an expired lease is taken over)."""
        with self._lock:
            entry = self._held.get(key)
            if entry is not None and self._alive(entry):
                return None
            owner = uuid.uuid4().hex
            token = memory_fencing(self.stores).mint(key) if self.fencing else None
            now = self.clock()
            lease = None
            if self.ttl_seconds is not None:
                lease = Lease(name=key, owner=owner, ttl_seconds=self.ttl_seconds,
                              acquired_at=now, valid_until=now + self.ttl_seconds,
                              fencing_token=token, clock=self.clock)
            self._held[key] = _Entry(owner=owner, claimant=claimant, token=token,
                                     acquired_at=now, lease=lease)
        return Taken(key=key, owner=owner, token=token, lease=lease)

    def _own(self, taken: Taken) -> _Entry | None:
        entry = self._held.get(taken.key)
        if entry is None or entry.owner != taken.owner or not self._alive(entry):
            return None
        return entry

    def check(self, taken: Taken) -> None:
        with self._lock:
            if self._own(taken) is None:
                raise LockNotOwnedError(
                    f"{self.kind} lock {taken.key!r} is no longer held (lease expired or "
                    "taken over); stopping before commit", key=taken.key, token=taken.token)

    def extend(self, taken: Taken) -> bool:
        with self._lock:
            entry = self._own(taken)
            if entry is None:
                return False
            if entry.lease is not None:
                entry.lease.valid_until = self.clock() + entry.lease.ttl_seconds
                entry.lease.extensions += 1
            return True

    def release(self, taken: Taken) -> None:
        with self._lock:
            entry = self._own(taken)
            if entry is None:
                raise LockNotOwnedError(
                    f"{self.kind} lock {taken.key!r} was no longer held at release",
                    key=taken.key, token=taken.token)
            del self._held[taken.key]

    def _holder(self, key: str, entry: _Entry) -> Holder:
        return Holder(kind=self.kind, key=key, owner=entry.claimant.task_id or entry.owner,
                      token=entry.token,
                      held_seconds=round(self.clock() - entry.acquired_at, 3),
                      alive=self._alive(entry))

    def holder(self, key: str) -> Holder | None:
        with self._lock:
            entry = self._held.get(key)
            if entry is None or not self._alive(entry):
                return None
            return self._holder(key, entry)

    def holders(self) -> list[Holder]:
        """Every lock in the table (`alive` False for a lapsed lease)."""
        with self._lock:
            return [self._holder(key, entry) for key, entry in sorted(self._held.items())]
