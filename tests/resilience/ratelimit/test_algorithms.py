"""The limit algorithms: the registry, and every algorithm on every backend.

The classes parametrized by `algorithm` (or `holding`, `waiting`) and `backend` run each
registered algorithm on the in-memory backend (fake clock) and on real Redis: a new entry
in `ALGORITHMS` is tested here without a new test.
"""

from __future__ import annotations

import itertools
import re
import threading
import uuid
from pathlib import Path
from typing import Any

import pytest

import resilience.ratelimit.backends.redis as redis_backend
from resilience.errors import ConfigurationError
from resilience.ratelimit import (
    ALGORITHMS,
    GCRA,
    SLIDING_WINDOW,
    Algorithm,
    Lease,
    MemoryBackend,
    Params,
    RedisBackend,
    algorithms,
)
from tests.resilience.ratelimit.conftest import FakeClock
from tests.support import wait_for

pytestmark = pytest.mark.timeout(60)

#: Three at once, then none for a minute, whichever algorithm reads it.
THREE_PER_MINUTE = Params(limit=3, period_us=60_000_000, burst=3)


def key() -> str:
    return uuid.uuid4().hex[:8]


def take(
    backend: Any, algorithm: Algorithm, name: str, callers: int, params: Params = THREE_PER_MINUTE
) -> list[bool]:
    """`callers` distinct callers ask once each; whether each was granted."""
    return [backend.run(algorithm, name, params, f"c{i}").allowed for i in range(callers)]


class TestRegistry:
    def test_every_algorithm_has_its_scripts(self, algorithm: Algorithm) -> None:
        """Each algorithm's Lua files exist and open with their KEYS/ARGV contract."""
        folder = Path(redis_backend.__file__).parent
        scripts = [algorithm.script] + ([algorithm.release_script] if algorithm.holds else [])
        for script in scripts:
            text = (folder / script).read_text()
            assert re.search(r"^-- KEYS\[1\] = ", text, re.MULTILINE), script
        assert (algorithm.release_script is not None) is algorithm.holds

    def test_names_and_namespaces_are_unique(self) -> None:
        """Two algorithms never share a name or a Redis namespace (their state would mix)."""
        assert list(ALGORITHMS) == [a.name for a in ALGORITHMS.values()]
        assert len({a.namespace for a in ALGORITHMS.values()}) == len(ALGORITHMS)

    def test_unknown_name(self) -> None:
        """An unknown algorithm is a ConfigurationError naming the known ones."""
        with pytest.raises(ConfigurationError, match="gcra, sliding_window"):
            algorithms.algorithm_named("leaky")


class TestEveryAlgorithm:
    def test_grants_up_to_the_limit_then_denies(self, backend: Any, algorithm: Algorithm) -> None:
        """Three callers pass at once; the fourth is denied with a retry-after in the period."""
        decisions = [backend.run(algorithm, "k", THREE_PER_MINUTE, f"c{i}") for i in range(4)]
        assert [d.allowed for d in decisions] == [True, True, True, False]
        assert 0 < decisions[-1].retry_after_seconds <= 60

    def test_concurrent_callers_never_exceed(self, backend: Any, algorithm: Algorithm) -> None:
        """16 threads racing for 7 permits or slots: exactly 7 granted."""
        name, granted, lock = key(), [], threading.Lock()
        params = Params(limit=7, period_us=3_600_000_000, burst=7)

        def ask(thread: int) -> None:
            for attempt in range(5):
                if backend.run(algorithm, name, params, f"t{thread}-{attempt}").allowed:
                    with lock:
                        granted.append(thread)

        threads = [threading.Thread(target=ask, args=(i,)) for i in range(16)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert len(granted) == 7

    def test_describe_shows_the_limiter(self, backend: Any, algorithm: Algorithm) -> None:
        """describe() lists the limiter under its key and algorithm, decoded, with its use."""
        name = f"tenant:{key()}"
        decisions = [backend.run(algorithm, name, THREE_PER_MINUTE, f"c{i}") for i in range(2)]
        [state] = backend.describe(algorithm, name)
        assert (state.algorithm, state.key) == (algorithm.name, name)
        assert state.used == decisions[-1].used
        assert [s.algorithm for s in backend.describe() if s.key == name] == [algorithm.name]

    def test_retry_after_is_honest_on_a_fake_clock(self, algorithm: Algorithm) -> None:
        """Denied, then granted once the clock reaches the retry-after (memory, no waiting)."""
        clock = FakeClock()
        backend = MemoryBackend(clock=clock)
        take(backend, algorithm, "k", 3)
        denied = backend.run(algorithm, "k", THREE_PER_MINUTE, "late")
        assert not denied.allowed
        clock.now += denied.retry_after_seconds - 0.001
        assert not backend.run(algorithm, "k", THREE_PER_MINUTE, "late").allowed
        clock.now += 0.001
        assert backend.run(algorithm, "k", THREE_PER_MINUTE, "late").allowed

    def test_retry_after_is_honest_on_redis_time(
        self, redis_client: Any, algorithm: Algorithm
    ) -> None:
        """On Redis the limit runs on server time: a 0.2 s limit grants again after it."""
        backend = RedisBackend(redis_client, prefix=f"test:{key()}")
        params = Params(limit=1, period_us=200_000)
        assert backend.run(algorithm, "k", params, "first").allowed
        denied = backend.run(algorithm, "k", params, "next")
        assert not denied.allowed and 0 < denied.retry_after_seconds <= 0.2
        wait_for(
            lambda: backend.run(algorithm, "k", params, "next").allowed,
            timeout_seconds=10,
            message="the limit to grant again",
        )

    def test_release_only_where_slots_are_held(self, backend: Any, algorithm: Algorithm) -> None:
        """A held slot given back is free again; a permit spent cannot be given back."""
        take(backend, algorithm, "k", 3)
        if not algorithm.holds:
            with pytest.raises(ConfigurationError, match="holds no slots"):
                backend.release(algorithm, "k", "c0")
            return
        assert backend.release(algorithm, "k", "c0")
        assert not backend.release(algorithm, "k", "c0")
        assert take(backend, algorithm, "k", 1) == [True]


class TestHoldingAlgorithms:
    def test_holders_are_described(self, backend: Any, holding: Algorithm) -> None:
        """Each live slot is a `Lease` naming its holder and the lease time left."""
        assert take(backend, holding, "k", 2) == [True, True]
        [state] = backend.describe(holding, "k")
        assert {lease.owner for lease in state.holders} == {"c0", "c1"}
        assert all(
            isinstance(lease, Lease)
            and lease.alive
            and lease.key == "k"
            and 0 < lease.expires_in_seconds <= 60
            for lease in state.holders
        )
        assert state.used == 2

    def test_holder_renews(self, backend: Any, holding: Algorithm) -> None:
        """A holder asking again renews its own slot instead of taking a second one."""
        for _ in range(3):
            assert backend.run(holding, "k", Params(limit=1, period_us=60_000_000), "a").allowed
        assert [lease.owner for lease in backend.describe(holding, "k")[0].holders] == ["a"]

    def test_lapsed_lease_is_reclaimed(self, holding: Algorithm) -> None:
        """A holder that never releases (killed) loses its slot when the lease ends, and is
        shown lapsed until then reclaimed."""
        clock = FakeClock()
        backend = MemoryBackend(clock=clock)
        params = Params.of_slots(1, lease_seconds=5)
        assert backend.run(holding, "k", params, "dead").allowed
        assert not backend.run(holding, "k", params, "next").allowed
        clock.now += 5.001
        [lapsed] = backend.describe(holding, "k")[0].holders
        assert (lapsed.owner, lapsed.alive) == ("dead", False)
        assert backend.run(holding, "k", params, "next").allowed
        assert not backend.release(holding, "k", "dead")


class TestWaitingAlgorithms:
    def test_waiters_get_spread_retry_times(self, backend: Any, waiting: Algorithm) -> None:
        """Denied callers are told to come back one spacing apart, not all at once."""
        params = Params(limit=1, period_us=10_000_000)
        assert backend.run(waiting, "k", params, "first").allowed
        waits = [backend.run(waiting, "k", params, f"c{i}").retry_after_seconds for i in range(4)]
        gaps = [later - earlier for earlier, later in itertools.pairwise(waits)]
        spacing = waiting.spacing_us(params) / 1e6
        assert all(gap == pytest.approx(spacing, abs=0.05) for gap in gaps)
        assert backend.describe(waiting, "k")[0].waiting == 4

    def test_waiter_keeps_its_place(self, backend: Any, waiting: Algorithm) -> None:
        """A caller denied again keeps its slot instead of going to the back of the line."""
        params = Params(limit=1, period_us=10_000_000)
        assert backend.run(waiting, "k", params, "first").allowed
        first = backend.run(waiting, "k", params, "a")
        for i in range(3):
            backend.run(waiting, "k", params, f"later{i}")
        again = backend.run(waiting, "k", params, "a")
        assert again.retry_after_seconds == pytest.approx(first.retry_after_seconds, abs=0.05)


class TestGcra:
    def test_state_is_constant_per_key(self, redis_client: Any) -> None:
        """GCRA's limiter state is one number per key, however many requests it decides.

        Beside it lives the waiting line (one entry per deferred caller), which expires.
        """
        backend = RedisBackend(redis_client, prefix="test:o1")
        params = Params(limit=1, period_us=500_000, burst=10)
        for _ in range(200):
            backend.run(GCRA, "one", params, "same-task")
        assert sorted(redis_client.keys("test:o1:*")) == [
            "test:o1:gcra:{one}",
            "test:o1:gcra:{one}:waiting",
        ]
        assert redis_client.type("test:o1:gcra:{one}") == "string"
        assert redis_client.zcard("test:o1:gcra:{one}:waiting") == 1
        assert redis_client.pttl("test:o1:gcra:{one}:waiting") > 0

    def test_any_window_within_limit_with_burst_one(self) -> None:
        """burst=1: in every window of one period at most `limit` grants (fake clock sweep)."""
        clock = FakeClock()
        backend = MemoryBackend(clock=clock)
        params = Params(limit=4, period_us=2_000_000)
        grants = []
        for step in range(2000):
            clock.now = 1_000_000 + step * 0.013
            if backend.run(GCRA, "k", params).allowed:
                grants.append(clock.now)
        assert max_in_window(grants, 2.0) <= 4

    def test_ahead_of_now_is_described(self, backend: Any) -> None:
        """describe() shows how far the theoretical arrival time runs ahead of now."""
        backend.run(GCRA, "k", Params(limit=1, period_us=60_000_000, burst=2))
        [state] = backend.describe(GCRA, "k")
        assert state.figures["ahead_seconds"] == pytest.approx(60, abs=1)


class TestSlidingWindow:
    def test_limit_then_retry_after_oldest(self) -> None:
        """limit grants, then denial until the oldest grant leaves the window."""
        clock = FakeClock()
        backend = MemoryBackend(clock=clock)
        params = Params(limit=3, period_us=10_000_000)
        for _ in range(3):
            assert backend.run(SLIDING_WINDOW, "k", params).allowed
            clock.now += 1
        denied = backend.run(SLIDING_WINDOW, "k", params)
        assert not denied.allowed
        assert denied.retry_after_seconds == pytest.approx(7)
        assert backend.describe(SLIDING_WINDOW, "k")[0].figures["in_window"] == 3
        clock.now += 7
        assert backend.run(SLIDING_WINDOW, "k", params).allowed


def max_in_window(times: list[float], window: float) -> int:
    """Most events in any half-open window [t, t + window) (starts at each event suffice)."""
    ordered = sorted(times)
    best, right = 0, 0
    for left, start in enumerate(ordered):
        while right < len(ordered) and ordered[right] < start + window:
            right += 1
        best = max(best, right - left)
    return best
