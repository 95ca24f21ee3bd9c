"""Cancellation that sticks: a cancelled job never starts, on any worker, and a job cancelled
while it runs does not commit."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import text

from resilience.cancel import MemoryCancelBackend, RedisCancelBackend, id_target, key_target
from tests.support import wait_for

#: The guard's copy is at most this old (CancelConfig.refresh_seconds) plus a margin.
REFRESH = 1.2


@pytest.fixture(params=["memory", "redis"])
def backend(request: pytest.FixtureRequest, redis_client: Any) -> Any:
    """The same mark semantics on each backend."""
    return MemoryCancelBackend() if request.param == "memory" else RedisCancelBackend(
        redis_client)


class TestBackend:
    def test_marks_versions_and_expiry(self, backend: Any) -> None:
        """A mark is read back with its reason until it expires; every change moves the
        version; prune drops expired marks; uncancel removes one."""
        now = time.time()
        start = backend.version()
        backend.cancel(id_target("t1"), reason="fraud", expires_at=now + 60)
        middle = backend.version()
        backend.cancel(key_target("shop.charge", "order-7"), reason="", expires_at=now - 1)
        assert len({start, middle, backend.version()}) == 3
        version, marks = backend.load()
        assert version == backend.version() and set(marks) == {"id:t1", "key:shop.charge:order-7"}
        assert backend.reasons(["id:other", "id:t1"], now=now) == "fraud"
        assert backend.reasons(["key:shop.charge:order-7"], now=now) is None  # expired
        assert backend.prune(now=now) == 1
        assert backend.uncancel("id:t1") is True
        assert backend.uncancel("id:t1") is False
        assert backend.load()[1] == {}


@pytest.fixture()
def cancellations(app: Any, redis_client: Any) -> Any:
    from jobs.platform import cancellations as build

    return build(app)


@pytest.mark.usefixtures("tier_workers")
class TestOnWorkers:
    def test_a_cancelled_job_never_starts(self, app: Any, redis_client: Any,
                                          cancellations: Any) -> None:
        """Cancelled by id before it is even sent (no Celery revoke anywhere): the worker
        stops it with outcome CANCELLED and the body never runs."""
        from tests.resilience.cancel.tasks import cancel_order

        run_id, task_id = uuid.uuid4().hex[:8], str(uuid.uuid4())
        cancellations.cancel_job(task_id, reason="customer asked")
        time.sleep(REFRESH)
        result = cancel_order.apply_async((run_id, "a", 1), task_id=task_id)
        outcome = result.get(timeout=30)
        assert outcome["outcome"] == "CANCELLED"
        assert outcome["reason"] == "cancelled: customer asked"
        assert redis_client.get(f"tests:cancel:{run_id}:a") is None
        assert cancel_order.delay(run_id, "a", 2).get(timeout=30) == 2  # another id runs

    def test_cancel_by_key_stops_every_job_of_the_key(self, redis_client: Any,
                                                     cancellations: Any) -> None:
        """`--task NAME --key KEY`: every job whose cancel_key renders to KEY is stopped, the
        other keys' jobs run; withdrawing the cancellation lets new ones run again."""
        from tests.resilience.cancel.tasks import cancel_order

        run_id = uuid.uuid4().hex[:8]
        order = f"order-{run_id}"
        target = cancellations.cancel_key(cancel_order.name, order)
        time.sleep(REFRESH)
        stopped = [cancel_order.delay(run_id, order, n) for n in range(3)]
        other = cancel_order.delay(run_id, "other", 9)
        assert other.get(timeout=30) == 9
        assert [r.get(timeout=30)["outcome"] for r in stopped] == ["CANCELLED"] * 3
        assert redis_client.get(f"tests:cancel:{run_id}:{order}") is None
        assert cancellations.uncancel(target) is True
        time.sleep(REFRESH)
        assert cancel_order.delay(run_id, order, 4).get(timeout=30) == 4

    def test_restored_after_redis_lost_its_copy(self, redis_client: Any,
                                               cancellations: Any) -> None:
        """The record is PostgreSQL's: after the Redis copy is flushed, restore() (the beat's
        job, `jobs cancellations restore`) brings it back and the job is still stopped."""
        from tests.resilience.cancel.tasks import cancel_order

        run_id, task_id = uuid.uuid4().hex[:8], str(uuid.uuid4())
        cancellations.cancel_job(task_id, reason="kept")
        redis_client.flushdb()
        assert cancellations.backend.load()[1] == {}
        assert cancellations.restore() >= 1
        assert f"id:{task_id}" in cancellations.backend.load()[1]
        assert task_id in {c.task_id for c in cancellations.describe()}
        time.sleep(REFRESH)
        result = cancel_order.apply_async((run_id, "b", 1), task_id=task_id)
        assert result.get(timeout=30)["outcome"] == "CANCELLED"


@pytest.fixture()
def effects_table(engine: Any) -> Iterator[None]:
    with engine.begin() as connection:
        connection.execute(text(
            "CREATE TABLE IF NOT EXISTS tests_cancel_effects (run_id text NOT NULL)"))
    yield


@pytest.mark.usefixtures("tier_workers", "effects_table")
class TestWhileRunning:
    def test_a_transactional_body_cancelled_mid_run_rolls_back(
        self, engine: Any, redis_client: Any, cancellations: Any
    ) -> None:
        """Cancelled while its body runs: the commit's checkpoint sees it, the body's row is
        rolled back, and the job ends CANCELLED on its next delivery; nothing committed."""
        from tests.resilience.cancel.tasks import cancel_transfer

        run_id = uuid.uuid4().hex[:8]
        result = cancel_transfer.delay(run_id)
        wait_for(lambda: redis_client.get(f"tests:cancel:{run_id}:started"),
                 timeout_seconds=30, message="the body started")
        cancellations.cancel_job(result.id, reason="stop it")
        redis_client.set(f"tests:cancel:{run_id}:go", 1)
        outcome = result.get(timeout=60)
        assert outcome["outcome"] == "CANCELLED"
        with engine.connect() as connection:
            rows = connection.execute(text(
                "SELECT count(*) FROM tests_cancel_effects WHERE run_id = :run"),
                {"run": run_id}).scalar_one()
        assert rows == 0
