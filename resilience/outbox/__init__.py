"""Transactional enqueue (the outbox) and long delays.

    with Session(engine) as session, session.begin():
        session.add(order)
        charge.enqueue_in(session, order.id)      # an AsyncResult, at once
    # committed: the relay publishes the job; rolled back: there never was a job

`task.apply_async_in(session, args, kwargs, **options)` / `task.enqueue_in(session, ...)`
write a row in the caller's transaction (`enqueue.py`); `jobs outbox relay` publishes the
committed rows (`relay.py`); `apply_async` with a countdown beyond the app's
`resilience_max_countdown_seconds` is written to the same table and published when due.
`describe(stores)` reports what is pending, the lag, and what was published recently.
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


__all__ = [
    "ORDERING_KEY_OPTION",
    "OUTBOX_HEADER",
    "NewRow",
    "OutboxBackend",
    "OutboxRow",
    "OutboxState",
    "Relay",
    "RelayConfig",
    "RelayReport",
    "delay_seconds_of",
    "describe",
    "write",
]
