"""The worker's heartbeat file (`jobs health live --local`) and the consumption watchdog (a
worker that stops taking work reconnects, then exits 75). See docs/observe.md (Health;
Workers that stop consuming and stay alive).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from celery import bootsteps, signals
from kombu.utils.functional import retry_over_time

from jobs.observe.backlog import fresh_backlog
from jobs.observe.health import (
    Periodic,
    ReadinessRecorder,
    heartbeat_age,
    heartbeat_path,
    readiness,
    readiness_path,
    stalled_path,
)
from jobs.observe.metrics import WATCHDOG
from jobs.settings import get_settings
from resilience.counters import count_outcome
from resilience.redact import redact

logger = logging.getLogger("jobs.observe.watchdog")

#: Seconds between beats; the probe's max age should be many of these.
BEAT_INTERVAL_SECONDS = 1.0
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
        # Remove heartbeat files untouched for a day: killed workers', which nothing else
        # removes (node names that never come back, as in test sessions).
        cutoff = time.time() - ABANDONED_AFTER_SECONDS
        for path in self.path.parent.glob("*"):
            with contextlib.suppress(OSError):  # another worker removed it first, or not ours
                if path.stat().st_mtime < cutoff:
                    path.unlink()
        self._thread.start()

    def stop(self) -> None:
        """Stop beating and remove the file: a worker that has stopped is not alive."""
        self._thread.stop(join_seconds=self.interval_seconds * 2)
        self.path.unlink(missing_ok=True)

    def connected(self) -> bool:
        """The consumer runs and is not inside kombu's connection retry loop."""
        return self.consuming and not main_thread_waits_for_broker()

    def _beat_if_waiting(self) -> None:
        if not self.connected():
            self.beat()


def main_thread_waits_for_broker() -> bool:
    """Is the main thread inside kombu's connection retry loop (`retry_over_time`)?"""
    frame = sys._current_frames().get(threading.main_thread().ident or 0)
    while frame is not None:
        if frame.f_code is retry_over_time.__code__:
            return True
        frame = frame.f_back
    return False


class WorkerHeartbeat(bootsteps.StartStopStep):
    """Worker bootstep: the heartbeat file, beaten every second by the worker's timer, the
    readiness checks, and the consumption watchdog's thread (JOBS_WORKER_STALL_SECONDS > 0)."""

    # After the pool: its processes are forked when it starts, and the readiness thread's
    # first check imports modules; a process forked meanwhile would inherit their import
    # locks held and hang on its first PostgreSQL statement.
    requires = ("celery.worker.components:Timer", "celery.worker.components:Pool")
    timer_entry: Any = None
    watchdog: Periodic | None = None

    def create(self, w: Any) -> Heartbeat:
        heartbeat = w.jobs_heartbeat = Heartbeat(w.hostname)
        w.jobs_readiness = ReadinessRecorder(readiness_path(w.hostname),
                                             lambda: readiness(w.app, heartbeat.connected))
        stall = float((getattr(w.app, "settings", None) or get_settings()).worker_stall_seconds)
        self.watchdog = watchdog_thread(w, stall) if stall > 0 else None
        return heartbeat

    def start(self, w: Any) -> None:
        # Registered before the consumer starts, so the consumer's reconnects (which cancel
        # the timer entries of a lost connection) keep it.
        super().start(w)
        self.timer_entry = w.timer.call_repeatedly(
            w.jobs_heartbeat.interval_seconds, w.jobs_heartbeat.beat)
        w.jobs_readiness.start()
        if self.watchdog is not None:
            stalled_path(w.hostname).unlink(missing_ok=True)  # a previous incarnation's mark
            self.watchdog.start()

    def stop(self, w: Any) -> None:
        if self.watchdog is not None:
            self.watchdog.stop()
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
        c.controller.jobs_heartbeat.consuming = True
        c.controller.jobs_heartbeat.beat()

    def stop(self, c: Any) -> None:
        c.controller.jobs_heartbeat.consuming = False

    shutdown = stop


@signals.worker_shutdown.connect(weak=False)
def stop_heartbeat(sender: Any = None, **_: Any) -> None:
    """Stop worker `sender`'s heartbeat and readiness checks and remove their files."""
    for part in (getattr(sender, "jobs_readiness", None), getattr(sender, "jobs_heartbeat", None)):
        if part is not None:
            part.stop()


# -- the consumption watchdog ----------------------------------------------------------
#: Exit status of a worker that stalled and did not recover (EX_TEMPFAIL: start it again).
EXIT_STALLED = 75
#: Counter labels of the watchdog's decisions (`jobs_worker_stalls_total{action}`).
RECONNECT, EXIT = "reconnect", "exit"

#: Task messages this process's consumer has taken since it started.
_taken = [0]


@signals.task_received.connect(weak=False)
def _task_taken(**_: Any) -> None:
    _taken[0] += 1


@dataclass(frozen=True)
class ConsumerState:
    """What the watchdog sees of the consumer at one check."""

    #: Task messages taken so far (any change is progress).
    taken: int
    #: Fewer reserved requests than the prefetch limit: the broker should deliver more.
    free_slots: bool
    #: The consumer runs and is not inside Celery's own reconnect loop.
    consuming: bool
    #: The queues it consumes now.
    queues: tuple[str, ...]
    #: The event loop has not beaten the heartbeat for a while (blocked, e.g. on a socket).
    loop_blocked: bool = False


class ConsumptionWatchdog:
    """Decides, one `check()` at a time, whether the consumer stalled, and acts.

    Args:
        stall_seconds: nothing taken this long, with a backlog and free slots, is a stall.
        observe: the consumer's state now.
        backlog: messages waiting in the queues, on a fresh connection; None: unreachable.
        reconnect: make the consumer reconnect.
        give_up: mark the worker stalled and exit (reconnecting did not help).
        count: record a decision (RECONNECT / EXIT) fleet-wide.
        clock: monotonic seconds (injected in tests).
    """

    def __init__(self, *, stall_seconds: float, observe: Callable[[], ConsumerState],
                 backlog: Callable[[tuple[str, ...]], int | None],
                 reconnect: Callable[[], None], give_up: Callable[[str], None],
                 count: Callable[[str], None] = lambda action: None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if stall_seconds <= 0:
            raise ValueError(f"stall_seconds must be positive, got {stall_seconds!r}")
        self.stall_seconds = stall_seconds
        #: Seconds between fresh backlog reads while idle (each opens a broker connection).
        self.read_interval_seconds = stall_seconds / 4
        #: Seconds between checks of the consumer's state (local, no I/O).
        self.check_interval_seconds = max(0.1, stall_seconds / 20)
        #: After a reconnect, how long consumption has to come back.
        self.recover_seconds = stall_seconds / 2
        self.observe, self.backlog, self.clock = observe, backlog, clock
        self.reconnect, self.give_up, self.count = reconnect, give_up, count
        self._taken: int | None = None
        #: The queues the consumer consumed when last seen running.
        self.queues: tuple[str, ...] = ()
        self._backlog_seen: float | None = None
        self._restart_clock(clock())
        self._gave_up = False
        self._reconnected_at: float | None = None
        #: The last fresh read could not reach the broker (and nothing was taken since).
        self.outage = False

    def check(self) -> str | None:
        """Look once; returns what was decided: 'reconnect', 'recovered', 'exit',
        'outage', or None (nothing to do)."""
        if self._gave_up:
            return None
        now = self.clock()
        state = self.observe()
        progressed = self._taken is not None and state.taken != self._taken
        self._taken = state.taken
        if state.queues:
            self.queues = state.queues
        if self._reconnected_at is not None:  # the consumer restarts: its queues may be ()
            return self._after_reconnect(now, progressed or not state.free_slots)
        busy = not state.free_slots or not state.queues
        if progressed or busy or not state.consuming:
            self.outage = False
            self._restart_clock(now)
            return None
        due = (self.outage or state.loop_blocked
               or now - self._idle_since >= self.stall_seconds - self.read_interval_seconds)
        if not due or now < self._next_read:
            return None
        self._next_read = now + self.read_interval_seconds
        waiting = self.backlog(state.queues)
        if waiting is None:
            return self._broker_unreachable(now)
        if self.outage:  # the broker answers again: the stall clock starts now
            self.outage = False
            self._restart_clock(now)
            return None
        if waiting == 0:
            self._backlog_seen = None
            return None
        if self._backlog_seen is None:  # first sighting: a healthy consumer takes it now
            self._backlog_seen = now
            return None
        if now - self._idle_since < self.stall_seconds:
            return None
        logger.warning("consumer stalled: %d message(s) waiting in %s, free slots, nothing "
                       "taken for %.0fs; reconnecting it", waiting, ",".join(state.queues),
                       now - self._idle_since)
        self._reconnected_at = now
        try:
            self.reconnect()
        finally:  # counted after: a guard Redis on the broker's server answers again now
            self.count(RECONNECT)
        return RECONNECT

    def _after_reconnect(self, now: float, resumed: bool) -> str | None:
        assert self._reconnected_at is not None
        if resumed:
            logger.warning("consumer recovered %.1fs after the reconnect",
                           now - self._reconnected_at)
            self._reconnected_at = None
            self._restart_clock(now)
            return "recovered"
        if now - self._reconnected_at < self.recover_seconds:
            return None
        waiting = self.backlog(self.queues)
        if waiting is None:
            self._reconnected_at = None
            return self._broker_unreachable(now)
        if waiting == 0:
            self._reconnected_at = None
            self._restart_clock(now)
            return "recovered"
        reason = (f"consumer stalled: {waiting} message(s) waiting in "
                  f"{','.join(self.queues)}, nothing taken for "
                  f"{now - self._idle_since:.0f}s, and reconnecting did not help")
        logger.critical("%s; exiting with status %d so the supervisor restarts the worker",
                        reason, EXIT_STALLED)
        self._gave_up = True
        self.count(EXIT)
        self.give_up(reason)
        return EXIT

    def _broker_unreachable(self, now: float) -> str:
        if not self.outage:
            logger.warning("the broker cannot be reached on a fresh connection either: an "
                           "outage, not a stall; waiting for it")
        self.outage = True
        self._restart_clock(now)
        self._next_read = now + self.read_interval_seconds
        return "outage"

    def _restart_clock(self, now: float) -> None:
        self._idle_since = now
        self._next_read = now
        self._backlog_seen = None


# -- the worker's side ------------------------------------------------------------------
def consumer_state(worker: Any, *, blocked_after_seconds: float = 5.0) -> ConsumerState:
    """The state of `worker`'s consumer, read from Celery's worker objects; its loop counts
    as blocked when its heartbeat file is older than `blocked_after_seconds`."""
    from celery.worker import state

    consumer = worker.consumer
    task_consumer = getattr(consumer, "task_consumer", None)
    queues = tuple(queue.name for queue in getattr(task_consumer, "queues", None) or ())
    qos = getattr(consumer, "qos", None)
    limit = int(getattr(qos, "value", 0) or 0)
    return ConsumerState(
        taken=_taken[0], free_slots=limit == 0 or len(state.reserved_requests) < limit,
        consuming=worker.jobs_heartbeat.connected(), queues=queues,
        loop_blocked=(heartbeat_age(worker.hostname) or 0.0) > blocked_after_seconds)


def broker_addresses(app: Any) -> set[tuple[str, int]]:
    """The (ip, port) pairs the broker URL resolves to (TCP brokers; empty otherwise)."""
    with app.connection_for_read() as connection:
        host, port = connection.hostname, connection.port or connection.transport.default_port
    if not host or not port or str(host).startswith("/"):
        return set()
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError:
        return set()
    return {(str(info[4][0]), int(info[4][1])) for info in infos}


def sever_connections(addresses: set[tuple[str, int]]) -> int:
    """Shut down every TCP connection of this process to `addresses`; a thread blocked
    reading one gets its end of stream at once. Returns how many were shut down."""
    import psutil

    severed = 0
    for connection in psutil.Process().net_connections(kind="tcp"):
        remote = connection.raddr
        if not remote or connection.fd < 0 or (remote.ip, remote.port) not in addresses:
            continue
        with contextlib.suppress(OSError), socket.fromfd(  # OSError: closed meanwhile
                connection.fd, connection.family, socket.SOCK_STREAM) as sock:
            sock.shutdown(socket.SHUT_RDWR)  # acts on the connection, not the copy
            severed += 1
    return severed


def reconnect_consumer(worker: Any, *, wait_seconds: float = 1.0) -> None:
    """Make `worker`'s consumer reconnect: shut down the main process's broker connections
    (a loop blocked reading one gets its end of stream, kombu reconnects); and if the
    consumer did not restart within `wait_seconds`, raise a connection error on its event
    loop, which sends it down Celery's reconnect path."""
    consumer = worker.consumer
    restarts = consumer.restart_count
    severed = sever_connections(broker_addresses(worker.app))
    logger.warning("consumption watchdog: %d broker connection(s) of the worker shut down",
                   severed)
    deadline = time.monotonic() + wait_seconds
    while consumer.restart_count == restarts and time.monotonic() < deadline:
        time.sleep(0.05)
    hub = getattr(consumer, "hub", None)
    if consumer.restart_count != restarts or hub is None:
        return

    def lost() -> None:
        if consumer.restart_count == restarts:  # not restarted meanwhile
            raise ConnectionResetError("consumption watchdog: the consumer stalled, reconnecting")

    hub.call_soon(lost)


def exit_stalled(worker: Any, reason: str, *, grace_seconds: float) -> None:
    """Mark `worker` stalled (its liveness probe fails), ask for a warm shutdown with
    status `EXIT_STALLED`, and exit at once if it has not stopped after `grace_seconds`."""
    from celery.worker import state

    path = stalled_path(worker.hostname)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(redact(reason)[:300] + "\n")
    except OSError as exc:
        logger.warning("stall mark %s cannot be written (%s)", path, exc)
    state.should_stop = EXIT_STALLED  # the event loop raises WorkerShutdown(75)
    hub = getattr(worker.consumer, "hub", None)
    if hub is not None:
        hub.call_soon(lambda: None)  # wake the loop so it looks at the flag
    time.sleep(grace_seconds)
    logger.critical("consumption watchdog: the worker did not stop within %.1fs; exiting "
                    "now with status %d", grace_seconds, EXIT_STALLED)
    import psutil

    # SIGKILL the pool: no orphan outlives the worker (their unacknowledged messages are
    # delivered again, as after a crash).
    for child in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            child.send_signal(signal.SIGKILL)
    os._exit(EXIT_STALLED)


def watchdog_thread(w: Any, stall: float) -> Periodic:
    """The consumption watchdog of worker `w` (stall after `stall` seconds), in its thread."""
    timeout = min(5.0, max(0.5, stall / 4))
    # The loop beats every second: a few missed beats make a fresh read due at once.
    blocked_after = max(2.0, stall / 10)

    def count(action: str) -> None:
        tier = ",".join(watchdog.queues) or None
        count_outcome(w.app, "STALLED", guard=WATCHDOG, tier=tier, name=action)

    watchdog = w.jobs_watchdog = ConsumptionWatchdog(
        stall_seconds=stall,
        observe=lambda: consumer_state(w, blocked_after_seconds=blocked_after),
        backlog=lambda queues: fresh_backlog(w.app, queues, timeout_seconds=timeout),
        reconnect=lambda: reconnect_consumer(w),
        give_up=lambda reason: exit_stalled(w, reason, grace_seconds=max(1.0, stall / 4)),
        count=count,
    )

    def check() -> None:
        try:
            watchdog.check()
        except Exception:  # the watchdog must never take the worker down
            logger.exception("consumption watchdog check failed")
        if watchdog.outage:
            # Nothing reaches the broker: the main thread may be blocked on a silent
            # socket, but a restart would not help. Liveness holds.
            w.jobs_heartbeat.beat()

    return Periodic("jobs-watchdog", watchdog.check_interval_seconds, check)


@signals.celeryd_init.connect(weak=False)
def install(instance: Any = None, **_: Any) -> None:
    """Add the heartbeat and watchdog bootsteps to worker `instance`'s app (not built yet)."""
    if instance is not None:
        instance.app.steps["worker"].add(WorkerHeartbeat)
        instance.app.steps["consumer"].add(ConsumerHeartbeat)
