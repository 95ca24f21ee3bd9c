"""A process's copy of a closed breaker, and its successes waiting to be sent (issue 14).

Per process and per breaker (of one backend), with `BreakerConfig.local_state_seconds`
(`S`, default 0.1) above 0:

- admission: while this process's copy of the state says closed / forced_closed and was
  read less than `S` ago, a call is admitted with no Redis operation. A stale copy is read
  again with the call's other reads (the `HMGET` the guard always sent); any state but
  closed takes today's exact path (acquire.lua), and a copy is never kept for it.
- outcomes: a success of a closed breaker is added to a count here; the counts are sent as
  ONE record.lua call (`calls=N`: a count window gets N entries) once the oldest is `S`
  old: by the call that finds them due, in its write round, or by the timer thread when no
  call comes (`resilience.flushing`, which also flushes at shutdown and is
  fork-safe). Both, because the call's round costs no extra round trip under traffic and
  the timer bounds the delay when traffic stops. An "ignored" outcome of a closed breaker
  (record.lua changes nothing for it) sends nothing.
- decisions go at once: a failure or a slow call (either can trip the breaker) is recorded
  as today, right after the pending successes (same round, in order), so the rate it is
  judged on counts them. Probes (half-open) and every other state: today's path.

What this changes in the guarantees (docs/failure.md, "Local state"): a trip made in
another process stops admission here at most `S` later (plus one read in flight); the
successes a SIGKILLed process held (its last `S` seconds) are lost, so the failure rate
reads slightly high (the breaker opens marginally early, never late). `S = 0` is the exact
per-call behaviour.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from resilience import flushing
from resilience.circuit.backends import Permission, Verdict
from resilience.errors import StorageError

if TYPE_CHECKING:
    from resilience.batch import Rounds
    from resilience.circuit.backends import BreakerBackend
    from resilience.circuit.config import BreakerConfig

logger = logging.getLogger("resilience.circuit")

#: States a copy may stand for: acquire.lua only reads in them.
CLOSED = ("closed", "forced_closed")

#: (config, generation) -> successes not yet sent.
Batch = list[tuple["BreakerConfig", int, int]]


class LocalBreaker:
    """One breaker's copy and pending successes in this process (see the module doc).

    Args:
        backend: where the breaker lives (flushes go there).
        name: the breaker.
    """

    def __init__(self, backend: BreakerBackend, name: str) -> None:
        self.backend = backend
        self.name = name
        self._lock = threading.Lock()
        #: (state, generation, monotonic time the read was asked) of a closed breaker.
        self._copy: tuple[str, int, float] | None = None
        #: Successes not yet sent, per (config, generation) they were admitted under.
        self._pending = flushing.Pending()
        #: Told each flushed verdict (the breaker logs and counts transitions).
        self.report: Callable[[Verdict], None] = lambda _verdict: None

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
        """Count one success admitted under `generation`."""
        self._pending.add((config, generation), now, config.local_state_seconds)

    def due(self, now: float) -> bool:
        """Are the pending counts old enough to send?"""
        return self._pending.due(now)

    def take(self) -> Batch:
        """Everything pending (and no longer pending)."""
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
                verdict: Verdict | StorageError = self.backend.record(
                    config, generation, "success", False, calls
                )
            except StorageError as exc:
                verdict = exc
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


def monotonic() -> float:
    """The clock of local copies and pending counts."""
    return time.monotonic()
