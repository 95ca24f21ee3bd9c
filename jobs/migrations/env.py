"""Alembic environment: runs on the connection `jobs.db.migrate` hands over."""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine

import jobs.models  # noqa: F401 - registers the example tables on the metadata
from resilience.schema import metadata

config = context.config
connection = config.attributes.get("connection")

if connection is None:
    engine = create_engine(config.get_main_option("sqlalchemy.url"))
    with engine.connect() as connection:
        context.configure(connection=connection, target_metadata=metadata)
        with context.begin_transaction():
            context.run_migrations()
else:
    context.configure(connection=connection, target_metadata=metadata)
    with context.begin_transaction():
        context.run_migrations()
