"""Periodic jobs for the leader-elected beat.

Entries are Celery beat entries (`{"name": {"task": ..., "schedule": ...}}`); the app loads
`SCHEDULE` at start. An empty schedule is valid.
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
    },
    # The Redis copies of live cancellations, rewritten from their PostgreSQL record.
    "cancellations-restore": {
        "task": "jobs.maintenance.restore_cancellations",
        "schedule": 300.0,
        "options": {"expires": 240},
    },
    # Dead letters of a dependency that was down, requeued once its breaker stayed closed
    # long enough (off unless configured: see jobs.maintenance.replay_dead_letters).
    "dead-letters-replay": {
        "task": "jobs.maintenance.replay_dead_letters",
        "schedule": 30.0,
        "options": {"expires": 25},
    },
    # Claims whose holder died and whose lease ended more than 5 minutes ago.
    "idempotency-reaper": {
        "task": "jobs.maintenance.reap_idempotency_claims",
        "schedule": 300.0,
        "options": {"expires": 240},
    },
}
