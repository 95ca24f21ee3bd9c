"""The record backends' atomic steps, on every backend: claim, replay, fencing, release,
the transaction's completion, and the operator's reads. PostgreSQL is a real database."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from resilience.idempotency.backends import (
    FAILED,
    IN_PROGRESS,
    SUCCEEDED,
    Claim,
    IdempotencyBackend,
)
from resilience.idempotency.backends.memory import MemoryIdempotencyBackend
from resilience.idempotency.backends.postgres import (
    PostgresIdempotencyBackend,
    backend_for,
)
from tests.harness import wait_for

TASK = "tests.store"


@pytest.fixture(params=["postgres-prepared", "postgres-plain", "memory"])
def store(stores: Any, request: pytest.FixtureRequest) -> IdempotencyBackend:
    """Every backend; the PostgreSQL one with and without prepared statements."""
    if request.param == "memory":
        return MemoryIdempotencyBackend()
    return PostgresIdempotencyBackend(
        stores.statements(),
        prepared=request.param == "postgres-prepared",
        transaction_engine=stores.engine,
    )


@pytest.fixture(params=[True, False], ids=["prepared", "plain-sql"])
def postgres(stores: Any, request: pytest.FixtureRequest) -> PostgresIdempotencyBackend:
    return PostgresIdempotencyBackend(stores.statements(), prepared=request.param)


def claim(
    store: IdempotencyBackend,
    key: str,
    *,
    owner: str,
    fingerprint: str = "f1",
    lease_seconds: float = 60,
) -> Any:
    return store.claim(
        task_name=TASK,
        key=key,
        fingerprint=fingerprint,
        owner=owner,
        task_id=f"task-{owner}",
        lease_seconds=lease_seconds,
        ttl_seconds=600,
    )


def held(key: str, attempt: int, owner: str) -> Claim:
    return Claim(task_name=TASK, key=key, attempt=attempt, owner=owner)


class TestBackendSemantics:
    def test_first_claim_wins_and_second_sees_live_claim(self, store: IdempotencyBackend) -> None:
        """The first claim inserts the record; a second one finds a live claim, not its own."""
        key = uuid.uuid4().hex
        first = claim(store, key, owner="a")
        second = claim(store, key, owner="b")
        assert first.claimed and first.attempt == 1
        assert first.claim == held(key, 1, "a") and second.claim is None
        assert not second.claimed and second.live and second.task_id == "task-a"

    def test_completed_record_is_returned_with_its_result(self, store: IdempotencyBackend) -> None:
        """After completion a claim returns the succeeded record and the stored result."""
        key = uuid.uuid4().hex
        first = claim(store, key, owner="a")
        assert store.complete(held(key, first.attempt, "a"), '{"x": 1}', 600)
        again = claim(store, key, owner="b")
        assert not again.claimed
        assert again.state == SUCCEEDED and again.result == {"x": 1} and again.task_id == "task-a"

    def test_expired_lease_is_taken_over_and_stale_holder_is_fenced(
        self, store: IdempotencyBackend
    ) -> None:
        """A dead holder's claim is reclaimed with attempt 2; the old holder cannot complete."""
        key = uuid.uuid4().hex
        first = claim(store, key, owner="a", lease_seconds=0)
        second = claim(store, key, owner="b")
        assert second.claimed and second.attempt == first.attempt + 1
        assert not store.complete(held(key, first.attempt, "a"), '"stale"', 600)
        assert not store.release(held(key, first.attempt, "a"))
        assert not store.fail(held(key, first.attempt, "a"), "stale", 600)
        assert store.complete(held(key, second.attempt, "b"), '"fresh"', 600)
        assert claim(store, key, owner="c").result == "fresh"

    def test_release_makes_the_key_claimable_at_once(self, store: IdempotencyBackend) -> None:
        """A released claim (retryable failure) is claimed by the next delivery at once."""
        key = uuid.uuid4().hex
        first = claim(store, key, owner="a")
        assert store.release(held(key, first.attempt, "a"))
        second = claim(store, key, owner="b")
        assert second.claimed and second.attempt == 2

    def test_failure_is_recorded_but_not_cached(self, store: IdempotencyBackend) -> None:
        """A failed record keeps its error, and the same arguments may claim again."""
        key = uuid.uuid4().hex
        first = claim(store, key, owner="a")
        assert store.fail(held(key, first.attempt, "a"), "ValueError: no", 600)
        other = claim(store, key, owner="b", fingerprint="other")
        assert not other.claimed and other.state == FAILED and other.error == "ValueError: no"
        retry = claim(store, key, owner="c")
        assert retry.claimed and retry.state == IN_PROGRESS

    def test_different_arguments_never_take_over(self, store: IdempotencyBackend) -> None:
        """Same key with another fingerprint returns the record for the guard to refuse."""
        key = uuid.uuid4().hex
        first = claim(store, key, owner="a", lease_seconds=0)
        other = claim(store, key, owner="b", fingerprint="f2")
        assert not other.claimed and other.fingerprint == "f1"
        assert store.complete(held(key, first.attempt, "a"), "1", 600)

    def test_operator_reads_see_the_record(self, store: IdempotencyBackend) -> None:
        """read, recent, count_by_state and holders report what the steps wrote."""
        key, done = uuid.uuid4().hex, uuid.uuid4().hex
        first = claim(store, key, owner="a")
        finished = claim(store, done, owner="b")
        assert store.complete(held(done, finished.attempt, "b"), '{"x": 1}', 600)
        record = store.read(TASK, key)
        assert record is not None and record.state == IN_PROGRESS and record.lease_owner == "a"
        assert store.read(TASK, done).result == {"x": 1}
        assert store.read(TASK, "no-such-key") is None
        assert {r.key for r in store.recent(limit=1000, task_name=TASK)} >= {key, done}
        assert [
            r.key
            for r in store.recent(limit=1000, task_name=TASK, state=SUCCEEDED)
            if r.key in (key, done)
        ] == [done]
        counts = store.count_by_state()
        assert set(counts) == {IN_PROGRESS, SUCCEEDED, FAILED}
        assert counts[IN_PROGRESS] >= 1 and counts[SUCCEEDED] >= 1
        mine = [h for h in store.holders(limit=10_000) if h.key == f"{TASK}:{key}"]
        assert len(mine) == 1
        assert mine[0].kind == "idempotency" and mine[0].owner == "task-a"
        assert mine[0].token == first.attempt and mine[0].alive
        assert not [h for h in store.holders(limit=10_000) if h.key == f"{TASK}:{done}"]

    def test_released_claims_have_no_holder_and_lapsed_ones_are_not_alive(
        self, store: IdempotencyBackend
    ) -> None:
        """A released claim is held by nobody; a lease that ran out is reported not alive."""
        released, lapsed = uuid.uuid4().hex, uuid.uuid4().hex
        first = claim(store, released, owner="a")
        assert store.release(held(released, first.attempt, "a"))
        claim(store, lapsed, owner="b", lease_seconds=0)
        holders = {h.key: h for h in store.holders(limit=10_000)}
        assert f"{TASK}:{released}" not in holders
        assert holders[f"{TASK}:{lapsed}"].alive is False

    def test_purge_keeps_open_claims_without_force(self, store: IdempotencyBackend) -> None:
        """purge deletes a finished record, and an open claim only with force."""
        key = uuid.uuid4().hex
        claim(store, key, owner="a")
        assert not store.purge(TASK, key)
        assert store.purge(TASK, key, force=True)
        assert store.read(TASK, key) is None
        assert not store.purge(TASK, key)
        again = claim(store, key, owner="b")
        assert again.attempt == 1 and store.fail(held(key, 1, "b"), "boom", 600)
        assert store.purge(TASK, key)

    def test_transaction_completes_only_a_current_claim(self, store: IdempotencyBackend) -> None:
        """A transaction's completion applies at commit; a taken-over claim is refused."""
        key = uuid.uuid4().hex
        first = claim(store, key, owner="a")
        transaction = store.begin()
        try:
            assert transaction.complete(held(key, first.attempt, "a"), '"tx"', 600)
            transaction.commit()
        finally:
            transaction.close()
        assert store.read(TASK, key).state == SUCCEEDED
        stale = uuid.uuid4().hex
        old = claim(store, stale, owner="a", lease_seconds=0)
        claim(store, stale, owner="b")
        transaction = store.begin()
        try:
            assert not transaction.complete(held(stale, old.attempt, "a"), '"late"', 600)
        finally:
            transaction.close()
        assert store.read(TASK, stale).state == IN_PROGRESS

    def test_a_closed_transaction_records_nothing(self, store: IdempotencyBackend) -> None:
        """Closing without commit rolls the completion back: the claim stays open."""
        key = uuid.uuid4().hex
        first = claim(store, key, owner="a")
        transaction = store.begin()
        assert transaction.complete(held(key, first.attempt, "a"), '"rolled back"', 600)
        transaction.close()
        record = store.read(TASK, key)
        assert record.state == IN_PROGRESS and record.result is None


class TestPostgresBackend:
    def test_owner_token_fences_a_recreated_record(
        self, postgres: PostgresIdempotencyBackend, engine: Any
    ) -> None:
        """A record deleted and claimed again (attempt 1 again) still refuses the old holder."""
        from sqlalchemy import text

        key = uuid.uuid4().hex
        claim(postgres, key, owner="a")
        with engine.begin() as connection:
            connection.execute(text("DELETE FROM resilience_idempotency_records WHERE key = :k"),
                               {"k": key})
        again = claim(postgres, key, owner="b")
        assert again.claimed and again.attempt == 1
        assert not postgres.complete(held(key, 1, "a"), '"stale"', 600)

    def test_survives_connections_closed_by_the_server(
        self, postgres: PostgresIdempotencyBackend, engine: Any
    ) -> None:
        """No pre-ping: a connection PostgreSQL closed is replaced on the next statement."""
        from sqlalchemy import text

        claim(postgres, uuid.uuid4().hex, owner="a")
        with engine.begin() as connection:
            connection.execute(
                text(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND pid <> pg_backend_pid()"
                )
            )
        key = uuid.uuid4().hex
        assert claim(postgres, key, owner="b").claimed
        assert postgres.complete(held(key, 1, "b"), '"ok"', 600)

    def test_constant_parameters_written_in_keep_each_guards_values(
        self, postgres: PostgresIdempotencyBackend, stores: Any
    ) -> None:
        """The task name, lease and TTL a prepared claim and completion write into their
        EXECUTE once per connection: several guards on one connection (names with quotes,
        `%`, backslashes and non-ASCII) each keep their own values on every call."""
        from sqlalchemy import text

        names = ["tests.o'brien", "tests.100%_%s", "tests.back\\slash", "tests.ünï"]
        leases = {name: 30.0 + index * 100 for index, name in enumerate(names)}
        keys: dict[str, list[str]] = {name: [] for name in names}
        for _ in range(3):  # the first call prepares; the later ones use the written text
            for name in names:
                key = uuid.uuid4().hex
                found = postgres.claim(task_name=name, key=key, fingerprint="f", owner="o",
                                       task_id="t", lease_seconds=leases[name],
                                       ttl_seconds=1000 + leases[name])
                assert found.claimed
                assert postgres.complete(found.claim, '"ok"', 900 + leases[name])
                keys[name].append(key)
        with stores.engine().connect() as connection:
            for name in names:
                rows = connection.execute(
                    text("SELECT state, EXTRACT(EPOCH FROM (expires_at - now())) AS left "
                         "FROM resilience_idempotency_records "
                         "WHERE task_name = :n AND key = ANY(:k)"),
                    {"n": name, "k": keys[name]},
                ).all()
                assert len(rows) == 3
                for state, left in rows:
                    assert state == SUCCEEDED
                    # the claim's lease + TTL (the completion's is within: a HOT update)
                    assert 1000 + 2 * leases[name] - 30 < float(left) <= 1000 + 2 * leases[name]

    def test_threads_each_use_their_own_connection(
        self, postgres: PostgresIdempotencyBackend
    ) -> None:
        """Worker threads claim and complete at once without sharing a session."""
        import threading
        from concurrent.futures import ThreadPoolExecutor

        prefix = uuid.uuid4().hex
        together = threading.Barrier(4, timeout=30)

        def work(thread: int) -> int:
            together.wait()  # four distinct threads, all working at once
            done = 0
            for index in range(50):
                key = f"{prefix}:{thread}:{index}"
                first = claim(postgres, key, owner=f"t{thread}")
                assert first.claimed
                done += postgres.complete(held(key, first.attempt, f"t{thread}"), str(index), 600)
            assert done == 50
            return postgres.runner.connection().driver.get_backend_pid()

        with ThreadPoolExecutor(4) as pool:
            pids = list(pool.map(work, range(4)))
        assert len(set(pids)) == 4

    def test_ping_is_one_statement_without_parameters(
        self, postgres: PostgresIdempotencyBackend
    ) -> None:
        """`EXECUTE name` takes no parentheses when the statement has no parameters."""
        postgres.ping()
        postgres.ping()  # the second time, prepared already

    def test_without_a_transaction_engine_begin_is_a_configuration_error(
        self, postgres: PostgresIdempotencyBackend
    ) -> None:
        """A backend built without transaction_engine refuses transactional mode clearly."""
        from resilience.errors import ConfigurationError

        with pytest.raises(ConfigurationError, match="transaction_engine"):
            postgres.begin()

    def test_backend_for_builds_from_the_stores(self, stores: Any) -> None:
        """backend_for gives the autocommit engine and the pooled engine for transactions."""
        backend = backend_for(stores, synchronous_commit=False, prepared=False)
        transaction = backend.begin()
        try:
            assert transaction.session is not None
        finally:
            transaction.close()
        backend.ping()


def table_updates(engine: Any) -> tuple[int, int]:
    """(all, HOT) row updates PostgreSQL's statistics count for the records table so far."""
    from sqlalchemy import text

    with engine.connect() as connection:
        row = connection.execute(
            text("SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables "
                 "WHERE relname = 'resilience_idempotency_records'")
        ).one()
    return int(row[0]), int(row[1])


class _CountingConnection:
    """A thread connection's driver that counts the statements sent through it."""

    def __init__(self, driver: Any) -> None:
        self.driver, self.statements = driver, 0

    @property
    def closed(self) -> int:
        return self.driver.closed

    def cursor(self) -> Any:
        counting = self

        class Cursor:
            def __init__(self, cursor: Any) -> None:
                self.cursor = cursor

            def execute(self, *args: Any) -> Any:
                counting.statements += 1
                return self.cursor.execute(*args)

            def __getattr__(self, name: str) -> Any:
                return getattr(self.cursor, name)

        return Cursor(self.driver.cursor())

    def close(self) -> None:
        self.driver.close()


@contextlib.contextmanager
def _counting(backend: PostgresIdempotencyBackend) -> Iterator[_CountingConnection]:
    """Count the statements `backend` sends on this thread's connection meanwhile."""
    connection = backend.runner.connection()
    counting = connection.driver = _CountingConnection(connection.driver)
    connection.cursor = None
    try:
        yield counting
    finally:
        connection.driver, connection.cursor = counting.driver, None


class TestPostgresTable:
    def test_table_has_the_natural_key_and_room_for_hot_updates(self, engine: Any) -> None:
        """Primary key (task_name, key), no surrogate id, one index besides it (cleanup's,
        on expires_at), and a fillfactor below 100."""
        from sqlalchemy import text

        with engine.connect() as connection:
            key_columns = connection.execute(text(
                "SELECT array_agg(a.attname ORDER BY k.ord) FROM pg_index i "
                "CROSS JOIN unnest(i.indkey) WITH ORDINALITY AS k(attnum, ord) "
                "JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum "
                "WHERE i.indrelid = 'resilience_idempotency_records'::regclass AND i.indisprimary"
            )).scalar_one()
            indexes = connection.execute(text(
                "SELECT indexdef FROM pg_indexes "
                "WHERE tablename = 'resilience_idempotency_records' "
                "AND indexname <> 'pk_resilience_idempotency_records'"
            )).scalars().all()
            options = connection.execute(text(
                "SELECT reloptions FROM pg_class "
                "WHERE oid = 'resilience_idempotency_records'::regclass"
            )).scalar_one()
            columns = connection.execute(text(
                "SELECT column_name FROM information_schema.columns "
                "WHERE table_name = 'resilience_idempotency_records'"
            )).scalars().all()
        assert key_columns == ["task_name", "key"]
        assert "id" not in columns
        assert len(indexes) == 1 and "(expires_at)" in indexes[0] and "WHERE" not in indexes[0]
        assert any(option.startswith("fillfactor=") and int(option.split("=")[1]) < 100
                   for option in options or [])

    def test_completions_are_hot_updates(
        self, postgres: PostgresIdempotencyBackend, stores: Any, engine: Any
    ) -> None:
        """Claims completed within their lease (autocommit and in the body's transaction)
        are HOT updates: PostgreSQL's own statistics count every one of them as HOT."""
        from sqlalchemy import text

        transactional = PostgresIdempotencyBackend(
            stores.statements(), transaction_engine=stores.engine
        )
        prefix = uuid.uuid4().hex
        before_all, before_hot = table_updates(engine)
        for index in range(150):
            key = f"{prefix}:{index}"
            first = claim(postgres, key, owner="a")
            assert postgres.complete(held(key, first.attempt, "a"), str(index), 600)
        for index in range(50):
            key = f"{prefix}:tx:{index}"
            first = claim(postgres, key, owner="a")
            transaction = transactional.begin()
            try:
                assert transaction.complete(held(key, first.attempt, "a"), str(index), 600)
                transaction.commit()
            finally:
                transaction.close()
        # Backends report their counts when idle (at most once a second): ask both to now.
        with postgres.runner.connection().driver.cursor() as cursor:
            cursor.execute("SELECT pg_stat_force_next_flush()")
        with stores.engine().connect() as connection:
            connection.execute(text("SELECT pg_stat_force_next_flush()"))

        def counted() -> tuple[int, int] | None:
            every, hot = table_updates(engine)
            done = (every - before_all, hot - before_hot)
            return done if done[0] >= 200 else None

        updates, hot_updates = wait_for(counted, timeout_seconds=20,
                                        message="200 updates in pg_stat_user_tables")
        assert hot_updates >= 200 and hot_updates >= updates - 5, (updates, hot_updates)

    def test_a_fresh_claim_is_one_statement_and_a_duplicate_two(
        self, postgres: PostgresIdempotencyBackend
    ) -> None:
        """A fresh claim is one statement (its result says all a holder needs); a claim of
        a finished key or of a key running elsewhere claims nothing, then reads the record
        in the way: two statements each."""
        fresh, done, running = uuid.uuid4().hex, uuid.uuid4().hex, uuid.uuid4().hex
        first = claim(postgres, done, owner="a")
        assert postgres.complete(held(done, first.attempt, "a"), '"first"', 600)
        claim(postgres, running, owner="a")
        with _counting(postgres) as counting:
            claimed = claim(postgres, fresh, owner="b")
            fresh_statements = counting.statements
            replay = claim(postgres, done, owner="b")
            deferred = claim(postgres, running, owner="b")
        assert fresh_statements == 1 and counting.statements == 5
        assert claimed.claim == held(fresh, 1, "b") and claimed.state == IN_PROGRESS
        assert claimed.fingerprint == "f1" and claimed.task_id == "task-b"
        assert claimed.live and claimed.expires_in_seconds == 660
        assert replay.claim is None and replay.state == SUCCEEDED and replay.result == "first"
        assert deferred.claim is None and deferred.live and deferred.task_id == "task-a"

    def test_synchronous_commit_is_set_once_per_session_and_switched_back(
        self, stores: Any
    ) -> None:
        """Without a pooler an asynchronous backend turns `synchronous_commit` off on the
        thread's session once; a synchronous backend on the same connection turns it back
        to the server's default before its own write."""
        runner = stores.statements()
        asynchronous = PostgresIdempotencyBackend(runner, synchronous_commit=False)
        synchronous = PostgresIdempotencyBackend(runner, synchronous_commit=True)

        def session_setting() -> str:
            with asynchronous.runner.connection().driver.cursor() as cursor:
                cursor.execute("SHOW synchronous_commit")
                return str(cursor.fetchone()[0])

        prefix = uuid.uuid4().hex
        assert claim(asynchronous, f"{prefix}:1", owner="a").claimed
        assert session_setting() == "off"
        with _counting(asynchronous) as counting:
            assert claim(asynchronous, f"{prefix}:2", owner="a").claimed
        assert counting.statements == 1
        assert claim(synchronous, f"{prefix}:3", owner="a").claimed
        assert session_setting() == "on"
        assert claim(asynchronous, f"{prefix}:4", owner="a").claimed
        assert session_setting() == "off"

    def test_a_completion_keeps_the_record_at_least_its_ttl(
        self, postgres: PostgresIdempotencyBackend, engine: Any
    ) -> None:
        """The claim's expiry covers lease + TTL; a completion after the lease pushes it to
        TTL after the completion."""
        from sqlalchemy import text

        def expires_in(key: str) -> float:
            with engine.connect() as connection:
                return float(connection.execute(
                    text("SELECT extract(epoch FROM expires_at - now()) "
                         "FROM resilience_idempotency_records WHERE task_name = :t AND key = :k"),
                    {"t": TASK, "k": key},
                ).scalar_one())

        within, late = uuid.uuid4().hex, uuid.uuid4().hex
        first = claim(postgres, within, owner="a", lease_seconds=60)
        assert postgres.complete(held(within, first.attempt, "a"), "1", 600)
        assert 600 < expires_in(within) <= 660
        first = claim(postgres, late, owner="a", lease_seconds=60)
        with engine.begin() as connection:  # as if the body outlived the claim's expiry
            connection.execute(
                text("UPDATE resilience_idempotency_records "
                     "SET expires_at = now() + interval '5 seconds'"
                     " WHERE task_name = :t AND key = :k"), {"t": TASK, "k": late})
        assert postgres.complete(held(late, first.attempt, "a"), "1", 600)
        assert 590 < expires_in(late) <= 600


class TestMemoryBackend:
    def test_clock_is_injected(self) -> None:
        """Leases and TTLs follow the injected clock: tests expire them without waiting."""
        now = [1000.0]
        store = MemoryIdempotencyBackend(clock=lambda: now[0])
        first = claim(store, "k", owner="a", lease_seconds=30)
        assert not claim(store, "k", owner="b").claimed
        now[0] += 31
        second = claim(store, "k", owner="b")
        assert second.claimed and second.attempt == first.attempt + 1
        assert store.complete(held("k", second.attempt, "b"), "1", 600)
        now[0] += 601
        third = claim(store, "k", owner="c", fingerprint="other")
        assert third.claimed and third.attempt == 3  # the whole record expired
