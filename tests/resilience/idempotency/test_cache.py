"""The Redis result cache on a real Redis: reads, batched fills, misses, and the guard's
replay from it (records on the memory backend)."""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest
import redis

from resilience.batch import for_client
from resilience.errors import ConfigurationError, StoreUnavailable
from resilience.idempotency import IdempotencyConfig, IdempotencyGuard, MemoryIdempotencyBackend
from resilience.idempotency.backends.cached import CachedResult, ResultCache, cache_key
from resilience.outcomes import Outcome, Stop
from resilience.pipeline import Call, Pipeline, Rounds
from tests.resilience.idempotency import tasks
from tests.support import dead_redis

TASK = "tests.cache"


def execute(rounds: Rounds) -> None:
    for queued in rounds.values():
        queued.execute()
    rounds.clear()


def unreachable() -> redis.Redis:

    return dead_redis(decode_responses=True)


class TestResultCache:
    def test_a_fill_is_read_back_with_its_ttl(self, redis_client: Any) -> None:
        """put_later (one write round) then get: fingerprint, result and task id, with a TTL."""
        cache, rounds = ResultCache(lambda: redis_client), {}
        cache.put_later(
            rounds,
            TASK,
            "k",
            fingerprint="f",
            result_json='{"a":[1,2]}',
            task_id="t-1",
            ttl_seconds=60,
        )
        assert cache.get(TASK, "k") is None  # queued, not sent
        execute(rounds)
        assert cache.get(TASK, "k") == CachedResult("f", {"a": [1, 2]}, "t-1")
        assert 0 < redis_client.pttl(cache_key(TASK, "k")) <= 60_000

    def test_get_later_joins_the_read_round(self, redis_client: Any) -> None:
        """get_later queues a GET in the call's round; the callback gets what get would."""
        cache, rounds = ResultCache(lambda: redis_client), {}
        redis_client.set(cache_key(TASK, "k"), '{"f": "f", "t": null, "r": 3}')
        seen: list[Any] = []
        cache.get_later(rounds, TASK, "k", seen.append)
        cache.get_later(rounds, TASK, "missing", seen.append)
        assert len(for_client(rounds, redis_client)) == 2 and seen == []
        execute(rounds)
        assert seen == [CachedResult("f", 3, None), None]

    def test_unreadable_values_are_misses(self, redis_client: Any) -> None:
        """A value that is not the cache's JSON is a miss, never an error."""
        redis_client.set(cache_key(TASK, "bad"), "not json")
        redis_client.set(cache_key(TASK, "partial"), '{"r": 1}')
        cache = ResultCache(lambda: redis_client)
        assert cache.get(TASK, "bad") is None and cache.get(TASK, "partial") is None

    def test_forget_and_size(self, redis_client: Any) -> None:
        """size counts the cached results only; forget drops one."""
        cache = ResultCache(lambda: redis_client)
        for key in ("a", "b"):
            redis_client.set(cache_key(TASK, key), '{"f": "f", "t": null, "r": 1}')
        redis_client.set("unrelated", "1")
        assert cache.size() == 2
        cache.forget(TASK, "a")
        assert cache.size() == 1 and cache.get(TASK, "a") is None

    def test_redis_down_is_a_miss_for_the_guard_and_an_error_for_size(self) -> None:
        """Reads and fills log and go on (the backend is the truth); size says unavailable."""
        cache, rounds, seen = ResultCache(unreachable), {}, []
        assert cache.get(TASK, "k") is None
        cache.get_later(rounds, TASK, "k", seen.append)
        cache.put_later(
            rounds, TASK, "k", fingerprint="f", result_json="1", task_id=None, ttl_seconds=1
        )
        execute(rounds)
        assert seen == [None]
        cache.forget(TASK, "k")
        with pytest.raises(StoreUnavailable):
            cache.size()


class TestGuardWithCache:
    def test_a_duplicate_is_replayed_from_the_cache(self, stores: Any, redis_client: Any) -> None:
        """The first call fills the cache after its commit; the second replays from it
        without asking the backend (its record is gone, the cache still answers)."""
        backend = MemoryIdempotencyBackend()
        guard = IdempotencyGuard(IdempotencyConfig(key="{key}", cache=True), backend)
        guard.bind(tasks.idem_count)
        pipeline = Pipeline([guard])

        def call() -> Call:
            return Call(task=tasks.idem_count, args=("c",), kwargs={}, request=None)

        assert pipeline.run(call(), lambda: {"ran": 1}) == {"ran": 1}
        assert backend.purge(tasks.idem_count.name, "c")
        with pytest.raises(Stop) as stopped:
            pipeline.run(call(), lambda: pytest.fail("ran again"))
        assert stopped.value.outcome is Outcome.REPLAYED
        assert stopped.value.details["source"] == "cache"
        assert stopped.value.result == {"ran": 1}

    def test_auto_makes_no_redis_round_trip_until_a_key_replays(
        self, stores: Any, redis_client: Any
    ) -> None:
        """cache="auto" (the default): fresh keys neither read nor fill the cache; the first
        duplicate is answered by the backend's claim and turns the fast path on, so the
        next duplicate of another key replays from Redis without asking the backend."""
        backend = MemoryIdempotencyBackend()
        guard = IdempotencyGuard(IdempotencyConfig(key="{key}"), backend)
        assert guard.config.cache == "auto"
        guard.bind(tasks.idem_count)
        pipeline = Pipeline([guard])
        run = uuid.uuid4().hex[:8]

        def call(key: str) -> Call:
            return Call(task=tasks.idem_count, args=(f"{run}-{key}",), kwargs={}, request=None)

        for key in ("a", "b"):
            assert pipeline.run(call(key), lambda: {"ran": 1}) == {"ran": 1}
        assert not guard.backend.cache_on()
        assert redis_client.get(cache_key(tasks.idem_count.name, f"{run}-a")) is None  # no fill
        probe = call("d")
        guard.prefetch(probe)
        assert not probe.reads, "a fresh key queued a cache read"

        with pytest.raises(Stop) as stopped:  # a duplicate: answered by the backend's claim
            pipeline.run(call("a"), lambda: pytest.fail("ran again"))
        assert stopped.value.details["source"] == "database"
        assert guard.backend.cache_on()
        assert pipeline.run(call("c"), lambda: {"ran": 3}) == {"ran": 3}  # hot: filled
        assert backend.purge(tasks.idem_count.name, f"{run}-c")
        with pytest.raises(Stop) as stopped:
            pipeline.run(call("c"), lambda: pytest.fail("ran again"))
        assert stopped.value.details["source"] == "cache"

    def test_auto_turns_itself_off_after_the_hot_period(
        self, stores: Any, redis_client: Any, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        from resilience.idempotency.backends import cached

        backend = MemoryIdempotencyBackend()
        guard = IdempotencyGuard(IdempotencyConfig(key="{key}"), backend)
        guard.bind(tasks.idem_count)
        pipeline = Pipeline([guard])
        monkeypatch.setattr(cached, "HOT_SECONDS", 0.2)
        key = f"hot-{uuid.uuid4().hex[:8]}"

        def call() -> Call:
            return Call(task=tasks.idem_count, args=(key,), kwargs={}, request=None)

        pipeline.run(call(), lambda: {"ran": 1})
        with pytest.raises(Stop):
            pipeline.run(call(), lambda: pytest.fail("ran again"))
        assert guard.backend.cache_on()
        time.sleep(0.3)
        assert not guard.backend.cache_on()

    def test_auto_turns_itself_off_after_fresh_keys_in_a_row(
        self, stores: Any, redis_client: Any
    ) -> None:
        """Duplicates stopped: `HOT_FRESH_CALLS` fresh keys claimed with no replay between
        them turn the fast path off before `HOT_SECONDS`; the next replay turns it on."""
        from resilience.idempotency.backends.cached import HOT_FRESH_CALLS

        backend = MemoryIdempotencyBackend()
        guard = IdempotencyGuard(IdempotencyConfig(key="{key}"), backend)
        guard.bind(tasks.idem_count)
        pipeline = Pipeline([guard])
        run = uuid.uuid4().hex[:8]

        def call(key: str) -> Call:
            return Call(task=tasks.idem_count, args=(f"{run}-{key}",), kwargs={}, request=None)

        pipeline.run(call("first"), lambda: {"ran": 1})
        with pytest.raises(Stop):
            pipeline.run(call("first"), lambda: pytest.fail("ran again"))
        for index in range(HOT_FRESH_CALLS):
            assert guard.backend.cache_on(), f"off after {index} fresh keys"
            pipeline.run(call(f"fresh-{index}"), lambda: {"ran": 1})
        assert not guard.backend.cache_on()
        probe = call("probe")
        guard.prefetch(probe)
        assert not probe.reads, "a fresh key queued a cache read after the fast path went off"
        with pytest.raises(Stop):
            pipeline.run(call("fresh-0"), lambda: pytest.fail("ran again"))
        assert guard.backend.cache_on()

    def test_cache_option_is_checked(self) -> None:
        with pytest.raises(ConfigurationError, match="cache must be True, False or 'auto'"):
            IdempotencyConfig(key="{key}", cache="sometimes")
