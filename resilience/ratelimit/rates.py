"""Rate notation: `parse("100/minute")` -> `Rate(limit=100, period_seconds=60)`.

Accepted forms: ``"N/unit"``, ``"N/K unit"`` and ``"N per unit"``, where unit is one of
second, minute, hour, day (singular, plural or s/sec/m/min/h/hr/d). Anything else is a
`ConfigurationError` at definition time, naming the accepted forms.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from resilience.errors import ConfigurationError

_UNITS = {
    "s": 1.0, "sec": 1.0, "secs": 1.0, "second": 1.0, "seconds": 1.0,
    "m": 60.0, "min": 60.0, "mins": 60.0, "minute": 60.0, "minutes": 60.0,
    "h": 3600.0, "hr": 3600.0, "hrs": 3600.0, "hour": 3600.0, "hours": 3600.0,
    "d": 86400.0, "day": 86400.0, "days": 86400.0,
}

_PATTERN = re.compile(
    r"^\s*(?P<limit>\d+)\s*(?:/|\s+per\s+)\s*(?P<multiple>\d+(?:\.\d+)?)?\s*(?P<unit>[a-z]+)\s*$",
    re.IGNORECASE,
)


@dataclass(frozen=True, kw_only=True)
class Rate:
    """`limit` permits per `period_seconds`."""

    limit: int
    period_seconds: float

    def __post_init__(self) -> None:
        if isinstance(self.limit, bool) or not isinstance(self.limit, int) or self.limit <= 0:
            raise ConfigurationError(f"a rate limit must be a positive integer, got {self.limit!r}")
        if not self.period_seconds > 0:
            raise ConfigurationError(
                f"a rate period must be positive seconds, got {self.period_seconds!r}"
            )

    @property
    def per_second(self) -> float:
        return self.limit / self.period_seconds

    @property
    def emission_interval_seconds(self) -> float:
        """Seconds between permits at the steady rate (GCRA's T)."""
        return self.period_seconds / self.limit

    def __str__(self) -> str:
        return f"{self.limit}/{self.period_seconds:g}s"


def parse(text: str | Rate) -> Rate:
    """Parse rate notation such as ``"100/minute"``, ``"5/10 seconds"``, ``"3 per hour"``.

    Raises:
        ConfigurationError: the text is not rate notation or the limit is not positive.
    """
    if isinstance(text, Rate):
        return text
    if not isinstance(text, str):
        raise ConfigurationError(f"a rate must be a string like '100/minute', got {text!r}")
    match = _PATTERN.match(text)
    unit = (match.group("unit").lower() if match else "")
    if match is None or unit not in _UNITS:
        raise ConfigurationError(
            f"cannot parse rate {text!r}; write 'N/unit', 'N/K units' or 'N per unit' with "
            "unit second, minute, hour or day (e.g. '100/minute', '5/10 seconds')",
            rate=text,
        )
    multiple = float(match.group("multiple") or 1)
    return Rate(limit=int(match.group("limit")), period_seconds=multiple * _UNITS[unit])
