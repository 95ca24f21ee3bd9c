"""Transactional enqueue and the relay, on real PostgreSQL, Redis and worker processes."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from kombu import Exchange, Queue
from sqlalchemy import text
from sqlalchemy.orm import Session

from resilience.counters import read_all
from resilience.errors import (
    ArgumentsDoNotBind,
    DuplicateJob,
    InvalidKey,
    NonJsonArguments,
    StoreUnavailable,
)
from resilience.outbox import OUTBOX_HEADER, NewRow, Relay, RelayConfig, describe
from resilience.outbox.backends.postgres import backend_for
from tests.resilience.idempotency import tasks_unique
from tests.resilience.idempotency.tasks import runs_key
from tests.resilience.outbox import tasks
from tests.resilience.outbox.relays import RelayProcess, effects, outbox_rows
from tests.support import ROOT, Worker, running, wait_for

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def critical_worker(app: Any) -> Iterator[Worker]:
    """One critical-tier worker for the module's tests."""
    worker = Worker("critical", name="outbox", concurrency=2)
    with running([worker]):
        yield worker


@pytest.fixture()
def run(engine: Any) -> str:
    """A fresh run id; the ledger exists and the outbox is empty."""
    with engine.begin() as connection:
        connection.execute(tasks.CREATE_LEDGER)
        connection.execute(text("DELETE FROM resilience_outbox"))
    return uuid.uuid4().hex[:10]


@pytest.fixture()
def private_queue(app: Any) -> Iterator[str]:
    """A queue on the platform exchange no worker consumes, known to this process's app."""
    name = f"outbox-test-{uuid.uuid4().hex[:8]}"
    queue = Queue(name, Exchange("jobs", type="direct"), routing_key=name)
    app.amqp.queues.add(queue)
    with app.connection_for_write() as connection:
        queue(connection.default_channel).declare()
    yield name
    app.amqp.queues.pop(name, None)
    with app.connection_for_write() as connection:
        connection.default_channel.queue_delete(name)


def relay_for(app: Any, **options: Any) -> Relay:
    return Relay(app, RelayConfig(backoff_initial_seconds=0.05, backoff_max_seconds=0.2,
                                  **options))


def drain(relay: Relay, stores: Any, timeout_seconds: float = 30) -> None:
    """Relay until nothing due is pending."""
    deadline = time.monotonic() + timeout_seconds
    while describe(stores).due:
        assert time.monotonic() < deadline, f"outbox not drained: {describe(stores)}"
        relay.relay_once()
        time.sleep(0.02)


def replayed(redis_client: Any, task_name: str) -> int:
    return sum(value for labels, value in read_all(redis_client)
               if labels.get("outcome") == "REPLAYED" and labels.get("name") == task_name)


def queued_messages(app: Any, queue: str) -> list[dict[str, Any]]:
    """The messages waiting in a Redis queue, decoded (newest first)."""
    with app.connection_for_write() as connection:
        client = connection.default_channel.client
        return [json.loads(raw) for raw in client.lrange(queue, 0, -1)]


class TestTransactionalEnqueue:
    def test_commit_runs_once_and_rollback_never(self, app: Any, engine: Any, stores: Any,
                                                critical_worker: Worker, run: str) -> None:
        """Jobs of a committed transaction run once each; those of a rolled-back one never."""
        with Session(engine) as session:
            session.begin()
            committed = [tasks.outbox_effect.enqueue_in(session, run, n) for n in range(5)]
            session.commit()
            session.begin()
            rolled_back = [tasks.outbox_effect.enqueue_in(session, run, n)
                           for n in range(5, 10)]
            session.rollback()
        assert outbox_rows(engine, [r.id for r in rolled_back]) == []
        drain(relay_for(app), stores)
        assert [r.get(timeout=30) for r in committed] == list(range(5))
        time.sleep(1.0)  # time for anything else to (wrongly) arrive
        found = effects(engine, run)
        assert sorted(row.n for row in found) == list(range(5))
        assert {row.task_id for row in found} == {r.id for r in committed}

    def test_ids_are_fixed_at_insert_and_nothing_is_published_before_commit(
        self, app: Any, engine: Any, stores: Any, critical_worker: Worker, run: str
    ) -> None:
        """The AsyncResult comes back at once with the id the job runs with; until the
        transaction commits the relay sees nothing (a Connection works like a Session)."""
        relay = relay_for(app)
        with engine.connect() as connection:
            connection.begin()
            started = time.perf_counter()
            results = [tasks.outbox_effect.apply_async_in(connection, (run, n))
                       for n in range(100)]
            per_call_ms = (time.perf_counter() - started) * 1000 / len(results)
            assert relay.relay_once().locked == 0
            assert all(r.state == "PENDING" for r in results)
            connection.commit()
        print(f"enqueue_in: {per_call_ms:.2f} ms per call in one transaction")
        rows = outbox_rows(engine, [r.id for r in results])
        assert [row.task_id for row in rows] == [r.id for r in results]
        drain(relay, stores)
        wait_for(lambda: len(effects(engine, run)) >= 100, timeout_seconds=60,
                 message="100 effects")
        found = effects(engine, run)
        assert Counter(row.task_id for row in found) == Counter(r.id for r in results)
        assert results[7].get(timeout=10) == 7

    def test_arguments_are_validated_as_apply_async_does(self, engine: Any, run: str) -> None:
        """Bad arguments, keys or options raise in the producer and write nothing."""
        with Session(engine) as session, session.begin():
            with pytest.raises(ArgumentsDoNotBind):
                tasks.outbox_effect.enqueue_in(session, run)
            with pytest.raises(NonJsonArguments):
                tasks.outbox_effect.enqueue_in(session, run, {1, 2})
            with pytest.raises(NonJsonArguments):
                tasks.outbox_plain.apply_async_in(session, (run, 1), producer=None,
                                                  headers={"x": object()})
            with pytest.raises(InvalidKey):
                tasks.outbox_plain.apply_async_in(session, (run, 1), ordering_key=7)
            good = tasks.outbox_plain.enqueue_in(session, run, 1)
        assert [row.task_id for row in outbox_rows(engine)] == [good.id]


class TestRelay:
    def test_tier_full_leaves_the_row_pending_then_publishes_when_there_is_room(
        self, app: Any, engine: Any, run: str, private_queue: str
    ) -> None:
        """A refusal (TierFull) is not a loss: the row waits with backoff and is published,
        with its task id and outbox header, once the queue has room."""
        for n in range(tasks.BOUNDED_DEPTH):
            tasks.outbox_bounded.apply_async((run, n), queue=private_queue)
        with Session(engine) as session, session.begin():
            job = tasks.outbox_bounded.apply_async_in(session, (run, 99), queue=private_queue)
        relay = relay_for(app)
        report = relay.relay_once()
        assert (report.published, report.postponed) == (0, 1)
        [row] = outbox_rows(engine, [job.id])
        assert row.state == "pending" and row.attempts == 1
        assert "TierFull" in row.last_error
        with app.connection_for_write() as connection:
            connection.default_channel.queue_purge(private_queue)
        wait_for(lambda: relay.relay_once().published, timeout_seconds=10,
                 message="publish after room")
        [row] = outbox_rows(engine, [job.id])
        assert row.state == "published" and row.attempts == 2
        [message] = queued_messages(app, private_queue)
        assert message["headers"]["id"] == job.id
        assert message["headers"][OUTBOX_HEADER] == row.id

    def test_ordering_key_rows_are_published_in_order_past_a_refusal(
        self, app: Any, engine: Any, stores: Any, critical_worker: Worker, run: str,
        private_queue: str,
    ) -> None:
        """A later row of a key is never published before an earlier pending one (here held
        back by a full queue); other keys and keyless rows go on meanwhile."""
        for n in range(tasks.BOUNDED_DEPTH):
            tasks.outbox_bounded.apply_async((run, n), queue=private_queue)
        with Session(engine) as session, session.begin():
            first = tasks.outbox_bounded.apply_async_in(session, (run, 100),
                                                        queue=private_queue, ordering_key="K")
            later = [tasks.outbox_plain.apply_async_in(session, (run, 101 + i),
                                                       ordering_key="K") for i in range(4)]
            other = tasks.outbox_plain.apply_async_in(session, (run, 200), ordering_key="L")
            keyless = tasks.outbox_plain.enqueue_in(session, run, 300)
        relay = relay_for(app)
        for _ in range(3):
            relay.relay_once()
        states = {row.task_id: row.state for row in outbox_rows(engine)}
        assert states[first.id] == "pending"
        assert all(states[r.id] == "pending" for r in later)
        assert states[other.id] == states[keyless.id] == "published"
        with app.connection_for_write() as connection:
            connection.default_channel.queue_purge(private_queue)
        drain(relay, stores)
        ordered = [first.id, *(r.id for r in later)]
        rows = {row.task_id: row for row in outbox_rows(engine, ordered)}
        finished = [rows[task_id].finished_at for task_id in ordered]
        assert all(rows[task_id].state == "published" for task_id in ordered)
        assert finished == sorted(finished) and len(set(finished)) == len(finished)
        wait_for(lambda: len(effects(engine, run)) >= 6, message="the plain jobs' effects")

    def test_unknown_task_and_unbindable_arguments_are_dead_lettered(
        self, app: Any, engine: Any, stores: Any, run: str
    ) -> None:
        """An unknown task name, or arguments that no longer bind, dead-letter the row."""
        backend = backend_for(stores)
        unknown = NewRow(task_id=str(uuid.uuid4()), task_name="tests.outbox.no_such_task",
                         args=[run], kwargs={}, options={})
        unbindable = NewRow(task_id=str(uuid.uuid4()), task_name=tasks.outbox_plain.name,
                            args=[run, 1, 2, 3], kwargs={}, options={})
        for row in (unknown, unbindable):
            backend.insert(None, row)
        report = relay_for(app).relay_once()
        assert (report.published, report.dead_lettered) == (0, 2)
        rows = outbox_rows(engine, [unknown.task_id, unbindable.task_id])
        assert [row.state for row in rows] == ["dead_lettered", "dead_lettered"]
        with engine.connect() as connection:
            letters = connection.execute(
                text("SELECT id, task_id, guard, reason, exception_type "
                     "FROM resilience_dead_letters "
                     "WHERE task_id = ANY(:ids) ORDER BY id"),
                {"ids": [unknown.task_id, unbindable.task_id]}).all()
        assert [row.dead_letter_id for row in rows] == [letter.id for letter in letters]
        assert all(letter.guard == "outbox" for letter in letters)
        assert "unknown task 'tests.outbox.no_such_task'" in letters[0].reason
        assert letters[1].exception_type == "resilience.errors.ArgumentsDoNotBind"
        assert describe(stores).dead_lettered == 2

    def test_a_row_published_twice_takes_effect_once(
        self, app: Any, engine: Any, stores: Any, critical_worker: Worker, run: str,
        redis_client: Any,
    ) -> None:
        """The relay killed between publishing and marking publishes the row again (same task
        id, same outbox header): @idempotent keyed on the row replays the second copy."""
        with Session(engine) as session, session.begin():
            job = tasks.outbox_effect.enqueue_in(session, run, 1)
        relay = relay_for(app)
        assert relay.relay_once().published == 1
        assert job.get(timeout=30) == 1
        # What a SIGKILL before the mark's commit leaves: the row pending again.
        with engine.begin() as connection:
            connection.execute(text("UPDATE resilience_outbox SET state = 'pending', "
                                    "finished_at = NULL WHERE task_id = :id"), {"id": job.id})
        assert relay.relay_once().published == 1
        wait_for(lambda: replayed(redis_client, tasks.outbox_effect.name) >= 1,
                 timeout_seconds=30, message="the second copy replayed")
        assert [row.task_id for row in effects(engine, run)] == [job.id]
        with engine.connect() as connection:
            record = connection.execute(
                text("SELECT key, state FROM resilience_idempotency_records WHERE task_name = :t "
                     "AND task_id = :id"), {"t": tasks.outbox_effect.name, "id": job.id}).one()
        [row] = outbox_rows(engine, [job.id])
        assert (record.key, record.state) == (f"outbox:{row.id}", "succeeded")


    def test_finished_rows_are_purged_after_the_retention(self, engine: Any, stores: Any,
                                                           run: str) -> None:
        """Published and dead-lettered rows older than the retention are deleted; pending
        rows and recent finished rows stay."""
        with Session(engine) as session, session.begin():
            old, recent, pending = (tasks.outbox_plain.enqueue_in(session, run, n)
                                    for n in range(3))
        with engine.begin() as connection:
            connection.execute(
                text("UPDATE resilience_outbox SET state = 'published', finished_at = "
                     "now() - make_interval(secs => :age) WHERE task_id = :id"),
                [{"age": 7200, "id": old.id}, {"age": 10, "id": recent.id}])
        assert backend_for(stores).purge_published(older_than_seconds=3600, limit=10) == 1
        assert [row.task_id for row in outbox_rows(engine)] == [recent.id, pending.id]


class TestUniqueRows:
    """A row whose `@unique` key another job holds is marked, not postponed, and its
    AsyncResult resolves to where the work went instead of staying PENDING."""

    def test_enqueue_in_while_the_key_is_held_resolves_to_the_rejected_outcome(
        self, app: Any, engine: Any, critical_worker: Worker, run: str, redis_client: Any,
    ) -> None:
        """The caller's AsyncResult resolves at once to the REJECTED outcome naming the job
        holding the key; that job runs once."""
        key = uuid.uuid4().hex
        holder = tasks_unique.held.delay(key, pause_seconds=2.0)
        with Session(engine) as session, session.begin():
            job = tasks_unique.held.enqueue_in(session, key)
        report = relay_for(app).relay_once()
        assert (report.published, report.deduplicated, report.postponed) == (1, 1, 0)
        outcome = job.get(timeout=10)
        assert outcome["outcome"] == "REJECTED" and outcome["guard"] == "unique"
        assert outcome["details"]["existing_task_id"] == holder.id
        assert holder.get(timeout=30) == holder.id
        assert [row.state for row in outbox_rows(engine, [job.id])] == ["published"]
        assert unique_runs(redis_client, key) == 1

    def test_raise_on_duplicate_makes_get_raise_duplicate_job(
        self, app: Any, engine: Any, critical_worker: Worker, run: str, redis_client: Any,
    ) -> None:
        """With `raise_on_duplicate` the row is marked too (not refused, which would hold up
        its queue) and `.get()` raises DuplicateJob naming the holder."""
        key = uuid.uuid4().hex
        holder = tasks_unique.held_raising.delay(key, pause_seconds=2.0)
        with Session(engine) as session, session.begin():
            job = tasks_unique.held_raising.enqueue_in(session, key)
        report = relay_for(app).relay_once()
        assert (report.published, report.deduplicated, report.postponed) == (1, 1, 0)
        with pytest.raises(DuplicateJob, match=holder.id):
            job.get(timeout=10)
        assert holder.get(timeout=30) == holder.id
        assert unique_runs(redis_client, key) == 1

    def test_an_outcome_not_recorded_leaves_the_row_pending(
        self, app: Any, engine: Any, critical_worker: Worker, run: str, redis_client: Any,
    ) -> None:
        """A `job_deduplicated` receiver that cannot record (its store down) makes the relay
        postpone the row instead of marking it; the next pass records and marks it."""
        from resilience.idempotency.unique import job_deduplicated

        def refuse(**_: Any) -> None:
            raise StoreUnavailable("batch store down (test)")

        key = uuid.uuid4().hex
        holder = tasks_unique.held.delay(key, pause_seconds=2.0)
        with Session(engine) as session, session.begin():
            job = tasks_unique.held.enqueue_in(session, key)
        relay = relay_for(app)
        job_deduplicated.connect(refuse, weak=False)
        try:
            report = relay.relay_once()
        finally:
            job_deduplicated.disconnect(refuse)
        assert (report.published, report.deduplicated, report.postponed) == (0, 0, 1)
        assert [row.state for row in outbox_rows(engine, [job.id])] == ["pending"]
        time.sleep(0.2)  # past the row's backoff (0.05 s)
        report = relay.relay_once()
        assert (report.published, report.deduplicated, report.postponed) == (1, 1, 0)
        assert job.get(timeout=10)["details"]["existing_task_id"] == holder.id
        assert holder.get(timeout=30) == holder.id

    def test_a_row_published_again_while_its_own_job_holds_the_key_keeps_its_result(
        self, app: Any, engine: Any, critical_worker: Worker, run: str, redis_client: Any,
    ) -> None:
        """The relay killed between publishing and marking publishes the row again while
        its job holds the key: the holder is the row's own job, so nothing is stored for it
        and it is not refused; the job runs once and its result is its own."""
        key = uuid.uuid4().hex
        with Session(engine) as session, session.begin():
            job = tasks_unique.held_raising.enqueue_in(session, key, 2.0)
        relay = relay_for(app)
        assert relay.relay_once().published == 1
        with engine.begin() as connection:
            connection.execute(text("UPDATE resilience_outbox SET state = 'pending', "
                                    "finished_at = NULL WHERE task_id = :id"), {"id": job.id})
        report = relay.relay_once()
        assert (report.published, report.deduplicated, report.postponed) == (1, 0, 0)
        assert job.get(timeout=30) == job.id
        assert unique_runs(redis_client, key) == 1


def unique_runs(redis_client: Any, key: str) -> int:
    return int(redis_client.get(runs_key(key)) or 0)


class TestRelayProcesses:
    def test_two_relays_at_once_publish_each_row_once(
        self, app: Any, engine: Any, stores: Any, critical_worker: Worker, run: str
    ) -> None:
        """Two `jobs outbox relay` processes share the rows (SKIP LOCKED): a task without
        idempotency shows every publish, and each job ran exactly once."""
        relays = [RelayProcess("--poll-seconds", "0.2", "--batch-size", "20", name=f"two{i}")
                  for i in range(2)]
        try:
            for relay in relays:
                relay.start()
            for relay in relays:
                relay.wait_ready(1)
            started = time.monotonic()
            expected = []
            for batch in range(30):
                with Session(engine) as session, session.begin():
                    expected += [tasks.outbox_plain.enqueue_in(session, run, batch * 10 + i).id
                                 for i in range(10)]
            wait_for(lambda: len(effects(engine, run)) >= 300, timeout_seconds=60,
                     message="300 effects")
            print(f"two relays: 300 jobs published and run in "
                  f"{time.monotonic() - started:.1f}s")
            time.sleep(1.0)
        finally:
            for relay in relays:
                relay.stop()
        found = effects(engine, run)
        assert Counter(row.task_id for row in found) == Counter(expected)
        logs = [relay.log_path.read_text() for relay in relays]
        print("batches per relay:", [log.count("outbox relay: ") for log in logs])

    def test_status_command_and_snapshot_show_the_backlog(self, app: Any, engine: Any,
                                                          run: str) -> None:
        """`jobs outbox status --json` and `jobs status`'s snapshot show pending rows, the
        due ones' lag and the scheduled ones."""
        with Session(engine) as session, session.begin():
            for n in range(3):
                tasks.outbox_plain.enqueue_in(session, run, n)
            tasks.outbox_plain.apply_async_in(session, (run, 9), countdown=3600)
        time.sleep(0.3)
        output = subprocess.run(
            [sys.executable, "-m", "jobs", "outbox", "status", "--json"],
            cwd=ROOT, capture_output=True, text=True, timeout=60, check=True,
        ).stdout
        state = json.loads(output)
        assert (state["pending"], state["due"], state["scheduled"]) == (4, 3, 1)
        assert state["lag_seconds"] >= 0.3
        assert 3590 < state["next_due_in_seconds"] <= 3600
        from jobs.observe.snapshot import collect

        assert collect(app, active=False)["outbox"]["pending"] == 4
