"""Options of the limit guards: refused at definition time, and limit names from templates."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from resilience.errors import ConfigurationError
from resilience.ratelimit import (
    ConcurrencyLimitConfig,
    RateLimitConfig,
    limit_concurrency,
    rate_limit,
)
from resilience.ratelimit.config import split_name


class TestBadInput:
    @pytest.mark.parametrize("limit", [0, -2, 1.5, True])
    def test_concurrency_limit_positive(self, limit: Any) -> None:
        """limit <= 0 is refused at definition time."""
        with pytest.raises(ConfigurationError, match="positive integer"):
            limit_concurrency("api", limit)

    def test_bad_lease(self) -> None:
        """A lease that is not positive is refused."""
        with pytest.raises(ConfigurationError, match="lease_seconds"):
            ConcurrencyLimitConfig(name="api", limit=1, lease_seconds=0)

    def test_unparsable_rate(self) -> None:
        """A rate that is not rate notation is refused."""
        with pytest.raises(ConfigurationError, match="cannot parse rate"):
            rate_limit("api", "lots/minute")

    @pytest.mark.parametrize("algorithm", ["leaky", "lease"])
    def test_unknown_or_slot_algorithm(self, algorithm: str) -> None:
        """A rate limit takes a registered rate algorithm, not a semaphore's."""
        with pytest.raises(ConfigurationError, match="gcra, sliding_window"):
            RateLimitConfig(name="api", rate="1/s", algorithm=algorithm)  # type: ignore[arg-type]

    def test_burst_with_sliding_window(self) -> None:
        """burst is refused for an algorithm that does not burst."""
        with pytest.raises(ConfigurationError, match="burst"):
            rate_limit("api", "1/s", algorithm="sliding_window", burst=3)

    def test_template_naming_no_argument(self) -> None:
        """A key template naming a missing argument fails when the task is decorated."""
        with pytest.raises(ConfigurationError, match="customer"):
            rate_limit("vendor:{customer}", "1/s")(lambda order_id: None)

    def test_lease_shorter_than_time_limit(self, app: Any) -> None:
        """A lease shorter than the hard time limit is refused when the task is bound."""

        @app.task(
            tier="standard",
            name=f"tests.ratelimit.badlease.{uuid.uuid4().hex[:8]}",
            time_limit=10,
            soft_time_limit=5,
        )
        @limit_concurrency("api", 1, lease_seconds=3)
        def short(n: int) -> int:
            return n

        with pytest.raises(ConfigurationError, match="hard time limit"):
            short.pipelines()


class TestNames:
    @pytest.mark.parametrize(
        ("given", "name", "template"),
        [
            ("payments-api", "payments-api", None),
            ("vendor:{customer_id}", "vendor", "{customer_id}"),
            ("tenant-{tenant}:{region}", "tenant", "{tenant}:{region}"),
        ],
    )
    def test_name_and_template(self, given: str, name: str, template: str | None) -> None:
        """A template's prefix names the limit; the stored key is `name:value`."""
        assert split_name(given, None) == (name, template)

    def test_template_needs_a_name(self) -> None:
        """A template with no name before its first field is refused."""
        with pytest.raises(ConfigurationError, match="needs a name"):
            split_name("{customer_id}", None)


class TestParams:
    def test_rate_params_keep_the_rounded_up_interval(self) -> None:
        """A rate's figures carry its interval rounded up, as `Rate` computes it."""
        params = RateLimitConfig(name="api", rate="3/second", burst=2).params()
        assert (params.limit, params.period_us, params.interval_us, params.burst) == (
            3,
            1_000_000,
            333_334,
            2,
        )
