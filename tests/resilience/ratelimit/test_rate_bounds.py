"""What a rate limit guarantees, exactly: the finest rate supported and the window bounds.

sliding_window, and GCRA with burst 1: never more than `limit` permits in any half-open
window of one period. GCRA with burst b: at most limit + b - 1, and over any span the
long-run rate never exceeds the limit (plus the burst allowance).
"""

from __future__ import annotations

import bisect
import itertools
import math
import time
import uuid
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from resilience.errors import ConfigurationError
from resilience.ratelimit import ALGORITHMS, RateLimitConfig, RedisBackend, algorithms
from resilience.ratelimit.rates import Rate, parse

pytestmark = pytest.mark.timeout(60)


def most_in_any_window(grants_us: list[int], window_us: int) -> int:
    """Most grants in any half-open window (t - window, t] (the busiest one ends at a grant)."""
    grants = sorted(grants_us)
    return max(
        (
            index + 1 - bisect.bisect_right(grants, end - window_us)
            for index, end in enumerate(grants)
        ),
        default=0,
    )


class TestFinestRate:
    @pytest.mark.parametrize("text", ["10000000/s", "1000001/second", "1001/0.001 s"])
    def test_rate_finer_than_a_microsecond_refused(self, text: str) -> None:
        """An emission interval under 1 µs (which Redis would round to 0) is refused."""
        with pytest.raises(ConfigurationError, match="1,000,000"):
            parse(text)

    def test_finest_rate_accepted(self) -> None:
        """1,000,000/s is the finest rate: an interval of exactly 1 µs."""
        assert parse("1000000/s").emission_interval_us == 1
        assert parse("60000000/minute").emission_interval_us == 1

    @pytest.mark.parametrize("period", [0.0005, 0.000001])
    def test_period_under_a_millisecond_refused(self, period: float) -> None:
        """A window shorter than 1 ms is refused (sliding windows round it to microseconds)."""
        with pytest.raises(ConfigurationError, match="1 ms"):
            Rate(limit=1, period_seconds=period)

    @pytest.mark.parametrize("period", [math.inf, math.nan, True])
    def test_period_must_be_finite_seconds(self, period: Any) -> None:
        with pytest.raises(ConfigurationError, match="period"):
            Rate(limit=1, period_seconds=period)

    def test_emission_interval_rounds_up(self) -> None:
        """The interval in whole µs is rounded up, so limit intervals never undercut a period."""
        rate = parse("3/second")
        assert rate.emission_interval_us == 333_334
        assert parse("100/minute").emission_interval_us == 600_000
        assert parse("7/2.5s").emission_interval_us == 357_143
        assert Rate(limit=1, period_seconds=0.1).emission_interval_us == 100_000


@st.composite
def schedules(draw: st.DrawFn) -> tuple[Rate, int, list[int]]:
    """A rate, a burst and sorted arrival times (µs) dense enough to hit the limit."""
    period_us = draw(st.integers(min_value=1_000, max_value=10_000_000))
    limit = draw(st.integers(min_value=1, max_value=min(60, period_us)))
    rate = Rate(limit=limit, period_seconds=period_us / 1_000_000)
    burst = draw(st.integers(min_value=1, max_value=8))
    interval = rate.emission_interval_us
    # Runs of equal gaps: a long run exactly one interval apart is the schedule GCRA grants
    # most densely (it exposes an interval rounded down), a run of 0 is a flood.
    gap = st.sampled_from([0, interval]) | st.integers(min_value=0, max_value=2 * interval)
    runs = draw(
        st.lists(
            st.tuples(gap, st.integers(min_value=1, max_value=2 * limit + burst)),
            min_size=1,
            max_size=20,
        )
    )
    gaps = [length for length, repeat in runs for _ in range(repeat)][:400]
    start = draw(st.integers(min_value=0, max_value=10**15))
    return rate, burst, list(itertools.accumulate(gaps, initial=start))


class TestPureAlgorithms:
    @settings(max_examples=300, deadline=None)
    @given(schedules())
    def test_gcra_window_bound(self, drawn: tuple[Rate, int, list[int]]) -> None:
        """GCRA: at most limit + burst - 1 grants in any window of one period (limit at
        burst 1), and over the whole run at most span/interval + burst."""
        rate, burst, arrivals = drawn
        tat: int | None = None
        grants: list[int] = []
        for now in arrivals:
            allowed, tat, _ = algorithms.gcra(
                tat, now, interval_us=rate.emission_interval_us, burst=burst
            )
            if allowed:
                grants.append(now)
        period_us = round(rate.period_seconds * 1_000_000)
        assert most_in_any_window(grants, period_us) <= rate.limit + burst - 1
        span = grants[-1] - grants[0]
        assert len(grants) <= span / rate.emission_interval_us + burst

    @settings(max_examples=300, deadline=None)
    @given(schedules())
    def test_sliding_window_bound(self, drawn: tuple[Rate, int, list[int]]) -> None:
        """Sliding window: never more than limit grants in any window of one period."""
        rate, _, arrivals = drawn
        window_us = round(rate.period_seconds * 1_000_000)
        log: list[int] = []
        grants: list[int] = []
        for now in arrivals:
            allowed, log, _ = algorithms.sliding_window(
                log, now, limit=rate.limit, window_us=window_us
            )
            if allowed:
                grants.append(now)
        assert most_in_any_window(grants, window_us) <= rate.limit


class TestOnRedis:
    @pytest.mark.parametrize(
        ("algorithm", "rate", "burst"),
        [
            ("gcra", "20/0.1 s", 1),
            ("gcra", "20/0.1 s", 5),
            ("gcra", "3/0.01 s", 1),
            ("sliding_window", "20/0.1 s", 1),
        ],
    )
    def test_grant_times_within_bound(
        self, redis_client: Any, algorithm: str, rate: str, burst: int
    ) -> None:
        """Requests as fast as one client can send them for 1 s: the grant times Redis
        reported hold the bound in every window of one period."""
        config = RateLimitConfig(
            name=f"bound-{uuid.uuid4().hex[:6]}", rate=parse(rate), algorithm=algorithm, burst=burst
        )
        backend = RedisBackend(redis_client, prefix="test:bounds")
        chosen, params = ALGORITHMS[config.algorithm], config.params()
        grants: list[int] = []
        denied = 0
        stop = time.monotonic() + 1.0
        while time.monotonic() < stop:
            decision = backend.run(chosen, config.name, params)
            if decision.allowed:
                grants.append(round(decision.now_seconds * 1_000_000))
            else:
                denied += 1
        period_us = round(config.rate.period_seconds * 1_000_000)
        assert most_in_any_window(grants, period_us) <= config.rate.limit + burst - 1
        # It did limit, and it did grant at least a full window's worth.
        assert denied > 0 and len(grants) >= config.rate.limit
