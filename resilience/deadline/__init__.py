"""Deadline shedding: jobs carry a deadline header; an expired job is SHED, not run."""

from resilience.deadline.guard import (
    DEADLINE_HEADER,
    DEADLINE_OPTION,
    ENQUEUED_AT_HEADER,
    DeadlineConfig,
    DeadlineGuard,
    DeadlineStampGuard,
    finite_seconds,
    header_seconds,
    headers_of,
)

__all__ = [
    "DEADLINE_HEADER",
    "DEADLINE_OPTION",
    "ENQUEUED_AT_HEADER",
    "DeadlineConfig",
    "DeadlineGuard",
    "DeadlineStampGuard",
    "finite_seconds",
    "header_seconds",
    "headers_of",
]
