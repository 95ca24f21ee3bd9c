"""`AdvisorySession` on a real PostgreSQL, in the test process."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import text

from resilience.errors import ConfigurationError, LockNotOwnedError
from resilience.locks import AdvisorySession


class TestAdvisorySession:
    def test_transaction_pooling_refused(self, stores: Any) -> None:
        """A database declared behind PgBouncer transaction pooling is refused."""
        with pytest.raises(ConfigurationError, match="transaction pooling"):
            AdvisorySession(stores.database_url, pool_mode="transaction")

    def test_exclusive_and_freed_on_close(self, stores: Any) -> None:
        """A second session cannot take a held key; closing the holder frees it at once."""
        with AdvisorySession(stores.database_url, label="a") as first, AdvisorySession(
            stores.database_url, label="b"
        ) as second:
            assert first.try_acquire("job:1")
            assert not second.try_acquire("job:1")
            assert [h.owner for h in second.holders("job:1")] == ["a"]
            first.close()
            assert second.try_acquire("job:1")

    def test_killed_session_is_detected(self, stores: Any, engine: Any) -> None:
        """pg_terminate_backend of the holder's session makes verify() raise."""
        session = AdvisorySession(stores.database_url, label="victim")
        assert session.try_acquire("job:2")
        session.verify("job:2")
        with engine.begin() as connection:
            connection.execute(text("SELECT pg_terminate_backend(:pid)"),
                               {"pid": session.backend_pid})
        with pytest.raises(LockNotOwnedError, match="session is gone"):
            session.verify("job:2")
        session.close()

    def test_server_side_keepalives_and_user_timeout_are_set(self, stores: Any) -> None:
        """The server's end of a lock session probes a silent holder and gives up after
        the user timeout (tests/partition measures the lock freed within 15 s)."""
        with AdvisorySession(stores.database_url, label="keepalive") as session:
            settings = dict(session.execute(
                "SELECT name, setting FROM pg_settings WHERE name IN ('tcp_keepalives_idle',"
                " 'tcp_keepalives_interval', 'tcp_keepalives_count', 'tcp_user_timeout')"))
            parameters = session.connection.get_dsn_parameters()
        assert settings == {"tcp_keepalives_idle": "5", "tcp_keepalives_interval": "2",
                            "tcp_keepalives_count": "3", "tcp_user_timeout": "10000"}
        assert parameters["tcp_user_timeout"] == "10000"


class TestAdvisoryLockBackend:
    def test_lost_session_fails_check(self, stores: Any, engine: Any) -> None:
        """check() raises LockNotOwnedError once the holder's session was terminated, and
        the thread's next acquisition opens a fresh session."""
        from resilience.locks import AdvisoryLockBackend, Claimant
        from resilience.locks.backends.postgres import discard_thread_session

        backend = AdvisoryLockBackend(stores.database_url, engine=stores.engine)
        taken = backend.acquire("tests.locks.check", Claimant(task_id="t", task_name="n"))
        assert taken is not None
        with engine.begin() as connection:
            connection.execute(text("SELECT pg_terminate_backend(:pid)"),
                               {"pid": taken.handle.backend_pid})
        with pytest.raises(LockNotOwnedError, match="session is gone"):
            backend.check(taken)
        again = backend.acquire("tests.locks.check", Claimant(task_id="t", task_name="n"))
        assert again is not None and again.handle is not taken.handle
        backend.release(again)
        discard_thread_session()


class TestLockSessionPool:
    def test_released_sessions_are_reused_then_closed_when_idle(self, stores: Any) -> None:
        """A released lock session serves the next acquisition (any thread); unused for
        `idle_seconds` it is closed; with `idle_seconds=0` it is closed at release."""
        import threading
        import time

        from resilience.locks import AdvisoryLockBackend, Claimant
        from resilience.locks.backends.postgres import LockSessionPool

        pool = LockSessionPool(idle_seconds=0.3)
        backend = AdvisoryLockBackend(stores.database_url, engine=stores.engine)
        claimant = Claimant(task_id="t", task_name="n")
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr("resilience.locks.backends.postgres.SESSION_POOL", pool)
            first = backend.acquire("tests.locks.pool", claimant)
            assert first is not None
            backend.release(first)
            assert pool.idle_count() == 1
            taken: list[Any] = []
            thread = threading.Thread(target=lambda: taken.append(
                backend.acquire("tests.locks.pool", claimant)))
            thread.start()
            thread.join(10)
            assert taken[0] is not None and taken[0].handle is first.handle  # reused
            backend.release(taken[0])
            deadline = time.monotonic() + 5
            while pool.idle_count() and time.monotonic() < deadline:
                time.sleep(0.05)
            assert pool.idle_count() == 0 and first.handle.connection.closed
            pool.idle_seconds = 0
            again = backend.acquire("tests.locks.pool", claimant)
            assert again is not None
            backend.release(again)
            assert again.handle.connection.closed and pool.idle_count() == 0
