"""The outbox's storage: the Protocol and values (`base`, which explains the split), the
PostgreSQL backend (`postgres`) and the in-memory one (`memory`)."""

from __future__ import annotations

from resilience.outbox.backends.base import Batch, NewRow, OutboxBackend, OutboxRow, OutboxState

__all__ = ["Batch", "NewRow", "OutboxBackend", "OutboxRow", "OutboxState"]
