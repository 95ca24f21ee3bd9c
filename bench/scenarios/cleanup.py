"""Idempotency cleanup: the old single pass (before 0012: 100 batches of 1,000 joined back by
id, 0.1 s pauses, every 600 s) against `run_cleanup` (batches by ctid until none is left or
30 s are spent, every 60 s) on the same freshly seeded expired records; see
docs/idempotency.md. `*_sustained_rows_per_s` is what the schedule can delete per second of
wall time, the figure that must exceed the insert rate; `hot_update_ratio` is the share of
HOT updates over claim + completion pairs run with the guard's own SQL.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from bench.harness import parse, platform, psql, table

OLD_BATCH, OLD_PAUSE_SECONDS, OLD_MAX_BATCHES, OLD_INTERVAL_SECONDS = 1000, 0.1, 100, 600.0
NEW_INTERVAL_SECONDS = 60.0

SEED_SQL = """
INSERT INTO resilience_idempotency_records
    (task_name, key, fingerprint, state, attempt, task_id, result, expires_at)
SELECT %(task)s, md5(%(task)s || g), 'f', 'succeeded', 1, 't', '{"ok": true}'::jsonb,
       now() - interval '1 minute' + g * interval '1 microsecond'
FROM generate_series(1, %(rows)s) AS g
"""


def _seed(database_url: str, rows: int) -> None:
    psql(database_url, SEED_SQL, {"task": f"bench.cleanup.{uuid.uuid4().hex[:8]}", "rows": rows})
    psql(database_url, "VACUUM ANALYZE resilience_idempotency_records")


def _old_run(engine: Any) -> tuple[int, float]:
    """One run of the cleanup as it was: rows deleted and seconds."""
    from resilience.idempotency.cleanup import DELETE_EXPIRED_BY_ID_SQL

    deleted, started = 0, time.perf_counter()
    for batch in range(OLD_MAX_BATCHES):
        with engine.begin() as connection:
            affected = connection.exec_driver_sql(
                DELETE_EXPIRED_BY_ID_SQL, {"batch_size": OLD_BATCH}).rowcount
        deleted += affected
        if affected < OLD_BATCH:
            break
        if batch + 1 < OLD_MAX_BATCHES:
            time.sleep(OLD_PAUSE_SECONDS)
    return deleted, time.perf_counter() - started


def _hot_ratio(database_url: str, completions: int) -> tuple[int, int]:
    """Claims + completions with the guard's SQL; the table's (updates, HOT updates)."""
    import psycopg2

    from resilience.idempotency.backends.postgres import CLAIM_SQL, COMPLETE_SQL

    connection = psycopg2.connect(database_url)
    connection.autocommit = True
    task = f"bench.hot.{uuid.uuid4().hex[:8]}"
    stats = ("SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables "
             "WHERE relname = 'resilience_idempotency_records'")
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_stat_force_next_flush()")
            cursor.execute(stats)
            before = cursor.fetchone()
            for n in range(completions):
                claim = {"task_name": task, "key": str(n), "fingerprint": "f", "owner": f"o{n}",
                         "task_id": f"t{n}", "lease_seconds": 60.0, "ttl_seconds": 3600.0}
                cursor.execute(CLAIM_SQL, claim)
                cursor.execute(COMPLETE_SQL, {**claim, "attempt": 1, "result": '{"ok": 1}'})
            cursor.execute("SELECT pg_stat_force_next_flush()")
            cursor.execute("SELECT 1")
            cursor.execute(stats)
            after = cursor.fetchone()
    finally:
        connection.close()
    return after[0] - before[0], after[1] - before[1]


def run(argv: list[str]) -> dict[str, Any]:
    options = parse(argv, "cleanup", rows=(200_000, "expired records per variant"),
                    completions=2000, batch_size=1000)

    with platform():
        from jobs import app
        from resilience.idempotency.cleanup import CleanupConfig, run_cleanup
        from resilience.stores import stores_for

        engine = stores_for(app).engine()
        url = engine.url.set(drivername="postgresql").render_as_string(hide_password=False)
        run_cleanup(engine)  # start from an empty backlog

        # The old cleanup deletes at most 100,000 rows per run: seed what one run can take.
        old_rows = min(options.rows, OLD_BATCH * OLD_MAX_BATCHES)
        _seed(url, old_rows)
        old_deleted, old_seconds = _old_run(engine)

        _seed(url, options.rows)
        report = run_cleanup(engine, CleanupConfig(batch_size=options.batch_size))
        updates, hot = _hot_ratio(url, options.completions)

    old_rate = old_deleted / old_seconds
    figures = {
        "old_rows_per_s": round(old_rate, 1),
        "new_rows_per_s": round(report.rows_per_second, 1),
        "old_sustained_rows_per_s": round(old_deleted / OLD_INTERVAL_SECONDS, 1),
        "new_sustained_rows_per_s": round(
            report.rows_per_second * CleanupConfig().time_budget_seconds / NEW_INTERVAL_SECONDS,
            1),
        "old_deleted": old_deleted,
        "new_deleted": report.rows,
        "new_batches": report.batches,
        "hot_update_ratio": round(hot / updates, 3) if updates else 0.0,
        "updates": updates,
    }
    table("Idempotency cleanup", ["variant", "deleted", "seconds", "rows/s in run",
                                  "sustained rows/s"],
          [["old (100 x 1000, 0.1 s pause, every 600 s)", old_deleted, round(old_seconds, 2),
            figures["old_rows_per_s"], figures["old_sustained_rows_per_s"]],
           ["new (until done or 30 s, every 60 s)", report.rows, round(report.seconds, 2),
            figures["new_rows_per_s"], figures["new_sustained_rows_per_s"]]])
    return figures
