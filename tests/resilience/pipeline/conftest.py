"""Fixtures of the pipeline tests: their tables exist before any test runs."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import text


@pytest.fixture(scope="package", autouse=True)
def tables(stores: Any) -> None:
    # Imported here, not at the top: pytest loads this file before the session's services
    # exist, and importing the tasks builds the app from the environment.
    from tests.resilience.pipeline.tasks import CREATE_TABLES

    with stores.engine().begin() as connection:
        connection.execute(text(CREATE_TABLES))
