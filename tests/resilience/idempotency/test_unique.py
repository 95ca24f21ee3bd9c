"""`@unique` on real workers and Redis: a duplicate enqueue returns (or raises for) the
queued job until it starts or finishes."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import pytest

from resilience.errors import DuplicateJob
from tests.resilience.idempotency import tasks

pytestmark = pytest.mark.timeout(180)


def runs(redis_client: Any, key: str) -> int:
    return int(redis_client.get(tasks.runs_key(key)) or 0)


@pytest.fixture()
def worker(worker_factory: Callable[..., Any], redis_client: Any, purge_queues: None) -> Any:
    return worker_factory("critical", name="idem", concurrency=2)


class TestUnique:
    def test_duplicate_enqueue_raises_until_finished(self, worker: Any, redis_client: Any) -> None:
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
