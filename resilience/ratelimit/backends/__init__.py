"""Storage for the limit algorithms: a backend runs any registered algorithm atomically.

The Protocol has no method per algorithm: `run` performs one algorithm's step (the pure
function in memory, its Lua script on Redis), `release` gives a held slot back, `describe`
reads live state. A new algorithm (`resilience.ratelimit.algorithms.ALGORITHMS`) needs no
change here or in a backend.
"""

from __future__ import annotations

from typing import Protocol

from resilience.ratelimit.algorithms import (
    GCRA,
    LEASE,
    SLIDING_WINDOW,
    Algorithm,
    Decision,
    LimiterState,
    Params,
)


class LimiterBackend(Protocol):
    """The atomic steps the limit guards need from a store."""

    def run(
        self, algorithm: Algorithm, key: str, params: Params, caller: str | None = None
    ) -> Decision:
        """Decide one request of `caller` at the limiter `key` of `algorithm`, atomically.

        Args:
            caller: who asks: a task id for a rate limit (stable across deferrals, it keeps
                its place in the waiting line; None: a new one), the holder id of a slot.

        Raises:
            StorageError: the store failed (never a raw store error).
        """

    def release(self, algorithm: Algorithm, key: str, caller: str) -> bool:
        """Give `caller`'s slot back; False when its lease had already lapsed.

        Raises:
            StorageError: the store failed.  ConfigurationError: the algorithm holds no slots.
        """

    def describe(
        self, algorithm: Algorithm | None = None, key: str | None = None
    ) -> list[LimiterState]:
        """Live state of every limiter with state (of `algorithm`, or of every algorithm),
        or of the one limiter `key`, sorted by algorithm and key.

        Raises:
            StorageError: the store failed.
        """


class Shortcuts:
    """The per-algorithm calls of the former Protocol, as calls of `run` / `release`.

    Deprecated: kept for callers written against them (bench, older tests); removed in the
    next release. New code calls `run(algorithm, key, params)`.
    """

    def run(
        self, algorithm: Algorithm, key: str, params: Params, caller: str | None = None
    ) -> Decision:
        raise NotImplementedError

    def release(self, algorithm: Algorithm, key: str, caller: str) -> bool:
        raise NotImplementedError

    def describe(
        self, algorithm: Algorithm | None = None, key: str | None = None
    ) -> list[LimiterState]:
        raise NotImplementedError

    def gcra(
        self,
        key: str,
        *,
        interval_seconds: float,
        burst: int,
        cost: int = 1,
        caller: str | None = None,
    ) -> Decision:
        """Deprecated: `run(GCRA, key, Params(...), caller)`."""
        interval_us = round(interval_seconds * 1_000_000)
        params = Params(
            limit=1, period_us=interval_us, interval_us=interval_us, burst=burst, cost=cost
        )
        return self.run(GCRA, key, params, caller)

    def sliding_window(
        self, key: str, *, limit: int, window_seconds: float, caller: str | None = None
    ) -> Decision:
        """Deprecated: `run(SLIDING_WINDOW, key, Params(...), caller)`."""
        params = Params(limit=limit, period_us=round(window_seconds * 1_000_000))
        return self.run(SLIDING_WINDOW, key, params, caller)

    def acquire_lease(self, key: str, *, holder: str, limit: int, lease_seconds: float) -> Decision:
        """Deprecated: `run(LEASE, key, Params.of_slots(...), holder)`."""
        return self.run(LEASE, key, Params.of_slots(limit, lease_seconds=lease_seconds), holder)

    def release_lease(self, key: str, *, holder: str) -> bool:
        """Deprecated: `release(LEASE, key, holder)`."""
        return self.release(LEASE, key, holder)

    def holders(self, key: str) -> dict[str, float]:
        """Deprecated: live holders of the semaphore `key` and their lease expiry (epoch
        seconds on the store's clock); `describe(LEASE, key)` gives `Lease`s."""
        [state] = self.describe(LEASE, key)
        return {
            lease.owner or "": state.now_seconds + lease.expires_in_seconds
            for lease in state.holders
            if lease.alive
        }
