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
        """Decide one request of `caller` (a rate limit's task id, stable across deferrals
        so it keeps its place in line; a slot's holder id; None: a new one), atomically.

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

