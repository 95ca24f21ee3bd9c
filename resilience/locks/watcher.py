"""Session watcher: a singleton holder learns, while its body runs, that it lost its lock.

A session advisory lock lives as long as its session, which nothing else uses while the
body runs. The watcher thread sends one cheap probe on it (`SELECT pg_backend_pid()`) every
`period_seconds`, and one for each `check()` (in `call.checks`: `call.checkpoint()` and a
transactional `@idempotent` commit run it), which waits for the answer. A failed probe, or
silence past `period_seconds + timeout_seconds` (a probe sent into a partition fails only
at the TCP user timeout, 10 s), is loss. Timeline with the defaults (2 s + 3 s), A cut at c:

    A: probe sent at s <= c, answered                    (the server heard A at >= s)
    A: check() raises from s + 5 s <= c + 5 s on          (no answer to a later probe)
    PostgreSQL: ends A's session, freeing the lock, >= 10 s after it last heard A (>= s + 10)

So the bound must stay below the session's TCP user timeout (`SingletonConfig` checks it).
A watcher's thread starts only when its first probe falls due (one process-wide thread,
`_FirstProbes`, starts it) or `check()` asks: most bodies end sooner and start no thread.
See docs/locks.md.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable

from resilience.connections import on_fork
from resilience.errors import LockNotOwnedError

logger = logging.getLogger("resilience.locks.watcher")


class SessionWatcher:
    """Probes a held lock's session every `period_seconds` and on demand; `check()` says
    whether it is still held.

    Args:
        key: the lock key (named in errors and logs).
        probe: one statement on the held session; raises when the session is gone or moved.
        period_seconds: time between the sends of two background probes.
        timeout_seconds: how long past the next probe's due time silence is tolerated.
        answered_at: the monotonic time the acquisition was sent (its answer is the first).
        token: the acquisition's fencing token, carried by the error.
        clock: monotonic seconds (injectable for tests).
    """

    def __init__(self, key: str, probe: Callable[[], None], *, period_seconds: float,
                 timeout_seconds: float, answered_at: float | None = None,
                 token: int | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.key = key
        self.probe = probe
        self.period_seconds = period_seconds
        self.timeout_seconds = timeout_seconds
        self.token = token
        self.clock = clock
        #: When the newest answered probe was sent (the server heard us after it).
        self.answered_sent_at = clock() if answered_at is None else answered_at
        #: Probes answered so far.
        self.probes = 0
        self.lost_reason: str | None = None
        self._requested = float("-inf")  # the newest check() waiting for a fresh answer
        self._watching = False  # start() was called
        self._stopped = False
        self._changed = threading.Condition()
        self._thread: threading.Thread | None = None  # started when first needed

    @property
    def bound_seconds(self) -> float:
        """Silence after which the hold counts as lost: the period plus the timeout."""
        return self.period_seconds + self.timeout_seconds

    def start(self) -> SessionWatcher:
        """Watch from now on: the probing thread starts when the first probe falls due."""
        self._watching = True
        _FIRST_PROBES.add(self, time.monotonic() + max(
            0.0, self.answered_sent_at + self.period_seconds - self.clock()))
        return self

    def stop(self, wait_seconds: float = 1.0) -> bool:
        """Stop probing (before release); True when no probe is still using the session.

        A probe stuck in a partition keeps the session busy until the TCP user timeout;
        the caller then gives the session up without a statement (`abandon`).
        """
        with self._changed:
            self._stopped = True
            self._changed.notify_all()
            thread = self._thread
        if thread is None:
            return True
        if thread.is_alive() and thread is not threading.current_thread():
            thread.join(timeout=wait_seconds)
        return not thread.is_alive()

    def lost(self) -> bool:
        """True when the hold is known lost or silent past the bound (no probe sent)."""
        with self._changed:
            return self._lost_now() is not None

    def check(self) -> None:
        """Raise unless a probe sent after this call is answered; wait for it at most
        until the bound passes (then the hold is lost). Once lost, always lost.

        Without a running watcher (not started, stopped) only what is known is checked.

        Raises:
            LockNotOwnedError: the lock may be another holder's; do not commit.
        """
        with self._changed:
            if self._lost_now() is None and self._watching and not self._stopped:
                self._start_probing()
                asked = self.clock()
                self._requested = max(self._requested, asked)
                self._changed.notify_all()
                while (self.answered_sent_at < asked and self._lost_now() is None
                       and not self._stopped):
                    self._changed.wait(self.answered_sent_at + self.bound_seconds - self.clock())
            reason = self._lost_now()
        if reason is not None:
            raise LockNotOwnedError(
                f"singleton lock {self.key!r} lost: {reason}; stopping before the task "
                "commits", key=self.key, token=self.token)

    # -- inside, with `_changed` held ----------------------------------------------------------
    def _start_probing(self) -> None:
        """Start the probing thread once, unless stopped or lost meanwhile."""
        if self._thread is None and not self._stopped and self.lost_reason is None:
            self._thread = threading.Thread(target=self._run, daemon=True,
                                            name=f"lock-watcher:{self.key}"[:60])
            self._thread.start()

    def _lost_now(self) -> str | None:
        """The reason the hold is lost, deciding silence past the bound is loss."""
        if self.lost_reason is None:
            silent = self.clock() - self.answered_sent_at
            if silent > self.bound_seconds:
                self._lose(
                    f"no probe answered for {silent:.1f}s (bound {self.bound_seconds:g}s: "
                    f"a probe every {self.period_seconds:g}s, answered within "
                    f"{self.timeout_seconds:g}s); PostgreSQL may have ended its session")
        return self.lost_reason

    def _lose(self, reason: str) -> None:
        if self.lost_reason is None:
            self.lost_reason = reason
            if self._stopped:  # a probe still in flight at release failed (abandoned session)
                logger.debug("singleton lock %s: probe after release failed: %s", self.key,
                             reason)
            else:
                logger.warning("singleton lock %s lost while its body runs: %s", self.key,
                               reason)
        self._changed.notify_all()

    def _run(self) -> None:
        due = self.answered_sent_at + self.period_seconds
        while True:
            with self._changed:
                while not self._stopped and self.lost_reason is None:
                    if self._requested > self.answered_sent_at:
                        break  # a check() waits for an answer to a probe sent after it
                    remaining = due - self.clock()
                    if remaining <= 0:
                        break
                    self._changed.wait(remaining)
                if self._stopped or self.lost_reason is not None:
                    return
            sent = self.clock()
            try:
                self.probe()
            except Exception as exc:  # noqa: BLE001 - recorded; check() raises it
                with self._changed:
                    self._lose(f"its session failed a probe: {exc}")
                return
            with self._changed:
                if self.lost_reason is not None:  # declared lost meanwhile: stays lost
                    return
                self.answered_sent_at = sent
                self.probes += 1
                self._changed.notify_all()
            due = sent + self.period_seconds


class _FirstProbes:
    """One thread per process that starts each watcher's probing thread when its first
    probe falls due; a watcher stopped before then is dropped without a thread."""

    def __init__(self) -> None:
        self._forget()
        on_fork(self._forget)

    def _forget(self) -> None:
        """A fresh, empty schedule (also in a forked child: the parent's thread is gone)."""
        self._due: list[tuple[float, int, SessionWatcher]] = []
        self._order = itertools.count()
        self._changed = threading.Condition()
        self._thread: threading.Thread | None = None

    def add(self, watcher: SessionWatcher, due: float) -> None:
        """Start `watcher`'s thread at `due` (monotonic seconds) unless it stopped."""
        with self._changed:
            heapq.heappush(self._due, (due, next(self._order), watcher))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="lock-watchers",
                                                daemon=True)
                self._thread.start()
            elif self._due[0][2] is watcher:
                self._changed.notify()

    def _run(self) -> None:
        changed = self._changed
        while True:
            with changed:
                while not self._due or self._due[0][0] > time.monotonic():
                    changed.wait(self._due[0][0] - time.monotonic() if self._due else None)
                watcher = heapq.heappop(self._due)[2]
            try:
                with watcher._changed:
                    watcher._start_probing()
            except RuntimeError as exc:  # no thread to be had: that hold goes silent, lost
                logger.warning("singleton lock %s: its watcher did not start: %s",
                               watcher.key, exc)


_FIRST_PROBES = _FirstProbes()
