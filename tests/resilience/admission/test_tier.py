"""Tier bulkhead at enqueue: every policy on a full queue, concurrent producers, bad input."""

from __future__ import annotations

import multiprocessing
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kombu import Exchange, Queue

from resilience.admission import (
    AdmissionGuard,
    BulkheadConfig,
    DiscardedResult,
    RejectionPolicy,
    depth_backend_for,
)
from resilience.counters import read_all
from resilience.errors import ConfigurationError, TierFull, UnknownTierError
from resilience.outcomes import Outcome
from resilience.pipeline import Publish
from tests.resilience.admission import tasks

pytestmark = pytest.mark.timeout(60)


@pytest.fixture()
def queue(app: Any) -> Iterator[Queue]:
    """A private queue on the platform exchange that no worker consumes; deleted afterwards."""
    name = f"bulkhead-test-{uuid.uuid4().hex[:8]}"
    private = Queue(name, Exchange("jobs", type="direct"), routing_key=name)
    yield private
    backend = depth_backend_for(app)
    client = backend.client()
    client.delete(*backend.lists(name), backend.reservations_key(name))
    # kombu keeps exchange bindings as "routing_key\x06\x16pattern\x06\x16queue" members.
    ours = [m for m in client.smembers("_kombu.binding.jobs") if m.endswith("\x06\x16" + name)]
    if ours:
        client.srem("_kombu.binding.jobs", *ours)


def counted(redis_client: Any, outcome: str, name: str) -> int:
    return sum(
        value for labels, value in read_all(redis_client)
        if labels["outcome"] == outcome and labels["guard"] == "bulkhead" and labels["name"] == name
    )


def fill(task: Any, queue: Queue, count: int) -> None:
    for n in range(count):
        task.apply_async((n,), queue=queue)


class TestPolicies:
    def test_abort_raises_tier_full_with_fields(self, app: Any, queue: Queue,
                                                redis_client: Any) -> None:
        """A full tier with policy abort raises TierFull with tier, depth, limit, retry_after."""
        fill(tasks.bulkhead_abort, queue, tasks.LIMIT)
        with pytest.raises(TierFull) as raised:
            tasks.bulkhead_abort.apply_async((99,), queue=queue)
        error = raised.value
        assert (error.tier, error.depth, error.limit, error.retry_after) == (
            "optional", tasks.LIMIT, tasks.LIMIT, 7)
        assert depth_backend_for(app).depth(queue.name) == tasks.LIMIT
        assert counted(redis_client, "REJECTED", "abort") == 1

    def test_discard_returns_a_recognisable_result(self, app: Any, queue: Queue,
                                                   redis_client: Any) -> None:
        """Policy discard publishes nothing and returns a DiscardedResult, counted."""
        fill(tasks.bulkhead_discard, queue, tasks.LIMIT)
        result = tasks.bulkhead_discard.apply_async((99,), queue=queue)
        assert isinstance(result, DiscardedResult)
        assert result.outcome is Outcome.DISCARDED
        assert result.get()["outcome"] == "DISCARDED"
        assert (result.depth, result.limit, result.tier) == (tasks.LIMIT, tasks.LIMIT, "optional")
        assert depth_backend_for(app).depth(queue.name) == tasks.LIMIT
        assert counted(redis_client, "DISCARDED", "discard") == 1

    def test_caller_runs_executes_inline(self, app: Any, queue: Queue,
                                         redis_client: Any) -> None:
        """Policy caller_runs runs the task in the producer and returns its EagerResult."""
        fill(tasks.bulkhead_caller_runs, queue, tasks.LIMIT)
        result = tasks.bulkhead_caller_runs.apply_async((4,), queue=queue)
        assert result.get() == 40
        assert result.successful()
        assert depth_backend_for(app).depth(queue.name) == tasks.LIMIT
        assert counted(redis_client, "REJECTED", "caller_runs") == 1

    def test_wait_times_out_then_aborts(self, app: Any, queue: Queue, redis_client: Any) -> None:
        """Policy wait blocks up to its timeout, then raises TierFull."""
        fill(tasks.bulkhead_wait, queue, tasks.LIMIT)
        with pytest.raises(TierFull):
            tasks.bulkhead_wait.apply_async((99,), queue=queue)
        assert depth_backend_for(app).depth(queue.name) == tasks.LIMIT
        assert counted(redis_client, "REJECTED", "wait") == 1

    def test_wait_admits_when_room_appears(self, app: Any, queue: Queue) -> None:
        """Policy wait admits as soon as a consumer makes room (sleep injected: no clock)."""
        fill(tasks.bulkhead_abort, queue, tasks.LIMIT)
        backend = depth_backend_for(app)
        sleeps: list[float] = []

        def consume_one(seconds: float) -> None:
            sleeps.append(seconds)
            if len(sleeps) == 2:
                backend.client().rpop(queue.name)

        guard = AdmissionGuard(
            BulkheadConfig(tier="optional", max_queue_depth=tasks.LIMIT, policy="wait",
                           wait_timeout_seconds=3600),
            sleep=consume_one,
        )
        publish = Publish(task=tasks.bulkhead_abort, args=(1,), kwargs={},
                          options={"queue": queue})
        guard.before_publish(publish)
        assert len(sleeps) == 2
        assert backend.reserved(queue.name) == 1
        guard.after_publish(publish, None)
        assert backend.reserved(queue.name) == 0

    def test_priority_lists_count_toward_depth(self, app: Any, queue: Queue) -> None:
        """Messages in kombu's per-priority lists count: depth is the sum over all of them."""
        for n in range(3):
            tasks.bulkhead_abort.apply_async((n,), queue=queue, priority=9)
        fill(tasks.bulkhead_abort, queue, tasks.LIMIT - 3)
        backend = depth_backend_for(app)
        assert backend.client().llen(queue.name) == tasks.LIMIT - 3
        with pytest.raises(TierFull):
            tasks.bulkhead_abort.apply_async((99,), queue=queue)

    def test_reservations_are_released_after_publish(self, app: Any, queue: Queue) -> None:
        """Admitted publishes give back their reservation once the message is in the queue."""
        fill(tasks.bulkhead_abort, queue, 3)
        assert depth_backend_for(app).reserved(queue.name) == 0


class TestBoundedPublish:
    def test_the_transport_checks_depth_and_pushes_in_one_step(
        self, app: Any, queue: Queue
    ) -> None:
        """On the platform's Redis transport nothing is reserved or released: the bound
        travels in a header the transport removes, and the message stored is clean."""
        import json

        from resilience.admission.broker import BOUND_HEADER

        backend = depth_backend_for(app)
        assert backend.bounded_publish
        client = backend.client()

        def calls(command: str) -> int:
            return int(client.info("commandstats").get(f"cmdstat_{command}", {}).get("calls", 0))

        zrem, zadd = calls("zrem"), calls("zadd")
        fill(tasks.bulkhead_abort, queue, 3)
        assert (calls("zrem"), calls("zadd")) == (zrem, zadd)  # no reservation round trips
        stored = [json.loads(item) for item in client.lrange(queue.name, 0, -1)]
        assert len(stored) == 3
        assert all(BOUND_HEADER not in message["headers"] for message in stored)
        with pytest.raises(TierFull) as refused:
            fill(tasks.bulkhead_abort, queue, tasks.LIMIT)
        assert refused.value.limit == tasks.LIMIT
        assert backend.depth(queue.name) == tasks.LIMIT


class TestConcurrentProducers:
    def test_no_overshoot_with_many_producers(self, app: Any, queue: Queue) -> None:
        """8 producers racing on a limit of 20: exactly 20 admitted, depth never above 20."""
        producers, per_producer = 8, 10
        admitted: list[int] = []
        rejected: list[int] = []
        lock = threading.Lock()
        start = threading.Barrier(producers)

        def produce(index: int) -> None:
            start.wait()
            for n in range(per_producer):
                try:
                    tasks.bulkhead_concurrent.apply_async((index * 100 + n,), queue=queue)
                    outcome = admitted
                except TierFull:
                    outcome = rejected
                with lock:
                    outcome.append(n)

        threads = [threading.Thread(target=produce, args=(i,)) for i in range(producers)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        backend = depth_backend_for(app)
        assert len(admitted) == tasks.CONCURRENT_LIMIT
        assert len(rejected) == producers * per_producer - tasks.CONCURRENT_LIMIT
        assert backend.depth(queue.name) == tasks.CONCURRENT_LIMIT
        assert backend.reserved(queue.name) == 0


    def test_no_overshoot_with_producer_processes(self, app: Any, queue: Queue) -> None:
        """4 producer processes racing on a limit of 20: exactly 20 admitted in all."""
        context = multiprocessing.get_context("spawn")
        with context.Pool(4) as pool:
            admitted = pool.starmap(produce_in_process, [(queue, 10)] * 4)
        assert sum(admitted) == tasks.CONCURRENT_LIMIT
        assert depth_backend_for(app).depth(queue.name) == tasks.CONCURRENT_LIMIT


def produce_in_process(queue: Queue, jobs: int) -> int:
    """Producer process body: publish `jobs`, return how many were admitted."""
    from tests.resilience.admission import tasks as process_tasks

    admitted = 0
    for n in range(jobs):
        try:
            process_tasks.bulkhead_concurrent.apply_async((n,), queue=queue)
            admitted += 1
        except TierFull:
            pass
    return admitted


class TestTierDefaults:
    def test_platform_tasks_take_their_tier_settings(self, app: Any) -> None:
        """Every platform task gets its tier's depth limit and policy from the settings."""
        for tier, policy in (("critical", "wait"), ("standard", "caller_runs"),
                             ("optional", "discard")):
            task = app.tasks[f"tests.tasks.whoami_{tier}"]
            config = task.admission_config()
            assert config.policy is RejectionPolicy(policy)
            assert config.max_queue_depth == app.settings.tier(tier).max_queue_depth

    def test_own_bulkhead_takes_precedence(self) -> None:
        """A task's own @bulkhead replaces the tier default: one admission decision."""
        guards = tasks.bulkhead_abort.pipelines()[1].guards
        admissions = [guard for guard in guards if isinstance(guard, AdmissionGuard)]
        assert len(admissions) == 1
        config = admissions[0].config_for(tasks.bulkhead_abort)
        assert config is not None and config.max_queue_depth == tasks.LIMIT


class TestBadInput:
    @pytest.mark.parametrize("depth", [0, -1, 1.5, True])
    def test_limit_must_be_positive_integer(self, depth: Any) -> None:
        """max_queue_depth <= 0 (or not an integer) is refused at definition time."""
        with pytest.raises(ConfigurationError, match="max_queue_depth"):
            BulkheadConfig(tier="optional", max_queue_depth=depth)

    def test_unknown_policy(self) -> None:
        """An unknown policy names the valid ones."""
        with pytest.raises(ConfigurationError, match="abort, discard, caller_runs, wait"):
            BulkheadConfig(tier="optional", max_queue_depth=3, policy="drop")

    def test_unknown_tier(self, app: Any) -> None:
        """A task on an unknown tier fails when it is defined."""
        with pytest.raises(UnknownTierError, match="valid tiers"):
            app.task(tier="bulk")(lambda: None)

