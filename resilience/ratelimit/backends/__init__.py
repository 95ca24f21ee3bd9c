"""Storage for the limit algorithms: a backend runs any registered algorithm atomically, so
a new algorithm (`resilience.ratelimit.algorithms.ALGORITHMS`) changes nothing here."""

from __future__ import annotations

from typing import Protocol

from resilience.ratelimit.algorithms import Algorithm, Decision, LimiterState, Params


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

