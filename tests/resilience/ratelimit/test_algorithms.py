"""The limit algorithms on every backend: in-memory (fake clock) and real Redis."""

from __future__ import annotations

import itertools
import threading
import uuid
from typing import Any

import pytest

from resilience.errors import ConfigurationError, StorageError, StoreUnavailable
from resilience.ratelimit import (
    ConcurrencyLimitConfig,
    MemoryBackend,
    RateLimitConfig,
    RedisBackend,
    limit_concurrency,
    rate_limit,
)

pytestmark = pytest.mark.timeout(60)


class FakeClock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(params=["memory", "redis"])
def backend(request: Any) -> Any:
    if request.param == "memory":
        return MemoryBackend(clock=FakeClock())
    client = request.getfixturevalue("redis_client")
    return RedisBackend(client, prefix=f"test:{uuid.uuid4().hex[:6]}")


def key() -> str:
    return uuid.uuid4().hex[:8]


class TestGcra:
    def test_burst_then_deny_with_retry_after(self, backend: Any) -> None:
        """burst permits pass at once; the next is denied with a positive retry-after."""
        name = key()
        decisions = [backend.gcra(name, interval_seconds=60, burst=3) for _ in range(4)]
        assert [d.allowed for d in decisions] == [True, True, True, False]
        assert 0 < decisions[-1].retry_after_seconds <= 60

    def test_permit_returns_after_interval(self) -> None:
        """After one interval one more permit is granted (fake clock, no waiting)."""
        clock = FakeClock()
        backend = MemoryBackend(clock=clock)
        assert backend.gcra("k", interval_seconds=2, burst=1).allowed
        denied = backend.gcra("k", interval_seconds=2, burst=1)
        assert not denied.allowed
        clock.now += denied.retry_after_seconds
        assert backend.gcra("k", interval_seconds=2, burst=1).allowed

    def test_state_is_constant_per_key(self, redis_client: Any) -> None:
        """GCRA's limiter state is one number per key, however many requests it decides.

        Beside it lives the waiting line (one entry per deferred caller), which expires.
        """
        backend = RedisBackend(redis_client, prefix="test:o1")
        for _ in range(200):
            backend.gcra("one", interval_seconds=0.5, burst=10, caller="same-task")
        assert sorted(redis_client.keys("test:o1:*")) == [
            "test:o1:gcra:{one}", "test:o1:gcra:{one}:waiting"]
        assert redis_client.type("test:o1:gcra:{one}") == "string"
        assert redis_client.zcard("test:o1:gcra:{one}:waiting") == 1
        assert redis_client.pttl("test:o1:gcra:{one}:waiting") > 0

    def test_waiters_get_spread_retry_times(self, backend: Any) -> None:
        """Denied callers are told to come back one interval apart, not all at once."""
        name = key()
        assert backend.gcra(name, interval_seconds=10, burst=1).allowed
        waits = [backend.gcra(name, interval_seconds=10, burst=1, caller=f"c{i}")
                 .retry_after_seconds for i in range(4)]
        gaps = [later - earlier for earlier, later in itertools.pairwise(waits)]
        assert all(gap == pytest.approx(10, abs=0.05) for gap in gaps)

    def test_waiter_keeps_its_place(self, backend: Any) -> None:
        """A caller denied again keeps its slot instead of going to the back of the line."""
        name = key()
        assert backend.gcra(name, interval_seconds=10, burst=1).allowed
        first = backend.gcra(name, interval_seconds=10, burst=1, caller="a")
        for i in range(3):
            backend.gcra(name, interval_seconds=10, burst=1, caller=f"later{i}")
        again = backend.gcra(name, interval_seconds=10, burst=1, caller="a")
        assert again.retry_after_seconds == pytest.approx(first.retry_after_seconds, abs=0.05)

    def test_any_window_within_limit_with_burst_one(self) -> None:
        """burst=1: in every window of one period at most `limit` grants (fake clock sweep)."""
        clock = FakeClock()
        backend = MemoryBackend(clock=clock)
        grants = []
        for step in range(2000):
            clock.now = 1_000_000 + step * 0.013
            if backend.gcra("k", interval_seconds=0.5, burst=1).allowed:
                grants.append(clock.now)
        assert max_in_window(grants, 0.5 * 4) <= 4


class TestSlidingWindow:
    def test_limit_then_retry_after_oldest(self) -> None:
        """limit grants, then denial until the oldest grant leaves the window."""
        clock = FakeClock()
        backend = MemoryBackend(clock=clock)
        for _ in range(3):
            assert backend.sliding_window("k", limit=3, window_seconds=10).allowed
            clock.now += 1
        denied = backend.sliding_window("k", limit=3, window_seconds=10)
        assert not denied.allowed
        assert denied.retry_after_seconds == pytest.approx(7)
        clock.now += 7
        assert backend.sliding_window("k", limit=3, window_seconds=10).allowed

    def test_concurrent_callers_never_exceed(self, backend: Any) -> None:
        """16 threads racing: exactly `limit` grants within one window."""
        name, granted = key(), []
        lock = threading.Lock()

        def take() -> None:
            for _ in range(10):
                decision = backend.sliding_window(name, limit=7, window_seconds=3600)
                if decision.allowed:
                    with lock:
                        granted.append(decision)

        threads = [threading.Thread(target=take) for _ in range(16)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert len(granted) == 7


class TestLeases:
    def test_limit_slots_then_deny(self, backend: Any) -> None:
        """limit holders get a slot; the next is denied until one releases."""
        name = key()
        for holder in ("a", "b"):
            assert backend.acquire_lease(name, holder=holder, limit=2, lease_seconds=60).allowed
        denied = backend.acquire_lease(name, holder="c", limit=2, lease_seconds=60)
        assert not denied.allowed
        assert 0 < denied.retry_after_seconds <= 60
        assert backend.release_lease(name, holder="a")
        assert backend.acquire_lease(name, holder="c", limit=2, lease_seconds=60).allowed
        assert set(backend.holders(name)) == {"b", "c"}

    def test_holder_renews(self, backend: Any) -> None:
        """A holder asking again renews its own slot instead of taking a second one."""
        name = key()
        for _ in range(3):
            assert backend.acquire_lease(name, holder="a", limit=1, lease_seconds=60).allowed
        assert list(backend.holders(name)) == ["a"]

    def test_expired_lease_is_reclaimed(self) -> None:
        """A holder that never releases (killed) loses its slot when the lease ends."""
        clock = FakeClock()
        backend = MemoryBackend(clock=clock)
        assert backend.acquire_lease("k", holder="dead", limit=1, lease_seconds=5).allowed
        assert not backend.acquire_lease("k", holder="next", limit=1, lease_seconds=5).allowed
        clock.now += 5.001
        assert backend.acquire_lease("k", holder="next", limit=1, lease_seconds=5).allowed
        assert not backend.release_lease("k", holder="dead")

    def test_expired_lease_is_reclaimed_on_redis_time(self, redis_client: Any) -> None:
        """On Redis the lease runs on server time: a 0.2 s lease is reclaimed after it ends."""
        from tests.support import wait_for

        backend = RedisBackend(redis_client, prefix="test:lease")
        assert backend.acquire_lease("k", holder="dead", limit=1, lease_seconds=0.2).allowed
        wait_for(lambda: backend.acquire_lease("k", holder="next", limit=1,
                                               lease_seconds=5).allowed,
                 timeout_seconds=10, message="the dead holder's lease to be reclaimed")
        assert list(backend.holders("k")) == ["next"]


class TestStorageErrors:
    def test_unreachable_redis_is_wrapped(self) -> None:
        """A dead Redis raises StoreUnavailable naming the key, never a raw redis error."""
        import redis

        from jobs.embedded import free_port

        client = redis.Redis(port=free_port(), socket_connect_timeout=0.2)
        with pytest.raises(StoreUnavailable, match="tests-key") as raised:
            RedisBackend(client).gcra("tests-key", interval_seconds=1, burst=1)
        assert isinstance(raised.value, StorageError)


class TestBadInput:
    @pytest.mark.parametrize("limit", [0, -2, 1.5, True])
    def test_concurrency_limit_positive(self, limit: Any) -> None:
        """limit <= 0 is refused at definition time."""
        with pytest.raises(ConfigurationError, match="positive integer"):
            limit_concurrency("api", limit)

    def test_bad_lease(self) -> None:
        with pytest.raises(ConfigurationError, match="lease_seconds"):
            ConcurrencyLimitConfig(name="api", limit=1, lease_seconds=0)

    def test_unparsable_rate(self) -> None:
        with pytest.raises(ConfigurationError, match="cannot parse rate"):
            rate_limit("api", "lots/minute")

    def test_unknown_algorithm(self) -> None:
        with pytest.raises(ConfigurationError, match="gcra, sliding_window"):
            RateLimitConfig(name="api", rate="1/s", algorithm="leaky")  # type: ignore[arg-type]

    def test_burst_with_sliding_window(self) -> None:
        with pytest.raises(ConfigurationError, match="burst"):
            rate_limit("api", "1/s", algorithm="sliding_window", burst=3)

    def test_template_naming_no_argument(self) -> None:
        """A key template naming a missing argument fails when the task is decorated."""
        with pytest.raises(ConfigurationError, match="customer"):
            rate_limit("vendor:{customer}", "1/s")(lambda order_id: None)

    def test_lease_shorter_than_time_limit(self, app: Any) -> None:
        """A lease shorter than the hard time limit is refused when the task is bound."""

        @app.task(tier="standard", name=f"tests.ratelimit.badlease.{key()}", time_limit=10,
                  soft_time_limit=5)
        @limit_concurrency("api", 1, lease_seconds=3)
        def short(n: int) -> int:
            return n

        with pytest.raises(ConfigurationError, match="hard time limit"):
            short.pipelines()


def max_in_window(times: list[float], window: float) -> int:
    """Most events in any half-open window [t, t + window) (starts at each event suffice)."""
    ordered = sorted(times)
    best, right = 0, 0
    for left, start in enumerate(ordered):
        while right < len(ordered) and ordered[right] < start + window:
            right += 1
        best = max(best, right - left)
    return best
