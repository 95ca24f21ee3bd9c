"""The breaker's state machine on every backend (the `store` fixture: memory and Redis)."""

from __future__ import annotations

import multiprocessing
import threading
import uuid
from typing import Any

import pytest

from resilience.circuit import (
    BreakerConfig,
    CircuitBreaker,
    MemoryBreakerBackend,
    RedisBreakerBackend,
    TimeWindow,
)
from resilience.circuit.backends.redis import state_key
from resilience.errors import ConfigurationError
from tests.resilience.circuit.conftest import BreakerStore, FakeClock

pytestmark = pytest.mark.timeout(60)


def _call(breaker: CircuitBreaker, outcome: str, duration: float = 0.0) -> str:
    permission = breaker.acquire()
    assert permission.allowed
    return breaker.record(permission, outcome, duration_seconds=duration).transition


def _open(store: BreakerStore, breaker: CircuitBreaker) -> None:
    """Open it with failures, then let its open period pass."""
    assert [_call(breaker, "failure") for _ in range(4)][-1] == "open"
    store.elapse(breaker.name, breaker.config.open_seconds)


class TestClosed:
    def test_needs_minimum_calls(self, store: BreakerStore) -> None:
        """Failures below minimum_calls never open it; the minimum-th failure does."""
        breaker = store.breaker()
        assert [_call(breaker, "failure") for _ in range(4)] == ["", "", "", "open"]
        denied = breaker.acquire()
        assert not denied.allowed and denied.state == "open"
        assert 0 < denied.wait_seconds <= 60

    def test_failure_rate_threshold(self, store: BreakerStore) -> None:
        """Below the failure rate it stays closed; the window slides by count."""
        breaker = store.breaker(window=4, failure_rate_threshold=0.75)
        for outcome in ["failure", "success", "failure", "success", "failure", "success"]:
            assert _call(breaker, outcome) == ""
        assert _call(breaker, "failure") == ""  # last 4: s f s f, rate 0.5
        assert _call(breaker, "failure") == "open"  # last 4: f s f f, rate 0.75

    def test_slow_call_rate(self, store: BreakerStore) -> None:
        """Slow successes open it when the slow-call rate reaches its threshold."""
        breaker = store.breaker(
            slow_call_rate_threshold=0.5, slow_call_seconds=1.0, failure_rate_threshold=1.0
        )
        assert [_call(breaker, "success", 0.5) for _ in range(4)] == ["", "", "", ""]
        assert [_call(breaker, "success", 2.0) for _ in range(4)][-1] == "open"

    def test_slow_calls_off_without_threshold(self, store: BreakerStore) -> None:
        """Without a slow-call threshold, slow successes never open it."""
        breaker = store.breaker(slow_call_seconds=1.0)
        assert all(_call(breaker, "success", 5.0) == "" for _ in range(10))

    def test_time_window(self, store: BreakerStore) -> None:
        """A time window counts every outcome of the last seconds."""
        breaker = store.breaker(window=TimeWindow(seconds=60))
        assert [_call(breaker, "failure") for _ in range(4)][-1] == "open"

    def test_time_window_slides(self, store: BreakerStore) -> None:
        """Outcomes older than the time window no longer count."""
        breaker = store.breaker(window=TimeWindow(seconds=0.4, slots=2))
        assert [_call(breaker, "failure") for _ in range(3)] == ["", "", ""]
        store.sleep(0.5)
        assert _call(breaker, "failure") == ""  # the three earlier failures left the window
        assert [_call(breaker, "failure") for _ in range(3)][-1] == "open"

    def test_ignored_outcomes(self, store: BreakerStore) -> None:
        """'ignored' (non-retryable errors, guard stops) never counts towards opening."""
        breaker = store.breaker()
        assert all(_call(breaker, "ignored") == "" for _ in range(10))
        assert breaker.acquire().state == "closed"


class TestHalfOpen:
    def test_probes_then_close(self, store: BreakerStore) -> None:
        """After the open period exactly `half_open_probes` calls pass; all succeeding closes."""
        breaker = store.breaker()
        _open(store, breaker)
        permissions = [breaker.acquire() for _ in range(5)]
        assert [p.allowed for p in permissions] == [True, True, False, False, False]
        assert permissions[0].transition == "half_open"
        assert breaker.record(permissions[0], "success", duration_seconds=0).transition == ""
        assert breaker.record(permissions[1], "success", duration_seconds=0).transition == "closed"
        assert breaker.acquire().state == "closed"

    def test_still_open_before_its_period_ends(self, store: BreakerStore) -> None:
        """Within the open period every call is refused, told how long is left."""
        breaker = store.breaker()
        assert [_call(breaker, "failure") for _ in range(4)][-1] == "open"
        store.elapse(breaker.name, 50)
        denied = breaker.acquire()
        assert not denied.allowed and denied.state == "open"
        assert 0 < denied.wait_seconds <= 10

    def test_failed_probe_reopens(self, store: BreakerStore) -> None:
        """One failed probe opens it again; an ignored probe gives its permit back."""
        breaker = store.breaker()
        _open(store, breaker)
        first, second = breaker.acquire(), breaker.acquire()
        breaker.record(first, "ignored", duration_seconds=0)
        third = breaker.acquire()
        assert third.allowed
        assert breaker.record(second, "failure", duration_seconds=0).transition == "open"
        assert breaker.record(third, "success", duration_seconds=0).transition == ""  # stale
        assert not breaker.acquire().allowed

    def test_slow_probe_reopens(self, store: BreakerStore) -> None:
        """A probe that succeeds slowly counts as failed."""
        breaker = store.breaker(slow_call_rate_threshold=0.5, slow_call_seconds=1.0)
        _open(store, breaker)
        probe = breaker.acquire()
        assert breaker.record(probe, "success", duration_seconds=3.0).transition == "open"

    def test_stale_outcomes_ignored(self, store: BreakerStore) -> None:
        """A call admitted before a transition cannot push the new state around."""
        breaker = store.breaker()
        early = breaker.acquire()
        _open(store, breaker)
        probe = breaker.acquire()
        assert breaker.record(early, "failure", duration_seconds=0).transition == ""
        assert breaker.acquire().allowed  # the second probe is still available
        assert breaker.record(probe, "success", duration_seconds=0).transition == ""

    def test_lost_probes_reopen_after_timeout(self, store: BreakerStore) -> None:
        """Probes whose workers died do not wedge half-open: it opens again after the timeout."""
        breaker = store.breaker(probe_timeout_seconds=30)
        _open(store, breaker)
        breaker.acquire(), breaker.acquire()
        store.elapse(breaker.name, 30)
        denied = breaker.acquire()
        assert (denied.allowed, denied.state, denied.transition) == (False, "open", "open")


class TestForce:
    def test_force(self, store: BreakerStore) -> None:
        """Operators force it open or closed, and reset it."""
        breaker = store.breaker()
        assert breaker.force("forced_open") == "closed"
        assert not breaker.acquire().allowed
        assert breaker.force("forced_closed") == "forced_open"
        assert all(_call(breaker, "failure") == "" for _ in range(10))
        breaker.force("closed")
        assert breaker.acquire().state == "closed"
        with pytest.raises(ConfigurationError):
            breaker.force("ajar")

    def test_reset_empties_the_window(self, store: BreakerStore) -> None:
        """A reset forgets the failures counted so far."""
        breaker = store.breaker()
        assert [_call(breaker, "failure") for _ in range(3)] == ["", "", ""]
        breaker.force("closed")
        assert [_call(breaker, "failure") for _ in range(3)] == ["", "", ""]


def test_transitions_are_counted_through_the_backend() -> None:
    """Each transition (and the operator's) is counted once, under the breaker's name."""
    backend = MemoryBreakerBackend(clock=FakeClock())
    breaker = CircuitBreaker(BreakerConfig(name="counted", minimum_calls=2), backend)
    assert [_call(breaker, "failure") for _ in range(2)][-1] == "open"
    breaker.force("closed")
    assert backend.counted == {("counted", "BREAKER_OPEN"): 1, ("counted", "BREAKER_CLOSED"): 1}


class TestConcurrency:
    def test_threads_on_memory_consistent(self) -> None:
        """4 threads hammering one in-memory breaker: never more probes than allowed."""
        clock = FakeClock()
        backend = MemoryBreakerBackend(clock=clock)
        config = BreakerConfig(
            name="race", window=10, minimum_calls=4, open_seconds=0.005, half_open_probes=2
        )
        threads = [
            threading.Thread(target=_hammer_with, args=(config, backend, seed, clock))
            for seed in range(4)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        _assert_consistent(backend.describe(["race"])[0])

    def test_processes_on_redis_consistent(self, redis_client: Any, stores: Any) -> None:
        """3 processes hammering one Redis breaker: never more probes than allowed."""
        name = f"unit-race-{uuid.uuid4().hex[:8]}"
        # spawn, not fork: by now the test process may run threads (result consumers) whose
        # locks a forked child would inherit held.
        context = multiprocessing.get_context("spawn")
        processes = [
            context.Process(target=_hammer, args=(stores.redis_url, name, seed))
            for seed in range(3)
        ]
        for process in processes:
            process.start()
        for process in processes:
            process.join(60)
            assert process.exitcode == 0
        assert redis_client.exists(state_key(name))
        _assert_consistent(RedisBreakerBackend(lambda: redis_client).describe([name])[0])


def _assert_consistent(state: Any) -> None:
    assert state.times_half_opened > 0
    assert state.probes_total <= 2 * state.times_half_opened
    assert state.times_opened >= state.times_half_opened
    assert state.times_closed <= state.times_half_opened


def _hammer_with(
    config: BreakerConfig, backend: Any, seed: int, clock: FakeClock | None = None
) -> None:
    import random

    breaker = CircuitBreaker(config, backend)
    chooser = random.Random(seed)
    for _ in range(400):
        if clock is not None:
            clock.now += 0.001  # racy on purpose: any thread moves time on
        permission = breaker.acquire()
        if permission.allowed:
            outcome = "failure" if chooser.random() < 0.6 else "success"
            breaker.record(permission, outcome, duration_seconds=0)


def _hammer(redis_url: str, name: str, seed: int) -> None:
    import redis

    client = redis.Redis.from_url(redis_url, decode_responses=True)
    config = BreakerConfig(
        name=name, window=10, minimum_calls=4, open_seconds=0.005, half_open_probes=2
    )
    _hammer_with(config, RedisBreakerBackend(lambda: client), seed)
