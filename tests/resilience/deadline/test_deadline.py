"""Deadline shedding: expired jobs finish with outcome SHED (counted), never run."""

from __future__ import annotations

import json
import time
import uuid
from types import SimpleNamespace
from typing import Any

import pytest

from resilience.counters import read_all
from resilience.deadline import DeadlineConfig, DeadlineGuard, DeadlineStampGuard
from resilience.errors import ConfigurationError
from resilience.outcomes import Outcome, Stop
from resilience.pipeline import Call, Publish
from tests.resilience.deadline import tasks
from tests.support import wait_for

pytestmark = pytest.mark.timeout(90)

NOW = 1_700_000_000.0


def call_with(headers: dict[str, Any], task: Any = None) -> Call:
    request = SimpleNamespace(id="t-1", headers=headers,
                              delivery_info={"routing_key": "optional"})
    return Call(task=task or tasks.deadline_mark, args=("r",), kwargs={}, request=request)


class TestDeadlineGuard:
    def test_expired_job_is_shed(self) -> None:
        """A deadline in the past stops the call with SHED and says how late it is."""
        guard = DeadlineGuard(clock=lambda: NOW)
        with pytest.raises(Stop) as stopped:
            guard.before_run(call_with({"deadline": NOW - 2.5}))
        assert stopped.value.outcome is Outcome.SHED
        assert stopped.value.details["late_seconds"] == pytest.approx(2.5)
        assert stopped.value.as_result()["outcome"] == "SHED"

    def test_job_within_deadline_runs(self) -> None:
        """A deadline still ahead, or none at all, lets the call through."""
        guard = DeadlineGuard(clock=lambda: NOW)
        guard.before_run(call_with({"deadline": NOW + 1}))
        guard.before_run(call_with({}))

    def test_pressure_shrinks_the_deadline(self) -> None:
        """Beyond the pressure depth only a quarter of the deadline is kept: old work goes."""
        policy = DeadlineConfig(deadline_seconds=100, pressure_queue_depth=10,
                                pressure_deadline_factor=0.25)
        headers = {"enqueued_at": NOW - 30, "deadline": NOW + 70}
        calm = DeadlineGuard(policy, depth=lambda task, queue: 10, clock=lambda: NOW)
        calm.before_run(call_with(headers))
        pressed = DeadlineGuard(policy, depth=lambda task, queue: 11, clock=lambda: NOW)
        with pytest.raises(Stop) as stopped:
            pressed.before_run(call_with(headers))
        assert stopped.value.details["pressure"] is True
        assert stopped.value.details["effective_deadline"] == pytest.approx(NOW - 5)

    def test_depth_is_read_once_per_interval(self) -> None:
        """Pressure costs one depth reading per cache interval, not one per job."""
        readings: list[str] = []

        def depth(task: Any, queue: str) -> int:
            readings.append(queue)
            return 0

        guard = DeadlineGuard(DeadlineConfig(deadline_seconds=10, pressure_queue_depth=5),
                              depth=depth, clock=lambda: NOW, depth_cache_seconds=3600)
        for _ in range(5):
            guard.before_run(call_with({"enqueued_at": NOW, "deadline": NOW + 10}))
        assert readings == ["optional"]


class TestDeadlineStamp:
    def publish(self, **options: Any) -> Publish:
        return Publish(task=tasks.deadline_mark, args=("r",), kwargs={}, options=options)

    def test_stamps_enqueue_time_and_deadline(self) -> None:
        """New jobs carry enqueued_at and, with a deadline, the absolute deadline."""
        publish = self.publish()
        DeadlineStampGuard(DeadlineConfig(deadline_seconds=30), clock=lambda: NOW).before_publish(
            publish)
        assert publish.options["headers"] == {"enqueued_at": NOW, "deadline": NOW + 30}

    def test_per_call_deadline_and_explicit_header(self) -> None:
        """deadline_seconds= per call wins over the policy; an explicit header is kept."""
        stamp = DeadlineStampGuard(DeadlineConfig(deadline_seconds=30), clock=lambda: NOW)
        publish = self.publish(deadline_seconds=5)
        stamp.before_publish(publish)
        assert publish.options["headers"]["deadline"] == NOW + 5
        assert "deadline_seconds" not in publish.options
        explicit = self.publish(headers={"deadline": 123.0})
        stamp.before_publish(explicit)
        assert explicit.options["headers"]["deadline"] == 123.0

    def test_no_deadline_by_default(self) -> None:
        publish = self.publish()
        DeadlineStampGuard(DeadlineConfig(), clock=lambda: NOW).before_publish(publish)
        assert "deadline" not in publish.options["headers"]

    def test_tier_defaults(self, app: Any) -> None:
        """Critical and standard work is never shed by default; optional work is."""
        assert app.tasks["tests.tasks.whoami_critical"].deadline_policy().deadline_seconds is None
        optional = app.tasks["tests.tasks.whoami_optional"].deadline_policy()
        assert optional.deadline_seconds and optional.pressure_queue_depth
        assert tasks.deadline_short.deadline_policy().deadline_seconds == 1


class TestBadInput:
    @pytest.mark.parametrize("options", [{"deadline_seconds": 0}, {"deadline_seconds": -1},
                                         {"pressure_queue_depth": 0},
                                         {"pressure_deadline_factor": 0},
                                         {"pressure_deadline_factor": 1.5}])
    def test_refused(self, options: dict[str, Any]) -> None:
        with pytest.raises(ConfigurationError):
            DeadlineConfig(**options)

    def test_bad_per_call_deadline(self) -> None:
        with pytest.raises(ConfigurationError, match="deadline_seconds"):
            tasks.deadline_mark.apply_async(("r",), deadline_seconds="soon")


@pytest.fixture()
def optional_worker(worker_factory: Any) -> Any:
    return worker_factory("optional", name="deadline", concurrency=1)


def shed_count(redis_client: Any, task_name: str) -> int:
    return sum(value for labels, value in read_all(redis_client)
               if labels["outcome"] == "SHED" and labels["name"] == task_name
               and labels["tier"] == "optional")


class TestOnWorkers:
    def test_expired_message_is_shed_visibly(self, optional_worker: Any,
                                             redis_client: Any) -> None:
        """A message past its deadline finishes SUCCESS with outcome SHED; the body never ran."""
        run_id = uuid.uuid4().hex
        result = tasks.deadline_mark.apply_async((run_id,), headers={"deadline": time.time() - 1})
        body = result.get(timeout=60)
        assert result.state == "SUCCESS"
        assert body["outcome"] == "SHED" and body["guard"] == "deadline"
        assert redis_client.get(f"tests:deadline:ran:{run_id}") is None
        assert shed_count(redis_client, "tests.deadline.mark") == 1

    def test_task_deadline_seconds_sheds_a_late_job(self, optional_worker: Any,
                                                    redis_client: Any,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
        """deadline_seconds=1 on the task; enqueued (by the stamp's clock) 3 s ago, the job
        is shed. (A countdown no longer makes a job late: its deadline counts from when it
        is due, see tests/resilience/pipeline/test_celery_features.py.)

        The same job with a per-call deadline of 300 s runs.
        """
        from resilience.deadline import DeadlineStampGuard

        _, enqueue = tasks.deadline_short.pipelines()
        stamp = next(g for g in enqueue.guards if isinstance(g, DeadlineStampGuard))
        monkeypatch.setattr(stamp, "clock", lambda: time.time() - 3)
        run_id = uuid.uuid4().hex
        result = tasks.deadline_short.apply_async((run_id,))
        assert result.get(timeout=60)["outcome"] == "SHED"
        assert redis_client.get(f"tests:deadline:ran:{run_id}") is None
        in_time = tasks.deadline_short.apply_async((run_id,), deadline_seconds=300)
        assert in_time.get(timeout=60) == "ran"

    def test_retry_keeps_the_original_deadline(self, optional_worker: Any,
                                               redis_client: Any) -> None:
        """A Celery retry republishes with the same deadline header: no fresh deadline."""
        run_id = uuid.uuid4().hex
        deadline = time.time() + 120
        tasks.deadline_retried.apply_async((run_id,), headers={"deadline": deadline})
        recorded = wait_for(lambda: redis_client.get(f"tests:deadline:headers:{run_id}"),
                            timeout_seconds=60, message="the retried run")
        assert json.loads(recorded)["deadline"] == pytest.approx(deadline)
