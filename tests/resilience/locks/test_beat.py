"""Two real `celery beat` processes with the leader-elected scheduler."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

from resilience.locks import AdvisorySession
from resilience.locks.beat import LEADER_KEY
from tests.harness import ARTIFACTS, ROOT, wait_for

pytestmark = [pytest.mark.usefixtures("locks_tables", "own_critical_queue", "purge_queues")]


class Beat:
    """One `celery -A jobs beat -S resilience.locks.beat:LeaderElectedScheduler` process."""

    def __init__(self, name: str, folder: Path, env: dict[str, str]) -> None:
        self.log_path = ARTIFACTS / "beat" / f"{name}.log"
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        command = [sys.executable, "-m", "celery", "-A", "jobs", "beat",
                   "-S", "resilience.locks.beat:LeaderElectedScheduler",
                   "-s", str(folder / f"{name}-schedule"), "--loglevel", "INFO"]
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                command, cwd=ROOT, env={**os.environ, **env, "PYTHONPATH": str(ROOT)},
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            )

    @property
    def pid(self) -> int:
        return self.process.pid

    def signal(self, signum: int) -> None:
        os.killpg(self.process.pid, signum)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.signal(signal.SIGKILL)
            self.process.wait(10)


def leader_pid(stores: Any) -> int | None:
    with AdvisorySession(stores.database_url, label="probe") as probe:
        holders = probe.holders(LEADER_KEY)
    if not holders:
        return None
    return int((holders[0].owner or "").rsplit(":", 1)[1])


def executions(engine: Any, run_id: str) -> list[Any]:
    with engine.connect() as connection:
        return list(connection.execute(
            text("SELECT slot, ran_at FROM locks_test_beat WHERE run_id = :run_id "
                 "ORDER BY ran_at"), {"run_id": run_id}))


@pytest.mark.chaos
@pytest.mark.timeout(180)
def test_leader_killed_takeover_without_double_sends(
    worker_factory: Any, engine: Any, stores: Any, run_id: str, tmp_path: Path,
) -> None:
    """Two beats: one leads; SIGKILL it, the other takes over; no slot runs twice;
    SIGTERM of the new leader gives leadership up at once."""
    worker_factory("critical", name="locks-beat", concurrency=1)
    env = {"RESILIENCE_BEAT_SCHEDULE": "tests.resilience.locks.beat_schedule_fixture",
           "LOCKS_TEST_RUN_ID": run_id, "LOCKS_TEST_PERIOD_SECONDS": "1.0",
           "RESILIENCE_BEAT_POLL_SECONDS": "0.5"}
    beats = [Beat(f"beat-{run_id}-{i}", tmp_path, env) for i in range(2)]
    try:
        first_leader = wait_for(lambda: leader_pid(stores), timeout_seconds=60,
                                message="a beat leads")
        wait_for(lambda: len(executions(engine, run_id)) >= 3, timeout_seconds=60,
                 message="leader schedules")
        leader = next(beat for beat in beats if beat.pid == first_leader)
        standby = next(beat for beat in beats if beat is not leader)

        leader.signal(signal.SIGKILL)
        killed_at = time.time()
        leader.process.wait(10)
        wait_for(lambda: leader_pid(stores) == standby.pid, timeout_seconds=30,
                 message="standby takes over")
        wait_for(lambda: any(row.ran_at.timestamp() > killed_at + 0.1
                             for row in executions(engine, run_id)) and
                 sum(row.ran_at.timestamp() > killed_at for row in executions(engine, run_id))
                 >= 3, timeout_seconds=60, message="new leader schedules")
        first_after = min(row.ran_at.timestamp() for row in executions(engine, run_id)
                          if row.ran_at.timestamp() > killed_at)
        print(f"first periodic run {first_after - killed_at:.2f}s after SIGKILL of the leader")

        standby.signal(signal.SIGTERM)
        terminated_at = time.monotonic()
        with AdvisorySession(stores.database_url, label="probe") as probe:
            wait_for(lambda: probe.try_acquire(LEADER_KEY), timeout_seconds=30,
                     interval=0.02, message="leadership released on SIGTERM")
        print(f"leadership free {time.monotonic() - terminated_at:.2f}s after SIGTERM")
        standby.process.wait(15)
    finally:
        for beat in beats:
            beat.stop()

    rows = executions(engine, run_id)
    slots = [row.slot for row in rows]
    assert all(slots), "every periodic message carries its slot"
    assert len(slots) == len(set(slots)), f"a slot ran twice: {sorted(slots)}"
    assert first_after - killed_at < 30
