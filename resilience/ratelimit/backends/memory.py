"""In-memory limiter backend: one process only; for fast algorithm tests and local use."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from resilience.ratelimit.algorithms import (
    ALGORITHMS,
    Algorithm,
    Decision,
    LimiterState,
    Params,
    WaitingLine,
)


def _us(seconds: float) -> int:
    return round(seconds * 1_000_000)


class MemoryBackend:
    """Limiter state in a dict behind one lock; each step is an algorithm's pure function.

    Args:
        clock: epoch seconds now (tests pass a fake clock and never sleep).
    """

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self._lock = threading.Lock()
        #: (algorithm name, key) -> the state its pure function keeps.
        self._states: dict[tuple[str, str], Any] = {}
        self._lines: dict[tuple[str, str], WaitingLine] = {}

    def run(
        self, algorithm: Algorithm, key: str, params: Params, caller: str | None = None
    ) -> Decision:
        caller = caller or uuid.uuid4().hex
        slot = (algorithm.name, key)
        with self._lock:
            now = _us(self.clock())
            allowed, state, retry = algorithm.step(self._states.get(slot), now, params, caller)
            self._states[slot] = state
            if algorithm.waits:
                line = self._lines.setdefault(slot, WaitingLine())
                if allowed:
                    line.granted(caller)
                else:
                    retry = line.retry_after(caller, now, retry, algorithm.spacing_us(params))
            return Decision(allowed, retry / 1e6, now / 1e6, algorithm.used(state, now))

    def release(self, algorithm: Algorithm, key: str, caller: str) -> bool:
        slot = (algorithm.name, key)
        with self._lock:
            released, state = algorithm.release(self._states.get(slot), _us(self.clock()), caller)
            self._states[slot] = state
            return released

    def describe(
        self, algorithm: Algorithm | None = None, key: str | None = None
    ) -> list[LimiterState]:
        chosen = [algorithm] if algorithm is not None else list(ALGORITHMS.values())
        with self._lock:
            now = _us(self.clock())
            return [
                each.describe(one, self._states.get((each.name, one)), now,
                              len(getattr(self._lines.get((each.name, one)), "arrivals", ())))
                for each in chosen
                for one in ([key] if key is not None else
                            sorted(stored for name, stored in self._states if name == each.name))
            ]
