"""Transactional enqueue (the outbox) and long delays.

    with Session(engine) as session, session.begin():
        session.add(order)
        charge.enqueue_in(session, order.id)      # an AsyncResult, at once
    # committed: the relay publishes the job; rolled back: there never was a job

`enqueue.py` writes the row in the caller's transaction, `relay.py` publishes committed
rows; a countdown beyond `resilience_max_countdown_seconds` takes the same table. See
docs/outbox.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from resilience.headers import OUTBOX_HEADER
from resilience.outbox.backends import NewRow, OutboxBackend, OutboxRow, OutboxState
from resilience.outbox.backends.memory import MemoryOutboxBackend
from resilience.outbox.backends.postgres import backend_for
from resilience.outbox.enqueue import ORDERING_KEY_OPTION, delay_seconds_of, write
from resilience.outbox.relay import Relay, RelayConfig, RelayReport

if TYPE_CHECKING:
    from resilience.stores import Stores


def describe(stores: Stores) -> OutboxState:
    """Live outbox state of `stores`: pending, due, lag, published in the last minute.

    Raises:
        StoreUnavailable, StorageError: the outbox cannot be read.
    """
    return stores.backend("outbox", backend_for, memory=MemoryOutboxBackend).describe()


__all__ = ["ORDERING_KEY_OPTION", "OUTBOX_HEADER", "NewRow", "OutboxBackend", "OutboxRow",
           "OutboxState", "Relay", "RelayConfig", "RelayReport", "delay_seconds_of", "describe",
           "write"]
