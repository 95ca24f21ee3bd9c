"""Celery's own retry, autoretry, countdown/ETA and revoke inside a guard stack, on real
workers: the guards never double an effect or drop a job Celery's features move around."""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest

from tests.resilience.pipeline.tasks import effects
from tests.support import wait_for


@pytest.mark.usefixtures("tier_workers")
class TestCeleryFeatures:
    def test_self_retry_under_idempotency_and_a_lock_commits_once(self, engine: Any) -> None:
        """The body writes, then calls self.retry(): that attempt's writes roll back, the
        lock and claim are given back, and the retry (same task id) commits once."""
        from tests.resilience.pipeline.tasks import self_retry

        run_id = uuid.uuid4().hex[:12]
        result = self_retry.delay(run_id, "r")
        assert result.get(timeout=30) == "r"
        assert effects(engine, run_id) == ["r"]

    def test_autoretry_for_under_transactional_idempotency_commits_once(
        self, engine: Any
    ) -> None:
        from tests.resilience.pipeline.tasks import auto_retry

        run_id = uuid.uuid4().hex[:12]
        assert auto_retry.delay(run_id, "a").get(timeout=30) == "a"
        assert effects(engine, run_id) == ["a"]

    def test_a_countdown_past_the_deadline_is_not_shed(self, engine: Any) -> None:
        """The deadline counts from when the job is due: a 2 s deadline with a 3 s
        countdown runs (before: SHED, the deadline counted from the enqueue)."""
        from tests.resilience.pipeline.tasks import due_later

        run_id = uuid.uuid4().hex[:12]
        result = due_later.apply_async((run_id, "late"), countdown=3)
        assert result.get(timeout=30) == "late"
        assert effects(engine, run_id) == ["late"]

    def test_a_revoked_job_that_keeps_deferring_never_runs(
        self, app: Any, stores: Any, engine: Any
    ) -> None:
        """A deferral republishes under the same task id, so Celery's revoke still
        reaches it: after the lock frees, the revoked job does not run."""
        from resilience.locks.backends.postgres import AdvisorySession
        from tests.resilience.pipeline.tasks import held

        run_id = uuid.uuid4().hex[:12]
        key = f"revoke-{run_id}"
        with AdvisorySession(stores.database_url, label="holder") as holder:
            assert holder.try_acquire(f"{held.name}:{key}")
            result = held.delay(run_id, key)
            wait_for(lambda: result.state == "RETRY", timeout_seconds=20,
                     message="the job deferred")
            app.control.revoke(result.id)
            time.sleep(1.0)
        time.sleep(2.0)  # the lock is free: a job still alive would run now
        assert effects(engine, run_id) == []
        assert result.state in ("REVOKED", "RETRY")

    def test_a_revoked_unique_job_gives_its_key_back(self, app: Any, stores: Any,
                                                     engine: Any) -> None:
        """`until_finished` unique key of a job revoked while it deferred: once a worker
        drops the revoked message the key is free, so the next `.delay()` is a new job
        (before: the key named the dead job for its whole TTL)."""
        from resilience.idempotency.unique import NAMESPACE, UniqueKeys
        from resilience.keys import redis_key
        from resilience.locks.backends.postgres import AdvisorySession
        from tests.resilience.pipeline.tasks import held_unique

        run_id = uuid.uuid4().hex[:12]
        key = f"ru-{run_id}"
        with AdvisorySession(stores.database_url, label="holder") as holder:
            assert holder.try_acquire(f"{held_unique.name}:{key}")
            first = held_unique.delay(run_id, key)
            wait_for(lambda: first.state == "RETRY", timeout_seconds=20,
                     message="the job deferred")
            assert held_unique.delay(run_id, key).id == first.id  # deduplicated
            unique_key = redis_key(NAMESPACE, f"{held_unique.name}:{key}")
            keys = UniqueKeys.store(app).client
            assert keys.get(unique_key) == first.id
            app.control.revoke(first.id)
            wait_for(lambda: first.state == "REVOKED", timeout_seconds=20,
                     message="a worker dropped the revoked job")
            wait_for(lambda: keys.get(unique_key) is None, timeout_seconds=10,
                     message="the revoked job's unique key released")
        second = held_unique.delay(run_id, key)
        assert second.id != first.id
        assert second.get(timeout=30) == key
        assert effects(engine, run_id) == [key]
