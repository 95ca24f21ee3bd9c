"""`@unique` on real workers and Redis: a duplicate enqueue returns (or raises for) the
queued job until it starts or finishes."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import pytest
from celery import chain, chord, group
from celery.exceptions import ChordError

from resilience.errors import DuplicateJob, JobStopped
from tests.resilience.idempotency import tasks, tasks_unique
from tests.support import wait_for

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


class TestDuplicateWithItsOwnId:
    """A duplicate whose id its caller fixed before the enqueue (an explicit `task_id`, a
    canvas member, an outbox row) gets a final result under that id: nothing would ever
    run with it, so `.get()` on it would otherwise wait forever."""

    def test_an_explicit_task_id_resolves_to_the_rejected_outcome(
            self, tier_workers: Any, redis_client: Any) -> None:
        """The caller gets the holder's AsyncResult, and its own id resolves at once to the
        REJECTED outcome naming the holder."""
        key = uuid.uuid4().hex
        first = tasks_unique.held.delay(key, pause_seconds=1.0)
        own_id = uuid.uuid4().hex
        assert tasks_unique.held.apply_async((key,), task_id=own_id).id == first.id
        outcome = tasks_unique.held.AsyncResult(own_id).get(timeout=10)
        assert outcome["outcome"] == "REJECTED" and outcome["guard"] == "unique"
        assert outcome["details"]["existing_task_id"] == first.id
        assert first.get(timeout=30) == first.id
        assert runs(redis_client, key) == 1

    def test_the_guards_own_check_resolves_it_too(
            self, app: Any, tier_workers: Any, redis_client: Any,
            monkeypatch: pytest.MonkeyPatch) -> None:
        """Where the broker push does not take the key (RabbitMQ, a key prefix), the guard's
        own script finds the holder: the duplicate's id resolves the same way."""
        from resilience.admission import broker

        monkeypatch.setitem(broker._SUPPORTED, app, False)  # this process: no in-push check
        key = uuid.uuid4().hex
        first = tasks_unique.held.delay(key)
        own_id = uuid.uuid4().hex
        assert tasks_unique.held.apply_async((key,), task_id=own_id).id == first.id
        outcome = tasks_unique.held.AsyncResult(own_id).get(timeout=10)
        assert outcome["details"]["existing_task_id"] == first.id
        assert first.get(timeout=30) == first.id

    def test_an_explicit_task_id_of_a_raising_task_raises_duplicate_job(
            self, tier_workers: Any, redis_client: Any) -> None:
        """With raise_on_duplicate the caller gets DuplicateJob, and `.get()` on its own id
        raises DuplicateJob naming the holder."""
        key = uuid.uuid4().hex
        first = tasks_unique.held_raising.delay(key, pause_seconds=1.0)
        own_id = uuid.uuid4().hex
        with pytest.raises(DuplicateJob):
            tasks_unique.held_raising.apply_async((key,), task_id=own_id)
        with pytest.raises(DuplicateJob, match=first.id):
            tasks_unique.held_raising.AsyncResult(own_id).get(timeout=10)
        assert first.get(timeout=30) == first.id

    def test_a_chord_with_two_members_of_one_key_fails_instead_of_hanging(
            self, tier_workers: Any, redis_client: Any) -> None:
        """The second member is REJECTED: it fails as a stopped chord member does
        (`JobStopped`), so `.get()` raises at once and the chord counts it: once the first
        finished the chord fails (ChordError naming REJECTED), and its body never runs on
        an outcome it would mistake for a result."""
        key = uuid.uuid4().hex
        result = chord([tasks_unique.held.s(key, 0.5),
                        tasks_unique.held.s(key, 0.5)])(tasks_unique.collect.s())
        with pytest.raises(JobStopped, match="REJECTED"):
            result.get(timeout=30)
        first, second = result.parent.results
        assert first.get(timeout=30) == first.id
        assert second.state == "FAILURE"
        wait_for(lambda: result.state == "FAILURE", timeout_seconds=30,
                 message="the chord's body failed")
        assert isinstance(result.result, ChordError) and "REJECTED" in str(result.result)
        assert runs(redis_client, key) == 1

    def test_a_chain_whose_first_link_is_a_duplicate_fails_instead_of_hanging(
            self, tier_workers: Any, redis_client: Any) -> None:
        """A chain starting with a job whose key is held: nothing of it will run, so its
        links fail (`JobStopped` naming REJECTED) and `.get()` raises at once instead of
        waiting on a PENDING result forever."""
        key = uuid.uuid4().hex
        first = tasks_unique.held.delay(key, 1.0)
        result = chain(tasks_unique.held.si(key), tasks_unique.collect.si([1])).apply_async()
        with pytest.raises(JobStopped, match="REJECTED"):
            result.get(timeout=10)
        assert result.parent.state == "FAILURE"
        assert first.get(timeout=30) == first.id
        assert runs(redis_client, key) == 1

    def test_a_group_with_two_members_of_one_key_resolves(
            self, tier_workers: Any, redis_client: Any) -> None:
        """Each member id of the group resolves: the first to its result, the second to
        the REJECTED outcome naming the first."""
        key = uuid.uuid4().hex
        signature = group(tasks_unique.held.s(key, 0.5), tasks_unique.held.s(key, 0.5))
        first, second = signature.freeze().results
        signature.apply_async()
        assert first.get(timeout=30) == first.id
        outcome = second.get(timeout=10)
        assert outcome["outcome"] == "REJECTED"
        assert outcome["details"]["existing_task_id"] == first.id
        assert runs(redis_client, key) == 1
