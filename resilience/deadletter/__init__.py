"""The dead-letter place: jobs that must not be retried again, kept for inspection and requeue.

Bulk requeue is `requeue_many` (`bulk.py`); automatic replay of jobs whose dependency
recovered is `resilience.deadletter.replay.AutoReplay`.
"""

from resilience.deadletter.bulk import RequeueReport, Selection, requeue_many
from resilience.deadletter.place import DeadLetter, dead_letter, get, list_entries, requeue

__all__ = ["DeadLetter", "RequeueReport", "Selection", "dead_letter", "get", "list_entries",
           "requeue", "requeue_many"]
