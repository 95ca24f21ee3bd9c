"""Rate notation: `parse("100/minute")` -> `Rate(limit=100, period_seconds=60)`.

Forms: ``"N/unit"``, ``"N/K unit"``, ``"N per unit"``; unit second, minute, hour or day.
The limiters count whole microseconds, so the finest rate is 1,000,000/s (a finer one would
stop limiting) and the shortest period 1 ms; both are refused (docs/overload.md).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from fractions import Fraction

from resilience.config import check, is_number
from resilience.errors import ConfigurationError

_UNITS = {
    **dict.fromkeys(("s", "sec", "secs", "second", "seconds"), 1.0),
    **dict.fromkeys(("m", "min", "mins", "minute", "minutes"), 60.0),
    **dict.fromkeys(("h", "hr", "hrs", "hour", "hours"), 3600.0),
    **dict.fromkeys(("d", "day", "days"), 86400.0),
}

_PATTERN = re.compile(
    r"^\s*(?P<limit>\d+)\s*(?:/|\s+per\s+)\s*(?P<multiple>\d+(?:\.\d+)?)?\s*(?P<unit>[a-z]+)\s*$",
    re.IGNORECASE,
)

#: The shortest period (a sliding window's length), seconds.
MIN_PERIOD_SECONDS = 0.001
#: The finest rate: permits per second at an emission interval of 1 µs.
MAX_PER_SECOND = 1_000_000


@dataclass(frozen=True, kw_only=True)
class Rate:
    """`limit` permits per `period_seconds`.

    Raises:
        ConfigurationError: limit not a positive integer; period not finite positive seconds
            or under 1 ms; an emission interval (period / limit) under 1 µs, i.e. more than
            1,000,000 permits per second.
    """

    limit: int
    period_seconds: float

    def __post_init__(self) -> None:
        check(self, "limit", "a positive integer", label="a rate limit",
              valid=lambda v: not isinstance(v, bool) and isinstance(v, int) and v > 0)
        check(self, "period_seconds", "positive finite seconds", label="a rate period",
              valid=lambda v: is_number(v) and v > 0)
        period = self.period_seconds
        if period < MIN_PERIOD_SECONDS:
            raise ConfigurationError(
                f"rate {self}: the period must be at least 1 ms (a decision is a Redis round "
                f"trip; a shorter window is not one a fleet can hold), got {period!r} s",
                rate=str(self),
            )
        if self._period_us < self.limit:
            raise ConfigurationError(
                f"rate {self} is finer than the limiters resolve: its emission interval "
                f"(period / limit) is {float(self._period_us / self.limit):.3g} µs, under the "
                f"1 µs minimum; the finest rate is {MAX_PER_SECOND:,} per second "
                "(e.g. '1000000/second', '60000000/minute')",
                rate=str(self),
            )

    @property
    def _period_us(self) -> Fraction:
        # Exact decimal value of the period as written ("0.1" is 1/10, not the float
        # 0.1000000000000000055...), so the µs arithmetic below has no float error.
        return Fraction(str(self.period_seconds)) * 1_000_000

    @property
    def emission_interval_seconds(self) -> float:
        """Seconds between permits at the steady rate (GCRA's T)."""
        return self.period_seconds / self.limit

    @property
    def emission_interval_us(self) -> int:
        """Whole microseconds between permits (GCRA's T for a backend); always >= 1.

        Rounded up, never to nearest: `limit` intervals then never add up to less than the
        period, which is what keeps every window of one period within `limit` (burst 1);
        rounding 1/3 s down to 333,333 µs would let 4 permits into one second.
        """
        return max(1, math.ceil(self._period_us / self.limit))

    def __str__(self) -> str:
        return f"{self.limit}/{self.period_seconds:g}s"


def parse(text: str | Rate) -> Rate:
    """Parse rate notation such as ``"100/minute"``, ``"5/10 seconds"``, ``"3 per hour"``.

    Raises:
        ConfigurationError: the text is not rate notation, the limit is not positive, or the
            rate is finer than 1,000,000 per second (or its period under 1 ms).
    """
    if isinstance(text, Rate):
        return text
    if not isinstance(text, str):
        raise ConfigurationError(f"a rate must be a string like '100/minute', got {text!r}")
    match = _PATTERN.match(text)
    unit = match.group("unit").lower() if match else ""
    if match is None or unit not in _UNITS:
        raise ConfigurationError(
            f"cannot parse rate {text!r}; write 'N/unit', 'N/K units' or 'N per unit' with "
            "unit second, minute, hour or day (e.g. '100/minute', '5/10 seconds')",
            rate=text,
        )
    multiple = float(match.group("multiple") or 1)
    return Rate(limit=int(match.group("limit")), period_seconds=multiple * _UNITS[unit])
