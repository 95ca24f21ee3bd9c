"""Admission: whether a new job may enter the broker at all, decided in the producer.

One package for every enqueue stage that can refuse new work, because they share what makes
admission its own concern: they run only for a new job (a republish was admitted once),
refuse with the same vocabulary (REJECTED, DISCARDED, an `AdmissionError` the caller maps
to HTTP 503 + Retry-After), and read their state where the producer already is, the broker:

- `tier.py`: the tier bulkhead (`@bulkhead`, stage ADMIT): queue depth against the tier's
  limit, then abort / discard / caller_runs / wait;
- `breaker.py`: the breaker's enqueue admission (stage BREAKER): `.delay()` refuses while a
  declared breaker is open; the breaker itself (and its execution guard) is `circuit`'s,
  which hands this stage a reader of its state;
- `broker.py`: the broker as store: depth and reservations (Redis, RabbitMQ), and the
  guarded publish that checks the bound and `@unique`'s key in the push itself.

The package sits beside the pipeline, under the guards: guard packages (`circuit`,
`idempotency`'s `@unique`) attach its stages; it imports only the core and the pipeline.
"""

from resilience.admission.breaker import BreakerAdmissionGuard
from resilience.admission.broker import (
    Admission,
    AmqpBrokerDepth,
    DepthBackend,
    RedisBrokerDepth,
    depth_backend_for,
)
from resilience.admission.tier import (
    AdmissionGuard,
    BulkheadConfig,
    DiscardedResult,
    RejectionPolicy,
    bulkhead,
    queue_of,
)

__all__ = [
    "Admission",
    "AdmissionGuard",
    "AmqpBrokerDepth",
    "BreakerAdmissionGuard",
    "BulkheadConfig",
    "DepthBackend",
    "DiscardedResult",
    "RedisBrokerDepth",
    "RejectionPolicy",
    "bulkhead",
    "depth_backend_for",
    "queue_of",
]
