"""Regression tests of the stacking bugs a review found (issue 11, scenarios 1-3)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from celery import signals
from sqlalchemy import event, text

from tests.resilience.pipeline.tasks import effects


@pytest.fixture()
def run_id() -> str:
    return uuid.uuid4().hex[:12]


@pytest.fixture()
def publishes() -> Iterator[list[str]]:
    """Task names this process published while the test ran (a publish the broker took:
    `before_task_publish` also fires for one the transport refuses as full)."""
    sent: list[str] = []

    def record(sender: Any = None, **_: Any) -> None:
        sent.append(str(sender))

    signals.after_task_publish.connect(record, weak=False)
    yield sent
    signals.after_task_publish.disconnect(record)




@pytest.fixture()
def full_queue(app: Any) -> Iterator[str]:
    """The standard tier held full by a live admission reservation (limit 1)."""
    from resilience.admission import depth_backend_for

    backend = depth_backend_for(app)
    reservation = f"test-{uuid.uuid4().hex[:8]}"
    backend.try_admit("standard", limit=10**9, reservation=reservation,
                      reservation_ttl_seconds=60)
    yield "standard"
    backend.release("standard", reservation)


class TestInlineNeverRepublishes:
    def test_caller_runs_with_a_deferring_guard_publishes_nothing(
        self, engine: Any, run_id: str, publishes: list[str], full_queue: str
    ) -> None:
        """Scenario 1: the tier is full, the job runs in the caller, and a rate limit
        defers it: the caller gets `JobDeferred` with retry_after, no message is published
        (before the fix: ~480 publishes, then RecursionError)."""
        from resilience.errors import JobDeferred
        from tests.resilience.pipeline.tasks import storm

        key = f"k-{run_id}"
        first = storm.delay(run_id, key)  # runs inline and takes the hour's one permit
        assert first.get() == key
        with pytest.raises(JobDeferred) as deferred:
            storm.delay(run_id, key)
        assert deferred.value.retry_after_seconds > 60
        assert "ran in the caller" in str(deferred.value)
        assert publishes == []
        assert effects(engine, run_id) == [key]

    def test_apply_with_a_deferring_guard_raises_and_publishes_nothing(
        self, engine: Any, run_id: str, publishes: list[str]
    ) -> None:
        from resilience.errors import JobDeferred
        from tests.resilience.pipeline.tasks import storm

        key = f"a-{run_id}"
        assert storm.apply(args=(run_id, key)).get() == key
        result = storm.apply(args=(run_id, key))
        assert isinstance(result.result, JobDeferred)
        assert publishes == []
        assert effects(engine, run_id) == [key]


@pytest.fixture()
def standard_unconsumed(app: Any, tier_workers: Any) -> Iterator[None]:
    """The shared standard worker stops consuming while the test runs: a job published to
    the tier stays queued, so `@unique` (which gives its key back when the job starts) must
    answer a duplicate with that job's id, whatever the timing."""
    node = [tier_workers["standard"].nodename]
    assert app.control.cancel_consumer("standard", destination=node, reply=True, timeout=10)
    yield
    assert app.control.add_consumer("standard", destination=node, reply=True, timeout=10)


@pytest.mark.usefixtures("purge_queues", "standard_unconsumed")
class TestEnqueueUnwind:
    def test_refused_publish_gives_the_unique_key_back(
        self, app: Any, run_id: str, publishes: list[str]
    ) -> None:
        """Scenario 2: admission refuses (TierFull); the unique key is given back, so the
        caller retrying as told gets a real job, not the phantom id of an unsent one."""
        from resilience.admission import depth_backend_for
        from resilience.errors import TierFull
        from tests.resilience.pipeline.tasks import unique_abort

        backend = depth_backend_for(app)
        hold = f"hold-{run_id}"
        backend.try_admit("standard", limit=10**9, reservation=hold,
                          reservation_ttl_seconds=60)
        try:
            with pytest.raises(TierFull):
                unique_abort.delay(run_id, f"u-{run_id}")
        finally:
            backend.release("standard", hold)
        assert publishes == []
        again = unique_abort.delay(run_id, f"u-{run_id}")
        assert publishes == ["tests.pipeline.unique_abort"]
        assert unique_abort.delay(run_id, f"u-{run_id}").id == again.id

    def test_failed_publish_gives_back_the_key_and_the_reservation(
        self, app: Any, run_id: str
    ) -> None:
        """The broker refuses the publish: nothing of the unique key or the admission
        reservation is left behind (before: key for the TTL, reservation for 30 s)."""
        from resilience.admission import depth_backend_for
        from tests.resilience.pipeline.tasks import unique_abort

        backend = depth_backend_for(app)
        before = backend.reserved("standard")
        with pytest.raises(Exception) as failed:  # whatever the broker says
            unique_abort.apply_async((run_id, f"f-{run_id}"), queue="no-such-queue")
        assert "no-such-queue" in str(failed.value)
        assert backend.reserved("no-such-queue") == 0
        assert backend.reserved("standard") == before
        published = unique_abort.delay(run_id, f"f-{run_id}")
        assert unique_abort.delay(run_id, f"f-{run_id}").id == published.id


class TestCommitInsideTheLock:
    @pytest.mark.parametrize("task_name", ["paid_singleton", "paid_exclusive"])
    def test_transactional_commit_happens_while_the_lock_is_held(
        self, engine: Any, stores: Any, run_id: str, task_name: str,
        monkeypatch: pytest.MonkeyPatch, tmp_path: Any,
    ) -> None:
        """Scenario 3: at the moment the body's transaction commits, the lock's holder is
        still registered (before: released first, so a second run could read stale state)."""
        from tests.resilience.pipeline import tasks

        task = getattr(tasks, task_name)
        nodes = None
        if task_name == "paid_exclusive":
            from tests.resilience.locks.conftest import Nodes

            nodes = Nodes(3, tmp_path / "redlock")
            # Run inline: this process's stores name the nodes (app.conf, not the env).
            monkeypatch.setattr(stores, "redlock_urls", tuple(nodes.urls))

        key = f"c-{run_id}"
        lock_key = f"{task.name}:{key}"
        seen: list[int] = []

        def on_execute(connection: Any, cursor: Any, statement: str, *_: Any) -> None:
            if "INSERT INTO pipeline_test_effects" in statement:
                connection.info["effect"] = True

        def on_commit(connection: Any) -> None:
            # Only the commit of the body's transaction (the one that wrote the effect).
            if not connection.info.pop("effect", False):
                return
            with engine.connect() as other:
                seen.append(int(other.execute(
                    text("SELECT count(*) FROM resilience_held_locks WHERE key = :k"),
                    {"k": lock_key}).scalar_one()))

        event.listen(stores.engine(), "before_cursor_execute", on_execute)
        event.listen(stores.engine(), "commit", on_commit)
        try:
            assert task.apply(args=(run_id, key)).get() == key
        finally:
            event.remove(stores.engine(), "commit", on_commit)
            event.remove(stores.engine(), "before_cursor_execute", on_execute)
            if nodes is not None:
                nodes.stop()
        assert effects(engine, run_id) == [key]
        assert len(seen) == 1, "the effect's commit was not observed"
        assert seen[0] == 1, "the transactional commit ran after the lock was given back"


class TestNoLengthTraps:
    def test_long_task_ids_and_keys_run_once(self, engine: Any, run_id: str) -> None:
        """Scenario 4: a 100-character task id and a 500-character key run under
        `@idempotent` + `@singleton` (before: a too-long value read as "store down", so
        the job deferred forever); a second delivery replays."""
        from tests.resilience.pipeline.tasks import paid_singleton

        key = f"{run_id}-" + "k" * 480
        task_id = "t" * 100
        assert paid_singleton.apply(args=(run_id, key), task_id=task_id).get() == key
        replay = paid_singleton.apply(args=(run_id, key), task_id="u" * 100).get()
        assert replay == key  # the first call's value, replayed: the body wrote once
        assert effects(engine, run_id) == [key]


class TestLostHoldsDefer:
    def test_a_lock_lost_mid_body_defers_and_rolls_back(self, engine: Any, run_id: str) -> None:
        """checkpoint() finds the lock's session gone: the job is DEFERRED (not FAILED, which
        would lose it without a retry policy) and its transactional writes roll back."""
        from resilience.errors import JobDeferred
        from tests.resilience.pipeline.tasks import loses_lock

        result = loses_lock.apply(args=(run_id, f"lost-{run_id}"))
        assert isinstance(result.result, JobDeferred), result.result
        assert "lock lost while the job ran" in str(result.result)
        assert effects(engine, run_id) == []
