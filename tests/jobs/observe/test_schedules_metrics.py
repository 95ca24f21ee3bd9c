"""The schedules' metric families, derived from the run rows: missed slots (recorded and
only counted), slots skipped by overlap, the newest run's lateness, slots since the newest
success, paused; as `jobs metrics` exports them."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import text

from resilience.schedules import Interval, ScheduleNotFound, add, pause, remove
from resilience.views import Source


@pytest.fixture()
def name(stores: Any) -> Iterator[str]:
    chosen = f"metrics-{uuid.uuid4().hex[:8]}"
    add(stores, chosen, task="tests.observe.idle", every=Interval(60), args=[1])
    yield chosen
    with contextlib.suppress(ScheduleNotFound):
        remove(stores, chosen)


def samples(app: Any, name: str) -> dict[str, float]:
    """The schedule's sample in each family `jobs metrics` exports, by series name."""
    from jobs.observe.metrics import view_metrics
    from jobs.tiers import TIERS
    from resilience.schedules.view import VIEW, read

    snapshot = {VIEW.name: read(Source(app=app, tiers=TIERS))}
    found = {}
    for family in view_metrics(VIEW, snapshot):
        for sample in family.samples:
            if sample.labels == {"schedule": name}:
                found[sample.name] = sample.value
    return found


class TestSchedulesMetrics:
    def test_families_add_up_the_run_rows(self, app: Any, stores: Any, engine: Any,
                                          name: str) -> None:
        """Two missed rows, one of which counts 5 more, one skipped by overlap, a success
        10 minutes ago and a late newest run: missed 7, skipped 1, lateness of the newest
        run, 10 slots (of 60 s) since the success, not paused; paused: 1 and no count of
        slots since success."""
        now = dt.datetime.now(dt.timezone.utc).replace(second=0, microsecond=0)
        rows = [
            (now - dt.timedelta(minutes=30), "missed", None, {"also_missed": 5}),
            (now - dt.timedelta(minutes=29), "missed", None, None),
            (now - dt.timedelta(minutes=20), "skipped_overlap", None, None),
            (now - dt.timedelta(minutes=10), "succeeded", 0.5, None),
            (now - dt.timedelta(minutes=9), "failed", 2.25, None),
        ]
        with engine.begin() as connection:
            for slot, outcome, late, detail in rows:
                connection.execute(text(
                    "INSERT INTO resilience_schedule_runs (schedule, slot, fired_at, outcome, "
                    "late_seconds, detail) VALUES (:name, :slot, :fired, :outcome, :late, "
                    "CAST(:detail AS jsonb))"),
                    {"name": name, "slot": slot, "outcome": outcome, "late": late,
                     "fired": None if late is None else slot + dt.timedelta(seconds=late),
                     "detail": None if detail is None else json.dumps(detail)})

        found = samples(app, name)
        # 11 when a minute turned between `now` above and the read.
        assert found.pop("resilience_schedule_slots_since_success") in (10.0, 11.0)
        assert found == {
            "resilience_schedule_missed_total": 7.0,
            "resilience_schedule_skipped_total": 1.0,
            "resilience_schedule_lateness_seconds": 2.25,
            "resilience_schedule_paused": 0.0,
        }
        pause(stores, name)
        paused = samples(app, name)
        assert paused["resilience_schedule_paused"] == 1.0
        assert "resilience_schedule_slots_since_success" not in paused
