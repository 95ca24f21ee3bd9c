"""`Heartbeat`: a lease renewed in the background, and its loss reported."""

from __future__ import annotations

import time
from typing import Any

import pytest

from resilience.errors import LockNotOwnedError
from resilience.locks import Heartbeat, HeartbeatConfig, Lease, RedisLock
from resilience.locks.backends.redis import lock_key


class TestHeartbeat:
    def test_renews_until_stopped(self, redis_client: Any) -> None:
        """The lease is extended in the background, so it outlives its TTL."""
        lock = RedisLock(redis_client)
        lease = lock.acquire("hb", ttl_seconds=0.3)
        assert lease is not None
        heartbeat = Heartbeat(lease, lock.extend, HeartbeatConfig(renew_fraction=0.3)).start()
        time.sleep(0.8)
        heartbeat.check()
        assert lease.extensions >= 2 and lock.locked("hb")
        heartbeat.stop()

    def test_failed_extension_is_reported(self, redis_client: Any) -> None:
        """When the lock is taken away, check() raises LockNotOwnedError."""
        lock = RedisLock(redis_client)
        lease = lock.acquire("hb2", ttl_seconds=0.3)
        assert lease is not None
        heartbeat = Heartbeat(lease, lock.extend, HeartbeatConfig(renew_fraction=0.3)).start()
        redis_client.delete(lock_key("hb2"))
        time.sleep(0.4)
        with pytest.raises(LockNotOwnedError, match="lost"):
            heartbeat.check()
        heartbeat.stop()

    def test_cap_on_extensions(self, redis_client: Any) -> None:
        lock = RedisLock(redis_client)
        lease = lock.acquire("hb3", ttl_seconds=0.2)
        assert lease is not None
        heartbeat = Heartbeat(
            lease, lock.extend, HeartbeatConfig(renew_fraction=0.25, max_extensions=1)
        ).start()
        time.sleep(0.4)
        with pytest.raises(LockNotOwnedError, match="cap"):
            heartbeat.check()
        heartbeat.stop()

    def test_paused_holder_expired_deadline(self) -> None:
        """A holder whose monotonic deadline passed learns it without any Redis call."""
        now = [0.0]
        lease = Lease(name="p", owner="o", ttl_seconds=1, acquired_at=0, valid_until=1,
                      clock=lambda: now[0])
        heartbeat = Heartbeat(lease, lambda _: True)
        heartbeat.check()
        now[0] = 5.0
        with pytest.raises(LockNotOwnedError, match="expired"):
            heartbeat.check()
