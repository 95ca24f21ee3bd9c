"""`Redlock` over five real, independent Redis nodes, in the test process."""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Any

import pytest

from resilience.errors import ConfigurationError, LockError, LockNotOwnedError, StoreUnavailable
from resilience.locks import Redlock, RedlockConfig
from resilience.locks.backends.redis import lock_key
from tests.resilience.locks.conftest import Nodes


def _clients(nodes: Nodes) -> list[Any]:
    import redis

    return [redis.Redis.from_url(url, socket_timeout=0.5, socket_connect_timeout=0.5)
            for url in nodes.urls]


def _redlock(nodes: Nodes, **options: Any) -> Redlock:
    return Redlock.from_urls(nodes.urls, options=RedlockConfig(**options))


def _redlock_unchecked(nodes: Nodes, **options: Any) -> Redlock:
    return Redlock(_clients(nodes), options=RedlockConfig(**options))


class TestRedlock:
    def test_fewer_than_three_nodes(self, nodes: Nodes) -> None:
        """Redlock refuses fewer than 3 nodes."""
        with pytest.raises(ConfigurationError, match="at least 3"):
            Redlock.from_urls(nodes.urls[:2])

    def test_unreachable_nodes_at_start(self) -> None:
        """A node that does not answer at start is named in a clear error."""
        from jobs.embedded import free_port

        urls = [f"redis://127.0.0.1:{free_port()}/0" for _ in range(3)]
        with pytest.raises(StoreUnavailable, match="unreachable at start"):
            Redlock.from_urls(urls)

    def test_exclusion_and_release(self, nodes: Nodes) -> None:
        """A majority grant excludes others; release frees all nodes."""
        redlock = _redlock(nodes, retry_count=0)
        lease = redlock.acquire("job", ttl_seconds=5)
        assert lease is not None and lease.remaining_seconds() > 4
        assert redlock.acquire("job", ttl_seconds=5) is None
        assert redlock.extend(lease)
        redlock.release(lease)
        assert redlock.holders("job") == []

    def test_release_of_a_lost_lease_raises(self, nodes: Nodes) -> None:
        """A lease whose key is gone from the nodes raises LockNotOwnedError at release;
        releasing a lock never acquired is a LockError (misuse)."""
        redlock = _redlock(nodes, retry_count=0)
        lease = redlock.acquire("lost", ttl_seconds=5)
        assert lease is not None
        assert redlock.force_release("lost") == 5
        with pytest.raises(LockNotOwnedError, match="no longer held"):
            redlock.release(lease)
        with pytest.raises(LockError, match="never acquired"):
            redlock.release(None)

    def test_locked_is_anyone_owned_is_mine(self, nodes: Nodes) -> None:
        """locked() says someone holds the name; owned() that this lease still does."""
        redlock = _redlock(nodes, retry_count=0)
        assert not redlock.locked("who")
        mine = redlock.acquire("who", ttl_seconds=5)
        assert mine is not None
        assert redlock.locked("who") and redlock.owned(mine)
        redlock.force_release("who")
        theirs = redlock.acquire("who", ttl_seconds=5)
        assert theirs is not None
        assert redlock.locked("who") and redlock.owned(theirs) and not redlock.owned(mine)

    def test_partial_grant_is_undone_everywhere(self, nodes: Nodes) -> None:
        """When another owner holds a majority, our minority grants are released."""
        import redis

        for url in nodes.urls[:3]:
            redis.Redis.from_url(url).set(lock_key("job"), "other", px=10_000)
        redlock = _redlock(nodes, retry_count=1, retry_delay_seconds=0.01)
        assert redlock.acquire("job", ttl_seconds=5) is None
        assert redlock.holders("job") == ["other"] * 3

    def test_two_nodes_down_still_grants_and_excludes(self, nodes: Nodes) -> None:
        """With 2 of 5 nodes killed, locks are granted and no two threads hold one at once."""
        nodes.kill(0, 1)
        redlock = _redlock_unchecked(nodes, retry_count=0)
        holding = 0
        overlaps = 0
        granted = 0
        guard = threading.Lock()

        def contend() -> None:
            nonlocal holding, overlaps, granted
            for _ in range(20):
                lease = redlock.acquire("shared", ttl_seconds=5)
                if lease is None:
                    continue
                with guard:
                    holding += 1
                    granted += 1
                    overlaps += holding > 1
                time.sleep(0.002)
                with guard:
                    holding -= 1
                with contextlib.suppress(LockNotOwnedError):
                    redlock.release(lease)

        threads = [threading.Thread(target=contend) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert granted > 0
        assert overlaps == 0

    def test_three_nodes_down_fails_clearly_and_bounded(self, nodes: Nodes) -> None:
        """With 3 of 5 nodes killed acquisition raises a clear error after bounded attempts."""
        nodes.kill(0, 1, 2)
        sleeps: list[float] = []
        redlock = Redlock(
            _clients(nodes), options=RedlockConfig(retry_count=3, retry_delay_seconds=0.1),
            sleep=sleeps.append,
        )
        started = time.monotonic()
        with pytest.raises(StoreUnavailable, match="only 2 of 5 nodes answered"):
            redlock.acquire("job", ttl_seconds=5)
        elapsed = time.monotonic() - started
        assert len(sleeps) == 3 and all(0 <= s <= 0.1 for s in sleeps)
        # Bounded: attempts x per-node socket timeout; here nodes refuse connections at once.
        assert elapsed < 4 * 5 * 0.5 + 1

    def test_validity_discounts_elapsed_time_and_drift(self, nodes: Nodes) -> None:
        """validity = ttl - elapsed - drift on the injected monotonic clock."""
        ticks = iter([100.0, 100.4])
        redlock = Redlock(_clients(nodes), options=RedlockConfig(clock_drift_factor=0.01),
                          clock=lambda: next(ticks))
        lease = redlock.acquire("job", ttl_seconds=10)
        assert lease is not None
        assert lease.valid_until == pytest.approx(100.0 + 10 - 0.1 - 0.002)

    def test_too_slow_acquisition_is_not_a_lock(self, nodes: Nodes) -> None:
        """An acquisition that took longer than the TTL is given back everywhere."""
        ticks = iter([0.0, 6.0])
        redlock = Redlock(_clients(nodes), options=RedlockConfig(retry_count=0),
                          clock=lambda: next(ticks))
        assert redlock.acquire("job", ttl_seconds=5) is None
        assert Redlock(_clients(nodes)).holders("job") == []
