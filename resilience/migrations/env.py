"""Alembic environment of the library's own tables (run by `resilience.migrations`).

Only the `resilience_*` tables are compared and migrated; the version table is
`resilience_alembic_version`, so the library's history lives beside an application's own
Alembic history (its `alembic_version`) in the same database without touching it.
"""

from __future__ import annotations

from typing import Any

from alembic import context
from sqlalchemy import create_engine

from resilience.migrations import VERSION_TABLE, library_metadata


def _library_object(obj: Any, name: str | None, kind: str, reflected: bool,
                    compare_to: Any) -> bool:
    """Autogenerate looks at the library's tables only, never at an application's."""
    if kind == "table":
        return bool(name and name.startswith("resilience_"))
    table = getattr(obj, "table", None)
    return table is None or str(table.name).startswith("resilience_")


def _configure(**options: Any) -> None:
    context.configure(
        target_metadata=library_metadata(),
        version_table=VERSION_TABLE,
        include_object=_library_object,
        **options,
    )


def run() -> None:
    """Run the revisions Alembic selected, online or offline (`--sql`)."""
    config = context.config
    if context.is_offline_mode():
        _configure(url=config.get_main_option("sqlalchemy.url"), literal_binds=True)
        with context.begin_transaction():
            context.run_migrations()
    else:
        connection = config.attributes.get("connection")
        if connection is None:
            engine = create_engine(config.get_main_option("sqlalchemy.url"))
            with engine.connect() as connection:
                _configure(connection=connection)
                with context.begin_transaction():
                    context.run_migrations()
            engine.dispose()
        else:
            _configure(connection=connection)
            with context.begin_transaction():
                context.run_migrations()


# Alembic executes this file under its own module name; importing the package's module (a
# tool walking every module of the library) must not run migrations.
if __name__ != "resilience.migrations.env":
    run()
