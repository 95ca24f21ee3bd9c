"""Bench tasks of the idempotency scenario: the same no-op plain, idempotent, and with
hand-rolled idempotency (`idem_bench_handrolled`)."""

from __future__ import annotations

import json
import os
import threading
from typing import Any

from jobs import app
from resilience.idempotency import idempotent
from resilience.stores import stores_for


@app.task(tier="standard", ignore_result=True)
def idem_bench_plain(counter: str, n: int) -> None:
    """Count one execution in Redis."""
    stores_for(app).redis().incr(counter)


@app.task(tier="standard", ignore_result=True)
@idempotent(key="{counter}:{n}")
def idem_bench_guarded(counter: str, n: int) -> None:
    """The same no-op, idempotent per (counter, n)."""
    stores_for(app).redis().incr(counter)


@app.task(tier="standard", ignore_result=True)
def idem_bench_steps(counter: str, n: int, steps: str) -> None:
    """The same no-op after part of the guard's work, done by hand with the guard's own store
    and cache: `cache` (the Redis fast-path read), `ping` (that, plus one PostgreSQL round
    trip: `SELECT 1`), `claim` (the read, plus the real claim; no completion)."""
    from resilience.idempotency.backends.cached import ResultCache
    from resilience.idempotency.backends.postgres import backend_for as store_for

    stores = stores_for(app)
    key = f"{counter}:{n}"
    ResultCache(stores.redis).get(idem_bench_steps.name, key)
    store = store_for(stores, synchronous_commit=False)
    if steps == "ping":
        store.ping()
    elif steps == "claim":
        store.claim(task_name=idem_bench_steps.name, key=key, fingerprint="0" * 64,
                    owner=f"bench:{key}", task_id=None, lease_seconds=60.0,
                    ttl_seconds=3600.0)
    stores.redis().incr(counter)


#: The hand-rolled variant's own table (created by the scenario before the workers start).
HANDROLLED_TABLE = "bench_handrolled_idempotency"
HANDROLLED_DDL = f"""
CREATE TABLE IF NOT EXISTS {HANDROLLED_TABLE} (
    task_name text NOT NULL,
    key text NOT NULL,
    state text NOT NULL,
    result jsonb,
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (task_name, key)
)
"""
_HANDROLLED_CLAIM = (f"INSERT INTO {HANDROLLED_TABLE} (task_name, key, state) "
                     "VALUES (%s, %s, 'running') ON CONFLICT DO NOTHING RETURNING 1")
_HANDROLLED_DONE = (f"UPDATE {HANDROLLED_TABLE} SET state = 'succeeded', result = %s::jsonb "
                    "WHERE task_name = %s AND key = %s")
_handrolled = threading.local()


def _handrolled_connection() -> Any:
    """This thread's psycopg2 connection (one per worker process/thread), autocommit, with
    the guard's default durability (`synchronous_commit=off`, `IdempotencyConfig`) so the
    comparison is of the code, not of the commit mode."""
    import psycopg2

    connection = getattr(_handrolled, "connection", None)
    if connection is None or connection.closed or getattr(_handrolled, "pid", 0) != os.getpid():
        url = stores_for(app).database_url.replace("postgresql+psycopg2://", "postgresql://")
        connection = psycopg2.connect(url, options="-c synchronous_commit=off")
        connection.autocommit = True
        _handrolled.connection, _handrolled.pid = connection, os.getpid()
    return connection


@app.task(tier="standard", ignore_result=True)
def idem_bench_handrolled(counter: str, n: int) -> None:
    """The same no-op with the idempotency a careful user writes by hand: an
    `INSERT ... ON CONFLICT DO NOTHING RETURNING` claim before the body, an `UPDATE` after."""
    key = f"{counter}:{n}"
    with _handrolled_connection().cursor() as cursor:
        cursor.execute(_HANDROLLED_CLAIM, (idem_bench_handrolled.name, key))
        if cursor.fetchone() is None:
            return  # claimed before: a duplicate
        stores_for(app).redis().incr(counter)
        cursor.execute(_HANDROLLED_DONE, (json.dumps(None), idem_bench_handrolled.name, key))
