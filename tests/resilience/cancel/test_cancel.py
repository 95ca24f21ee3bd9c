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
    from resilience.cancel.view import cancellations as build

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


class TestLostCopy:
    """A guard Redis without the version key has lost its copy; PostgreSQL restores it."""

    def test_a_cancel_after_a_flush_restores_the_whole_copy(
        self, redis_client: Any, cancellations: Any
    ) -> None:
        """Cancel A, FLUSHDB, cancel B: the copy holds A and B (not B alone, which workers
        would take for the complete set), with a version."""
        first, second = (f"t-{uuid.uuid4().hex[:8]}" for _ in range(2))
        cancellations.cancel_job(first, reason="first")
        redis_client.flushdb()
        cancellations.cancel_job(second, reason="second")
        version, marks = cancellations.backend.load()
        assert version
        assert {marks[id_target(first)][0], marks[id_target(second)][0]} == {"first", "second"}

    def test_restore_makes_the_copy_the_record(self, redis_client: Any,
                                               cancellations: Any) -> None:
        """A mark without a live row (withdrawn while the copy was rebuilt elsewhere) is
        removed by restore(); an empty record still leaves a version, so an empty store is
        never mistaken for a lost one; restore_if_lost() does nothing while it is kept."""
        kept = f"t-{uuid.uuid4().hex[:8]}"
        cancellations.cancel_job(kept, reason="kept")
        cancellations.backend.cancel("id:orphan", reason="no row", expires_at=time.time() + 60)
        cancellations.restore()
        assert set(cancellations.backend.load()[1]) >= {id_target(kept)}
        assert "id:orphan" not in cancellations.backend.load()[1]
        cancellations.uncancel(id_target(kept))
        redis_client.flushdb()
        assert cancellations.restore_if_lost() is True
        version, marks = cancellations.backend.load()
        assert version and id_target(kept) not in marks
        assert cancellations.restore_if_lost() is False
        assert cancellations.backend.version() == version

    def test_the_guard_keeps_its_copy_while_postgres_is_down_too(
        self, redis_client: Any, cancellations: Any
    ) -> None:
        """The guard Redis is flushed while PostgreSQL is unreachable: a worker process with
        a copy still stops the cancelled job; one without a copy follows on_store_down
        (fail_closed here: DEFERRED); once the record answers, the guard restores the copy
        and stops the job."""
        from types import SimpleNamespace

        from sqlalchemy import create_engine

        from jobs.embedded import free_port
        from resilience.cancel import CancelConfig, CancelGuard, Cancellations
        from resilience.outcomes import Outcome, Stop
        from resilience.pipeline import Call
        from tests.resilience.cancel.tasks import cancel_order

        task_id = str(uuid.uuid4())
        cancellations.cancel_job(task_id, reason="kept")
        unreachable = Cancellations(create_engine(
            f"postgresql+psycopg2://postgres@127.0.0.1:{free_port()}/none",
            connect_args={"connect_timeout": 1}), cancellations.backend)

        def guard(record: Any) -> CancelGuard:
            return CancelGuard(CancelConfig(refresh_seconds=0, on_store_down="fail_closed"),
                               cancellations.backend, record=record)

        def decide(cancel: CancelGuard) -> Outcome | None:
            request = SimpleNamespace(id=task_id, called_directly=False, is_eager=False,
                                      retries=0)
            try:
                cancel.before_run(Call(task=cancel_order, args=("run", "o", 1), kwargs={},
                                       request=request))
            except Stop as stop:
                return stop.outcome
            return None

        with_copy = guard(unreachable)
        assert decide(with_copy) is Outcome.CANCELLED
        redis_client.flushdb()
        assert decide(with_copy) is Outcome.CANCELLED
        assert cancellations.backend.version() == ""
        assert decide(guard(unreachable)) is Outcome.DEFERRED
        assert decide(guard(cancellations)) is Outcome.CANCELLED
        assert id_target(task_id) in cancellations.backend.load()[1]

    def test_a_restore_in_progress_never_brings_back_a_withdrawn_mark(
        self, engine: Any, redis_client: Any, cancellations: Any
    ) -> None:
        """A restore has read the rows and is about to write the copy when an operator
        withdraws one of them: the copy ends without the withdrawn mark, as the record does
        (the withdrawal waits for the restore's lock instead of slipping in between)."""
        import threading

        from resilience.cancel import Cancellations

        target = cancellations.cancel_job(f"t-{uuid.uuid4().hex[:8]}", reason="withdraw me")
        read, go = threading.Event(), threading.Event()

        class Paused(RedisCancelBackend):
            """The copy, pausing the restore after it read the record's rows."""

            def load(self) -> Any:
                read.set()
                go.wait(10)
                return super().load()

        restoring = Cancellations(engine, Paused(redis_client))
        restore = threading.Thread(target=restoring.restore, daemon=True)
        restore.start()
        assert read.wait(10)
        withdrawn = threading.Event()
        withdraw = threading.Thread(
            target=lambda: (cancellations.uncancel(target), withdrawn.set()), daemon=True)
        withdraw.start()
        withdrawn.wait(1.0)
        go.set()
        restore.join(10)
        withdraw.join(10)
        assert withdrawn.is_set()
        assert target not in {c.target for c in cancellations.describe()}
        assert target not in cancellations.backend.load()[1]


class TestStoredResult:
    def test_only_an_unstarted_job_gets_its_cancelled_result_stored(self, app: Any) -> None:
        """`store_cancelled` (what `jobs cancel ID` runs before Celery's revoke) stores the
        cancel guard's outcome for a job with no state yet; a started or finished job keeps
        its state, and Celery's revoke marking afterwards cannot make the first one REVOKED."""
        from celery.result import AsyncResult

        from resilience.cancel import store_cancelled

        pending, started, done = (str(uuid.uuid4()) for _ in range(3))
        app.backend.store_result(started, {"pid": 1}, "STARTED")
        app.backend.mark_as_done(done, 7)
        assert store_cancelled(app, pending, reason="customer asked") is True
        assert [store_cancelled(app, each, reason="late") for each in (started, done)] == [
            False, False]
        result = AsyncResult(pending, app=app)
        assert result.get(timeout=5) == {
            "outcome": "CANCELLED", "guard": "cancel", "reason": "cancelled: customer asked",
            "details": {"target": id_target(pending)}}
        app.backend.mark_as_revoked(pending, reason="revoked")  # a worker's late revoke
        assert AsyncResult(pending, app=app).state == "SUCCESS"
        assert AsyncResult(started, app=app).state == "STARTED"
        assert AsyncResult(done, app=app).get(timeout=5) == 7


@pytest.mark.usefixtures("tier_workers")
class TestLostCopyOnWorkers:
    def test_a_cancelled_job_stays_cancelled_after_a_flush(
        self, redis_client: Any, cancellations: Any
    ) -> None:
        """Cancelled through the platform's API (no Celery revoke), the guard Redis is
        FLUSHDB'd, the job is delivered: CANCELLED, its body never ran, and the copy is
        back in Redis at once (not at the next beat tick)."""
        from tests.resilience.cancel.tasks import cancel_order

        run_id, task_id = uuid.uuid4().hex[:8], str(uuid.uuid4())
        cancellations.cancel_job(task_id, reason="before the flush")
        assert cancel_order.delay(run_id, "warm", 1).get(timeout=30) == 1  # a copy is held
        redis_client.flushdb()
        time.sleep(REFRESH)  # every copy is old enough to be checked against the store
        result = cancel_order.apply_async((run_id, "c", 1), task_id=task_id)
        outcome = result.get(timeout=30)
        assert outcome["outcome"] == "CANCELLED"
        assert outcome["reason"] == "cancelled: before the flush"
        assert redis_client.get(f"tests:cancel:{run_id}:c") is None
        assert id_target(task_id) in cancellations.backend.load()[1]


@pytest.mark.chaos
@pytest.mark.timeout(180)
def test_a_cancelled_job_stays_cancelled_after_the_guard_redis_restarts_empty(
    app: Any, services: Any, engine: Any, tier_workers: Any, worker_factory: Any,
    tmp_path: Any,
) -> None:
    """A critical worker whose guard Redis is its own server; the job is cancelled through
    the platform's API, a job runs so the worker holds a copy, the guard Redis is stopped
    and started again empty (no persistence), then the job is delivered: CANCELLED, its
    body never ran."""
    import redis

    from jobs.embedded import embedded_redis, free_port
    from resilience.cancel import Cancellations
    from tests.resilience.cancel.tasks import cancel_order

    port = free_port()
    guard = embedded_redis(port, tmp_path / "guard-redis").start()
    client = redis.Redis.from_url(guard.url, decode_responses=True)
    cancellations = Cancellations(engine, RedisCancelBackend(client))
    critical = tier_workers["critical"]
    critical.stop()  # only this test's worker, on its own guard Redis, takes critical jobs
    try:
        worker = worker_factory("critical", name="cancel-restart", concurrency=1, env={
            "REDIS_URL": guard.url, "RESULT_BACKEND_URL": services.redis_url})
        run_id, task_id = uuid.uuid4().hex[:8], str(uuid.uuid4())
        cancellations.cancel_job(task_id, reason="before the restart")
        assert cancel_order.delay(run_id, "warm", 1).get(timeout=30) == 1
        assert client.get(f"tests:cancel:{run_id}:warm") == "1"
        guard.stop()
        guard = embedded_redis(port, tmp_path / "guard-redis").start()
        assert client.dbsize() == 0
        time.sleep(REFRESH)
        result = cancel_order.apply_async((run_id, "r", 1), task_id=task_id)
        outcome = result.get(timeout=60)
        assert outcome["outcome"] == "CANCELLED"
        assert client.get(f"tests:cancel:{run_id}:r") is None
        assert id_target(task_id) in cancellations.backend.load()[1]
    finally:
        guard.stop()
        if "worker" in locals():
            worker.stop()
        critical.start()


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


def _waiting_in_queue(app: Any, queue: str, run_id: str) -> set[str]:
    """Task ids of this run's messages sitting in the tier queue's broker list."""
    import json

    with app.connection_for_write() as connection:
        raw = connection.default_channel.client.lrange(queue, 0, -1)
    ids = set()
    for item in raw:
        headers = json.loads(item).get("headers", {})
        if run_id in str(headers.get("argsrepr", "")):
            ids.add(headers["id"])
    return ids


def _revoked_on(app: Any, nodes: list[str], task_id: str) -> bool:
    """Every worker of `nodes` lists `task_id` among its revoked tasks."""
    replies = app.control.inspect(destination=nodes, timeout=1).revoked() or {}
    return all(task_id in replies.get(node, []) for node in nodes)


@pytest.mark.chaos
@pytest.mark.timeout(180)
def test_cancelled_while_every_worker_is_stopped_never_runs_after_restart(
    app: Any, redis_client: Any, tier_workers: Any
) -> None:
    """Every worker consuming the critical queue is terminated (warm shutdown, SIGTERM);
    four jobs are sent and wait in the broker's list. The operator runs `jobs cancel ID` on
    one (its Celery `revoke` reaches only the other tiers' workers, which mark a job whose
    result is not final REVOKED: its result is CANCELLED at once, before the revoke, and stays
    so) and `jobs cancel --task --key` on the key of two others. New worker processes are
    started: the three cancelled jobs end CANCELLED (never Celery's REVOKED: the mark stopped
    them) and their bodies never ran (counters absent); the job queued alongside runs exactly
    once."""
    from jobs.admin.cancel import cancel_command as jobs_cancel
    from tests.resilience.cancel.tasks import cancel_order

    critical = tier_workers["critical"]
    old_pid = critical.pid
    run_id = uuid.uuid4().hex[:8]
    order = f"order-{run_id}"
    critical.stop()
    try:
        assert not critical.alive()
        by_id = cancel_order.delay(run_id, "by-id", 1)
        by_key = [cancel_order.delay(run_id, order, n) for n in (2, 3)]
        kept = cancel_order.delay(run_id, "kept", 4)
        sent = {by_id.id, kept.id, *(r.id for r in by_key)}
        assert _waiting_in_queue(app, "critical", run_id) == sent  # nobody consumes them
        jobs_cancel(by_id.id, reason="customer asked")
        jobs_cancel(None, task=cancel_order.name, key=order, reason="order withdrawn")
        assert _waiting_in_queue(app, "critical", run_id) == sent
        # The revoke reached the other tiers' workers, which mark a job whose result is
        # not final REVOKED: the job's result was CANCELLED before, and stays so.
        others = [w.nodename for tier, w in tier_workers.items() if tier != "critical"]
        wait_for(lambda: _revoked_on(app, others, by_id.id), timeout_seconds=20,
                 message="the revoke applied by the running workers")
        assert by_id.state == "SUCCESS"
        assert by_id.get(timeout=5)["outcome"] == "CANCELLED"
    finally:
        critical.start()  # new processes: no revoke list, no copy of the marks
    assert critical.pid != old_pid
    assert kept.get(timeout=60) == 4
    stopped = [by_id.get(timeout=60), *(r.get(timeout=60) for r in by_key)]
    assert [s["outcome"] for s in stopped] == ["CANCELLED"] * 3
    assert [s["reason"] for s in stopped] == [
        "cancelled: customer asked", "cancelled: order withdrawn", "cancelled: order withdrawn"]
    assert redis_client.get(f"tests:cancel:{run_id}:by-id") is None
    assert redis_client.get(f"tests:cancel:{run_id}:{order}") is None
    assert redis_client.get(f"tests:cancel:{run_id}:kept") == "1"
    assert _waiting_in_queue(app, "critical", run_id) == set()
