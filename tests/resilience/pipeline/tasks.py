"""Tasks of the pipeline-contract tests: guard stacks whose composition the review broke."""

from __future__ import annotations

from typing import Any

from sqlalchemy import text

from jobs import app
from resilience.admission import bulkhead
from resilience.circuit import circuit_breaker
from resilience.idempotency import idempotent, unique
from resilience.locks import exclusive, singleton
from resilience.ratelimit import limit_concurrency, rate_limit
from resilience.retry import retry_policy
from resilience.stores import stores_for

CREATE_TABLES = """
CREATE TABLE IF NOT EXISTS pipeline_test_effects (
    id bigserial PRIMARY KEY,
    run_id text NOT NULL,
    key text NOT NULL,
    task_id text,
    written_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
"""


def _write(session: Any, run_id: str, key: str, task_id: str | None) -> None:
    statement = text("INSERT INTO pipeline_test_effects (run_id, key, task_id) "
                     "VALUES (:run_id, :key, :task_id)")
    values = {"run_id": run_id, "key": key, "task_id": task_id}
    if session is not None:
        session.execute(statement, values)
        return
    with stores_for(app).engine().begin() as connection:
        connection.execute(statement, values)


# -- scenario 1: a deferral inside caller_runs / apply() -------------------------------------
@app.task(bind=True, tier="standard", name="tests.pipeline.storm")
@bulkhead(max_queue_depth=1, policy="caller_runs")
@rate_limit("pipeline-storm:{key}", "1/hour")
def storm(self: Any, run_id: str, key: str) -> str:
    _write(None, run_id, key, self.request.id)
    return key


# -- scenario 2: a unique key and a refused publish ------------------------------------------
@app.task(tier="standard", name="tests.pipeline.unique_abort")
@unique(ttl_seconds=300, key="{key}")
@bulkhead(max_queue_depth=1, policy="abort")
def unique_abort(run_id: str, key: str) -> str:
    _write(None, run_id, key, None)
    return key


# -- scenario 3: the transactional commit inside the lock -------------------------------------
@app.task(bind=True, tier="critical", name="tests.pipeline.paid_singleton")
@idempotent(key="{key}", transactional=True)
@singleton(key="{key}", policy="defer")
def paid_singleton(self: Any, run_id: str, key: str, session: Any = None) -> str:
    _write(session, run_id, key, self.request.id)
    return key


@app.task(bind=True, tier="critical", name="tests.pipeline.paid_exclusive")
@idempotent(key="{key}", transactional=True)
@exclusive(key="{key}", ttl_seconds=30, policy="defer")
def paid_exclusive(self: Any, run_id: str, key: str, session: Any = None) -> str:
    _write(session, run_id, key, self.request.id)
    return key


# -- canvas -------------------------------------------------------------------------------------
@app.task(bind=True, tier="critical", name="tests.pipeline.skipper")
@singleton(key="{key}", policy="skip")
def skipper(self: Any, run_id: str, key: str) -> str:
    _write(None, run_id, key, self.request.id)
    return f"ran {key}"


@app.task(bind=True, tier="critical", name="tests.pipeline.after")
def after(self: Any, previous: Any, run_id: str) -> Any:
    _write(None, run_id, "after", self.request.id)
    return previous


@app.task(bind=True, tier="critical", name="tests.pipeline.value")
@idempotent(key="{key}")
def value(self: Any, run_id: str, key: str, amount: int) -> int:
    _write(None, run_id, key, self.request.id)
    return amount


@app.task(tier="critical", name="tests.pipeline.total")
def total(values: list[Any]) -> Any:
    if not all(isinstance(item, int) for item in values):
        return {"not numbers": values}
    return sum(values)


# -- the payment stack: every execution guard a payment job stacks -----------------------------
@app.task(bind=True, tier="critical", name="tests.pipeline.charge")
@idempotent(key="charge:{order_id}", transactional=True)
@singleton(key="account:{account}", policy="defer")
@circuit_breaker("payments-api", failure_rate_threshold=0.5, minimum_calls=20)
@limit_concurrency("payments-api", 10)
@rate_limit("payments:{account}", "100/minute")
@retry_policy(max_attempts=4, dependency="payments-api")
def charge(self: Any, order_id: str, account: str, amount_cents: int,
           session: Any = None) -> dict[str, Any]:
    _write(session, f"charge-{account}", order_id, self.request.id)
    return {"order_id": order_id, "amount_cents": amount_cents}


# -- Celery's own features inside a stack -------------------------------------------------------
def _attempts(run_id: str, key: str) -> int:
    """How many times this key's body started (an autocommit counter, outside any guard)."""
    with stores_for(app).engine().begin() as connection:
        connection.execute(text(
            "CREATE TABLE IF NOT EXISTS pipeline_test_attempts "
            "(run_id text, key text, n int, PRIMARY KEY (run_id, key))"))
        return int(connection.execute(text(
            "INSERT INTO pipeline_test_attempts VALUES (:r, :k, 1) ON CONFLICT (run_id, key) "
            "DO UPDATE SET n = pipeline_test_attempts.n + 1 RETURNING n"),
            {"r": run_id, "k": key}).scalar_one())


@app.task(bind=True, tier="critical", name="tests.pipeline.self_retry", max_retries=3)
@idempotent(key="{key}", transactional=True)
@singleton(key="{key}", policy="defer")
def self_retry(self: Any, run_id: str, key: str, session: Any = None) -> str:
    _write(session, run_id, key, self.request.id)
    if _attempts(run_id, key) == 1:
        raise self.retry(countdown=0.2)
    return key


@app.task(bind=True, tier="critical", name="tests.pipeline.auto_retry",
          autoretry_for=(ConnectionError,), max_retries=3, default_retry_delay=0.2,
          retry_backoff=False, retry_jitter=False)
@idempotent(key="{key}", transactional=True)
def auto_retry(self: Any, run_id: str, key: str, session: Any = None) -> str:
    _write(session, run_id, key, self.request.id)
    if _attempts(run_id, key) == 1:
        raise ConnectionError("vendor reset the connection")
    return key


@app.task(bind=True, tier="critical", name="tests.pipeline.due_later", deadline_seconds=2)
def due_later(self: Any, run_id: str, key: str) -> str:
    _write(None, run_id, key, self.request.id)
    return key


@app.task(bind=True, tier="critical", name="tests.pipeline.held")
@singleton(key="{key}", policy="defer", defer_seconds=0.3)
def held(self: Any, run_id: str, key: str) -> str:
    _write(None, run_id, key, self.request.id)
    return key


@app.task(bind=True, tier="critical", name="tests.pipeline.held_unique")
@unique(ttl_seconds=300, mode="until_finished", key="{key}")
@singleton(key="{key}", policy="defer", defer_seconds=0.3)
def held_unique(self: Any, run_id: str, key: str) -> str:
    _write(None, run_id, key, self.request.id)
    return key


@app.task(bind=True, tier="critical", name="tests.pipeline.loses_lock")
@idempotent(key="{key}", transactional=True)
@singleton(key="{key}", policy="defer")
def loses_lock(self: Any, run_id: str, key: str, session: Any = None,
               checkpoint: Any = None) -> str:
    """Writes, then finds at checkpoint() that its advisory-lock session is gone."""
    from resilience.locks.backends.postgres import _SESSIONS

    _write(session, run_id, key, self.request.id)
    # As a PostgreSQL restart would: the lock is held on the thread's own connection when
    # the lock URL is the database URL with no pooler (`SharedSessionLock`), else on the
    # thread's lock session; both go.
    stores_for(app).statements().connection().driver.close()
    lock_session = getattr(_SESSIONS.local, "session", None)
    if lock_session is not None:
        lock_session.connection.close()
    checkpoint()
    return key


def effects(engine: Any, run_id: str) -> list[str]:
    """The keys whose effect rows `run_id` wrote, in order (what the tests assert on)."""
    with engine.connect() as connection:
        return list(connection.execute(
            text("SELECT key FROM pipeline_test_effects WHERE run_id = :r ORDER BY id"),
            {"r": run_id}).scalars())
