"""The dead-letter place: jobs that must not be retried again, kept for inspection and requeue
(`bulk.py`: in bulk; `replay.py`: once their dependency recovered). See docs/failure.md.
"""

from resilience.deadletter.bulk import RequeueReport, Selection, requeue_many
from resilience.deadletter.place import DeadLetter, dead_letter, get, list_entries, requeue

__all__ = ["DeadLetter", "RequeueReport", "Selection", "dead_letter", "get", "list_entries",
           "requeue", "requeue_many"]
