"""The limit guards around a call: deferral with a countdown, release, keys, store failure."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from resilience.counters import read_all
from resilience.outcomes import Outcome, Stop
from resilience.pipeline import Call
from resilience.ratelimit import (
    ALGORITHMS,
    ConcurrencyGuard,
    ConcurrencyLimitConfig,
    MemoryBackend,
    RateLimitConfig,
    RateLimitGuard,
    RedisBackend,
)
from tests.resilience.ratelimit import tasks
from tests.support import dead_redis


def call(task_id: str = "t1", **kwargs: Any) -> Call:
    return Call(
        task=tasks.limited_slot,
        args=(),
        kwargs={"run_id": "r", "n": 1, **kwargs},
        request=SimpleNamespace(id=task_id),
    )


def concurrency(limit: int = 1, backend: Any = None, **options: Any) -> ConcurrencyGuard:
    guard = ConcurrencyGuard(
        ConcurrencyLimitConfig(name="api", limit=limit, **options),
        backend=backend or MemoryBackend(),
        random_fraction=lambda: 0.5,
    )
    guard.bind(tasks.limited_slot)
    return guard


class TestConcurrencyGuard:
    def test_no_slot_defers_with_countdown(self, redis_client: Any) -> None:
        """The second caller is DEFERRED with a positive countdown and the deferral is counted."""
        guard = concurrency(limit=1)
        guard.before_run(call("a"))
        with pytest.raises(Stop) as stopped:
            guard.before_run(call("b"))
        assert stopped.value.outcome is Outcome.DEFERRED
        assert 0 < stopped.value.retry_after_seconds <= 1.0
        assert [
            v
            for labels, v in read_all(redis_client)
            if labels["guard"] == "concurrency" and labels["outcome"] == "DEFERRED"
        ] == [1]

    @pytest.mark.parametrize("finish", ["after_run", "on_error", "on_stop"])
    def test_slot_released_however_the_call_ends(self, finish: str) -> None:
        """Success, error or an inner guard's stop: the slot is given back."""
        guard = concurrency(limit=1)
        first = call("a")
        guard.before_run(first)
        argument = {
            "after_run": None,
            "on_error": RuntimeError("x"),
            "on_stop": Stop(Outcome.SKIPPED, guard="g", reason="r"),
        }[finish]
        getattr(guard, finish)(first, argument)
        assert first.kept(guard) is None
        guard.before_run(call("b"))

    def test_default_lease_covers_the_hard_time_limit(self) -> None:
        """No lease given: the task's hard time limit plus a margin."""
        assert concurrency().lease_for(call()) == tasks.limited_slot.time_limit + 10

    def test_fail_open_runs_when_redis_is_down(self) -> None:
        """Store down, fail_open (default): the call runs."""
        dead = RedisBackend(dead_redis())
        concurrency(backend=dead).before_run(call())

    def test_fail_closed_defers_when_redis_is_down(self) -> None:
        """Store down, on_store_down="fail_closed": DEFERRED."""
        dead = RedisBackend(dead_redis())
        with pytest.raises(Stop) as stopped:
            concurrency(backend=dead, on_store_down="fail_closed").before_run(call())
        assert stopped.value.outcome is Outcome.DEFERRED


class TestRateGuard:
    def test_keys_per_call(self) -> None:
        """A key template gives each customer its own limit."""
        guard = RateLimitGuard(
            RateLimitConfig(name="vendor", rate="1/minute"),
            key="{run_id}",
            func=tasks.windowed.run,
            backend=MemoryBackend(),
        )
        guard.bind(tasks.windowed)
        guard.before_run(call(run_id="alice"))
        guard.before_run(call(run_id="bob"))
        with pytest.raises(Stop) as stopped:
            guard.before_run(call(run_id="alice"))
        assert stopped.value.details["key"] == "vendor:alice"
        assert stopped.value.retry_after_seconds == pytest.approx(60, abs=1)

    @pytest.mark.parametrize("algorithm", [n for n, a in ALGORITHMS.items() if not a.holds])
    def test_every_rate_algorithm_defers(self, algorithm: str) -> None:
        """Whichever registered rate algorithm is named, the guard runs it: one permit a
        minute, the second call DEFERRED for about a minute."""
        backend = MemoryBackend()
        guard = RateLimitGuard(
            RateLimitConfig(name="api", rate="1/minute", algorithm=algorithm), backend=backend
        )
        guard.bind(tasks.windowed)
        guard.before_run(call("a"))
        with pytest.raises(Stop) as stopped:
            guard.before_run(call("b"))
        assert stopped.value.retry_after_seconds == pytest.approx(60, abs=1)
        assert [state.algorithm for state in backend.describe()] == [algorithm]
