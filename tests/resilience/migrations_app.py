"""A user's Celery app for `python -m resilience migrate -A` (tests/resilience/test_migrations.py):
its `resilience_database_url` comes from the environment the test sets."""

from __future__ import annotations

import os

from celery import Celery

app = Celery("migrations_app", broker="memory://", set_as_current=False)
app.conf.resilience_database_url = os.environ.get("MIGRATIONS_APP_URL")
