"""Fixtures of the limit tests: every backend, and every registered algorithm.

`backend` runs a test on the in-memory backend (fake clock) and on real Redis; `algorithm`
runs it for each entry of `ALGORITHMS` (`holding` / `waiting` for those that hold slots or
keep a waiting line). A new algorithm or backend is tested by every such test at once.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from resilience.ratelimit import ALGORITHMS, Algorithm, MemoryBackend, RedisBackend


class FakeClock:
    """Epoch seconds a test moves by hand (the memory backend never waits)."""

    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(params=["memory", "redis"])
def backend(request: Any) -> Any:
    """Each backend: memory on a fake clock, Redis under a prefix of its own."""
    if request.param == "memory":
        return MemoryBackend(clock=FakeClock())
    client = request.getfixturevalue("redis_client")
    return RedisBackend(client, prefix=f"test:{uuid.uuid4().hex[:6]}")


@pytest.fixture(params=list(ALGORITHMS.values()), ids=list(ALGORITHMS))
def algorithm(request: Any) -> Algorithm:
    """Each registered algorithm."""
    return request.param


@pytest.fixture(
    params=[a for a in ALGORITHMS.values() if a.holds],
    ids=[n for n, a in ALGORITHMS.items() if a.holds],
)
def holding(request: Any) -> Algorithm:
    """Each algorithm whose grants are slots given back."""
    return request.param


@pytest.fixture(
    params=[a for a in ALGORITHMS.values() if a.waits],
    ids=[n for n, a in ALGORITHMS.items() if a.waits],
)
def waiting(request: Any) -> Algorithm:
    """Each algorithm whose denied callers wait in line."""
    return request.param
