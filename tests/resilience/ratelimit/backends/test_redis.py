"""The Redis backend: its key layout, its decoding of stored state, its errors.

A key never lands on another key's state (WRONGTYPE, fail-open):

The layout before `resilience.keys.redis_key` put `acme`'s waiting line at
`...:gcra:acme:waiting`, which is also the limiter of the key `acme:waiting`: one call then
met a sorted set where it expected a string (or the reverse), Redis answered WRONGTYPE, and
the guard failed open: no limit at all.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from redis.crc import key_slot

from resilience.errors import StorageError, StoreUnavailable
from resilience.keys import encode_key_part
from resilience.outcomes import Outcome, Stop
from resilience.pipeline import Call
from resilience.ratelimit import (
    GCRA,
    LEASE,
    Algorithm,
    Params,
    RateLimitConfig,
    RateLimitGuard,
    RedisBackend,
)
from tests.resilience.ratelimit import tasks
from tests.support import dead_redis

PREFIX = "resilience:limits"


def take(backend: RedisBackend, algorithm: Algorithm, key: str, caller: str) -> bool:
    """One permit (or slot) of a limit of 1 per minute; True when granted."""
    return backend.run(algorithm, key, Params(limit=1, period_us=60_000_000), caller).allowed


class TestKeysDoNotCollide:
    def test_key_named_like_a_waiting_line_after_the_line_exists(
        self, redis_client: Any, algorithm: Algorithm
    ) -> None:
        """`acme` is denied (its waiting line is written), then `acme:waiting` has a limit of
        its own: granted once, then denied, no WRONGTYPE."""
        backend = RedisBackend(redis_client)
        assert take(backend, algorithm, "acme", "a1")
        assert not take(backend, algorithm, "acme", "a2")  # a2 waits in acme's line
        assert take(backend, algorithm, "acme:waiting", "w1")
        assert not take(backend, algorithm, "acme:waiting", "w2")
        assert not take(backend, algorithm, "acme", "a2")

    def test_key_named_like_a_waiting_line_before_the_line_exists(
        self, redis_client: Any, algorithm: Algorithm
    ) -> None:
        """The other order: `acme:waiting` first, then `acme` is denied and waits in line."""
        backend = RedisBackend(redis_client)
        assert take(backend, algorithm, "acme:waiting", "w1")
        assert take(backend, algorithm, "acme", "a1")
        assert not take(backend, algorithm, "acme", "a2")
        assert not take(backend, algorithm, "acme:waiting", "w2")
        if algorithm.waits:
            kind = algorithm.namespace
            assert redis_client.zcard(f"{PREFIX}:{kind}:{{acme}}:waiting") == 1
            assert redis_client.zcard(f"{PREFIX}:{kind}:{{acme%3Awaiting}}:waiting") == 1

    def test_limiter_and_its_line_share_a_hash_slot(
        self, redis_client: Any, algorithm: Algorithm
    ) -> None:
        """Every key a script touches carries the key's hash tag (Redis Cluster needs one slot)."""
        backend = RedisBackend(redis_client)
        take(backend, algorithm, "tenant:{eu}", "c1")
        take(backend, algorithm, "tenant:{eu}", "c2")
        names = sorted(redis_client.scan_iter(match=f"{PREFIX}:*"))
        assert len(names) == (2 if algorithm.waits else 1)  # the limiter (and its line)
        slots = {key_slot(name.encode()) for name in names}  # Redis Cluster's own function
        assert len(slots) == 1
        assert all("{tenant%3A%7Beu%7D}" in name for name in names)

    def test_five_thousand_character_key(self, redis_client: Any, algorithm: Algorithm) -> None:
        """A 5,000-character key is limited like any other, under a short Redis key."""
        backend = RedisBackend(redis_client)
        long = "k" * 5000
        assert take(backend, algorithm, long, "c1")
        assert not take(backend, algorithm, long, "c2")
        assert take(backend, algorithm, long + "!", "c3")
        names = list(redis_client.scan_iter(match=f"{PREFIX}:*"))
        assert names and max(len(name) for name in names) < 120
        assert any(encode_key_part(long) in name for name in names)


class TestGuardDoesNotFailOpen:
    def test_waiting_line_named_key_is_deferred(self, redis_client: Any) -> None:
        """Through the guard: the second `acme:waiting` call is DEFERRED, not run because a
        WRONGTYPE reply made the guard fail open."""
        guard = RateLimitGuard(
            RateLimitConfig(name="vendor", rate="1/minute"),
            key="{run_id}",
            func=tasks.windowed.run,
            backend=RedisBackend(redis_client),
        )
        guard.bind(tasks.windowed)

        def call(task_id: str, run_id: str) -> Call:
            return Call(
                task=tasks.windowed,
                args=(),
                kwargs={"run_id": run_id, "n": 1},
                request=SimpleNamespace(id=task_id),
            )

        guard.before_run(call("a1", "acme"))
        with pytest.raises(Stop):
            guard.before_run(call("a2", "acme"))  # writes acme's waiting line
        guard.before_run(call("w1", "acme:waiting"))
        with pytest.raises(Stop) as stopped:
            guard.before_run(call("w2", "acme:waiting"))
        assert stopped.value.outcome is Outcome.DEFERRED
        assert stopped.value.details["key"] == "vendor:acme:waiting"


class TestDescribe:
    def test_keys_are_listed_decoded(self, redis_client: Any) -> None:
        """`describe()` gives the keys as written, waiting lines left out, with their line."""
        backend = RedisBackend(redis_client)
        for key in ("acme", "acme:waiting", "a b{c}%"):
            take(backend, GCRA, key, "c1")
            take(backend, GCRA, key, "c2")
        states = backend.describe(GCRA)
        assert [state.key for state in states] == ["a b{c}%", "acme", "acme:waiting"]
        assert [state.waiting for state in states] == [1, 1, 1]

    def test_a_digested_key_shows_its_digest(self, redis_client: Any) -> None:
        """A key too long to keep readable is listed by its digest, and read through it."""
        backend = RedisBackend(redis_client)
        long = "k" * 5000
        take(backend, LEASE, long, "holder")
        [state] = backend.describe(LEASE)
        assert state.key == encode_key_part(long) and state.key.startswith("#")
        assert [lease.owner for lease in state.holders] == ["holder"]

    def test_every_schema_is_decoded(self, redis_client: Any, algorithm: Algorithm) -> None:
        """Each algorithm's stored state reads back as its pure step keeps it in memory:
        Redis and the memory backend describe the same figures after the same requests."""
        from resilience.ratelimit import MemoryBackend

        on_redis, in_memory = RedisBackend(redis_client), MemoryBackend()
        params = Params(limit=2, period_us=60_000_000, burst=2)
        for backend in (on_redis, in_memory):
            for caller in ("a", "b", "c"):
                backend.run(algorithm, "k", params, caller)
        [stored], [kept] = on_redis.describe(algorithm, "k"), in_memory.describe(algorithm, "k")
        assert (stored.used, stored.waiting) == (kept.used, kept.waiting)
        assert [lease.owner for lease in stored.holders] == [h.owner for h in kept.holders]
        assert stored.figures.keys() == kept.figures.keys()
        for name, value in stored.figures.items():
            assert value == pytest.approx(kept.figures[name], abs=0.5)


class TestStorageErrors:
    def test_unreachable_redis_is_wrapped(self, algorithm: Algorithm) -> None:
        """A dead Redis raises StoreUnavailable naming the key, never a raw redis error."""


        backend = RedisBackend(dead_redis())
        with pytest.raises(StoreUnavailable, match="tests-key") as raised:
            backend.run(algorithm, "tests-key", Params(limit=1, period_us=1_000_000))
        assert isinstance(raised.value, StorageError)
        with pytest.raises(StoreUnavailable):
            backend.describe(algorithm)
