"""Tier bulkheads at enqueue: queue depth against a limit, then abort/discard/caller_runs/wait."""

from resilience.bulkhead.admission import (
    AdmissionGuard,
    BulkheadConfig,
    DiscardedResult,
    RejectionPolicy,
    bulkhead,
    queue_of,
)
from resilience.bulkhead.backends import Admission, DepthBackend
from resilience.bulkhead.backends.broker import (
    AmqpBrokerDepth,
    RedisBrokerDepth,
    depth_backend_for,
)

__all__ = [
    "Admission",
    "AdmissionGuard",
    "AmqpBrokerDepth",
    "BulkheadConfig",
    "DepthBackend",
    "DiscardedResult",
    "RedisBrokerDepth",
    "RejectionPolicy",
    "bulkhead",
    "depth_backend_for",
    "queue_of",
]
