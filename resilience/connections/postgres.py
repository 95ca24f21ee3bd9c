"""PostgreSQL connections: the client and server TCP bounds, direct sessions, and the
statement runner that the guards' single-statement decisions go through.

`StatementRunner` keeps one connection per thread, detached from any pool: a worker thread
runs one call at a time, and a pool checkout and checkin per statement cost more CPU than
the statement's round trip. It prepares each statement once per connection
(`resilience.prepared`), connects again when PostgreSQL closed the connection (a restart,
an idle timeout: no pre-ping, so the first statement after it fails and one more try uses a
fresh connection), and forgets prepared statements a pooler lost. Behind a transaction
pooler (PgBouncer) no session state holds from one statement to the next: callers pass
`prepared=False` there (`Stores.transaction_pooled`). A forked child starts without the
parent's connections (`ProcessLocal`).

`connect` opens a direct session (advisory locks, the outbox relay's `LISTEN`): autocommit,
client keepalives, and with `server_tcp` the server's end bounded too.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from typing import Any

import psycopg2
import psycopg2.errors
import psycopg2.extensions
import sqlalchemy
from sqlalchemy import event, make_url
from sqlalchemy.engine import Engine

from resilience.connections import ProcessLocal, translate_store_error, wrap_store_errors
from resilience.prepared import PreparedStatement

#: TCP user timeout of every connection, both ends (ms): unacknowledged data, or keepalive
#: probes unanswered, for this long end the connection.
TCP_USER_TIMEOUT_MS = 10_000
#: Client-side TCP settings of every PostgreSQL connection the library opens (libpq
#: parameters, nothing sent to the server, so poolers accept them): a partition surfaces
#: as a connection error within ~10 s, and a guard applies its store-down policy, instead
#: of a call that hangs until the task's hard time limit.
PG_CLIENT_TCP: dict[str, int] = {
    "keepalives": 1, "keepalives_idle": 5, "keepalives_interval": 2, "keepalives_count": 3,
    "tcp_user_timeout": TCP_USER_TIMEOUT_MS,
}
#: Server-side TCP settings of each direct (unpooled) session, set in its first statement
#: rather than as startup options, which poolers refuse: without them the server keeps a
#: partitioned client's backend, its open transaction, its row and advisory locks for the
#: kernel's keepalive time (two hours). With them PostgreSQL ends such a session within
#: ~15 s. `set_config(..., false)` lasts the session (outside a transaction, or committed).
PG_SERVER_TCP = (
    "SELECT set_config('tcp_keepalives_idle', '5', false), "
    "set_config('tcp_keepalives_interval', '2', false), "
    "set_config('tcp_keepalives_count', '3', false), "
    f"set_config('tcp_user_timeout', '{TCP_USER_TIMEOUT_MS}', false)")

#: Execution option that marks a connection of `Stores.guard_engine()`: every transaction
#: it begins gets `SET LOCAL statement_timeout` and `lock_timeout` (milliseconds).
GUARD_BOUND_OPTION = "resilience_guard_bound_ms"


def guard_bounds_sql(bound_ms: int) -> str:
    """The statements that bound the rest of one transaction: `statement_timeout` and
    `lock_timeout` at `bound_ms` milliseconds (`SET LOCAL`: gone at its end, so a pooler
    accepts it). Also a prefix for one autocommit query string, whose statements share one
    implicit transaction."""
    return (f"SET LOCAL statement_timeout = {int(bound_ms)}; "
            f"SET LOCAL lock_timeout = {int(bound_ms)}; ")


#: Prepended to one autocommit statement whose loss in a crash is harmless: its implicit
#: transaction commits without waiting for its WAL flush (`SET LOCAL`: that statement only).
ASYNCHRONOUS_COMMIT = "SET LOCAL synchronous_commit = off; "


def asynchronous_commit(connection: HeldConnection) -> tuple[str, None]:
    """A `Prefix` for `StatementRunner.run`: the statement commits asynchronously (no WAL
    flush wait); for writes a crash may lose without harm."""
    return ASYNCHRONOUS_COMMIT, None


#: Prepended to a statement that must wait for its WAL flush on a held connection whose
#: session another backend set to `synchronous_commit = off` (`HeldConnection.settings`).
SYNCHRONOUS_COMMIT = "SET LOCAL synchronous_commit = on; "


def synchronous_commit(connection: HeldConnection) -> tuple[str, None]:
    """A `Prefix` for `StatementRunner.run`: the statement commits synchronously even when
    the thread's shared connection runs with `synchronous_commit = off` for the idempotency
    guard (its default); nothing is prepended otherwise."""
    if connection.settings.get("synchronous_commit") is False:
        return SYNCHRONOUS_COMMIT, None
    return "", None


def connect_arguments(database_url: str) -> dict[str, Any]:
    """psycopg2 keyword arguments of a SQLAlchemy/libpq URL."""
    url = make_url(database_url)
    arguments: dict[str, Any] = {
        "host": url.host or "127.0.0.1", "port": url.port or 5432,
        "user": url.username or "postgres", "dbname": url.database or "postgres"}
    if url.password:
        arguments["password"] = url.password
    arguments.update({k: v for k, v in url.query.items() if isinstance(v, str)})
    return arguments


def connect(database_url: str, *, connect_timeout_seconds: float,
            application_name: str | None = None, server_tcp: bool = False) -> Any:
    """A new autocommit psycopg2 connection with the client TCP bounds (`PG_CLIENT_TCP`;
    the URL may override them); with `server_tcp` (a direct session, no pooler) the server's
    end is bounded in the first round trip (`PG_SERVER_TCP`).

    Raises:
        StoreUnavailable: PostgreSQL cannot be reached.
    """
    extra = {} if application_name is None else {"application_name": application_name[:63]}
    with wrap_store_errors("PostgreSQL connect"):
        connection = psycopg2.connect(
            **{**PG_CLIENT_TCP, **connect_arguments(database_url)}, **extra,
            connect_timeout=max(1, int(connect_timeout_seconds)))
        connection.autocommit = True
        if server_tcp:
            with connection.cursor() as cursor:
                cursor.execute(PG_SERVER_TCP)
    return connection


def engine(database_url: str, *, connect_timeout_seconds: float, server_tcp: bool) -> Engine:
    """A SQLAlchemy engine with the client TCP bounds: five connections (five more on
    demand), pinged at checkout; with `server_tcp` (a direct URL, no pooler in between)
    `PG_SERVER_TCP` once per new connection. Each transaction begun on a connection carrying
    `GUARD_BOUND_OPTION` first runs its `SET LOCAL` bounds (`Stores.guard_engine`)."""
    created = sqlalchemy.create_engine(
        database_url,
        connect_args={"connect_timeout": int(max(1, connect_timeout_seconds)), **PG_CLIENT_TCP},
        pool_pre_ping=True, pool_size=5, max_overflow=5)
    if server_tcp:
        @event.listens_for(created, "connect")
        def _server_keepalives(dbapi_connection: Any, _record: Any) -> None:
            with dbapi_connection.cursor() as cursor:
                cursor.execute(PG_SERVER_TCP)
            dbapi_connection.commit()  # set_config(..., false) survives only a commit

    @event.listens_for(created, "begin")
    def _bound_guard_transaction(connection: Any) -> None:
        bound_ms = connection.get_execution_options().get(GUARD_BOUND_OPTION)
        driver = connection.connection.driver_connection
        if bound_ms is None or getattr(driver, "autocommit", False):
            return  # SET LOCAL would outlive nothing in autocommit
        # On the driver's cursor: the SQLAlchemy transaction is not open yet inside this
        # event; psycopg2 opens the database transaction with this statement.
        with driver.cursor() as cursor:
            cursor.execute(guard_bounds_sql(bound_ms))

    return created


class Row(dict[str, Any]):
    """A result row by column name, with attribute access."""

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


class Lead:
    """A statement waiting on a held connection to be sent at the head of the next
    statement that takes leads (`StatementRunner.run(..., lead=True)`), in its query string:
    one round trip for both, in one implicit transaction. `settled` is called once that
    statement succeeded; a lead whose statement failed is dropped with `sent` set."""

    __slots__ = ("sent", "settled", "text")

    def __init__(self, text: str, settled: Callable[[], None]) -> None:
        #: SQL with its values written in (`%` doubled: it is sent through the driver's
        #: parameter substitution), ending with `; `.
        self.text = text
        self.settled = settled
        self.sent = False


class HeldConnection:
    """A thread's own connection and what its session holds."""

    def __init__(self, driver: Any) -> None:
        self.driver = driver
        #: One cursor for every statement (a thread runs one at a time): a cursor per
        #: statement cost more than the rest of a backend's Python around it.
        self.cursor: Any = None
        self.prepared: set[str] = set()
        #: Session settings callers keep track of (`synchronous_commit`, ...).
        self.settings: dict[str, Any] = {}
        #: `EXECUTE` texts with constant parameters written in (`StatementRunner.run`).
        self.rendered: dict[tuple[Any, ...], tuple[str, tuple[str, ...]]] = {}
        #: Statements to send with the next statement that takes them (`Lead`).
        self.leads: list[Lead] = []
        #: Session advisory lock ids held on this session for this thread's callers.
        self.locks: set[int] = set()

    def learn_prepared(self) -> bool:
        """Take the session's prepared statements from the server (ours can be wrong: a
        PREPARE outlives the failure of its query string); False when that failed too."""
        try:
            with self.driver.cursor() as cursor:
                cursor.execute("SELECT name FROM pg_prepared_statements")
                self.prepared = {name for (name,) in cursor.fetchall()}
        except psycopg2.Error:
            return False
        return True

    def render(self, statement: PreparedStatement, parameters: dict[str, Any]) -> str:
        """`statement` as query text with its values written in, for a `Lead`: its
        `EXECUTE` when prepared on this session, else its SQL (a lead that may never be
        sent prepares nothing: the session's prepared set would be wrong)."""
        cursor = self.cursor
        if cursor is None:
            cursor = self.cursor = self.driver.cursor()
        if statement.name in self.prepared:
            rendered = cursor.mogrify(statement.execute, statement.values(parameters))
        else:
            rendered = cursor.mogrify(statement.sql, parameters)
        encoding = psycopg2.extensions.encodings[self.driver.encoding]
        return rendered.decode(encoding).replace("%", "%%") + "; "

    def prepare(self, statement: PreparedStatement) -> None:
        """Prepare `statement` on this session unless it is (one round trip, once per
        session), so a `Lead` of it is sent as its EXECUTE (`render`).

        Raises:
            StoreUnavailable, StorageError: the session is gone or the PREPARE failed.
        """
        if statement.name in self.prepared:
            return
        try:
            with self.driver.cursor() as cursor:
                cursor.execute(statement.prepare)
        except psycopg2.errors.DuplicatePreparedStatement:
            pass  # prepared by a query string that failed after its PREPARE
        except psycopg2.Error as exc:
            raise translate_store_error(exc, "held PostgreSQL session") from exc
        self.prepared.add(statement.name)

    def execute_here(self, statement: PreparedStatement | str,
                     parameters: dict[str, Any] | Any = ()) -> Any:
        """Run one statement on this very session, never on a replacement, on a cursor of
        its own (another thread may use the shared one: a watcher's probe); its rows, or
        None. A `PreparedStatement` (named `parameters`) is prepared once on the session.

        Raises:
            StoreUnavailable, StorageError: the session is gone or the statement failed.
        """
        try:
            with self.driver.cursor() as cursor:
                if isinstance(statement, str):
                    cursor.execute(statement, parameters)
                elif statement.name in self.prepared:
                    cursor.execute(statement.execute, statement.values(parameters))
                else:
                    try:
                        cursor.execute(statement.prepare_and_execute,
                                       statement.values(parameters))
                    except psycopg2.errors.DuplicatePreparedStatement:
                        # Prepared by a first call that failed after its PREPARE (`run`).
                        cursor.execute(statement.execute, statement.values(parameters))
                    self.prepared.add(statement.name)
                return cursor.fetchall() if cursor.description is not None else None
        except psycopg2.Error as exc:
            raise translate_store_error(exc, "held PostgreSQL session") from exc

    def close(self) -> None:
        with contextlib.suppress(Exception):  # already broken; it is being replaced
            self.driver.close()


#: A statement's session prefix: the text to send before it on `connection`, and what to
#: record once it succeeded (None: nothing).
Prefix = Callable[[HeldConnection], tuple[str, Callable[[], None] | None]]


class StatementRunner:
    """Runs single statements in autocommit on a connection held per thread.

    Args:
        database_url: the PostgreSQL URL (or a pooler's).
        connect_timeout_seconds: bound on connecting.
    """

    def __init__(self, database_url: str, *, connect_timeout_seconds: float = 5.0) -> None:
        self.database_url = database_url
        self.connect_timeout_seconds = connect_timeout_seconds
        self._held = ProcessLocal()

    def connection(self) -> HeldConnection:
        """This thread's connection, opened on first use and after one broke.

        Raises:
            StoreUnavailable: PostgreSQL cannot be reached.
        """
        held: HeldConnection | None = getattr(self._held.local, "connection", None)
        if held is None or held.driver.closed:
            held = HeldConnection(connect(
                self.database_url, connect_timeout_seconds=self.connect_timeout_seconds))
            self._held.local.connection = held
        return held

    def discard(self, held: HeldConnection) -> None:
        """Forget `held` if it is this thread's connection (the next statement opens
        another) and close it in the background: a statement stuck in a partition may be
        using it until the TCP user timeout."""
        if getattr(self._held.local, "connection", None) is held:
            self._held.local.connection = None
        threading.Thread(target=held.close, name="held-connection-close", daemon=True).start()

    def close(self) -> None:
        """Close this thread's connection (a test database about to be dropped)."""
        held: HeldConnection | None = getattr(self._held.local, "connection", None)
        if held is not None:
            held.close()
            self._held.local.connection = None

    def run(self, statement: PreparedStatement, parameters: dict[str, Any], action: str, *,
            prepared: bool = True, prefix: Prefix | None = None, named: bool = True,
            fixed: tuple[str, ...] = (), lead: bool = False) -> Any:
        """Run one statement: its row count when it returns no rows, else its rows (`Row`s
        by column name; plain tuples when not `named`, which spares a dict per row).

        Args:
            statement: the SQL, prepared once per connection when `prepared`.
            parameters: its named parameters.
            action: what errors name ("idempotency store: claim").
            prepared: server-side prepared statements (off behind a transaction pooler).
            prefix: session statements sent in the same query string (see `Prefix`).
            named: rows as `Row`s, else tuples.
            fixed: parameters the same on every call of one caller (a guard's task name,
                lease, TTL), written into a prepared `EXECUTE` once per connection instead
                of adapted on every call.
            lead: send the connection's waiting `Lead`s first, in the same query string
                (a singleton's release rides on the idempotency completion, a published
                continuation's mark on the next workflow statement); for statements a lead
                may share a transaction with: an error in either drops both.

        Raises:
            StoreUnavailable, StoreRejected, StorageError, SchemaMissing.
        """
        for attempt in (1, 2):
            connection = self.connection()  # `connect` translates its own errors
            try:
                # A prefix may talk to the server (prepare what it sends): its errors are
                # handled as the statement's.
                text, settle = prefix(connection) if prefix is not None else ("", None)
                leads = connection.leads if lead and connection.leads else None
                if leads is not None:
                    connection.leads = []
                    for waiting in leads:
                        waiting.sent = True
                    text = "".join(waiting.text for waiting in leads) + text
                cursor = connection.cursor
                if cursor is None:
                    cursor = connection.cursor = connection.driver.cursor()
                # One query string per call: the result is the last statement's.
                if not prepared:
                    cursor.execute(text + statement.sql, parameters)
                elif statement.name in connection.prepared:
                    if fixed:
                        query, names = self._rendered(connection, statement, parameters, fixed)
                        cursor.execute(text + query, [parameters[name] for name in names])
                    else:
                        cursor.execute(text + statement.execute, statement.values(parameters))
                else:
                    cursor.execute(text + statement.prepare_and_execute,
                                   statement.values(parameters))
                    connection.prepared.add(statement.name)
                if settle is not None:
                    settle()
                if leads is not None:
                    for waiting in leads:
                        waiting.settled()
                description = cursor.description
                if description is None:
                    return cursor.rowcount
                if not named:
                    return cursor.fetchall()
                columns = [column.name for column in description]
                return [Row(zip(columns, row, strict=True)) for row in cursor.fetchall()]
            except (psycopg2.errors.InvalidSqlStatementName,
                    psycopg2.errors.DuplicatePreparedStatement) as exc:
                # The session's prepared statements are not what we recorded: the server
                # lost them (a pooler switched backends), or a PREPARE outlived its query
                # string's failure (a later statement's runtime error). Learn them, retry.
                # (Before OperationalError: psycopg2 files the first under it.)
                if not connection.learn_prepared():
                    connection.prepared.clear()
                if attempt == 2:
                    raise translate_store_error(exc, action) from exc
            except (psycopg2.OperationalError, psycopg2.InterfaceError) as exc:
                # A connection PostgreSQL closed fails its first statement: drop it, and
                # one more try uses a fresh one.
                connection.close()
                if attempt == 2:
                    raise translate_store_error(exc, action) from exc
            except psycopg2.Error as exc:
                raise translate_store_error(exc, action) from exc
        raise AssertionError("unreachable")

    @staticmethod
    def _rendered(connection: HeldConnection, statement: PreparedStatement,
                  parameters: dict[str, Any], fixed: tuple[str, ...]
                  ) -> tuple[str, tuple[str, ...]]:
        """`statement`'s `EXECUTE` with the `fixed` parameters' values written in (by the
        driver's `mogrify`: the same query text), and the names still passed per call."""
        key = (statement.name, *[parameters[name] for name in fixed])
        found = connection.rendered.get(key)
        if found is not None:
            return found
        encoding = psycopg2.extensions.encodings[connection.driver.encoding]
        written = []
        names = []
        for name in statement.names:
            if name in fixed:
                literal = connection.cursor.mogrify("%s", (parameters[name],)).decode(encoding)
                written.append(literal.replace("%", "%%"))  # literal text, not a placeholder
            else:
                written.append("%s")
                names.append(name)
        found = (f"EXECUTE {statement.name} ({', '.join(written)})", tuple(names))
        if len(connection.rendered) >= 256:  # a caller's few statements each; bounded anyway
            connection.rendered.clear()
        connection.rendered[key] = found
        return found
