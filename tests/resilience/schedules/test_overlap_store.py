"""The overlap policies in the fire transaction (`ScheduleStore.fire` / `fire_queued`) on
real PostgreSQL, without a beat or a worker: the jobs go to an outbox queue nobody reads."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import text

from resilience.errors import StorageError
from resilience.schedules import Interval, Overlap, RunOutcome, add, run_now
from resilience.schedules.catchup import Plan
from resilience.schedules.overlap import decide, releases_queued
from resilience.schedules.store import schedule_store

TASK = "tests.schedules.record"
BASE = dt.datetime.now(dt.UTC).replace(microsecond=0) - dt.timedelta(seconds=100)


@pytest.fixture()
def nowhere(engine: Any) -> Iterator[None]:
    yield
    with engine.begin() as connection:
        connection.execute(text("DELETE FROM resilience_outbox WHERE task_name = :task AND "
                                "options->>'queue' = 'nowhere'"), {"task": TASK})


def entry_with(stores: Any, name: str, overlap: Overlap) -> None:
    add(stores, name, task=TASK, every=Interval(1.0), args=[name], overlap=overlap,
        options={"queue": "nowhere"})


def fire(stores: Any, name: str, second: int, cancel: Any = None) -> Any:
    """Fire slot BASE + `second` of `name` (read afresh, as a tick does)."""
    store = schedule_store(stores)
    slot = BASE + dt.timedelta(seconds=second)
    return store.fire(store.read(name), Plan(fire=[(slot, "on_time")], last_slot=slot),
                      decide=decide, cancel=cancel)


def rows(engine: Any, name: str) -> dict[int, Any]:
    """The entry's run rows by slot second (run_now rows under -1)."""
    with engine.connect() as connection:
        found = connection.execute(text(
            "SELECT id, slot, task_id, outcome, detail, late_seconds "
            "FROM resilience_schedule_runs WHERE schedule = :name ORDER BY id"),
            {"name": name}).all()
    return {(-1 if (row.detail or {}).get("why") == "run_now"
             else round((row.slot - BASE).total_seconds())): row for row in found}


def job_headers(engine: Any, run_id: int) -> dict[str, Any]:
    with engine.connect() as connection:
        return connection.execute(text(
            "SELECT options->'headers' FROM resilience_outbox WHERE "
            "CAST(options->'headers'->>'resilience_schedule_run' AS bigint) = :id"),
            {"id": run_id}).scalar_one()


@pytest.mark.usefixtures("nowhere")
class TestFireWithOverlap:
    def test_skip_records_slots_during_a_run_and_stamps_the_singleton_header(
            self, stores: Any, engine: Any, tag: str) -> None:
        name = f"{tag}-skip"
        entry_with(stores, name, Overlap.SKIP)
        fire(stores, name, 1)
        skipped = fire(stores, name, 2)
        assert skipped.sent == [] and skipped.skipped[0][1] is RunOutcome.SKIPPED_OVERLAP
        found = rows(engine, name)
        assert found[2].task_id is None and found[2].detail["running_run"] == found[1].id
        assert job_headers(engine, found[1].id)["resilience_schedule_singleton"] == \
            f"skip:{name}"
        schedule_store(stores).record(found[1].id, RunOutcome.SUCCEEDED)
        assert len(fire(stores, name, 3).sent) == 1, "sent once the previous run ended"

    def test_queue_one_keeps_one_and_fires_it_when_the_previous_ends(
            self, stores: Any, engine: Any, tag: str) -> None:
        """Slot 1 sent, 2 queued, 3 skipped (a run_now between them changes nothing);
        `fire_queued` waits while run 1 is sent, then fires 2 with its own slot."""
        name = f"{tag}-queue"
        entry_with(stores, name, Overlap.QUEUE_ONE)
        store = schedule_store(stores)
        fire(stores, name, 1)
        assert fire(stores, name, 2).skipped[0][1] is RunOutcome.QUEUED
        run_now(stores, name)
        assert fire(stores, name, 3).skipped[0][1] is RunOutcome.SKIPPED_OVERLAP
        found = rows(engine, name)
        assert [found[second].outcome for second in (1, 2, 3)] == [
            "sent", "queued", "skipped_overlap"]
        assert found[3].detail["queued_run"] == found[2].id

        assert store.fire_queued(store.read(name), released=releases_queued) == (None, True)
        store.record(found[1].id, RunOutcome.SUCCEEDED)
        sent, waiting = store.fire_queued(store.read(name), released=releases_queued)
        assert sent is not None and sent[0] == found[2].id and not waiting
        released = rows(engine, name)[2]
        assert released.outcome == "sent" and released.task_id
        assert released.detail["released_by_run"] == found[1].id
        assert released.late_seconds >= 100, "late from its own slot"
        assert job_headers(engine, released.id)["resilience_schedule_singleton"] == \
            f"defer:{name}"
        assert store.fire_queued(store.read(name), released=releases_queued) == (None, False)

    def test_cancel_previous_cancels_inside_the_fire(
            self, stores: Any, engine: Any, tag: str) -> None:
        """Slot 2 records run 1 cancelled and cancels its job before it commits; a
        cancellation that cannot be recorded rolls slot 3's fire back whole."""
        name = f"{tag}-cancel"
        entry_with(stores, name, Overlap.CANCEL_PREVIOUS)
        fire(stores, name, 1)
        cancelled: list[str] = []
        assert len(fire(stores, name, 2, cancel=cancelled.append).sent) == 1
        found = rows(engine, name)
        assert cancelled == [found[1].task_id]
        assert found[1].outcome == "cancelled" and "cancelled_by_slot" in found[1].detail
        assert found[2].outcome == "sent" and found[2].detail["cancelled_run"] == found[1].id
        assert "resilience_schedule_singleton" not in job_headers(engine, found[2].id)

        def refuse(task_id: str) -> None:
            raise StorageError("cancellation store down")

        with pytest.raises(StorageError):
            fire(stores, name, 3, cancel=refuse)
        after = rows(engine, name)
        assert 3 not in after and after[2].outcome == "sent"
        assert schedule_store(stores).read(name).last_slot == BASE + dt.timedelta(seconds=2)
