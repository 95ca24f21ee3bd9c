"""Cancelling jobs: a PostgreSQL row (the record) and a copy every worker reads (the guard's).

PostgreSQL is the truth, and the copy follows it in the record's order: every write of the
copy (a cancel, a withdrawal, a restore) happens inside the PostgreSQL transaction that
changed or read the rows, under one transaction-level advisory lock. So a restore that read
a row cannot write its mark back after an operator withdrew it, and a restore never erases
a cancellation committed after its read. A cancel or withdrawal that finds the copy lost
restores it whole: workers would take one mark in an empty store for the complete set.
See docs/operations.md, "Cancellation that sticks".
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import insert

from resilience.cancel.backends import CancelBackend, id_target, key_target
from resilience.cancel.models import cancellations
from resilience.connections import wrap_store_errors
from resilience.errors import ConfigurationError, StorageError

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection, Engine

logger = logging.getLogger("resilience.cancel")

#: The transaction-level advisory lock every write of the copy holds (see the module doc).
_LOCK = sa.text("SELECT pg_advisory_xact_lock(hashtextextended('resilience:cancellations', 0))")

#: How long a cancellation lasts unless told: a week, longer than any countdown the platform
#: accepts and than the broker's visibility timeout.
DEFAULT_TTL_SECONDS = 7 * 24 * 3600.0


@dataclass(frozen=True)
class Cancellation:
    """One live cancellation, as `describe()` lists it."""

    target: str
    task_name: str | None
    task_id: str | None
    key: str | None
    reason: str
    created_at: dt.datetime
    expires_at: dt.datetime


class Cancellations:
    """The operator's side of cancellation (`jobs cancel`).

    Args:
        engine: the PostgreSQL engine holding the record.
        backend: where workers read the copies (Redis on the platform).
        ttl_seconds: how long a cancellation lasts (>= the broker's visibility timeout).
    """

    def __init__(self, engine: Engine, backend: CancelBackend,
                 ttl_seconds: float = DEFAULT_TTL_SECONDS) -> None:
        if not ttl_seconds > 0:
            raise ConfigurationError(f"ttl_seconds must be > 0, got {ttl_seconds!r}")
        self.engine = engine
        self.backend = backend
        self.ttl_seconds = ttl_seconds

    def cancel_job(self, task_id: str, *, reason: str = "cancelled by an operator") -> str:
        """Cancel one job by its task id; returns the target written.

        Raises:
            ConfigurationError: an empty task id.
            StorageError: PostgreSQL or the copy's store failed (the row, once written,
                stays: `restore()` writes the copy later).
        """
        if not task_id:
            raise ConfigurationError("cancel needs a task id")
        return self._write(id_target(task_id), reason, task_id=task_id)

    def cancel_key(self, task_name: str, key: str, *,
                   reason: str = "cancelled by an operator") -> str:
        """Cancel every job of `task_name` whose cancel key is `key` (the task's
        `cancel_key` template rendered with its arguments)."""
        if not task_name or not key:
            raise ConfigurationError("cancel by key needs a task name and a key")
        return self._write(key_target(task_name, key), reason, task_name=task_name, key=key)

    def _write(self, target: str, reason: str, *, task_id: str | None = None,
               task_name: str | None = None, key: str | None = None) -> str:
        expires = sa.func.now() + dt.timedelta(seconds=self.ttl_seconds)
        row = {"target": target, "task_id": task_id, "task_name": task_name, "key": key,
               "reason": reason, "expires_at": expires}
        statement = insert(cancellations).values(**row).on_conflict_do_update(
            index_elements=["target"], set_={"reason": reason, "expires_at": expires},
        ).returning(sa.func.extract("epoch", cancellations.c.expires_at))
        with wrap_store_errors("cancellation record", target=target), \
                self.engine.begin() as connection:
            connection.execute(_LOCK)
            until = float(connection.execute(statement).scalar_one())
            # The copy carries the record's own expiry, so restore() finds nothing to rewrite.
            failed = self._copy(connection, lambda: self.backend.cancel(
                target, reason=reason, expires_at=until))
        if failed is not None:
            raise failed  # the row is committed: restore() writes the copy later
        logger.info("cancelled %s: %s", target, reason)
        return target

    def uncancel(self, target: str) -> bool:
        """Withdraw a cancellation (jobs not yet stopped by it run again).

        Raises:
            StorageError: PostgreSQL or the copy's store failed (a withdrawn row stays
                withdrawn: the next restore() removes its mark).
        """
        marked: list[bool] = []
        with wrap_store_errors("cancellation record", target=target), \
                self.engine.begin() as connection:
            connection.execute(_LOCK)
            removed = connection.execute(
                cancellations.delete().where(cancellations.c.target == target)).rowcount
            failed = self._copy(connection, lambda: marked.append(self.backend.uncancel(target)))
        if failed is not None:
            raise failed
        return any(marked) or bool(removed)

    def _copy(self, connection: Connection, write: Callable[[], object]) -> StorageError | None:
        """Write the copy inside the record's transaction: `write` when the copy is kept,
        the whole copy when it was lost. Returns the copy's error instead of raising it, so
        the record's change commits all the same."""
        try:
            if self.backend.version():
                write()
            else:
                logger.warning("cancellations: the copy was lost; restoring it from the record")
                self._sync(connection)
        except StorageError as error:
            return error
        return None

    def describe(self, *, limit: int = 100) -> list[Cancellation]:
        """Live cancellations, newest first."""
        query = (sa.select(cancellations).where(cancellations.c.expires_at > sa.func.now())
                 .order_by(cancellations.c.id.desc()).limit(limit))
        with wrap_store_errors("cancellations"), self.engine.connect() as connection:
            return [Cancellation(**{k: v for k, v in row._mapping.items() if k != "id"})
                    for row in connection.execute(query)]

    def restore(self) -> int:
        """Make the copy the live cancellations of the record, dropping expired rows and
        marks without a row. Returns how many cancellations are live.

        Raises:
            StorageError: PostgreSQL or the copy's store failed.
        """
        with wrap_store_errors("cancellations"), self.engine.begin() as connection:
            connection.execute(_LOCK)
            return self._sync(connection)

    def restore_if_lost(self) -> bool:
        """`restore()` only when the copy has lost its version: the cancel guard's call, so
        the first worker to see the loss restores it and the others find it done. Returns
        True when this call restored it.

        Raises:
            StorageError: PostgreSQL or the copy's store failed.
        """
        with wrap_store_errors("cancellations"), self.engine.begin() as connection:
            connection.execute(_LOCK)
            if self.backend.version():
                return False
            live = self._sync(connection)
        logger.warning("cancellations: the copy was lost; restored %d from the record", live)
        return True

    def _sync(self, connection: Connection) -> int:
        """The copy made equal to the live rows (under `_LOCK`, in the caller's transaction);
        written only when it differs or has no version, so workers reload only on change."""
        expired = cancellations.c.expires_at <= sa.func.now()
        connection.execute(cancellations.delete().where(expired))
        rows = connection.execute(sa.select(
            cancellations.c.target, cancellations.c.reason,
            sa.func.extract("epoch", cancellations.c.expires_at).label("until"),
        )).all()
        live = {target: (reason, float(until)) for target, reason, until in rows}
        version, marks = self.backend.load()
        if not version or marks != live:
            self.backend.replace(live)
        return len(live)
