"""Errors raised by the resilience guards.

Misuse (a mistake in code or configuration, found at definition or enqueue time) is kept
apart from runtime loss (a store went away, a lease was lost), so callers can catch one
without the other.

    ResilienceError
    ├── ConfigurationError          bad guard or platform configuration (definition time)
    │   ├── UnknownTierError        a tier name that is not configured
    │   └── SchemaMissing           the library's tables are not in the database (migrate)
    ├── InvalidTaskArguments        arguments that cannot be enqueued (enqueue time)
    │   ├── ArgumentsDoNotBind      arguments do not match the task's signature
    │   ├── NonJsonArguments        an argument is not JSON-serializable (also kombu's EncodeError)
    │   ├── PayloadTooLarge         the serialized message exceeds the size limit
    │   └── InvalidBatch            a batch that cannot be enqueued as given (resilience.batches)
    ├── InvalidKey                  a guard key is malformed, too long or not JSON
    ├── BatchNotFound               no batch has this id (resilience.batches)
    ├── StorageError                Redis or PostgreSQL failed under a guard (wraps the cause)
    │   ├── StoreUnavailable        the store cannot serve now (down, timeout, failover)
    │   └── StoreRejected           the store refused an operation retrying cannot fix
    ├── LockError                   misuse of a lock (release of a lock never acquired, ...)
    │   ├── LockNotOwnedError       the lock's ownership was lost (expired, stolen, session gone)
    │   └── StaleFencingToken       a write carried a token older than the newest seen
    ├── IdempotencyError
    │   ├── IdempotencyKeyReused    same key, different arguments (HTTP 422 semantics)
    │   └── UnserializableResult    an idempotent task returned a value JSON cannot carry
    ├── JobDeferred                 a guard deferred the job (Retry's reason; raised inline)
    ├── JobStopped                  a guard stopped a chord member, so the chord fails
    ├── AdmissionError
    │   ├── TierFull                the tier's queue is at its depth limit (HTTP 503 semantics)
    │   │   └── QueueFull           the broker refused a bounded publish (nothing was sent)
    │   ├── DuplicateJob            a unique job with this key is already queued or running
    │   └── DependencyUnavailable   the task's breaker is open and it refuses at enqueue
    └── RetryError
        ├── RetryBudgetExhausted    the fleet-wide retry budget for a dependency is spent
        └── DeadLettered            the job was moved to the dead-letter place instead of retried
"""

from __future__ import annotations

from typing import Any

from kombu.exceptions import EncodeError


class ResilienceError(Exception):
    """Raised for any error of the resilience package; the root of the hierarchy."""

    def __init__(self, message: str, **fields: Any) -> None:
        super().__init__(message)
        self.message = message
        self.fields = fields
        for name, value in fields.items():
            setattr(self, name, value)

    def __reduce__(self) -> tuple[Any, ...]:
        # Keep the structured fields when the error crosses a process boundary.
        return (_rebuild, (type(self), self.message, self.fields))

    def __str__(self) -> str:
        return self.message


def _rebuild(cls: type[ResilienceError], message: str, fields: dict[str, Any]) -> ResilienceError:
    error = cls.__new__(cls)
    ResilienceError.__init__(error, message, **fields)
    return error


class ConfigurationError(ResilienceError, ValueError):
    """Raised when a guard or the platform is configured in a way that cannot work."""


class UnknownTierError(ConfigurationError):
    """Raised when a task names a tier that is not configured; the message lists valid tiers."""


class SchemaMissing(ConfigurationError):
    """Raised when a guard finds the library's `resilience_*` tables missing from its
    database: `python -m resilience migrate` (Django: `manage.py migrate`) creates them.
    Fields: `table` (the missing one), `database` (host:port/name, no password)."""


class InvalidTaskArguments(ResilienceError, TypeError):
    """Raised at enqueue time when a task's arguments cannot be sent."""


class ArgumentsDoNotBind(InvalidTaskArguments):
    """Raised when the arguments do not match the task function's signature."""


class NonJsonArguments(InvalidTaskArguments, EncodeError):
    """Raised when an argument is not JSON-serializable (JSON is the only wire format).

    Also kombu's `EncodeError`, which Celery raises for arguments its serializer refuses,
    so code catching Celery's error catches the platform's earlier refusal too.
    """


class PayloadTooLarge(InvalidTaskArguments):
    """Raised when the serialized arguments exceed the configured size limit."""


class InvalidKey(ResilienceError, ValueError):
    """Raised when a guard key is malformed, too long or built from non-JSON parts."""


class StorageError(ResilienceError):
    """Raised when Redis or PostgreSQL fails under a guard; `cause` holds the native error."""


class StoreUnavailable(StorageError):
    """Raised when a store cannot be reached or cannot serve now (connection refused,
    timeout, loading, failover, deadlock); the same operation may succeed later."""


class StoreRejected(StorageError):
    """Raised when a store refused an operation that cannot succeed by retrying (value too
    long, wrong type, constraint)."""


class LockError(ResilienceError):
    """Raised on misuse of a lock, such as releasing a lock that was never acquired."""


class LockNotOwnedError(LockError):
    """Raised when a lock's ownership was lost: its lease expired or its session died."""


class StaleFencingToken(LockError):
    """Raised when a protected write carries a fencing token older than the newest seen."""


class IdempotencyError(ResilienceError):
    """Raised for idempotency-record errors."""


class IdempotencyKeyReused(IdempotencyError):
    """Raised when an idempotency key is reused with different arguments."""


class UnserializableResult(IdempotencyError):
    """Raised when an idempotent task's result is not JSON, so it could not be replayed."""


class JobDeferred(ResilienceError):
    """Raised when a guard defers a job: the reason of Celery's Retry (shown in Flower), or,
    for a job run inline (`apply()`, caller-runs, eager), to the caller, with
    `retry_after_seconds`, because nothing was published."""


class JobStopped(ResilienceError):
    """Raised when a guard stopped a chord member (SKIPPED, SHED, ...), so the chord fails
    instead of handing the outcome to its callback as a result."""


class AdmissionError(ResilienceError):
    """Raised when a job is refused at enqueue time."""


class TierFull(AdmissionError):
    """Raised when a tier's queue is at its depth limit; carries `retry_after` seconds."""


class QueueFull(TierFull):
    """Raised by a broker transport when a bounded publish finds the queue at its limit."""


class DuplicateJob(AdmissionError):
    """Raised when a unique job with the same key is already queued or running."""


class DependencyUnavailable(AdmissionError):
    """Raised at enqueue when the task's breaker is open and its policy is `on_open="refuse"`;
    carries `retry_after` seconds (HTTP 503 + Retry-After), `breaker`, `state` and `task`."""


class RetryError(ResilienceError):
    """Raised for retry-policy errors."""


class RetryBudgetExhausted(RetryError):
    """Raised when the fleet-wide retry budget of a dependency is spent."""


class DeadLettered(RetryError):
    """Raised when a job is moved to the dead-letter place (`reason`, `dead_letter_id`, `cause`)."""
