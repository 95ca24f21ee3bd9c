"""The library's own schema: its Alembic history, applied with `python -m resilience migrate`.

Every table of the library is named `resilience_*`; its history is recorded in
`resilience_alembic_version`, so it lives beside an application's own Alembic history (its
`alembic_version`) in the same database, and creates nothing but the library's tables.

    from resilience.migrations import upgrade
    upgrade("postgresql://app:secret@db/shop")    # what `python -m resilience migrate` does

Several processes may call `upgrade` at once (every worker at start): a PostgreSQL advisory
lock lets one apply the revisions while the others wait, then find nothing left to do.
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.util import CommandError
from sqlalchemy import MetaData, create_engine, make_url, text
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError, SQLAlchemyError
from sqlalchemy.pool import NullPool

import resilience.cancel.models
import resilience.deadletter.models
import resilience.idempotency.models
import resilience.locks.models
import resilience.outbox.models
import resilience.schedules.models
import resilience.workflows.models  # noqa: F401 - each registers its tables
from resilience.errors import ConfigurationError, StoreUnavailable
from resilience.redact import redact, redact_url
from resilience.schema import metadata
from resilience.stores import _sqlalchemy_url

__all__ = [
    "LOCK_ID", "VERSION_TABLE", "current", "downgrade", "head", "library_metadata", "sql",
    "upgrade"]

#: The table recording which of the library's revisions a database has.
VERSION_TABLE = "resilience_alembic_version"

#: Advisory-lock id that serializes the library's migrations across processes.
LOCK_ID = 7_201_901_002

_HERE = Path(__file__).parent


def library_metadata() -> MetaData:
    """The metadata with every library table declared (each guard's `models.py` imported)."""
    return metadata


def upgrade(database_url: str, revision: str = "head") -> None:
    """Apply the library's migrations up to `revision` (the database must exist); safe when
    processes call it at once.

    Raises:
        ConfigurationError: the URL is malformed or `revision` unknown.
        StoreUnavailable: the database cannot be reached.
    """
    _run("upgrade", database_url, revision)


def downgrade(database_url: str, revision: str = "base") -> None:
    """Revert the library's migrations down to `revision` (`base`: drop every library table).

    Raises:
        ConfigurationError, StoreUnavailable: as `upgrade`.
    """
    _run("downgrade", database_url, revision)


def current(database_url: str) -> str | None:
    """The library revision applied to the database; None when none is.

    Raises:
        ConfigurationError, StoreUnavailable: as `upgrade`.
    """
    with _connection(database_url) as connection:
        context = MigrationContext.configure(connection, opts={"version_table": VERSION_TABLE})
        return context.get_current_revision()


def head() -> str:
    """The newest revision of the library's history."""
    head_revision = ScriptDirectory.from_config(_config("postgresql://")).get_current_head()
    assert head_revision is not None
    return head_revision


def sql(database_url: str = "postgresql://", revision: str = "head") -> str:
    """The SQL `upgrade` would run from an empty database to `revision` (Alembic's offline
    mode), for a DBA to review or apply by hand."""
    config = _config(database_url)
    config.output_buffer = io.StringIO()
    with _translated(database_url):
        command.upgrade(config, revision, sql=True)
    return config.output_buffer.getvalue()


def _run(action: str, database_url: str, revision: str) -> None:
    with _connection(database_url) as connection:
        lock = {"id": LOCK_ID}
        connection.execute(text("SELECT pg_advisory_lock(:id)"), lock)
        connection.commit()
        try:
            config = _config(database_url)
            config.attributes["connection"] = connection
            with _translated(database_url):
                getattr(command, action)(config, revision)
            connection.commit()
        finally:
            # After a failure the connection may be gone, and the lock with its session.
            with contextlib.suppress(Exception):
                connection.rollback()
                connection.execute(text("SELECT pg_advisory_unlock(:id)"), lock)
                connection.commit()


def _config(database_url: str) -> Any:
    config = Config()
    config.set_main_option("script_location", str(_HERE))
    config.set_main_option("sqlalchemy.url", _sqlalchemy_url(database_url).replace("%", "%%"))
    return config


@contextlib.contextmanager
def _connection(database_url: str) -> Iterator[Any]:
    """A connection to `database_url`; errors leave as the library's, one line, redacted."""
    if not isinstance(database_url, str) or not database_url.strip():
        raise ConfigurationError("no database URL given for the resilience migrations")
    with _translated(database_url):
        try:
            url = make_url(_sqlalchemy_url(database_url))
        except Exception:  # noqa: BLE001 - SQLAlchemy cannot parse it
            url = None
        if url is None or url.get_backend_name() != "postgresql":
            raise ConfigurationError(
                f"{redact_url(database_url)!r} is not a PostgreSQL URL "
                "(postgresql://user@host:5432/database): the resilience tables live in "
                "PostgreSQL")
        engine = create_engine(url, poolclass=NullPool)  # one connection, closed after
        try:
            with engine.connect() as connection:
                yield connection
        finally:
            engine.dispose()


@contextlib.contextmanager
def _translated(database_url: str) -> Iterator[None]:
    """Alembic's and the driver's errors as the library's: one line, no password."""
    where = _where(database_url)
    try:
        yield
    except CommandError as exc:
        raise ConfigurationError(f"resilience migrations: {_one_line(exc)}") from None
    except DBAPIError as exc:
        text = redact(_one_line(exc.orig if exc.orig is not None else exc))
        if exc.connection_invalidated or isinstance(exc, OperationalError | InterfaceError):
            raise StoreUnavailable(
                f"resilience migrations: PostgreSQL at {where} unavailable: {text}") from None
        raise ConfigurationError(
            f"resilience migrations: PostgreSQL at {where} refused: {text}") from None
    except SQLAlchemyError as exc:
        raise ConfigurationError(f"resilience migrations: {redact(_one_line(exc))}") from None


def _where(database_url: str) -> str:
    """`host:port/database` of a URL, for messages (never its password)."""
    try:
        url = make_url(database_url)
    except Exception:  # noqa: BLE001 - a malformed URL: show it redacted
        return redact_url(database_url)
    host = url.host or "localhost"
    return f"{host}{f':{url.port}' if url.port else ''}/{url.database or ''}"


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text[:300] + ("..." if len(text) > 300 else "")
