"""The schedules core without beat processes: the catch-up plan, the one-transaction fire
(two firing at once), seeding, the API's answers to bad input, and the run history the
guard records on real workers."""

from __future__ import annotations

import datetime as dt
import threading
from typing import Any

import pytest
from sqlalchemy import text

from resilience.schedules import (
    CatchUp,
    Cron,
    Interval,
    InvalidSchedule,
    Overlap,
    RunOutcome,
    ScheduleNotFound,
    add,
    describe,
    edit,
    listing,
    pause,
    recent_runs,
    remove,
    resume,
    run_now,
)
from resilience.schedules.catchup import FIRE_LIMIT, RECORD_LIMIT, plan
from resilience.schedules.overlap import decide
from resilience.schedules.seed import code_entries, entry_values
from resilience.schedules.store import schedule_store
from tests.harness import wait_for

EPOCH = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def at(seconds: float) -> dt.datetime:
    return EPOCH + dt.timedelta(seconds=seconds)


def fired(planned: Any) -> list[float]:
    return [(slot - EPOCH).total_seconds() for slot, _ in planned.fire]


def missed(planned: Any) -> list[float]:
    return [(slot - EPOCH).total_seconds() for slot in planned.missed]


class TestCatchUpPlan:
    """The 2 s entry of issue 28: last slot 0, no leader until 7.2 s (3.5 periods), then a
    leader ticks at 7.5 s: slots 2, 4 and 6 were missed."""

    def test_skip_fires_none_of_the_missed_slots_and_records_each(self) -> None:
        """skip: 0 fired, 3 recorded missed; the next on-time slot fires."""
        planned = plan(Interval(2), at(0), at(7.5), at(7.2), CatchUp.SKIP, 3600)
        assert (fired(planned), missed(planned), planned.last_slot) == ([], [2, 4, 6], at(6))
        assert fired(plan(Interval(2), at(6), at(8.01), at(7.2), CatchUp.SKIP, 3600)) == [8]

    def test_once_fires_one_for_all(self) -> None:
        """once: the newest missed slot fires, the two others are recorded missed."""
        planned = plan(Interval(2), at(0), at(7.5), at(7.2), CatchUp.ONCE, 3600)
        assert (fired(planned), missed(planned)) == ([6], [2, 4])

    def test_all_fires_each_within_the_window_oldest_first(self) -> None:
        """all: 2, 4, 6 fire in order; with a 3 s window only 6 fires, 2 and 4 are missed."""
        planned = plan(Interval(2), at(0), at(7.5), at(7.2), CatchUp.ALL, 3600)
        assert (fired(planned), missed(planned)) == ([2, 4, 6], [])
        planned = plan(Interval(2), at(0), at(7.5), at(7.2), CatchUp.ALL, 3)
        assert (fired(planned), missed(planned)) == ([6], [2, 4])

    def test_a_continuous_leader_fires_on_time_and_misses_nothing(self) -> None:
        """Slots that fell while this leader led fire, late or not (a slow tick, a stalled
        leader), oldest first; nothing is missed."""
        planned = plan(Interval(2), at(4), at(6.9), at(0), CatchUp.SKIP, 3600)
        assert (fired(planned), missed(planned), planned.last_slot) == ([6], [], at(6))
        assert plan(Interval(2), at(6), at(7.9), at(0), CatchUp.SKIP, 3600).empty
        planned = plan(Interval(0.1), at(1), at(1.35), at(0), CatchUp.SKIP, 3600)
        assert (fired(planned), missed(planned)) == ([1.1, 1.2, 1.3], [])
        planned = plan(Interval(0.1), at(1), at(1.35), at(1.15), CatchUp.SKIP, 3600)
        assert (fired(planned), missed(planned)) == ([1.2, 1.3], [1.1])

    def test_a_long_outage_records_a_bounded_number_of_rows(self) -> None:
        """A day without a leader for a 0.1 s entry: RECORD_LIMIT rows and a count of the
        rest; `all` fires at most FIRE_LIMIT per tick, from the oldest in the window."""
        now = at(86_400)
        planned = plan(Interval(0.1), at(0), now, now, CatchUp.SKIP, 3600)
        assert len(planned.missed) == RECORD_LIMIT
        assert planned.also_missed + RECORD_LIMIT == 864_000 - 1
        assert fired(planned) == [86_400]
        planned = plan(Interval(0.1), at(0), now, now, CatchUp.ALL, 60)
        assert len(planned.fire) == FIRE_LIMIT
        assert fired(planned)[0] == pytest.approx(86_400 - 60)
        assert planned.last_slot == planned.fire[-1][0]
        assert len(planned.missed) + planned.also_missed == 864_000 - 601  # (0, now - 60)

    def test_a_new_entry_starts_from_now(self) -> None:
        """No last slot: nothing fires; the current slot is the starting point."""
        planned = plan(Interval(2), None, at(7.5), at(0), CatchUp.ALL, 3600)
        assert (planned.fire, planned.missed, planned.last_slot) == ([], [], at(6))

    def test_cron_slots_in_their_time_zone(self) -> None:
        """A cron entry's slots are its fire times (half-hours, in Paris): all four fell
        before the leader started, once fires the newest; skip with the last one on time."""
        every = Cron("*/30 * * * *", timezone="Europe/Paris")
        planned = plan(every, at(0), at(7_300), at(7_250), CatchUp.ONCE, 3600)
        assert (fired(planned), missed(planned)) == ([7_200], [1_800, 3_600, 5_400])
        planned = plan(every, at(0), at(7_300), at(7_000), CatchUp.SKIP, 3600)
        assert (fired(planned), missed(planned)) == ([7_200], [1_800, 3_600, 5_400])


def due_now(stores: Any, name: str, period: float = 1.0) -> Any:
    """Make `name` due now: its last slot three periods ago."""
    with stores.engine().begin() as connection:
        connection.execute(text(
            "UPDATE resilience_schedules SET last_slot = clock_timestamp() - "
            "make_interval(secs => :seconds) WHERE name = :name"),
            {"seconds": 3 * period, "name": name})
    return schedule_store(stores).read(name)


def outbox_rows(engine: Any, run_ids: list[int]) -> int:
    with engine.connect() as connection:
        return int(connection.execute(text(
            "SELECT count(*) FROM resilience_outbox WHERE "
            "CAST(options->'headers'->>'resilience_schedule_run' AS bigint) = ANY(:ids)"),
            {"ids": run_ids}).scalar_one())


class TestFire:
    def test_two_fires_of_the_same_slots_at_once_fire_them_once(
            self, stores: Any, engine: Any, tag: str) -> None:
        """Eight threads run the same fire (as eight beats that all think they lead):
        each slot gets one run row and one outbox row; the others do nothing."""
        name = f"{tag}-race"
        add(stores, name, task="tests.schedules.record", every=Interval(1.0), args=[tag],
            catch_up=CatchUp.ALL, options={"queue": "nowhere"})
        entry = due_now(stores, name)
        now = dt.datetime.now(dt.UTC)
        planned = plan(entry.every, entry.last_slot, now, now - dt.timedelta(seconds=10),
                       CatchUp.ALL, 3600)
        assert len(planned.fire) == 3
        store = schedule_store(stores)
        results: list[Any] = []
        barrier = threading.Barrier(8)

        def fire() -> None:
            barrier.wait()
            results.append(store.fire(entry, planned, decide=decide))

        threads = [threading.Thread(target=fire) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        sent = [run for result in results for run in result.sent]
        assert len(sent) == 3 and sum(result.stale for result in results) == 7
        runs = recent_runs(stores, name)
        assert sorted(run.slot for run in runs) == [slot for slot, _ in planned.fire]
        assert outbox_rows(engine, [run.id for run in runs]) == 3
        assert describe(stores, name).last_slot == planned.last_slot
        with engine.begin() as connection:
            connection.execute(text("DELETE FROM resilience_outbox WHERE task_name = "
                                    "'tests.schedules.record' AND options->>'queue' = 'nowhere'"))

    def test_a_stale_plan_does_nothing(self, stores: Any, tag: str) -> None:
        """An entry edited after it was read (version moved) is not fired from the old read."""
        name = f"{tag}-stale"
        add(stores, name, task="tests.schedules.record", every=Interval(1.0), args=[tag],
            options={"queue": "nowhere"})
        entry = due_now(stores, name)
        now = dt.datetime.now(dt.UTC)
        planned = plan(entry.every, entry.last_slot, now, now - dt.timedelta(seconds=10),
                       CatchUp.SKIP, 3600)
        pause(stores, name)
        assert schedule_store(stores).fire(entry, planned, decide=decide).stale
        assert recent_runs(stores, name) == []


class FakeConf(dict):
    timezone = "Europe/Paris"

    def get(self, key: str, default: Any = None) -> Any:
        return super().get(key, default)


class FakeApp:
    def __init__(self, schedule: dict[str, Any]) -> None:
        self.conf = FakeConf()
        self.conf.beat_schedule = schedule  # type: ignore[attr-defined]


class TestSeeding:
    def test_code_owns_timing_runtime_policies_survive_removed_entries_go(
            self, stores: Any, tag: str) -> None:
        """Seeding writes code's task and timing; a policy set at runtime stays unless the
        code names it; a code entry gone from code is deleted; runtime entries stay."""
        from celery.schedules import crontab

        store = schedule_store(stores)
        add(stores, f"{tag}-runtime", task="tests.schedules.record", every=Interval(5))
        first = {f"{tag}-a": {"task": "tests.schedules.record", "schedule": 10.0},
                 f"{tag}-b": {"task": "tests.schedules.record",
                              "schedule": crontab(minute="*/15"), "overlap": "skip"}}
        store.seed(code_entries(FakeApp(first)))
        b = describe(stores, f"{tag}-b")
        assert (b.source, b.every, b.overlap) == (
            "code", Cron("*/15 * * * *", timezone="Europe/Paris"), Overlap.SKIP)
        edit(stores, f"{tag}-a", catch_up="all")
        pause(stores, f"{tag}-a")
        edit(stores, f"{tag}-b", overlap="allow")
        with pytest.raises(InvalidSchedule, match="comes from the code"):
            edit(stores, f"{tag}-a", every=Interval(1))

        second = {f"{tag}-a": {"task": "tests.schedules.record", "schedule": 20.0},
                  f"{tag}-b": {"task": "tests.schedules.record",
                               "schedule": crontab(minute="*/15"), "overlap": "skip"}}
        other_code = [entry for entry in store.read_all()
                      if entry.source == "code" and not entry.name.startswith(tag)]
        store.seed(code_entries(FakeApp(second)))
        a, b = describe(stores, f"{tag}-a"), describe(stores, f"{tag}-b")
        assert (a.every, a.catch_up, a.paused) == (Interval(20), CatchUp.ALL, True)
        assert b.overlap is Overlap.SKIP  # named in code: code wins
        store.seed(code_entries(FakeApp({f"{tag}-b": second[f"{tag}-b"]})))
        with pytest.raises(ScheduleNotFound):
            describe(stores, f"{tag}-a")
        assert describe(stores, f"{tag}-runtime").source == "runtime"
        assert {entry.name for entry in other_code}.isdisjoint(
            entry.name for entry in store.read_all())  # other code entries went too

    def test_a_bad_code_entry_is_named(self) -> None:
        with pytest.raises(InvalidSchedule, match="'broken'.*not supported"):
            code_entries(FakeApp({"broken": {"task": "x", "schedule": object()}}))
        with pytest.raises(InvalidSchedule, match="catch_up must be one of"):
            entry_values("x", {"task": "x", "schedule": 1, "catch_up": "sometimes"}, "UTC")


class TestApi:
    def test_bad_input_gets_one_clear_error(self, stores: Any, tag: str) -> None:
        with pytest.raises(InvalidSchedule, match="interval"):
            add(stores, f"{tag}-x", task="t", every=Interval(0))
        with pytest.raises(InvalidSchedule):
            add(stores, f"{tag}-x", task="t", every=Cron("61 * * * *"))
        with pytest.raises(InvalidSchedule, match="overlap must be one of"):
            add(stores, f"{tag}-x", task="t", every=Interval(1), overlap="sometimes")
        with pytest.raises(InvalidSchedule, match="JSON"):
            add(stores, f"{tag}-x", task="t", every=Interval(1), args=[object()])
        add(stores, f"{tag}-x", task="t", every=Interval(1))
        with pytest.raises(InvalidSchedule, match="already exists"):
            add(stores, f"{tag}-x", task="t", every=Interval(1))
        with pytest.raises(InvalidSchedule, match="cannot edit paused"):
            edit(stores, f"{tag}-x", paused=True)
        for call in (describe, pause, resume, remove, run_now):
            with pytest.raises(ScheduleNotFound, match="no schedule named"):
                call(stores, f"{tag}-missing")

    def test_describe_and_listing(self, stores: Any, tag: str) -> None:
        """describe: the next five fires; listing: every schedule with its next fire."""
        summary = add(stores, f"{tag}-cron", task="t", every=Cron("0 2 * * *", "Europe/Paris"),
                      catch_up=CatchUp.ONCE)
        assert len(summary.next_fires) == 5
        assert all(moment.astimezone(dt.timezone.utc).hour in (0, 1)
                   for moment in summary.next_fires)
        assert summary.as_dict()["schedule"] == "0 2 * * * (Europe/Paris)"
        found = {item.name: item for item in listing(stores)}
        assert found[f"{tag}-cron"].next_fires == summary.next_fires[:1]
        assert pause(stores, f"{tag}-cron").paused and not resume(stores, f"{tag}-cron").paused


@pytest.mark.usefixtures("tier_workers")
class TestRunHistory:
    def test_outcomes_are_recorded_by_the_guard(self, app: Any, stores: Any,
                                                tag: str) -> None:
        """run_now fires each entry once; its job's end is on its run row: succeeded,
        failed, dead_lettered, with its lateness."""
        for suffix, task in (("ok", "tests.schedules.record"), ("fail", "tests.schedules.fail"),
                             ("dead", "tests.schedules.dead")):
            add(stores, f"{tag}-{suffix}", task=task, every=Interval(3600), args=[tag],
                options={"queue": "standard"})
            run_now(stores, f"{tag}-{suffix}", app)

        def outcomes() -> dict[str, Any] | None:
            found = {suffix: recent_runs(stores, f"{tag}-{suffix}")
                     for suffix in ("ok", "fail", "dead")}
            if all(runs and runs[0].outcome is not RunOutcome.SENT for runs in found.values()):
                return {suffix: runs[0] for suffix, runs in found.items()}
            return None

        runs = wait_for(outcomes, timeout_seconds=30, message="the three runs end")
        assert {suffix: run.outcome for suffix, run in runs.items()} == {
            "ok": RunOutcome.SUCCEEDED, "fail": RunOutcome.FAILED,
            "dead": RunOutcome.DEAD_LETTERED}
        assert all(run.finished_at and run.fired_at and run.late_seconds is not None
                   for run in runs.values())


class TestLibraryDefault:
    def test_every_guarded_task_of_an_initialised_app_records_its_runs(self) -> None:
        """A user's app given only `resilience.init_app` has the run-history guard on its
        plain tasks (outermost), so its scheduled jobs' outcomes are recorded too."""
        from celery import Celery

        import resilience
        from resilience.schedules import ScheduleRunGuard

        user_app = Celery("schedules-user-app", set_as_current=False)
        resilience.init_app(user_app)

        @user_app.task(name="tests.schedules.user_task")
        def user_task() -> None:
            """A task with no guard decorator."""

        execution = user_task.pipelines()[0].guards
        assert isinstance(execution[0], ScheduleRunGuard)
