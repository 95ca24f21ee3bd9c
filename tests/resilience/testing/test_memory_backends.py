"""In-memory backends of `@singleton`, `@exclusive`, the outbox and batches
(`resilience.testing.memory_mode`): a user's app whose Redis and PostgreSQL URLs point at
ports where nothing listens, eager, and a worker in a thread where concurrency matters.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery
from celery.contrib.testing.worker import start_worker
from sqlalchemy import create_engine
from sqlalchemy.orm import Session

from resilience.batches import batch
from resilience.errors import JobDeferred, StaleFencingToken
from resilience.locks import exclusive, singleton
from resilience.locks.fencing import FencingTokens
from resilience.outbox.backends.memory import MemoryOutboxBackend
from resilience.outbox.relay import outbox_backend
from resilience.task import GuardedTask
from resilience.testing import memory_mode
from resilience.workflows import StepState, workflow_guards
from resilience.workflows.eager import EagerWorkflowBackend, eager_backend
from tests.resilience.testing.test_memory_mode import dead_app


@pytest.fixture()
def app() -> Celery:
    return dead_app()


class TestSingletonInMemory:
    def test_a_second_run_is_skipped_while_the_first_holds_and_runs_after(
            self, app: Celery) -> None:
        """A body that enqueues itself (eagerly, so while it holds the key): the inner run
        is SKIPPED and its body never runs; once the body ended the key is free again."""
        runs: list[str] = []
        inner: list[Any] = []

        @app.task(shared=False)
        @singleton(key="{name}")
        def nightly(name: str, again: bool = False) -> str:
            runs.append(name)
            if again:
                inner.append(nightly.delay(name))
            return name

        with memory_mode() as mode:
            assert nightly.delay("report", again=True).get() == "report"
            assert runs == ["report"]
            (refused,) = inner
            assert refused.get()["outcome"] == "SKIPPED"
            assert mode.outcomes(app)["SKIPPED"] == 1
            assert nightly.delay("report").get() == "report"  # released at the end
            assert runs == ["report", "report"]

    def test_two_threads_one_runs_the_other_is_deferred(self, app: Celery) -> None:
        """policy="defer": while one thread's run holds the key, another's is DEFERRED."""
        entered, leave = threading.Event(), threading.Event()

        @app.task(shared=False)
        @singleton(key="{name}", policy="defer")
        def rebuild(name: str) -> str:
            entered.set()
            assert leave.wait(5)
            return name

        with memory_mode():
            holder = threading.Thread(target=lambda: rebuild.delay("a").get())
            holder.start()
            try:
                assert entered.wait(5)
                with pytest.raises(JobDeferred, match="held by another run"):
                    # Celery's join guard is process-wide while the other thread's task runs.
                    rebuild.delay("a").get(disable_sync_subtasks=False)
            finally:
                leave.set()
                holder.join(5)
            assert rebuild.delay("a").get() == "a"


class TestExclusiveInMemory:
    def test_tokens_increase_and_a_stale_write_is_refused(self, app: Celery) -> None:
        """Each acquisition gets a larger fencing token (singletons and exclusive locks
        share the counter); `FencingTokens.guard_write` in the body checks the in-memory
        marks: an older token than the newest written is refused."""
        tokens: list[int] = []

        @app.task(shared=False)
        @exclusive(key="{report}", ttl_seconds=5)
        def publish(report: str, write_with: int | None = None,
                    fencing_token: int | None = None) -> int:
            assert fencing_token is not None
            tokens.append(fencing_token)
            FencingTokens.guard_write(None, f"report:{report}",
                                      fencing_token if write_with is None else write_with)
            return fencing_token

        with memory_mode():
            first = publish.delay("r").get()
            second = publish.delay("r").get()
            third = publish.delay("other").get()
            assert first < second < third
            with pytest.raises(StaleFencingToken, match="older than"):
                publish.delay("r", write_with=first).get()
        with memory_mode():
            assert publish.delay("r").get() == 1  # reset: a fresh counter and marks

    def test_a_held_lease_refuses_and_an_expired_one_is_taken_over(self, app: Celery) -> None:
        """While a run holds the lease another is SKIPPED; a holder paused past its TTL
        (no heartbeat) loses it to the next run, which gets a larger token, and its own
        `checkpoint()` then fails."""
        entered, leave = threading.Event(), threading.Event()
        seen: dict[str, Any] = {}

        @app.task(shared=False)
        @exclusive(key="k", ttl_seconds=0.3, heartbeat=False)
        def work(wait: bool = False, fencing_token: int | None = None,
                 checkpoint: Any = None) -> int:
            if wait:
                entered.set()
                assert leave.wait(5)
                try:
                    checkpoint()
                except Exception as exc:  # noqa: BLE001 - the test reads it
                    seen["checkpoint"] = exc
            return fencing_token or 0

        with memory_mode():
            holder = threading.Thread(target=lambda: seen.update(held=work.delay(True).get(
                propagate=False, disable_sync_subtasks=False)))
            holder.start()
            try:
                assert entered.wait(5)
                refused = work.delay().get(disable_sync_subtasks=False)
                assert refused["outcome"] == "SKIPPED"
                time.sleep(0.4)  # past the holder's lease
                taken_over = work.delay().get(disable_sync_subtasks=False)
            finally:
                leave.set()
                holder.join(5)
            assert isinstance(taken_over, int) and taken_over > 1
            assert "expired" in str(seen["checkpoint"]) or "no longer held" in str(
                seen["checkpoint"])


    def test_a_heartbeat_keeps_the_lease_past_its_ttl(self, app: Celery) -> None:
        """The heartbeat extends the in-memory lease: a body running twice its TTL still
        passes `checkpoint()` (without a heartbeat it fails: the takeover test above)."""

        @app.task(shared=False)
        @exclusive(key="long", ttl_seconds=0.3, renew_fraction=0.3)
        def long_job(checkpoint: Any = None) -> str:
            time.sleep(0.7)
            checkpoint()
            return "done"

        with memory_mode():
            assert long_job.delay().get() == "done"


@pytest.fixture()
def database() -> Iterator[Any]:
    """The caller's own database (SQLite in memory): the outbox rows are not in it."""
    engine = create_engine("sqlite://")
    yield engine
    engine.dispose()


class TestOutboxInMemory:
    def test_published_when_the_session_commits_and_never_on_rollback(
            self, app: Celery, database: Any) -> None:
        runs: list[int] = []

        ids: list[str] = []

        @app.task(base=GuardedTask, bind=True, shared=False)
        def ship(self: Any, order_id: int) -> int:
            runs.append(order_id)
            ids.append(self.request.id)
            return order_id

        with memory_mode():
            with Session(database) as session:
                result = ship.apply_async_in(session, (1,))
                assert runs == []  # not before the commit
                session.commit()
            assert runs == [1]
            assert ids == [result.id]  # the id the job ran with
            with Session(database) as session:
                ship.apply_async_in(session, (2,))
                session.rollback()
                session.commit()  # a later commit of the session publishes nothing
            with database.begin() as connection:  # a Connection: on its commit
                ship.enqueue_in(connection, 3)
                assert runs == [1]
            assert runs == [1, 3]
            outbox = outbox_backend(app)
            assert isinstance(outbox, MemoryOutboxBackend)
            assert [row["state"] for row in outbox.rows] == ["published", "published"]
        with memory_mode():
            assert outbox_backend(app).rows == []  # reset

    def test_a_thread_worker_runs_the_committed_job(self, database: Any) -> None:
        """Not eager: the commit publishes to the broker and a worker in a thread runs it."""
        app = Celery("outbox-worker", broker="memory://", backend="cache+memory://")
        app.conf.resilience_stores = "memory"
        import resilience

        resilience.init_app(app)
        done = threading.Event()

        @app.task(base=GuardedTask, shared=False, name="tests.memory_backends.worker_ship")
        def ship(order_id: int) -> int:
            done.set()
            return order_id

        with start_worker(app, pool="solo", perform_ping_check=False, loglevel="WARNING"):
            with Session(database) as session:
                result = ship.apply_async_in(session, (7,))
                session.commit()
            assert result.get(timeout=10) == 7
            assert done.is_set()


class TestBatchesInMemory:
    def test_the_callbacks_fire_exactly_once_when_every_member_is_final(
            self, app: Celery) -> None:
        calls: list[dict[str, Any]] = []

        @app.task(base=GuardedTask, guards=workflow_guards(), shared=False)
        def member(n: int) -> int:
            if n < 0:
                raise ValueError(n)
            return n

        @app.task(shared=False)
        def done(summary: dict[str, Any]) -> None:
            calls.append(summary)

        with memory_mode():
            result = batch([member.s(1), member.s(2)], on_success=done.s(),
                           on_complete=done.s(), app=app).apply_async()
            assert sorted(c["callback"] for c in calls) == ["complete", "success"]
            assert all(c["batch_id"] == result.id and c["total"] == 2 for c in calls)
            summary = result.summary()
            assert summary.complete and summary.succeeded
            assert summary.tallies["succeeded"] == 2
            # A redelivered member's outcome is recorded once: nothing fires again.
            backend = eager_backend(app)
            assert isinstance(backend, EagerWorkflowBackend)
            again = backend.record(None, task_id=result.results[0].id,
                                   state=StepState.FAILED)
            assert not again.recorded
            assert len(calls) == 2

            calls.clear()
            failing = batch([member.s(3), member.s(-1)], on_success=done.s(),
                            on_complete=done.s(), app=app).apply_async()
            assert [c["callback"] for c in calls] == ["complete"]
            assert calls[0]["succeeded"] is False
            assert failing.summary().tallies["failed"] == 1

    def test_a_rolled_back_batch_leaves_nothing(self, app: Celery, database: Any) -> None:
        runs: list[int] = []

        @app.task(base=GuardedTask, guards=workflow_guards(), shared=False)
        def member(n: int) -> int:
            runs.append(n)
            return n

        with memory_mode():
            with Session(database) as session:
                created = batch([member.s(1)], app=app).apply_async_in(session)
                session.rollback()
            assert runs == []
            assert eager_backend(app).recent(limit=5) == []
            with pytest.raises(Exception, match="no batch"):
                created.summary()
