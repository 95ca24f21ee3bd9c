"""A real PgBouncer in transaction pooling mode in front of the session's PostgreSQL.

    guards (this process) ── DATABASE_URL ──────► PgBouncer (transaction mode, 2 servers)
                          ── LOCKS_DATABASE_URL ─► PostgreSQL directly (advisory locks)

`pgbouncer` starts Debian's `pgbouncer` (./scripts/ensure-pgbouncer installs it; the tests
skip without it) once per session on a free port with its own ini: trust auth, the
session's database, `pool_mode = transaction`, two server connections, and no
`ignore_startup_parameters` (so `options=-c ...` at connect is refused, as in production).
Its server connections are named `SERVER_NAME` in `pg_stat_activity`.

`pgbouncer_stores` puts the session app's stores behind it for one module (`apply()` runs
the guards in this process) and gives the session's stores back afterwards. Nothing here
imports `jobs` at module level (this conftest may load before the session's services
exist, see tests/conftest.py).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import make_url, text

from tests.harness import ARTIFACTS

#: `application_name` of PgBouncer's server connections (its [databases] entry sets it).
SERVER_NAME = "pgbouncer-test"
#: Server connections PgBouncer opens to the database (`default_pool_size`).
SERVER_POOL_SIZE = 2

CREATE_TABLES = """
CREATE TABLE IF NOT EXISTS pgbouncer_test_effects (
    id bigserial PRIMARY KEY,
    run_id text NOT NULL,
    key text NOT NULL,
    task_id text,
    at timestamptz NOT NULL DEFAULT clock_timestamp()
);
"""


class PgBouncer:
    """One `pgbouncer` process with its own ini, listening on 127.0.0.1:`port`."""

    def __init__(self, database_url: str) -> None:
        from jobs.embedded import EmbeddedProcess, free_port, postgres_ready

        binary = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"
        if not os.access(binary, os.X_OK):
            pytest.skip("pgbouncer not installed: run ./scripts/ensure-pgbouncer")
        self.direct = make_url(database_url).set(drivername="postgresql+psycopg2")
        self.port = free_port()
        self.folder = Path(tempfile.mkdtemp(prefix="pgbouncer-test-"))
        self.log_path = ARTIFACTS / "pgbouncer" / f"pgbouncer-{self.port}.log"
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        users = self.folder / "userlist.txt"
        users.write_text(f'"{self.direct.username or "postgres"}" ""\n')
        ini = self.folder / "pgbouncer.ini"
        ini.write_text(
            "[databases]\n"
            f"* = host={self.direct.host or '127.0.0.1'} port={self.direct.port or 5432} "
            f"application_name={SERVER_NAME}\n"
            "[pgbouncer]\n"
            "listen_addr = 127.0.0.1\n"
            f"listen_port = {self.port}\n"
            "unix_socket_dir =\n"
            "auth_type = trust\n"
            f"auth_file = {users}\n"
            "pool_mode = transaction\n"
            f"default_pool_size = {SERVER_POOL_SIZE}\n"
            "min_pool_size = 0\n"
            "max_client_conn = 200\n"
            "server_idle_timeout = 60\n"
        )
        # PgBouncer refuses to run as root: drop to nobody, who must read the ini.
        self.folder.chmod(0o755)
        for path in (users, ini):
            path.chmod(0o644)
        command = [binary, str(ini)]
        if os.geteuid() == 0:
            command[1:1] = ["-u", "nobody"]
        self.server = EmbeddedProcess(command, url=self.url, ready=postgres_ready,
                                      log_path=self.log_path).start(timeout_seconds=15)

    @property
    def url(self) -> str:
        """DATABASE_URL through PgBouncer (same database and user)."""
        return self.direct.set(host="127.0.0.1", port=self.port).render_as_string(
            hide_password=False)

    @property
    def direct_url(self) -> str:
        return self.direct.render_as_string(hide_password=False)

    def stop(self) -> None:
        self.server.stop()
        shutil.rmtree(self.folder, ignore_errors=True)


@pytest.fixture(scope="session")
def pgbouncer(services: Any) -> Iterator[PgBouncer]:
    """A real PgBouncer (transaction mode) in front of the session's database."""
    bouncer = PgBouncer(services.database_url)
    try:
        yield bouncer
    finally:
        bouncer.stop()


@pytest.fixture(scope="module")
def pgbouncer_stores(app: Any, stores: Any, pgbouncer: PgBouncer) -> Iterator[Any]:
    """The app's stores with DATABASE_URL through PgBouncer (declared transaction mode) and
    LOCKS_DATABASE_URL direct, for this module's tests."""
    from resilience.stores import Stores, install, stores_for

    with stores.engine().begin() as connection:
        connection.execute(text(CREATE_TABLES))
    original = stores_for(app)
    pooled = install(app, Stores(
        redis_url=original.redis_url, database_url=pgbouncer.url,
        locks_database_url=pgbouncer.direct_url, redlock_urls=original.redlock_urls,
        pool_mode="transaction", socket_timeout_seconds=3.0,
    ))
    try:
        yield pooled
    finally:
        install(app, original)
        pooled.engine().dispose()
