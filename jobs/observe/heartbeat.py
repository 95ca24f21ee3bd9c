"""The worker's heartbeat file: liveness read locally (one `stat`), with no broker round
trip, beaten by the worker's event loop, and by a thread while the main thread waits for a
lost broker (a broker outage must not fail every liveness probe of the fleet at once).
The same bootstep starts the worker's readiness recorder. See docs/observe.md (Health).
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

from celery import bootsteps
from kombu.utils.functional import retry_over_time

from jobs.observe.health import (
    Periodic,
    ReadinessRecorder,
    heartbeat_path,
    readiness_path,
    worker_readiness,
)

logger = logging.getLogger("jobs.observe.heartbeat")

#: Seconds between beats; the probe's max age should be many of these.
BEAT_INTERVAL_SECONDS = 1.0
#: Default `--max-age` of `jobs health live --local`.
DEFAULT_MAX_AGE_SECONDS = 30.0
#: A worker starting removes other heartbeat files older than this (killed workers').
ABANDONED_AFTER_SECONDS = 24 * 3600.0


class Heartbeat:
    """The heartbeat file of worker `node`, beaten by its event loop or, while the main
    thread waits for the broker or the consumer is down, by a thread of the main process."""

    def __init__(self, node: str, interval_seconds: float = BEAT_INTERVAL_SECONDS) -> None:
        self.path = heartbeat_path(node)
        self.interval_seconds = interval_seconds
        #: True while the consumer runs (its event loop beats); False: the thread beats.
        self.consuming = False
        self._thread = Periodic("jobs-heartbeat", interval_seconds, self._beat_if_waiting)
        self._warned = False

    def beat(self) -> None:
        """Touch the file; a write error is logged once and never stops the worker."""
        try:
            try:
                os.utime(self.path)
            except FileNotFoundError:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self.path.write_text(f"{os.getpid()}\n")
            self._warned = False
        except OSError as exc:
            if not self._warned:
                logger.warning("heartbeat file %s cannot be written (%s): `jobs health live "
                               "--local` will fail; set TMPDIR to a writable directory",
                               self.path, exc)
                self._warned = True

    def start(self) -> None:
        """Write the file and start the thread that beats while the consumer is down."""
        self.beat()
        _remove_abandoned(self.path.parent)
        self._thread.start()

    def stop(self) -> None:
        """Stop beating and remove the file: a worker that has stopped is not alive."""
        self._thread.stop(join_seconds=self.interval_seconds * 2)
        self.path.unlink(missing_ok=True)

    def _beat_if_waiting(self) -> None:
        if not self.consuming or main_thread_waits_for_broker():
            self.beat()


def main_thread_waits_for_broker() -> bool:
    """Is the main thread inside kombu's connection retry loop (`retry_over_time`)?"""
    frame = sys._current_frames().get(threading.main_thread().ident or 0)
    while frame is not None:
        if frame.f_code is retry_over_time.__code__:
            return True
        frame = frame.f_back
    return False


def _remove_abandoned(directory: Path) -> None:
    """Remove heartbeat files untouched for a day: killed workers' files, which nothing
    else removes (node names that never come back, as in test sessions)."""
    cutoff = time.time() - ABANDONED_AFTER_SECONDS
    for path in directory.glob("*"):
        try:
            if path.stat().st_mtime < cutoff:
                path.unlink()
        except OSError:
            pass  # another worker removed it first, or it is not ours to remove


class WorkerHeartbeat(bootsteps.StartStopStep):
    """Worker bootstep: the heartbeat file, beaten every second by the worker's timer."""

    requires = ("celery.worker.components:Timer",)
    timer_entry: Any = None

    def create(self, w: Any) -> Heartbeat:
        heartbeat = w.jobs_heartbeat = Heartbeat(w.hostname)

        def broker_connected() -> bool:
            return heartbeat.consuming and not main_thread_waits_for_broker()

        w.jobs_readiness = ReadinessRecorder(
            readiness_path(w.hostname), lambda: worker_readiness(w.app, broker_connected))
        return heartbeat

    def start(self, w: Any) -> None:
        # Registered before the consumer starts, so the consumer's reconnects (which cancel
        # the timer entries of a lost connection) keep it.
        super().start(w)
        self.timer_entry = w.timer.call_repeatedly(
            w.jobs_heartbeat.interval_seconds, w.jobs_heartbeat.beat)
        w.jobs_readiness.start()

    def stop(self, w: Any) -> None:
        # The thread keeps beating while the pool finishes its tasks; `worker_shutdown`
        # stops it and removes the file (`stop_heartbeat`).
        if self.timer_entry is not None:
            w.timer.cancel(self.timer_entry)
            self.timer_entry = None
        w.jobs_heartbeat.consuming = False

    terminate = stop


class ConsumerHeartbeat(bootsteps.StartStopStep):
    """Consumer bootstep: tells the heartbeat whether the consumer (and its loop) runs."""

    # Started after the connection and the task consumers, just before the event loop.
    requires = ("celery.worker.consumer.tasks:Tasks",)

    def start(self, c: Any) -> None:
        self._set(c, consuming=True)

    def stop(self, c: Any) -> None:
        self._set(c, consuming=False)

    shutdown = stop

    @staticmethod
    def _set(c: Any, *, consuming: bool) -> None:
        heartbeat = getattr(c.controller, "jobs_heartbeat", None)
        if heartbeat is not None:
            heartbeat.consuming = consuming
            if consuming:
                heartbeat.beat()


def install(app: Any) -> None:
    """Add the heartbeat bootsteps to `app`'s workers (before the worker is built)."""
    app.steps["worker"].add(WorkerHeartbeat)
    app.steps["consumer"].add(ConsumerHeartbeat)


def stop_heartbeat(worker: Any) -> None:
    """Stop `worker`'s heartbeat and readiness checks and remove their files (the worker
    has shut down)."""
    for part in (getattr(worker, "jobs_readiness", None), getattr(worker, "jobs_heartbeat", None)):
        if part is not None:
            part.stop()
