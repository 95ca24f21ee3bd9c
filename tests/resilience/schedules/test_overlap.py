"""Overlap policies with a real `celery beat` (the schedules Scheduler) and real workers.

A 1 s entry runs a job of about 3 s (`tasks_overlap.work`: one row per execution with its
start and end, stopping early once cancelled). Every assertion is on rows: the execution
log says whether two runs of an entry ever ran at once, the run history what the policy
recorded, and the metric families what `jobs metrics` exports. One beat serves the module.
"""

from __future__ import annotations

import datetime as dt
import itertools
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import text

from resilience.cancel.view import cancel_job, cancellations
from resilience.schedules import Interval, Overlap, add, pause, run_now
from tests.harness import wait_for
from tests.resilience.schedules.conftest import Beat

pytestmark = [pytest.mark.usefixtures("tier_workers", "relay"), pytest.mark.timeout(90)]

TASK = "tests.schedules.overlap_work"
JOB_SECONDS = 3.0


@pytest.fixture(scope="module", autouse=True)
def beat(tier_workers: Any) -> Iterator[Beat]:
    """One beat process for the module's tests (each adds its own entry), started with
    the module so that it starts while the first tests (which need none) run."""
    started = Beat(f"overlap-{uuid.uuid4().hex[:6]}", {
        "RESILIENCE_BEAT_SCHEDULE": "tests.resilience.schedules.beat_schedule_fixture",
        "RESILIENCE_BEAT_POLL_SECONDS": "0.2"})
    yield started
    started.kill()


def runs(engine: Any, name: str) -> list[Any]:
    """The entry's run rows, by slot."""
    with engine.connect() as connection:
        return list(connection.execute(text(
            "SELECT id, slot, task_id, outcome, fired_at, finished_at, detail "
            "FROM resilience_schedule_runs WHERE schedule = :name ORDER BY slot"),
            {"name": name}))


def executions(engine: Any, name: str) -> list[Any]:
    """The entry's executions, by start."""
    with engine.connect() as connection:
        return list(connection.execute(text(
            "SELECT run_id, task_id, started_at, ended_at FROM schedules_test_executions "
            "WHERE tag = :name ORDER BY started_at"), {"name": name}))


def overlaps(rows: list[Any], slack_seconds: float = 0.0) -> list[tuple[Any, Any]]:
    """Pairs of executions that ran at once (one started before the other ended, less
    `slack_seconds`)."""
    found = []
    for first, second in itertools.combinations(rows, 2):
        end = first.ended_at or dt.datetime.now(dt.UTC)
        if second.started_at < end - dt.timedelta(seconds=slack_seconds):
            found.append((first, second))
    return found


def start(stores: Any, engine: Any, beat: Beat, name: str, overlap: Overlap,
          seconds: float = JOB_SECONDS) -> None:
    """Add the 1 s entry and wait for its first execution."""
    add(stores, name, task=TASK, every=Interval(1.0), args=[name, seconds], overlap=overlap,
        options={"queue": "standard"})
    assert beat.process.poll() is None, f"the beat died: see {beat.log_path}"
    wait_for(lambda: executions(engine, name), timeout_seconds=30,
             message="the first run executes")


def wind_down(app: Any, stores: Any, engine: Any, name: str) -> None:
    """Pause the entry, cancel its runs still sent (a running one stops within 0.1 s) and
    wait until none runs, so the next test has the workers to itself."""
    pause(stores, name)
    going = {row.task_id for row in runs(engine, name) if row.outcome == "sent"}
    going |= {row.task_id for row in executions(engine, name) if row.ended_at is None}
    for task_id in going:
        cancel_job(app, task_id, reason="test over")
    wait_for(lambda: all(row.ended_at for row in executions(engine, name))
             and not any(row.outcome == "sent" for row in runs(engine, name)),
             timeout_seconds=15, message="the entry's runs end")


def skipped_metric(app: Any, name: str) -> float | None:
    """`resilience_schedule_skipped_total` of the entry, as `jobs metrics` exports it."""
    from jobs.observe.metrics import view_metrics
    from jobs.tiers import TIERS
    from resilience.schedules.view import VIEW, read
    from resilience.views import Source

    snapshot = {VIEW.name: read(Source(app=app, tiers=TIERS))}
    for family in view_metrics(VIEW, snapshot):
        for sample in family.samples:
            if sample.name == "resilience_schedule_skipped_total" and \
                    sample.labels == {"schedule": name}:
                return sample.value
    return None


class TestSingleton:
    @pytest.mark.parametrize(("overlap", "second_outcome"), [
        (Overlap.SKIP, "skipped_overlap"), (Overlap.QUEUE_ONE, "succeeded")])
    def test_a_run_sent_beside_a_running_one_never_runs_beside_it(
            self, app: Any, stores: Any, engine: Any, tag: str, overlap: Overlap,
            second_outcome: str) -> None:
        """No beat: two `run_now` of a paused entry (a fire the history never held back).
        The second job meets the first's singleton on schedule:<name>: for skip it ends
        SKIPPED (run row skipped_overlap, never executed); for queue_one it is deferred
        until the first lets go, then runs. Never two executions at once."""
        name = f"{tag}-{overlap.value}-now"
        add(stores, name, task=TASK, every=Interval(3600.0), args=[name, 1.5],
            overlap=overlap, options={"queue": "standard"})
        pause(stores, name)
        first = run_now(stores, name, app=app)
        wait_for(lambda: executions(engine, name), timeout_seconds=10,
                 message="the first run executes")
        second = run_now(stores, name, app=app)
        wait_for(lambda: {row.task_id: row.outcome for row in runs(engine, name)}
                 == {first: "succeeded", second: second_outcome}, timeout_seconds=15,
                 message="both runs end")
        done = executions(engine, name)
        assert [row.task_id for row in done] == (
            [first] if overlap is Overlap.SKIP else [first, second])
        assert overlaps(done) == []


class TestSkip:
    def test_never_runs_twice_at_once_and_records_skipped_slots(
            self, app: Any, stores: Any, engine: Any, tag: str, beat: Beat) -> None:
        """skip: while a run is going, each slot is recorded skipped_overlap and nothing
        is sent; then, with the history made stale (the running run's row rewritten as
        succeeded, as if its outcome came early), the next slots are sent but the job's
        singleton on schedule:<name> skips them: their rows say skipped_overlap too. The
        execution log never shows two runs at once; the metric counts every skipped slot."""
        name = f"{tag}-skip"
        start(stores, engine, beat, name, Overlap.SKIP)
        wait_for(lambda: sum(row.outcome == "succeeded" for row in runs(engine, name)) >= 1
                 and len(executions(engine, name)) >= 2, timeout_seconds=15,
                 message="a second run after the first ended")
        rows = runs(engine, name)
        by_history = [row for row in rows if row.outcome == "skipped_overlap"]
        assert len(by_history) >= 2, "slots during a run are recorded skipped_overlap"
        assert all(row.task_id is None for row in by_history), "a skipped slot was sent"

        # Stale history: the running run's row says it ended while it still runs.
        running = wait_for(lambda: next((row for row in executions(engine, name)
                                         if row.ended_at is None), None),
                           timeout_seconds=5, message="a run in progress")
        with engine.begin() as connection:
            connection.execute(text("UPDATE resilience_schedule_runs SET outcome = "
                                    "'succeeded' WHERE id = :id"), {"id": running.run_id})
        wait_for(lambda: any(row.task_id is not None and row.outcome == "skipped_overlap"
                             for row in runs(engine, name)), timeout_seconds=10,
                 message="a sent run skipped by the singleton")
        wind_down(app, stores, engine, name)

        rows, done = runs(engine, name), executions(engine, name)
        assert overlaps(done) == [], "two runs of a skip entry ran at once"
        by_singleton = [row for row in rows
                        if row.task_id is not None and row.outcome == "skipped_overlap"]
        assert by_singleton and all(row.id not in {run.run_id for run in done}
                                    for row in by_singleton), "a skipped run executed"
        assert all(row.detail.get("guard") == "schedule-singleton" for row in by_singleton)
        skipped = sum(row.outcome == "skipped_overlap" for row in rows)
        assert skipped_metric(app, name) == skipped


class TestCancelPrevious:
    def test_each_slot_cancels_the_previous_run_and_leaves_one_running(
            self, app: Any, stores: Any, engine: Any, tag: str, beat: Beat) -> None:
        """cancel_previous: each slot cancels the run before it (its row: cancelled, its
        job cancelled through resilience.cancel, so it stops) and sends a new one; at any
        moment at most one run is sent, and after five slots exactly one runs."""
        name = f"{tag}-cancel"
        start(stores, engine, beat, name, Overlap.CANCEL_PREVIOUS)
        most_sent = 0
        deadline = time.monotonic() + 15
        while len([row for row in runs(engine, name) if row.task_id]) < 5:
            assert time.monotonic() < deadline, "five slots did not fire"
            most_sent = max(most_sent, sum(row.outcome == "sent"
                                           for row in runs(engine, name)))
            time.sleep(0.1)
        rows = runs(engine, name)
        assert most_sent == 1
        sent = [row for row in rows if row.outcome == "sent"]
        assert len(sent) == 1 and sent[0].slot == rows[-1].slot, "the newest run is running"
        cancelled = [row for row in rows if row.outcome == "cancelled"]
        assert len(cancelled) == len(rows) - 1 >= 4
        assert all("cancelled_by_slot" in row.detail for row in cancelled)
        recorded = {entry.task_id for entry in cancellations(app).describe(limit=1000)}
        assert {row.task_id for row in cancelled} <= recorded, "cancelled through the store"
        # The cancelled jobs stopped: executions overlap only while a cancellation lands.
        wait_for(lambda: sum(row.ended_at is None for row in executions(engine, name)) <= 1,
                 timeout_seconds=5, message="the cancelled runs stop")
        assert overlaps(executions(engine, name), slack_seconds=1.0) == []
        wind_down(app, stores, engine, name)


class TestQueueOne:
    def test_one_queued_run_fired_when_the_previous_ends(
            self, app: Any, stores: Any, engine: Any, tag: str, beat: Beat) -> None:
        """queue_one: while a run is going, the first slot is queued and the others are
        skipped_overlap; never more than one queued; the queued run fires within a tick
        or so after the previous ends, and no two runs ever run at once."""
        name = f"{tag}-queue"
        start(stores, engine, beat, name, Overlap.QUEUE_ONE, seconds=2.0)
        most_queued = 0
        deadline = time.monotonic() + 20
        while sum(1 for row in runs(engine, name)
                  if row.task_id and "behind_run" in (row.detail or {})) < 2:
            assert time.monotonic() < deadline, "two queued runs did not fire"
            most_queued = max(most_queued, sum(row.outcome == "queued"
                                               for row in runs(engine, name)))
            time.sleep(0.1)
        wind_down(app, stores, engine, name)

        rows, done = runs(engine, name), executions(engine, name)
        assert most_queued == 1
        assert overlaps(done) == [], "two runs of a queue_one entry ran at once"
        by_id = {row.id: row for row in rows}
        released = [row for row in rows if row.task_id and "behind_run" in row.detail]
        for row in released:
            behind = by_id[row.detail["behind_run"]]
            assert behind.finished_at is not None and row.fired_at >= behind.finished_at
            assert (row.fired_at - behind.finished_at).total_seconds() < 2.0, "fired late"
        assert any(row.outcome == "skipped_overlap" and "queued_run" in row.detail
                   for row in rows), "a slot while one is queued is skipped"
