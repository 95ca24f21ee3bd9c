"""One fixture runs the breaker's state machine on every backend: in memory, real Redis."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from resilience.circuit import (
    BreakerBackend,
    BreakerConfig,
    CircuitBreaker,
    CountWindow,
    MemoryBreakerBackend,
    RedisBreakerBackend,
)
from resilience.circuit.backends.redis import state_key


class FakeClock:
    """Epoch seconds that only move when a test moves them."""

    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class BreakerStore:
    """A backend under test, and ways to let its time pass."""

    kind: str
    backend: BreakerBackend
    #: Let `seconds` pass for breaker `name`'s open period and probe timeout (no waiting).
    elapse: Callable[[str, float], None]
    #: Let `seconds` pass for everything, time windows included (Redis: really waits).
    sleep: Callable[[float], None]

    def breaker(self, **options: Any) -> CircuitBreaker:
        """A breaker of its own name: count window of 10, opens at 4 calls, 50 % failures."""
        settings: dict[str, Any] = {
            "name": f"unit-{uuid.uuid4().hex[:8]}",
            "window": CountWindow(calls=10),
            "minimum_calls": 4,
            "failure_rate_threshold": 0.5,
            "open_seconds": 60,
            "half_open_probes": 2,
        }
        settings.update(options)
        return CircuitBreaker(BreakerConfig(**settings), self.backend)


@pytest.fixture(params=["memory", "redis"])
def store(request: pytest.FixtureRequest) -> BreakerStore:
    """Each backend in turn: memory on a fake clock, and the session's real Redis."""
    if request.param == "memory":
        clock = FakeClock()

        def advance(seconds: float) -> None:
            clock.now += seconds

        return BreakerStore(
            "memory",
            MemoryBreakerBackend(clock=clock),
            lambda _name, seconds: advance(seconds),
            advance,
        )
    client = request.getfixturevalue("redis_client")

    def elapse(name: str, seconds: float) -> None:
        # Redis time cannot be moved: move the breaker's deadlines back instead.
        key = state_key(name)
        for field in ("open_until", "half_open_until", "changed_at"):
            value = client.hget(key, field)
            if value is not None:
                client.hset(key, field, int(value) - int(seconds * 1000))

    return BreakerStore("redis", RedisBreakerBackend(lambda: client), elapse, time.sleep)
