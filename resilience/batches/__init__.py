"""Batches: jobs enqueued together whose callbacks run exactly once when all are final.

    from resilience.batches import batch

    b = batch(on_success=notify.s("ops"), on_complete=report.s(), description="May invoices")
    for invoice in invoices:
        b.add(send_invoice.s(invoice.id))
    result = b.apply_async()          # or b.apply_async_in(session): in your transaction

The batch and its members are written in one PostgreSQL transaction with the members'
outbox rows (`enqueue.py`); each member's final state is recorded once, however often it is
delivered (`guard.py`, `signals.py`); the transaction that records the last one writes the
callbacks to the outbox (`backends/postgres.py`, `callbacks.py`). `jobs batches list/show`
show them (`describe`, `recent`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from resilience.batches.backends import (
    FINAL_STATES,
    SUCCESS_STATES,
    BatchBackend,
    BatchSummary,
    MemberState,
    NewBatch,
    NewMember,
    Recorded,
)
from resilience.batches.backends.memory import MemoryBatchBackend
from resilience.batches.backends.postgres import backend_for
from resilience.batches.callbacks import CALLBACK_HEADER, CALLBACK_KEY, COMPLETE, SUCCESS
from resilience.batches.enqueue import Batch, BatchResult, batch
from resilience.batches.errors import BatchNotFound, InvalidBatch
from resilience.batches.guard import (
    BatchConfig,
    BatchGuard,
    BatchStage,
    BatchTransactionGuard,
    batch_guards,
    state_of_error,
    state_of_stop,
)

if TYPE_CHECKING:
    from resilience.stores import Stores


def describe(stores: Stores, batch_id: str) -> BatchSummary:
    """One batch of `stores` with its tallies and callbacks.

    Raises:
        BatchNotFound: no batch has this id.  StorageError: PostgreSQL cannot be read.
    """
    return stores.backend("batches", backend_for, memory=MemoryBatchBackend).summary(batch_id)


def recent(stores: Stores, *, limit: int = 50,
           incomplete_only: bool = False) -> list[BatchSummary]:
    """The newest batches of `stores`, newest first.

    Raises:
        StorageError: PostgreSQL cannot be read.
    """
    backend = stores.backend("batches", backend_for, memory=MemoryBatchBackend)
    return backend.recent(limit=limit, incomplete_only=incomplete_only)


__all__ = [
    "CALLBACK_HEADER",
    "CALLBACK_KEY",
    "COMPLETE",
    "FINAL_STATES",
    "SUCCESS",
    "SUCCESS_STATES",
    "Batch",
    "BatchBackend",
    "BatchConfig",
    "BatchGuard",
    "BatchNotFound",
    "BatchResult",
    "BatchStage",
    "BatchSummary",
    "BatchTransactionGuard",
    "InvalidBatch",
    "MemberState",
    "NewBatch",
    "NewMember",
    "Recorded",
    "batch",
    "batch_guards",
    "describe",
    "recent",
    "state_of_error",
    "state_of_stop",
]
