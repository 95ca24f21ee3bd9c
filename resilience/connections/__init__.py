"""The connection layer: one fork hook and one translation of native store errors.

- `on_fork(callback)`: what to drop in a forked child (a child never reuses its parent's
  sockets); one `os.register_at_fork` hook, so no cache compares `os.getpid()`.
- `StoreBackend`: its subclasses' public methods are wrapped at class definition (as the
  `limits` library's `Storage`), so a native redis-py, psycopg2 or SQLAlchemy error leaves
  as `StoreUnavailable`, `StoreRejected`, `SchemaMissing` or `StorageError`, and a new
  backend cannot forget it. `wrap_store_errors` does the same around other code.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import os
import re
import sys
import threading
import weakref
from collections.abc import Callable
from typing import Any, ClassVar

from resilience.errors import SchemaMissing, StorageError, StoreRejected, StoreUnavailable
from resilience.redact import redact

# -- one fork hook -------------------------------------------------------------------------
_forked: list[Callable[[], Callable[[], Any] | None]] = []
_forked_lock = threading.Lock()


def on_fork(callback: Callable[[], Any]) -> None:
    """Run `callback()` in every child forked later, before the child uses a connection: it
    drops (never closes) the parent's clients. A bound method is held weakly."""
    ref: Callable[[], Callable[[], Any] | None] = (
        weakref.WeakMethod(callback) if inspect.ismethod(callback)
        else lambda: callback)  # a strong reference with WeakMethod's shape
    with _forked_lock:
        _forked.append(ref)


def _after_fork_in_child() -> None:
    global _forked_lock
    _forked_lock = threading.Lock()  # a thread of the parent may have held it at the fork
    alive = []
    for ref in _forked:
        callback = ref()
        if callback is not None:
            callback()
            alive.append(ref)
    _forked[:] = alive


os.register_at_fork(after_in_child=_after_fork_in_child)


class ProcessLocal:
    """Per-thread values (`.local`, a `threading.local`) that a forked child starts
    without: a thread's held connection is never used by two processes."""

    def __init__(self) -> None:
        self.local = threading.local()
        on_fork(self._forget)

    def _forget(self) -> None:
        self.local = threading.local()


# -- native store errors ------------------------------------------------------------------
#: SQLSTATE classes of a server that cannot serve now: connection exception (08), object in
#: use / lock not available (55), transaction rollback: serialization failure, deadlock
#: (40), insufficient resources (53), operator intervention: shutdown, cancel (57),
#: system error (58), invalid statement name: a pooler lost a prepared statement (26).
_PG_UNAVAILABLE_CLASSES = ("08", "26", "40", "53", "55", "57", "58")
#: SQLSTATE classes of a statement the server will refuse again: data exception (22),
#: integrity constraint (23), syntax or access rule (42), feature not supported (0A),
#: program limit exceeded (54: an index row too large, too many columns).
_PG_REJECTED_CLASSES = ("0A", "22", "23", "42", "54")
#: Redis error codes of a server that cannot serve now. redis-py has classes for most, but
#: not for BUSY, MISCONF, NOREPLICAS, nor for any code inside a Lua script's error before
#: Redis 7 ("Error running script (call to f_...): @user_script:9: READONLY ...").
_REDIS_UNAVAILABLE_CODES = frozenset(
    ("BUSY", "CLUSTERDOWN", "LOADING", "MASTERDOWN", "MISCONF", "NOREPLICAS", "OOM",
     "READONLY", "TRYAGAIN", "ASK", "MOVED"))
_SCRIPT_ERROR_CODE = re.compile(r"@user_script:\d+: ([A-Z]+) ")
#: Longest native message quoted in an error message (`cause` keeps twice as much).
_DETAIL_LENGTH = 500


#: What redis-py's cluster client raises, outside `RedisError`, for a request no server can
#: serve as written: a transaction or a pipelined command across slots (a program error, as
#: the CROSSSLOT reply is).
_CLUSTER_MISUSE = ("must map to the same key slot", "is blocked when running redis in cluster")


def _redis_verdict(exc: BaseException) -> type[StorageError] | None:
    errors = sys.modules.get("redis.exceptions")
    if errors is None:
        return None
    if isinstance(exc, errors.RedisClusterException):
        # Not a RedisError: a slot no master serves, no node reachable to learn the
        # layout from ("Redis Cluster cannot be connected"), ... is a store down;
        # a request that mixes slots is refused whatever the cluster's health.
        if isinstance(exc, errors.CrossSlotTransactionError | errors.InvalidPipelineStack) or (
                any(text in str(exc) for text in _CLUSTER_MISUSE)):
            return StoreRejected
        return StoreUnavailable
    if not isinstance(exc, errors.RedisError):
        return None
    # A Sentinel that names no master is a ConnectionError; ClusterError: CLUSTERDOWN /
    # MASTERDOWN replies, and the cluster client giving up after too many redirections.
    if isinstance(exc, errors.ConnectionError | errors.TimeoutError | errors.InvalidResponse
                  | errors.ReadOnlyError | errors.TryAgainError | errors.ClusterError
                  | errors.AskError | errors.OutOfMemoryError):
        return StoreUnavailable
    if isinstance(exc, errors.ResponseError):
        # redis-py keeps the code of replies it has no class for: "BUSY Redis is busy ..."
        message = str(exc)
        code = message.split(" ", 1)[0]
        if code == "Error":
            inner = _SCRIPT_ERROR_CODE.search(message)
            code = inner.group(1) if inner else code
        if code in _REDIS_UNAVAILABLE_CODES:
            return StoreUnavailable
        return StoreRejected
    if isinstance(exc, errors.DataError):
        return StoreRejected  # an argument redis-py cannot send (wrong type)
    return StorageError


#: DB-API error classes (psycopg2's and SQLAlchemy's share the names) by verdict.
_DBAPI_UNAVAILABLE = ("OperationalError", "InterfaceError", "DisconnectionError", "TimeoutError")
_DBAPI_REJECTED = ("DataError", "IntegrityError", "ProgrammingError", "NotSupportedError")


def _dbapi_class_verdict(exc: BaseException, module: Any) -> type[StorageError]:
    """The verdict of a DB-API error's class (no server code: the connection failed)."""
    for verdict, names in ((StoreUnavailable, _DBAPI_UNAVAILABLE),
                           (StoreRejected, _DBAPI_REJECTED)):
        if any(isinstance(exc, getattr(module, name, ())) for name in names):
            return verdict
    return StorageError


def _psycopg2_verdict(exc: BaseException) -> type[StorageError] | None:
    psycopg2 = sys.modules.get("psycopg2")
    if psycopg2 is None or not isinstance(exc, psycopg2.Error):
        return None
    code = (getattr(exc, "pgcode", None) or "")[:2]
    if code in _PG_UNAVAILABLE_CLASSES:
        return StoreUnavailable
    if code in _PG_REJECTED_CLASSES:
        return StoreRejected
    return _dbapi_class_verdict(exc, psycopg2)


def _sqlalchemy_verdict(exc: BaseException) -> type[StorageError] | None:
    errors = sys.modules.get("sqlalchemy.exc")
    if errors is None or not isinstance(exc, errors.SQLAlchemyError):
        return None
    if isinstance(exc, errors.DBAPIError):
        if exc.connection_invalidated:
            return StoreUnavailable
        native = _psycopg2_verdict(exc.orig) if exc.orig is not None else None
        if native is not None and native is not StorageError:
            return native
    return _dbapi_class_verdict(exc, errors)


def _verdict(exc: BaseException) -> tuple[type[StorageError], str] | None:
    """The error class and store name a native error maps to; None for a non-store error."""
    for verdict, store in ((_redis_verdict, "Redis"), (_psycopg2_verdict, "PostgreSQL"),
                           (_sqlalchemy_verdict, "PostgreSQL")):
        cls = verdict(exc)
        if cls is not None:
            return cls, store
    if isinstance(exc, OSError):  # a socket error a client let through
        return StoreUnavailable, "store"
    return None


def _native_message(exc: BaseException) -> str:
    # SQLAlchemy's own text appends the statement and its parameters: quote the driver's.
    orig = getattr(exc, "orig", None)
    text = " ".join(str(orig if orig is not None else exc).split())
    if len(text) > _DETAIL_LENGTH:
        text = text[:_DETAIL_LENGTH] + "..."
    return redact(text)


def translate_store_error(
    exc: BaseException, what: str, **fields: Any
) -> StorageError | SchemaMissing:
    """The package's error for a native store error `exc`, raised under `what`.

    `StoreUnavailable` when the store cannot serve now (connection, timeout, loading,
    failover, deadlock); `StoreRejected` when the operation will fail again (an error
    reply, a value too long, a constraint); `SchemaMissing` when a `resilience_*` table is
    missing; else `StorageError`. Ours are returned unchanged; messages are redacted.

    Args:
        exc: the error caught.
        what: the operation, as the message should name it ("rate limit").
        fields: structured fields of the error (`key=...`), also quoted in the message.
    """
    if isinstance(exc, StorageError | SchemaMissing):
        return exc
    missing = schema_missing(exc)
    if missing is not None:
        return missing
    cls, store = _verdict(exc) or (StorageError, "store")
    verdict = f"{store} " + _VERDICT_TEXT.get(cls, "error")
    context = ", ".join(f"{name}={_shorten(value)}" for name, value in fields.items())
    driver = getattr(exc, "orig", None) or exc
    code = getattr(driver, "pgcode", None)
    native = type(driver).__name__ + (f" [{code}]" if isinstance(code, str) else "")
    return cls(
        f"{what}{f' ({context})' if context else ''}: {verdict}: {native}: "
        f"{_native_message(exc)}",
        **fields,
        cause=redact(repr(exc))[:_DETAIL_LENGTH * 2])


_VERDICT_TEXT = {StoreUnavailable: "unavailable", StoreRejected: "refused the operation"}

#: PostgreSQL's undefined_table, and the relation its message names.
_UNDEFINED_TABLE = "42P01"
_MISSING_RELATION = re.compile(r'relation "(?:[^"]*\.)?(resilience_[^"]*)" does not exist')

#: What to run when the library's tables are missing.
MIGRATE_HINT = "run `python -m resilience migrate` (Django: `python manage.py migrate`)"


def schema_missing(exc: BaseException) -> SchemaMissing | None:
    """`SchemaMissing` when `exc` (psycopg2's or SQLAlchemy's) says a `resilience_*` table
    does not exist (undefined_table, 42P01); else None."""
    driver = getattr(exc, "orig", None) or exc
    if getattr(driver, "pgcode", None) != _UNDEFINED_TABLE:
        return None
    match = _MISSING_RELATION.search(str(driver))
    if match is None:
        return None  # a table of the application's own, not the library's
    database = _database_of(driver)
    return SchemaMissing(
        f"the resilience tables are missing from the database {database} "
        f"(relation {match.group(1)!r} does not exist): {MIGRATE_HINT}",
        table=match.group(1),
        database=database)


def _database_of(driver: Any) -> str:
    """`host:port/name` of the connection a psycopg2 error came from (never a password)."""
    try:
        parameters = driver.cursor.connection.get_dsn_parameters()
    except Exception:  # noqa: BLE001 - no cursor or a closed connection: say so
        return "(unknown)"
    host = parameters.get("host") or "localhost"
    port = parameters.get("port")
    return f"{host}{f':{port}' if port else ''}/{parameters.get('dbname', '')}"


def _shorten(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 120 else text[:117] + "..."


class _StoreErrorTranslation(contextlib.ContextDecorator):
    """`wrap_store_errors`'s context manager (a class: cheaper per call than a generator)."""

    def __init__(self, what: str, fields: dict[str, Any]) -> None:
        self.what = what
        self.fields = fields

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: Any, exc: BaseException | None, traceback: Any) -> bool:
        if exc is None or isinstance(exc, StorageError) or _verdict(exc) is None:
            return False
        raise translate_store_error(exc, self.what, **self.fields) from exc


def wrap_store_errors(what: str, **fields: Any) -> _StoreErrorTranslation:
    """Context manager and decorator: native store errors raised inside leave as
    `translate_store_error` makes them (the native one as `__cause__`); others pass.

        with wrap_store_errors("rate limit", key=key):
            script(keys=[...], args=[...])
    """
    return _StoreErrorTranslation(what, fields)


class StoreBackend:
    """Base of every backend on a server store: each public method (not generators or
    properties) is wrapped at class definition, so a native store error leaves as
    `translate_store_error` makes it, naming `store_operation` and the method."""

    #: How errors name this backend's operations ("idempotency store").
    store_operation: ClassVar[str] = "store"

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for name, value in list(vars(cls).items()):
            if (name.startswith("_") or not inspect.isfunction(value)
                    or inspect.isgeneratorfunction(value)
                    or getattr(value, "_translated", False)):
                continue
            setattr(cls, name, _translating(value, name))


def _translating(method: Callable[..., Any], name: str) -> Callable[..., Any]:
    @functools.wraps(method)
    def translated(self: StoreBackend, *args: Any, **kwargs: Any) -> Any:
        try:
            return method(self, *args, **kwargs)
        except (StorageError, SchemaMissing):
            raise
        except Exception as exc:
            if _verdict(exc) is None and schema_missing(exc) is None:
                raise
            raise translate_store_error(exc, f"{self.store_operation} {name}") from exc

    translated._translated = True  # type: ignore[attr-defined]
    return translated
