"""Read and purge idempotency records, for the admin commands and the dashboard."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy.exc import DBAPIError

from resilience.idempotency.models import IN_PROGRESS, TABLE_NAME
from resilience.idempotency.store import wrap_database_error

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine

_FIELDS = (
    "task_name, key, fingerprint, state, result, error, attempt, lease_owner, "
    "lease_expires_at, task_id, created_at, updated_at, expires_at"
)


@dataclass(frozen=True)
class Record:
    """One idempotency record as stored."""

    task_name: str
    key: str
    fingerprint: str
    state: str
    result: Any
    error: str | None
    attempt: int
    lease_owner: str | None
    lease_expires_at: datetime | None
    task_id: str | None
    created_at: datetime
    updated_at: datetime
    expires_at: datetime


def _query(engine: Engine, sql: str, parameters: dict[str, Any]) -> list[Record]:
    try:
        with engine.connect() as connection:
            rows = connection.exec_driver_sql(sql, parameters).all()
    except DBAPIError as exc:
        raise wrap_database_error(exc, "read") from exc
    return [Record(*row) for row in rows]


def find(engine: Engine, task_name: str, key: str) -> Record | None:
    """The record of `key` under `task_name`, or None."""
    rows = _query(
        engine,
        f"SELECT {_FIELDS} FROM {TABLE_NAME} WHERE task_name = %(t)s AND key = %(k)s",
        {"t": task_name, "k": key},
    )
    return rows[0] if rows else None


def recent(
    engine: Engine, *, limit: int = 20, task_name: str | None = None, state: str | None = None
) -> list[Record]:
    """The most recently updated records, newest first, optionally of one task or state."""
    return _query(
        engine,
        f"SELECT {_FIELDS} FROM {TABLE_NAME} "
        "WHERE (%(t)s::text IS NULL OR task_name = %(t)s) "
        "AND (%(s)s::text IS NULL OR state = %(s)s) "
        "ORDER BY updated_at DESC LIMIT %(n)s",
        {"t": task_name, "s": state, "n": int(limit)},
    )


def purge(engine: Engine, task_name: str, key: str, *, force: bool = False) -> bool:
    """Delete one record so the key runs again; an open claim only with `force`.

    Returns:
        True when a record was deleted.
    """
    guard = "" if force else f" AND state <> '{IN_PROGRESS}'"
    try:
        with engine.begin() as connection:
            deleted = connection.exec_driver_sql(
                f"DELETE FROM {TABLE_NAME} WHERE task_name = %(t)s AND key = %(k)s{guard}",
                {"t": task_name, "k": key},
            ).rowcount
    except DBAPIError as exc:
        raise wrap_database_error(exc, "purge") from exc
    return deleted > 0
