"""The platform's periodic maintenance, run by the leader-elected beat.

Entries are Celery beat entries (`{"name": {"task": ..., "schedule": ...}}`); `create_app`
loads `SCHEDULE` from here, and the beat leader seeds them into the schedules table
(resilience.schedules): code stays the source of their task, period and options.

Policies: none names a catch-up policy, so each gets `skip` (slots missed while no beat led
are recorded, not replayed: each run catches up with all the work anyway) and an operator's
runtime choice survives restarts. Each says `overlap: skip`: a cleanup still running when
its next slot comes makes that slot `skipped_overlap` instead of starting a second one.

It lives inside the `jobs` package, not in a top-level
`beat_schedule` module, so installing the platform adds no top-level module and a
`beat_schedule.py` in the working directory cannot replace it. A deployment that wants
another schedule names its module in `RESILIENCE_BEAT_SCHEDULE` (resilience.schedules.seed).
"""

from __future__ import annotations

from typing import Any

SCHEDULE: dict[str, dict[str, Any]] = {
    # Expired, finished idempotency records: batches of 1000 until none is left or 30 s are
    # spent, every minute, so deletion keeps up with the insert rate.
    "idempotency-cleanup": {
        "task": "jobs.maintenance.cleanup_idempotency",
        "schedule": 60.0,
        "options": {"expires": 55},
        "overlap": "skip",
    },
    # The Redis copies of live cancellations, rewritten from their PostgreSQL record.
    "cancellations-restore": {
        "task": "jobs.maintenance.restore_cancellations",
        "schedule": 300.0,
        "options": {"expires": 240},
        "overlap": "skip",
    },
    # Dead letters of a dependency that was down, requeued once its breaker stayed closed
    # long enough (off unless configured: see jobs.maintenance.replay_dead_letters).
    "dead-letters-replay": {
        "task": "jobs.maintenance.replay_dead_letters",
        "schedule": 30.0,
        "options": {"expires": 25},
        "overlap": "skip",
    },
    # Schedule run rows older than resilience_schedule_history_days (default 7), each
    # entry's newest 20 and every run in flight kept: batches of 1000 for up to 30 s, hourly.
    "schedule-history-prune": {
        "task": "jobs.maintenance.prune_schedule_runs",
        "schedule": 3600.0,
        "options": {"expires": 3000},
        "overlap": "skip",
    },
    # Claims whose holder died and whose lease ended more than 5 minutes ago.
    "idempotency-reaper": {
        "task": "jobs.maintenance.reap_idempotency_claims",
        "schedule": 300.0,
        "options": {"expires": 240},
        "overlap": "skip",
    },
}
