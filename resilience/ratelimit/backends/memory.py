"""In-memory limiter backend: one process only; for fast algorithm tests and local use."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable

from resilience.ratelimit import algorithms
from resilience.ratelimit.algorithms import Decision


def _us(seconds: float) -> int:
    return round(seconds * 1_000_000)


class MemoryBackend:
    """Limiter state in a dict, guarded by a lock; the clock is injectable.

    Args:
        clock: epoch seconds now (tests pass a fake clock and never sleep).
    """

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self._lock = threading.Lock()
        self._tat: dict[str, int] = {}
        self._logs: dict[str, list[int]] = {}
        self._leases: dict[str, dict[str, int]] = {}
        self._lines: dict[str, algorithms.WaitingLine] = {}

    def _line(self, key: str) -> algorithms.WaitingLine:
        return self._lines.setdefault(key, algorithms.WaitingLine())

    def gcra(self, key: str, *, interval_seconds: float, burst: int, cost: int = 1,
             caller: str | None = None) -> Decision:
        with self._lock:
            now = _us(self.clock())
            interval = _us(interval_seconds)
            allowed, tat, retry = algorithms.gcra(
                self._tat.get(key), now, interval_us=interval, burst=burst, cost=cost
            )
            self._tat[key] = tat
            caller = caller or uuid.uuid4().hex
            if allowed:
                self._line(key).granted(caller)
            else:
                retry = self._line(key).retry_after(caller, now, retry, interval * cost)
            return Decision(allowed, retry / 1e6, now / 1e6)

    def sliding_window(self, key: str, *, limit: int, window_seconds: float,
                       caller: str | None = None) -> Decision:
        with self._lock:
            now = _us(self.clock())
            allowed, kept, retry = algorithms.sliding_window(
                self._logs.get(key, []), now, limit=limit, window_us=_us(window_seconds)
            )
            self._logs[key] = kept
            caller = caller or uuid.uuid4().hex
            if allowed:
                self._line(key).granted(caller)
            else:
                retry = self._line(key).retry_after(caller, now, retry,
                                                    _us(window_seconds) // limit)
            return Decision(allowed, retry / 1e6, now / 1e6, len(kept))

    def acquire_lease(
        self, key: str, *, holder: str, limit: int, lease_seconds: float
    ) -> Decision:
        with self._lock:
            now = _us(self.clock())
            allowed, live, retry = algorithms.lease_acquire(
                self._leases.get(key, {}), now, holder=holder, limit=limit,
                lease_us=_us(lease_seconds),
            )
            self._leases[key] = live
            return Decision(allowed, retry / 1e6, now / 1e6, len(live))

    def release_lease(self, key: str, *, holder: str) -> bool:
        with self._lock:
            now = _us(self.clock())
            leases = self._leases.get(key, {})
            expiry = leases.pop(holder, None)
            return expiry is not None and expiry > now

    def holders(self, key: str) -> dict[str, float]:
        with self._lock:
            now = _us(self.clock())
            return {h: e / 1e6 for h, e in self._leases.get(key, {}).items() if e > now}
