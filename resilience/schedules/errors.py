"""Errors of the schedules service (`resilience.schedules`).

    ResilienceError
    ├── ConfigurationError
    │   └── InvalidSchedule     a schedule that cannot be used as given (bad cron expression,
    │                           unknown time zone, non-positive interval, unknown policy, ...)
    └── ScheduleNotFound        no schedule has this name
"""

from __future__ import annotations

from resilience.errors import ConfigurationError, ResilienceError


class InvalidSchedule(ConfigurationError):
    """Raised when a schedule (its timing, task or policies) cannot be used as given."""


class ScheduleNotFound(ResilienceError, LookupError):
    """Raised when no schedule has the given name (`name`)."""
