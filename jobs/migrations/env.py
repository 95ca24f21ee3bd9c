"""Alembic environment of the platform's own tables (the demo's), run by `jobs.db.migrate`
and recorded in `jobs_alembic_version` (the library's history is its own: see jobs/db.py)."""

from __future__ import annotations

from typing import Any

from alembic import context
from sqlalchemy import create_engine

from jobs.db import VERSION_TABLE
from jobs.models import metadata

config = context.config
connection = config.attributes.get("connection")


def _platform_object(obj: Any, name: str | None, kind: str, reflected: bool,
                     compare_to: Any) -> bool:
    """Autogenerate looks at the platform's tables only (never at the library's)."""
    return not (kind == "table" and reflected and compare_to is None)


def _migrate(connection: Any) -> None:
    context.configure(connection=connection, target_metadata=metadata,
                      version_table=VERSION_TABLE, include_object=_platform_object)
    with context.begin_transaction():
        context.run_migrations()


if connection is None:
    with create_engine(config.get_main_option("sqlalchemy.url")).connect() as connection:
        _migrate(connection)
else:
    _migrate(connection)
