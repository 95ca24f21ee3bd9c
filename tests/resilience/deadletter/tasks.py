"""Tasks of the dead-letter tests (loaded by every test worker)."""

from __future__ import annotations

import os
import signal

from jobs import app
from resilience.circuit import circuit_breaker
from resilience.deadletter.poison import poison_guard
from resilience.retry import RetryBudget, retry_policy
from resilience.stores import stores_for

MAX_DELIVERIES = 2

#: A test worker started with this variable parks an unrecordable intake message for that
#: many seconds before giving it back to its queue (test_intake's outage tests).
PARK_SECONDS_VARIABLE = "TESTS_INTAKE_PARK_SECONDS"
if os.environ.get(PARK_SECONDS_VARIABLE):
    app.conf.resilience_intake_park_seconds = float(os.environ[PARK_SECONDS_VARIABLE])


@app.task(tier="standard")
@poison_guard(max_deliveries=MAX_DELIVERIES)
def failure_poison(counter: str) -> None:
    """Kill the pool process running it, every time: WorkerLostError, requeued at once."""
    stores_for(app).redis().incr(counter)
    os.kill(os.getpid(), signal.SIGKILL)


@app.task(tier="standard")
@poison_guard(max_deliveries=MAX_DELIVERIES)
def failure_echo(value: int) -> int:
    return value


#: The breaker `replay_echo` sits behind (the automatic replay test opens and closes it).
REPLAY_BREAKER = "deadletter-replay"


@app.task(tier="standard")
def bulk_echo(value: int) -> int:
    """The task of the bulk requeue tests' dead letters (its jobs are never run there)."""
    return value


@app.task(tier="standard")
@circuit_breaker(REPLAY_BREAKER, open_seconds=600.0)
def replay_echo(value: int) -> int:
    """Behind a breaker: while it is open, a job with a short `expires` is dead-lettered."""
    return value


#: The dependency whose retry budget `budget_spent` finds spent (ratio 0, no floor).
BUDGET_DEPENDENCY = "deadletter-budget"


@app.task(tier="standard")
@retry_policy(max_attempts=3, dependency=BUDGET_DEPENDENCY,
              budget=RetryBudget(ratio=0.0, min_per_second=0.0))
def budget_spent(fail_with: str) -> None:
    """Fails: `connection` (retryable, the budget refuses the retry) or `value` (not)."""
    raise ConnectionError("the dependency is down") if fail_with == "connection" else ValueError(
        "bad input")
