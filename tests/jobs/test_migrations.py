"""The platform's migrations build the schema its models declare (the library's tables have
their own history: tests/resilience/test_migrations.py), and long ids and keys fit."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import text

from jobs.db import VERSION_TABLE, alembic_config
from jobs.models import metadata


def _modelled(obj: Any, name: str | None, kind: str, reflected: bool, compare_to: Any) -> bool:
    """Compare the tables the platform's models declare; the database also holds the
    library's tables and tables test fixtures create."""
    return not (kind == "table" and reflected and compare_to is None)


class TestMigrations:
    def test_one_head(self, stores: Any) -> None:
        """The revisions form one line: a new migration has one place to go."""
        heads = ScriptDirectory.from_config(alembic_config(stores.database_url)).get_heads()
        assert heads == ["0001_platform"]

    def test_migrated_columns_match_the_models(self, engine: Any) -> None:
        """Column types and nullability of the migrated database are those of the models."""
        with engine.connect() as connection:
            context = MigrationContext.configure(
                connection, opts={"compare_type": True, "include_object": _modelled,
                                  "version_table": VERSION_TABLE}
            )
            differences = compare_metadata(context, metadata)
        assert _flatten(differences) == []

    @pytest.mark.parametrize(
        ("table", "column"),
        [
            ("resilience_idempotency_records", "task_id"),
            ("resilience_idempotency_records", "key"),
            ("resilience_held_locks", "key"),
            ("resilience_held_locks", "task_id"),
            ("resilience_fencing_marks", "key"),
            ("resilience_dead_letters", "task_id"),
            ("resilience_dead_letters", "queue"),
            ("resilience_outbox", "task_id"),
            ("resilience_outbox", "ordering_key"),
            ("ledger_entries", "task_id"),
        ],
    )
    def test_ids_and_keys_are_text(self, engine: Any, table: str, column: str) -> None:
        """Ids and keys have no length limit (a 1,000-character task id is stored as is)."""
        assert _column_type(engine, table, column) == "text"

    def test_long_task_id_and_key_are_stored(self, engine: Any) -> None:
        """A held-lock row with a 1,000-character task id and a 2,000-character key fits."""
        key = f"tests.migrations:{uuid.uuid4().hex}:" + "k" * 2000
        with engine.begin() as connection:
            connection.execute(
                text("INSERT INTO resilience_held_locks (key, kind, owner, task_id) "
                     "VALUES (:key, 'singleton', :owner, :task_id)"),
                {"key": key, "owner": "o" * 300, "task_id": "t" * 1000},
            )
            stored = connection.execute(
                text("SELECT length(task_id) FROM resilience_held_locks WHERE key = :key"),
                {"key": key},
            ).scalar_one()
            connection.execute(text("DELETE FROM resilience_held_locks WHERE key = :key"),
                               {"key": key})
        assert stored == 1000


class TestMigrationPath:
    @pytest.mark.timeout(120)
    def test_migrate_downgrade_migrate(self, services: Any) -> None:
        """`migrate` creates a missing database with the library's tables and the platform's,
        each history in its own version table; the platform's downgrade leaves the
        library's tables, and `migrate` brings the platform's back."""
        from alembic import command
        from sqlalchemy import create_engine, make_url

        from jobs.db import migrate
        from resilience.migrations import VERSION_TABLE as LIBRARY_VERSION_TABLE
        from resilience.stores import _sqlalchemy_url

        url = make_url(_sqlalchemy_url(services.database_url))
        name = f"migrations_{uuid.uuid4().hex[:8]}"
        database_url = url.set(database=name).render_as_string(hide_password=False)
        admin = create_engine(url.set(database="postgres"), isolation_level="AUTOCOMMIT")
        engine = create_engine(database_url)
        try:
            migrate(database_url)
            assert {LIBRARY_VERSION_TABLE, VERSION_TABLE, "ledger_entries",
                    "resilience_dead_letters"} <= _tables(engine)
            assert "alembic_version" not in _tables(engine)
            with engine.begin() as connection:
                config = alembic_config(database_url)
                config.attributes["connection"] = connection
                command.downgrade(config, "base")
            assert "ledger_entries" not in _tables(engine)
            assert "resilience_dead_letters" in _tables(engine)
            migrate(database_url)
            assert "ledger_entries" in _tables(engine)
        finally:
            engine.dispose()
            with admin.connect() as connection:
                connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
            admin.dispose()


def _tables(engine: Any) -> set[str]:
    with engine.connect() as connection:
        return set(connection.execute(text(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'public'")).scalars())


def _column_type(engine: Any, table: str, column: str) -> str:
    with engine.connect() as connection:
        return connection.execute(
            text("SELECT data_type FROM information_schema.columns "
                 "WHERE table_name = :t AND column_name = :c"), {"t": table, "c": column}
        ).scalar_one()


def _flatten(differences: list[Any]) -> list[tuple[Any, ...]]:
    """compare_metadata's list: column changes come grouped in lists; one tuple each."""
    flat = []
    for difference in differences:
        if isinstance(difference, list):
            flat.extend(difference)
        else:
            flat.append(difference)
    return flat
