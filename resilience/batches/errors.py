"""Errors of batches (subclasses of the package's hierarchy in `resilience.errors`).

    ResilienceError
    ├── InvalidTaskArguments
    │   └── InvalidBatch        a batch that cannot be enqueued as given (enqueue time)
    └── BatchNotFound           no batch has this id
"""

from __future__ import annotations

from resilience.errors import InvalidTaskArguments, ResilienceError


class InvalidBatch(InvalidTaskArguments):
    """Raised when a batch cannot be enqueued as given: a member that is not one task's
    signature, a task whose jobs cannot report their outcome, a callback that cannot be sent."""


class BatchNotFound(ResilienceError):
    """Raised when no batch has the given id."""
