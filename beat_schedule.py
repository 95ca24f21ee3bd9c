"""The repository's pointer to the platform's beat schedule, `jobs.schedule.SCHEDULE` (which
ships inside the package); a deployment may copy this module and name it in
`RESILIENCE_BEAT_SCHEDULE` to run its own schedule."""

from __future__ import annotations

from jobs.schedule import SCHEDULE

__all__ = ["SCHEDULE"]
