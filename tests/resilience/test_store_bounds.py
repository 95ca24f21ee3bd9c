"""Bounded waits of the stores' clients (issue 25): a guard's PostgreSQL statement gives up
behind a lock at `statement_timeout_seconds` while a body's transaction is unbounded; the
guard Redis client meets an unanswering server in one timeout, then fails at once."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import text

from resilience.connections import wrap_store_errors
from resilience.errors import StoreUnavailable
from resilience.stores import Stores


@pytest.fixture()
def bounded(stores: Any) -> Iterator[Stores]:
    """Stores on the session's servers with a 1 s guard statement bound."""
    made = Stores(redis_url=stores.redis_url, database_url=stores.database_url,
                  statement_timeout_seconds=1)
    with made.engine().begin() as connection:
        connection.exec_driver_sql(
            "CREATE TABLE IF NOT EXISTS store_bounds_rows (id int PRIMARY KEY);"
            "INSERT INTO store_bounds_rows VALUES (1) ON CONFLICT DO NOTHING")
    yield made
    made.engine().dispose()


def _show(connection: Any, setting: str) -> str:
    return str(connection.execute(text(f"SHOW {setting}")).scalar())


class TestGuardEngine:
    def test_a_guard_statement_behind_a_held_row_lock_gives_up_at_the_bound(
        self, bounded: Stores
    ) -> None:
        """A transaction holds a row (a stuck or partitioned holder): a guard statement that
        needs it ends as StoreUnavailable after ~1 s instead of waiting for the holder."""
        with bounded.engine().connect() as holder:
            holder.execute(text("SELECT id FROM store_bounds_rows WHERE id = 1 FOR UPDATE"))
            started = time.monotonic()
            with pytest.raises(StoreUnavailable) as raised, \
                    wrap_store_errors("guard write"), bounded.guard_engine().begin() as guard:
                guard.execute(text("UPDATE store_bounds_rows SET id = 1 WHERE id = 1"))
            waited = time.monotonic() - started
            holder.rollback()
        assert 0.9 <= waited < 3, waited
        assert "57014" in str(raised.value) or "55P03" in str(raised.value)

    def test_the_bound_is_per_transaction_and_never_reaches_a_body(
        self, bounded: Stores
    ) -> None:
        """Guard transactions run with statement and lock timeouts; the same pooled
        connection, taken by a body through `engine()` afterwards, has neither (SET LOCAL)."""
        with bounded.guard_engine().connect() as guard:
            pid = guard.execute(text("SELECT pg_backend_pid()")).scalar()
            assert (_show(guard, "statement_timeout"), _show(guard, "lock_timeout")) == (
                "1s", "1s")
            guard.commit()
            assert _show(guard, "statement_timeout") == "1s"  # the next transaction too
        with bounded.engine().connect() as body:
            assert body.execute(text("SELECT pg_backend_pid()")).scalar() == pid
            assert (_show(body, "statement_timeout"), _show(body, "lock_timeout")) == (
                "0", "0")
            body.execute(text("SELECT pg_sleep(1.2)"))  # longer than a guard may wait

    def test_direct_sessions_carry_server_side_keepalives(self, bounded: Stores) -> None:
        """The server ends a vanished client's session (and frees its row locks) in
        seconds: keepalives and a TCP user timeout on PostgreSQL's end of each session."""
        with bounded.engine().connect() as connection:
            assert _show(connection, "tcp_keepalives_idle") == "5"
            assert _show(connection, "tcp_user_timeout") == "10000"

    def test_behind_a_transaction_pooler_no_session_setting_is_sent(self, stores: Any) -> None:
        """Under PgBouncer's transaction pooling a session SET would reach other clients:
        only the guard's SET LOCAL is sent."""
        pooled = Stores(redis_url=stores.redis_url, database_url=stores.database_url,
                        pool_mode="transaction", statement_timeout_seconds=1)
        try:
            with pooled.engine().connect() as connection:
                assert _show(connection, "tcp_user_timeout") == "0"
            with pooled.guard_engine().connect() as guard:
                assert _show(guard, "statement_timeout") == "1s"
        finally:
            pooled.engine().dispose()


@pytest.fixture()
def silent_server() -> Iterator[int]:
    """A TCP port that accepts connections and never answers (a partitioned Redis)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    accepted: list[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                accepted.append(server.accept()[0])
            except OSError:
                return

    threading.Thread(target=accept, daemon=True).start()
    yield server.getsockname()[1]
    server.close()
    for connection in accepted:
        connection.close()


class TestRedisHold:
    def test_after_one_timeout_calls_fail_at_once_until_the_hold_ends(
        self, silent_server: int
    ) -> None:
        """The first call waits out the 0.5 s timeout; the next ones (a script, a
        pipeline) fail at once as StoreUnavailable naming the hold; after 0.5 s a call
        tries the server again."""
        stores = Stores(redis_url=f"redis://127.0.0.1:{silent_server}/0",
                        socket_timeout_seconds=0.5)
        client = stores.redis()
        waits = []
        for call in (lambda: client.get("k"), lambda: client.eval("return 1", 0),
                     lambda: client.pipeline().get("k").execute()):
            started = time.monotonic()
            with pytest.raises(StoreUnavailable) as raised, wrap_store_errors("probe"):
                call()
            waits.append(time.monotonic() - started)
        assert 0.4 <= waits[0] < 2 and max(waits[1:]) < 0.1, waits
        assert "fail at once" in str(raised.value)
        time.sleep(0.6)
        started = time.monotonic()
        with pytest.raises(StoreUnavailable), wrap_store_errors("probe"):
            client.get("k")
        assert time.monotonic() - started >= 0.4

    def test_an_answering_server_is_served_as_before(self, stores: Any) -> None:
        client = Stores(redis_url=stores.redis_url).redis()
        assert client.ping() is True
        assert client.set("store-bounds", "1") and client.get("store-bounds") == "1"
        client.delete("store-bounds")
