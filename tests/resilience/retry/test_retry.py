"""Classified retries, backoff, the fleet-wide budget and the retry guard on real workers."""

from __future__ import annotations

import random
import urllib.error
import uuid
from email.message import Message
from typing import Any

import pytest

from resilience.classify import NonRetryable, Retryable, is_retryable, retry_after
from resilience.errors import ConfigurationError
from resilience.pipeline import attached
from resilience.retry.backoff import (
    wait_decorrelated_jitter,
    wait_exponential,
    wait_fixed,
    wait_full_jitter,
    wait_random,
)
from resilience.retry.budget import RedisBudgetBackend, RetryBudget, RetryBudgetGate
from resilience.retry.guard import RetryConfig, retry_policy
from tests.resilience.retry.dependency import DependencyServer
from tests.support import wait_for


class _StatusError(Exception):
    def __init__(self, status: int) -> None:
        super().__init__(f"HTTP {status}")
        self.status_code = status


class _Response:
    def __init__(self, status: int) -> None:
        self.status_code = status
        self.headers = {"Retry-After": "7"}


class _ResponseError(Exception):
    def __init__(self, status: int) -> None:
        super().__init__(f"HTTP {status}")
        self.response = _Response(status)


class TestClassify:
    @pytest.mark.parametrize("status", [408, 429, 500, 502, 503, 504])
    def test_retryable_statuses(self, status: int) -> None:
        """408, 429 and 5xx are retryable, whichever attribute carries the status."""
        assert is_retryable(_StatusError(status))
        assert is_retryable(_ResponseError(status))
        assert is_retryable(Retryable(status=status))

    @pytest.mark.parametrize("status", [400, 401, 403, 404, 422])
    def test_non_retryable_statuses(self, status: int) -> None:
        """400, 401, 403, 404 and 422 are never retried."""
        assert not is_retryable(_StatusError(status))
        assert not is_retryable(_ResponseError(status))

    def test_urllib_http_error(self) -> None:
        """urllib's HTTPError keeps its status in `code`; its Retry-After header is read."""
        headers = Message()
        headers["Retry-After"] = "3"
        error = urllib.error.HTTPError("http://x", 503, "busy", headers, None)
        assert is_retryable(error)
        assert retry_after(error) == 3.0
        assert not is_retryable(urllib.error.HTTPError("http://x", 404, "no", Message(), None))

    def test_types_and_pair(self) -> None:
        """The user pair wins over types; connection errors retry, programming errors do not."""
        assert is_retryable(ConnectionError())
        assert is_retryable(TimeoutError())
        assert not is_retryable(ValueError())
        assert not is_retryable(NonRetryable("bad"))
        assert not is_retryable(KeyboardInterrupt())

    def test_hooks_first(self) -> None:
        """A hook's verdict wins; None abstains."""
        assert is_retryable(ValueError(), [lambda exc: None, lambda exc: True])
        assert not is_retryable(ConnectionError(), [lambda exc: False])

    def test_retry_after_sources(self) -> None:
        """Retry-After from the exception's field, or its response's headers."""
        assert retry_after(Retryable(retry_after_seconds=2.5)) == 2.5
        assert retry_after(_ResponseError(503)) == 7.0
        assert retry_after(ValueError()) is None


class TestBackoff:
    def test_full_jitter_bounds(self) -> None:
        """Full jitter draws in [0, min(cap, base * 2^(n-1))]."""
        top = wait_full_jitter(base=1, cap=5, random=lambda: 0.999999)
        assert top(1) == pytest.approx(1, rel=1e-3)
        assert top(3) == pytest.approx(4, rel=1e-3)
        assert top(10) == pytest.approx(5, rel=1e-3)
        assert wait_full_jitter(base=1, cap=5, random=lambda: 0.0)(4) == 0

    def test_decorrelated_grows_from_previous(self) -> None:
        """Decorrelated jitter draws in [base, 3 * previous], capped."""
        top = wait_decorrelated_jitter(base=1, cap=10, random=lambda: 1.0)
        assert top(1, None) == 3
        assert top(2, 3) == 9
        assert top(3, 9) == 10
        assert wait_decorrelated_jitter(base=1, cap=10, random=lambda: 0.0)(2, 9) == 1

    def test_strategies_add(self) -> None:
        """`a + b` waits the sum: exponential plus a random spread, fixed plus fixed."""
        wait = wait_exponential(base=1, cap=30) + wait_random(0, 1, random=lambda: 0.25)
        assert [wait(attempt) for attempt in (1, 2, 3, 6)] == [1.25, 2.25, 4.25, 30.25]
        assert (wait_fixed(2) + wait_fixed(3) + wait_fixed(0.5))(7) == 5.5
        assert sum([wait_fixed(1), wait_fixed(2)])(1) == 3

    def test_seeded_random_stays_within_bounds(self) -> None:
        """A sum of an exponential and a seeded random spread stays in its bounds."""
        source = random.Random(42)
        wait = wait_exponential(base=0.5, cap=4) + wait_random(1, 2, random=source.random)
        for attempt in range(1, 20):
            low = min(4, 0.5 * 2 ** (attempt - 1)) + 1
            assert low <= wait(attempt) <= low + 1

    def test_retry_after_is_a_floor(self) -> None:
        """A dependency's Retry-After wins over a shorter backoff."""
        policy = RetryConfig(backoff=wait_full_jitter(base=0.1, cap=1, random=lambda: 0.5))
        assert policy.delay_seconds(1, Retryable(retry_after_seconds=4)) == 4
        assert policy.delay_seconds(1, Retryable()) == pytest.approx(0.05)

    @pytest.mark.parametrize(
        "options",
        [
            {"max_attempts": 0},
            {"backoff": "full"},
            {"backoff": lambda attempt, previous: 1.0},
            {"budget": "lots"},
        ],
    )
    def test_bad_policy(self, options: dict[str, Any]) -> None:
        """No attempts, a backoff that is not a strategy object, a bad budget fail at
        definition."""
        with pytest.raises(ConfigurationError):
            retry_policy(**options)

    @pytest.mark.parametrize(
        "make",
        [lambda: wait_full_jitter(base=-1), lambda: wait_exponential(base=2, cap=1),
         lambda: wait_random(2, 1), lambda: wait_fixed(-1)],
    )
    def test_bad_strategy(self, make: Any) -> None:
        """Negative delays and a cap below the base fail when the strategy is built."""
        with pytest.raises(ConfigurationError):
            make()

    def test_a_string_names_the_object_to_use(self) -> None:
        """backoff="decorrelated" is refused with the strategy object to write instead."""
        with pytest.raises(ConfigurationError, match="wait_decorrelated_jitter"):
            RetryConfig(backoff="decorrelated")  # type: ignore[arg-type]

    def test_unknown_override_names_the_valid_options(self) -> None:
        """A former option (`jitter=`) is an unknown one; the message lists RetryConfig's."""
        with pytest.raises(ConfigurationError, match="jitter.*valid:.*backoff"):
            retry_policy(jitter="full")

    def test_config_instance_with_overrides(self) -> None:
        """A RetryConfig plus overrides: the overrides replace its fields, the rest stays."""
        base = RetryConfig(max_attempts=5, dependency="payments")
        decorated = retry_policy(base, max_attempts=2)(lambda: None)
        [guard] = attached(decorated)
        assert (guard.policy.max_attempts, guard.policy.dependency) == (2, "payments")

    @pytest.mark.parametrize(
        "options",
        [{"ratio": 1.5}, {"ratio": -0.1}, {"window_seconds": 0}, {"min_per_second": -1},
         {"on_store_down": "maybe"}],
    )
    def test_bad_budget(self, options: dict[str, Any]) -> None:
        """A ratio outside 0..1, a window <= 0, a negative floor fail at definition."""
        with pytest.raises(ConfigurationError):
            RetryBudget(**options)


class TestRetryBudget:
    def test_ratio_of_requests(self, redis_client: Any) -> None:
        """With no floor, retries are granted while retries + 1 <= ratio * requests."""
        gate = RetryBudgetGate(
            "unit-ratio",
            RetryBudget(ratio=0.2, min_per_second=0, window_seconds=60),
            RedisBudgetBackend(lambda: redis_client),
        )
        for _ in range(10):
            gate.record_request()
        granted = [gate.try_spend().allowed for _ in range(5)]
        assert granted == [True, True, False, False, False]
        gate.record_forced_retry()
        assert gate.try_spend().retries == 3

    def test_floor(self, redis_client: Any) -> None:
        """The floor allows min_per_second * window retries with no requests at all."""
        gate = RetryBudgetGate(
            "unit-floor",
            RetryBudget(ratio=0.0, min_per_second=0.5, window_seconds=4),
            RedisBudgetBackend(lambda: redis_client),
        )
        assert [gate.try_spend().allowed for _ in range(3)] == [True, True, False]


@pytest.mark.timeout(120)
class TestRetryGuardOnWorkers:
    def test_storm_amplification_within_budget(
        self, app: Any, redis_client: Any, engine: Any, worker_factory: Any, purge_queues: None
    ) -> None:
        """A dependency failing 100 %: calls per job stay <= 1 / (1 - ratio) = 1.25 with the
        budget (max_attempts=4 alone would allow 4), and every job ends dead-lettered."""
        from resilience.errors import DeadLettered
        from tests.resilience.retry.tasks import failure_storm_budgeted

        worker_factory("standard", name="storm", concurrency=3)
        jobs = 40
        with DependencyServer(status=503) as dependency:
            results = [failure_storm_budgeted.delay(dependency.url) for _ in range(jobs)]
            wait_for(lambda: all(r.ready() for r in results), timeout_seconds=90,
                     message="storm jobs finished")
            calls = dependency.total_calls
        assert all(isinstance(r.result, DeadLettered) for r in results)
        assert jobs < calls <= 1.25 * jobs
        rows = _dead_letters(engine, "tests.resilience.retry.tasks.failure_storm_budgeted")
        assert len(rows) == jobs
        reasons = {row["reason"].split(" ")[0] for row in rows}
        assert reasons <= {"retry", "attempts"}
        assert any(row["reason"].startswith("retry budget") for row in rows)

    def test_non_retryable_never_retried(
        self, app: Any, redis_client: Any, engine: Any, worker_factory: Any, purge_queues: None
    ) -> None:
        """A NonRetryable (HTTP 422) and a ValueError run once and are dead-lettered."""
        from resilience.errors import DeadLettered
        from tests.resilience.retry.tasks import failure_non_retryable

        worker_factory("standard", name="nonretry", concurrency=1)
        first, second = f"nr:{uuid.uuid4().hex}", f"nr:{uuid.uuid4().hex}"
        results = [failure_non_retryable.delay(first, 422), failure_non_retryable.delay(second)]
        wait_for(lambda: all(r.ready() for r in results), timeout_seconds=60)
        assert all(isinstance(r.result, DeadLettered) for r in results)
        assert int(redis_client.get(first)) == 1
        assert int(redis_client.get(second)) == 1
        rows = {row["task_id"]: row for row in
                _dead_letters(engine, "tests.resilience.retry.tasks.failure_non_retryable")}
        assert rows[results[0].id]["reason"].startswith("non-retryable NonRetryable")
        assert rows[results[1].id]["exception_type"] == "ValueError"
        assert rows[results[0].id]["attempts"] == 1

    def test_retry_after_honoured(
        self, app: Any, redis_client: Any, worker_factory: Any, purge_queues: None
    ) -> None:
        """The second attempt starts no earlier than the Retry-After the error gave."""
        from tests.resilience.retry.tasks import failure_retry_after

        worker_factory("standard", name="retryafter", concurrency=1)
        counter = f"ra:{uuid.uuid4().hex}"
        result = failure_retry_after.delay(counter, 1.5)
        assert result.get(timeout=60) == "done"
        first, second = (float(value) for value in redis_client.lrange(counter, 0, -1))
        assert second - first >= 1.5

    def test_self_retry_counted_in_budget(
        self, app: Any, redis_client: Any, worker_factory: Any, purge_queues: None
    ) -> None:
        """A task's own self.retry passes through and is counted as a retry of the budget."""
        from tests.resilience.retry.tasks import failure_self_retry

        worker_factory("standard", name="selfretry", concurrency=1)
        counter = f"sr:{uuid.uuid4().hex}"
        assert failure_self_retry.delay(counter).get(timeout=60) == "done"
        assert int(redis_client.get(counter)) == 2
        gate = RetryBudgetGate(
            "test-self-retry",
            RetryBudget(ratio=1.0, min_per_second=0, window_seconds=600),
            RedisBudgetBackend(lambda: redis_client),
        )
        # The last run's request is aggregated in the worker: it arrives within flush_seconds.
        wait_for(lambda: gate.describe().requests == 2, timeout_seconds=5,
                 message="the worker's aggregated request arrived")
        decision = gate.try_spend()
        assert (decision.requests, decision.retries) == (2, 2)  # 1 forced + this one


def _dead_letters(engine: Any, task_name: str) -> list[dict[str, Any]]:
    import sqlalchemy as sa

    from resilience.deadletter.models import dead_letters

    with engine.connect() as connection:
        rows = connection.execute(
            sa.select(dead_letters).where(dead_letters.c.task_name == task_name)
        )
        return [dict(row._mapping) for row in rows]


@pytest.mark.timeout(120)
def test_decorrelated_jitter_carries_previous_delay(
    app: Any, redis_client: Any, worker_factory: Any, purge_queues: None
) -> None:
    """Decorrelated jitter grows from the delay actually used: it travels in a message header."""
    from tests.resilience.retry.tasks import failure_decorrelated

    worker_factory("standard", name="decorrelated", concurrency=1)
    counter = f"dj:{uuid.uuid4().hex}"
    assert failure_decorrelated.delay(counter).get(timeout=60) == "done"
    first, second, third = redis_client.lrange(counter, 0, -1)
    assert first == "None"
    assert 0.3 <= float(second) <= 0.5  # base 0.3, cap 0.5 (tests/resilience/retry/tasks.py)
    assert 0.3 <= float(third) <= 0.5


@pytest.mark.timeout(120)
def test_autoretry_for_interoperates(
    app: Any, redis_client: Any, engine: Any, worker_factory: Any, purge_queues: None
) -> None:
    """autoretry_for retries first (counted as forced retries); when Celery gives up the guard
    decides with the shared attempt count: 3 executions in all, then dead-lettered."""
    from resilience.errors import DeadLettered
    from tests.resilience.retry.tasks import failure_autoretry

    worker_factory("standard", name="autoretry", concurrency=1)
    counter = f"ar:{uuid.uuid4().hex}"
    result = failure_autoretry.delay(counter)
    wait_for(result.ready, timeout_seconds=60, message="autoretry job finished")
    assert isinstance(result.result, DeadLettered)
    assert int(redis_client.get(counter)) == 3
    rows = [row for row in _dead_letters(engine, failure_autoretry.name)
            if row["task_id"] == result.id]
    assert rows[0]["reason"].startswith("attempts exhausted (3 of 3)")
    gate = RetryBudgetGate(
        "test-autoretry",
        RetryBudget(ratio=1.0, min_per_second=0, window_seconds=600),
        RedisBudgetBackend(lambda: redis_client),
    )
    # The last run's request is aggregated in the worker: it arrives within flush_seconds.
    wait_for(lambda: gate.describe().requests == 3, timeout_seconds=5,
             message="the worker's aggregated request arrived")
    decision = gate.try_spend()
    assert (decision.requests, decision.retries) == (3, 3)  # 1 forced + 1 granted + this one
