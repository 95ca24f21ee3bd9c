"""TTL cleanup and the reaper remove or reclaim exactly what they should, even run twice at once."""

from __future__ import annotations

import threading
import uuid
from typing import Any

from sqlalchemy import text

from resilience.idempotency.cleanup import CleanupConfig, reap_abandoned, run_cleanup

INSERT = text(
    """
    INSERT INTO resilience_idempotency_records
        (task_name, key, fingerprint, state, attempt, lease_owner, lease_expires_at, task_id,
         expires_at)
    SELECT :task, :prefix || g, 'f', :state, 1, :owner,
           CASE WHEN :lease IS NULL THEN NULL
                ELSE now() + CAST(:lease AS float8) * interval '1 second' END,
           't', now() + :expires * interval '1 second'
    FROM generate_series(1, :n) AS g
    """
)


def seed(
    engine: Any,
    task: str,
    prefix: str,
    n: int,
    state: str,
    expires: float,
    lease: float | None = None,
) -> None:
    with engine.begin() as connection:
        connection.execute(
            INSERT,
            {
                "task": task,
                "prefix": prefix,
                "n": n,
                "state": state,
                "expires": expires,
                "lease": lease,
                "owner": "o" if state == "in_progress" else None,
            },
        )


def counts(engine: Any, task: str) -> dict[str, int]:
    with engine.connect() as connection:
        rows = connection.execute(
            text(
                "SELECT split_part(key, '-', 1) AS kind, count(*) "
                "FROM resilience_idempotency_records "
                "WHERE task_name = :task GROUP BY 1"
            ),
            {"task": task},
        ).all()
    return {kind: int(n) for kind, n in rows}


class TestCleanup:
    def test_only_expired_finished_records_are_deleted(self, engine: Any) -> None:
        """Two concurrent runs delete all expired finished rows and nothing else."""
        task = f"tests.cleanup.{uuid.uuid4().hex[:8]}"
        seed(engine, task, "expired_ok-", 1500, "succeeded", -60)
        seed(engine, task, "expired_failed-", 700, "failed", -1)
        seed(engine, task, "live_ok-", 800, "succeeded", 3600)
        seed(engine, task, "live_failed-", 100, "failed", 60)
        # Claims are never deleted by cleanup, even when their record TTL has passed.
        seed(engine, task, "claim_live-", 200, "in_progress", -60, lease=60)
        seed(engine, task, "claim_dead-", 200, "in_progress", -60, lease=-3600)
        policy = CleanupConfig(batch_size=97, pause_seconds=0.0, max_batches=1000)
        results: list[int] = []
        threads = [
            threading.Thread(target=lambda: results.append(run_cleanup(engine, policy).rows))
            for _ in range(2)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert sum(results) >= 2200  # other tests' expired rows may be deleted too
        assert counts(engine, task) == {
            "live_ok": 800,
            "live_failed": 100,
            "claim_live": 200,
            "claim_dead": 200,
        }

    def test_batches_are_bounded_and_paused(self, engine: Any) -> None:
        """A run stops after max_batches and sleeps between batches (sleep injected)."""
        task = f"tests.cleanup.{uuid.uuid4().hex[:8]}"
        run_cleanup(engine, CleanupConfig(batch_size=1000, pause_seconds=0))
        seed(engine, task, "expired_ok-", 50, "succeeded", -5)
        pauses: list[float] = []
        policy = CleanupConfig(batch_size=10, pause_seconds=0.25, max_batches=3)
        assert run_cleanup(engine, policy, sleep=pauses.append).rows == 30
        assert pauses == [0.25, 0.25]
        assert counts(engine, task) == {"expired_ok": 20}


class TestReaper:
    def test_reaper_fails_only_long_abandoned_claims(self, engine: Any) -> None:
        """Claims whose lease ended more than the grace ago become failed; others stay."""
        task = f"tests.reaper.{uuid.uuid4().hex[:8]}"
        seed(engine, task, "abandoned-", 30, "in_progress", 3600, lease=-3600)
        seed(engine, task, "recent-", 20, "in_progress", 3600, lease=-10)
        seed(engine, task, "live-", 10, "in_progress", 3600, lease=60)
        policy = CleanupConfig(batch_size=7, pause_seconds=0, grace_seconds=300)
        assert reap_abandoned(engine, policy) >= 30
        with engine.connect() as connection:
            rows = connection.execute(
                text(
                    "SELECT split_part(key, '-', 1), state, count(*) "
                    "FROM resilience_idempotency_records "
                    "WHERE task_name = :task GROUP BY 1, 2"
                ),
                {"task": task},
            ).all()
        assert {(kind, state): n for kind, state, n in rows} == {
            ("abandoned", "failed"): 30,
            ("recent", "in_progress"): 20,
            ("live", "in_progress"): 10,
        }


class TestMaintenanceTasks:
    def test_beat_tasks_run_on_a_worker(
        self, worker_factory: Any, engine: Any, purge_queues: None
    ) -> None:
        """The beat's cleanup and reaper tasks run on a standard worker and do their work."""
        from beat_schedule import SCHEDULE
        from jobs.maintenance import cleanup_idempotency, reap_idempotency_claims

        scheduled = {entry["task"] for entry in SCHEDULE.values()}
        assert {cleanup_idempotency.name, reap_idempotency_claims.name} <= scheduled
        task = f"tests.maintenance.{uuid.uuid4().hex[:8]}"
        seed(engine, task, "expired_ok-", 120, "succeeded", -5)
        seed(engine, task, "live_ok-", 10, "succeeded", 600)
        seed(engine, task, "abandoned-", 7, "in_progress", 600, lease=-3600)
        worker_factory("standard", name="idem-maintenance", concurrency=1)
        deleted = cleanup_idempotency.delay(batch_size=50, pause_seconds=0).get(timeout=60)
        reaped = reap_idempotency_claims.delay(grace_seconds=60).get(timeout=60)
        assert deleted["deleted"] >= 120 and reaped["reaped"] >= 7
        assert counts(engine, task) == {"live_ok": 10, "abandoned": 7}
