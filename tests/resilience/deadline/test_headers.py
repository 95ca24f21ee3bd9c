"""The one parsing rule for the platform-stamped `deadline` / `enqueued_at` headers.

A finite number (or numeric string) is used; anything else (garbage, NaN, ±inf, a bool)
counts as absent, with one warning naming the task id and the header: never a raw
traceback, never "always shed", never "never shed" through a bogus value.
"""

from __future__ import annotations

import logging
import math
import uuid
from types import SimpleNamespace
from typing import Any

import pytest

from resilience.deadline import DeadlineConfig, DeadlineGuard, DeadlineStampGuard
from resilience.errors import ConfigurationError
from resilience.headers import Headers
from resilience.outcomes import Outcome, Stop
from resilience.pipeline import Call, Publish
from tests.resilience.deadline import tasks

pytestmark = pytest.mark.timeout(90)

NOW = 1_700_000_000.0

UNUSABLE = ["garbage", "", "nan", "NaN", math.nan, "inf", math.inf, "-inf", -math.inf,
            "1e400", pytest.param(10**400, id="10**400"), True, False, [NOW], {"at": NOW},
            b"1700000000"]


def call_with(headers: dict[str, Any], task_id: str = "t-1") -> Call:
    request = SimpleNamespace(id=task_id, headers=headers,
                              delivery_info={"routing_key": "optional"})
    return Call(task=tasks.deadline_mark, args=("r",), kwargs={}, request=request)


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [record.getMessage() for record in caplog.records
            if record.levelno == logging.WARNING and record.name == "resilience.deadline"]


class TestDeadlineHeader:
    @pytest.mark.parametrize("value", UNUSABLE, ids=repr)
    def test_unusable_deadline_counts_as_absent(self, value: Any,
                                                caplog: pytest.LogCaptureFixture) -> None:
        """The job runs as if it had no deadline; one warning names the task and header."""
        guard = DeadlineGuard(clock=lambda: NOW)
        with caplog.at_level(logging.WARNING, logger="resilience.deadline"):
            guard.before_run(call_with({"deadline": value}, task_id="task-42"))
        [warning] = warnings_of(caplog)
        assert "task-42" in warning and "deadline" in warning

    @pytest.mark.parametrize("value", UNUSABLE, ids=repr)
    def test_unusable_deadline_under_pressure(self, value: Any,
                                              caplog: pytest.LogCaptureFixture) -> None:
        """Pressure cannot turn an unusable deadline into a shed (or an error) either."""
        policy = DeadlineConfig(deadline_seconds=100, pressure_queue_depth=1)
        guard = DeadlineGuard(policy, depth=lambda task, queue: 50, clock=lambda: NOW)
        with caplog.at_level(logging.WARNING, logger="resilience.deadline"):
            guard.before_run(call_with({"deadline": value, "enqueued_at": NOW - 1000}))
        assert len(warnings_of(caplog)) == 1

    @pytest.mark.parametrize("value", [NOW - 1, int(NOW - 1), str(NOW - 1), " 1699999999 "],
                             ids=repr)
    def test_finite_numbers_and_numeric_strings_are_used(self, value: Any) -> None:
        """A finite number or numeric string is a deadline: past means SHED."""
        guard = DeadlineGuard(clock=lambda: NOW)
        with pytest.raises(Stop) as stopped:
            guard.before_run(call_with({"deadline": value}))
        assert stopped.value.outcome is Outcome.SHED


class TestEnqueuedAtHeader:
    @pytest.mark.parametrize("value", UNUSABLE, ids=repr)
    def test_unusable_enqueued_at_under_pressure(self, value: Any,
                                                 caplog: pytest.LogCaptureFixture) -> None:
        """No ValueError: without an enqueue time there is no pressure rule, the plain
        deadline decides, and one warning names the task and header."""
        policy = DeadlineConfig(deadline_seconds=100, pressure_queue_depth=10)
        guard = DeadlineGuard(policy, depth=lambda task, queue: 11, clock=lambda: NOW)
        with caplog.at_level(logging.WARNING, logger="resilience.deadline"):
            guard.before_run(call_with({"enqueued_at": value, "deadline": NOW + 70},
                                       task_id="task-7"))
        [warning] = warnings_of(caplog)
        assert "task-7" in warning and "enqueued_at" in warning
        with pytest.raises(Stop) as stopped:
            guard.before_run(call_with({"enqueued_at": value, "deadline": NOW - 1}))
        assert stopped.value.details["pressure"] is False

    def test_numeric_string_enqueued_at_is_used(self) -> None:
        """A numeric-string enqueue time still drives the pressure rule."""
        policy = DeadlineConfig(deadline_seconds=100, pressure_queue_depth=10)
        guard = DeadlineGuard(policy, depth=lambda task, queue: 11, clock=lambda: NOW)
        with pytest.raises(Stop) as stopped:
            guard.before_run(call_with({"enqueued_at": str(NOW - 30), "deadline": NOW + 70}))
        assert stopped.value.details["pressure"] is True


class TestNonFiniteDeadlineSeconds:
    def publish(self, **options: Any) -> Publish:
        return Publish(task=tasks.deadline_mark, args=("r",), kwargs={}, options=options)

    @pytest.mark.parametrize("seconds", [math.nan, math.inf, -math.inf, True], ids=repr)
    def test_per_call_option_refused(self, seconds: Any) -> None:
        """`deadline_seconds=` per call must be finite positive seconds."""
        stamp = DeadlineStampGuard(DeadlineConfig(), clock=lambda: NOW)
        with pytest.raises(ConfigurationError, match="deadline_seconds"):
            stamp.before_publish(self.publish(deadline_seconds=seconds))

    @pytest.mark.parametrize("seconds", [math.nan, math.inf, True], ids=repr)
    def test_policy_refused(self, seconds: Any) -> None:
        """A policy's deadline_seconds must be finite positive seconds too."""
        with pytest.raises(ConfigurationError, match="deadline_seconds"):
            DeadlineConfig(deadline_seconds=seconds)

    @pytest.mark.parametrize("factor", [math.nan, math.inf], ids=repr)
    def test_pressure_factor_refused(self, factor: float) -> None:
        with pytest.raises(ConfigurationError, match="pressure_deadline_factor"):
            DeadlineConfig(pressure_deadline_factor=factor)


def _expires_at(request: Any) -> float | None:
    return Headers(request).expires_at  # what the breaker reads (`call.headers`)


class TestBreakerReadsTheSameRule:
    @pytest.mark.parametrize("value", UNUSABLE, ids=repr)
    def test_unusable_deadline_is_no_deadline(self, value: Any) -> None:
        """The breaker neither dead-letters every job (-inf, a bool) nor none (NaN, +inf)."""
        request = SimpleNamespace(id="t-9", headers={"deadline": value}, expires=None)
        assert _expires_at(request) is None
        request.expires = NOW + 5
        assert _expires_at(request) == NOW + 5

    @pytest.mark.parametrize("value", [NOW + 1, str(NOW + 1)], ids=repr)
    def test_usable_deadline_is_read(self, value: Any) -> None:
        request = SimpleNamespace(id="t-9", headers={"deadline": value}, expires=NOW + 5)
        assert _expires_at(request) == NOW + 1

    def test_non_finite_expires_is_ignored(self) -> None:
        """Celery's `expires` goes through the same finiteness check (ISO strings still work)."""
        request = SimpleNamespace(id="t-9", headers={}, expires=math.nan)
        assert _expires_at(request) is None
        request.expires = "2023-11-14T22:13:20+00:00"
        assert _expires_at(request) == NOW


@pytest.fixture()
def optional_worker(worker_factory: Any) -> Any:
    return worker_factory("optional", name="deadline-headers", concurrency=1)


class TestOnWorkers:
    def test_unusable_headers_run_the_job(self, optional_worker: Any, redis_client: Any) -> None:
        """A real worker runs a job whose deadline is "nan" and enqueued_at garbage."""
        run_id = uuid.uuid4().hex
        result = tasks.deadline_mark.apply_async(
            (run_id,), headers={"deadline": "nan", "enqueued_at": "garbage"})
        assert result.get(timeout=60) == "ran"
        assert redis_client.get(f"tests:deadline:ran:{run_id}") == "1"
