"""Alembic environment of the library's own tables (run by `resilience.migrations`): only
`resilience_*` tables, versioned in `resilience_alembic_version`, beside an application's
own Alembic history."""

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


def _migrate(**options: Any) -> None:
    context.configure(target_metadata=library_metadata(), version_table=VERSION_TABLE,
                      include_object=_library_object, **options)
    with context.begin_transaction():
        context.run_migrations()


def run() -> None:
    """Run the revisions Alembic selected, online or offline (`--sql`)."""
    config = context.config
    url = config.get_main_option("sqlalchemy.url")
    connection = config.attributes.get("connection")
    if context.is_offline_mode():
        _migrate(url=url, literal_binds=True)
    elif connection is not None:
        _migrate(connection=connection)
    else:
        engine = create_engine(url)
        with engine.connect() as connection:
            _migrate(connection=connection)
        engine.dispose()


# Alembic executes this file under its own module name; importing the package's module (a
# tool walking every module of the library) must not run migrations.
if __name__ != "resilience.migrations.env":
    run()
