"""Cancelling jobs: a PostgreSQL row (the record) and a copy every worker reads (the guard's).

`cancel_job` / `cancel_key` write the row first, then the copy in the fast backend (Redis) with
the same expiry. A worker restart, a redelivery or a new worker changes nothing: every
execution checks the copy before it starts. If the copy is lost (Redis flushed, failed over)
`restore()` writes the copies of every live row again; the platform's beat runs it
periodically and `jobs cancel --sync` runs it at once.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import insert

from resilience.cancel.backends import CancelBackend, id_target, key_target
from resilience.cancel.models import cancellations
from resilience.errors import ConfigurationError
from resilience.stores import wrap_store_errors

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine

logger = logging.getLogger("resilience.cancel")

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
            until = float(connection.execute(statement).scalar_one())
        # The copy carries the record's own expiry, so restore() finds nothing to rewrite.
        self.backend.cancel(target, reason=reason, expires_at=until)
        logger.info("cancelled %s: %s", target, reason)
        return target

    def uncancel(self, target: str) -> bool:
        """Withdraw a cancellation (jobs not yet stopped by it run again)."""
        with wrap_store_errors("cancellation record", target=target), \
                self.engine.begin() as connection:
            removed = connection.execute(
                cancellations.delete().where(cancellations.c.target == target)).rowcount
        return bool(self.backend.uncancel(target)) or bool(removed)

    def describe(self, *, limit: int = 100) -> list[Cancellation]:
        """Live cancellations, newest first."""
        query = (sa.select(cancellations).where(cancellations.c.expires_at > sa.func.now())
                 .order_by(cancellations.c.id.desc()).limit(limit))
        with wrap_store_errors("cancellations"), self.engine.connect() as connection:
            return [Cancellation(**{k: v for k, v in row._mapping.items() if k != "id"})
                    for row in connection.execute(query)]

    def restore(self) -> int:
        """Write the copy of every live cancellation again and drop expired ones, from the
        record and from the copy. Returns how many copies were written."""
        now = sa.func.now()
        with wrap_store_errors("cancellations"), self.engine.begin() as connection:
            connection.execute(cancellations.delete().where(cancellations.c.expires_at <= now))
            rows = connection.execute(sa.select(
                cancellations.c.target, cancellations.c.reason,
                sa.func.extract("epoch", cancellations.c.expires_at).label("until"),
            )).all()
        _, marks = self.backend.load()
        for target, reason, until in rows:
            if marks.get(target) != (reason, float(until)):
                self.backend.cancel(target, reason=reason, expires_at=float(until))
        self.backend.prune(now=time.time())
        return len(rows)
