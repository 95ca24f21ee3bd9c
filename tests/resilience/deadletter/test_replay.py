"""Automatic replay of dead letters whose dependency recovered, on real stores and workers."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
import sqlalchemy as sa

from resilience.deadletter.models import dead_letters
from resilience.deadletter.place import dead_letter, get
from resilience.deadletter.replay import AutoReplay, ReplayConfig
from resilience.errors import ConfigurationError, DeadLettered
from resilience.outbox.models import outbox
from tests.support import wait_for


def _outbox_jobs(engine: Any, task_id: str) -> int:
    with engine.connect() as connection:
        return connection.execute(
            sa.select(sa.func.count()).select_from(outbox).where(outbox.c.task_id == task_id)
        ).scalar_one()


class TestAutoReplay:
    @pytest.mark.timeout(180)
    def test_replayed_once_after_the_breaker_stayed_closed(
        self, app: Any, engine: Any, redis_client: Any, tier_workers: Any, purge_queues: None
    ) -> None:
        """A job dead-lettered by an open breaker records its dependency; it is not replayed
        while the breaker is open, nor while it has been closed less than the configured
        time; then one beat tick replays it, the next does not, and the replayed job runs."""
        from jobs.maintenance import replay_dead_letters
        from resilience.circuit.backends.redis import RedisBreakerBackend
        from resilience.outbox.relay import Relay
        from tests.resilience.deadletter.tasks import REPLAY_BREAKER, replay_echo

        breakers = RedisBreakerBackend.of_app(app)
        breakers.force(REPLAY_BREAKER, "forced_open")
        # The breaker would stay open (600 s) beyond the job's expiry: dead-lettered at once.
        result = replay_echo.apply_async((5,), expires=300)
        wait_for(result.ready, timeout_seconds=120, message="the job dead-lettered")
        assert isinstance(result.result, DeadLettered)
        with engine.connect() as connection:
            [entry_id] = connection.execute(
                sa.select(dead_letters.c.id).where(dead_letters.c.task_id == result.id)
            ).scalars().all()
        entry = get(engine, entry_id)
        assert (entry.guard, entry.dependency) == ("breaker", REPLAY_BREAKER)

        def tick(closed_for_seconds: float) -> int:
            summary = replay_dead_letters.apply(kwargs={
                "closed_for_seconds": closed_for_seconds, "dependencies": [REPLAY_BREAKER],
            }).get(timeout=60)
            return summary["replayed"]

        assert tick(0.0) == 0  # open: waits whatever the configured time
        breakers.force(REPLAY_BREAKER, "closed")
        assert tick(3600.0) == 0  # closed, not for long enough
        assert get(engine, entry_id).requeued_at is None
        wait_for(lambda: (breakers.describe([REPLAY_BREAKER])[0].seconds_in_state or 0) >= 0.5,
                 timeout_seconds=30, message="the breaker closed for 0.5 s")
        assert [tick(0.5), tick(0.5)] == [1, 0]  # exactly once across two ticks
        replayed = get(engine, entry_id)
        assert replayed.requeued_task_id is not None
        assert _outbox_jobs(engine, replayed.requeued_task_id) == 1
        Relay(app).relay_once()
        assert app.AsyncResult(replayed.requeued_task_id).get(timeout=90) == 5

    def test_spent_budget_records_the_dependency(
        self, app: Any, engine: Any, redis_client: Any
    ) -> None:
        """A retry the budget refuses records its dependency (replayable); a non-retryable
        error records none (the job itself is at fault, replaying cannot help)."""
        from tests.resilience.deadletter.tasks import BUDGET_DEPENDENCY, budget_spent

        spent, invalid = budget_spent.apply(("connection",)), budget_spent.apply(("value",))
        assert isinstance(spent.result, DeadLettered) and isinstance(invalid.result, DeadLettered)
        with engine.connect() as connection:
            recorded = dict(connection.execute(
                sa.select(dead_letters.c.task_id, dead_letters.c.dependency)
                .where(dead_letters.c.task_id.in_([spent.id, invalid.id]))).all())
        assert recorded == {spent.id: BUDGET_DEPENDENCY, invalid.id: None}

    def test_paced_by_the_rate_limit(self, app: Any, engine: Any, redis_client: Any) -> None:
        """A run replays no more than the rate allows; the rest waits for a later run."""
        from resilience.circuit.backends.memory import MemoryBreakerBackend
        from resilience.ratelimit.backends.redis import RedisBackend
        from tests.resilience.deadletter.tasks import bulk_echo

        dependency = f"paced-{uuid.uuid4().hex}"
        ids = [dead_letter(engine, task_name=bulk_echo.name, task_id=f"p-{index}", args=[index],
                           kwargs={}, guard="retry", reason="retry budget exhausted",
                           attempts=1, queue="standard", dependency=dependency)
               for index in range(5)]
        config = ReplayConfig(closed_for_seconds=0, rate="2/minute", max_run_seconds=0,
                              dependencies=(dependency,))
        replay = AutoReplay(engine, app, config, breakers=MemoryBreakerBackend(),
                            limiter=RedisBackend(redis_client))
        try:
            report = replay.run_once()
            assert report.replayed == 2  # the burst; the next permit is 30 s away
            assert report.waiting[dependency].startswith("paced")
            assert sum(get(engine, entry_id).requeued_at is not None for entry_id in ids) == 2
            assert replay.run_once().replayed == 0
        finally:
            with engine.begin() as connection:
                connection.execute(outbox.delete().where(outbox.c.task_name == bulk_echo.name,
                                                         outbox.c.state == "pending"))

    def test_bad_config(self) -> None:
        """A bad rate, time or row limit fails when the config is built."""
        for options in ({"rate": "fast"}, {"closed_for_seconds": -1},
                        {"max_rows_per_run": 0}, {"dependencies": "payments"}):
            with pytest.raises(ConfigurationError):
                ReplayConfig(**options)
