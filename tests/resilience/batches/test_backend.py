"""Batches on the workflow store, real PostgreSQL: one write per member, one completion
per batch."""

from __future__ import annotations

import json
import random
import threading
import uuid
from datetime import datetime, timezone
from decimal import Decimal
from typing import Any

import pytest
from celery import group
from kombu.utils import json as kombu_json
from sqlalchemy import text
from sqlalchemy.orm import Session

from resilience import workflows
from resilience.batches import (
    BatchNotFound,
    InvalidBatch,
    batch,
    describe,
    recent,
)
from resilience.errors import ArgumentsDoNotBind
from resilience.workflows import StepState, WorkflowNotRetryable
from resilience.workflows.backend import backend_for
from tests.resilience.batches import tasks


def _outbox(engine: Any, task_ids: list[str]) -> list[Any]:
    with engine.connect() as connection:
        return connection.execute(
            text("SELECT task_id, task_name, args, options FROM resilience_outbox "
                 "WHERE task_id = ANY(:ids) ORDER BY id"), {"ids": task_ids}).all()


def _forget(engine: Any, *task_ids: str | None) -> None:
    """Delete this test's outbox rows, so no later relay publishes them."""
    with engine.begin() as connection:
        connection.execute(text("DELETE FROM resilience_outbox WHERE task_id = ANY(:ids)"),
                           {"ids": [task_id for task_id in task_ids if task_id]})


class TestBatchStore:
    def test_members_and_batch_commit_together_or_not_at_all(self, app: Any, engine: Any,
                                                              run: str) -> None:
        """A rolled-back transaction leaves no batch, no member and no outbox row; a
        committed one leaves all three, each member with the batch id in its headers."""
        with pytest.raises(RuntimeError), Session(engine) as session, session.begin():
            rolled_back = batch([tasks.member.s(run, n) for n in range(3)],
                                on_complete=tasks.callback.s(run)).apply_async_in(session)
            raise RuntimeError("the caller's transaction rolls back")
        ids = [result.id for result in rolled_back.results]
        assert _outbox(engine, ids) == []
        with pytest.raises(BatchNotFound):
            describe(_stores(app), rolled_back.id)

        with Session(engine) as session, session.begin():
            result = batch([tasks.member.s(run, n) for n in range(3)],
                           on_complete=tasks.callback.s(run),
                           description="three").apply_async_in(session)
        ids = [r.id for r in result.results]
        rows = _outbox(engine, ids)
        assert [row.task_id for row in rows] == ids
        assert all(row.options["headers"]["batch_id"] == result.id for row in rows)
        summary = result.summary()
        assert (summary.total, summary.pending, summary.description) == (3, 3, "three")
        assert not summary.complete
        _forget(engine, *ids)

    def test_each_member_counts_once_and_the_last_writes_each_callback_once(
            self, app: Any, engine: Any, run: str) -> None:
        """Eight threads record 120 members two or three times each, in random order: the
        tallies are exact, the batch completes once, and each callback is one outbox row
        carrying the tallies; on_success is not written when a member failed."""
        result = batch([tasks.member.s(run, n) for n in range(120)],
                       on_success=tasks.callback.s(run), on_complete=tasks.callback.s(run),
                       app=app).apply_async()
        ids = [r.id for r in result.results]
        expected = {task_id: (StepState.FAILED if index == 7 else StepState.SUCCEEDED)
                    for index, task_id in enumerate(ids)}
        work = [task_id for task_id in ids for _ in range(random.choice((2, 3)))]
        random.Random(15).shuffle(work)
        backend = backend_for(_stores(app))
        recorded: list[bool] = []
        completed: list[str] = []
        lock = threading.Lock()

        def record(chunk: list[str]) -> None:
            for task_id in chunk:
                done = backend.record(None, task_id=task_id, state=expected[task_id],
                                      workflow_id=result.id)
                with lock:
                    recorded.append(done.recorded)
                    completed.extend([result.id] if done.rows else [])  # callbacks written

        threads = [threading.Thread(target=record, args=(work[index::8],)) for index in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert recorded.count(True) == 120
        assert completed == [result.id]
        summary = result.summary()
        assert summary.pending == 0 and summary.complete and not summary.succeeded
        assert summary.tallies["succeeded"] == 119 and summary.tallies["failed"] == 1
        assert summary.success_task_id is None and summary.complete_task_id is not None
        rows = _outbox(engine, [summary.complete_task_id])
        assert len(rows) == 1 and rows[0].task_name == tasks.callback.name
        argument = rows[0].args[0]
        assert argument["batch_id"] == result.id and argument["callback"] == "complete"
        assert argument["tallies"] == summary.tallies and argument["succeeded"] is False
        assert rows[0].args[1:] == [run]
        assert rows[0].options["headers"]["batch_callback"] == f"{result.id}:complete"
        # Once final, a member never changes again, even by its task id alone.
        assert not backend.record(None, task_id=ids[7], state=StepState.SUCCEEDED).recorded
        assert result.summary().tallies == summary.tallies
        _forget(engine, *ids, summary.complete_task_id)

    def test_an_empty_batch_completes_at_once(self, app: Any, engine: Any, run: str) -> None:
        """No members: complete and succeeded when written, both callbacks in the outbox;
        `recent` lists it first."""
        result = batch(on_success=tasks.callback.s(run), on_complete=tasks.plain.si(run, 0),
                       app=app).apply_async()
        summary = result.summary()
        assert summary.complete and summary.succeeded and summary.total == 0
        rows = _outbox(engine, [summary.success_task_id, summary.complete_task_id])
        assert len(rows) == 2
        immutable = next(row for row in rows if row.task_id == summary.complete_task_id)
        assert immutable.args == [run, 0]  # .si(): nothing added
        assert recent(_stores(app), limit=1)[0].id == result.id
        _forget(engine, summary.success_task_id, summary.complete_task_id)

    def test_a_callback_carries_what_celerys_json_carries(self, app: Any, engine: Any) -> None:
        """A callback's UUID, datetime and Decimal arguments (which Celery's JSON serializer
        accepts) are stored tagged, and reach the worker's decoder as themselves."""
        arguments = (uuid.uuid4(),
                     [datetime(2026, 11, 26, 20, 0, tzinfo=timezone.utc), Decimal("12.50")])
        result = batch(on_complete=tasks.plain.si(*arguments), app=app).apply_async()
        summary = result.summary()
        (row,) = _outbox(engine, [summary.complete_task_id])
        assert tuple(kombu_json.loads(json.dumps(row.args))) == arguments
        _forget(engine, summary.complete_task_id)

    def test_a_batch_is_a_workflow_whose_members_are_not_run_again(
            self, app: Any, engine: Any, run: str) -> None:
        """The batch is a workflow of the same id: a member step, and a callback step that
        depends on it, released when the member failed; once the callback ran the workflow
        is failed (a member did not succeed), and retry and replay refuse it."""
        result = batch([tasks.member.s(run, 1)], on_complete=tasks.callback.s(run),
                       app=app).apply_async()
        stores = _stores(app)
        backend = backend_for(stores)
        backend.record(None, task_id=result.results[0].id, state=StepState.FAILED,
                       workflow_id=result.id)
        flow = workflows.describe(stores, result.id)
        assert [step.state for step in flow.steps] == [StepState.FAILED, StepState.QUEUED]
        assert flow.steps[1].depends_on == [0] and flow.state == "running"
        backend.record(None, task_id=flow.steps[1].task_id, state=StepState.SUCCEEDED)
        flow = workflows.describe(stores, result.id)
        assert (flow.state, flow.failed_step) == ("failed", 0)
        with pytest.raises(WorkflowNotRetryable, match="is a batch"):
            workflows.retry(stores, result.id)
        with pytest.raises(WorkflowNotRetryable, match="is a batch"):
            workflows.replay(stores, result.id, from_step=0)
        _forget(engine, result.results[0].id, flow.steps[1].task_id)

    def test_bad_members_and_callbacks_are_refused_before_anything_is_written(
            self, app: Any) -> None:
        """A group is not a member; a callback must be a registered task whose arguments
        fit with the summary first; nothing is written when refused."""
        with pytest.raises(InvalidBatch, match="one task's signature"):
            batch([group(tasks.member.s("r", 1), tasks.member.s("r", 2))])
        with pytest.raises(InvalidBatch, match="not a registered task"):
            batch([tasks.member.s("r", 1)], on_complete=app.signature("no.such.task"),
                  app=app).apply_async()
        with pytest.raises(ArgumentsDoNotBind):
            batch([tasks.member.s("r", 1)], on_complete=tasks.callback.s("r", "x", "y"),
                  app=app).apply_async()
        with pytest.raises(ArgumentsDoNotBind):
            batch([tasks.member.s("r", 1, extra=True)], app=app).apply_async()


def _stores(app: Any) -> Any:
    from resilience.stores import stores_for

    return stores_for(app)


class TestBatchesCommand:
    def test_list_and_show_as_a_user_runs_them(self, app: Any, engine: Any, run: str) -> None:
        """`jobs batches list` lists a batch; `show ID` has its tallies and callbacks (as
        tables and as JSON); an unknown id is one line and exit 2."""
        import json
        import os
        import subprocess
        import sys

        from tests.support import ROOT

        result = batch([tasks.member.s(run, 1), tasks.member.s(run, 2)], app=app,
                       on_success=tasks.callback.s(run), description="cli").apply_async()
        backend = backend_for(_stores(app))
        backend.record(None, task_id=result.results[0].id, state=StepState.SUCCEEDED)
        env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}

        def jobs(*args: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run([sys.executable, "-m", "jobs", "batches", *args], cwd=ROOT,
                                  env=env, capture_output=True, text=True, timeout=120)

        listed = jobs("list", "--json", "--incomplete")
        assert listed.returncode == 0, listed.stderr
        assert result.id in {row["id"] for row in json.loads(listed.stdout)}
        shown = jobs("show", result.id, "--json")
        assert shown.returncode == 0, shown.stderr
        view = json.loads(shown.stdout)
        assert (view["total"], view["pending"], view["description"]) == (2, 1, "cli")
        assert view["tallies"]["succeeded"] == 1
        assert view["callbacks"] == {"success": {"task": tasks.callback.name, "fired": False,
                                                 "task_id": None, "state": None},
                                     "complete": None}
        table = jobs("show", result.id)
        assert table.returncode == 0 and "1 pending" in table.stdout, table.stderr
        assert "succeeded" in table.stdout and tasks.callback.name in table.stdout
        assert result.id in jobs("list").stdout
        missing = jobs("show", "no-such-batch")
        assert missing.returncode == 2 and "BatchNotFound" in missing.stderr
        assert "Traceback" not in missing.stderr
        _forget(engine, *(r.id for r in result.results))
