"""The scheduler fires only as a confirmed leader: a fire whose last check of the leader
session is stale (`CHECK_VALID_SECONDS`) checks again first, and a dead session fires
nothing (moved from the leader-elected beat's tests, issue 25)."""

from __future__ import annotations

import datetime as dt
import time
from typing import Any

from sqlalchemy import text

from resilience.locks.beat import CHECK_VALID_SECONDS
from resilience.schedules import Interval, add, recent_runs
from resilience.schedules.scheduler import Scheduler


def make_due(engine: Any, name: str) -> None:
    with engine.begin() as connection:
        connection.execute(text("UPDATE resilience_schedules SET last_slot = "
                                "clock_timestamp() - interval '3 seconds' WHERE name = :name"),
                           {"name": name})


class TestFireAfterAStaleCheck:
    def test_a_stale_check_is_repeated_and_a_dead_session_fires_nothing(
            self, app: Any, stores: Any, engine: Any, tag: str) -> None:
        """A leader whose last check is older than CHECK_VALID_SECONDS checks again before
        firing (alive: it fires); when its session was terminated meanwhile, nothing fires
        and the scheduler steps down."""
        name = f"{tag}-checked"
        add(stores, name, task="tests.schedules.record", every=Interval(1.0), args=[tag],
            options={"queue": "nowhere"})
        scheduler = Scheduler(app, lazy=True)
        leadership = scheduler.leadership
        try:
            assert leadership.ensure(), "the scheduler leads (no other beat runs in tests)"
            # It has led for a while: the due slot fell while it led (on time, not missed).
            leadership.leading_since_wall -= dt.timedelta(hours=1)
            make_due(engine, name)
            entry = next(row for row in _rows(stores) if row.name == name)

            stale = time.monotonic() - CHECK_VALID_SECONDS - 1
            leadership.checked_at = stale
            scheduler._fire_due(_store(stores), entry, _now())
            assert leadership.is_leader and leadership.checked_at > stale
            sent = _sent(stores, name)
            assert sent >= 1

            make_due(engine, name)
            entry = next(row for row in _rows(stores) if row.name == name)
            with engine.begin() as connection:
                connection.execute(text("SELECT pg_terminate_backend(:pid)"),
                                   {"pid": leadership.session.backend_pid})
            leadership.checked_at = time.monotonic() - CHECK_VALID_SECONDS - 1
            assert scheduler._fire_due(_store(stores), entry, _now()) is None
            assert not leadership.is_leader and leadership.session is None
            assert _sent(stores, name) == sent, "a leader with a dead session fired"
        finally:
            scheduler.close()
            with engine.begin() as connection:
                connection.execute(text("DELETE FROM resilience_outbox WHERE "
                                        "options->>'queue' = 'nowhere'"))


def _sent(stores: Any, name: str) -> int:
    return sum(run.outcome.value == "sent" for run in recent_runs(stores, name))


def _store(stores: Any) -> Any:
    from resilience.schedules.store import schedule_store

    return schedule_store(stores)


def _rows(stores: Any) -> list[Any]:
    return _store(stores).read_all()


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


class TestABrokenEntry:
    def test_an_entry_that_cannot_be_planned_does_not_stop_the_others(
            self, app: Any, stores: Any, engine: Any, tag: str) -> None:
        """A cron row whose time zone is unknown (written behind the API's back, or a zone
        tzdata dropped) is skipped with an error; the other entries of the tick fire."""
        good, broken = f"{tag}-good", f"{tag}-broken"
        for name in (good, broken):
            add(stores, name, task="tests.schedules.record", every=Interval(1.0), args=[tag],
                options={"queue": "nowhere"})
        make_due(engine, good)
        with engine.begin() as connection:
            connection.execute(text(
                "UPDATE resilience_schedules SET kind = 'cron', cron = '* * * * *', "
                "timezone = 'Nowhere/Atlantis', every_seconds = NULL WHERE name = :name"),
                {"name": broken})
        scheduler = Scheduler(app, lazy=True)
        try:
            assert scheduler.leadership.ensure()
            scheduler.leadership.leading_since_wall -= dt.timedelta(hours=1)
            scheduler.seeded = True  # this test is about the tick, not the code schedule
            scheduler.run_due()
            assert _sent(stores, good) >= 1
            assert recent_runs(stores, broken) == []
        finally:
            scheduler.close()
            with engine.begin() as connection:
                connection.execute(text("DELETE FROM resilience_outbox WHERE "
                                        "options->>'queue' = 'nowhere'"))
