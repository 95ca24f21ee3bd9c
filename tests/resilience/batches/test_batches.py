"""Batches on real worker processes: exact tallies with duplicate deliveries, and each
callback run once. The 2,000-member version under SIGKILL is `test_chaos.py` (soak)."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from sqlalchemy import text

from resilience.batches import batch
from resilience.cancel.view import cancellations
from resilience.counters import read_all
from resilience.outbox import OUTBOX_HEADER
from tests.resilience.batches import tasks
from tests.support import wait_for

pytestmark = pytest.mark.timeout(300)


def outbox_ids(engine: Any, task_ids: list[str]) -> dict[str, int]:
    with engine.connect() as connection:
        rows = connection.execute(
            text("SELECT task_id, id FROM resilience_outbox WHERE task_id = ANY(:ids)"),
            {"ids": task_ids}).all()
    return {row.task_id: int(row.id) for row in rows}


def deliver_again(task: Any, result: Any, args: tuple[Any, ...], batch_id: str,
                  outbox_id: int) -> None:
    """Publish a second copy of a member's message: the same task id and headers, as a
    relay killed between publishing and marking would."""
    task.apply_async(args, task_id=result.id,
                     headers={"batch_id": batch_id, OUTBOX_HEADER: outbox_id})


def callback_rows(engine: Any, run: str, table: str) -> list[tuple[str, str]]:
    with engine.connect() as connection:
        return [tuple(row) for row in connection.execute(
            text(f"SELECT batch_id, kind FROM {table} WHERE run = :run ORDER BY id"),
            {"run": run}).all()]


def effects(engine: Any, run: str) -> list[int]:
    with engine.connect() as connection:
        return sorted(int(n) for n in connection.execute(
            text("SELECT n FROM batch_test_effects WHERE run = :run"), {"run": run}).scalars())


def same_transaction(engine: Any, run: str) -> dict[int, bool]:
    """Per member n: was its state written by the transaction that wrote its ledger row?"""
    with engine.connect() as connection:
        rows = connection.execute(text(
            "SELECT e.n, bool_or(e.xmin::text = m.xmin::text) AS same "
            "FROM batch_test_effects e JOIN resilience_workflow_steps m USING (task_id) "
            "WHERE e.run = :run GROUP BY e.n"), {"run": run}).all()
    return {int(row.n): bool(row.same) for row in rows}


class TestBatchOnWorkers:
    def test_tallies_are_exact_and_each_callback_runs_once(
            self, app: Any, engine: Any, stores: Any, tier_workers: Any, relay: Any,
            run: str) -> None:
        """50 members, 16 of them delivered twice, one retried once, one failing, one
        cancelled (`jobs cancel`) before it started: 48 succeeded, 1 failed, 1 cancelled,
        each counted once; on_complete ran once and on_success never. A second batch in
        which all succeed runs on_success once, and a second copy of its message is
        REPLAYED without running the body again."""
        first = batch(description="with a failure", app=app,
                      on_success=tasks.callback.s(run), on_complete=tasks.callback.s(run))
        plain = set(range(40, 49))  # not idempotent: a second delivery runs again
        for n in range(50):
            first.add(tasks.plain.s(run, n) if n in plain
                      else tasks.member.s(run, n, fail=(n == 49), retry_first=(n == 38))
                      .set(countdown=3 if n == 39 else None))
        result = first.apply_async()
        cancellations(app).cancel_job(result.results[39].id, reason="test")
        ids = outbox_ids(engine, [r.id for r in result.results])
        for n in [*range(0, 30, 3), 40, 42, 44, 46, 48, 49]:  # 16 second deliveries
            task = tasks.plain if n in plain else tasks.member
            args = (run, n) if n in plain else (run, n, n == 49)
            deliver_again(task, result.results[n], args, result.id,
                          ids[result.results[n].id])

        summary = wait_for(lambda: (s := result.summary()).complete and s,
                           timeout_seconds=180, interval=0.2, message="batch complete")
        assert summary.pending == 0
        assert summary.tallies == {"succeeded": 48, "replayed": 0, "failed": 1, "shed": 0,
                                   "skipped": 0, "cancelled": 1, "dead_lettered": 0}
        assert summary.success_task_id is None and summary.complete_task_id is not None
        wait_for(lambda: callback_rows(engine, run, "batch_test_callbacks"),
                 timeout_seconds=120, interval=0.2, message="on_complete ran")
        # Every idempotent member took effect once; a plain one delivered twice ran twice,
        # yet each member counts once.
        twice = {40, 42, 44, 46, 48}
        expected_runs = sorted([*range(39), *plain, *twice])
        wait_for(lambda: effects(engine, run) == expected_runs, timeout_seconds=120,
                 interval=0.2, message="every delivery ran")
        assert result.summary().tallies == summary.tallies
        # A transactional member's state committed in its body's transaction (one xmin);
        # a plain one's right after, in a transaction of its own.
        same = same_transaction(engine, run)
        assert all(same[n] for n in range(39)) and not any(same[n] for n in plain)

        second = batch([tasks.member.s(run, 100 + n) for n in range(10)], app=app,
                       on_success=tasks.callback.s(run), on_complete=tasks.callback.s(run),
                       description="all succeed").apply_async()
        done = wait_for(lambda: (s := second.summary()).complete and s,
                        timeout_seconds=120, interval=0.2, message="second batch complete")
        assert done.succeeded and done.tallies["succeeded"] == 10
        expected = [(result.id, "complete"), (second.id, "complete"), (second.id, "success")]
        wait_for(lambda: sorted(callback_rows(engine, run, "batch_test_callbacks"))
                 == sorted(expected), timeout_seconds=120, interval=0.2,
                 message=f"callbacks {expected}")

        # The relay publishes at least once: a second copy of the on_success message
        # (same task id and arguments: its step row's input) is REPLAYED under
        # CALLBACK_KEY, not run again.
        with engine.connect() as connection:
            row = connection.execute(text(
                "SELECT input FROM resilience_workflow_steps WHERE task_id = :id"),
                {"id": done.success_task_id}).one()
        before = replayed(stores.redis(), tasks.callback.name)
        tasks.callback.apply_async(tuple(row.input), task_id=done.success_task_id)
        wait_for(lambda: replayed(stores.redis(), tasks.callback.name) > before,
                 timeout_seconds=60, interval=0.2, message="duplicate callback replayed")
        assert sorted(callback_rows(engine, run, "batch_test_callbacks")) == sorted(expected)
        assert sorted(callback_rows(engine, run, "batch_test_callback_runs")) == sorted(expected)
        with engine.connect() as connection:
            argument = connection.execute(text(
                "SELECT argument FROM batch_test_callbacks WHERE batch_id = :id AND "
                "kind = 'complete'"), {"id": result.id}).scalar_one()
        assert argument["tallies"] == summary.tallies and argument["total"] == 50
        assert argument["description"] == "with a failure" and argument["succeeded"] is False

    def test_a_member_deduplicated_at_publish_is_skipped_and_the_batch_completes(
            self, app: Any, engine: Any, tier_workers: Any, relay: Any, run: str) -> None:
        """Two members of one `@unique` key: the relay publishes the first, which holds the
        key while it runs; the second is never enqueued. It counts as skipped at once (its
        own result is the REJECTED outcome naming the first), so the batch completes and
        on_complete runs exactly once; on_success does not (a skipped member is no success)."""
        key = uuid.uuid4().hex
        result = batch([tasks.unique_member.s(run, 1, key, 1.0),
                        tasks.unique_member.s(run, 2, key, 1.0),
                        tasks.member.s(run, 3)], app=app,
                       on_success=tasks.callback.s(run), on_complete=tasks.callback.s(run),
                       description="one deduplicated").apply_async()
        summary = wait_for(lambda: (s := result.summary()).complete and s,
                           timeout_seconds=60, interval=0.2, message="batch complete")
        assert summary.tallies == {"succeeded": 2, "replayed": 0, "failed": 0, "shed": 0,
                                   "skipped": 1, "cancelled": 0, "dead_lettered": 0}
        assert summary.success_task_id is None and summary.complete_task_id is not None
        outcome = result.results[1].get(timeout=10)
        assert outcome["outcome"] == "REJECTED"
        assert outcome["details"]["existing_task_id"] == result.results[0].id
        assert app.AsyncResult(summary.complete_task_id).get(timeout=60) == "complete"
        assert effects(engine, run) == [1, 3]
        assert callback_rows(engine, run, "batch_test_callback_runs") == [(result.id, "complete")]
        assert callback_rows(engine, run, "batch_test_callbacks") == [(result.id, "complete")]


def replayed(redis_client: Any, task_name: str) -> int:
    """REPLAYED decisions counted fleet-wide for `task_name`."""
    return sum(value for labels, value in read_all(redis_client)
               if labels.get("outcome") == "REPLAYED" and labels.get("name") == task_name)
