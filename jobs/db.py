"""Database helpers: create the database if missing, apply migrations once at a time.

Two Alembic histories share the database: the library's (`resilience.migrations`, its
`resilience_*` tables, recorded in `resilience_alembic_version`) and the platform's
(`jobs/migrations`, the demo's tables, recorded in `jobs_alembic_version`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy import create_engine, make_url, text
from sqlalchemy.engine import Connection
from sqlalchemy.exc import OperationalError

from resilience import migrations as library_migrations
from resilience.stores import _sqlalchemy_url

logger = logging.getLogger("jobs.db")

#: Advisory-lock id that serializes migrations across processes starting together.
MIGRATION_LOCK_ID = 7_201_901_001

#: The table recording the platform's own revisions.
VERSION_TABLE = "jobs_alembic_version"


@contextmanager
def _locked(connection: Connection) -> Iterator[None]:
    """Hold the migration lock (a session lock, committed on both sides) on `connection`."""
    connection.execute(text("SELECT pg_advisory_lock(:id)"), {"id": MIGRATION_LOCK_ID})
    connection.commit()
    try:
        yield
    finally:
        connection.execute(text("SELECT pg_advisory_unlock(:id)"), {"id": MIGRATION_LOCK_ID})
        connection.commit()


def ensure_database(database_url: str) -> bool:
    """Create the URL's database if it does not exist; safe when processes race.

    Returns:
        True when this call created the database.
    """
    url = make_url(_sqlalchemy_url(database_url))
    probe = create_engine(url)
    try:
        with probe.connect():
            return False
    except OperationalError as exc:
        if "does not exist" not in str(exc):
            raise
    finally:
        probe.dispose()
    admin = create_engine(url.set(database="postgres"), isolation_level="AUTOCOMMIT")
    try:
        # Serialize creators: CREATE DATABASE cannot run inside a transaction or use
        # IF NOT EXISTS, so check-then-create must hold a lock.
        with admin.connect() as connection, _locked(connection):
            exists = connection.execute(text("SELECT 1 FROM pg_database WHERE datname = :name"),
                                        {"name": url.database}).first()
            if exists:
                return False
            connection.execute(text(f'CREATE DATABASE "{url.database}"'))
            logger.info("created database %s", url.database)
            return True
    finally:
        admin.dispose()


def alembic_config(database_url: str) -> Config:
    """Alembic configuration pointing at the packaged migrations."""
    config = Config()
    config.set_main_option("script_location", str(Path(__file__).parent / "migrations"))
    config.set_main_option("sqlalchemy.url", _sqlalchemy_url(database_url).replace("%", "%%"))
    return config


def expected_versions(database_url: str) -> dict[str, frozenset[str]]:
    """Each version table and the heads of its history's scripts (what a migrated database
    records): the library's and the platform's."""
    from alembic.script import ScriptDirectory

    return {
        library_migrations.VERSION_TABLE: frozenset({library_migrations.head()}),
        VERSION_TABLE: frozenset(
            ScriptDirectory.from_config(alembic_config(database_url)).get_heads()),
    }


def migrate(database_url: str) -> None:
    """Create the database if missing, apply the library's migrations, then the platform's;
    safe when several processes call it at once."""
    ensure_database(database_url)
    library_migrations.upgrade(database_url)
    engine = create_engine(_sqlalchemy_url(database_url))
    try:
        with engine.connect() as connection, _locked(connection):
            config = alembic_config(database_url)
            config.attributes["connection"] = connection
            command.upgrade(config, "heads")
            connection.commit()
    finally:
        engine.dispose()
