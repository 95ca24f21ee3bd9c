"""The outbox's storage: the Protocol and values (`base`), the PostgreSQL backend for
production (`postgres`), the in-memory one for unit tests (`memory`), and `outbox_backend`,
which picks the app's.

The relay's flow (`resilience.outbox.relay`) never sees SQL: it asks the backend for a
batch of publishable rows (locked for it alone), and tells the batch what became of each.
PostgreSQL is the one backend for production: the rows must live in the database the
producers write their own data to, or the insert could not share their transaction. The
memory backend publishes them when the caller's transaction commits (`resilience.testing`).
"""

from __future__ import annotations

from typing import Any

from resilience.outbox.backends.base import (
    Batch,
    NewRow,
    OutboxBackend,
    OutboxRow,
    OutboxState,
)
from resilience.outbox.backends.memory import MemoryOutboxBackend
from resilience.outbox.backends.postgres import backend_for
from resilience.stores import stores_for

__all__ = ["Batch", "NewRow", "OutboxBackend", "OutboxRow", "OutboxState", "outbox_backend"]


def outbox_backend(app: Any) -> OutboxBackend:
    """The outbox of `app`'s stores: PostgreSQL, or the in-memory one (publishing through
    `app` when the caller's transaction commits) with `MemoryStores`."""
    backend = stores_for(app).backend("outbox", backend_for, memory=MemoryOutboxBackend)
    if isinstance(backend, MemoryOutboxBackend):
        backend.bind(app)
    return backend
