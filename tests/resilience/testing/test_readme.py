"""The README's "Use with your own Celery app" section, executed: the install line, the app
snippet on the session's real Redis and PostgreSQL, the Django settings, and the test
snippets as a user's own project, run by pytest in a subprocess twice in a row with the
app's URLs pointing at ports where nothing listens (the plugin keeps the guards in memory).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import types
import uuid
from importlib import metadata
from pathlib import Path

import pytest
import tomllib
from celery import Celery
from sqlalchemy import text

import resilience
from jobs.embedded import free_port
from resilience.stores import stores_for
from tests.support import ROOT, Services

HEADING = "## Use with your own Celery app"
#: The snippet's stores, replaced by real or dead ones.
SNIPPET_REDIS = "redis://localhost:6379"
SNIPPET_DATABASE = "postgresql://shop@localhost/shop"
#: The variables of the platform's test session, which a user's project never sees.
SESSION_VARIABLES = ("REDIS_URL", "DATABASE_URL", "BROKER_URL", "LOCKS_DATABASE_URL",
                     "REDLOCK_URLS", "PYTEST_ADDOPTS", "PYTEST_PLUGINS")


def section() -> str:
    readme = (ROOT / "README.md").read_text()
    start = readme.index(f"\n{HEADING}\n")
    end = readme.find("\n## ", start + 1)
    # Its "### Django" subsection is a Django project's, run by tests/django.
    django = readme.find("\n### Django\n", start, end if end != -1 else None)
    return readme[start:django if django != -1 else end if end != -1 else None]


def blocks() -> dict[str, str]:
    """The section's fenced blocks by the file their first line names (`# shop.py`);
    a shell block by its language."""
    found = {}
    for language, body in re.findall(r"```(\w+)\n(.*?)```", section(), re.S):
        first = body.splitlines()[0]
        name = first[2:].strip() if first.startswith("# ") and "." in first else language
        found[name] = body
    return found


def project(into: Path, *, redis: str, database: str) -> Path:
    """The user's project: the snippets as files, with `shop.py` on the given stores."""
    files = blocks()
    shop = files["shop.py"]
    assert SNIPPET_REDIS in shop and SNIPPET_DATABASE in shop
    files["shop.py"] = shop.replace(SNIPPET_REDIS, redis).replace(SNIPPET_DATABASE, database)
    for name in ("shop.py", "pytest.ini", "test_shop.py", "test_shop_worker.py"):
        (into / name).write_text(files[name])
    return into


def user_environment() -> dict[str, str]:
    return {name: value for name, value in os.environ.items() if name not in SESSION_VARIABLES}


def run(command: list[str], cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, cwd=cwd, env=user_environment(), capture_output=True,
                          text=True, timeout=timeout)


class TestInstall:
    def test_the_first_install_line_installs_the_library_from_a_checkout(self) -> None:
        """`pip install ./resilience` names the library's own project folder (the
        `celery-resilience` distribution, whose `[pytest]` extra brings pytest and whose
        entry point registers the plugin); the development install has that entry point."""
        lines = [line.split("#")[0].strip() for line in blocks()["sh"].splitlines()]
        installs = [line for line in lines if line.startswith("pip install")]
        assert installs[0] == "pip install ./resilience"
        assert installs[1] == "pip install './resilience[pytest]'"
        project_file = tomllib.loads((ROOT / "resilience" / "pyproject.toml").read_text())
        assert project_file["project"]["name"] == "celery-resilience"
        assert any(requirement.startswith("pytest")
                   for requirement in project_file["project"]["optional-dependencies"]["pytest"])
        plugin = project_file["project"]["entry-points"]["pytest11"]["resilience"]
        assert plugin == "resilience.testing.pytest_plugin"
        installed = {entry.value for entry in metadata.entry_points(group="pytest11")}
        assert plugin in installed


class TestAppSnippet:
    def test_the_app_snippet_guards_charge_on_real_redis_and_postgresql(
        self, services: Services, tmp_path: Path, engine: object
    ) -> None:
        """The README's shop.py on the session's Redis and PostgreSQL, eager: the same order
        charged twice runs the body once, answers its value twice, and leaves a succeeded
        record in the library's table."""
        project(tmp_path, redis=services.redis_base, database=services.database_url)
        order = uuid.uuid4().int % 1_000_000_000
        script = ("import json, sys, shop\n"
                  "shop.app.conf.task_always_eager = True\n"
                  "values = [shop.charge.delay(int(sys.argv[1])).get() for _ in range(2)]\n"
                  "print(json.dumps({'values': values, 'charged': shop.charged}))\n")
        done = run([sys.executable, "-c", script, str(order)], tmp_path)
        assert done.returncode == 0, done.stderr[-3000:]
        assert json.loads(done.stdout.splitlines()[-1]) == {
            "values": [order * 100, order * 100], "charged": [order]}
        with engine.connect() as connection:  # type: ignore[attr-defined]
            state = connection.execute(
                text("SELECT state FROM resilience_idempotency_records "
                     "WHERE task_name = 'shop.charge' AND key = :key"),
                {"key": str(order)}).scalar()
        assert state == "succeeded"

    def test_the_django_settings_reach_the_stores(self) -> None:
        """`CELERY_RESILIENCE_*` settings, read through Celery's namespace, are the stores'."""
        settings = types.ModuleType("settings")
        exec(blocks()["settings.py"], settings.__dict__)
        app = Celery("django-shop")
        app.config_from_object(settings, namespace="CELERY")
        resilience.init_app(app)
        stores = stores_for(app)
        assert stores.redis_url == "redis://localhost:6379/1"
        assert stores.database_url == "postgresql+psycopg2://shop@localhost/shop"


class TestTestSnippets:
    @pytest.mark.chaos  # two pytest runs with a worker thread each: 17-27 s here
    @pytest.mark.timeout(240)
    def test_the_user_tests_pass_twice_in_a_row_with_no_server_reachable(
        self, tmp_path: Path
    ) -> None:
        """The README's test files, run by pytest in the user's project with the plugin
        (the entry point of the installed library) and `celery.contrib.pytest`: eager and
        with a worker thread, a duplicate runs once, a unique key held in one test is free
        in the next; green twice in a row. Nothing listens on the app's ports: without the
        plugin the same call fails on the unreachable store."""
        project(tmp_path, redis=f"redis://127.0.0.1:{free_port()}",
                database=f"postgresql://shop@127.0.0.1:{free_port()}/shop")
        control = run([sys.executable, "-c",
                       "import shop\n"
                       "shop.app.conf.task_always_eager = True\n"
                       "shop.app.conf.resilience_socket_timeout_seconds = 1\n"
                       "try:\n    shop.charge.delay(1).get()\n"
                       "except Exception as exc:\n    print(type(exc).__name__)\n"
                       "print(shop.charged)\n"], tmp_path)
        assert control.returncode == 0, control.stderr[-3000:]
        # The idempotency guard fails closed on the unreachable PostgreSQL: deferred, not run.
        assert control.stdout.split() == ["JobDeferred", "[]"]
        for attempt in (1, 2):
            done = run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"],
                       tmp_path, timeout=200)
            assert done.returncode == 0, f"run {attempt}:\n{done.stdout[-4000:]}"
            assert "5 passed" in done.stdout, done.stdout[-2000:]
