"""The library's own schema: `resilience.migrations` and `python -m resilience migrate`,
on fresh databases of the session's PostgreSQL."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Iterator

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from celery import Celery
from sqlalchemy import create_engine, make_url, text

import resilience
from resilience import migrations
from resilience.__main__ import ENVIRONMENT_VARIABLE
from resilience.errors import ConfigurationError, SchemaMissing, StoreUnavailable
from resilience.idempotency import idempotent
from resilience.stores import _sqlalchemy_url
from tests.support import ROOT, Services, scratch_database

pytestmark = pytest.mark.timeout(120)

#: Every table the baseline creates (plus the version table).
LIBRARY_TABLES = {
    "resilience_cancellations",
    "resilience_dead_letters", "resilience_fencing_marks", "resilience_held_locks",
    "resilience_idempotency_records", "resilience_outbox",
    "resilience_workflows", "resilience_workflow_steps",
    "resilience_schedules", "resilience_schedule_runs",
}
PASSWORD = "s3cret-pw"


@pytest.fixture()
def database_url(services: Services) -> Iterator[str]:
    """A new, empty database on the session's PostgreSQL, dropped after the test."""
    with scratch_database(services.database_url, "resilience_migrations") as url:
        yield _sqlalchemy_url(url)


def _tables(database_url: str) -> set[str]:
    engine = create_engine(_sqlalchemy_url(database_url))
    try:
        with engine.connect() as connection:
            return set(connection.execute(text(
                "SELECT tablename FROM pg_tables WHERE schemaname = 'public'")).scalars())
    finally:
        engine.dispose()


def _run(*argv: str, **env: str) -> subprocess.CompletedProcess[str]:
    environment = {key: value for key, value in os.environ.items()
                   if key != ENVIRONMENT_VARIABLE}
    return subprocess.run(
        [sys.executable, "-m", "resilience", *argv], cwd=ROOT, capture_output=True,
        text=True, timeout=60, env={**environment, "PYTHONPATH": str(ROOT), **env},
    )


class TestUpgrade:
    def test_creates_only_the_library_tables_and_its_version_table(
        self, database_url: str
    ) -> None:
        """`upgrade` on an empty database creates the `resilience_*` tables and
        `resilience_alembic_version` at the head, and nothing else; again, it is a no-op."""
        assert migrations.current(database_url) is None
        migrations.upgrade(database_url)
        assert _tables(database_url) == LIBRARY_TABLES | {migrations.VERSION_TABLE}
        assert migrations.current(database_url) == migrations.head() == "0003_schedules"
        migrations.upgrade(database_url)
        assert _tables(database_url) == LIBRARY_TABLES | {migrations.VERSION_TABLE}

    def test_concurrent_upgrades_both_succeed(self, database_url: str) -> None:
        """Two processes' worth of `upgrade` at once (threads, own connections): the
        advisory lock lets one create the tables, the other then finds nothing to do."""
        errors: list[BaseException] = []
        start = threading.Barrier(3)

        def upgrade() -> None:
            start.wait()
            try:
                migrations.upgrade(database_url)
            except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
                errors.append(exc)

        threads = [threading.Thread(target=upgrade) for _ in range(3)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert errors == []
        assert migrations.current(database_url) == migrations.head()

    def test_downgrade_to_base_drops_every_library_table(self, database_url: str) -> None:
        """`downgrade(url, "base")` leaves no library table (only the empty version
        table), and `upgrade` builds them again."""
        migrations.upgrade(database_url)
        migrations.downgrade(database_url, "base")
        assert _tables(database_url) == {migrations.VERSION_TABLE}
        assert migrations.current(database_url) is None
        migrations.upgrade(database_url)
        assert _tables(database_url) >= LIBRARY_TABLES

    def test_the_baseline_matches_the_models(self, database_url: str) -> None:
        """Autogenerate finds no difference between the migrated database and the models:
        types, nullability, defaults, comments, indexes, constraints."""
        migrations.upgrade(database_url)
        engine = create_engine(_sqlalchemy_url(database_url))
        try:
            with engine.connect() as connection:
                context = MigrationContext.configure(connection, opts={
                    "compare_type": True, "compare_server_default": True,
                    "version_table": migrations.VERSION_TABLE,
                })
                differences = compare_metadata(context, migrations.library_metadata())
        finally:
            engine.dispose()
        assert differences == []

    def test_every_library_table_carries_the_prefix(self) -> None:
        """One prefix for every table of the library (docs/library.md, "Migrations")."""
        names = set(migrations.library_metadata().tables)
        assert names == LIBRARY_TABLES

    @pytest.mark.parametrize("url", [
        f"postgresql://app:{PASSWORD}@127.0.0.1:1/nowhere",
        f"mysql://app:{PASSWORD}@db/shop",
        "not a url",
    ])
    def test_a_bad_url_is_one_clear_error_without_the_password(self, url: str) -> None:
        """Unreachable: `StoreUnavailable`; not PostgreSQL: `ConfigurationError`; one line
        each, the password masked."""
        with pytest.raises((StoreUnavailable, ConfigurationError)) as raised:
            migrations.upgrade(url)
        message = str(raised.value)
        assert "\n" not in message and PASSWORD not in message, message
        if "127.0.0.1:1" in url:
            assert isinstance(raised.value, StoreUnavailable)


class TestCommand:
    def test_migrate_current_downgrade(self, database_url: str) -> None:
        """`python -m resilience migrate --database-url` creates the tables; `current`
        prints the revision; `downgrade --revision base` drops them."""
        done = _run("migrate", "--database-url", database_url)
        assert done.returncode == 0, done.stderr
        assert "0003_schedules" in done.stdout
        assert _tables(database_url) >= LIBRARY_TABLES
        done = _run("current", "--database-url", database_url)
        assert done.stdout.strip() == "0003_schedules", done.stderr
        done = _run("downgrade", "--revision", "base", "--database-url", database_url)
        assert done.returncode == 0, done.stderr
        assert _tables(database_url) == {migrations.VERSION_TABLE}

    def test_the_url_comes_from_the_app_or_the_environment(self, database_url: str) -> None:
        """`-A module:app` reads the app's `resilience_database_url`;
        `RESILIENCE_DATABASE_URL` serves when neither option is given."""
        done = _run("migrate", "-A", "tests.resilience.migrations_app:app",
                    MIGRATIONS_APP_URL=database_url)
        assert done.returncode == 0, done.stderr
        assert migrations.current(database_url) == migrations.head()
        done = _run("current", RESILIENCE_DATABASE_URL=database_url)
        assert done.stdout.strip() == "0003_schedules", done.stderr

    @pytest.mark.parametrize(("argv", "says"), [
        (["migrate", "--database-url", f"postgresql://app:{PASSWORD}@127.0.0.1:1/x"],
         "unavailable"),
        (["migrate", "--database-url", f"redis://:{PASSWORD}@127.0.0.1:6379/0"],
         "not a PostgreSQL URL"),
        (["migrate"], "pass --database-url URL"),
        (["migrate", "-A", "tests.no_such_module"], "cannot load the Celery app"),
        (["downgrade", "--database-url", "postgresql://x@127.0.0.1:1/x"], "--revision"),
    ])
    def test_bad_input_is_one_line_and_exit_2(self, argv: list[str], says: str) -> None:
        """A mistake prints one line naming it (no traceback, no password), exit 2."""
        done = _run(*argv)
        assert done.returncode == 2, done.stdout + done.stderr
        assert done.stderr.count("\n") == 1 and says in done.stderr, done.stderr
        assert "Traceback" not in done.stderr and PASSWORD not in done.stderr

    def test_sql_prints_the_baseline_offline(self) -> None:
        """`migrate --sql` prints the SQL without a database."""
        done = _run("migrate", "--sql")
        assert done.returncode == 0, done.stderr
        assert "CREATE TABLE resilience_idempotency_records" in done.stdout
        assert "CREATE TABLE resilience_alembic_version" in done.stdout


class TestSchemaMissing:
    def test_a_guard_on_an_unmigrated_database_says_run_migrate(
        self, services: Services, database_url: str
    ) -> None:
        """An `@idempotent` task whose database has no resilience tables fails with
        `SchemaMissing` naming the database (no password) and the command to run, not
        psycopg2's `relation ... does not exist`."""
        app = Celery("unmigrated", broker="memory://", set_as_current=False)
        app.conf.resilience_redis_url = services.redis_url
        app.conf.resilience_database_url = database_url
        resilience.init_app(app)

        @app.task
        @idempotent(key="{order_id}")
        def charge(order_id: int) -> int:
            return order_id

        with pytest.raises(SchemaMissing) as raised:
            charge(1)
        message = str(raised.value)
        assert isinstance(raised.value, ConfigurationError)
        assert "python -m resilience migrate" in message, message
        assert make_url(database_url).database in message, message
        assert raised.value.table == "resilience_idempotency_records"
        password = make_url(database_url).password
        assert not password or password not in message
        migrations.upgrade(database_url)
        assert charge(2) == 2
