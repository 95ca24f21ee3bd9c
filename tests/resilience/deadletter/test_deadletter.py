"""The dead-letter place, requeue, and poison messages on real workers."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from resilience.deadletter.place import DeadLetterNotFound, dead_letter, get, list_entries, requeue
from resilience.deadletter.poison import PoisonConfig, poison_guard
from resilience.errors import ConfigurationError
from tests.support import wait_for


class TestPlace:
    def test_record_list_show(self, engine: Any) -> None:
        """An entry keeps the task, its JSON arguments, the reason and the error."""
        entry_id = dead_letter(
            engine, task_name="some.task", task_id="t-1", args=[1, "a"], kwargs={"k": [1]},
            guard="retry", reason="attempts exhausted", attempts=3, tier="standard",
            queue="standard", exception=ValueError("boom"),
        )
        entry = get(engine, entry_id)
        assert (entry.args, entry.kwargs, entry.attempts) == ([1, "a"], {"k": [1]}, 3)
        assert (entry.exception_type, entry.exception_message) == ("ValueError", "boom")
        assert entry_id in [e.id for e in list_entries(engine, task_name="some.task")]
        with pytest.raises(DeadLetterNotFound):
            get(engine, 10**12)

    def test_requeue_once(
        self, app: Any, engine: Any, redis_client: Any, worker_factory: Any, purge_queues: None
    ) -> None:
        """Requeue publishes the original task with its arguments, exactly once."""
        from tests.resilience.deadletter.tasks import failure_echo

        entry_id = dead_letter(
            engine, task_name=failure_echo.name, task_id="old", args=[41], kwargs={},
            guard="retry", reason="test", attempts=1, queue="standard",
        )
        task_id = requeue(engine, app, entry_id)
        with pytest.raises(DeadLetterNotFound):
            requeue(engine, app, entry_id)
        worker_factory("standard", name="requeue", concurrency=1)
        assert app.AsyncResult(task_id).get(timeout=60) == 41
        entry = get(engine, entry_id)
        assert entry.requeued_at is not None and entry.requeued_task_id == task_id

    def test_bad_poison_policy(self) -> None:
        """max_deliveries < 1 fails at definition time."""
        with pytest.raises(ConfigurationError):
            poison_guard(max_deliveries=0)
        with pytest.raises(ConfigurationError):
            PoisonConfig(ttl_seconds=0)


@pytest.mark.chaos
@pytest.mark.timeout(180)
class TestPoisonMessage:
    def test_worker_killed_each_time_is_dead_lettered(
        self, app: Any, engine: Any, redis_client: Any, worker_factory: Any, purge_queues: None
    ) -> None:
        """A message that SIGKILLs its pool process on every run (WorkerLostError, requeued at
        once) runs max_deliveries times, then lands in the dead-letter table."""
        from resilience.errors import DeadLettered
        from tests.resilience.deadletter.tasks import MAX_DELIVERIES, failure_poison

        worker = worker_factory("standard", name="poison", concurrency=1)
        counter = f"poison:{uuid.uuid4().hex}"
        result = failure_poison.delay(counter)
        wait_for(result.ready, timeout_seconds=150, message="poison message dead-lettered")
        assert isinstance(result.result, DeadLettered)
        assert int(redis_client.get(counter)) == MAX_DELIVERIES
        entries = [e for e in list_entries(engine, task_name=failure_poison.name)
                   if e.task_id == result.id]
        assert len(entries) == 1
        assert entries[0].guard == "poison"
        assert entries[0].attempts == MAX_DELIVERIES
        assert entries[0].args == [counter]
        assert worker.alive()
