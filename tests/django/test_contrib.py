"""`resilience.contrib.django` in small: the URL built from Django's settings, the AppConfig's
choices in a fresh process (Django configures once per process), and the guard's `session`
injection that lets an ORM body go without one.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import uuid
from typing import Any

import pytest
from sqlalchemy import make_url

from jobs import app as celery_app
from resilience.contrib.django.apps import url_of
from resilience.errors import ConfigurationError
from resilience.idempotency import IdempotencyConfig
from resilience.idempotency.backends import IN_PROGRESS
from resilience.idempotency.backends.postgres import backend_for
from resilience.idempotency.guard import IdempotencyGuard
from resilience.pipeline import Call, Pipeline
from tests.support import ROOT


class TestUrlOf:
    def test_a_postgresql_database_gives_its_url_with_the_password(self) -> None:
        """Every field survives quoting: a password with URL characters comes back intact."""
        url = url_of({"ENGINE": "django.db.backends.postgresql", "NAME": "shop",
                      "USER": "shop", "PASSWORD": "p@ss:w/rd%", "HOST": "db.internal",
                      "PORT": "6432", "OPTIONS": {"sslmode": "require", "pool": True}})
        assert url is not None
        parsed = make_url(url)
        assert (parsed.username, parsed.password, parsed.host, parsed.port, parsed.database) == (
            "shop", "p@ss:w/rd%", "db.internal", 6432, "shop")
        assert dict(parsed.query) == {"sslmode": "require"}  # only libpq's own options

    def test_a_socket_directory_becomes_the_host_parameter(self) -> None:
        url = url_of({"ENGINE": "django.db.backends.postgresql", "NAME": "shop",
                      "HOST": "/var/run/postgresql"})
        assert url is not None
        assert make_url(url).query == {"host": "/var/run/postgresql"}

    def test_another_engine_gives_none(self) -> None:
        assert url_of({"ENGINE": "django.db.backends.sqlite3", "NAME": "db.sqlite3"}) is None


#: A process with a Celery app and Django configured in code; prints what `ready()` did.
READY = textwrap.dedent('''
    import json, sys
    from celery import Celery
    from django.conf import settings
    import django
    from resilience.app import is_initialised

    app = Celery("probe", set_as_current={current})
    app.conf.resilience_redis_url = "redis://127.0.0.1:1/0"
    app.conf.update({conf})
    settings.configure(INSTALLED_APPS=["resilience.contrib.django"], DATABASES={databases},
                       {extra})
    try:
        django.setup()
    except Exception as exc:
        print(json.dumps({{"error": type(exc).__name__, "message": str(exc)}}))
        sys.exit(0)
    from resilience.stores import stores_for
    stores = stores_for(app)
    print(json.dumps({{"initialised": is_initialised(app),
                       "database_url": stores.database_url if stores.has_database else None,
                       "transactions": app.conf.get("resilience_transactions")}}))
''')

SQLITE = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}}
POSTGRES = {"default": {"ENGINE": "django.db.backends.postgresql", "NAME": "shop",
                        "USER": "shop", "PASSWORD": "s3cret", "HOST": "db", "PORT": "5432"}}


def ready(*, databases: dict[str, Any], conf: dict[str, Any] | None = None,
          current: bool = True, extra: str = "") -> dict[str, Any]:
    script = READY.format(current=current, conf=conf or {}, databases=databases, extra=extra)
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


class TestReady:
    def test_the_current_app_is_initialised_on_the_django_database(self) -> None:
        """The stores (built on first use) name DATABASES["default"], password included."""
        found = ready(databases=POSTGRES)
        assert found == {"initialised": True, "transactions": "django",
                         "database_url": "postgresql+psycopg2://shop:s3cret@db:5432/shop"}

    def test_an_explicit_database_url_is_kept(self) -> None:
        found = ready(databases=POSTGRES,
                      conf={"resilience_database_url": "postgresql://other@elsewhere/x"})
        assert found["database_url"] == "postgresql+psycopg2://other@elsewhere/x"

    def test_a_sqlite_default_leaves_redis_only_guards(self) -> None:
        """No PostgreSQL: initialised anyway, with no library database."""
        found = ready(databases=SQLITE)
        assert found == {"initialised": True, "transactions": "django", "database_url": None}

    def test_an_explicit_alias_that_is_not_postgresql_is_refused_in_one_line(self) -> None:
        found = ready(databases=SQLITE, conf={"resilience_django_database": "default"})
        assert found["error"] == "ConfigurationError"
        assert "needs PostgreSQL" in found["message"] and "\n" not in found["message"]

    def test_no_celery_app_is_refused(self) -> None:
        found = ready(databases=POSTGRES, current=False)
        assert found["error"] == "ConfigurationError"
        assert "RESILIENCE_CELERY_APP" in found["message"]

    def test_resilience_celery_app_names_the_app(self) -> None:
        found = ready(databases=POSTGRES, current=False,
                      extra='RESILIENCE_CELERY_APP="__main__:app"')
        assert found["initialised"] is True


@celery_app.task(name="tests.django.no_session")
def no_session(key: str) -> str:
    return key


class TestSessionInjection:
    def test_a_sqlalchemy_transaction_without_a_session_parameter_is_refused(
        self, stores: Any
    ) -> None:
        """Outside Django the transaction hands a SQLAlchemy session: a body that declares
        no `session` would write outside it, so the call fails with ConfigurationError
        before the body runs, and the claim is given back (its lease ended)."""
        backend = backend_for(stores)
        guard = IdempotencyGuard(IdempotencyConfig(key="{key}", transactional=True,
                                                   cache=False), backend)
        guard.bind(no_session)
        ran: list[str] = []
        key = uuid.uuid4().hex
        call = Call(task=no_session, args=(key,), kwargs={}, request=None)
        with pytest.raises(ConfigurationError, match="declare `session=None`"):
            Pipeline([guard]).run(call, lambda: ran.append(key))
        assert ran == []
        record = backend.read(no_session.name, key)
        assert record is not None and record.state == IN_PROGRESS
        assert record.lease_owner is None  # released: a fixed task claims it at once
