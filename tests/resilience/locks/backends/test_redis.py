"""`RedisLock` on one real Redis node, in the test process."""

from __future__ import annotations

from typing import Any

import pytest

from resilience.errors import ConfigurationError, LockError, LockNotOwnedError
from resilience.locks import Lease, RedisLock
from resilience.locks.backends.redis import lock_key


def _stranger() -> Lease:
    return Lease(name="k", owner="not-me", ttl_seconds=5, acquired_at=0, valid_until=0)


class TestRedisLock:
    def test_ttl_must_be_positive(self, redis_client: Any) -> None:
        """A TTL <= 0 is refused at acquisition."""
        with pytest.raises(ConfigurationError, match="ttl_seconds"):
            RedisLock(redis_client).acquire("x", ttl_seconds=0)

    def test_owner_checked_release_and_extend(self, redis_client: Any) -> None:
        """Only the owner can release or extend; a second acquire waits for release."""
        lock = RedisLock(redis_client)
        lease = lock.acquire("k", ttl_seconds=5)
        assert lease is not None
        assert lock.acquire("k", ttl_seconds=5) is None
        with pytest.raises(LockNotOwnedError):
            lock.release(_stranger())
        assert lock.extend(_stranger()) is False
        assert lock.extend(lease) is True
        lock.release(lease)
        assert lock.acquire("k", ttl_seconds=5) is not None

    def test_release_of_a_lost_lock_raises(self, redis_client: Any) -> None:
        """A lock that expired or was taken over raises LockNotOwnedError at release, and
        leaves the new holder's lock in place."""
        lock = RedisLock(redis_client)
        lease = lock.acquire("lost", ttl_seconds=5)
        assert lease is not None
        redis_client.delete(lock_key("lost"))
        theirs = lock.acquire("lost", ttl_seconds=5)
        assert theirs is not None
        with pytest.raises(LockNotOwnedError, match="no longer held") as raised:
            lock.release(lease)
        assert raised.value.key == "lost"  # type: ignore[attr-defined]
        assert lock.owned(theirs)

    def test_release_of_a_lock_never_acquired_is_misuse(self, redis_client: Any) -> None:
        """release(None) or extend(None) (an acquire that returned None) is a LockError."""
        lock = RedisLock(redis_client)
        with pytest.raises(LockError, match="never acquired") as raised:
            lock.release(None)
        assert not isinstance(raised.value, LockNotOwnedError)
        with pytest.raises(LockError, match="never acquired"):
            lock.extend(None)

    def test_locked_is_anyone_owned_is_mine(self, redis_client: Any) -> None:
        """locked() says someone holds the name; owned() that this lease still does."""
        lock = RedisLock(redis_client)
        assert not lock.locked("who")
        lease = lock.acquire("who", ttl_seconds=5)
        assert lease is not None
        assert lock.locked("who") and lock.owned(lease)
        stranger = Lease(name="who", owner="not-me", ttl_seconds=5, acquired_at=0,
                         valid_until=0)
        assert lock.locked("who") and not lock.owned(stranger)
        lock.release(lease)
        assert not lock.locked("who") and not lock.owned(lease)
