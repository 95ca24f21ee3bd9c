"""Idempotent execution (`@idempotent`) and unique enqueue (`@unique`), records in PostgreSQL."""

from resilience.idempotency.guard import (
    IdempotencyConfig,
    IdempotencyGuard,
    idempotent,
    is_retryable,
)
from resilience.idempotency.unique import UniqueConfig, unique

__all__ = [
    "IdempotencyConfig",
    "IdempotencyGuard",
    "UniqueConfig",
    "idempotent",
    "is_retryable",
    "unique",
]
