"""Cleanup keeps going until nothing expired is left (or its time budget is spent), and the
status counts come from statistics instead of a full scan."""

from __future__ import annotations

import itertools
import uuid
from typing import Any

from sqlalchemy import text

from resilience.idempotency.cleanup import CleanupConfig, run_cleanup
from tests.resilience.idempotency.test_cleanup import counts, seed


class TestCleanupLoop:
    def test_one_run_deletes_every_expired_record(self, engine: Any) -> None:
        """A run deletes 3,000 expired rows in batches of 100 (past the old 100-batch cap's
        proportion) and stops on the first short batch, leaving live rows and claims."""
        run_cleanup(engine, CleanupConfig(batch_size=5000))
        task = f"tests.cleanup_scale.{uuid.uuid4().hex[:8]}"
        seed(engine, task, "expired_ok-", 3000, "succeeded", -30)
        seed(engine, task, "live_ok-", 40, "succeeded", 3600)
        seed(engine, task, "claim_dead-", 20, "in_progress", -30, lease=-3600)
        report = run_cleanup(engine, CleanupConfig(batch_size=100, max_batches=None))
        assert report.rows >= 3000 and report.batches >= 31 and not report.exhausted
        assert counts(engine, task) == {"live_ok": 40, "claim_dead": 20}

    def test_time_budget_ends_a_run_with_a_backlog(self, engine: Any) -> None:
        """With 10 s passing per batch (clock injected) a 25 s budget runs 3 batches and
        reports the backlog; the next run finishes it."""
        run_cleanup(engine, CleanupConfig(batch_size=5000))
        task = f"tests.cleanup_scale.{uuid.uuid4().hex[:8]}"
        seed(engine, task, "expired_ok-", 500, "succeeded", -30)
        ticks = itertools.count(step=10.0)
        policy = CleanupConfig(batch_size=50, time_budget_seconds=25.0)
        report = run_cleanup(engine, policy, clock=lambda: float(next(ticks)))
        assert (report.rows, report.batches, report.exhausted) == (150, 3, True)
        assert counts(engine, task) == {"expired_ok": 350}
        assert run_cleanup(engine, CleanupConfig(batch_size=50)).rows == 350
        assert counts(engine, task) == {}


class TestCounts:
    def test_estimates_match_exact_counts_after_analyze(
        self, stores: Any, engine: Any, monkeypatch: Any
    ) -> None:
        """Open claims are counted exactly; finished states, estimated from the statistics
        (the small-table fallback turned off), are within 10 % of the exact counts."""
        from resilience.idempotency.backends import postgres

        task = f"tests.cleanup_scale.{uuid.uuid4().hex[:8]}"
        seed(engine, task, "ok-", 3000, "succeeded", 3600)
        seed(engine, task, "failed-", 1000, "failed", 3600)
        seed(engine, task, "claim-", 25, "in_progress", 3600, lease=60)
        with engine.connect() as connection:
            connection.execution_options(isolation_level="AUTOCOMMIT").execute(
                text("ANALYZE resilience_idempotency_records")
            )
        backend = postgres.backend_for(stores)
        monkeypatch.setattr(postgres, "EXACT_COUNT_BELOW_ROWS", 0)
        estimated = backend.estimate_by_state()
        exact = backend.count_by_state()
        assert estimated["in_progress"] == exact["in_progress"]
        for state in ("succeeded", "failed"):
            assert abs(estimated[state] - exact[state]) <= 0.1 * exact[state] + 10, state
