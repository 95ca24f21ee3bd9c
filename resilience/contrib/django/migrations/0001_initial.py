"""The library's tables (`resilience_*`), through the library's own Alembic history.

`manage.py migrate` runs `resilience.migrations.upgrade` on the database being migrated
(Django's test databases included); reversing it runs `downgrade(url, "base")`. A database
that is not PostgreSQL, or not the one the library uses, is left alone.
"""

from __future__ import annotations

from typing import Any

from django.apps import apps as global_apps
from django.db import migrations

from resilience.contrib.django.apps import url_of
from resilience.migrations import downgrade, upgrade


def _url(schema_editor: Any) -> str | None:
    connection = schema_editor.connection
    alias = global_apps.get_app_config("resilience").database_alias
    if connection.alias != alias:
        return None
    return url_of(connection.settings_dict)


def forward(apps: Any, schema_editor: Any) -> None:
    url = _url(schema_editor)
    if url is not None:
        upgrade(url)


def reverse(apps: Any, schema_editor: Any) -> None:
    url = _url(schema_editor)
    if url is not None:
        downgrade(url, "base")


class Migration(migrations.Migration):
    atomic = False
    initial = True
    dependencies: list[tuple[str, str]] = []
    operations = [migrations.RunPython(forward, reverse)]
