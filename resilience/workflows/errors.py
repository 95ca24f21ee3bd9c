"""Errors of durable workflows (subclasses of the package's hierarchy in `resilience.errors`).

    ResilienceError
    ├── InvalidTaskArguments
    │   └── InvalidWorkflow     a canvas that cannot be started durably (start time)
    ├── WorkflowNotFound        no workflow has this id
    ├── WorkflowFailed          `run.get()`: the workflow failed or was cancelled
    ├── WorkflowTimeout         `run.get()`: no final state within the timeout
    └── WorkflowNotRetryable    `retry` / `replay` of a run in a state that does not allow it
"""

from __future__ import annotations

from typing import Any

from resilience.errors import InvalidTaskArguments, ResilienceError


class InvalidWorkflow(InvalidTaskArguments):
    """Raised when a canvas cannot be started durably: an unsupported canvas type, a task
    that is not registered or not a GuardedTask, arguments that cannot be stored."""


class WorkflowNotFound(ResilienceError):
    """Raised when no workflow has the given id."""


class WorkflowFailed(ResilienceError):
    """Raised by `run.get()` when the workflow failed, was compensated or was cancelled.

    Attributes:
        state: the workflow's state (failed, compensating, compensated, cancelled).
        step: the position of the step that failed it, or None (cancelled by an operator).
        error: that step's error, one line.
    """

    def __init__(self, message: str, *, state: str, step: int | None = None,
                 error: str | None = None, **details: Any) -> None:
        super().__init__(message, state=state, step=step, error=error, **details)
        self.state = state
        self.step = step
        self.error = error


class WorkflowTimeout(ResilienceError, TimeoutError):
    """Raised by `run.get()` when the workflow has no final state within the timeout."""


class WorkflowNotRetryable(ResilienceError):
    """Raised when `retry` or `replay` is asked of a run in a state that does not allow it
    (a running workflow, a position out of range)."""
