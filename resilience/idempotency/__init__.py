"""Idempotent execution (`@idempotent`) and unique enqueue (`@unique`).

    @app.task(tier="critical")
    @idempotent(key="transfer:{transfer_id}", transactional=True)
    def transfer(transfer_id, amount, session=None): ...

Records live in PostgreSQL (`backends.postgres`, or `backends.memory` in one process), a
Redis cache replays finished keys in one round trip, and `describe(stores)` reports what is
on now (records by state, the open claims' holders, the cache's size).
"""

from resilience.idempotency.backends import (
    Claim,
    ClaimResult,
    IdempotencyBackend,
    Record,
    Transaction,
)
from resilience.idempotency.backends.memory import MemoryIdempotencyBackend
from resilience.idempotency.config import IdempotencyConfig
from resilience.idempotency.guard import IdempotencyGuard, idempotent, is_retryable
from resilience.idempotency.records import (
    IdempotencyRecords,
    IdempotencyState,
    describe,
    records_for,
)
from resilience.idempotency.unique import UniqueConfig, unique

__all__ = [
    "Claim",
    "ClaimResult",
    "IdempotencyBackend",
    "IdempotencyConfig",
    "IdempotencyGuard",
    "IdempotencyRecords",
    "IdempotencyState",
    "MemoryIdempotencyBackend",
    "Record",
    "Transaction",
    "UniqueConfig",
    "describe",
    "idempotent",
    "is_retryable",
    "records_for",
    "unique",
]
