"""The breaker guard: configuration, the flow on the memory backend, gating on real workers.

The state machine itself is tested on every backend in test_breaker.py.
"""

from __future__ import annotations

from typing import Any

import pytest
from celery.app.task import Context

from resilience.circuit.backends.memory import MemoryBreakerBackend
from resilience.circuit.backends.redis import RedisBreakerBackend, state_key
from resilience.circuit.breaker import CircuitBreaker
from resilience.circuit.config import BreakerConfig, CountWindow, TimeWindow
from resilience.circuit.guard import BreakerGuard, circuit_breaker
from resilience.errors import ConfigurationError
from resilience.flushing import flush_all
from resilience.outcomes import Outcome, Stop
from resilience.pipeline import Call, Pipeline
from tests.resilience.circuit.conftest import FakeClock
from tests.resilience.retry.dependency import DependencyServer
from tests.support import wait_for


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


def _call(task: Any) -> Call:
    request = Context(id="memory-guard", retries=0, called_directly=False)
    return Call(task=task, args=("http://127.0.0.1:1/",), kwargs={}, request=request)


def _raise(exc: BaseException) -> Any:
    def body() -> Any:
        raise exc

    return body


class TestGuardOnMemory:
    """The guard's flow on an in-memory breaker: no Redis between the guard and its state."""

    def _guard(self, **options: Any) -> tuple[BreakerGuard, MemoryBreakerBackend, Any]:
        from tests.resilience.circuit.tasks import failure_breaker_call

        backend = MemoryBreakerBackend(clock=FakeClock())
        config = BreakerConfig(
            name="memory-guard",
            window=CountWindow(calls=4),
            minimum_calls=2,
            open_seconds=30,
            **options,
        )
        guard = BreakerGuard(config, backend=backend)
        guard.bind(failure_breaker_call)
        return guard, backend, failure_breaker_call

    def test_retryable_failures_open_and_defer(self, app: Any) -> None:
        """Connection errors count as failures; once open the body is not run: DEFERRED."""
        guard, backend, task = self._guard()
        for _ in range(2):
            with pytest.raises(ConnectionError):
                Pipeline([guard]).run(_call(task), _raise(ConnectionError("down")))
        assert backend.describe(["memory-guard"])[0].state == "open"
        with pytest.raises(Stop) as stopped:
            Pipeline([guard]).run(_call(task), _raise(AssertionError("must not run")))
        assert stopped.value.outcome is Outcome.DEFERRED
        assert stopped.value.retry_after_seconds == 30

    def test_non_retryable_errors_are_ignored(self, app: Any) -> None:
        """An error the dependency answered (bad input) is no failure of the dependency."""
        guard, backend, task = self._guard()
        for _ in range(3):
            with pytest.raises(ValueError):
                Pipeline([guard]).run(_call(task), _raise(ValueError("bad input")))
        state = backend.describe(["memory-guard"])[0]
        assert (state.state, state.calls) == ("closed", 0)

    def test_successes_are_recorded(self, app: Any) -> None:
        """A closed breaker lets the body run and records its success: at once with
        local_state_seconds=0, at the next flush of the process's aggregate otherwise."""
        guard, backend, task = self._guard(local_state_seconds=0)
        assert Pipeline([guard]).run(_call(task), lambda: 200) == 200
        state = backend.describe(["memory-guard"])[0]
        assert (state.calls, state.failures) == (1, 0)
        guard, backend, task = self._guard()
        for _ in range(3):
            assert Pipeline([guard]).run(_call(task), lambda: 200) == 200
        flush_all()
        state = backend.describe(["memory-guard"])[0]
        assert (state.calls, state.failures) == (3, 0)

    def test_fallback_when_open(self, app: Any) -> None:
        """With fallback=, an open breaker returns the fallback's result (SKIPPED)."""
        guard, backend, task = self._guard(fallback=lambda url: {"cached": url})
        CircuitBreaker(guard.config, backend).force("forced_open")
        with pytest.raises(Stop) as stopped:
            Pipeline([guard]).run(_call(task), _raise(AssertionError("must not run")))
        assert stopped.value.outcome is Outcome.SKIPPED
        assert stopped.value.result == {"cached": "http://127.0.0.1:1/"}


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
            wait_for(
                lambda: int(redis_client.hget(key, "n_half_opened") or 0) >= 2,
                timeout_seconds=60,
                message="breaker opened and half-opened twice",
            )
            dependency.status = 200
            wait_for(
                lambda: all(r.ready() for r in results),
                timeout_seconds=120,
                message="all jobs finished",
            )
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
        guard, task = self._guard(redis_client, "gated-defer")
        request = Context(id="gated-1", retries=0, called_directly=False)
        with pytest.raises(Stop) as stopped:
            guard.before_run(Call(task=task, args=("u",), kwargs={}, request=request))
        assert stopped.value.outcome is Outcome.DEFERRED
        assert stopped.value.retry_after_seconds == 30

    def test_deadline_header_dead_letters(self, app: Any, redis_client: Any, engine: Any) -> None:
        """A `deadline` header earlier than the half-open moment dead-letters the job."""
        import time

        from resilience.deadletter.place import list_entries
        from resilience.errors import DeadLettered

        guard, task = self._guard(redis_client, "gated-deadline")
        request = Context(
            id="gated-2", retries=0, called_directly=False, headers={"deadline": time.time() + 5}
        )
        with pytest.raises(DeadLettered):
            guard.before_run(Call(task=task, args=("u",), kwargs={}, request=request))
        assert any(e.task_id == "gated-2" for e in list_entries(engine, task_name=task.name))
