"""Storage for the limit algorithms: each backend performs one atomic step per decision."""

from __future__ import annotations

from typing import Protocol

from resilience.ratelimit.algorithms import Decision


class LimiterBackend(Protocol):
    """The atomic operations the limit guards need from a store."""

    def gcra(self, key: str, *, interval_seconds: float, burst: int, cost: int = 1,
             caller: str | None = None) -> Decision:
        """Take `cost` permits from the GCRA limiter at `key`.

        `caller` (a task id, stable across deferrals) keeps its waiting slot when denied again.
        """

    def sliding_window(self, key: str, *, limit: int, window_seconds: float,
                       caller: str | None = None) -> Decision:
        """Take one permit from the sliding-window limiter at `key` (`caller` as for gcra)."""

    def acquire_lease(
        self, key: str, *, holder: str, limit: int, lease_seconds: float
    ) -> Decision:
        """Take (or renew) `holder`'s slot of the semaphore at `key`."""

    def release_lease(self, key: str, *, holder: str) -> bool:
        """Give back `holder`'s slot; False when it had expired and been reclaimed."""

    def holders(self, key: str) -> dict[str, float]:
        """Live holders of the semaphore at `key` and their lease expiry (epoch seconds)."""
