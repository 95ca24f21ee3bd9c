"""The `LockBackend` contract, run on every backend (`lock_backend`: advisory and Redlock)."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from sqlalchemy import text

from resilience.errors import LockNotOwnedError
from resilience.locks import Claimant

CLAIMANT = Claimant(task_id="task-1", task_name="tests.locks.backend")


def _key() -> str:
    return f"tests.locks.backend:{uuid.uuid4().hex[:8]}"


def _steal(backend: Any, taken: Any, engine: Any) -> None:
    """Take the lock away from its holder, as a crash or an operator would."""
    if backend.kind == "singleton":
        with engine.begin() as connection:
            connection.execute(text("SELECT pg_terminate_backend(:pid)"),
                               {"pid": taken.handle.backend_pid})
    else:
        backend.redlock.force_release(taken.key)


class TestLockBackend:
    def test_one_holder_until_released(self, lock_backend: Any) -> None:
        """A held key is refused to a second claimant until released, then taken again."""
        key = _key()
        taken = lock_backend.acquire(key, CLAIMANT)
        assert taken is not None and taken.key == key
        assert lock_backend.acquire(key, CLAIMANT) is None
        lock_backend.check(taken)
        lock_backend.release(taken)
        again = lock_backend.acquire(key, CLAIMANT)
        assert again is not None
        lock_backend.release(again)

    def test_each_acquisition_gets_a_newer_token(self, lock_backend: Any) -> None:
        """Both kinds mint a fencing token per acquisition; a later one is larger."""
        key = _key()
        first = lock_backend.acquire(key, CLAIMANT)
        lock_backend.release(first)
        second = lock_backend.acquire(key, CLAIMANT)
        lock_backend.release(second)
        assert first.token is not None and second.token > first.token

    def test_holder_names_the_claimant(self, lock_backend: Any) -> None:
        """holder(key) reports the holding task as `Holder.owner`, and None once released."""
        key = _key()
        taken = lock_backend.acquire(key, CLAIMANT)
        holder = lock_backend.holder(key)
        assert holder is not None
        assert (holder.kind, holder.key, holder.owner) == (lock_backend.kind, key, "task-1")
        assert holder.held_seconds is not None and holder.held_seconds >= 0
        lock_backend.release(taken)
        assert lock_backend.holder(key) is None

    def test_holders_lists_registered_locks(self, lock_backend: Any) -> None:
        """holders() lists a held lock with its owner and token, alive; none once released."""
        key = _key()
        taken = lock_backend.acquire(key, CLAIMANT)
        listed = {holder.key: holder for holder in lock_backend.holders()}
        assert listed[key].owner == "task-1"
        assert listed[key].token == taken.token
        assert listed[key].alive
        lock_backend.release(taken)
        assert key not in {holder.key for holder in lock_backend.holders()}

    def test_release_of_a_lost_lock_raises(self, lock_backend: Any, engine: Any) -> None:
        """A lock taken away from its holder raises LockNotOwnedError at release; the key
        is free for the next claimant."""
        key = _key()
        taken = lock_backend.acquire(key, CLAIMANT)
        _steal(lock_backend, taken, engine)
        with pytest.raises(LockNotOwnedError):
            lock_backend.release(taken)
        after = lock_backend.acquire(key, CLAIMANT)
        assert after is not None
        lock_backend.release(after)
