"""Rate notation: parse("100/minute") and clear errors for anything else."""

from __future__ import annotations

import pytest

from resilience.errors import ConfigurationError
from resilience.ratelimit import Rate, parse


class TestParse:
    @pytest.mark.parametrize(
        ("text", "limit", "period"),
        [
            ("100/minute", 100, 60),
            ("10/second", 10, 1),
            ("5/10 seconds", 5, 10),
            ("3 per hour", 3, 3600),
            ("1/d", 1, 86400),
            ("7/2.5s", 7, 2.5),
            (" 2 / min ", 2, 60),
        ],
    )
    def test_notation(self, text: str, limit: int, period: float) -> None:
        """Each accepted form gives the limit and the period in seconds."""
        assert parse(text) == Rate(limit=limit, period_seconds=period)

    @pytest.mark.parametrize(
        "text", ["", "100", "ten/minute", "10/fortnight", "10/-1 s", "/minute", "10 minute"]
    )
    def test_unparsable(self, text: str) -> None:
        """Anything else is a ConfigurationError naming the accepted forms."""
        with pytest.raises(ConfigurationError, match="cannot parse rate"):
            parse(text)

    def test_zero_limit(self) -> None:
        """A limit of 0 is refused."""
        with pytest.raises(ConfigurationError, match="positive"):
            parse("0/minute")

    def test_emission_interval(self) -> None:
        """GCRA's interval is period / limit."""
        assert parse("100/minute").emission_interval_seconds == pytest.approx(0.6)
