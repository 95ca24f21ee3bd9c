"""A process's copy of a closed breaker, and its successes waiting to be sent (issue 14).

With `BreakerConfig.local_state_seconds` (`S`) above 0, a copy read less than `S` ago that
says closed admits a call with no Redis operation, and a closed breaker's successes are sent
as one record.lua call (`calls=N`) once the oldest is `S` old: by the call that finds them
due (in its write round) or by the timer of `resilience.flushing`. Failures and slow calls
are decisions, sent at once after the pending successes. What this costs in staleness and
lost counts: docs/failure.md, "Local state".
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from resilience import flushing
from resilience.circuit.backends.base import CLOSED, Permission, Verdict
from resilience.errors import StorageError

if TYPE_CHECKING:
    from resilience.batch import Rounds
    from resilience.circuit.backends import BreakerBackend
    from resilience.circuit.config import BreakerConfig

logger = logging.getLogger("resilience.circuit")

#: (config, generation) -> successes not yet sent.
Batch = list[tuple["BreakerConfig", int, int]]


class LocalBreaker:
    """One breaker's copy and pending successes in this process (see the module doc)."""

    def __init__(self, backend: BreakerBackend, name: str) -> None:
        self.backend = backend
        self.name = name
        self._lock = threading.Lock()
        #: (state, generation, monotonic time the read was asked) of a closed breaker.
        self._copy: tuple[str, int, float] | None = None
        #: Successes not yet sent, per (config, generation) they were admitted under.
        self._pending = flushing.Pending()
        #: Told each flushed verdict (the breaker logs and counts transitions).
        self.report: Callable[[Verdict], object] = lambda _verdict: None

    # -- the copy ----------------------------------------------------------------------
    def permission(self, config: BreakerConfig, now: float) -> Permission | None:
        """The permission the copy gives now, or None when Redis must be asked."""
        copy = self._copy
        if copy is not None and now - copy[2] < config.local_state_seconds:
            return Permission(True, copy[0], copy[1])
        return None

    def saw(self, state: str, generation: int, asked_at: float) -> None:
        """Redis said `state` / `generation` for a read asked at `asked_at` (monotonic)."""
        with self._lock:
            if state not in CLOSED:
                self._copy = None
            elif self._copy is None or asked_at >= self._copy[2]:
                self._copy = (state, generation, asked_at)

    def forget(self) -> None:
        """Drop the copy: the next call asks Redis."""
        self._copy = None

    def observe(self, verdict: Verdict) -> None:
        """A verdict from Redis: any transition or state but closed drops the copy."""
        if verdict.transition or verdict.state not in (*CLOSED, "unknown"):
            self.forget()

    # -- pending successes ---------------------------------------------------------------
    def add(self, config: BreakerConfig, generation: int, now: float) -> None:
        self._pending.add((config, generation), now, config.local_state_seconds)

    def due(self, now: float) -> bool:
        return self._pending.due(now)

    def take(self) -> Batch:
        return [(config, generation, calls)
                for (config, generation), calls in self._pending.take().items()]

    def send_later(self, rounds: Rounds, batch: Batch) -> None:
        """Queue the batch into a call's write round (before anything the call queues next)."""
        for config, generation, calls in batch:
            self.backend.record_later(
                rounds, config, generation, "success", False,
                lambda verdict, calls=calls: self._sent(verdict, calls), calls,
            )

    def send_now(self, batch: Batch) -> None:
        """Send the batch now; never raises (a failed send is logged and dropped)."""
        for config, generation, calls in batch:
            try:
                verdict = self.backend.record(config, generation, "success", False, calls)
            except StorageError as exc:
                self._sent(exc, calls)
            else:
                self._sent(verdict, calls)

    def _sent(self, verdict: Verdict | StorageError, calls: int) -> None:
        if isinstance(verdict, StorageError):
            logger.warning("breaker %s: %d successes not recorded (%s)", self.name, calls, verdict)
            return
        self.observe(verdict)
        self.report(verdict)

    def flush(self, now: float, *, force: bool = False) -> bool:
        """The timer's (and shutdown's) flush: send the counts once due; True while some
        are still pending."""
        if not self._pending:
            return False
        if not (force or self._pending.due(now)):
            return True
        self.send_now(self.take())
        return False


def local_breaker(backend: BreakerBackend, name: str) -> LocalBreaker:
    """This process's `LocalBreaker` of breaker `name` in `backend`."""
    return flushing.member(("breaker", backend, name), lambda: LocalBreaker(backend, name))
