"""`@idempotent` and `@unique` on real workers, Redis and PostgreSQL."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import text

from jobs import app as celery_app
from resilience.errors import (
    ConfigurationError,
    DuplicateJob,
    IdempotencyKeyReused,
    InvalidKey,
    NonJsonArguments,
)
from resilience.idempotency import idempotent
from resilience.idempotency.guard import IdempotencyGuard
from resilience.keys import MAX_KEY_LENGTH
from tests.resilience.idempotency import tasks
from tests.support import wait_for

pytestmark = pytest.mark.timeout(180)


def runs(redis_client: Any, key: str) -> int:
    return int(redis_client.get(tasks.runs_key(key)) or 0)


def record(engine: Any, task_name: str, key: str) -> Any:
    with engine.connect() as connection:
        return connection.execute(
            text("SELECT * FROM idempotency_records WHERE task_name = :t AND key = :k"),
            {"t": task_name, "k": key},
        ).one_or_none()


def decisions(redis_client: Any, task_name: str) -> dict[str, int]:
    from resilience.counters import read_all

    return {labels["outcome"]: value for labels, value in read_all(redis_client)
            if labels["guard"] == "idempotency" and labels["name"] == task_name}


def entries(engine: Any, key: str) -> list[int]:
    with engine.connect() as connection:
        return sorted(connection.execute(
            text("SELECT amount_cents FROM idempotency_demo_entries WHERE transfer_key = :k"),
            {"k": key},
        ).scalars())


@pytest.fixture()
def worker(worker_factory: Callable[..., Any], redis_client: Any, purge_queues: None) -> Any:
    return worker_factory("critical", name="idem", concurrency=2)


class TestDefinitionErrors:
    def test_ttl_must_be_positive(self) -> None:
        """TTL <= 0 is refused when the decorator is applied."""
        with pytest.raises(ConfigurationError, match="ttl_seconds"):
            idempotent(ttl_seconds=0)
        with pytest.raises(ConfigurationError, match="ttl_seconds"):
            idempotent(ttl_seconds=-5)

    def test_template_naming_a_missing_argument(self) -> None:
        """A key template naming an argument the function lacks fails at definition."""
        def charge(order_id: str) -> None: ...

        with pytest.raises(ConfigurationError, match="orderid"):
            idempotent(key="{orderid}")(charge)

    def test_transactional_needs_a_session_parameter(self) -> None:
        """transactional=True on a function without `session=None` fails at definition."""
        def charge(order_id: str) -> None: ...

        with pytest.raises(ConfigurationError, match="session"):
            idempotent(transactional=True)(charge)

    def test_short_lease_without_transaction_is_refused(self) -> None:
        """A lease shorter than the hard time limit is refused unless transactional."""
        guard = IdempotencyGuard.__new__(IdempotencyGuard)
        from resilience.idempotency.guard import IdempotencyConfig

        guard.__init__(IdempotencyConfig(lease_seconds=1))
        with pytest.raises(ConfigurationError, match="lease_seconds"):
            guard.bind(tasks.idem_count)


class TestEnqueueErrors:
    def test_unserializable_arguments(self) -> None:
        """Arguments JSON cannot carry are refused by .delay()."""
        with pytest.raises(NonJsonArguments):
            tasks.idem_count.delay({1, 2})

    def test_oversize_key(self) -> None:
        """A key longer than the limit is refused by .delay(), not truncated."""
        with pytest.raises(InvalidKey):
            tasks.idem_count.delay("k" * (MAX_KEY_LENGTH + 1))


class TestIdempotentExecution:
    def test_duplicate_is_replayed_with_original_task_id(
        self, worker: Any, redis_client: Any
    ) -> None:
        """A second job with the same key returns the first result without running the body."""
        key = uuid.uuid4().hex
        first = tasks.idem_count.delay(key, payload=7)
        assert first.get(timeout=30)["payload"] == 7
        second = tasks.idem_count.delay(key, payload=7).get(timeout=30)
        assert second["outcome"] == "REPLAYED"
        assert second["result"]["ran_in"] == first.id
        assert second["details"]["original_task_id"] == first.id
        assert runs(redis_client, key) == 1

    def test_same_message_delivered_twice_runs_once(
        self, worker: Any, redis_client: Any, engine: Any
    ) -> None:
        """Re-publishing one message (same task id) while it runs executes the body once."""
        key = uuid.uuid4().hex
        task_id = str(uuid.uuid4())
        tasks.idem_count.apply_async((key,), {"pause_seconds": 1.0}, task_id=task_id)
        tasks.idem_count.apply_async((key,), {"pause_seconds": 1.0}, task_id=task_id)
        wait_for(lambda: (row := record(engine, tasks.idem_count.name, key))
                 and row.state == "succeeded", timeout_seconds=30)
        # The second delivery met the live claim (DEFERRED), then the stored result (REPLAYED).
        wait_for(lambda: decisions(redis_client, tasks.idem_count.name).get("REPLAYED"),
                 timeout_seconds=30, message="the second delivery to be replayed")
        assert decisions(redis_client, tasks.idem_count.name).get("DEFERRED", 0) >= 1
        # Celery keeps the first SUCCESS of a task id: the caller sees the body's own result.
        assert celery_app.AsyncResult(task_id).get(timeout=30)["ran_in"] == task_id
        assert runs(redis_client, key) == 1

    def test_key_reused_with_other_arguments_fails_clearly(self, worker: Any) -> None:
        """Same key, other arguments: the task fails with IdempotencyKeyReused (422)."""
        key = uuid.uuid4().hex
        tasks.idem_count.delay(key, payload=1).get(timeout=30)
        other = tasks.idem_count.delay(key, payload=2)
        with pytest.raises(IdempotencyKeyReused, match="different arguments"):
            other.get(timeout=30)

    def test_replay_survives_a_redis_flush(
        self, worker: Any, redis_client: Any
    ) -> None:
        """PostgreSQL is the truth: with the Redis cache gone, a duplicate is still replayed."""
        key = uuid.uuid4().hex
        first = tasks.idem_count.delay(key).get(timeout=30)
        redis_client.flushdb()
        again = tasks.idem_count.delay(key).get(timeout=30)
        assert again["outcome"] == "REPLAYED" and again["details"]["source"] == "database"
        assert again["result"] == first
        cached = tasks.idem_count.delay(key).get(timeout=30)
        assert cached["details"]["source"] == "cache"
        assert runs(redis_client, key) == 0  # the flush removed the only counted run

    def test_retryable_failure_releases_the_claim(
        self, worker: Any, redis_client: Any, engine: Any
    ) -> None:
        """A Retry releases the claim, so the retry runs and succeeds; one success recorded."""
        key = uuid.uuid4().hex
        result = tasks.idem_flaky.delay(key, "retry").get(timeout=30)
        assert result == {"key": key, "runs": 2}
        row = record(engine, tasks.idem_flaky.name, key)
        assert row.state == "succeeded" and row.attempt == 2

    def test_non_retryable_failure_is_recorded_not_cached(
        self, worker: Any, redis_client: Any, engine: Any
    ) -> None:
        """A ValueError is recorded as failed; the next delivery runs the body again."""
        key = uuid.uuid4().hex
        with pytest.raises(ValueError):
            tasks.idem_flaky.delay(key, "error").get(timeout=30)
        row = record(engine, tasks.idem_flaky.name, key)
        assert row.state == "failed" and "ValueError" in row.error
        with pytest.raises(ValueError):
            tasks.idem_flaky.delay(key, "error").get(timeout=30)
        assert runs(redis_client, key) == 2

    def test_unserializable_result_fails_clearly(self, worker: Any, engine: Any) -> None:
        """A result JSON cannot carry fails the task with UnserializableResult, recorded."""
        from resilience.errors import UnserializableResult

        key = uuid.uuid4().hex
        with pytest.raises(UnserializableResult):
            tasks.idem_unserializable.delay(key).get(timeout=30)
        assert record(engine, tasks.idem_unserializable.name, key).state == "failed"

    def test_transactional_failure_leaves_no_effect(self, worker: Any, engine: Any) -> None:
        """The body's writes roll back with its error; a later success writes exactly once."""
        key = uuid.uuid4().hex
        with pytest.raises(ValueError):
            tasks.idem_transfer.delay(key, "a", "b", 5, fail=True).get(timeout=30)
        assert entries(engine, key) == []
        # Different arguments (fail=False) with the same key: refused, never silently run.
        with pytest.raises(IdempotencyKeyReused):
            tasks.idem_transfer.delay(key, "a", "b", 5).get(timeout=30)
        fresh = uuid.uuid4().hex
        assert tasks.idem_transfer.delay(fresh, "a", "b", 5).get(timeout=30)["amount_cents"] == 5
        assert tasks.idem_transfer.delay(fresh, "a", "b", 5).get(timeout=30)["outcome"] == (
            "REPLAYED"
        )
        assert entries(engine, fresh) == [-5, 5]


class TestUnique:
    def test_duplicate_enqueue_raises_until_finished(
        self, worker: Any, redis_client: Any
    ) -> None:
        """A second .delay() while the first is queued or running raises DuplicateJob."""
        key = uuid.uuid4().hex
        first = tasks.unique_raising.delay(key, pause_seconds=1.0)
        with pytest.raises(DuplicateJob) as raised:
            tasks.unique_raising.delay(key)
        assert raised.value.task_id == first.id
        assert first.get(timeout=30) == first.id
        # Finished: the key is free again.
        assert tasks.unique_raising.delay(key).get(timeout=30) != first.id
        assert runs(redis_client, key) == 2

    def test_duplicate_enqueue_returns_the_existing_job(
        self, worker: Any, redis_client: Any
    ) -> None:
        """Without raise_on_duplicate, .delay() of a queued job returns its AsyncResult."""
        worker.stop()
        key = uuid.uuid4().hex
        first = tasks.unique_started.delay(key)
        second = tasks.unique_started.delay(key)
        assert second.id == first.id
        worker.start()
        assert first.get(timeout=30) == first.id
        assert runs(redis_client, key) == 1
