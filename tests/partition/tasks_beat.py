"""The beat-leader partition test's periodic task and schedule (issue 25).

`SCHEDULE` is the schedule the test's beat processes run (`RESILIENCE_BEAT_SCHEDULE` names
this module): a fast entry every `PARTITION_BEAT_PERIOD_SECONDS` and a slow one every
`PARTITION_BEAT_SLOW_PERIOD_SECONDS` (an hour unless set: then never due in a short test),
on the standard queue, which worker `b` consumes (the leader's node `a` is the one cut).
Each execution records the slot beat claimed for it and the beat process that sent it
(message headers, resilience.locks.beat) as one row in PostgreSQL, with no unique
constraint: a slot sent twice shows as two rows.
"""

from __future__ import annotations

import os
from typing import Any

from sqlalchemy import text

from jobs import app
from resilience.locks.beat import SENDER_HEADER, SLOT_HEADER
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
    """Record this execution: the slot and the sender its message carries."""
    headers = getattr(self.request, "headers", None) or {}

    def header(name: str) -> Any:
        return getattr(self.request, name, None) or headers.get(name)

    with stores_for(app).engine().begin() as connection:
        connection.execute(
            text("INSERT INTO partition_beat_sends (run_id, slot, sender, task_id) "
                 "VALUES (:run_id, :slot, :sender, :task_id)"),
            {"run_id": run_id, "slot": header(SLOT_HEADER), "sender": header(SENDER_HEADER),
             "task_id": self.request.id})
