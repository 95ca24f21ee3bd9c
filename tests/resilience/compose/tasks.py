"""Tasks of the composition matrix: one per pair of execution guards, plus the payment stack.

Every task has the same body (`execute`); only its guards differ. The body

1. counts its attempt and records its execution (start time, pid, task id, lock token) in
   `compose_executions`, committed at once, so a SIGKILLed execution stays visible;
2. sleeps `pause` seconds (a window for the SIGKILL and for overlapping duplicates);
3. raises `ConnectionError` (retryable) while the key's attempt number is <= `fail_first`;
4. calls the lock guard's `checkpoint()`, as the locks documentation asks of a body that
   commits an effect, then writes one row into `compose_effects`: through the injected
   `session` when the idempotency guard is transactional (committed by the guard together
   with the idempotency record), else on its own autocommit connection;
5. records its end time (also when it raised).

The bookkeeping of steps 1 and 5 and the non-transactional effect use the *recorder*
database URL, which reaches PostgreSQL directly, never through the fault-injection proxy:
an outage must change what the guards do, not hide executions from the invariants. The
transactional effect goes through the guard's own connection (the proxied one in the
compose workers), because that commit is what the guards protect.

Limits are generous and delays short so a matrix example drains in seconds: a rate of
20/s and 2 concurrency slots for 4 pool processes defer a burst but never for long; lock
deferrals 0.2 s; idempotency store-down deferrals 0.5 s; retries after 0.05-0.2 s.
`time_limit=6` lets the concurrency slot lease (which must cover the hard limit) be 6 s,
so a SIGKILLed holder's slot returns within the example. The idempotency lease is 3 s
(allowed in transactional mode: a stale holder's commit is fenced), so a killed claim is
taken over quickly. Exclusive leases are 2 s with a heartbeat, for the same reason.

Tasks go to their own queue, `compose`, consumed only by the compose workers (conftest),
which reach Redis and PostgreSQL through the proxies. `compose-inline` has no consumer:
the caller-runs test fills it to its depth limit of 1.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from itertools import combinations
from typing import Any

from kombu import Exchange, Queue
from sqlalchemy import create_engine, text

from jobs import app
from resilience.admission import bulkhead
from resilience.circuit import circuit_breaker
from resilience.idempotency import idempotent
from resilience.locks import exclusive, singleton
from resilience.ratelimit import limit_concurrency, rate_limit
from resilience.retry import RetryBudget, retry_policy, wait_full_jitter

TIER = "critical"
QUEUE = "compose"
INLINE_QUEUE = "compose-inline"
#: Hard and soft time limits of the compose tasks (see the module docstring).
TIME_LIMIT_SECONDS = 6
SOFT_TIME_LIMIT_SECONDS = 5
#: Guard parameters the invariants need to know.
CONCURRENCY_LIMIT = 2
RATE = "20/s"
MAX_ATTEMPTS = 4
#: Environment variable naming the recorder's direct PostgreSQL URL (compose workers);
#: unset, the process's DATABASE_URL is used (the producer's is direct already).
RECORDER_URL_VARIABLE = "COMPOSE_RECORDER_DATABASE_URL"

#: The execution guards of the matrix, by short name.
GUARDS = ("idempotent", "singleton", "exclusive", "breaker", "concurrency", "rate", "retry")
#: Two guards that share the exclusivity stage: a stack with both is a configuration error.
STAGE_CLASH = frozenset({"singleton", "exclusive"})
LOCKS = ("singleton", "exclusive")


def register_queues(celery_app: Any) -> None:
    """Declare the compose queues on `celery_app` (task_create_missing_queues is False).

    Called at import by this module (producer and every test worker) and by `worker_app`
    before the worker reads `-Q compose`.
    """
    exchange = Exchange("jobs", type="direct")
    for name in (QUEUE, INLINE_QUEUE):
        if name not in celery_app.amqp.queues:
            celery_app.amqp.queues.add(Queue(name, exchange, routing_key=name))


register_queues(app)


@dataclass(frozen=True)
class Stack:
    """A combination of execution guards, and what the invariants may expect of it."""

    name: str
    guards: tuple[str, ...]

    @property
    def task_name(self) -> str:
        return f"tests.compose.{self.name}"

    @property
    def transactional(self) -> bool:
        """Effects commit with the idempotency record: exactly once per key."""
        return "idempotent" in self.guards

    @property
    def lock(self) -> str | None:
        """The lock guard of the stack (singleton or exclusive), if any."""
        return next((guard for guard in self.guards if guard in LOCKS), None)

    @property
    def retries(self) -> bool:
        return "retry" in self.guards

    @property
    def commit_inside_lock(self) -> bool:
        """A transactional commit that must happen while the lock is held."""
        return self.transactional and self.lock is not None

    def lock_key(self, run: str, key: str) -> str | None:
        """The key both lock guards register in `resilience_held_locks`."""
        return f"{self.task_name}:{run}:{key}" if self.lock else None


PAIRS = tuple(
    Stack(f"{first}+{second}", (first, second))
    for first, second in combinations(GUARDS, 2)
    if {first, second} != STAGE_CLASH
)
#: The README's payment task plus a singleton: every guard kind but exclusive.
PAYMENT = Stack("payment", ("idempotent", "singleton", "breaker", "rate", "concurrency", "retry"))
STACKS = (*PAIRS, PAYMENT)


# -- the recorder ---------------------------------------------------------------------------
_engines: dict[int, Any] = {}
_engines_lock = threading.Lock()


def recorder() -> Any:
    """This process's engine on the recorder database (direct, autocommit per `begin()`)."""
    pid = os.getpid()
    engine = _engines.get(pid)
    if engine is None:
        with _engines_lock:
            engine = _engines.get(pid)
            if engine is None:
                url = os.environ.get(RECORDER_URL_VARIABLE) or os.environ["DATABASE_URL"]
                url = url.replace("postgresql://", "postgresql+psycopg2://", 1)
                engine = create_engine(url, pool_pre_ping=True, pool_size=2, max_overflow=4)
                _engines.clear()
                _engines[pid] = engine
    return engine


CREATE_TABLES = """
CREATE TABLE IF NOT EXISTS compose_attempts (
    run text NOT NULL,
    key text NOT NULL,
    attempts integer NOT NULL,
    PRIMARY KEY (run, key)
);
CREATE TABLE IF NOT EXISTS compose_executions (
    id bigserial PRIMARY KEY,
    run text NOT NULL,
    stack text NOT NULL,
    key text NOT NULL,
    task_id text,
    pid integer NOT NULL,
    inline boolean NOT NULL,
    attempt integer NOT NULL,
    token bigint,
    started_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    ended_at timestamptz,
    raised text
);
CREATE INDEX IF NOT EXISTS compose_executions_run ON compose_executions (run);
CREATE TABLE IF NOT EXISTS compose_effects (
    id bigserial PRIMARY KEY,
    run text NOT NULL,
    stack text NOT NULL,
    key text NOT NULL,
    task_id text,
    execution_id bigint,
    lock_key text,
    token bigint,
    written_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX IF NOT EXISTS compose_effects_run ON compose_effects (run);
CREATE TABLE IF NOT EXISTS compose_violations (
    id bigserial PRIMARY KEY,
    effect_id bigint,
    run text,
    key text,
    lock_key text,
    token bigint,
    task_id text,
    holder text,
    observed_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
"""

#: Runs inside COMMIT of every effect (a deferred constraint trigger): the lock that
#: protected the effect must still be registered as held by the writer (same key, same
#: token) when the effect commits. If not, the effect commits anyway, together with a
#: violation row naming what the registry held instead, for the test to report.
CREATE_TRIGGER = """
CREATE OR REPLACE FUNCTION compose_commit_inside_lock() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    found text;
BEGIN
    IF NEW.lock_key IS NULL THEN
        RETURN NULL;
    END IF;
    IF EXISTS (SELECT 1 FROM resilience_held_locks
               WHERE key = NEW.lock_key AND (NEW.token IS NULL OR token = NEW.token)) THEN
        RETURN NULL;
    END IF;
    SELECT coalesce(string_agg(format('%s token %s task %s', kind, token, task_id), '; '),
                    'nobody')
      INTO found FROM resilience_held_locks WHERE key = NEW.lock_key;
    INSERT INTO compose_violations (effect_id, run, key, lock_key, token, task_id, holder)
    VALUES (NEW.id, NEW.run, NEW.key, NEW.lock_key, NEW.token, NEW.task_id, found);
    RETURN NULL;
END
$$;
DROP TRIGGER IF EXISTS compose_commit_inside_lock ON compose_effects;
CREATE CONSTRAINT TRIGGER compose_commit_inside_lock
    AFTER INSERT ON compose_effects
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW EXECUTE FUNCTION compose_commit_inside_lock();
"""

_START = text("""
WITH counted AS (
    INSERT INTO compose_attempts (run, key, attempts) VALUES (:run, :key, 1)
    ON CONFLICT (run, key) DO UPDATE SET attempts = compose_attempts.attempts + 1
    RETURNING attempts
)
INSERT INTO compose_executions (run, stack, key, task_id, pid, inline, attempt, token)
SELECT :run, :stack, :key, :task_id, :pid, :inline, attempts, :token FROM counted
RETURNING id, attempt
""")
_END = text("UPDATE compose_executions SET ended_at = clock_timestamp(), raised = :raised "
            "WHERE id = :id")
_EFFECT = text("""
INSERT INTO compose_effects (run, stack, key, task_id, execution_id, lock_key, token)
VALUES (:run, :stack, :key, :task_id, :execution_id, :lock_key, :token) RETURNING id
""")


def execute(task: Any, stack: Stack, run: str, key: str, fail_first: int, pause: float,
            session: Any, fencing_token: int | None,
            checkpoint: Callable[[], None] | None) -> dict[str, Any]:
    """The body of every compose task (see the module docstring)."""
    request = task.request
    with recorder().begin() as connection:
        execution_id, attempt = connection.execute(_START, {
            "run": run, "stack": stack.name, "key": key, "task_id": request.id,
            "pid": os.getpid(), "inline": bool(getattr(request, "is_eager", False)),
            "token": fencing_token,
        }).one()
    raised: str | None = None
    try:
        if pause:
            time.sleep(pause)
        if attempt <= fail_first:
            raise ConnectionError(f"compose: injected failure {attempt} of {fail_first} "
                                  f"for key {key}")
        if checkpoint is not None:
            checkpoint()
        effect = {"run": run, "stack": stack.name, "key": key, "task_id": request.id,
                  "execution_id": execution_id, "lock_key": stack.lock_key(run, key),
                  "token": fencing_token}
        if session is not None:
            session.execute(_EFFECT, effect)
        else:
            with recorder().begin() as connection:
                connection.execute(_EFFECT, effect)
    except BaseException as exc:
        raised = f"{type(exc).__name__}: {exc}"[:500]
        raise
    finally:
        with recorder().begin() as connection:
            connection.execute(_END, {"id": execution_id, "raised": raised})
    return {"run": run, "key": key, "attempt": attempt, "execution_id": execution_id}


# -- the guards, one factory per short name -------------------------------------------------
def _decorators(stack: Stack) -> dict[str, Callable[[Callable[..., Any]], Callable[..., Any]]]:
    """One decorator per guard short name. The singleton defers and the exclusive lock
    skips, so both lock policies meet every other guard. Limits and breakers are named
    after the stack: stacks never share their state."""
    name = f"compose-{stack.name}"
    return {
        "idempotent": idempotent(key="{run}:{key}", transactional=True, lease_seconds=3,
                                 poll_seconds=0.3, store_down_retry_seconds=0.5),
        "singleton": singleton(key="{run}:{key}", policy="defer", defer_seconds=0.2,
                               same_task_wait_seconds=1.0),
        "exclusive": exclusive(key="{run}:{key}", ttl_seconds=2, policy="skip",
                               defer_seconds=0.2, same_task_wait_seconds=3.0),
        "breaker": circuit_breaker(name, failure_rate_threshold=0.5, minimum_calls=20,
                                   window=20, open_seconds=1, half_open_probes=2,
                                   probe_timeout_seconds=3),
        "concurrency": limit_concurrency(name, CONCURRENCY_LIMIT,
                                         lease_seconds=TIME_LIMIT_SECONDS, retry_seconds=0.1),
        "rate": rate_limit(name, RATE, retry_seconds=0.2),
        "retry": retry_policy(max_attempts=MAX_ATTEMPTS,
                              backoff=wait_full_jitter(base=0.05, cap=0.2),
                              budget=RetryBudget(ratio=0.5, min_per_second=5)),
    }


def build(stack: Stack, *, name: str | None = None) -> Any:
    """The task of `stack`: the shared body under the stack's guards, on the compose queue.

    Args:
        stack: the guards, by short name.
        name: the task name; None is the stack's (tests that build a stack of their own
            pass another, so the tasks every worker loads stay the generated ones).
    """

    def body(self: Any, run: str, key: str, fail_first: int = 0, pause: float = 0.0,
             session: Any = None, fencing_token: int | None = None,
             checkpoint: Callable[[], None] | None = None) -> dict[str, Any]:
        return execute(self, stack, run, key, fail_first, pause, session, fencing_token,
                       checkpoint)

    body.__name__ = body.__qualname__ = f"compose_{stack.name.replace('+', '_')}"
    func: Callable[..., Any] = body
    decorators = _decorators(stack)
    for guard in stack.guards:
        func = decorators[guard](func)
    return app.task(tier=TIER, bind=True, name=name or stack.task_name, queue=QUEUE,
                    time_limit=TIME_LIMIT_SECONDS,
                    soft_time_limit=SOFT_TIME_LIMIT_SECONDS)(func)


TASKS: dict[str, Any] = {stack.name: build(stack) for stack in STACKS}


# -- caller-runs: a deferring guard under a bulkhead of depth 1 --------------------------------
@app.task(tier=TIER, bind=True, name="tests.compose.inline.rate", queue=INLINE_QUEUE)
@bulkhead(max_queue_depth=1, policy="caller_runs")
@rate_limit("compose-inline:{run}", "1/minute")
def inline_rate(self: Any, run: str, n: int) -> dict[str, Any]:
    """Rate limited to one run a minute per `run`: the second inline run is deferred."""
    return {"run": run, "n": n, "ran": True}


@app.task(tier=TIER, bind=True, name="tests.compose.inline.singleton", queue=INLINE_QUEUE)
@bulkhead(max_queue_depth=1, policy="caller_runs")
@singleton(key="{run}", policy="defer", defer_seconds=0.5)
def inline_singleton(self: Any, run: str, n: int) -> dict[str, Any]:
    """A singleton that defers while the test holds its advisory lock."""
    return {"run": run, "n": n, "ran": True}
