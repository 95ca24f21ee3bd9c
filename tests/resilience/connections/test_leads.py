"""Leads on a thread's shared PostgreSQL connection: a singleton's release riding on the
next commit (resilience.connections.postgres.Lead, AdvisoryLockBackend.hand_off); and
statements prepared on such connections whose first execution failed."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from sqlalchemy import text

from resilience.connections.postgres import StatementRunner
from resilience.locks import AdvisoryLockBackend, AdvisorySession, Claimant
from resilience.prepared import PreparedStatement

#: A commit that takes a while, so another session can try the lock meanwhile.
SLOW = PreparedStatement("test_leads_slow", "SELECT pg_sleep(0.8), 7 AS seven")
KEY = "tests.connections.leads"


def _registered(engine: Any) -> int:
    with engine.connect() as connection:
        return int(connection.execute(text(
            "SELECT count(*) FROM resilience_held_locks WHERE key = :key"), {"key": KEY},
        ).scalar_one())


class TestLeads:
    def test_a_handed_off_release_frees_the_lock_when_the_next_commit_does(
            self, stores: Any, engine: Any) -> None:
        """The release rides on the statement that takes leads, in one round trip: the
        lock stays held while that statement runs, is free once it committed, and its
        registry row is gone; the statement's own rows are the answer."""
        runner = StatementRunner(stores.database_url)
        backend = AdvisoryLockBackend(stores.database_url, engine=stores.engine,
                                      statements=runner)
        try:
            taken = backend.acquire(KEY, Claimant(task_id="t", task_name="n"))
            assert taken is not None and _registered(engine) == 1
            backend.hand_off(taken)
            seen: dict[str, bool] = {}

            def other_session() -> None:
                time.sleep(0.3)
                with AdvisorySession(stores.database_url, label="other") as other:
                    seen["during"] = other.try_acquire(KEY)

            thread = threading.Thread(target=other_session)
            thread.start()
            assert runner.run(SLOW, {}, "test", lead=True)[0].seven == 7
            thread.join(10)
            assert seen == {"during": False}
            with AdvisorySession(stores.database_url, label="after") as after:
                assert after.try_acquire(KEY)
            assert _registered(engine) == 0
            backend.release(taken)  # released with the commit: nothing left to send
        finally:
            runner.close()

    def test_a_release_no_commit_took_is_sent_alone(self, stores: Any, engine: Any) -> None:
        """A statement that does not take leads leaves the release waiting (the lock still
        held); `release` then withdraws it and releases on its own."""
        runner = StatementRunner(stores.database_url)
        backend = AdvisoryLockBackend(stores.database_url, engine=stores.engine,
                                      statements=runner)
        try:
            taken = backend.acquire(KEY, Claimant(task_id="t", task_name="n"))
            assert taken is not None
            backend.hand_off(taken)
            assert runner.run(SLOW, {}, "test")[0].seven == 7
            with AdvisorySession(stores.database_url, label="other") as other:
                assert not other.try_acquire(KEY)
            backend.release(taken)
            assert runner.connection().leads == []
            with AdvisorySession(stores.database_url, label="after") as after:
                assert after.try_acquire(KEY)
            assert _registered(engine) == 0
        finally:
            runner.close()


class TestPrepared:
    def test_a_statement_whose_first_execution_failed_runs_on_that_connection(
            self, stores: Any) -> None:
        """PREPARE and the first EXECUTE share a query string, and the PREPARE outlives the
        EXECUTE's runtime error: the next call must use it, not prepare it again (it got
        DuplicatePreparedStatement on that connection for good)."""
        from resilience.errors import StoreRejected

        divide = PreparedStatement("test_prepared_divide", "SELECT 6 / %(by)s::int AS v")
        runner = StatementRunner(stores.database_url)
        try:
            with pytest.raises(StoreRejected, match="DivisionByZero"):
                runner.run(divide, {"by": 0}, "test")
            assert runner.run(divide, {"by": 3}, "test")[0].v == 2
            assert runner.run(divide, {"by": 2}, "test")[0].v == 3
            held = runner.connection()
            again = PreparedStatement("test_prepared_again", "SELECT 6 / %(by)s::int AS v")
            with pytest.raises(StoreRejected, match="DivisionByZero"):
                held.execute_here(again, {"by": 0})
            assert held.execute_here(again, {"by": 6}) == [(1,)]
        finally:
            runner.close()

    def test_a_shared_connection_locks_after_its_first_acquisition_failed(
            self, stores: Any, engine: Any) -> None:
        """A shared connection's first acquisition prepares the release statements and the
        acquisition in one query string; when its EXECUTE fails (here: a read-only
        session), the PREPAREs stay on the session, and the next acquisition must still
        work on that connection (it got DuplicatePreparedStatement for good)."""
        from resilience.errors import StorageError

        runner = StatementRunner(stores.database_url)
        backend = AdvisoryLockBackend(stores.database_url, engine=stores.engine,
                                      statements=runner)
        claimant = Claimant(task_id="t", task_name="n")
        try:
            held = runner.connection()
            with held.driver.cursor() as cursor:
                cursor.execute("SET default_transaction_read_only = on")
            with pytest.raises(StorageError, match="ReadOnlySqlTransaction"):
                backend.acquire(KEY, claimant)
            with held.driver.cursor() as cursor:
                cursor.execute("SET default_transaction_read_only = off")
            taken = backend.acquire(KEY, claimant)
            assert taken is not None and runner.connection() is held
            assert _registered(engine) == 1
            backend.release(taken)
            assert _registered(engine) == 0
        finally:
            runner.close()

    def test_an_advisory_session_uses_a_statement_whose_first_execution_failed(
            self, stores: Any) -> None:
        """The same on a lock session (`AdvisorySession.execute_prepared`)."""
        from resilience.errors import StoreRejected

        divide = PreparedStatement("test_session_divide", "SELECT 6 / %(by)s::int AS v")
        with AdvisorySession(stores.database_url, label="prepared") as session:
            with pytest.raises(StoreRejected, match="DivisionByZero"):
                session.execute_prepared(divide, {"by": 0})
            assert session.execute_prepared(divide, {"by": 3}) == [(2,)]
            assert session.execute_prepared(divide, {"by": 2}) == [(3,)]
