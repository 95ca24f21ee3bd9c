"""Alembic environment of the platform's own tables (the demo's), run by `jobs.db.migrate`.

The library's `resilience_*` tables are not this history's: `resilience.migrations` creates
them, recorded in `resilience_alembic_version`; this one records in `jobs_alembic_version`.
"""

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


def _configure(**options: Any) -> None:
    context.configure(target_metadata=metadata, version_table=VERSION_TABLE,
                      include_object=_platform_object, **options)


if connection is None:
    engine = create_engine(config.get_main_option("sqlalchemy.url"))
    with engine.connect() as connection:
        _configure(connection=connection)
        with context.begin_transaction():
            context.run_migrations()
else:
    _configure(connection=connection)
    with context.begin_transaction():
        context.run_migrations()
