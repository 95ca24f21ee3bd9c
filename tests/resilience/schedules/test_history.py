"""Run history retention (`prune_runs`) and the metrics query on real PostgreSQL, without a
beat or workers: run rows are written directly, as the fire transaction and the guard would."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import pytest
from sqlalchemy import text

from resilience.errors import ConfigurationError
from resilience.schedules import (
    Interval,
    InvalidSchedule,
    add,
    history_days_of,
    prune_runs,
)
from resilience.schedules.store import schedule_store

TASK = "tests.schedules.record"
NOW = dt.datetime.now(dt.UTC).replace(microsecond=0)
OLD = NOW - dt.timedelta(days=10)


def write_runs(engine: Any, name: str, rows: list[tuple[dt.datetime, str, dict | None]]) -> None:
    with engine.begin() as connection:
        connection.execute(text(
            "INSERT INTO resilience_schedule_runs (schedule, slot, outcome, detail) "
            "VALUES (:name, :slot, :outcome, CAST(:detail AS JSONB))"),
            [{"name": name, "slot": slot, "outcome": outcome,
              "detail": None if detail is None else json.dumps(detail)}
             for slot, outcome, detail in rows])


def slots_left(engine: Any, name: str) -> list[tuple[dt.datetime, str]]:
    with engine.connect() as connection:
        return [(row.slot, row.outcome) for row in connection.execute(text(
            "SELECT slot, outcome FROM resilience_schedule_runs WHERE schedule = :name "
            "ORDER BY slot"), {"name": name})]


def old(i: int) -> dt.datetime:
    return OLD + dt.timedelta(seconds=i)


def recent(i: int) -> dt.datetime:
    return NOW - dt.timedelta(hours=1) + dt.timedelta(seconds=i)


class TestPrune:
    def test_old_finished_rows_go_the_newest_and_unfinished_stay_counters_hold(
            self, stores: Any, engine: Any, tag: str) -> None:
        busy, small, fresh = f"{tag}-busy", f"{tag}-small", f"{tag}-fresh"
        for name in (busy, small, fresh):
            add(stores, name, task=TASK, every=Interval(1.0), paused=True)
        # busy: 40 old rows (a sent and a queued run the oldest, 5 missed, one of them
        # counting 7 more, 3 skipped_overlap, 30 succeeded) and 10 recent succeeded.
        outcomes = (["sent", "queued"] + ["missed"] * 5 + ["skipped_overlap"] * 3
                    + ["succeeded"] * 30)
        write_runs(engine, busy, [
            (old(i), outcome, {"also_missed": 7} if i == 2 else None)
            for i, outcome in enumerate(outcomes)]
            + [(recent(i), "succeeded", None) for i in range(10)])
        write_runs(engine, small, [(old(i), "failed", None) for i in range(5)])
        write_runs(engine, fresh, [(recent(i), "succeeded", None) for i in range(30)])
        store = schedule_store(stores)
        before = store.run_totals()[busy]
        assert (before.missed, before.skipped) == (12, 3)

        report = prune_runs(stores, history_days=7, keep_last=20, batch_size=7)

        assert report["done"] is True and report["deleted"] >= 28
        left = slots_left(engine, busy)
        # The sent and queued runs, the 10 newest old ones and the 10 recent ones.
        assert left == ([(old(0), "sent"), (old(1), "queued")]
                        + [(old(i), "succeeded") for i in range(30, 40)]
                        + [(recent(i), "succeeded") for i in range(10)])
        assert len(slots_left(engine, small)) == 5  # fewer than keep_last: all kept
        assert len(slots_left(engine, fresh)) == 30  # within the retention: all kept
        after = store.run_totals()[busy]
        assert after == before  # counters never go down; newest success, oldest slot kept
        with engine.connect() as connection:
            pruned = connection.execute(text(
                "SELECT pruned_missed, pruned_skipped FROM resilience_schedules "
                "WHERE name = :name"), {"name": busy}).one()
        assert tuple(pruned) == (12, 3)
        # Nothing more to do: a second pass deletes none of these.
        prune_runs(stores, history_days=7, keep_last=20)
        assert len(slots_left(engine, busy)) == 22
        assert store.run_totals()[busy] == before

    def test_a_time_budget_stops_between_batches(self, stores: Any, engine: Any,
                                                 tag: str) -> None:
        name = f"{tag}-budget"
        add(stores, name, task=TASK, every=Interval(1.0), paused=True)
        write_runs(engine, name, [(old(i), "succeeded", None) for i in range(50)])
        report = prune_runs(stores, keep_last=1, batch_size=10, time_budget_seconds=1e-9)
        assert report["done"] is False
        prune_runs(stores, keep_last=1, batch_size=10)
        assert slots_left(engine, name) == [(old(49), "succeeded")]

    def test_bad_arguments_and_settings_get_one_clear_error(self, stores: Any) -> None:
        for bad in ({"history_days": 0}, {"keep_last": 0}, {"keep_last": 2.5},
                    {"batch_size": -1}, {"time_budget_seconds": True}):
            with pytest.raises(InvalidSchedule):
                prune_runs(stores, **bad)
        assert history_days_of({}) == 7.0
        assert history_days_of({"resilience_schedule_history_days": "2"}) == 2.0
        for bad in ("soon", 0, -1, True):
            with pytest.raises(ConfigurationError):
                history_days_of({"resilience_schedule_history_days": bad})

    def test_the_platform_schedules_it(self) -> None:
        from jobs.schedule import SCHEDULE

        entry = SCHEDULE["schedule-history-prune"]
        assert entry["task"] == "jobs.maintenance.prune_schedule_runs"
        assert entry.get("catch_up", "skip") == "skip"


class TestMetricsQuery:
    def test_every_part_reads_an_index_not_the_run_rows(self, stores: Any, engine: Any,
                                                        tag: str) -> None:
        """With sequential scans priced out, no part of the metrics query scans the run
        table or walks a whole index: each per-schedule count or slot is an index probe on
        its schedule (a GROUP BY over every row, the previous query, reads them all)."""
        from resilience.schedules.store import _RUN_TOTALS

        add(stores, f"{tag}-m", task=TASK, every=Interval(1.0), paused=True)
        with engine.begin() as connection:
            connection.execute(text("SET LOCAL enable_seqscan = off"))
            plan = json.dumps(connection.execute(
                text(f"EXPLAIN (FORMAT JSON) {_RUN_TOTALS.text}")).scalar())
        assert "resilience_schedule_runs" in plan
        runs_scans = [part for part in plan.split('"Node Type"')
                      if '"Relation Name": "resilience_schedule_runs"' in part]
        assert runs_scans and not any('"Seq Scan"' in part for part in runs_scans)
        # Each is a probe of one schedule's range, not a walk of a whole index.
        assert all('"Index Cond"' in part and "schedule" in part for part in runs_scans)


def test_a_platform_task_has_one_schedule_run_guard() -> None:
    """ScheduleRunGuard is a library default only; the platform's task base does not list
    it again (the pipeline would keep one of the same name anyway)."""
    from jobs.maintenance import prune_schedule_runs
    from jobs.platform import JobTask
    from resilience.schedules import ScheduleRunGuard

    assert not any(isinstance(guard, ScheduleRunGuard) for guard in JobTask.guards)
    execution = prune_schedule_runs.pipelines()[0].guards
    assert sum(isinstance(guard, ScheduleRunGuard) for guard in execution) == 1
