"""Tasks of the topology tests (loaded by every test worker; only the Sentinel failover test
runs them in workers of its own).

`guarded` carries the guards that keep state in the guard Redis on its hot path (breaker,
retry budget, rate limit, concurrency lease, idempotency with its Redis fast path) and
records each execution of its body in PostgreSQL, so a test counts executions per key.
"""

from __future__ import annotations

import os
from typing import Any

from kombu import Exchange, Queue
from sqlalchemy import create_engine, text

from jobs import app
from resilience.circuit import circuit_breaker
from resilience.idempotency import idempotent
from resilience.ratelimit import limit_concurrency, rate_limit
from resilience.retry import retry_policy

#: The queue of `guarded`, consumed only by the Sentinel test's own workers (whose guard
#: Redis is the Sentinel master), never by the session's tier workers.
QUEUE = "topology"


def register_queue(celery_app: Any) -> None:
    """Declare `QUEUE` on `celery_app` (task_create_missing_queues is off)."""
    if QUEUE not in celery_app.amqp.queues:
        celery_app.amqp.queues.add(Queue(QUEUE, Exchange("jobs", type="direct"),
                                         routing_key=QUEUE))


register_queue(app)

CREATE_TABLE = """
CREATE TABLE IF NOT EXISTS topology_executions (
    id bigserial PRIMARY KEY,
    run text NOT NULL,
    n integer NOT NULL,
    pid integer NOT NULL,
    at timestamptz NOT NULL DEFAULT clock_timestamp()
)
"""

_engines: dict[int, Any] = {}


def _engine() -> Any:
    """This process's engine on the session database (direct, not the guards' own)."""
    engine = _engines.get(os.getpid())
    if engine is None:
        url = os.environ["DATABASE_URL"].replace("postgresql://", "postgresql+psycopg2://", 1)
        engine = _engines[os.getpid()] = create_engine(url, pool_size=2, max_overflow=2)
    return engine


@app.task(tier="standard", name="tests.topology.guarded", queue=QUEUE)
@circuit_breaker("topology-dependency", minimum_calls=1000, on_store_down="fail_open")
@retry_policy(dependency="topology-dependency", max_attempts=3)
@rate_limit("topology-rate:{run}", "1000/s", on_store_down="fail_open")
@limit_concurrency("topology-slots:{run}", 8, on_store_down="fail_open")
@idempotent(key="{run}:{n}")
def guarded(run: str, n: int) -> int:
    """Record one execution of key (`run`, `n`); return `n`."""
    with _engine().begin() as connection:
        connection.execute(
            text("INSERT INTO topology_executions (run, n, pid) VALUES (:run, :n, :pid)"),
            {"run": run, "n": n, "pid": os.getpid()},
        )
    return n
