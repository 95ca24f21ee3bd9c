"""The repository's pointer to the platform's beat schedule, which is `jobs.schedule.SCHEDULE`.

The schedule ships inside the `jobs` package (no top-level module is installed, and a
`beat_schedule.py` in a user's working directory cannot replace it); this file stays at the
top of the repository for readers looking for it, and as a module a deployment may copy
and name in `RESILIENCE_BEAT_SCHEDULE` to run its own schedule.
"""

from __future__ import annotations

from jobs.schedule import SCHEDULE

__all__ = ["SCHEDULE"]
