"""Platform maintenance tasks run by the leader-elected beat (see jobs/schedule.py).

Each runs under a singleton lock so overlapping schedules do not pile up; the SQL itself is
also safe to run twice at once (`FOR UPDATE SKIP LOCKED`), so a lock lost mid-run costs
nothing but duplicate work.
"""

from __future__ import annotations

from typing import Any

from jobs import app
from jobs.settings import get_settings
from resilience.cancel.view import cancellations
from resilience.deadletter.replay import AutoReplay, ReplayConfig
from resilience.idempotency.cleanup import CleanupConfig, reap_abandoned, run_cleanup
from resilience.locks.guards import singleton
from resilience.schedules import history_days_of, prune_runs
from resilience.stores import stores_for


@app.task(tier="standard")
@singleton(key="maintenance:cleanup_idempotency")
def cleanup_idempotency(batch_size: int = 1000, pause_seconds: float = 0.0,
                        max_batches: int | None = None,
                        time_budget_seconds: float = 30.0) -> dict[str, Any]:
    """Delete expired, finished idempotency records until none is left or the time budget
    is spent; reports rows/s."""
    policy = CleanupConfig(batch_size=batch_size, pause_seconds=pause_seconds,
                           max_batches=max_batches,
                           time_budget_seconds=_budget(time_budget_seconds))
    report = run_cleanup(stores_for(app).engine(), policy)
    return {"deleted": report.rows, **report.as_dict()}


@app.task(tier="standard")
@singleton(key="maintenance:reap_idempotency_claims")
def reap_idempotency_claims(grace_seconds: float = 300.0, batch_size: int = 1000,
                            max_batches: int = 100) -> dict[str, Any]:
    """Turn claims whose holder died long ago (lease ended > grace) into failed records."""
    policy = CleanupConfig(batch_size=batch_size, max_batches=max_batches,
                           grace_seconds=grace_seconds)
    return {"reaped": reap_abandoned(stores_for(app).engine(), policy)}


@app.task(tier="standard")
@singleton(key="maintenance:restore_cancellations")
def restore_cancellations() -> dict[str, Any]:
    """Write the Redis copy of every live cancellation again from PostgreSQL (a flushed or
    failed-over Redis forgets them) and drop expired ones."""
    return {"restored": cancellations(app).restore()}


@app.task(tier="standard")
@singleton(key="maintenance:replay_dead_letters")
def replay_dead_letters(closed_for_seconds: float | None = None, rate: str | None = None,
                        max_rows_per_run: int | None = None,
                        dependencies: list[str] | None = None) -> dict[str, Any]:
    """Requeue dead letters of a dependency that was down, once its breaker has stayed
    closed `closed_for_seconds`, paced by `rate` (see `resilience.deadletter.replay`);
    with `dependencies`, only the rows of those.

    Off unless `closed_for_seconds` is given here (the beat entry's kwargs) or by the
    platform settings (`JOBS_DEAD_LETTER_REPLAY_CLOSED_SECONDS`).
    """
    settings = get_settings()
    closed = (closed_for_seconds if closed_for_seconds is not None
              else settings.dead_letter_replay_closed_seconds)
    if closed is None:
        return {"enabled": False, "replayed": 0}
    options: dict[str, Any] = {
        "closed_for_seconds": float(closed), "rate": rate or settings.dead_letter_replay_rate,
        "max_rows_per_run": max_rows_per_run,
        "dependencies": tuple(dependencies) if dependencies is not None else None}
    config = ReplayConfig(**{name: value for name, value in options.items() if value is not None})
    return {"enabled": True, **AutoReplay.of_app(app, config).run_once().summary()}


@app.task(tier="standard")
@singleton(key="maintenance:prune_schedule_runs")
def prune_schedule_runs(keep_last: int = 20, batch_size: int = 1000,
                        time_budget_seconds: float = 30.0) -> dict[str, Any]:
    """Delete finished schedule run rows older than `resilience_schedule_history_days`
    (default 7), keeping each entry's newest `keep_last` runs and every run in flight."""
    return prune_runs(stores_for(app), history_days=history_days_of(app.conf),
                      keep_last=keep_last, batch_size=batch_size,
                      time_budget_seconds=_budget(time_budget_seconds))


def _budget(seconds: float) -> float:
    """`seconds`, kept under half the standard tier's soft time limit."""
    return min(seconds, get_settings().standard.soft_time_limit_seconds / 2)
