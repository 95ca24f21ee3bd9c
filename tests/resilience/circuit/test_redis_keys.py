"""Breaker names on real Redis: any name works, and no name lands on another breaker's keys.

Before `resilience.keys.redis_key`, breaker `payments`'s window was `...:payments:window`,
which is also the state hash of a breaker named `payments:window`: the two scripts met a
list where they expected a hash and Redis answered WRONGTYPE.
"""

from __future__ import annotations

from typing import Any

import pytest
from redis.crc import key_slot

from resilience.circuit.backends.redis import RedisBreakerBackend, state_key, window_key
from resilience.circuit.breaker import CircuitBreaker
from resilience.circuit.config import BreakerConfig, CountWindow


def breaker(redis_client: Any, name: str) -> CircuitBreaker:
    config = BreakerConfig(
        name=name,
        window=CountWindow(calls=4),
        minimum_calls=2,
        failure_rate_threshold=0.5,
        open_seconds=60,
    )
    return CircuitBreaker(config, RedisBreakerBackend(lambda: redis_client))


def record(breaker: CircuitBreaker, outcome: str) -> str:
    permission = breaker.acquire()
    assert permission.allowed
    return breaker.record(permission, outcome, duration_seconds=0.0).transition


class TestBreakerNames:
    @pytest.mark.parametrize(
        ("neighbour_name", "name"),
        [
            ("payments", "payments:window"),
            ("orders", "orders:{eu}"),
            ("a", "a}b{c"),
            ("%41", "%41 #x"),
        ],
    )
    def test_name_with_separators_is_its_own_breaker(
        self, redis_client: Any, neighbour_name: str, name: str
    ) -> None:
        """A breaker named with `:`, braces, `%` or spaces opens on its own failures, and its
        neighbour (with a window list of its own) does not."""
        neighbour = breaker(redis_client, neighbour_name)
        tricky = breaker(redis_client, name)
        assert record(neighbour, "success") == ""  # writes the neighbour's window (a list)
        assert [record(tricky, "failure") for _ in range(2)] == ["", "open"]
        assert not tricky.acquire().allowed
        assert neighbour.acquire().allowed
        assert record(neighbour, "failure") == "open"  # 1 of 2 calls failed: its own window

    def test_state_and_window_share_a_hash_slot(self, redis_client: Any) -> None:
        """Both keys of the breaker's scripts carry the name as their hash tag."""
        name = "orders:{eu}"
        assert [record(breaker(redis_client, name), "failure") for _ in range(1)] == [""]
        assert redis_client.type(state_key(name)) == "hash"
        assert redis_client.type(window_key(name)) == "list"
        assert key_slot(state_key(name).encode()) == key_slot(window_key(name).encode())
        assert state_key(name) == "resilience:breaker:{orders%3A%7Beu%7D}"

    def test_longest_name_escaped_is_digested(self, redis_client: Any) -> None:
        """The longest name a breaker takes (200 characters), all escapes (600 encoded),
        works under short Redis keys, apart from a name one character off."""
        name = "{:}" * 66 + "xy"
        long = breaker(redis_client, name)
        assert [record(long, "failure") for _ in range(2)] == ["", "open"]
        assert not long.acquire().allowed
        assert breaker(redis_client, name[:-1] + "z").acquire().allowed
        # Its window was cleared when it opened; the state hash remains, 85 characters long.
        assert list(redis_client.scan_iter(match="resilience:breaker:*")) == [state_key(name)]
        assert len(state_key(name)) == len("resilience:breaker:{}") + 65

    def test_admin_listing_decodes_names(self, redis_client: Any) -> None:
        """`jobs breakers list` shows names as configured, windows left out."""
        for name in ("payments", "payments:window", "orders:{eu}"):
            record(breaker(redis_client, name), "failure")
        backend = RedisBreakerBackend(lambda: redis_client)
        assert backend.names() == ["orders:{eu}", "payments", "payments:window"]
        states = {state.name: state for state in backend.describe(include_stored=True)}
        assert list(states) == ["orders:{eu}", "payments", "payments:window"]
        assert states["payments:window"].calls == 1
        assert backend.describe(["orders:{eu}"])[0].failures == 1

    def test_a_digested_name_is_described_under_both_spellings(self, redis_client: Any) -> None:
        """A name too long to keep is listed as its digest, and under its own name when
        asked for by name, never twice."""
        name = "{:}" * 66 + "xy"
        record(breaker(redis_client, name), "failure")
        backend = RedisBreakerBackend(lambda: redis_client)
        (stored,) = backend.describe(include_stored=True)
        assert stored.name.startswith("#") and stored.calls == 1
        (named,) = backend.describe([name], include_stored=True)
        assert named.name == name and named.calls == 1
