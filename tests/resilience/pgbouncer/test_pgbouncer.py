"""The guards through a real PgBouncer in transaction mode, advisory locks direct.

DATABASE_URL is PgBouncer (`pool_mode = transaction`, two server connections) and
LOCKS_DATABASE_URL is PostgreSQL itself (conftest.py). Idempotency (claim, completion,
replay, failure, transactional mode) runs through PgBouncer without prepared statements or
connect-time options; singletons and beat leadership hold their session advisory locks on
direct connections, which are closed once released.
"""

from __future__ import annotations

import threading
import uuid
from typing import Any

import psycopg2
import pytest
from sqlalchemy import text

from resilience.connections.postgres import connect_arguments
from resilience.errors import ConfigurationError
from resilience.idempotency.backends import FAILED, SUCCEEDED
from resilience.idempotency.backends.postgres import backend_for
from resilience.locks.backends.postgres import SESSION_POOL, AdvisoryLockBackend
from resilience.locks.beat import BeatLeadership
from resilience.prepared import PreparedStatement
from tests.harness import wait_for
from tests.resilience.pgbouncer import tasks
from tests.resilience.pgbouncer.conftest import SERVER_NAME, SERVER_POOL_SIZE, PgBouncer

pytestmark = pytest.mark.usefixtures("pgbouncer_stores")

#: Backends of this database by kind: direct lock sessions, PgBouncer's server connections.
_BACKENDS = text("""
    SELECT count(*) FILTER (WHERE application_name LIKE 'lock:%%') AS locks,
           count(*) FILTER (WHERE application_name = :server) AS pooled
    FROM pg_stat_activity WHERE datname = current_database()
""")


def backends(engine: Any) -> tuple[int, int]:
    """(direct lock sessions, PgBouncer server connections) open now on the database."""
    with engine.connect() as connection:
        row = connection.execute(_BACKENDS, {"server": SERVER_NAME}).one()
    return int(row.locks), int(row.pooled)


def effects(engine: Any, run_id: str, key: str) -> list[str]:
    with engine.connect() as connection:
        return list(connection.execute(text(
            "SELECT task_id FROM pgbouncer_test_effects WHERE run_id = :r AND key = :k "
            "ORDER BY id"), {"r": run_id, "k": key}).scalars())


@pytest.fixture()
def run_id() -> str:
    return uuid.uuid4().hex[:12]


@pytest.fixture()
def short_idle(monkeypatch: pytest.MonkeyPatch) -> None:
    """Released lock sessions close after 0.3 s (default 5 s), and none is idle now."""
    SESSION_POOL.close_idle()
    monkeypatch.setattr(SESSION_POOL, "idle_seconds", 0.3)


class TestPgBouncerItself:
    def test_options_at_connect_are_refused_and_the_stores_do_not_send_them(
        self, pgbouncer: PgBouncer, pgbouncer_stores: Any
    ) -> None:
        """The pooler refuses `options=-c synchronous_commit=off` (the old way), and the
        idempotency backend with synchronous_commit off connects and writes through it."""
        with pytest.raises(psycopg2.OperationalError,
                           match="unsupported startup parameter: options"):
            psycopg2.connect(host="127.0.0.1", port=pgbouncer.port, user="postgres",
                             dbname=pgbouncer.direct.database,
                             options="-c synchronous_commit=off").close()
        backend = backend_for(pgbouncer_stores, synchronous_commit=False)
        backend.ping()
        assert backend.claim(task_name="tests.pgbouncer.ping", key=uuid.uuid4().hex,
                             fingerprint="f", owner="o", task_id=None, lease_seconds=5,
                             ttl_seconds=60).claim is not None

    def test_prepared_statements_break_behind_it_and_are_turned_off(
        self, pgbouncer: PgBouncer, pgbouncer_stores: Any
    ) -> None:
        """SQL-level prepared statements on two client connections collide on PgBouncer's
        shared server connections (each client prepares once, as the runner does, then
        executes); `backend_for` turns them off for a transaction pooler. (The runner
        learns a session's prepared statements after such an error and retries once,
        which hides most of these collisions without making them safe.)"""
        clients = [psycopg2.connect(**connect_arguments(pgbouncer.url)) for _ in range(2)]
        statement = PreparedStatement("test_pooled_probe", "SELECT %(n)s::int AS n")
        prepared: list[set[str]] = [set(), set()]
        failures = []
        try:
            for n in range(5):
                for client, names in zip(clients, prepared, strict=True):
                    client.autocommit = True
                    query = (statement.execute if statement.name in names
                             else statement.prepare_and_execute)
                    try:
                        with client.cursor() as cursor:
                            cursor.execute(query, statement.values({"n": n}))
                        names.add(statement.name)
                    except psycopg2.Error as exc:
                        failures.append(str(exc))
        finally:
            for client in clients:
                client.close()
        assert failures and all("prepared statement" in failure for failure in failures)
        assert backend_for(pgbouncer_stores).prepared is False
        unprepared = [backend_for(pgbouncer_stores) for _ in range(2)]
        for _ in range(5):
            for backend in unprepared:
                backend.ping()

    def test_synchronous_commit_is_off_per_statement_only(self, pgbouncer_stores: Any) -> None:
        """With synchronous_commit off, a write runs with it off in its own transaction and
        leaves nothing behind on the shared server connection."""
        probe = PreparedStatement(
            "probe", "SELECT current_setting('synchronous_commit') AS value")
        backend = backend_for(pgbouncer_stores, synchronous_commit=False)
        assert backend._execute(probe, {}, "probe", write=True)[0].value == "off"
        assert backend._execute(probe, {}, "probe")[0].value == "on"
        durable = backend_for(pgbouncer_stores, synchronous_commit=True)
        assert durable._execute(probe, {}, "probe", write=True)[0].value == "on"


class TestIdempotencyThroughPgBouncer:
    def test_claim_complete_and_replay(self, engine: Any, run_id: str) -> None:
        """The first call runs and completes; the duplicate is REPLAYED with its result."""
        first = tasks.charge.apply(args=(run_id, "a"))
        assert first.successful() and first.result["ran_in"] == first.id
        second = tasks.charge.apply(args=(run_id, "a"))
        assert second.successful() and second.result == first.result  # replayed as it was
        assert effects(engine, run_id, "a") == [first.id]

    def test_failure_is_recorded_and_not_replayed(
        self, engine: Any, run_id: str, pgbouncer_stores: Any
    ) -> None:
        """A failing body records FAILED; the same call runs again and then succeeds."""
        redis = pgbouncer_stores.redis()
        redis.set(tasks.failing(run_id, "b"), 1, ex=60)
        failed = tasks.charge.apply(args=(run_id, "b"))
        redis.delete(tasks.failing(run_id, "b"))
        assert failed.failed() and isinstance(failed.result, ValueError)
        record = backend_for(pgbouncer_stores).read(tasks.charge.name, f"{run_id}:b")
        assert record is not None and record.state == FAILED
        again = tasks.charge.apply(args=(run_id, "b"))
        assert again.successful() and again.result["ran_in"] == again.id
        record = backend_for(pgbouncer_stores).read(tasks.charge.name, f"{run_id}:b")
        assert record is not None and record.state == SUCCEEDED and record.attempt == 2
        assert effects(engine, run_id, "b") == [failed.id, again.id]

    def test_transactional_body_commits_with_its_record(self, engine: Any, run_id: str) -> None:
        """The body's write and the completion share one transaction (one server
        connection for its length); the duplicate is REPLAYED and writes nothing."""
        first = tasks.transfer.apply(args=(run_id, "t"))
        assert first.successful() and first.result["ran_in"] == first.id
        second = tasks.transfer.apply(args=(run_id, "t"))
        assert second.result == first.result
        assert effects(engine, run_id, "t") == [first.id]

    def test_concurrent_calls_share_the_server_pool(self, engine: Any, run_id: str) -> None:
        """Eight threads, each with its own client connection, run through PgBouncer's
        two server connections: every call runs once, no server connection beyond two."""
        results: list[Any] = []
        peak = [0]
        stop = threading.Event()

        def watch() -> None:
            while not stop.is_set():
                peak[0] = max(peak[0], backends(engine)[1])
                stop.wait(0.01)

        def work(index: int) -> None:
            for round_ in range(5):
                results.append(tasks.charge.apply(args=(run_id, f"c{index}-{round_}")))

        watcher = threading.Thread(target=watch)
        watcher.start()
        threads = [threading.Thread(target=work, args=(index,)) for index in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        stop.set()
        watcher.join(5)
        assert len(results) == 40 and all(result.successful() for result in results)
        assert 0 < peak[0] <= SERVER_POOL_SIZE


class TestLocksDirect:
    def test_singleton_one_runs_other_skipped_session_closed_after(
        self, engine: Any, run_id: str, short_idle: None
    ) -> None:
        """Two contenders: one runs, the other is SKIPPED naming it; after release the
        direct lock sessions go back to the baseline."""
        baseline = backends(engine)[0]
        holder: list[Any] = []
        thread = threading.Thread(target=lambda: holder.append(tasks.exclusive_report.apply(
            args=(run_id, "r"), kwargs={"hold_seconds": 1.5})))
        thread.start()
        wait_for(lambda: backends(engine)[0] > baseline, timeout_seconds=10,
                 message="the holder's lock session")
        skipped = tasks.exclusive_report.apply(args=(run_id, "r"))
        thread.join(20)
        assert skipped.result["outcome"] == "SKIPPED"
        assert skipped.result["details"]["holder_task_id"] == holder[0].id
        assert holder[0].successful() and holder[0].result["ran_in"] == holder[0].id
        assert effects(engine, run_id, "r") == [holder[0].id]
        wait_for(lambda: backends(engine)[0] == baseline, timeout_seconds=5,
                 message="lock sessions closed after release")
        after = tasks.exclusive_report.apply(args=(run_id, "r"))
        assert after.successful() and after.result["ran_in"] == after.id

    def test_direct_connections_follow_the_locks_held(
        self, engine: Any, run_id: str, short_idle: None
    ) -> None:
        """Four singletons at once hold four direct sessions; none is left afterwards."""
        baseline = backends(engine)[0]
        results: list[Any] = []
        threads = [threading.Thread(target=lambda key=key: results.append(
            tasks.exclusive_report.apply(args=(run_id, key), kwargs={"hold_seconds": 3.0})))
            for key in ("n0", "n1", "n2", "n3")]
        for thread in threads:
            thread.start()
        peak = wait_for(lambda: (lambda n: n if n == baseline + 4 else 0)(backends(engine)[0]),
                        timeout_seconds=10, message="four lock sessions")
        for thread in threads:
            thread.join(20)
        assert peak == baseline + 4
        assert all(result.successful() for result in results)
        # Closed 0.3 s after release by the pool's reaper; a loaded box delays it. (At most
        # the baseline: a session an earlier test left may close meanwhile.)
        wait_for(lambda: backends(engine)[0] <= baseline, timeout_seconds=15,
                 message="lock sessions closed after release")

    def test_a_lock_behind_the_pooler_is_refused_clearly(self, pgbouncer: PgBouncer,
                                                         pgbouncer_stores: Any) -> None:
        """Without LOCKS_DATABASE_URL a singleton would lock through PgBouncer: refused."""
        backend = AdvisoryLockBackend(pgbouncer.url, engine=pgbouncer_stores.engine,
                                      pool_mode="transaction")
        from resilience.locks.backends import Claimant

        with pytest.raises(ConfigurationError, match="LOCKS_DATABASE_URL"):
            backend.acquire("tests.pgbouncer.refused", Claimant(task_id="t", task_name="n"))

    def test_beat_leadership_and_handover(self, app: Any, engine: Any) -> None:
        """Two beats' leader locks: one leads on a direct session, the other stands by; when
        the leader steps down the other leads."""
        first, second = BeatLeadership(app), BeatLeadership(app)
        try:
            assert first.ensure() is True
            assert second.ensure() is False
            assert first.ensure() is True  # verified on its own session
            with engine.connect() as connection:
                name = connection.execute(text(
                    "SELECT application_name FROM pg_stat_activity WHERE pid = :pid"),
                    {"pid": first.session.backend_pid}).scalar_one()
            assert name == f"lock:{first.node}"  # a direct session, not a pooled one
            first.step_down()
            assert second.ensure() is True
            assert first.ensure() is False
        finally:
            first.step_down()
            second.step_down()
