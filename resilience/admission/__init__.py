"""Admission: whether a new job may enter the broker at all, decided in the producer.

Every enqueue stage that can refuse new work: `tier.py` (the tier bulkhead, stage ADMIT),
`breaker.py` (`.delay()` refuses while a declared breaker is open, stage BREAKER) and
`broker.py` (the broker as store: depth, reservations, the guarded publish). They run only
for a new job and refuse with one vocabulary (REJECTED, DISCARDED, an `AdmissionError`:
HTTP 503 + Retry-After). Imports only the core and the pipeline. See docs/overload.md.
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
    "Admission", "AdmissionGuard", "AmqpBrokerDepth", "BreakerAdmissionGuard", "BulkheadConfig",
    "DepthBackend", "DiscardedResult", "RedisBrokerDepth", "RejectionPolicy", "bulkhead",
    "depth_backend_for", "queue_of"]
