"""The outbox's storage: the Protocol and values (`base`), the PostgreSQL backend for
production (`postgres`), the in-memory one for unit tests (`memory`);
`resilience.outbox.relay.outbox_backend` picks the app's.

The relay's flow (`resilience.outbox.relay`) never sees SQL: it asks the backend for a
batch of publishable rows (locked for it alone), and tells the batch what became of each.
PostgreSQL is the one backend for production: the rows must live in the database the
producers write their own data to, or the insert could not share their transaction. The
memory backend publishes them when the caller's transaction commits (`resilience.testing`).
"""

from __future__ import annotations

from resilience.outbox.backends.base import (
    Batch,
    NewRow,
    OutboxBackend,
    OutboxRow,
    OutboxState,
)

__all__ = ["Batch", "NewRow", "OutboxBackend", "OutboxRow", "OutboxState"]
