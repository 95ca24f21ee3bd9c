"""Batches: jobs enqueued together whose callbacks run exactly once when all are final.

    from resilience.batches import batch

    b = batch(on_success=notify.s("ops"), on_complete=report.s(), description="May invoices")
    for invoice in invoices:
        b.add(send_invoice.s(invoice.id))
    result = b.apply_async()          # or b.apply_async_in(session): in your transaction

A batch is a durable workflow (`resilience.workflows`) of independent member steps and
callback steps that depend on all of them. Batches add the producer's side (`enqueue.py`)
and the batch view of the workflow tables (`summary.py`). See docs/batches.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from resilience.batches.enqueue import CALLBACK_HEADER, CALLBACK_KEY, Batch, BatchResult, batch
from resilience.batches.errors import BatchNotFound, InvalidBatch
from resilience.batches.summary import (
    COMPLETE,
    SUCCESS,
    BatchSummary,
    eager_summary,
    read_recent,
    read_summary,
)
from resilience.stores import MemoryStores
from resilience.workflows.eager import eager_backend_of

if TYPE_CHECKING:
    from resilience.stores import Stores


def describe(stores: Stores, batch_id: str) -> BatchSummary:
    """One batch of `stores` with its tallies and callbacks.

    Raises:
        BatchNotFound: no batch has this id.  StorageError: PostgreSQL cannot be read.
    """
    eager = eager_backend_of(stores)
    if isinstance(stores, MemoryStores) or eager.find(batch_id) is not None:
        return eager_summary(eager, batch_id)  # run in process (memory mode, eager)
    return read_summary(stores, batch_id)


def recent(stores: Stores, *, limit: int = 50,
           incomplete_only: bool = False) -> list[BatchSummary]:
    """The newest batches of `stores`, newest first.

    Raises:
        StorageError: PostgreSQL cannot be read.
    """
    eager = eager_backend_of(stores)
    ran = [eager_summary(eager, found.id) for found in eager.recent(limit=limit)
           if "batch" in eager.get(found.id).canvas]
    ran = [found for found in ran if not incomplete_only or not found.complete]
    if isinstance(stores, MemoryStores):
        return ran
    stored = read_recent(stores, limit=limit, incomplete_only=incomplete_only)
    return sorted([*ran, *stored], key=lambda found: found.created_at, reverse=True)[:limit]


__all__ = ["CALLBACK_HEADER", "CALLBACK_KEY", "COMPLETE", "SUCCESS", "Batch", "BatchNotFound",
           "BatchResult", "BatchSummary", "InvalidBatch", "batch", "describe", "recent"]
