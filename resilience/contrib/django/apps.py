"""The Django app that binds `resilience` to the project's Celery app."""

from __future__ import annotations

import logging
from typing import Any

from celery import Celery, _state
from django.apps import AppConfig
from django.conf import settings
from django.db import connections
from django.utils.module_loading import import_string
from sqlalchemy.engine import URL

import resilience
from resilience.contrib.django.transaction import DjangoTransaction
from resilience.errors import ConfigurationError
from resilience.stores import Integration, register_integration

logger = logging.getLogger("resilience.contrib.django")

#: libpq connection parameters of a Django `OPTIONS` dict carried into the library's URL.
_LIBPQ_OPTIONS = (
    "sslmode", "sslcert", "sslkey", "sslrootcert", "sslcrl", "connect_timeout",
    "application_name", "options", "target_session_attrs", "passfile", "service",
    "keepalives", "keepalives_idle", "keepalives_interval", "keepalives_count",
)


class ResilienceConfig(AppConfig):
    """`INSTALLED_APPS += ["resilience.contrib.django"]`: `ready()` initialises the library.

    Settings read: `RESILIENCE_CELERY_APP` ("proj.celery:app"; unset: Celery's current app,
    which the standard layout's `proj/__init__.py` makes current), and through the Celery
    app's own configuration `CELERY_RESILIENCE_*` (`resilience_redis_url`, ...);
    `CELERY_RESILIENCE_DJANGO_DATABASE` names the Django database (alias, default
    "default") whose PostgreSQL keeps the library's records unless
    `CELERY_RESILIENCE_DATABASE_URL` is set (its URL is read when the stores are first
    built, so a test run's records go to Django's test database).
    """

    name = "resilience.contrib.django"
    label = "resilience"
    verbose_name = "Resilience"
    default_auto_field = "django.db.models.AutoField"

    #: The Django database alias transactional bodies and the library's records use.
    database_alias = "default"
    #: The Celery app `ready()` initialised.
    celery_app: Celery | None = None

    def ready(self) -> None:
        """Register the Django integration (its database, `transaction.atomic` bodies),
        find the Celery app, give it the Django database, and call `init_app`.

        Raises:
            ConfigurationError: `RESILIENCE_CELERY_APP` does not name a Celery app, or
                `CELERY_RESILIENCE_DJANGO_DATABASE` names a missing or non-PostgreSQL one.
        """
        register_integration("django", Integration(
            database_url=lambda alias: database_url(alias, required=False),
            begin=DjangoTransaction))
        app = self.celery_app = celery_app(getattr(settings, "RESILIENCE_CELERY_APP", None))
        conf = app.conf
        explicit = conf.get("resilience_django_database")
        alias = explicit or "default"
        self.database_alias = alias
        if not conf.get("resilience_database_url"):
            # Checked now; the URL itself is read when the stores are built
            # (`Stores.from_conf`), after Django's test runner renamed the test database.
            database_url(alias, required=bool(explicit))
        conf.resilience_transactions = "django"
        conf.resilience_django_database = alias
        resilience.init_app(app)


def celery_app(path: str | None) -> Celery:
    """The Celery app `path` ("module:attribute") names, or Celery's current app.

    Raises:
        ConfigurationError: `path` cannot be imported or is no Celery app, or no app was
            created (Celery's fallback default app is never the project's).
    """
    if path:
        try:
            app = import_string(path.replace(":", "."))
        except ImportError as exc:
            raise ConfigurationError(
                f"RESILIENCE_CELERY_APP={path!r} cannot be imported: {exc}"
            ) from None
        if not isinstance(app, Celery):
            raise ConfigurationError(
                f"RESILIENCE_CELERY_APP={path!r} is a {type(app).__name__}, not a Celery app"
            )
        return app
    app = _state._tls.current_app
    if app is None:
        raise ConfigurationError(
            "resilience.contrib.django found no Celery app: import it in your project's "
            "__init__.py (from .celery import app as celery_app) or set "
            "RESILIENCE_CELERY_APP = 'proj.celery:app'"
        )
    return app


def database_url(alias: str = "default", *, required: bool = True) -> str | None:
    """A PostgreSQL URL (password included) for the Django database `alias`.

    Args:
        alias: a key of `settings.DATABASES`.
        required: False: a missing or non-PostgreSQL database gives None (Redis-only
            guards need none); True: it raises.

    Raises:
        ConfigurationError: `required` and `alias` is missing or not PostgreSQL.
    """
    try:
        settings_dict = connections.settings[alias]
    except Exception:  # noqa: BLE001 - Django raises its own ConnectionDoesNotExist
        if not required:
            return None
        raise ConfigurationError(
            f"CELERY_RESILIENCE_DJANGO_DATABASE={alias!r} is not a key of DATABASES"
        ) from None
    url = url_of(settings_dict)
    if url is None and required:
        raise ConfigurationError(
            f"resilience needs PostgreSQL: DATABASES[{alias!r}] uses "
            f"{settings_dict.get('ENGINE')!r}; set CELERY_RESILIENCE_DATABASE_URL"
        )
    if url is None:
        logger.info("DATABASES[%r] is not PostgreSQL: only Redis guards are available", alias)
    return url


def url_of(settings_dict: dict[str, Any]) -> str | None:
    """The PostgreSQL URL of one Django database's settings; None when not PostgreSQL."""
    if not str(settings_dict.get("ENGINE", "")).endswith(("postgresql", "postgis")):
        return None
    host = settings_dict.get("HOST") or None
    query: dict[str, str] = {}
    if host and host.startswith("/"):
        query["host"], host = host, None  # a Unix socket directory
    options = settings_dict.get("OPTIONS") or {}
    for name in _LIBPQ_OPTIONS:
        if options.get(name) is not None:
            query[name] = str(options[name])
    port = settings_dict.get("PORT")
    return URL.create(
        "postgresql",
        username=settings_dict.get("USER") or None,
        password=settings_dict.get("PASSWORD") or None,
        host=host,
        port=int(port) if port else None,
        database=settings_dict.get("NAME") or None,
        query=query,
    ).render_as_string(hide_password=False)
