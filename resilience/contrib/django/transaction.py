"""`transactional=True` under Django: the body in `transaction.atomic`, the record with it."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

from django.db import DatabaseError, connections, transaction

from resilience.connections import translate_store_error
from resilience.idempotency.backends import Claim
from resilience.idempotency.backends.postgres import COMPLETE_SQL

logger = logging.getLogger("resilience.contrib.django")


class _RolledBack(Exception):
    """Handed to `atomic.__exit__` so it rolls back instead of committing."""


@contextmanager
def _database_errors(action: str) -> Iterator[None]:
    """Django's database errors leave as the library's `StorageError`s."""
    try:
        yield
    except DatabaseError as exc:
        native = exc.__cause__ or exc  # Django wraps the driver's error
        raise translate_store_error(native, f"idempotency store: {action}") from exc


class DjangoTransaction:
    """The body's transaction: `django.db.transaction.atomic(using=alias)`, entered when
    the guard opens it and left when it commits or closes, in the thread the body runs in.

    The body writes with the ORM (no `session`: it is None); `complete` records the claim's
    success through the same Django connection, so the ORM writes and the record commit
    once, together. Nested `atomic()` blocks in the body become savepoints, and
    `transaction.on_commit` callbacks run after this commit.

    Args:
        alias: the Django database (it must hold the library's tables: `manage.py migrate`).
    """

    #: No SQLAlchemy session: a body under Django writes through the ORM.
    session = None

    def __init__(self, alias: str = "default") -> None:
        self.alias = alias
        self._connection = connections[alias]
        self._atomic = transaction.atomic(using=alias)
        with _database_errors("open transaction"):
            self._atomic.__enter__()
        self._open = True

    def complete(self, claim: Claim | None, result_json: str, ttl_seconds: float) -> bool:
        """Record `claim`'s success in this transaction; False when it was taken over."""
        if claim is None:
            return True
        parameters = {**claim.parameters(), "result": result_json,
                      "ttl_seconds": float(ttl_seconds)}
        with _database_errors("commit"), self._connection.cursor() as cursor:
            cursor.execute(COMPLETE_SQL, parameters)
            return cursor.rowcount == 1

    def commit(self) -> None:
        """Leave `atomic` normally: the ORM writes and the record commit together."""
        self._open = False
        with _database_errors("commit"):
            self._atomic.__exit__(None, None, None)

    def close(self) -> None:
        """Roll back what was not committed; never raises."""
        if not self._open:
            return
        self._open = False
        try:
            self._atomic.__exit__(_RolledBack, _RolledBack(), None)
        except Exception as exc:  # noqa: BLE001 - rollback of a broken connection
            logger.warning("idempotency transaction cleanup: %s", exc)
