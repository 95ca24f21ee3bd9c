"""Final states stay final on the result backends the platform configures
(`resilience.results`): a late RETRY or STARTED never replaces SUCCESS, FAILURE or REVOKED."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery, states
from sqlalchemy import make_url

from resilience.results import DatabaseBackend, RedisBackend, keep_final_states
from tests.support import wait_for


@pytest.mark.usefixtures("tier_workers")
class TestLateRetry:
    def test_a_retry_stored_after_the_final_failure_leaves_the_failure(
        self, app: Any, stores: Any
    ) -> None:
        """Attempt 1 publishes attempt 2, then stalls before Celery stores its RETRY;
        attempt 2 fails for good meanwhile. The result stays FAILURE and `.get()` raises
        (before: RETRY for 24 h, `.get()` blocked)."""
        from tests.resilience.pipeline.tasks_api import RETRIED_MARK, late_retry

        result = late_retry.delay(uuid.uuid4().hex[:12])
        client = stores.redis()
        wait_for(lambda: client.exists(RETRIED_MARK.format(result.id)), timeout_seconds=30,
                 message="the first attempt never finished its retry")
        assert stored(app.backend, result.id) == states.FAILURE
        with pytest.raises(ValueError, match="final attempt"):
            result.get(timeout=10)

    def test_the_platform_app_uses_the_final_state_backend(self, app: Any) -> None:
        assert isinstance(app.backend, RedisBackend)


def stored(backend: Any, task_id: str) -> str:
    return backend.get_task_meta(task_id, cache=False)["status"]


@pytest.fixture(params=["json", "pickle"])
def redis_backend(request: Any, services: Any) -> Iterator[Any]:
    """A Celery app on the session's Redis with the final-state backend; JSON results take
    the Lua script, pickle the WATCH transaction."""
    serializer = request.param
    celery = Celery("results", backend=f"{services.redis_base}/2", set_as_current=False)
    celery.conf.result_serializer = serializer
    celery.conf.result_accept_content = [serializer]
    keep_final_states(celery)
    keep_final_states(celery)  # twice is harmless
    backend = celery.backend
    assert isinstance(backend, RedisBackend)
    yield backend
    backend.client.close()


class TestRedisBackend:
    @pytest.mark.parametrize("final", [states.FAILURE, states.SUCCESS, states.REVOKED])
    @pytest.mark.parametrize("late", [states.RETRY, states.STARTED, "PROGRESS"])
    def test_a_late_unready_state_never_replaces_a_final_one(
        self, redis_backend: Any, final: str, late: str
    ) -> None:
        task_id = uuid.uuid4().hex
        redis_backend.store_result(task_id, None, states.STARTED)
        redis_backend.store_result(task_id, 1 if final == states.SUCCESS
                                   else ValueError("x"), final)
        redis_backend.store_result(task_id, ValueError("late") if late == states.RETRY
                                   else {"pid": 1}, late)
        assert stored(redis_backend, task_id) == final

    def test_unready_states_replace_each_other_and_a_final_one_replaces_them(
        self, redis_backend: Any
    ) -> None:
        task_id = uuid.uuid4().hex
        redis_backend.store_result(task_id, None, states.STARTED)
        redis_backend.store_result(task_id, ValueError("once"), states.RETRY)
        assert stored(redis_backend, task_id) == states.RETRY
        redis_backend.store_result(task_id, None, states.STARTED)
        assert stored(redis_backend, task_id) == states.STARTED
        redis_backend.store_result(task_id, ValueError("x"), states.FAILURE)
        assert stored(redis_backend, task_id) == states.FAILURE
        # A final write after another final one: Celery's rule, only SUCCESS is kept.
        redis_backend.store_result(task_id, 2, states.SUCCESS)
        assert stored(redis_backend, task_id) == states.SUCCESS
        redis_backend.store_result(task_id, ValueError("y"), states.FAILURE)
        assert stored(redis_backend, task_id) == states.SUCCESS

    def test_the_result_keeps_its_expiry(self, redis_backend: Any) -> None:
        task_id = uuid.uuid4().hex
        redis_backend.store_result(task_id, None, states.STARTED)
        ttl = redis_backend.client.ttl(redis_backend.get_key_for_task(task_id))
        assert 0 < ttl <= redis_backend.expires


class TestDatabaseBackend:
    def test_a_late_retry_never_replaces_a_failure(self, services: Any) -> None:
        url = make_url(services.database_url).set(drivername="postgresql+psycopg2")
        celery = Celery("results-db", set_as_current=False,
                        backend="db+" + url.render_as_string(hide_password=False))
        keep_final_states(celery)
        backend = celery.backend
        assert isinstance(backend, DatabaseBackend)
        task_id = uuid.uuid4().hex
        backend.store_result(task_id, None, states.STARTED)
        backend.store_result(task_id, ValueError("x"), states.FAILURE)
        backend.store_result(task_id, ValueError("late"), states.RETRY)
        backend.store_result(task_id, None, states.STARTED)
        assert stored(backend, task_id) == states.FAILURE
        backend.store_result(task_id, 3, states.SUCCESS)
        backend.store_result(task_id, ValueError("late"), states.RETRY)
        assert stored(backend, task_id) == states.SUCCESS


class TestSentinelBackend:
    def test_a_late_retry_never_replaces_a_failure(self) -> None:
        """`sentinel://` results (Celery's SentinelBackend) take the same script, on the
        master the Sentinels name."""
        from resilience.results import SentinelBackend
        from tests.redis_topologies import SERVICE, SentinelProcesses

        setup = SentinelProcesses().start()
        try:
            url = ";".join(f"sentinel://127.0.0.1:{sentinel.port}/0"
                           for sentinel in setup.sentinels)
            celery = Celery("results-sentinel", backend=url, set_as_current=False)
            celery.conf.result_backend_transport_options = {"master_name": SERVICE}
            keep_final_states(celery)
            backend = celery.backend
            assert isinstance(backend, SentinelBackend)
            task_id = uuid.uuid4().hex
            backend.store_result(task_id, ValueError("x"), states.FAILURE)
            backend.store_result(task_id, ValueError("late"), states.RETRY)
            assert stored(backend, task_id) == states.FAILURE
        finally:
            setup.stop()
