"""`jobs health live` (the worker answers) apart from `jobs health ready` (stores up)."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import pytest

from jobs.embedded import free_port
from jobs.observe.health import liveness, readiness
from tests.support import ROOT


def _jobs(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "jobs", *args], cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
                          capture_output=True, text=True, timeout=110)


class TestLiveness:
    @pytest.mark.timeout(120)
    def test_a_running_worker_is_live_and_an_absent_one_is_not(
        self, app: Any, worker_factory: Any
    ) -> None:
        """Exit 0 when the node answers the ping; exit 1 for a node that does not exist."""
        worker = worker_factory("optional", name="observe-live", concurrency=1)
        assert all(check.ok for check in liveness(app, worker.nodename, timeout_seconds=5))
        done = _jobs("health", "live", "--node", worker.nodename)
        assert done.returncode == 0, done.stdout + done.stderr
        missing = _jobs("health", "live", "--node", "critical@no-such-host", "--timeout", "1")
        assert missing.returncode == 1, missing.stdout + missing.stderr

    @pytest.mark.timeout(120)
    def test_a_stopped_worker_is_not_live(self, app: Any, worker_factory: Any) -> None:
        """A SIGSTOPped worker (hung process) does not answer: liveness fails."""
        worker = worker_factory("optional", name="observe-hung", concurrency=1)
        worker.sigstop()
        try:
            checks = liveness(app, worker.nodename, timeout_seconds=1)
            assert not checks[0].ok
        finally:
            worker.sigcont()


class TestReadiness:
    @pytest.mark.timeout(60)
    def test_ready_when_stores_answer_and_migrations_are_applied(self, app: Any) -> None:
        """Redis, broker and PostgreSQL answer; every migration head is applied."""
        checks = {check.name: check for check in readiness(app)}
        assert set(checks) == {"redis", "broker", "postgres", "migrations"}
        assert all(check.ok for check in checks.values()), checks
        assert _jobs("health", "ready").returncode == 0

    @pytest.mark.timeout(120)
    def test_not_ready_when_redis_is_unreachable(self) -> None:
        """Guard-state Redis on a port nobody listens on: exit 1, the Redis check fails."""
        done = _jobs("health", "ready", env={"REDIS_URL": f"redis://127.0.0.1:{free_port()}/1"})
        assert done.returncode == 1, done.stdout + done.stderr
        assert "FAIL redis" in done.stdout
        assert "ok postgres" in done.stdout

    @pytest.mark.timeout(120)
    def test_not_ready_when_migrations_are_missing(self, services: Any) -> None:
        """An empty database (no migrations applied): PostgreSQL answers, migrations fail."""
        from sqlalchemy import create_engine, make_url, text

        from resilience.stores import _sqlalchemy_url

        url = make_url(_sqlalchemy_url(services.database_url))
        admin = create_engine(url.set(database="postgres"), isolation_level="AUTOCOMMIT")
        name = "observe_unmigrated"
        with admin.connect() as connection:
            connection.execute(text(f'DROP DATABASE IF EXISTS "{name}"'))
            connection.execute(text(f'CREATE DATABASE "{name}"'))
        try:
            done = _jobs("health", "ready", env={
                "DATABASE_URL": url.set(database=name).render_as_string(hide_password=False)})
            assert done.returncode == 1, done.stdout + done.stderr
            assert "ok postgres" in done.stdout
            assert "FAIL migrations" in done.stdout
        finally:
            with admin.connect() as connection:
                connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
            admin.dispose()
