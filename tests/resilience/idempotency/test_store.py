"""The PostgreSQL record store on a real database: claim, replay, fencing, release."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from resilience.idempotency.models import FAILED, IN_PROGRESS, SUCCEEDED
from resilience.idempotency.store import Holder, PostgresStore, autocommit_engine


@pytest.fixture(params=[True, False], ids=["prepared", "plain-sql"])
def store(stores: Any, request: pytest.FixtureRequest) -> PostgresStore:
    return PostgresStore(autocommit_engine(stores), prepared=request.param)


def claim(store: PostgresStore, key: str, *, owner: str, fingerprint: str = "f1",
          lease_seconds: float = 60) -> Any:
    return store.claim(task_name="tests.store", key=key, fingerprint=fingerprint, owner=owner,
                       task_id=f"task-{owner}", lease_seconds=lease_seconds, ttl_seconds=600)


def holder(key: str, attempt: int, owner: str) -> Holder:
    return Holder(task_name="tests.store", key=key, attempt=attempt, owner=owner)


class TestPostgresStore:
    def test_first_claim_wins_and_second_sees_live_claim(self, store: PostgresStore) -> None:
        """The first claim inserts the record; a second one finds a live claim, not its own."""
        key = uuid.uuid4().hex
        first = claim(store, key, owner="a")
        second = claim(store, key, owner="b")
        assert first.claimed and first.attempt == 1
        assert not second.claimed and second.live and second.task_id == "task-a"

    def test_completed_record_is_returned_with_its_result(self, store: PostgresStore) -> None:
        """After completion a claim returns the succeeded record and the stored result."""
        key = uuid.uuid4().hex
        first = claim(store, key, owner="a")
        assert store.complete(holder(key, first.attempt, "a"), '{"x": 1}', 600)
        again = claim(store, key, owner="b")
        assert not again.claimed
        assert again.state == SUCCEEDED and again.result == {"x": 1} and again.task_id == "task-a"

    def test_expired_lease_is_taken_over_and_stale_holder_is_fenced(
        self, store: PostgresStore
    ) -> None:
        """A dead holder's claim is reclaimed with attempt 2; the old holder cannot complete."""
        key = uuid.uuid4().hex
        first = claim(store, key, owner="a", lease_seconds=0)
        second = claim(store, key, owner="b")
        assert second.claimed and second.attempt == first.attempt + 1
        assert not store.complete(holder(key, first.attempt, "a"), '"stale"', 600)
        assert not store.release(holder(key, first.attempt, "a"))
        assert not store.fail(holder(key, first.attempt, "a"), "stale", 600)
        assert store.complete(holder(key, second.attempt, "b"), '"fresh"', 600)
        assert claim(store, key, owner="c").result == "fresh"

    def test_owner_token_fences_a_recreated_record(self, store: PostgresStore, engine: Any) -> None:
        """A record deleted and claimed again (attempt 1 again) still refuses the old holder."""
        from sqlalchemy import text

        key = uuid.uuid4().hex
        claim(store, key, owner="a")
        with engine.begin() as connection:
            connection.execute(text("DELETE FROM idempotency_records WHERE key = :k"), {"k": key})
        again = claim(store, key, owner="b")
        assert again.claimed and again.attempt == 1
        assert not store.complete(holder(key, 1, "a"), '"stale"', 600)

    def test_release_makes_the_key_claimable_at_once(self, store: PostgresStore) -> None:
        """A released claim (retryable failure) is claimed by the next delivery at once."""
        key = uuid.uuid4().hex
        first = claim(store, key, owner="a")
        assert store.release(holder(key, first.attempt, "a"))
        second = claim(store, key, owner="b")
        assert second.claimed and second.attempt == 2

    def test_failure_is_recorded_but_not_cached(self, store: PostgresStore) -> None:
        """A failed record keeps its error, and the same arguments may claim again."""
        key = uuid.uuid4().hex
        first = claim(store, key, owner="a")
        assert store.fail(holder(key, first.attempt, "a"), "ValueError: no", 600)
        other = claim(store, key, owner="b", fingerprint="other")
        assert not other.claimed and other.state == FAILED and other.error == "ValueError: no"
        retry = claim(store, key, owner="c")
        assert retry.claimed and retry.state == IN_PROGRESS

    def test_different_arguments_never_take_over(self, store: PostgresStore) -> None:
        """Same key with another fingerprint returns the record for the guard to refuse."""
        key = uuid.uuid4().hex
        first = claim(store, key, owner="a", lease_seconds=0)
        other = claim(store, key, owner="b", fingerprint="f2")
        assert not other.claimed and other.fingerprint == "f1"
        assert store.complete(holder(key, first.attempt, "a"), "1", 600)

    def test_survives_connections_closed_by_the_server(
        self, store: PostgresStore, engine: Any
    ) -> None:
        """No pre-ping: a connection PostgreSQL closed is replaced on the next statement."""
        from sqlalchemy import text

        claim(store, uuid.uuid4().hex, owner="a")
        with engine.begin() as connection:
            connection.execute(text(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            ))
        key = uuid.uuid4().hex
        assert claim(store, key, owner="b").claimed
        assert store.complete(holder(key, 1, "b"), '"ok"', 600)

    def test_threads_each_use_their_own_connection(self, store: PostgresStore) -> None:
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
                first = claim(store, key, owner=f"t{thread}")
                assert first.claimed
                done += store.complete(holder(key, first.attempt, f"t{thread}"), str(index), 600)
            assert done == 50
            return store._connection().driver.get_backend_pid()

        with ThreadPoolExecutor(4) as pool:
            pids = list(pool.map(work, range(4)))
        assert len(set(pids)) == 4

    def test_ping_is_one_statement_without_parameters(self, store: PostgresStore) -> None:
        """`EXECUTE name` takes no parentheses when the statement has no parameters."""
        store.ping()
        store.ping()  # the second time, prepared already
