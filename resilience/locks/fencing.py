"""Fencing tokens: a number per acquisition that only grows, and a check at the resource.

Tokens come from one PostgreSQL sequence, not from the Redis nodes (why: docs/locks.md). A
token minted *after* the lock is granted still orders holders correctly, timeline:

    A: lock granted at t0 (valid until t0+ttl-drift)   A: mint → 41 at t1
    A: checks t1 < t0+ttl-drift, else gives the lock up and fails the acquisition
    B: can only be granted after A's lease expired (> t0+ttl > t1), so B mints → 42 > 41
    A (paused, resumes): writes with 41 → the resource has seen 42 → StaleFencingToken

`FencingTokens.guard_write` is the resource side: inside the caller's transaction it raises
the key's high-water mark to the token, or raises `StaleFencingToken` so the transaction
rolls back; the mark's row lock serializes two writers of one key.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from celery._state import get_current_task
from sqlalchemy import text

from resilience.connections import wrap_store_errors
from resilience.errors import StaleFencingToken
from resilience.locks.backends.memory import memory_fencing
from resilience.stores import MemoryStores, stores_for

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection, Engine

    from resilience.locks.backends.memory import MemoryFencingTokens

_ADVANCE = text(
    """
    INSERT INTO resilience_fencing_marks (key, token, updated_at)
    VALUES (:key, :token, now())
    ON CONFLICT (key) DO UPDATE
        SET token = EXCLUDED.token, updated_at = now()
        WHERE resilience_fencing_marks.token <= EXCLUDED.token
    RETURNING token
    """
)
_NEWEST = text("SELECT token FROM resilience_fencing_marks WHERE key = :key")


class FencingTokens:
    """Mints tokens from a PostgreSQL sequence and checks them at a PostgreSQL resource.

    Args:
        engine: the durable store (the migration `0002_locks` creates the sequence/table).
    """

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def mint(self, key: str) -> int:
        """A new token, larger than every token minted before (for any key).

        Raises:
            StoreUnavailable / StoreRejected / StorageError: PostgreSQL failed (wraps the
                cause).
        """
        with (
            wrap_store_errors("minting a fencing token", key=key),
            self.engine.connect() as connection,
        ):
            token = connection.execute(text("SELECT nextval('resilience_fencing_token_seq')"))
            return int(token.scalar_one())

    @staticmethod
    def guard_write(connection: Connection, key: str, token: int) -> None:
        """Admit a write to `key` in the caller's open transaction only if `token` is newest.

        Call it in the same transaction as the write; the high-water mark commits or rolls
        back with it. Equal tokens pass (one holder may write many times). Inside a task
        whose app's stores are in memory (`resilience.testing`), the in-memory marks are
        checked instead and `connection` is not used.

        Raises:
            StaleFencingToken: a newer token was already seen for `key`.
        """
        if token is None:
            raise StaleFencingToken(f"write to {key!r} carries no fencing token", key=key)
        memory = _memory_twin()
        if memory is not None:
            newest = memory.advance(key, int(token))
            if newest is None:
                return
        elif connection.execute(_ADVANCE, {"key": key, "token": int(token)}).first() is None:
            newest = connection.execute(_NEWEST, {"key": key}).scalar()
        else:
            return
        raise StaleFencingToken(
            f"write to {key!r} refused: fencing token {token} is older than {newest}, "
            "the newest seen; this holder lost its lock", key=key, token=int(token), newest=newest)

    def newest(self, key: str) -> int | None:
        """The newest token a resource has accepted for `key` (None: never written)."""
        with (
            wrap_store_errors("reading a fencing mark", key=key),
            self.engine.connect() as connection,
        ):
            return connection.execute(_NEWEST, {"key": key}).scalar()


def _memory_twin() -> MemoryFencingTokens | None:
    """The in-memory fencing marks of the running task's app when its stores are in
    memory; None otherwise (no task running, or real stores)."""
    task = get_current_task()
    if task is None or getattr(task, "app", None) is None:
        return None
    try:
        stores = stores_for(task.app)
    except Exception:  # noqa: BLE001 - an app without resilience stores: the real path
        return None
    return memory_fencing(stores) if isinstance(stores, MemoryStores) else None
