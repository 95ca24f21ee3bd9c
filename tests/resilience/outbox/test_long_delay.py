"""Long delays: a countdown beyond JOBS_MAX_COUNTDOWN_SECONDS waits in the outbox, not in
the broker, so it is neither redelivered past the visibility timeout nor run early."""

from __future__ import annotations

import statistics
import time
import uuid
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.orm import Session

from tests.chaos import restore_unacked
from tests.resilience.outbox import tasks
from tests.resilience.outbox.relays import RelayProcess, effects, outbox_rows
from tests.support import wait_for

JOBS = 200
ENQUEUED_IN_TRANSACTION = 50
#: The worker's limits, shrunk so a countdown of 3x the visibility timeout fits in a test:
#: visibility must be >= max(hard time limit, max countdown) + 30 (the Settings rule).
VISIBILITY_TIMEOUT_SECONDS = 32
WORKER_ENV = {
    **{f"JOBS_{tier}__SOFT_TIME_LIMIT_SECONDS": "1.5"
       for tier in ("CRITICAL", "STANDARD", "OPTIONAL")},
    **{f"JOBS_{tier}__HARD_TIME_LIMIT_SECONDS": "2"
       for tier in ("CRITICAL", "STANDARD", "OPTIONAL")},
    "JOBS_MAX_COUNTDOWN_SECONDS": "1",
    "JOBS_VISIBILITY_TIMEOUT_SECONDS": str(VISIBILITY_TIMEOUT_SECONDS),
    # Other suites' tasks declare time limits this visibility timeout could not cover.
    "JOBS_IMPORTS": "tests.resilience.outbox.tasks",
}
COUNTDOWN_SECONDS = 3 * VISIBILITY_TIMEOUT_SECONDS


def in_broker(app: Any, task_ids: set[str]) -> int:
    """How many of `task_ids` sit in the critical queue or the unacknowledged set."""
    with app.connection_for_write() as connection:
        client = connection.default_channel.client
        raw = [*client.lrange("critical", 0, -1), *client.hvals("unacked")]
    decoded = [m.decode() if isinstance(m, bytes) else str(m) for m in raw]
    return sum(1 for message in decoded if any(task_id in message for task_id in task_ids))


@pytest.mark.soak
@pytest.mark.timeout(300)
def test_countdown_three_times_the_visibility_timeout_runs_once_and_not_early(
    app: Any, engine: Any, worker_factory: Callable[..., Any],
) -> None:
    """~200 jobs with a countdown of 3x the visibility timeout (apply_async and enqueue_in):
    none is in the broker before it is due, each runs once, none before its due time.
    About 110 s: `make stress` runs it; `make test` runs the short variant below."""
    run_long_delay(app, engine, worker_factory, jobs=JOBS,
                   in_transaction=ENQUEUED_IN_TRANSACTION, countdown_seconds=COUNTDOWN_SECONDS)


@pytest.mark.timeout(120)
def test_countdown_beyond_the_maximum_waits_in_the_outbox(
    app: Any, engine: Any, worker_factory: Callable[..., Any], monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The same path, short: 40 jobs with an 8 s countdown, beyond this producer's 1 s
    maximum, wait in the outbox (none in the broker), then each runs once and none early."""
    monkeypatch.setitem(app.conf, "resilience_max_countdown_seconds", 1)
    run_long_delay(app, engine, worker_factory, jobs=40, in_transaction=10,
                   countdown_seconds=8)


def run_long_delay(app: Any, engine: Any, worker_factory: Callable[..., Any], *, jobs: int,
                   in_transaction: int, countdown_seconds: float) -> None:
    """Enqueue `jobs` with `countdown_seconds` (the last `in_transaction` of them with
    apply_async_in), restore unacked messages every second, and check each ran once, never
    before due, and that none sat in the broker meanwhile."""
    run = uuid.uuid4().hex[:10]
    with engine.begin() as connection:
        connection.execute(tasks.CREATE_LEDGER)
        connection.execute(text("DELETE FROM resilience_outbox"))
    worker = worker_factory("critical", name="outboxdelay", concurrency=2, env=WORKER_ENV,
                            wait=False)
    relay = RelayProcess(name="delay").start()
    try:
        worker.wait_ready()
        relay.wait_ready(1)
        assert app.conf.resilience_max_countdown_seconds < countdown_seconds
        started = time.monotonic()
        ids = [tasks.outbox_effect.apply_async((run, n), countdown=countdown_seconds).id
               for n in range(jobs - in_transaction)]
        with Session(engine) as session, session.begin():
            ids += [tasks.outbox_effect.apply_async_in(session, (run, n),
                                                       countdown=countdown_seconds).id
                    for n in range(jobs - in_transaction, jobs)]
        enqueued = time.monotonic() - started
        rows = outbox_rows(engine, ids)
        assert len(rows) == jobs and {row.state for row in rows} == {"pending"}
        time.sleep(2.0)
        assert in_broker(app, set(ids)) == 0, "a delayed job sits in the broker"
        while time.monotonic() - started < countdown_seconds - 5:
            restore_unacked(app, VISIBILITY_TIMEOUT_SECONDS)
            assert effects(engine, run) == [], "a job ran before its due time"
            time.sleep(1.0)
        deadline = time.monotonic() + 60
        while len(effects(engine, run)) < jobs and time.monotonic() < deadline:
            restore_unacked(app, VISIBILITY_TIMEOUT_SECONDS)
            time.sleep(0.5)
        for _ in range(5):  # a redelivery would land now
            restore_unacked(app, VISIBILITY_TIMEOUT_SECONDS)
            time.sleep(1.0)
    finally:
        relay.stop()
    found = effects(engine, run)
    assert Counter(row.task_id for row in found) == Counter(ids), "each job runs exactly once"
    due = {row.task_id: row.due_at for row in outbox_rows(engine, ids)}
    late = [(row.ran_at - due[row.task_id]).total_seconds() for row in found]
    print(f"long delay: {jobs} jobs enqueued in {enqueued:.1f}s, countdown "
          f"{countdown_seconds}s; ran after due by min {min(late):.3f}s, median "
          f"{statistics.median(late):.3f}s, max {max(late):.3f}s")
    assert min(late) >= 0, "a job ran before its due time"
    wait_for(lambda: {row.state for row in outbox_rows(engine, ids)} == {"published"},
             timeout_seconds=5, message="every row marked published")
