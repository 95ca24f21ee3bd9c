"""The beat-leader partition test's periodic task and schedule (issue 25).

`SCHEDULE` is the schedule the test's beat processes run (`RESILIENCE_BEAT_SCHEDULE` names
this module): a fast entry every `PARTITION_BEAT_PERIOD_SECONDS` and a slow one every
`PARTITION_BEAT_SLOW_PERIOD_SECONDS` (an hour unless set: then never due in a short test),
on the standard queue, which worker `b` consumes (the leader's node `a` is the one cut).
Each execution records its slot and the beat process that fired it (read from its run row,
whose id the message carries: resilience.schedules) as one row in PostgreSQL, with no
unique constraint: a slot sent twice shows as two rows.
"""

from __future__ import annotations

import os
from typing import Any

from sqlalchemy import text

from jobs import app
from resilience.schedules import SCHEDULE_RUN_HEADER
from resilience.stores import stores_for

TIER = "standard"

CREATE_TABLE = """
CREATE TABLE IF NOT EXISTS partition_beat_sends (
    id bigserial PRIMARY KEY,
    run_id text NOT NULL,
    slot text,
    sender text,
    task_id text,
    ran_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
"""

#: Entry name → its period (s).
PERIODS = {
    "partition-beat-tick": float(os.environ.get("PARTITION_BEAT_PERIOD_SECONDS", "1.0")),
    "partition-beat-slow": float(os.environ.get("PARTITION_BEAT_SLOW_PERIOD_SECONDS", "3600")),
}

SCHEDULE = {
    name: {
        "task": "tests.partition.beat_tick",
        "schedule": period,
        "args": [os.environ.get("PARTITION_BEAT_RUN_ID", "unset")],
        "options": {"queue": TIER},
    }
    for name, period in PERIODS.items()
}


@app.task(tier=TIER, bind=True, name="tests.partition.beat_tick")
def beat_tick(self: Any, run_id: str) -> None:
    """Record this execution: its slot (`<entry>:<period index>`) and the beat that fired it."""
    headers = getattr(self.request, "headers", None) or {}
    run = getattr(self.request, SCHEDULE_RUN_HEADER, None) or headers.get(SCHEDULE_RUN_HEADER)
    with stores_for(app).engine().begin() as connection:
        fired = connection.execute(
            text("SELECT schedule, extract(epoch FROM slot)::float8 AS slot, "
                 "detail->>'sender' AS sender FROM resilience_schedule_runs WHERE id = :id"),
            {"id": int(run) if run is not None else None}).first()
        slot = sender = None
        if fired is not None:
            slot = f"{fired.schedule}:{round(fired.slot / PERIODS[fired.schedule])}"
            sender = fired.sender
        connection.execute(
            text("INSERT INTO partition_beat_sends (run_id, slot, sender, task_id) "
                 "VALUES (:run_id, :slot, :sender, :task_id)"),
            {"run_id": run_id, "slot": slot, "sender": sender, "task_id": self.request.id})
