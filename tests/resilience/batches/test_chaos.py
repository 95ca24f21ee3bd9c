"""Batch chaos (soak): a 2,000-member batch while worker processes are SIGKILLed.

Invariants: every member ends with exactly one final state and the tallies match the
ledger (one effect per member); the batch completes once; on_success and on_complete each
take effect exactly once (a row in a ledger without a unique constraint). `make stress`
runs it (`pytest -m soak`); `test_batches.py` is its small version in `make test`.
"""

from __future__ import annotations

import json
import os
import random
import time
from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import text

from resilience.batches import batch
from tests.chaos import chaos_loop, restore_unacked, supervise
from tests.resilience.batches import tasks

MEMBERS = int(os.environ.get("BATCH_CHAOS_MEMBERS", "2000"))
CHAOS_SECONDS = 60
MAX_WHOLE_WORKER_KILLS = 2
#: Short limits so a whole-worker SIGKILL's unacked messages come back within the test, and
#: enough deliveries that the poison check never dead-letters a member the test killed.
WORKER_ENV = {
    **{f"JOBS_{tier}__SOFT_TIME_LIMIT_SECONDS": "8"
       for tier in ("CRITICAL", "STANDARD", "OPTIONAL")},
    **{f"JOBS_{tier}__HARD_TIME_LIMIT_SECONDS": "10"
       for tier in ("CRITICAL", "STANDARD", "OPTIONAL")},
    "JOBS_MAX_COUNTDOWN_SECONDS": "5",
    "JOBS_VISIBILITY_TIMEOUT_SECONDS": "45",
    "JOBS_MAX_DELIVERIES": "1000",
}


def callbacks(engine: Any, run: str, table: str) -> list[tuple[str, str]]:
    with engine.connect() as connection:
        return sorted(tuple(row) for row in connection.execute(
            text(f"SELECT batch_id, kind FROM {table} WHERE run = :run"), {"run": run}).all())


@pytest.mark.soak
@pytest.mark.chaos
@pytest.mark.timeout(1200)
def test_a_2000_member_batch_under_sigkill_fires_each_callback_once(
        app: Any, engine: Any, worker_factory: Callable[..., Any], relay: Any, run: str,
        purge_queues: None) -> None:
    """2,000 members, pool processes SIGKILLed every few hundred ms and whole workers twice:
    2,000 succeeded, one ledger row each, each callback's effect exactly once."""
    rng = random.Random(15)
    started = time.monotonic()
    result = batch([tasks.member.s(run, n, pause_seconds=0.01) for n in range(MEMBERS)],
                   on_success=tasks.callback.s(run), on_complete=tasks.callback.s(run),
                   description="chaos", app=app).apply_async()
    print(f"batch of {MEMBERS} written in {time.monotonic() - started:.1f}s")
    workers = [worker_factory("critical", name=f"batch-chaos{index}", concurrency=2,
                              env=WORKER_ENV, wait=False) for index in range(2)]
    for worker in workers:
        worker.wait_ready()

    chaos_started = time.monotonic()
    kills, last_worker_kill = chaos_loop(
        workers, rng, seconds=CHAOS_SECONDS, max_worker_kills=MAX_WHOLE_WORKER_KILLS,
        done=lambda: len(callbacks(engine, run, "batch_test_callbacks")) == 2)
    print(f"chaos ended at {time.monotonic() - chaos_started:.1f}s: "
          f"{result.summary().pending} pending, kills={kills}")

    # Messages a killed worker held come back after the visibility timeout; past the
    # deadline, wait on only while members keep finishing (a slow drain is not a loss).
    visibility = int(WORKER_ENV["JOBS_VISIBILITY_TIMEOUT_SECONDS"])
    deadline = last_worker_kill + visibility + 120
    expected = sorted([(result.id, "complete"), (result.id, "success")])
    pending, last_progress = result.summary().pending, time.monotonic()
    while callbacks(engine, run, "batch_test_callbacks") != expected:
        now = time.monotonic()
        if now >= deadline and now - last_progress > visibility:
            break
        kills["exited"] += supervise(workers)
        restore_unacked(app, int(WORKER_ENV["JOBS_VISIBILITY_TIMEOUT_SECONDS"]))
        time.sleep(0.5)
        latest = result.summary().pending
        if latest < pending:
            pending, last_progress = latest, time.monotonic()
    time.sleep(2)  # a second copy of a callback, if any, has time to show

    summary = result.summary()
    with engine.connect() as connection:
        effects = connection.execute(text(
            "SELECT n, count(*) AS copies FROM batch_test_effects WHERE run = :run "
            "GROUP BY n"), {"run": run}).all()
    doubled = [row.n for row in effects if row.copies != 1]
    runs = callbacks(engine, run, "batch_test_callback_runs")
    print("batch-chaos-tally " + json.dumps({
        "members": MEMBERS, "tallies": summary.tallies, "pending": summary.pending,
        "effects": len(effects), "doubled": len(doubled), "callback_runs": len(runs),
        "seconds": round(time.monotonic() - started, 1), **kills}))
    assert summary.pending == 0 and summary.complete, f"{summary.pending} members pending"
    assert summary.tallies["succeeded"] == MEMBERS, summary.tallies
    assert sum(summary.tallies.values()) == MEMBERS
    assert len(effects) == MEMBERS and not doubled, f"doubled: {doubled[:5]}"
    assert callbacks(engine, run, "batch_test_callbacks") == expected
    assert set(runs) == set(expected)  # a body killed mid-run may start again, never commit
    assert summary.success_task_id and summary.complete_task_id
    assert kills["child"] > 10, f"too little chaos: {kills}"
