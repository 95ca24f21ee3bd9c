"""The Redis cache's own short TTL, on real Redis and PostgreSQL: the cached copy expires
long before the record, and a duplicate after that is still replayed, from PostgreSQL."""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest
from sqlalchemy import text

from resilience.errors import ConfigurationError
from resilience.idempotency import IdempotencyConfig, IdempotencyGuard
from resilience.idempotency.backends.cached import cache_key
from resilience.idempotency.config import DEFAULT_CACHE_TTL_SECONDS
from resilience.outcomes import Outcome, Stop
from resilience.pipeline import Call, Pipeline
from tests.resilience.idempotency import tasks

pytestmark = pytest.mark.timeout(60)

RECORD_TTL = 3600.0
CACHE_TTL = 0.5


def record_ttl_seconds(engine: Any, key: str) -> float:
    """Seconds the PostgreSQL record of `key` has left."""
    with engine.connect() as connection:
        return float(
            connection.execute(
                text(
                    "SELECT extract(epoch FROM expires_at - now()) "
                    "FROM resilience_idempotency_records"
                    " WHERE task_name = :t AND key = :k"
                ),
                {"t": tasks.idem_count.name, "k": key},
            ).scalar_one()
        )


def replay(pipeline: Pipeline, key: str) -> Stop:
    with pytest.raises(Stop) as stopped:
        pipeline.run(
            Call(task=tasks.idem_count, args=(key,), kwargs={}, request=None),
            lambda: pytest.fail("a finished key ran again"),
        )
    assert stopped.value.outcome is Outcome.REPLAYED
    return stopped.value


class TestConfig:
    def test_default_is_short_and_clamped_to_the_record_ttl(self) -> None:
        """10 minutes by default; never longer than the record; must be positive."""
        assert IdempotencyConfig().cache_ttl_seconds == DEFAULT_CACHE_TTL_SECONDS == 600
        assert IdempotencyConfig(ttl_seconds=60).cache_ttl_seconds == 60
        assert IdempotencyConfig(ttl_seconds=60, cache_ttl_seconds=5).cache_ttl_seconds == 5
        with pytest.raises(ConfigurationError, match="cache_ttl_seconds"):
            IdempotencyConfig(cache_ttl_seconds=0)


def test_cache_expires_on_its_ttl_and_postgresql_still_replays(
    engine: Any, redis_client: Any
) -> None:
    """The fill after the commit and the re-warm after a PostgreSQL replay both use the
    cache TTL while the record keeps the record TTL; past the cache TTL a duplicate is
    REPLAYED from PostgreSQL (the body never runs again)."""
    config = IdempotencyConfig(key="{key}", ttl_seconds=RECORD_TTL, cache_ttl_seconds=CACHE_TTL,
                               cache=True)
    guard = IdempotencyGuard(config)  # the app's PostgreSQL records
    guard.bind(tasks.idem_count)
    pipeline = Pipeline([guard])
    key = f"ttl-{uuid.uuid4().hex}"
    cached = cache_key(tasks.idem_count.name, key)

    # The claim sets the record's expiry to cover its lease too (a completion within the
    # lease leaves it: a HOT update), so the record lives between TTL and TTL + lease.
    record_lifetime = RECORD_TTL + guard.lease_seconds
    call = Call(task=tasks.idem_count, args=(key,), kwargs={}, request=None)
    assert pipeline.run(call, lambda: {"ran": 1}) == {"ran": 1}
    assert 0 < redis_client.pttl(cached) <= CACHE_TTL * 1000
    assert RECORD_TTL - 60 < record_ttl_seconds(engine, key) <= record_lifetime
    assert replay(pipeline, key).details["source"] == "cache"

    deadline = time.monotonic() + 5
    while redis_client.exists(cached) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not redis_client.exists(cached)

    stopped = replay(pipeline, key)
    assert stopped.details["source"] == "database" and stopped.result == {"ran": 1}
    # Re-warmed for the cache TTL, not for the hour the record has left.
    assert 0 < redis_client.pttl(cached) <= CACHE_TTL * 1000
    assert replay(pipeline, key).details["source"] == "cache"
    assert RECORD_TTL - 60 < record_ttl_seconds(engine, key) <= record_lifetime
