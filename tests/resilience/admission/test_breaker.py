"""Admission at enqueue: `.delay()` of a task whose breaker is open (`on_open="refuse"`).

Real Redis and the real broker; no worker consumes the private queue each test publishes to,
so its length is exactly what was enqueued. The guard's clock is moved, never waited on.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from kombu import Exchange, Queue
from redis.backoff import NoBackoff
from redis.retry import Retry

from resilience.admission import BreakerAdmissionGuard, depth_backend_for
from resilience.circuit import (
    AdmissionConfig,
    BreakerConfig,
    CircuitBreaker,
    RedisBreakerBackend,
    circuit_breaker,
)
from resilience.circuit.backends.redis import state_key
from resilience.counters import read_all
from resilience.errors import AdmissionError, ConfigurationError, DependencyUnavailable
from tests.resilience.admission.tasks_breaker import (
    ADMISSION_BREAKER,
    MINIMUM_CALLS,
    OPEN_SECONDS,
    admission_enqueue,
    admission_refuse,
)

pytestmark = pytest.mark.timeout(60)


class Clock:
    """Monotonic seconds that only move when a test moves them."""

    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


class CountingBackend:
    """A breaker backend that counts its state reads (what a refresh costs)."""

    def __init__(self, backend: Any) -> None:
        self.backend = backend
        self.reads = 0

    def describe(self, names: Any = (), **options: Any) -> Any:
        self.reads += 1
        return self.backend.describe(names, **options)


@pytest.fixture()
def queue(app: Any) -> Iterator[Queue]:
    """A private queue on the platform exchange that no worker consumes; deleted afterwards."""
    name = f"admission-test-{uuid.uuid4().hex[:8]}"
    yield Queue(name, Exchange("jobs", type="direct"), routing_key=name)
    backend = depth_backend_for(app)
    client = backend.client()
    client.delete(*backend.lists(name), backend.reservations_key(name))
    ours = [m for m in client.smembers("_kombu.binding.jobs") if m.endswith("\x06\x16" + name)]
    if ours:
        client.srem("_kombu.binding.jobs", *ours)


@pytest.fixture()
def guard(app: Any, redis_client: Any, monkeypatch: pytest.MonkeyPatch
          ) -> Iterator[BreakerAdmissionGuard]:
    """The enqueue guard of `admission_refuse`, on a clock the test moves, with no copy."""
    _, enqueue = admission_refuse.pipelines()
    found = next(g for g in enqueue.guards if isinstance(g, BreakerAdmissionGuard))
    monkeypatch.setattr(found, "clock", Clock())
    found.forget()
    yield found
    found.forget()


@pytest.fixture()
def breaker(redis_client: Any) -> CircuitBreaker:
    """The tasks' breaker, as an operator (`jobs breakers`) or a worker reaches it."""
    config = BreakerConfig(name=ADMISSION_BREAKER, minimum_calls=MINIMUM_CALLS,
                           open_seconds=OPEN_SECONDS)
    return CircuitBreaker(config, RedisBreakerBackend(lambda: redis_client))


def depth(app: Any, queue: Queue) -> int:
    return int(depth_backend_for(app).client().llen(queue.name))


def counted(redis_client: Any, outcome: str) -> int:
    return sum(value for labels, value in read_all(redis_client)
               if labels["outcome"] == outcome and labels["guard"] == "circuit"
               and labels["name"] == ADMISSION_BREAKER)


class TestRefuse:
    def test_forced_open_refuses_and_queues_nothing(
        self, app: Any, guard: Any, breaker: CircuitBreaker, queue: Queue, redis_client: Any
    ) -> None:
        """A breaker held open: `.delay()` raises DependencyUnavailable (an AdmissionError)
        with retry_after = open_seconds, nothing reaches the queue, each refusal counted."""
        breaker.force("forced_open")
        with pytest.raises(DependencyUnavailable) as refused:
            admission_refuse.apply_async((1,), queue=queue)
        with pytest.raises(AdmissionError):
            admission_refuse.delay(2)
        error = refused.value
        assert error.retry_after == OPEN_SECONDS
        assert (error.breaker, error.state, error.task) == (
            ADMISSION_BREAKER, "forced_open", admission_refuse.name)
        assert depth(app, queue) == 0
        assert counted(redis_client, "REJECTED") == 2

    def test_tripped_open_refuses_until_the_open_period_ends(
        self, app: Any, guard: Any, breaker: CircuitBreaker, queue: Queue, redis_client: Any
    ) -> None:
        """Opened by failures: refused with the rest of the open period as retry_after; once
        the period is over (and when half-open) jobs are queued again."""
        for _ in range(MINIMUM_CALLS):
            breaker.record(breaker.acquire(), "failure", duration_seconds=0.0)
        assert breaker.describe().state == "open"
        with pytest.raises(DependencyUnavailable) as refused:
            admission_refuse.apply_async((1,), queue=queue)
        assert 0 < refused.value.retry_after <= OPEN_SECONDS
        assert refused.value.state == "open"
        # The open period passes (Redis time cannot move: its deadline is moved back).
        key = state_key(ADMISSION_BREAKER)
        redis_client.hset(key, "open_until", int(redis_client.hget(key, "open_until")) - 60_000)
        guard.clock.now += 1.0
        admission_refuse.apply_async((2,), queue=queue)
        assert breaker.acquire().state == "half_open"
        guard.clock.now += 1.0
        admission_refuse.apply_async((3,), queue=queue)
        assert depth(app, queue) == 2

    def test_close_is_seen_after_the_refresh(
        self, app: Any, guard: Any, breaker: CircuitBreaker, queue: Queue
    ) -> None:
        """A close reaches the producer at its next refresh: refused until then, queued after."""
        breaker.force("forced_open")
        with pytest.raises(DependencyUnavailable):
            admission_refuse.apply_async((1,), queue=queue)
        breaker.force("closed")
        guard.clock.now += 0.5
        with pytest.raises(DependencyUnavailable):
            admission_refuse.apply_async((2,), queue=queue)  # the copy is 0.5 s old
        guard.clock.now += 0.5
        admission_refuse.apply_async((3,), queue=queue)
        assert depth(app, queue) == 1

    def test_republish_and_continuation_are_admitted(
        self, app: Any, guard: Any, breaker: CircuitBreaker, queue: Queue
    ) -> None:
        """A retry's republish and a canvas continuation (`parent_id`) are not new work."""
        breaker.force("forced_open")
        admission_refuse.apply_async((1,), queue=queue, retries=1)
        admission_refuse.apply_async((2,), queue=queue, parent_id=str(uuid.uuid4()))
        assert depth(app, queue) == 2


class TestEnqueuePolicy:
    def test_enqueue_queues_while_open(
        self, app: Any, breaker: CircuitBreaker, queue: Queue, redis_client: Any
    ) -> None:
        """on_open="enqueue" (the default) queues the job and adds no enqueue guard."""
        breaker.force("forced_open")
        admission_enqueue.apply_async((1,), queue=queue)
        assert depth(app, queue) == 1
        _, enqueue = admission_enqueue.pipelines()
        assert not any(isinstance(g, BreakerAdmissionGuard) for g in enqueue.guards)
        assert counted(redis_client, "REJECTED") == 0

    def test_bad_policy_is_refused_at_definition(self) -> None:
        """on_open is "enqueue" or "refuse"; anything else fails when the task is defined."""
        with pytest.raises(ConfigurationError, match="on_open"):
            circuit_breaker("bad", on_open="sometimes")
        with pytest.raises(ConfigurationError, match="refresh_seconds"):
            AdmissionConfig(on_open="refuse", refresh_seconds=-1)


class TestCost:
    def test_one_store_read_per_refresh(
        self, app: Any, guard: Any, queue: Queue, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """In steady state a `.delay()` reads nothing: the state is read once per refresh."""
        reads = CountingBackend(guard.backend)
        monkeypatch.setattr(guard, "backend", reads)
        for n in range(20):
            admission_refuse.apply_async((n,), queue=queue)
        assert reads.reads == 1
        guard.clock.now += 1.0
        admission_refuse.apply_async((20,), queue=queue)
        assert reads.reads == 2
        assert depth(app, queue) == 21


class TestStoreDown:
    def test_unreachable_store_fails_open(
        self, app: Any, guard: Any, breaker: CircuitBreaker, queue: Queue, redis_client: Any,
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
    ) -> None:
        """Breaker store unreachable: jobs are queued; the dead store is asked (warned,
        counted FAIL-OPEN) once per refresh, not once per job."""
        from jobs.embedded import free_port

        breaker.force("forced_open")  # in the real store, which the guard no longer reads
        dead = redis.Redis(port=free_port(), socket_connect_timeout=0.5, socket_timeout=0.5,
                           decode_responses=True, retry=Retry(NoBackoff(), 0))
        reads = CountingBackend(RedisBreakerBackend(lambda: dead))
        monkeypatch.setattr(guard, "backend", reads)
        for n in range(3):
            admission_refuse.apply_async((n,), queue=queue)
        assert depth(app, queue) == 3
        assert reads.reads == 1
        assert counted(redis_client, "FAIL-OPEN") == 1
        guard.clock.now += 1.0
        admission_refuse.apply_async((3,), queue=queue)
        assert (depth(app, queue), reads.reads, counted(redis_client, "FAIL-OPEN")) == (4, 2, 2)
        assert any("fail open" in record.getMessage() for record in caplog.records)
