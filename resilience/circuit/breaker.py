"""`CircuitBreaker`: one named breaker over a backend, with the store-down policy applied.

Every transition happens inside one atomic step of the backend (`acquire` or `record`), so
two workers never both see "closed -> open" nor hand out more probes than allowed. The state
machine, and the local copy of a closed breaker (`local.py`): docs/failure.md.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from time import monotonic
from typing import TYPE_CHECKING

from resilience.circuit.backends import BreakerBackend, BreakerState, Peek, Permission, Verdict
from resilience.circuit.backends.base import CLOSED
from resilience.circuit.config import BreakerConfig
from resilience.circuit.local import Batch, LocalBreaker, local_breaker
from resilience.errors import ConfigurationError, StorageError, StoreRejected
from resilience.outcomes import Outcome
from resilience.store_down import StoreDown

if TYPE_CHECKING:
    from resilience.batch import Rounds

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

    def local(self) -> LocalBreaker | None:
        """This process's copy of the breaker, None with `local_state_seconds=0`."""
        if self.config.local_state_seconds <= 0:
            return None
        local = local_breaker(self.backend, self.name)
        local.report = self._recorded
        return local

    def acquire(self) -> Permission:
        """May a call go ahead now? A fresh local copy of a closed breaker answers without
        the store; `on_store_down` applies when the store is unreachable.

        Raises:
            StoreRejected: the store refused the step (no retry can fix it).
        """
        local = self.local()
        asked = monotonic()
        if local is not None:
            cached = local.permission(self.config, asked)
            if cached is not None:
                return cached
        try:
            permission = self.backend.acquire(self.config)
        except StoreRejected:
            raise  # not "down": the guard dead-letters the job with the store's reason
        except StorageError as exc:
            return self.store_down(exc)
        if local is not None:
            local.saw(permission.state, permission.generation, asked)
        if permission.transition:
            self._transitioned(permission.transition, "acquire")
        return permission

    def store_down(self, exc: BaseException) -> Permission:
        """The permission `on_store_down` gives while the store is unreachable (warned,
        counted)."""
        allowed = self.config.on_store_down is StoreDown.FAIL_OPEN
        logger.warning("breaker %s: store unavailable, failing %s (%s)", self.name,
                       "open: call allowed" if allowed else "closed: call deferred", exc)
        if allowed:
            self.backend.count(self.name, Outcome.FAIL_OPEN.value)
        return Permission(allowed, "unknown", -1, self.config.open_seconds, store_down=True)

    def _slow(self, outcome: str, duration_seconds: float) -> bool:
        limit = self.config.slow_call_seconds
        return limit is not None and outcome != "ignored" and duration_seconds >= limit

    def peek_later(self, rounds: Rounds, then: Callable[[Peek | StorageError], None]) -> None:
        """The guard's prefetch: a fresh local copy answers at once; otherwise the state
        read is queued into the call's read round (and refreshes the copy)."""
        local = self.local()
        if local is None:
            self.backend.peek_later(rounds, self.name, then)
            return
        asked = monotonic()
        cached = local.permission(self.config, asked)
        if cached is not None:
            then(cached)
            return

        def seen(peek: Peek | StorageError) -> None:
            if isinstance(peek, Permission):
                local.saw(peek.state, peek.generation, asked)
            elif peek is None:
                local.forget()  # not closed: only acquire.lua can tell
            then(peek)

        self.backend.peek_later(rounds, self.name, seen)

    def _before_record(
        self, permission: Permission, outcome: str, slow: bool
    ) -> tuple[LocalBreaker | None, Batch, bool]:
        """The local copy, the pending successes to send first (in order: a failure is
        judged on them), and whether the outcome itself needs a script: not when the local
        layer counted it, nor when record.lua would change nothing (ignored, forced_closed)."""
        local = self.local()
        if local is None:
            return None, [], True
        if permission.state in CLOSED and outcome != "failure" and not slow:
            if outcome == "success" and permission.state == "closed":
                local.add(self.config, permission.generation, monotonic())
            return local, local.take() if local.due(monotonic()) else [], False
        return local, local.take(), True  # a decision (it may trip it), or not closed

    def record(self, permission: Permission, outcome: str, *, duration_seconds: float) -> Verdict:
        """Report a permitted call's outcome: 'success', 'failure' or 'ignored'. A success
        the local layer counts shows no figures in its verdict."""
        if permission.store_down:
            return Verdict("", "unknown")
        slow = self._slow(outcome, duration_seconds)
        local, pending, needed = self._before_record(permission, outcome, slow)
        if local is not None:
            local.send_now(pending)
        if not needed:
            return Verdict("", permission.state)
        try:
            return self._recorded(
                self.backend.record(self.config, permission.generation, outcome, slow)
            )
        except StorageError as exc:
            return self._recorded(exc)

    def record_later(
        self, rounds: Rounds, permission: Permission, outcome: str, *, duration_seconds: float
    ) -> None:
        """`record`, queued in the call's write round with its other after-run writes
        (pending successes go in the same round, once due or ahead of a failure)."""
        if permission.store_down:
            return
        slow = self._slow(outcome, duration_seconds)
        local, pending, needed = self._before_record(permission, outcome, slow)
        if local is not None:
            local.send_later(rounds, pending)
        if needed:
            self.backend.record_later(
                rounds, self.config, permission.generation, outcome, slow, self._recorded
            )

    def _recorded(self, verdict: Verdict | StorageError) -> Verdict:
        """Log and count the transition a verdict tells (the store's error: log it)."""
        if isinstance(verdict, StorageError):
            logger.warning("breaker %s: outcome not recorded (%s)", self.name, verdict)
            return Verdict("", "unknown")
        if self.config.local_state_seconds > 0:
            local_breaker(self.backend, self.name).observe(verdict)
        if verdict.transition:
            self._transitioned(
                verdict.transition,
                f"{verdict.failures} failures, {verdict.slow_calls} slow of {verdict.calls} calls",
            )
        return verdict

    def force(self, state: str) -> str:
        """Operator override; returns the previous state.

        Raises:
            ConfigurationError: `state` is not forced_open, forced_closed or closed.
        """
        if state not in FORCEABLE:
            raise ConfigurationError(f"state must be one of {FORCEABLE}, got {state!r}")
        previous = self.backend.force(self.name, state)
        if self.config.local_state_seconds > 0:
            self.local().forget()  # type: ignore[union-attr] - set above
        self._transitioned(state, f"operator (was {previous})")
        return previous

    def _transitioned(self, state: str, why: str) -> None:
        logger.warning("breaker %s -> %s (%s)", self.name, state, why)
        self.backend.count(self.name, f"BREAKER_{state.upper()}")

    def describe(self) -> BreakerState:
        """This breaker's live state (see `BreakerBackend.describe`).

        Raises:
            StorageError: the store failed.
        """
        return self.backend.describe([self.name])[0]
