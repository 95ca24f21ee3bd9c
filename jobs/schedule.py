"""The platform's periodic maintenance, run by the leader-elected beat.

Celery beat entries, which `create_app` loads and the beat leader seeds into the schedules
table (docs/schedules.md). None names a catch-up policy, so each gets `skip` (each run
catches up with all the work anyway) and an operator's runtime choice survives restarts;
each says `overlap: skip`, so a run still going when its next slot comes skips that slot.
The module lives in the `jobs` package so that a `beat_schedule.py` in the working directory
cannot replace it; `RESILIENCE_BEAT_SCHEDULE` names another module.
"""

from __future__ import annotations

from typing import Any


def _every(seconds: float, task: str, expires: float) -> dict[str, Any]:
    return {"task": f"jobs.maintenance.{task}", "schedule": seconds,
            "options": {"expires": expires}, "overlap": "skip"}


#: Each task's docstring (jobs/maintenance.py) says what it does.
SCHEDULE: dict[str, dict[str, Any]] = {
    # Every minute, so deletion keeps up with the insert rate.
    "idempotency-cleanup": _every(60.0, "cleanup_idempotency", expires=55),
    "cancellations-restore": _every(300.0, "restore_cancellations", expires=240),
    "dead-letters-replay": _every(30.0, "replay_dead_letters", expires=25),  # off by default
    "schedule-history-prune": _every(3600.0, "prune_schedule_runs", expires=3000),
    "idempotency-reaper": _every(300.0, "reap_idempotency_claims", expires=240),
}
