"""Resilience guards for Celery tasks: idempotency, locks, bulkheads, limits, retries, breakers.

Usable by any Celery app with one call, `resilience.init_app(app)`: the stores come from the
app's own configuration (`app.conf.resilience_redis_url`, `resilience_database_url`, ...) and
the guard decorators apply to every task of the app (docs/library.md).
"""

from resilience.app import init_app
from resilience.errors import ResilienceError
from resilience.outcomes import GuardOutcome, Outcome, Stop, outcome_of
from resilience.pipeline import Call, EnqueueGuard, Guard, Stage
from resilience.stores import Stores
from resilience.task import GuardedTask

#: The library's release (the `celery-resilience` distribution; see CHANGELOG.md).
__version__ = "0.1.0"

__all__ = [
    "Call", "EnqueueGuard", "Guard", "GuardOutcome", "GuardedTask", "Outcome", "ResilienceError",
    "Stage", "Stop", "Stores", "init_app", "outcome_of"]
