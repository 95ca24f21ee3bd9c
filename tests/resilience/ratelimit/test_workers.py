"""Limits across real worker processes: outcomes recorded in PostgreSQL, never in logs."""

from __future__ import annotations

import os
import signal
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import text

from resilience.counters import read_all
from resilience.ratelimit import LEASE
from tests.resilience.ratelimit import tasks
from tests.resilience.ratelimit.test_algorithms import max_in_window
from tests.support import Worker, running, wait_for

pytestmark = [pytest.mark.timeout(180)]


@pytest.fixture()
def tables(engine: Any) -> None:
    with engine.begin() as connection:
        connection.execute(
            text(
                "CREATE TABLE IF NOT EXISTS ratelimit_test_runs (run_id text NOT NULL, n int, "
                "phase text NOT NULL, at double precision NOT NULL, pid int)"
            )
        )
        connection.execute(
            text(
                "CREATE TABLE IF NOT EXISTS ratelimit_test_grants (run_id text NOT NULL, "
                "limit_key text NOT NULL, granted_at double precision NOT NULL, pid int)"
            )
        )


@pytest.fixture(scope="module")
def three_workers(app: Any) -> Iterator[list[Worker]]:
    """Three worker processes (one pool process each) on the standard tier, for the module."""
    with running(
        Worker("standard", name=f"limits-{i}", concurrency=1) for i in range(3)
    ) as workers:
        yield workers


def rows(engine: Any, sql: str, **params: Any) -> list[Any]:
    with engine.connect() as connection:
        return list(connection.execute(text(sql), params))


def max_overlap(intervals: list[tuple[float, float]]) -> int:
    """Most intervals open at one instant (an end at t closes before a start at t)."""
    events = sorted(
        [(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals],
        key=lambda event: (event[0], event[1]),
    )
    best = running = 0
    for _, delta in events:
        running += delta
        best = max(best, running)
    return best


class TestConcurrencyLimit:
    def test_never_more_than_limit_running(
        self, three_workers: list[Worker], tables: None, engine: Any, redis_client: Any
    ) -> None:
        """3 workers, limit 2: the bodies' start/end rows never overlap more than 2 deep."""
        run_id, jobs = uuid.uuid4().hex, 10
        for n in range(jobs):
            tasks.limited_slot.delay(run_id, n)
        wait_for(
            lambda: (
                rows(
                    engine,
                    "SELECT count(*) FROM ratelimit_test_runs WHERE run_id = :r AND phase = 'end'",
                    r=run_id,
                )[0][0]
                == jobs
            ),
            timeout_seconds=120,
            message="all limited jobs to finish",
        )
        found = rows(
            engine, "SELECT n, phase, at FROM ratelimit_test_runs WHERE run_id = :r", r=run_id
        )
        starts = {n: at for n, phase, at in found if phase == "start"}
        ends = {n: at for n, phase, at in found if phase == "end"}
        assert sorted(starts) == list(range(jobs))
        assert max_overlap([(starts[n], ends[n]) for n in starts]) <= tasks.SLOTS
        [guard] = [g for g in tasks.limited_slot.pipelines()[0].guards if g.name == "concurrency"]
        [state] = guard.backend.describe(LEASE, "tests-slots")
        assert state.used == 0

    @pytest.mark.chaos
    def test_killed_holder_slot_returns_after_its_lease(
        self, three_workers: list[Worker], tables: None, engine: Any, redis_client: Any
    ) -> None:
        """SIGKILL the slot holder: its lease is reclaimed and the redelivered job then runs.

        The second grant comes no earlier than the dead holder's lease end (the slot was not
        handed out twice) and it comes (the slot was not lost).
        """
        run_id = uuid.uuid4().hex
        tasks.hold_slot.delay(run_id)
        first = wait_for(
            lambda: rows(
                engine, "SELECT pid FROM ratelimit_test_runs WHERE run_id = :r AND n = 0", r=run_id
            ),
            timeout_seconds=60,
            message="the holder to start",
        )
        os.kill(first[0][0], signal.SIGKILL)
        wait_for(
            lambda: rows(
                engine,
                "SELECT 1 FROM ratelimit_test_runs WHERE run_id = :r AND n = 1 AND phase = 'end'",
                r=run_id,
            ),
            timeout_seconds=90,
            message="the redelivered job to run",
        )
        grants = sorted(
            at
            for (at,) in rows(
                engine, "SELECT granted_at FROM ratelimit_test_grants WHERE run_id = :r", r=run_id
            )
        )
        assert len(grants) == 2
        assert grants[1] >= grants[0] + tasks.KILL_LEASE_SECONDS
        deferred = [
            value
            for labels, value in read_all(redis_client)
            if labels["guard"] == "concurrency"
            and labels["outcome"] == "DEFERRED"
            and labels["name"] == "tests-hold"
        ]
        assert deferred and deferred[0] >= 1


class TestRateLimit:
    @pytest.mark.parametrize("task_name", ["windowed", "smoothed"])
    def test_no_window_exceeds_the_limit(
        self, three_workers: list[Worker], tables: None, engine: Any, task_name: str
    ) -> None:
        """Across 3 workers every window of one period holds at most `limit` grants."""
        task = getattr(tasks, task_name)
        run_id, jobs = uuid.uuid4().hex, 12
        for n in range(jobs):
            task.delay(run_id, n)
        wait_for(
            lambda: (
                rows(
                    engine, "SELECT count(*) FROM ratelimit_test_grants WHERE run_id = :r", r=run_id
                )[0][0]
                >= jobs
            ),
            timeout_seconds=120,
            message="all permits to be granted",
        )
        grants = [
            at
            for (at,) in rows(
                engine, "SELECT granted_at FROM ratelimit_test_grants WHERE run_id = :r", r=run_id
            )
        ]
        assert len(grants) == jobs
        assert max_in_window(grants, tasks.RATE_PERIOD_SECONDS) <= tasks.RATE_LIMIT
