"""`CircuitBreaker`: one named breaker over a backend, with the store-down policy applied.

    closed ──(calls >= minimum_calls and failure or slow rate >= threshold)──▶ open
    open ──(open_seconds elapsed; next acquire)──▶ half_open
    half_open ──(half_open_probes successes)──▶ closed
    half_open ──(one failure or slow probe, or no verdict within probe_timeout)──▶ open
    any ──(operator)──▶ forced_open | forced_closed | closed (reset)

Every transition happens inside one atomic step of the backend (`acquire` or `record`: a
Lua script on Redis server time in `backends/redis.py`), so two workers can never both see
"closed → open" or hand out more probes than allowed. Transitions are logged here and
counted through the backend (`BreakerBackend.count`).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from resilience.circuit.backends import BreakerBackend, BreakerState, Permission, Verdict
from resilience.circuit.config import BreakerConfig
from resilience.errors import ConfigurationError, StorageError, StoreRejected
from resilience.outcomes import Outcome
from resilience.store_down import StoreDown

if TYPE_CHECKING:
    from resilience.pipeline import Rounds

logger = logging.getLogger("resilience.circuit")

FORCEABLE = ("forced_open", "forced_closed", "closed")


class CircuitBreaker:
    """A fleet-wide breaker: `acquire()` before the call, `record()` after it."""

    def __init__(self, config: BreakerConfig, backend: BreakerBackend) -> None:
        self.config = config
        self.backend = backend

    @property
    def name(self) -> str:
        return self.config.name

    def acquire(self) -> Permission:
        """May a call go ahead now? Applies `on_store_down` when the store is unreachable.

        Raises:
            StoreRejected: the store refused the step (no retry can fix it).
        """
        try:
            permission = self.backend.acquire(self.config)
        except StoreRejected:
            raise  # not "down": the guard dead-letters the job with the store's reason
        except StorageError as exc:
            return self.store_down(exc)
        if permission.transition:
            self._transitioned(permission.transition, "acquire")
        return permission

    def store_down(self, exc: BaseException) -> Permission:
        """The permission `on_store_down` gives while the store is unreachable (warned,
        counted)."""
        allowed = self.config.on_store_down is StoreDown.FAIL_OPEN
        logger.warning(
            "breaker %s: store unavailable, failing %s (%s)",
            self.name,
            "open: call allowed" if allowed else "closed: call deferred",
            exc,
        )
        if allowed:
            self._count(Outcome.FAIL_OPEN.value)
        return Permission(
            allowed, "unknown", -1, wait_seconds=self.config.open_seconds, store_down=True
        )

    def _slow(self, outcome: str, duration_seconds: float) -> bool:
        return (
            self.config.slow_call_seconds is not None
            and outcome != "ignored"
            and duration_seconds >= self.config.slow_call_seconds
        )

    def record(self, permission: Permission, outcome: str, *, duration_seconds: float) -> Verdict:
        """Report a permitted call's outcome: 'success', 'failure' or 'ignored'."""
        if permission.store_down:
            return Verdict("", "unknown")
        try:
            verdict = self.backend.record(
                self.config, permission.generation, outcome, self._slow(outcome, duration_seconds)
            )
        except StorageError as exc:
            logger.warning("breaker %s: outcome not recorded (%s)", self.name, exc)
            return Verdict("", "unknown")
        self._recorded(verdict)
        return verdict

    def record_later(
        self, rounds: Rounds, permission: Permission, outcome: str, *, duration_seconds: float
    ) -> None:
        """`record`, queued in the call's write round with its other after-run writes."""
        if permission.store_down:
            return

        def done(verdict: Verdict | StorageError) -> None:
            if isinstance(verdict, StorageError):
                logger.warning("breaker %s: outcome not recorded (%s)", self.name, verdict)
                return
            self._recorded(verdict)

        self.backend.record_later(
            rounds,
            self.config,
            permission.generation,
            outcome,
            self._slow(outcome, duration_seconds),
            done,
        )

    def _recorded(self, verdict: Verdict) -> None:
        if verdict.transition:
            self._transitioned(
                verdict.transition,
                f"{verdict.failures} failures, {verdict.slow_calls} slow of {verdict.calls} calls",
            )

    def force(self, state: str) -> str:
        """Operator override; returns the previous state.

        Raises:
            ConfigurationError: `state` is not forced_open, forced_closed or closed.
        """
        if state not in FORCEABLE:
            raise ConfigurationError(f"state must be one of {FORCEABLE}, got {state!r}")
        previous = self.backend.force(self.name, state)
        self._transitioned(state, f"operator (was {previous})")
        return previous

    def _transitioned(self, state: str, why: str) -> None:
        logger.warning("breaker %s -> %s (%s)", self.name, state, why)
        self._count(f"BREAKER_{state.upper()}")

    def describe(self) -> BreakerState:
        """This breaker's live state (see `BreakerBackend.describe`).

        Raises:
            StorageError: the store failed.
        """
        return self.backend.describe([self.name])[0]

    def _count(self, outcome: str) -> None:
        self.backend.count(self.name, outcome)
