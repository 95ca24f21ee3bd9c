"""`SessionWatcher`: a singleton's lock session probed while the body runs, on real
PostgreSQL (the holder's backend terminated, a probe left unanswered)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import text

from resilience.errors import ConfigurationError, LockNotOwnedError
from resilience.locks import AdvisoryLockBackend, AdvisorySession, SessionWatcher, SingletonConfig
from resilience.locks.backends import Claimant, Taken
from resilience.locks.backends.postgres import discard_thread_session
from tests.harness import wait_for

pytestmark = pytest.mark.usefixtures("locks_tables")


@pytest.fixture()
def backend(stores: Any) -> Iterator[AdvisoryLockBackend]:
    yield AdvisoryLockBackend(stores.database_url, engine=stores.engine)
    discard_thread_session()


def take(backend: AdvisoryLockBackend, key: str) -> Taken:
    taken = backend.acquire(key, Claimant(task_id="watcher-test", task_name="tests.watcher"))
    assert taken is not None
    return taken


def free_within(database_url: str, key: str, seconds: float) -> float:
    """Seconds until another session can take `key` (fails after `seconds`)."""
    started = time.monotonic()
    with AdvisorySession(database_url, label="watcher-probe") as other:
        wait_for(lambda: other.try_acquire(key), timeout_seconds=seconds, interval=0.02,
                 message=f"{key} free")
    return time.monotonic() - started


class TestSessionWatcher:
    def test_a_terminated_session_is_lost_within_one_probe_period(
        self, backend: AdvisoryLockBackend, engine: Any, stores: Any
    ) -> None:
        """pg_terminate_backend of the holder's session: the next probe fails and check()
        raises LockNotOwnedError (with the token) within one period; abandoning the hold
        then costs no statement and the lock is free."""
        taken = take(backend, "watcher:terminated")
        watcher = SessionWatcher(taken.key, lambda: backend.probe(taken), period_seconds=0.3,
                                 timeout_seconds=1.0, token=taken.token).start()
        time.sleep(0.7)
        watcher.check()
        assert watcher.probes >= 1
        with engine.begin() as connection:
            assert connection.execute(text("SELECT pg_terminate_backend(:pid)"),
                                      {"pid": taken.handle.backend_pid}).scalar()
        killed = time.monotonic()
        wait_for(watcher.lost, timeout_seconds=5, interval=0.01, message="the loss noticed")
        noticed = time.monotonic() - killed
        print(f"terminated session noticed after {noticed * 1000:.0f} ms (period 300 ms)")
        assert noticed < 0.3 + 0.5  # one period; slack for a loaded machine
        with pytest.raises(LockNotOwnedError, match="failed a probe") as lost:
            watcher.check()
        assert lost.value.token == taken.token and taken.token is not None
        assert watcher.stop()
        backend.abandon(taken)
        assert free_within(stores.database_url, taken.key, 5) < 5

    def test_check_asks_for_a_fresh_probe_so_a_session_just_ended_is_caught(
        self, backend: AdvisoryLockBackend, engine: Any
    ) -> None:
        """A long period (the background probe is not due): check() still sends a probe
        after it is called and waits for its answer, so a session terminated a moment
        before a commit is caught by that commit's check."""
        taken = take(backend, "watcher:fresh")
        watcher = SessionWatcher(taken.key, lambda: backend.probe(taken), period_seconds=5,
                                 timeout_seconds=3).start()
        started = time.monotonic()
        watcher.check()
        watcher.check()
        assert watcher.probes == 2 and time.monotonic() - started < 1
        with engine.begin() as connection:
            connection.execute(text("SELECT pg_terminate_backend(:pid)"),
                               {"pid": taken.handle.backend_pid})
        with pytest.raises(LockNotOwnedError, match="failed a probe"):
            watcher.check()
        assert watcher.stop()
        backend.abandon(taken)

    def test_an_unanswered_probe_is_loss_once_the_bound_passes(
        self, backend: AdvisoryLockBackend, stores: Any
    ) -> None:
        """A probe that gets no answer (here a 3 s statement, as a partition would hold it):
        the hold is lost once period + timeout passed since the last answered probe was
        sent, while that probe still waits, and check() waits no longer than that; stop()
        reports the session busy, and abandon closes it in the background, which frees
        the lock once the statement returns."""
        taken = take(backend, "watcher:silent")
        session: AdvisorySession = taken.handle
        watcher = SessionWatcher(taken.key, lambda: session.execute("SELECT pg_sleep(3)"),
                                 period_seconds=0.2, timeout_seconds=0.5).start()
        started = time.monotonic()
        with pytest.raises(LockNotOwnedError, match="no probe answered"):
            watcher.check()
        silent = time.monotonic() - started
        print(f"check() on a silent session raised after {silent * 1000:.0f} ms "
              "(bound 700 ms)")
        assert 0.7 <= silent < 0.7 + 0.5
        assert watcher.lost()
        assert watcher.stop(wait_seconds=0.1) is False
        abandoned = time.monotonic()
        backend.abandon(taken)
        assert time.monotonic() - abandoned < 0.1, "abandon waited on the busy session"
        assert free_within(stores.database_url, taken.key, 6) < 6

    def test_a_check_waiting_for_its_probe_returns_when_the_watcher_stops(
        self, backend: AdvisoryLockBackend
    ) -> None:
        """stop() (release) while a check() waits for a slow probe: the check returns on
        what is known instead of waiting out the bound."""
        taken = take(backend, "watcher:stopped")
        session: AdvisorySession = taken.handle
        watcher = SessionWatcher(taken.key, lambda: session.execute("SELECT pg_sleep(3)"),
                                 period_seconds=2, timeout_seconds=7).start()
        returned: list[float] = []
        started = time.monotonic()
        checker = threading.Thread(target=lambda: (watcher.check(),
                                                   returned.append(time.monotonic())))
        checker.start()
        time.sleep(0.2)
        assert not returned
        assert watcher.stop(wait_seconds=0.1) is False
        checker.join(timeout=2)
        assert returned and returned[0] - started < 1
        backend.abandon(taken)

    def test_a_healthy_session_keeps_its_hold_and_releases_normally(
        self, backend: AdvisoryLockBackend, stores: Any
    ) -> None:
        """Probes keep answering: check() passes, stop() ends the thread, and the usual
        release statement then runs on the session."""
        taken = take(backend, "watcher:healthy")
        watcher = SessionWatcher(taken.key, lambda: backend.probe(taken), period_seconds=0.05,
                                 timeout_seconds=1.0).start()
        time.sleep(0.5)
        watcher.check()
        assert watcher.probes >= 4
        assert watcher.stop()
        backend.release(taken)
        assert free_within(stores.database_url, taken.key, 1) < 1

    def test_a_paused_holder_learns_it_on_resuming(self) -> None:
        """On the monotonic clock: past the bound without an answer (the process was
        stopped, say), check() raises before any probe runs; once lost, always lost."""
        now = [100.0]
        watcher = SessionWatcher("watcher:paused", lambda: None, period_seconds=2,
                                 timeout_seconds=3, answered_at=100.0, clock=lambda: now[0])
        now[0] = 104.9
        watcher.check()
        now[0] = 105.1
        with pytest.raises(LockNotOwnedError, match="no probe answered for 5.1s"):
            watcher.check()
        watcher.answered_sent_at = 105.0
        assert watcher.lost()


class TestProbeOptions:
    def test_defaults_watch_every_two_seconds_with_a_five_second_bound(self) -> None:
        options = SingletonConfig()
        assert options.watched and options.probe_seconds == 2.0
        assert options.probe_seconds + options.probe_timeout_seconds == 5.0

    @pytest.mark.parametrize("off", [0, None])
    def test_zero_or_none_turns_the_watcher_off(self, off: float | None) -> None:
        assert not SingletonConfig(probe_seconds=off).watched

    def test_a_bound_past_the_sessions_tcp_user_timeout_is_refused(self) -> None:
        """PostgreSQL may end a silent holder's session 10 s after it last heard it; a
        holder must stop believing before that."""
        with pytest.raises(ConfigurationError, match="below 10s"):
            SingletonConfig(probe_seconds=5, probe_timeout_seconds=5)
        SingletonConfig(probe_seconds=5, probe_timeout_seconds=4.5)

    @pytest.mark.parametrize("options", [{"probe_seconds": -1},
                                         {"probe_timeout_seconds": 0}])
    def test_bad_values_are_refused(self, options: dict[str, float]) -> None:
        with pytest.raises(ConfigurationError):
            SingletonConfig(**options)


class TestCheckCost:
    def test_a_watched_check_costs_about_the_query_it_replaces(
        self, backend: AdvisoryLockBackend
    ) -> None:
        """A checkpoint through the watcher (a fresh probe, handed to its thread) against
        the query per checkpoint without one (`AdvisorySession.verify`, pg_locks): p50 of
        500 each, printed; the watched one is not dearer than twice the query + 0.5 ms."""
        taken = take(backend, "watcher:cost")
        session: AdvisorySession = taken.handle

        def p50(call: Any) -> float:
            timings = []
            for _ in range(500):
                started = time.perf_counter()
                call()
                timings.append(time.perf_counter() - started)
            return sorted(timings)[len(timings) // 2] * 1000

        watcher = SessionWatcher(taken.key, lambda: backend.probe(taken), period_seconds=2,
                                 timeout_seconds=3).start()
        try:
            watched = p50(watcher.check)
        finally:
            assert watcher.stop()
        queried = p50(lambda: session.verify(taken.key))
        probe = p50(session.probe)
        print(f"checkpoint p50: watched {watched:.3f} ms, query (pg_locks) {queried:.3f} ms; "
              f"the probe alone {probe:.3f} ms")
        assert watched < 2 * queried + 0.5
        backend.release(taken)
