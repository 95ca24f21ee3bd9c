"""`TEST_RUNNER = "resilience.contrib.django.test.DiscoverRunner"`: Django's own runner, which
first closes the connections the library holds to the test databases, so they can be dropped.
"""

from __future__ import annotations

from typing import Any

from django.apps import apps
from django.test.runner import DiscoverRunner as _DjangoRunner


class DiscoverRunner(_DjangoRunner):
    """Django's `DiscoverRunner`; `close_connections()` before the test databases are dropped
    (PostgreSQL refuses to drop a database another session is connected to)."""

    def teardown_databases(self, old_config: Any, **kwargs: Any) -> None:
        close_connections()
        super().teardown_databases(old_config, **kwargs)


def close_connections() -> None:
    """Close the library's PostgreSQL connections of this thread and process: the
    idempotency backend's thread connection and the stores' engines (Redis is untouched)."""
    app = getattr(apps.get_app_config("resilience"), "celery_app", None)
    stores = getattr(app, "resilience_stores", None) if app is not None else None
    cache = getattr(stores, "_cache", None) or {}
    if cache.get("statements") is not None:
        cache["statements"].close()
    engine = cache.get("engine")
    if engine is not None:
        engine.dispose()
