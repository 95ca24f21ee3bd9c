"""Native store errors become StoreUnavailable (try later) or StoreRejected (will fail again).

On real Redis and PostgreSQL: a WRONGTYPE reply and a value too long for its column are
refusals, not "store down"; a closed port is; and no message quotes a password.
"""

from __future__ import annotations

import secrets
import uuid
from typing import Any

import psycopg2
import pytest
import redis
import sqlalchemy as sa

from jobs.embedded import free_port
from resilience.connections import translate_store_error, wrap_store_errors
from resilience.connections.postgres import connect
from resilience.errors import StorageError, StoreRejected, StoreUnavailable
from resilience.idempotency.backends.postgres import PostgresIdempotencyBackend
from resilience.locks.backends.postgres import AdvisorySession
from resilience.ratelimit import RedisBackend, parse
from resilience.ratelimit.algorithms import GCRA, Params
from resilience.retry.budget import RedisBudgetBackend, RetryBudget, budget_key
from tests.support import dead_redis

PASSWORD = "pw-" + secrets.token_hex(8)


def assert_no_password(error: BaseException) -> None:
    """Neither the message nor the structured fields quote the password."""
    assert PASSWORD not in str(error)
    assert PASSWORD not in repr(getattr(error, "fields", {}))


class TestRejected:
    def test_wrongtype_reply(self, redis_client: Any) -> None:
        """A command on a key of another type is refused: StoreRejected, native cause kept."""
        redis_client.set("tests:store-errors:string", "x")
        with (
            pytest.raises(StoreRejected, match="WRONGTYPE") as raised,
            wrap_store_errors("pushing", key="tests:store-errors:string"),
        ):
            redis_client.lpush("tests:store-errors:string", "y")
        assert isinstance(raised.value.__cause__, redis.ResponseError)
        assert raised.value.key == "tests:store-errors:string"

    def test_wrongtype_inside_a_script(self, redis_client: Any) -> None:
        """The retry budget's script meets a string where its hash should be: StoreRejected
        (redis-py reports it as a script error, the WRONGTYPE inside)."""
        redis_client.set(budget_key("tests-wrongtype"), "not a hash")
        backend = RedisBudgetBackend(lambda: redis_client)
        with pytest.raises(StoreRejected, match="tests-wrongtype"):
            backend.decide("tests-wrongtype", "request", RetryBudget())

    def test_value_too_long_for_its_column(self, engine: Any) -> None:
        """A value longer than a VARCHAR column: StoreRejected with SQLSTATE 22001."""
        with engine.connect() as connection:
            connection.execute(sa.text("CREATE TEMP TABLE store_errors_short (v varchar(4))"))
            with (
                pytest.raises(StoreRejected, match="22001") as raised,
                wrap_store_errors("inserting"),
            ):
                connection.execute(sa.text("INSERT INTO store_errors_short VALUES ('too long')"))
        assert "value too long" in str(raised.value)
        assert "[SQL:" not in str(raised.value)  # SQLAlchemy's statement dump is left out

    def test_value_too_long_through_psycopg2(self, stores: Any) -> None:
        """The same refusal on a bare psycopg2 connection (the idempotency store's path)."""
        connection = connect(stores.database_url, connect_timeout_seconds=5)
        try:
            with (
                pytest.raises(StoreRejected), wrap_store_errors("inserting"),
                connection.cursor() as cursor,
            ):
                cursor.execute("CREATE TEMP TABLE store_errors_short (v varchar(4))")
                cursor.execute("INSERT INTO store_errors_short VALUES ('too long')")
        finally:
            connection.close()

    def test_index_row_too_large_is_rejected_not_unavailable(self, stores: Any) -> None:
        """A key too large for the unique index (psycopg2 files SQLSTATE 54000 under
        OperationalError) is refused: retrying the claim can never succeed."""
        store = PostgresIdempotencyBackend(stores.statements())
        key = secrets.token_hex(6000)  # incompressible: 12,000 bytes in one index row
        with pytest.raises(StoreRejected, match="54000"):
            store.claim(task_name="tests.store-errors", key=key, fingerprint="f",
                        owner=uuid.uuid4().hex, task_id="t", lease_seconds=60, ttl_seconds=60)


class TestUnavailable:
    def test_redis_connection_refused(self) -> None:
        """Nothing listens on the port: StoreUnavailable naming the key."""
        client = dead_redis()
        with pytest.raises(StoreUnavailable, match="tests-key"):
            RedisBackend(client).run(GCRA, "tests-key", Params.of_rate(parse("1/second")))

    def test_postgresql_connection_refused(self) -> None:
        engine = sa.create_engine(f"postgresql+psycopg2://postgres@127.0.0.1:{free_port()}/x")
        try:
            with (
                pytest.raises(StoreUnavailable), wrap_store_errors("reading"),
                engine.connect(),
            ):
                pass
        finally:
            engine.dispose()

    @pytest.mark.parametrize(("sqlstate", "expected"), [
        ("40001", StoreUnavailable),  # serialization failure: the next attempt may pass
        ("40P01", StoreUnavailable),  # deadlock detected
        ("57014", StoreUnavailable),  # statement timeout
        ("23505", StoreRejected),  # unique violation
        ("22P02", StoreRejected),  # invalid text representation
        ("54000", StoreRejected),  # program limit exceeded (psycopg2: OperationalError)
    ])
    def test_sqlstate_decides(self, engine: Any, sqlstate: str,
                              expected: type[StorageError]) -> None:
        """The server's SQLSTATE class, not only psycopg2's class, decides retry or refuse."""
        with (
            engine.connect() as connection, pytest.raises(expected),
            wrap_store_errors("raising"),
        ):
            connection.execute(sa.text(
                f"DO $$ BEGIN RAISE EXCEPTION 'raised' USING ERRCODE = '{sqlstate}'; END $$"))


class TestNoPasswordInMessages:
    def test_redis_url_with_password(self) -> None:
        client = redis.Redis.from_url(f"redis://:{PASSWORD}@127.0.0.1:{free_port()}/0",
                                      socket_connect_timeout=0.5)
        with pytest.raises(StoreUnavailable) as raised:
            RedisBackend(client).run(GCRA, "k", Params.of_rate(parse("1/second")))
        assert_no_password(raised.value)

    def test_sqlalchemy_url_with_password(self) -> None:
        url = f"postgresql+psycopg2://app:{PASSWORD}@127.0.0.1:{free_port()}/jobs"
        engine = sa.create_engine(url)
        try:
            with (
                pytest.raises(StoreUnavailable) as raised, wrap_store_errors("reading"),
                engine.connect(),
            ):
                pass
        finally:
            engine.dispose()
        assert_no_password(raised.value)

    def test_advisory_session_url_with_password(self) -> None:
        """The singleton's own psycopg2 session: refused connection, no password."""
        url = f"postgresql://app:{PASSWORD}@127.0.0.1:{free_port()}/jobs"
        with pytest.raises(StoreUnavailable) as raised:
            AdvisorySession(url, connect_timeout_seconds=1)
        assert_no_password(raised.value)

    @pytest.mark.parametrize("native", [
        psycopg2.ProgrammingError(f"invalid dsn: postgresql://app:{PASSWORD}@db:5432/jobs"),
        psycopg2.OperationalError(f"could not connect: host=db password={PASSWORD} user=app"),
        redis.ConnectionError(f"Error connecting to redis://:{PASSWORD}@cache:6379/0"),
    ])
    def test_native_message_quoting_a_url_is_redacted(self, native: Exception) -> None:
        """A driver message that quotes a DSN or URL is redacted in the message and `cause`."""
        error = translate_store_error(native, "connecting")
        assert_no_password(error)
        assert "***" in str(error)


class TestWrapping:
    def test_other_errors_pass_through(self) -> None:
        """A bug inside the block is not a store error: it leaves unchanged."""
        with pytest.raises(KeyError), wrap_store_errors("reading"):
            raise KeyError("x")

    def test_storage_error_is_not_wrapped_twice(self) -> None:
        inner = StoreRejected("inner")
        with pytest.raises(StoreRejected) as raised, wrap_store_errors("outer"):
            raise inner
        assert raised.value is inner

    def test_decorator(self, redis_client: Any) -> None:
        """`wrap_store_errors` decorates a function the same way."""

        @wrap_store_errors("pushing")
        def push() -> None:
            redis_client.set("tests:store-errors:decorated", "x")
            redis_client.lpush("tests:store-errors:decorated", "y")

        with pytest.raises(StoreRejected, match="pushing"):
            push()
        with pytest.raises(StoreRejected):
            push()  # the same wrapper works on every call

    @pytest.mark.parametrize(("native", "expected"), [
        (redis.exceptions.ReadOnlyError("You can't write against a read only replica."),
         StoreUnavailable),
        (redis.exceptions.BusyLoadingError("Redis is loading the dataset in memory"),
         StoreUnavailable),
        (redis.exceptions.TryAgainError("Multiple keys request during rehashing of slot"),
         StoreUnavailable),
        (redis.exceptions.ClusterDownError("The cluster is down"), StoreUnavailable),
        (redis.exceptions.ResponseError("BUSY Redis is busy running a script."),
         StoreUnavailable),
        (redis.exceptions.ResponseError(
            "Error running script (call to f_1): @user_script:9: READONLY You can't write"),
         StoreUnavailable),
        (redis.exceptions.ResponseError(
            "Error running script (call to f_1): @user_script:9: WRONGTYPE Operation"),
         StoreRejected),
        (redis.exceptions.ResponseError("ERR value is not an integer or out of range"),
         StoreRejected),
        (redis.exceptions.DataError("Invalid input of type: 'dict'"), StoreRejected),
        (ConnectionResetError(104, "Connection reset by peer"), StoreUnavailable),
        (sa.exc.TimeoutError("QueuePool limit of size 5 overflow 5 reached"),
         StoreUnavailable),
        (sa.exc.DisconnectionError("connection invalidated"), StoreUnavailable),
    ])
    def test_classification(self, native: BaseException, expected: type) -> None:
        """Redis failover states and pool timeouts are unavailable; error replies refused."""
        assert type(translate_store_error(native, "op")) is expected
