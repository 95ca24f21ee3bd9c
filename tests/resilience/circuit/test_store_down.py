"""When the guards' Redis is unreachable: documented fail-open/fail-closed, a warning, no crash.

Each test points a guard at a Redis server it started and then SIGKILLed.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from celery.app.task import Context

from resilience.circuit.backends.redis import RedisBreakerBackend
from resilience.circuit.config import BreakerConfig
from resilience.circuit.guard import BreakerGuard
from resilience.deadletter.poison import PoisonConfig, PoisonGuard
from resilience.flushing import flush_all
from resilience.outcomes import Outcome, Stop
from resilience.pipeline import Call, Pipeline
from resilience.retry.budget import RedisBudgetBackend, RetryBudget, RetryBudgetGate
from resilience.retry.guard import RetryConfig, RetryGuard


@pytest.fixture()
def dead_redis(tmp_path: Path) -> Iterator[redis.Redis]:
    """A client of a Redis that was running and was then killed."""
    from jobs.embedded import embedded_redis, free_port

    server = embedded_redis(free_port(), tmp_path / "redis").start()
    client = redis.Redis.from_url(
        server.url, decode_responses=True, socket_timeout=0.5, socket_connect_timeout=0.5
    )
    assert client.ping()
    server.kill()
    yield client
    client.close()


def _call(task: Any, *args: Any, redelivered: bool = False) -> Call:
    request = Context(
        id="store-down-call",
        retries=0,
        called_directly=False,
        expires=None,
        delivery_info={"redelivered": redelivered},
    )
    return Call(task=task, args=args, kwargs={}, request=request)


def _fail(exc: BaseException) -> Any:
    def body() -> Any:
        raise exc

    return body


class TestBreakerStoreDown:
    def test_fail_open_runs(
        self, app: Any, dead_redis: redis.Redis, caplog: pytest.LogCaptureFixture
    ) -> None:
        """on_store_down="fail_open" (default): the call runs and the outcome is dropped, warned."""
        from tests.resilience.circuit.tasks import failure_breaker_call

        guard = BreakerGuard(
            BreakerConfig(name="down-open"), backend=RedisBreakerBackend(lambda: dead_redis)
        )
        guard.bind(failure_breaker_call)
        ran = []

        def body() -> None:
            ran.append(1)
            raise ConnectionError("dependency down too")

        with pytest.raises(ConnectionError, match="dependency down too"):
            Pipeline([guard]).run(_call(failure_breaker_call, "http://127.0.0.1:1/"), body)
        assert ran == [1]
        assert any("store unavailable" in r.getMessage() for r in caplog.records)

    def test_fail_closed_defers(self, app: Any, dead_redis: redis.Redis) -> None:
        """on_store_down="fail_closed": the call is DEFERRED, not run and not crashed."""
        from tests.resilience.circuit.tasks import failure_breaker_call

        guard = BreakerGuard(
            BreakerConfig(name="down-closed", on_store_down="fail_closed", open_seconds=5),
            backend=RedisBreakerBackend(lambda: dead_redis),
        )
        guard.bind(failure_breaker_call)
        with pytest.raises(Stop) as stopped:
            Pipeline([guard]).run(
                _call(failure_breaker_call, "http://127.0.0.1:1/"),
                _fail(AssertionError("must not run")),
            )
        assert stopped.value.outcome is Outcome.DEFERRED
        assert stopped.value.retry_after_seconds == 5


class TestBudgetStoreDown:
    @pytest.mark.parametrize(("policy", "allowed"), [("fail_open", True), ("fail_closed", False)])
    def test_policy(self, dead_redis: redis.Redis, policy: str, allowed: bool) -> None:
        """The budget allows (fail open, default) or denies (fail closed) retries, no raise."""
        gate = RetryBudgetGate(
            "down", RetryBudget(on_store_down=policy), RedisBudgetBackend(lambda: dead_redis)
        )
        assert gate.record_request().store_down
        decision = gate.try_spend()
        assert decision.store_down and decision.allowed is allowed

    def test_guard_counts_without_crash(
        self, app: Any, dead_redis: redis.Redis, caplog: pytest.LogCaptureFixture
    ) -> None:
        """The retry guard's request count is skipped with a warning; the result stands."""
        from tests.resilience.retry.tasks import failure_storm_budgeted

        guard = RetryGuard(RetryConfig(), backend=RedisBudgetBackend(lambda: dead_redis))
        guard.bind(failure_storm_budgeted)
        call = _call(failure_storm_budgeted, "http://127.0.0.1:1/")
        assert Pipeline([guard]).run(call, lambda: "done") == "done"
        flush_all()  # the request was aggregated: its send is what meets the dead store
        assert any("request not counted" in r.getMessage() for r in caplog.records)


class TestPoisonStoreDown:
    def test_runs(self, app: Any, dead_redis: redis.Redis) -> None:
        """The poison check fails open: the job runs."""
        from tests.resilience.deadletter.tasks import failure_echo

        guard = PoisonGuard(PoisonConfig(max_deliveries=1), client=lambda: dead_redis)
        guard.bind(failure_echo)
        for _ in range(3):
            call = _call(failure_echo, 1, redelivered=True)
            assert Pipeline([guard]).run(call, lambda: 1) == 1
