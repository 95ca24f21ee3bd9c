"""Bulk requeue of dead letters: once per row across concurrent operators, through the outbox."""

from __future__ import annotations

import datetime as dt
import multiprocessing
import uuid
from typing import Any

import pytest
import sqlalchemy as sa
from typer.testing import CliRunner

from resilience.deadletter.bulk import (
    NOT_DECODED,
    NOT_REGISTERED,
    InvalidSelection,
    Selection,
    parse_since,
    requeue_many,
)
from resilience.deadletter.models import dead_letters
from resilience.deadletter.place import get
from resilience.outbox.models import outbox


def _insert(engine: Any, task_name: str, reason: str, count: int, **row: Any) -> list[int]:
    """`count` pending dead letters of `task_name` with `reason`; their ids in order."""
    rows = [
        {"task_name": task_name, "task_id": f"old-{index}", "args": [index], "kwargs": {},
         "guard": "retry", "reason": reason, "attempts": 1, "queue": "standard", **row}
        for index in range(count)
    ]
    with engine.begin() as connection:
        ids = connection.execute(
            dead_letters.insert().returning(dead_letters.c.id), rows
        ).scalars().all()
    return sorted(ids)


def _outbox_rows(engine: Any, task_ids: list[str]) -> list[Any]:
    with engine.connect() as connection:
        return connection.execute(
            sa.select(outbox.c.task_id, outbox.c.args).where(outbox.c.task_id.in_(task_ids))
        ).all()


def _drop_outbox_rows(engine: Any, task_name: str) -> None:
    """These tests never run the jobs: keep the relay of later tests from publishing them."""
    with engine.begin() as connection:
        connection.execute(outbox.delete().where(outbox.c.task_name == task_name,
                                                 outbox.c.state == "pending"))


def _requeued(engine: Any, ids: list[int]) -> dict[int, str | None]:
    with engine.connect() as connection:
        return dict(connection.execute(
            sa.select(dead_letters.c.id, dead_letters.c.requeued_task_id)
            .where(dead_letters.c.id.in_(ids))
        ).all())


class TestConcurrentOperators:
    ROWS = 1_000

    @pytest.mark.timeout(240)
    def test_two_processes_requeue_each_row_once(self, app: Any, engine: Any) -> None:
        """Two OS processes requeue the same 1,000 dead letters at once: each row is claimed
        by exactly one of them and marked once, and the outbox holds exactly one job per row,
        with the row's arguments."""
        from tests.resilience.deadletter.operators import requeue_at_once
        from tests.resilience.deadletter.tasks import bulk_echo

        reason = f"bulk {uuid.uuid4().hex}"
        ids = _insert(engine, bulk_echo.name, reason, self.ROWS)
        context = multiprocessing.get_context("fork")
        barrier, results = context.Barrier(2), context.Queue()
        operators = [context.Process(target=requeue_at_once, args=(barrier, results, reason, 50))
                     for _ in range(2)]
        try:
            for operator in operators:
                operator.start()
            reports = [results.get(timeout=200) for _ in operators]
            for operator in operators:
                operator.join(timeout=30)
                assert operator.exitcode == 0
            claimed = [entry_id for report in reports for entry_id, _ in report]
            assert sorted(claimed) == ids  # each row by exactly one operator
            marked = _requeued(engine, ids)
            task_ids = [task_id for report in reports for _, task_id in report]
            assert sorted(marked.values()) == sorted(task_ids)
            assert len(set(task_ids)) == self.ROWS
            jobs = _outbox_rows(engine, task_ids)
            assert len(jobs) == self.ROWS  # one job per row, none twice
            by_task_id = {task_id: args for task_id, args in jobs}
            with engine.connect() as connection:
                originals = dict(connection.execute(
                    sa.select(dead_letters.c.requeued_task_id, dead_letters.c.args)
                    .where(dead_letters.c.id.in_(ids))).all())
            assert by_task_id == originals  # each job carries its row's arguments
        finally:
            for operator in operators:
                if operator.is_alive():
                    operator.kill()
            _drop_outbox_rows(engine, bulk_echo.name)

    def test_rows_another_run_holds_are_left_to_it(self, app: Any, engine: Any) -> None:
        """A run passes over rows another transaction holds (SKIP LOCKED) and requeues the
        rest; once released, the next run takes the rows passed over, and nothing twice."""
        from tests.resilience.deadletter.tasks import bulk_echo

        reason = f"held {uuid.uuid4().hex}"
        ids = _insert(engine, bulk_echo.name, reason, 6)
        try:
            with engine.connect() as holder, holder.begin():
                holder.execute(sa.select(dead_letters.c.id)
                               .where(dead_letters.c.id.in_(ids[:2])).with_for_update())
                first = requeue_many(engine, app, Selection(reason=reason), batch_size=2)
            assert [entry_id for entry_id, _ in first.requeued] == ids[2:]
            second = requeue_many(engine, app, Selection(reason=reason))
            assert [entry_id for entry_id, _ in second.requeued] == ids[:2]
            assert requeue_many(engine, app, Selection(reason=reason)).requeued == []
            task_ids = [task_id for _, task_id in first.requeued + second.requeued]
            assert len(_outbox_rows(engine, task_ids)) == 6
        finally:
            _drop_outbox_rows(engine, bulk_echo.name)


class TestRefusals:
    def test_rows_that_cannot_run_are_skipped_and_kept(self, app: Any, engine: Any) -> None:
        """A raw message that never decoded, an unregistered task and arguments that do not
        bind are skipped with their reason and stay pending; the good row is requeued; a dry
        run changes nothing."""
        from jobs.admin.dead_letters import cli
        from tests.resilience.deadletter.tasks import bulk_echo

        reason = f"refusals {uuid.uuid4().hex}"
        [good] = _insert(engine, bulk_echo.name, reason, 1)
        [raw] = _insert(engine, bulk_echo.name, reason, 1, raw_message={"runnable": False})
        [unknown] = _insert(engine, "tests.nowhere.unregistered", reason, 1)
        [unbound] = _insert(engine, bulk_echo.name, reason, 1, args=[1, 2, 3])
        refused = [raw, unknown, unbound]
        runner = CliRunner()
        try:
            dry = runner.invoke(cli, ["requeue", "--reason", reason, "--dry-run"])
            assert dry.exit_code == 0, dry.output
            assert "would requeue 1 dead letters" in dry.output
            assert _requeued(engine, [good, *refused]) == dict.fromkeys([good, *refused])

            done = runner.invoke(cli, ["requeue", "--reason", reason, "--since", "1h"])
            assert done.exit_code == 0, done.output
            assert "requeued 1 dead letters" in done.output and "skipped 3" in done.output
            marked = _requeued(engine, [good, *refused])
            assert marked[good] is not None
            assert all(marked[entry_id] is None for entry_id in refused)
            assert len(_outbox_rows(engine, [marked[good]])) == 1

            again = requeue_many(engine, app, Selection(reason=reason))
            assert again.requeued == []
            assert again.skipped == {
                NOT_DECODED: [raw],
                NOT_REGISTERED: [unknown],
                "arguments refused: ArgumentsDoNotBind": [unbound],
            }
            assert get(engine, unbound).requeued_at is None
        finally:
            _drop_outbox_rows(engine, bulk_echo.name)

    def test_usage_errors_are_one_line(self, app: Any) -> None:
        """No selection, a bad --since, or an ID with filters: exit 2 with one line."""
        from jobs.admin.dead_letters import cli

        runner = CliRunner()
        for arguments in (["requeue"], ["requeue", "--since", "yesterday"],
                          ["requeue", "7", "--task", "x"]):
            result = runner.invoke(cli, arguments)
            assert result.exit_code == 2, (arguments, result.output)
            assert result.exception is None or isinstance(result.exception, SystemExit)


class TestSince:
    def test_durations_and_iso(self) -> None:
        """Durations count back from now; ISO values are instants (naive: UTC)."""
        now = dt.datetime(2026, 11, 24, 12, 0, tzinfo=dt.UTC)
        assert parse_since("1h30m", now=now) == now - dt.timedelta(minutes=90)
        assert parse_since("7d", now=now) == now - dt.timedelta(days=7)
        assert parse_since("2026-11-20T10:00", now=now) == dt.datetime(
            2026, 11, 20, 10, tzinfo=dt.UTC)
        with pytest.raises(InvalidSelection):
            parse_since("last tuesday", now=now)
