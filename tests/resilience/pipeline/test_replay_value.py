"""A replay answers the first call's value (Celery's contract for an idempotent call, as
Stripe's and the IETF Idempotency-Key draft's); the outcome travels beside it, in the
result's metadata (`resilience.outcome_of`) and in the worker's log line."""

from __future__ import annotations

import re
import time
import uuid
from typing import Any

import pytest
from celery import chain
from celery.result import AsyncResult

from resilience import Outcome, outcome_of
from tests.resilience.pipeline import tasks_replay as tasks
from tests.support import wait_for


@pytest.fixture()
def standard_worker(worker_factory: Any) -> Any:
    return worker_factory("standard", name="replay", concurrency=1)


class TestReplayedValue:
    @pytest.mark.timeout(180)
    def test_a_replayed_payment_answers_the_first_calls_dict(
            self, app: Any, standard_worker: Any) -> None:
        """`.get()` of the duplicate equals the first call's dict (`["payment_id"]` works);
        the REPLAYED outcome is in the result's metadata, not in the value."""
        order = uuid.uuid4().hex
        first = tasks.payment.delay(order_id=order, amount=10)
        value = first.get(timeout=60)
        second = tasks.payment.delay(order_id=order, amount=10)
        assert second.get(timeout=60) == value
        assert second.get(timeout=60)["payment_id"] == value["payment_id"]
        assert second.state == "SUCCESS"
        decision = outcome_of(AsyncResult(second.id, app=app))
        assert decision is not None
        assert decision.outcome is Outcome.REPLAYED and decision.guard == "idempotency"
        assert first.id in decision.reason
        assert AsyncResult(second.id, app=app)._get_task_meta()["outcome"]["outcome"] == (
            "REPLAYED")
        assert outcome_of(AsyncResult(first.id, app=app)) is None  # the body ran

    @pytest.mark.timeout(180)
    def test_an_int_and_a_list_are_replayed_as_they_were(
            self, app: Any, standard_worker: Any) -> None:
        """A non-dict value (an int, a list) comes back exactly, not wrapped."""
        key = uuid.uuid4().hex
        number = tasks.number.delay(key=key).get(timeout=60)
        listed = tasks.items.delay(key=key).get(timeout=60)
        replayed_number = tasks.number.delay(key=key)
        replayed_list = tasks.items.delay(key=key)
        assert replayed_number.get(timeout=60) == number and isinstance(number, int)
        assert replayed_list.get(timeout=60) == listed and isinstance(listed, list)
        assert outcome_of(replayed_number).outcome is Outcome.REPLAYED  # type: ignore[union-attr]
        assert outcome_of(replayed_list).outcome is Outcome.REPLAYED  # type: ignore[union-attr]

    @pytest.mark.timeout(180)
    def test_a_replayed_job_in_a_chain_passes_the_first_value_on(
            self, app: Any, standard_worker: Any) -> None:
        """The next task of a chain receives the stored value, as from a run."""
        order = uuid.uuid4().hex
        value = tasks.payment.delay(order_id=order, amount=5).get(timeout=60)
        flow = chain(tasks.payment.si(order_id=order, amount=5), tasks.passed_on.s())
        assert flow.apply_async().get(timeout=60) == {"handed": value}

    @pytest.mark.timeout(180)
    def test_a_shed_job_answers_its_outcome_without_blocking(
            self, app: Any, standard_worker: Any) -> None:
        """Another stop (SHED) is final at once: `.get()` returns its outcome dict, and
        `outcome_of` reads the same decision."""
        result = tasks.number.apply_async(kwargs={"key": uuid.uuid4().hex},
                                          headers={"deadline": time.time() - 1})
        body = result.get(timeout=60)
        assert result.state == "SUCCESS"
        assert body["outcome"] == "SHED" and body["guard"] == "deadline"
        decision = outcome_of(AsyncResult(result.id, app=app))
        assert decision is not None and decision.outcome is Outcome.SHED


class TestGuardDecisionLog:
    @pytest.mark.timeout(180)
    def test_the_worker_log_line_carries_the_decision_fields(
            self, app: Any, worker_factory: Any) -> None:
        """Under Celery's default log format (JOBS_LOG_FORMAT=text keeps Celery's own, as a
        library user has it) the line names the task, id, guard, outcome and reason: an
        `extra=` field would not print."""
        worker = worker_factory("standard", name="replay-log", concurrency=1,
                                env={"JOBS_LOG_FORMAT": "text"})
        order = uuid.uuid4().hex
        first = tasks.payment.delay(order_id=order, amount=1)
        first.get(timeout=60)
        replayed: list[str] = []

        def logged() -> str | None:
            # Other workers of the session may consume the standard queue: replay until a
            # duplicate lands on this one.
            result = tasks.payment.delay(order_id=order, amount=1)
            result.get(timeout=60)
            replayed.append(result.id)
            for line in worker.log_path.read_text(errors="replace").splitlines():
                if "guard decision" in line and any(f"id={i}" in line for i in replayed):
                    return line
            return None

        line = wait_for(logged, timeout_seconds=120, interval=0.2,
                        message="the guard decision in the worker's log")
        # Celery's worker_log_format: "[%(asctime)s: %(levelname)s/%(processName)s] %(message)s"
        assert re.match(r"\[[^\]]+: INFO/ForkPoolWorker-\d+\] guard decision: "
                        r"task=tests\.replay\.payment id=\S+ guard=idempotency "
                        r"outcome=REPLAYED reason=", line), line
        assert "guard=idempotency" in line and "outcome=REPLAYED" in line
        assert "reason=key 'payment:" in line and f"already succeeded in task {first.id}" in line
