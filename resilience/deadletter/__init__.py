"""The dead-letter place: jobs that must not be retried again, kept for inspection and requeue."""

from resilience.deadletter.place import DeadLetter, dead_letter, get, list_entries, requeue

__all__ = ["DeadLetter", "dead_letter", "get", "list_entries", "requeue"]
