"""The fleet-wide circuit breaker: algorithm on real Redis, gating on real workers."""

from __future__ import annotations

import multiprocessing
import uuid
from typing import Any

import pytest

from resilience.circuit.backends.redis import RedisBreakerBackend, state_key
from resilience.circuit.breaker import CircuitBreaker
from resilience.circuit.config import BreakerConfig, CountWindow, TimeWindow
from resilience.circuit.guard import circuit_breaker
from resilience.errors import ConfigurationError
from tests.resilience.retry.dependency import DependencyServer
from tests.support import wait_for


def _breaker(redis_client: Any, **options: Any) -> CircuitBreaker:
    settings: dict[str, Any] = {
        "name": f"unit-{uuid.uuid4().hex[:8]}",
        "window": CountWindow(calls=10),
        "minimum_calls": 4,
        "failure_rate_threshold": 0.5,
        "open_seconds": 60,
        "half_open_probes": 2,
    }
    settings.update(options)
    return CircuitBreaker(BreakerConfig(**settings), RedisBreakerBackend(lambda: redis_client))


def _elapse_open(redis_client: Any, breaker: CircuitBreaker) -> None:
    """Make the open period be over (instead of sleeping through it)."""
    redis_client.hset(state_key(breaker.name), "open_until", 0)


def _call(breaker: CircuitBreaker, outcome: str, duration: float = 0.0) -> str:
    permission = breaker.acquire()
    assert permission.allowed
    return breaker.record(permission, outcome, duration_seconds=duration).transition


class TestBreakerAlgorithm:
    def test_needs_minimum_calls(self, redis_client: Any) -> None:
        """Failures below minimum_calls never open it; the minimum-th failure does."""
        breaker = _breaker(redis_client)
        assert [_call(breaker, "failure") for _ in range(4)] == ["", "", "", "open"]
        denied = breaker.acquire()
        assert not denied.allowed and denied.state == "open"
        assert 0 < denied.wait_seconds <= 60

    def test_failure_rate_threshold(self, redis_client: Any) -> None:
        """Below the failure rate it stays closed; the window slides by count."""
        breaker = _breaker(redis_client, window=CountWindow(calls=4), failure_rate_threshold=0.75)
        for outcome in ["failure", "success", "failure", "success", "failure", "success"]:
            assert _call(breaker, outcome) == ""
        assert _call(breaker, "failure") == ""  # last 4: s f s f, rate 0.5
        assert _call(breaker, "failure") == "open"  # last 4: f s f f, rate 0.75

    def test_slow_call_rate(self, redis_client: Any) -> None:
        """Slow successes open it when the slow-call rate reaches its threshold."""
        breaker = _breaker(
            redis_client, slow_call_rate_threshold=0.5, slow_call_seconds=1.0,
            failure_rate_threshold=1.0,
        )
        assert [_call(breaker, "success", 2.0) for _ in range(4)][-1] == "open"

    def test_time_window(self, redis_client: Any) -> None:
        """A time window counts every outcome of the last seconds."""
        breaker = _breaker(redis_client, window=TimeWindow(seconds=60))
        assert [_call(breaker, "failure") for _ in range(4)][-1] == "open"

    def test_ignored_outcomes(self, redis_client: Any) -> None:
        """'ignored' (non-retryable errors, guard stops) never counts towards opening."""
        breaker = _breaker(redis_client)
        assert all(_call(breaker, "ignored") == "" for _ in range(10))
        assert breaker.acquire().state == "closed"

    def test_half_open_probes_and_close(self, redis_client: Any) -> None:
        """After the open period exactly `half_open_probes` calls pass; all succeeding closes."""
        breaker = _breaker(redis_client)
        for _ in range(4):
            _call(breaker, "failure")
        _elapse_open(redis_client, breaker)
        permissions = [breaker.acquire() for _ in range(5)]
        assert [p.allowed for p in permissions] == [True, True, False, False, False]
        assert permissions[0].transition == "half_open"
        assert breaker.record(permissions[0], "success", duration_seconds=0).transition == ""
        assert breaker.record(permissions[1], "success", duration_seconds=0).transition == "closed"
        assert breaker.acquire().state == "closed"

    def test_failed_probe_reopens(self, redis_client: Any) -> None:
        """One failed probe opens it again; an ignored probe gives its permit back."""
        breaker = _breaker(redis_client)
        for _ in range(4):
            _call(breaker, "failure")
        _elapse_open(redis_client, breaker)
        first, second = breaker.acquire(), breaker.acquire()
        breaker.record(first, "ignored", duration_seconds=0)
        third = breaker.acquire()
        assert third.allowed
        assert breaker.record(second, "failure", duration_seconds=0).transition == "open"
        assert breaker.record(third, "success", duration_seconds=0).transition == ""  # stale
        assert not breaker.acquire().allowed

    def test_stale_outcomes_ignored(self, redis_client: Any) -> None:
        """A call admitted before a transition cannot push the new state around."""
        breaker = _breaker(redis_client)
        early = breaker.acquire()
        for _ in range(4):
            _call(breaker, "failure")
        _elapse_open(redis_client, breaker)
        probe = breaker.acquire()
        assert breaker.record(early, "failure", duration_seconds=0).transition == ""
        assert breaker.acquire().allowed  # the second probe is still available
        assert breaker.record(probe, "success", duration_seconds=0).transition == ""

    def test_lost_probes_reopen_after_timeout(self, redis_client: Any) -> None:
        """Probes whose workers died do not wedge half-open: it opens again after the timeout."""
        breaker = _breaker(redis_client, probe_timeout_seconds=30)
        for _ in range(4):
            _call(breaker, "failure")
        _elapse_open(redis_client, breaker)
        breaker.acquire(), breaker.acquire()
        redis_client.hset(state_key(breaker.name), "half_open_until", 0)
        denied = breaker.acquire()
        assert (denied.allowed, denied.state, denied.transition) == (False, "open", "open")

    def test_force(self, redis_client: Any) -> None:
        """Operators force it open or closed, and reset it."""
        breaker = _breaker(redis_client)
        breaker.force("forced_open")
        assert not breaker.acquire().allowed
        breaker.force("forced_closed")
        assert all(_call(breaker, "failure") == "" for _ in range(10))
        breaker.force("closed")
        assert breaker.acquire().state == "closed"
        with pytest.raises(ConfigurationError):
            breaker.force("ajar")

    def test_concurrent_processes_consistent(self, redis_client: Any, stores: Any) -> None:
        """3 processes hammering one breaker: never more probes than allowed per half-open."""
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
        state = redis_client.hgetall(state_key(name))
        half_opened = int(state.get("n_half_opened", 0))
        assert half_opened > 0
        assert int(state.get("n_probes", 0)) <= 2 * half_opened
        assert int(state.get("n_opened", 0)) >= half_opened
        assert int(state.get("n_closed", 0)) <= half_opened


def _hammer(redis_url: str, name: str, seed: int) -> None:
    import random

    import redis

    client = redis.Redis.from_url(redis_url, decode_responses=True)
    breaker = CircuitBreaker(
        BreakerConfig(name=name, window=10, minimum_calls=4, open_seconds=0.005,
                      half_open_probes=2),
        RedisBreakerBackend(lambda: client),
    )
    chooser = random.Random(seed)
    for _ in range(400):
        permission = breaker.acquire()
        if permission.allowed:
            outcome = "failure" if chooser.random() < 0.6 else "success"
            breaker.record(permission, outcome, duration_seconds=0)


class TestConfiguration:
    @pytest.mark.parametrize(
        "options",
        [
            {"failure_rate_threshold": 1.5},
            {"failure_rate_threshold": 0},
            {"slow_call_rate_threshold": -0.1, "slow_call_seconds": 1},
            {"slow_call_rate_threshold": 0.5},
            {"window": 0},
            {"window": -5},
            {"minimum_calls": 0},
            {"open_seconds": -1},
            {"half_open_probes": 0},
            {"on_store_down": "sometimes"},
            {"fallback": "not callable"},
        ],
    )
    def test_bad_input(self, options: dict[str, Any]) -> None:
        """Thresholds outside (0, 1], windows <= 0, negative timings fail at definition."""
        with pytest.raises(ConfigurationError):
            circuit_breaker("bad", **options)

    def test_bad_windows(self) -> None:
        """Window sizes <= 0 fail when the window is built."""
        with pytest.raises(ConfigurationError):
            TimeWindow(seconds=0)
        with pytest.raises(ConfigurationError):
            CountWindow(calls=0)


@pytest.mark.timeout(180)
class TestBreakerOnWorkers:
    def test_opens_probes_and_closes_across_workers(
        self, app: Any, redis_client: Any, worker_factory: Any, purge_queues: None
    ) -> None:
        """3 pool processes: the breaker opens within minimum_calls + in-flight failures, lets
        at most half_open_probes calls through per half-open period, and closes on recovery."""
        from tests.resilience.circuit.tasks import (
            BREAKER,
            HALF_OPEN_PROBES,
            MINIMUM_CALLS,
            failure_breaker_call,
        )

        concurrency = 3
        worker_factory("standard", name="breaker", concurrency=concurrency)
        key = state_key(BREAKER)
        with DependencyServer(status=503) as dependency:
            results = [failure_breaker_call.delay(dependency.url) for _ in range(30)]
            wait_for(lambda: int(redis_client.hget(key, "n_half_opened") or 0) >= 2,
                     timeout_seconds=60, message="breaker opened and half-opened twice")
            dependency.status = 200
            wait_for(lambda: all(r.ready() for r in results), timeout_seconds=120,
                     message="all jobs finished")
            failed_calls = dependency.calls.get(503, 0)
            ok_calls = dependency.calls.get(200, 0)
        state = redis_client.hgetall(key)
        assert state["state"] == "closed"
        half_opened = int(state["n_half_opened"])
        # Before the first opening at most minimum_calls + the calls already in flight fail;
        # afterwards only probes reach the failing dependency.
        assert failed_calls <= MINIMUM_CALLS + concurrency - 1 + HALF_OPEN_PROBES * half_opened
        assert int(state["n_probes"]) <= HALF_OPEN_PROBES * half_opened
        failures = [r for r in results if r.failed()]
        successes = [r for r in results if r.successful()]
        assert len(failures) == failed_calls
        assert len(successes) == ok_calls == 30 - failed_calls
        assert all(r.result == 200 for r in successes)

    def test_fallback_when_open(
        self, app: Any, redis_client: Any, worker_factory: Any, purge_queues: None
    ) -> None:
        """With fallback=, an open breaker returns the fallback's result, marked."""
        from resilience.circuit.breaker import CircuitBreaker as Breaker
        from tests.resilience.circuit.tasks import failure_breaker_fallback

        Breaker(
            BreakerConfig(name="test-breaker-fallback"), RedisBreakerBackend(lambda: redis_client)
        ).force("forced_open")
        worker_factory("standard", name="fallback", concurrency=1)
        with DependencyServer(status=200) as dependency:
            result = failure_breaker_fallback.delay(dependency.url).get(timeout=60)
            assert dependency.total_calls == 0
        assert result["outcome"] == "SKIPPED"
        assert result["details"]["fallback"] is True
        assert result["result"] == {"cached": True, "url": dependency.url}


@pytest.mark.timeout(120)
def test_open_breaker_spends_no_budget_and_respects_deadline(
    app: Any, redis_client: Any, engine: Any, worker_factory: Any, purge_queues: None
) -> None:
    """An open breaker keeps the call from the dependency and from the retry budget; when it
    cannot half-open before the job's deadline the job is dead-lettered, not deferred."""
    import sqlalchemy as sa

    from resilience.deadletter.models import dead_letters
    from resilience.errors import DeadLettered
    from resilience.retry.budget import budget_key
    from tests.resilience.circuit.tasks import failure_breaker_gated

    CircuitBreaker(
        BreakerConfig(name="test-breaker-gated"), RedisBreakerBackend(lambda: redis_client)
    ).force("forced_open")
    worker_factory("standard", name="gated", concurrency=1)
    with DependencyServer(status=200) as dependency:
        result = failure_breaker_gated.apply_async((dependency.url,), expires=20)
        wait_for(result.ready, timeout_seconds=60, message="gated job finished")
        assert dependency.total_calls == 0
    assert isinstance(result.result, DeadLettered)
    assert not redis_client.exists(budget_key("test-gated"))
    with engine.connect() as connection:
        row = connection.execute(
            sa.select(dead_letters).where(dead_letters.c.task_id == result.id)
        ).one()
    assert row.guard == "breaker" and "deadline" in row.reason


class TestGatedDispatch:
    def _guard(self, redis_client: Any, name: str) -> Any:
        from resilience.circuit.guard import BreakerGuard
        from tests.resilience.circuit.tasks import failure_breaker_call

        config = BreakerConfig(name=name, open_seconds=30)
        CircuitBreaker(config, RedisBreakerBackend(lambda: redis_client)).force("forced_open")
        guard = BreakerGuard(config, backend=RedisBreakerBackend(lambda: redis_client))
        guard.bind(failure_breaker_call)
        return guard, failure_breaker_call

    def test_open_defers_until_half_open(self, app: Any, redis_client: Any) -> None:
        """Without a deadline an open breaker defers the job by its open period."""
        from celery.app.task import Context

        from resilience.outcomes import Outcome, Stop
        from resilience.pipeline import Call

        guard, task = self._guard(redis_client, "gated-defer")
        request = Context(id="gated-1", retries=0, called_directly=False)
        with pytest.raises(Stop) as stopped:
            guard.before_run(Call(task=task, args=("u",), kwargs={}, request=request))
        assert stopped.value.outcome is Outcome.DEFERRED
        assert stopped.value.retry_after_seconds == 30

    def test_deadline_header_dead_letters(self, app: Any, redis_client: Any, engine: Any) -> None:
        """A `deadline` header earlier than the half-open moment dead-letters the job."""
        import time

        from celery.app.task import Context

        from resilience.deadletter.place import list_entries
        from resilience.errors import DeadLettered
        from resilience.pipeline import Call

        guard, task = self._guard(redis_client, "gated-deadline")
        request = Context(id="gated-2", retries=0, called_directly=False,
                          headers={"deadline": time.time() + 5})
        with pytest.raises(DeadLettered):
            guard.before_run(Call(task=task, args=("u",), kwargs={}, request=request))
        assert any(e.task_id == "gated-2" for e in list_entries(engine, task_name=task.name))
