"""Lease heartbeat: extend a held lock in the background, and say so when it is lost.

`check()` (in `call.checks`, run by `call.checkpoint()` before the task commits) raises
`LockNotOwnedError` once an extension failed, the cap was reached, or the lease's monotonic
deadline passed: a holder paused (SIGSTOP, GC, swap) past its lease learns it on resuming,
before the heartbeat thread runs again.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

from resilience.config import check
from resilience.errors import LockNotOwnedError
from resilience.locks.backends import Lease

logger = logging.getLogger("resilience.locks.heartbeat")


@dataclass(frozen=True, kw_only=True)
class HeartbeatConfig:
    """How often and how many times a lease is renewed.

    Args:
        renew_fraction: extend when this fraction of the TTL has passed (0 < f < 1).
        max_extensions: cap on renewals, so a stuck task cannot hold a lock forever.
    """

    renew_fraction: float = 1 / 3
    max_extensions: int = 100

    def __post_init__(self) -> None:
        check(self, "renew_fraction", "in (0, 1)", lambda v: 0 < v < 1)
        check(self, "max_extensions", ">= 0", lambda v: v >= 0)


class Heartbeat:
    """Renews `lease` with `extend` until stopped; remembers why it stopped if it failed.

    Args:
        lease: the held lease.
        extend: renews the lease, returns False when it is lost (may raise a StorageError).
        options: cadence and cap.
    """

    def __init__(self, lease: Lease, extend: Callable[[Lease], bool],
                 options: HeartbeatConfig | None = None) -> None:
        self.lease = lease
        self.extend = extend
        self.options = options or HeartbeatConfig()
        self.lost_reason: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"lease-heartbeat:{lease.name}",
                                        daemon=True)

    def start(self) -> Heartbeat:
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop renewing (before release); returns once the thread has finished."""
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)

    def _run(self) -> None:
        interval = self.lease.ttl_seconds * self.options.renew_fraction
        while not self._stop.wait(interval):
            if self.lease.extensions >= self.options.max_extensions:
                self._lost(f"reached the cap of {self.options.max_extensions} extensions")
                return
            try:
                renewed = self.extend(self.lease)
            except Exception as exc:  # noqa: BLE001 - recorded; the task checks it
                self._lost(f"extension failed: {exc}")
                return
            if not renewed:
                self._lost("extension refused: the lock expired or another holder took it")
                return

    def _lost(self, reason: str) -> None:
        self.lost_reason = reason
        logger.warning("lease %s lost: %s", self.lease.name, reason)

    def check(self) -> None:
        """Raise when the lease is lost or past its deadline; call before committing.

        Raises:
            LockNotOwnedError: the lease was lost, so the task must not commit its effect.
        """
        if self.lost_reason is not None:
            raise LockNotOwnedError(
                f"lock {self.lease.name!r} lost ({self.lost_reason}); stopping before commit",
                key=self.lease.name, token=self.lease.fencing_token)
        self.lease.check(" (the holder was paused or renewals stalled)")
