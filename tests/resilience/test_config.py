"""Every guard decorator takes its `*Config` or keyword overrides of it (`resilience.config`)."""

from __future__ import annotations

from typing import Any

import pytest

from resilience.admission.tier import bulkhead
from resilience.circuit.config import BreakerConfig
from resilience.circuit.guard import circuit_breaker
from resilience.deadletter.poison import poison_guard
from resilience.errors import ConfigurationError
from resilience.idempotency import idempotent
from resilience.idempotency.unique import unique
from resilience.locks import exclusive, singleton
from resilience.locks.config import ExclusiveConfig, SingletonConfig
from resilience.pipeline import attached
from resilience.ratelimit import limit_concurrency, rate_limit
from resilience.ratelimit.config import RateLimitConfig
from resilience.retry import retry_policy

DECORATORS: list[Any] = [
    lambda **o: idempotent(**o), lambda **o: unique(**o), lambda **o: singleton(**o),
    lambda **o: exclusive(**o), lambda **o: circuit_breaker("dep", **o),
    lambda **o: limit_concurrency("dep", 2, **o), lambda **o: rate_limit("dep", "1/s", **o),
    lambda **o: retry_policy(**o), lambda **o: bulkhead(max_queue_depth=1, **o),
    lambda **o: poison_guard(**o),
]


class TestConfigured:
    @pytest.mark.parametrize("decorate", DECORATORS)
    def test_unknown_override_lists_the_valid_names(self, decorate: Any) -> None:
        """A misspelt option is a ConfigurationError naming it and the valid options."""
        with pytest.raises(ConfigurationError, match=r"option\(s\) no_such_option; valid: "):
            decorate(no_such_option=1)

    def test_singleton_config_instance_with_overrides(self) -> None:
        """A SingletonConfig in the key position, `key=` and overrides replacing fields."""
        base = SingletonConfig(policy="defer", defer_seconds=9)
        def nightly(order_id: str) -> None: ...

        func = singleton(base, key="{order_id}", defer_seconds=2)(nightly)
        guard = next(g for g in attached(func) if getattr(g, "options", None) is not None)
        assert (guard.options.policy, guard.options.defer_seconds) == ("defer", 2)
        assert guard.keys.key == "{order_id}"

    def test_exclusive_overrides_are_validated(self) -> None:
        """Overrides go through the config's own validation (TTL <= 0 is refused)."""
        with pytest.raises(ConfigurationError):
            exclusive(ExclusiveConfig(), ttl_seconds=0)

    def test_breaker_and_rate_limit_configs(self) -> None:
        """A config instance replaces the name; overrides change only what they name."""
        breaker = BreakerConfig(name="payments", minimum_calls=20)
        [guard] = attached(circuit_breaker(breaker, open_seconds=5)(lambda: None))
        assert (guard.config.name, guard.config.minimum_calls, guard.config.open_seconds) == (
            "payments", 20, 5)
        limit = RateLimitConfig(name="vendor", rate="10/minute")
        [rate] = attached(rate_limit(limit, burst=3)(lambda: None))
        assert (rate.config.name, rate.config.rate.limit, rate.config.burst) == ("vendor", 10, 3)

    def test_a_wrong_config_type_is_refused(self) -> None:
        """Another guard's config in the config position is a ConfigurationError."""
        with pytest.raises(ConfigurationError, match="expected a RetryConfig"):
            retry_policy(BreakerConfig(name="x"))  # type: ignore[arg-type]
