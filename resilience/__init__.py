"""Resilience guards for Celery tasks: idempotency, locks, bulkheads, limits, retries, breakers.

Usable by any Celery app: register the stores with `resilience.stores.install(app, Stores(...))`
and give tasks the `GuardedTask` base class.
"""

from resilience.errors import ResilienceError
from resilience.outcomes import Outcome, Stop
from resilience.pipeline import Call, EnqueueGuard, Guard, Stage
from resilience.stores import Stores
from resilience.task import GuardedTask

#: The library's release (the `celery-resilience` distribution; see CHANGELOG.md).
__version__ = "0.1.0"

__all__ = [
    "Call",
    "EnqueueGuard",
    "Guard",
    "GuardedTask",
    "Outcome",
    "ResilienceError",
    "Stage",
    "Stop",
    "Stores",
]
