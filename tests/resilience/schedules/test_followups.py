"""Schedules follow-ups without a beat or workers: an edit away from queue_one settles its
queued run; catch-up of a long cron outage finds the newest missed slots backward; names a
page address cannot carry are refused."""

from __future__ import annotations

import datetime as dt
import random
from typing import Any

import pytest

from resilience.schedules import CatchUp, Cron, Interval, InvalidSchedule, Overlap, add, edit
from resilience.schedules.catchup import RECORD_LIMIT, plan
from resilience.schedules.overlap import releases_queued
from resilience.schedules.seed import entry_values
from resilience.schedules.store import schedule_store
from resilience.schedules.timing import newest_slots, slots_between
from tests.resilience.schedules.test_overlap_store import (  # noqa: F401 - a fixture
    entry_with,
    fire,
    nowhere,
    rows,
)

UTC = dt.UTC


@pytest.mark.usefixtures("nowhere")
@pytest.mark.parametrize("to", [Overlap.ALLOW, Overlap.SKIP, Overlap.CANCEL_PREVIOUS])
def test_an_edit_away_from_queue_one_settles_the_queued_run(
        stores: Any, engine: Any, tag: str, to: Overlap) -> None:
    """Slot 1 sent, slot 2 queued; editing the overlap records slot 2 skipped_overlap in the
    edit's transaction, so no queued run is left that no tick would ever fire."""
    name = f"{tag}-q"
    entry_with(stores, name, Overlap.QUEUE_ONE)
    fire(stores, name, 1)
    fire(stores, name, 2)
    assert rows(engine, name)[2].outcome == "queued"

    edit(stores, name, overlap=to)

    settled = rows(engine, name)[2]
    assert settled.outcome == "skipped_overlap" and settled.task_id is None
    assert settled.detail["settled"] == f"overlap edited to {to.value}"
    store = schedule_store(stores)
    assert store.fire_queued(store.read(name), released=releases_queued) == (None, False)
    assert rows(engine, name)[1].outcome == "sent"  # the running one is untouched


@pytest.mark.usefixtures("nowhere")
def test_other_edits_leave_a_queued_run_queued(stores: Any, engine: Any, tag: str) -> None:
    name = f"{tag}-q"
    entry_with(stores, name, Overlap.QUEUE_ONE)
    fire(stores, name, 1)
    fire(stores, name, 2)
    edit(stores, name, catch_up_window_seconds=60)
    edit(stores, name, overlap=Overlap.QUEUE_ONE)
    assert rows(engine, name)[2].outcome == "queued"


class TestCronCatchUp:
    EVERY = Cron("*/5 * * * *", timezone="Europe/Paris")
    LAST = dt.datetime(2026, 3, 1, tzinfo=UTC)

    def test_newest_slots_backward_equal_the_forward_walk(self) -> None:
        """Across the spring-forward and fall-back of Paris and New York."""
        for every in (self.EVERY, Cron("30 1,2,3 * * *", timezone="America/New_York"),
                      Cron("0 0 29 2 *")):
            after, until = self.LAST, dt.datetime(2026, 11, 3, 7, 31, tzinfo=UTC)
            walked = list(slots_between(every, after, until))
            for n in (1, 3, 100):
                assert newest_slots(every, after, until, n) == walked[-n:]

    def test_count_between_by_days_equals_the_walk(self) -> None:
        """Whole days counted as hours x minutes agree with walking every slot, DST days,
        half-hour zones and the partial first and last days included."""
        rng = random.Random(28)
        expressions = ("*/5 * * * *", "30 1,2,3 * * *", "0 0 29 2 *", "15 2 * * 0",
                       "*/7 2-3 1,15 * 1-5", "0 0 * * *")
        zones = ("Europe/Paris", "America/New_York", "UTC", "Australia/Lord_Howe",
                 "America/Santiago", "Asia/Kolkata")
        for _ in range(60):
            every = Cron(rng.choice(expressions), timezone=rng.choice(zones))
            after = self.LAST + dt.timedelta(seconds=rng.randint(-60 * 86_400, 300 * 86_400))
            until = after + dt.timedelta(seconds=rng.randint(0, 6 * 86_400))
            assert every.count_between(after, until) == len(
                list(slots_between(every, after, until))), (every, after, until)

    def test_a_long_outage_plans_the_newest_missed_slots_and_counts_the_rest(self) -> None:
        """Sixty days without a leader for a 5-minute entry: once fires the newest missed
        slot, the newest RECORD_LIMIT others are recorded, the rest counted."""
        now = self.LAST + dt.timedelta(days=60, seconds=30)
        walked = list(slots_between(self.EVERY, self.LAST, now))
        planned = plan(self.EVERY, self.LAST, now, now, CatchUp.ONCE, 3600)
        assert planned.fire == [(walked[-1], "catch_up")]
        assert planned.missed == walked[-RECORD_LIMIT - 1:-1]
        assert planned.also_missed == len(walked) - RECORD_LIMIT - 1
        assert planned.last_slot == walked[-1]
        planned = plan(self.EVERY, self.LAST, now, now, CatchUp.SKIP, 3600)
        assert planned.fire == [] and planned.missed == walked[-RECORD_LIMIT:]
        assert planned.also_missed == len(walked) - RECORD_LIMIT
        assert planned.last_slot == walked[-1]


class TestNames:
    @pytest.mark.parametrize("bad", ["line\nbreak", "tab\there", "", "   ", "n" * 201])
    def test_a_blank_long_or_control_character_name_is_refused(self, stores: Any, tag: str,
                                                               bad: str) -> None:
        name = f"{tag}{bad}" if bad.strip() and len(bad) < 200 else bad
        with pytest.raises(InvalidSchedule, match="schedule name is 1-200 printable"):
            add(stores, name, task="x.y", every=Interval(5))
        with pytest.raises(InvalidSchedule, match="schedule name is 1-200 printable"):
            entry_values(name, {"task": "x.y", "schedule": 5.0}, "UTC")

    @pytest.mark.parametrize("suffix", ["-Az09_.:-", " add every 10 seconds", "/a?b#1 é"])
    def test_a_printable_name_is_taken(self, stores: Any, tag: str, suffix: str) -> None:
        """Celery's own entry names, spaces and slashes included, name a schedule."""
        name = f"{tag}{suffix}"
        assert add(stores, name, task="x.y", every=Interval(5), paused=True).name == name
