"""Deadline shedding: jobs carry a deadline header; an expired job is SHED, not run."""

from resilience.deadline.guard import (
    DEADLINE_OPTION,
    DeadlineConfig,
    DeadlineGuard,
    DeadlineStampGuard,
)

__all__ = ["DEADLINE_OPTION", "DeadlineConfig", "DeadlineGuard", "DeadlineStampGuard"]
