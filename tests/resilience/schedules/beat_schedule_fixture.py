"""The code schedule of the schedules tests' beat processes (RESILIENCE_BEAT_SCHEDULE points
here): empty, so their seeding adds no platform maintenance entry; the tests add theirs at
runtime through the API."""

from __future__ import annotations

from typing import Any

SCHEDULE: dict[str, dict[str, Any]] = {}
