"""Tasks for the limit tests; each run writes rows to PostgreSQL so tests assert on them.

Tables (created by the tests' fixture): `ratelimit_test_runs` (start/end of each body,
database clock) and `ratelimit_test_grants` (Redis server time of each permit granted).
"""

from __future__ import annotations

import os
import time
from typing import Any

from sqlalchemy import text

from jobs import app
from resilience.pipeline import Call
from resilience.ratelimit import Decision, limit_concurrency, rate_limit
from resilience.stores import stores_for

#: Rate of the rate-limited tasks: permits per period.
RATE_LIMIT, RATE_PERIOD_SECONDS = 5, 2.0
#: Slots of the concurrency-limited task.
SLOTS = 2
#: Lease of the task whose holder the test SIGKILLs.
KILL_LEASE_SECONDS = 6.0


def record_grant(call: Call, key: str, decision: Decision) -> None:
    """on_decision hook: write each granted permit's Redis server time."""
    if not decision.allowed:
        return
    with stores_for(app).engine().begin() as connection:
        connection.execute(
            text(
                "INSERT INTO ratelimit_test_grants (run_id, limit_key, granted_at, pid) "
                "VALUES (:run_id, :key, :at, :pid)"
            ),
            {
                "run_id": call.kwargs.get("run_id") or call.args[0],
                "key": key,
                "at": decision.now_seconds,
                "pid": os.getpid(),
            },
        )


def record_run(run_id: str, n: int, phase: str) -> None:
    with stores_for(app).engine().begin() as connection:
        connection.execute(
            text(
                "INSERT INTO ratelimit_test_runs (run_id, n, phase, at, pid) "
                "VALUES (:run_id, :n, :phase, extract(epoch from clock_timestamp()), :pid)"
            ),
            {"run_id": run_id, "n": n, "phase": phase, "pid": os.getpid()},
        )


@app.task(tier="standard", name="tests.ratelimit.slot")
@limit_concurrency("tests-slots", SLOTS, retry_seconds=0.2, on_decision=record_grant)
def limited_slot(run_id: str, n: int, seconds: float = 0.3) -> int:
    record_run(run_id, n, "start")
    time.sleep(seconds)
    record_run(run_id, n, "end")
    return n


@app.task(tier="standard", name="tests.ratelimit.window")
@rate_limit(
    "tests-window:{run_id}",
    f"{RATE_LIMIT}/{RATE_PERIOD_SECONDS:g} seconds",
    algorithm="sliding_window",
    on_decision=record_grant,
)
def windowed(run_id: str, n: int) -> int:
    return n


@app.task(tier="standard", name="tests.ratelimit.gcra")
@rate_limit(
    "tests-gcra:{run_id}",
    f"{RATE_LIMIT}/{RATE_PERIOD_SECONDS:g} seconds",
    algorithm="gcra",
    on_decision=record_grant,
)
def smoothed(run_id: str, n: int) -> int:
    return n


@app.task(tier="standard", name="tests.ratelimit.hold", bind=True, soft_time_limit=4, time_limit=5)
@limit_concurrency(
    "tests-hold:{run_id}",
    1,
    lease_seconds=KILL_LEASE_SECONDS,
    retry_seconds=0.5,
    on_decision=record_grant,
)
def hold_slot(self: Any, run_id: str) -> str:
    """First run: hold the slot until killed; a later run returns at once."""
    first = stores_for(app).redis().set(f"tests:hold:{run_id}", "1", nx=True, ex=60)
    record_run(run_id, 0 if first else 1, "start")
    if first:
        time.sleep(3.5)
    record_run(run_id, 0 if first else 1, "end")
    return "held" if first else "ran"
