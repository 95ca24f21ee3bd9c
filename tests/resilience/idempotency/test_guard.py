"""`@idempotent`: the guard's flow in process on the memory backend, then on real workers
with Redis and PostgreSQL."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from datetime import datetime, timezone
from decimal import Decimal
from typing import Any

import pytest
from sqlalchemy import text

from jobs import app as celery_app
from resilience.errors import (
    ConfigurationError,
    IdempotencyKeyReused,
    InvalidKey,
    LockNotOwnedError,
    NonJsonArguments,
    StoreUnavailable,
    UnserializableResult,
)
from resilience.idempotency import IdempotencyConfig, MemoryIdempotencyBackend, idempotent
from resilience.idempotency.backends import FAILED, IN_PROGRESS, SUCCEEDED
from resilience.idempotency.guard import IdempotencyGuard
from resilience.keys import MAX_KEY_LENGTH
from resilience.outcomes import Outcome, Stop, outcome_of
from resilience.pipeline import Call, Pipeline, attached
from tests.resilience.idempotency import tasks
from tests.support import wait_for

pytestmark = pytest.mark.timeout(180)


def runs(redis_client: Any, key: str) -> int:
    return int(redis_client.get(tasks.runs_key(key)) or 0)


def record(engine: Any, task_name: str, key: str) -> Any:
    with engine.connect() as connection:
        return connection.execute(
            text("SELECT * FROM resilience_idempotency_records WHERE task_name = :t AND key = :k"),
            {"t": task_name, "k": key},
        ).one_or_none()


def decisions(redis_client: Any, task_name: str) -> dict[str, int]:
    from resilience.counters import read_all

    return {
        labels["outcome"]: value
        for labels, value in read_all(redis_client)
        if labels["guard"] == "idempotency" and labels["name"] == task_name
    }


def entries(engine: Any, key: str) -> list[int]:
    with engine.connect() as connection:
        return sorted(
            connection.execute(
                text("SELECT amount_cents FROM idempotency_demo_entries WHERE transfer_key = :k"),
                {"k": key},
            ).scalars()
        )


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

    def test_transactional_refuses_a_session_parameter_with_a_default(self) -> None:
        """transactional=True refuses a `session` parameter whose default is not None."""

        def charge(order_id: str, session: object = "x") -> None: ...

        with pytest.raises(ConfigurationError, match="session"):
            idempotent(transactional=True)(charge)

    def test_transactional_allows_no_session_parameter(self) -> None:
        """transactional=True accepts a function without `session` (Django's ORM writes)."""

        def charge(order_id: str) -> None: ...

        assert idempotent(transactional=True)(charge) is charge

    def test_unknown_override_names_the_valid_options(self) -> None:
        """An unknown keyword is a ConfigurationError listing IdempotencyConfig's fields."""
        with pytest.raises(ConfigurationError, match="ttl_secs.*valid:.*ttl_seconds"):
            idempotent(ttl_secs=5)

    def test_config_instance_with_overrides(self) -> None:
        """A config in the key position is the config; keyword overrides replace fields."""
        base = IdempotencyConfig(key="{order_id}", ttl_seconds=60)

        def charge(order_id: str) -> None: ...

        idempotent(base, ttl_seconds=5)(charge)
        guard = next(g for g in attached(charge) if isinstance(g, IdempotencyGuard))
        assert (guard.config.ttl_seconds, guard.config.key) == (5, "{order_id}")

    def test_short_lease_without_transaction_is_refused(self) -> None:
        """A lease shorter than the hard time limit is refused unless transactional."""
        guard = IdempotencyGuard(IdempotencyConfig(lease_seconds=1))
        with pytest.raises(ConfigurationError, match="lease_seconds"):
            guard.bind(tasks.idem_count)


class Clock:
    """An injected wall clock for the memory backend: leases end without waiting."""

    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture()
def memory() -> MemoryIdempotencyBackend:
    return MemoryIdempotencyBackend(clock=Clock())


def guarded(task: Any, backend: MemoryIdempotencyBackend, **options: Any) -> Pipeline:
    """A pipeline of one idempotency guard on `backend`, bound to `task` (no Redis cache)."""
    guard = IdempotencyGuard(IdempotencyConfig(cache=False, **options), backend)
    guard.bind(task)
    return Pipeline([guard])


def run(
    pipeline: Pipeline,
    task: Any,
    body: Callable[[Call], Any],
    *args: Any,
    checks: tuple[Callable[[], None], ...] = (),
    **kwargs: Any,
) -> Any:
    """One in-process call: the body receives the call (its injected session, say)."""
    call = Call(task=task, args=args, kwargs=kwargs, request=None)
    call.checks.extend(checks)
    return pipeline.run(call, lambda: body(call))


def only_record(backend: MemoryIdempotencyBackend, task: Any, key: str) -> Any:
    record = backend.read(task.name, key)
    assert record is not None
    return record


class TestGuardFlow:
    """The algorithm alone: the memory backend, no worker, no cache (stores only count)."""

    def test_second_call_is_replayed_without_running(
        self, stores: Any, memory: MemoryIdempotencyBackend
    ) -> None:
        """Claim, run, complete; the same call again is REPLAYED with the first result."""
        pipeline, ran = guarded(tasks.idem_count, memory, key="{key}"), []
        assert run(pipeline, tasks.idem_count, lambda c: ran.append(1) or {"n": 1}, "k") == {"n": 1}
        with pytest.raises(Stop) as stopped:
            run(pipeline, tasks.idem_count, lambda c: ran.append(1), "k")
        assert stopped.value.outcome is Outcome.REPLAYED and stopped.value.result == {"n": 1}
        assert stopped.value.details["source"] == "database" and ran == [1]
        assert only_record(memory, tasks.idem_count, "k").state == SUCCEEDED

    @pytest.mark.parametrize("backend", ["memory", "postgres"])
    def test_a_replay_answers_the_types_celerys_json_carries(
        self, stores: Any, backend: str
    ) -> None:
        """A result with UUID, datetime and Decimal (Celery's JSON serializer carries them)
        is recorded, and a duplicate is REPLAYED with those very values, not tagged dicts."""
        from resilience.idempotency.backends.postgres import PostgresIdempotencyBackend

        store = (MemoryIdempotencyBackend() if backend == "memory"
                 else PostgresIdempotencyBackend(stores.statements()))
        pipeline, key = guarded(tasks.idem_count, store, key="{key}"), uuid.uuid4().hex
        value = {"id": uuid.uuid4(), "amount": Decimal("12.50"),
                 "at": [datetime(2026, 11, 26, 21, 30, tzinfo=timezone.utc)]}
        assert run(pipeline, tasks.idem_count, lambda c: value, key) == value
        with pytest.raises(Stop) as stopped:
            run(pipeline, tasks.idem_count, lambda c: pytest.fail("ran"), key)
        assert stopped.value.outcome is Outcome.REPLAYED
        assert stopped.value.result == value

    def test_other_arguments_under_the_same_key_are_refused(
        self, stores: Any, memory: MemoryIdempotencyBackend
    ) -> None:
        """Same key, another fingerprint: IdempotencyKeyReused, the body never runs."""
        pipeline = guarded(tasks.idem_count, memory, key="{key}")
        run(pipeline, tasks.idem_count, lambda c: 1, "k", payload=1)
        with pytest.raises(IdempotencyKeyReused):
            run(pipeline, tasks.idem_count, lambda c: pytest.fail("ran"), "k", payload=2)

    def test_a_live_claim_defers(self, stores: Any, memory: MemoryIdempotencyBackend) -> None:
        """While another holder's lease runs, a second call is DEFERRED by at most poll."""
        pipeline = guarded(tasks.idem_count, memory, key="{key}", poll_seconds=0.5)
        memory.claim(
            task_name=tasks.idem_count.name,
            key="k",
            fingerprint=pipeline.guards[0].key_for(("k",), {}).fingerprint,
            owner="other",
            task_id="t-other",
            lease_seconds=60,
            ttl_seconds=600,
        )
        with pytest.raises(Stop) as stopped:
            run(pipeline, tasks.idem_count, lambda c: pytest.fail("ran"), "k")
        assert stopped.value.outcome is Outcome.DEFERRED
        assert stopped.value.retry_after_seconds == 0.5
        assert stopped.value.details["holder_task_id"] == "t-other"

    def test_retryable_error_releases_and_other_errors_fail(
        self, stores: Any, memory: MemoryIdempotencyBackend
    ) -> None:
        """Celery's Retry ends the lease (claimable at once); a ValueError records failed."""
        from celery.exceptions import Retry

        pipeline = guarded(tasks.idem_count, memory, key="{key}")

        def retry(call: Call) -> None:
            raise Retry("again")

        def refuse(call: Call) -> None:
            raise ValueError("no")

        with pytest.raises(Retry):
            run(pipeline, tasks.idem_count, retry, "r")
        released = only_record(memory, tasks.idem_count, "r")
        assert released.state == IN_PROGRESS and released.lease_owner is None
        with pytest.raises(ValueError):
            run(pipeline, tasks.idem_count, refuse, "v")
        failed = only_record(memory, tasks.idem_count, "v")
        assert failed.state == FAILED and "ValueError: no" in failed.error
        assert run(pipeline, tasks.idem_count, lambda c: "ok", "v") == "ok"  # not cached

    def test_unserializable_result_is_recorded_failed(
        self, stores: Any, memory: MemoryIdempotencyBackend
    ) -> None:
        """A result JSON cannot carry raises UnserializableResult and fails the record."""
        pipeline = guarded(tasks.idem_count, memory, key="{key}")
        with pytest.raises(UnserializableResult):
            run(pipeline, tasks.idem_count, lambda c: {1, 2}, "s")
        assert only_record(memory, tasks.idem_count, "s").state == FAILED

    def test_a_stale_claim_is_not_completed(self, stores: Any) -> None:
        """A claim taken over while the body ran completes nothing (counted STALE)."""
        clock = Clock()
        memory = MemoryIdempotencyBackend(clock=clock)
        pipeline = guarded(tasks.idem_count, memory, key="{key}", lease_seconds=60)

        def slow(call: Call) -> str:
            clock.now += 61  # the lease ended; another delivery takes the key over
            fingerprint = pipeline.guards[0].key_for(("k",), {}).fingerprint
            assert memory.claim(
                task_name=tasks.idem_count.name,
                key="k",
                fingerprint=fingerprint,
                owner="b",
                task_id="t-b",
                lease_seconds=10,
                ttl_seconds=600,
            ).claimed
            return "late"

        assert run(pipeline, tasks.idem_count, slow, "k") == "late"
        record = only_record(memory, tasks.idem_count, "k")
        assert record.state == IN_PROGRESS and record.lease_owner == "b"


class TestTransactionalFlow:
    """Transactional mode's commit phase, on the memory backend's transaction."""

    def test_body_and_record_commit_together(
        self, stores: Any, memory: MemoryIdempotencyBackend
    ) -> None:
        """The body gets the transaction's session; the record succeeds at the commit."""
        pipeline = guarded(tasks.idem_transfer, memory, key="{transfer_key}", transactional=True)
        sessions: list[Any] = []

        def body(call: Call) -> int:
            sessions.append(call.inject.get("session", "missing"))
            return 5

        assert run(pipeline, tasks.idem_transfer, body, "t1", "a", "b", 5) == 5
        assert sessions == [None]  # the memory transaction has no database session
        assert only_record(memory, tasks.idem_transfer, "t1").result == 5

    def test_a_lost_lock_rolls_back_and_defers(
        self, stores: Any, memory: MemoryIdempotencyBackend
    ) -> None:
        """call.checkpoint() failing before the commit: nothing recorded, claim given back."""
        pipeline = guarded(tasks.idem_transfer, memory, key="{transfer_key}", transactional=True)

        def lost() -> None:
            raise LockNotOwnedError("the lease ended")

        with pytest.raises(Stop) as stopped:
            run(pipeline, tasks.idem_transfer, lambda c: 5, "t2", "a", "b", 5, checks=(lost,))
        assert stopped.value.outcome is Outcome.DEFERRED and stopped.value.details["lock_lost"]
        record = only_record(memory, tasks.idem_transfer, "t2")
        assert record.state == IN_PROGRESS and record.lease_owner is None and record.result is None

    def test_database_outage_in_the_body_defers_and_releases_the_claim_once_reachable(
        self, stores: Any
    ) -> None:
        """The body's store went away: DEFERRED at once (not failed, and without waiting on
        the dead address for a release); the claim is released in the background as soon as
        the store answers (here: the third try), so the next delivery claims and commits
        without waiting out the lease; a delivery before that is DEFERRED."""
        memory = MemoryIdempotencyBackend()
        pipeline = guarded(tasks.idem_transfer, memory, key="{transfer_key}", transactional=True,
                           lease_seconds=300)
        release, tries = memory.release, []

        def unreachable_twice(claim: Any) -> Any:
            tries.append(time.monotonic())
            if len(tries) <= 2:
                raise StoreUnavailable("connection timed out")
            return release(claim)

        memory.release = unreachable_twice  # type: ignore[method-assign]

        def outage(call: Call) -> None:
            raise StoreUnavailable("connection refused")

        started = time.monotonic()
        with pytest.raises(Stop) as stopped:
            run(pipeline, tasks.idem_transfer, outage, "t3", "a", "b", 5)
        assert time.monotonic() - started < 0.5
        assert stopped.value.outcome is Outcome.DEFERRED and stopped.value.details["store_down"]
        with pytest.raises(Stop) as meanwhile:
            run(pipeline, tasks.idem_transfer, lambda c: 5, "t3", "a", "b", 5)
        assert meanwhile.value.outcome is Outcome.DEFERRED
        assert meanwhile.value.details["state"] == IN_PROGRESS
        wait_for(lambda: only_record(memory, tasks.idem_transfer, "t3").lease_owner is None,
                 timeout_seconds=5, message="the claim released once the store answers")
        assert len(tries) == 3
        assert run(pipeline, tasks.idem_transfer, lambda c: 5, "t3", "a", "b", 5) == 5
        record = only_record(memory, tasks.idem_transfer, "t3")
        assert record.state == SUCCEEDED


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
        duplicate = tasks.idem_count.delay(key, payload=7)
        assert duplicate.get(timeout=30)["ran_in"] == first.id  # the first call's value
        decision = outcome_of(duplicate)
        assert decision is not None and decision.outcome is Outcome.REPLAYED
        assert decision.details["original_task_id"] == first.id
        assert runs(redis_client, key) == 1

    def test_same_message_delivered_twice_runs_once(
        self, worker: Any, redis_client: Any, engine: Any
    ) -> None:
        """Re-publishing one message (same task id) while it runs executes the body once."""
        key = uuid.uuid4().hex
        task_id = str(uuid.uuid4())
        tasks.idem_count.apply_async((key,), {"pause_seconds": 1.0}, task_id=task_id)
        tasks.idem_count.apply_async((key,), {"pause_seconds": 1.0}, task_id=task_id)
        wait_for(
            lambda: (
                (row := record(engine, tasks.idem_count.name, key)) and row.state == "succeeded"
            ),
            timeout_seconds=30,
        )
        # The second delivery met the live claim (DEFERRED), then the stored result (REPLAYED).
        wait_for(
            lambda: decisions(redis_client, tasks.idem_count.name).get("REPLAYED"),
            timeout_seconds=30,
            message="the second delivery to be replayed",
        )
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

    def test_replay_survives_a_redis_flush(self, worker: Any, redis_client: Any) -> None:
        """PostgreSQL is the truth: with the Redis cache gone, a duplicate is still replayed."""
        key = uuid.uuid4().hex
        first = tasks.idem_count.delay(key).get(timeout=30)
        redis_client.flushdb()
        again = tasks.idem_count.delay(key)
        assert again.get(timeout=30) == first
        assert outcome_of(again).details["source"] == "database"  # type: ignore[union-attr]
        cached = tasks.idem_count.delay(key)
        assert cached.get(timeout=30) == first
        assert outcome_of(cached).details["source"] == "cache"  # type: ignore[union-attr]
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
        replayed = tasks.idem_transfer.delay(fresh, "a", "b", 5)
        assert replayed.get(timeout=30)["amount_cents"] == 5
        assert outcome_of(replayed).outcome is Outcome.REPLAYED  # type: ignore[union-attr]
        assert entries(engine, fresh) == [-5, 5]
