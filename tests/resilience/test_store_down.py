"""One store-down vocabulary for every guard (`resilience.store_down`)."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from sqlalchemy import text

from resilience.errors import ConfigurationError, DeadLettered, StoreRejected, StoreUnavailable
from resilience.outcomes import Outcome, Stop
from resilience.pipeline import Call
from resilience.store_down import StoreDown, store_down_policy, store_failed


def _configs(on_store_down: Any) -> list[Any]:
    from resilience.admission import BulkheadConfig
    from resilience.circuit.config import BreakerConfig
    from resilience.idempotency.guard import IdempotencyConfig
    from resilience.idempotency.unique import UniqueConfig
    from resilience.locks.guards import ExclusiveConfig, SingletonConfig
    from resilience.ratelimit.guards import ConcurrencyLimitConfig, RateLimitConfig
    from resilience.retry.budget import RetryBudget

    return [
        IdempotencyConfig(on_store_down=on_store_down),
        UniqueConfig(on_store_down=on_store_down),
        SingletonConfig(on_store_down=on_store_down),
        ExclusiveConfig(on_store_down=on_store_down),
        BreakerConfig(name="b", on_store_down=on_store_down),
        ConcurrencyLimitConfig(name="c", limit=1, on_store_down=on_store_down),
        RateLimitConfig(name="r", rate="1/s", on_store_down=on_store_down),
        RetryBudget(on_store_down=on_store_down),
        BulkheadConfig(tier="t", max_queue_depth=1, on_store_down=on_store_down),
    ]


class TestVocabulary:
    @pytest.mark.parametrize("value", ["fail_open", "fail_closed"])
    def test_every_guard_takes_the_same_option_and_values(self, value: str) -> None:
        for config in _configs(value):
            assert config.on_store_down is StoreDown(value), type(config).__name__

    def test_an_unknown_value_is_refused_everywhere(self) -> None:
        for make in range(len(_configs("fail_open"))):
            with pytest.raises(ConfigurationError, match="'fail_open' or 'fail_closed'"):
                _configs("sometimes")[make]

    @pytest.mark.parametrize("old", ["defer", "run", "open", "closed", "allow", "deny",
                                     "raise", True, False, None])
    def test_old_spellings_are_refused(self, old: Any) -> None:
        """Only "fail_open" / "fail_closed" / StoreDown: an old word names the valid two."""
        with pytest.raises(ConfigurationError, match="'fail_open' or 'fail_closed'"):
            store_down_policy(old)

    def test_old_option_names_are_unknown(self) -> None:
        """`on_store_error=` and `fail_open=` are no options of any config."""
        from resilience.locks.guards import SingletonConfig
        from resilience.ratelimit.guards import RateLimitConfig

        with pytest.raises(TypeError):
            SingletonConfig(on_store_error="run")  # type: ignore[call-arg]
        with pytest.raises(TypeError):
            RateLimitConfig(name="r", rate="1/s", fail_open=False)  # type: ignore[call-arg]

    def test_defaults_follow_the_design(self) -> None:
        """Idempotency and exclusivity fail closed; the rest fail open (DESIGN.md)."""
        from resilience.admission import BulkheadConfig
        from resilience.circuit.config import BreakerConfig
        from resilience.idempotency.guard import IdempotencyConfig
        from resilience.idempotency.unique import UniqueConfig
        from resilience.locks.guards import ExclusiveConfig, SingletonConfig
        from resilience.ratelimit.guards import ConcurrencyLimitConfig, RateLimitConfig
        from resilience.retry.budget import RetryBudget

        closed = [IdempotencyConfig(), SingletonConfig(), ExclusiveConfig()]
        opened = [UniqueConfig(), BreakerConfig(name="b"), RetryBudget(),
                  ConcurrencyLimitConfig(name="c", limit=1),
                  RateLimitConfig(name="r", rate="1/s"),
                  BulkheadConfig(tier="t", max_queue_depth=1)]
        assert {config.on_store_down for config in closed} == {StoreDown.FAIL_CLOSED}
        assert {config.on_store_down for config in opened} == {StoreDown.FAIL_OPEN}


class TestStoreFailed:
    def _call(self, app: Any) -> Call:
        from tests.resilience.pipeline.tasks import storm

        request = type("Request", (), {"id": f"sd-{uuid.uuid4().hex[:8]}", "retries": 0,
                                        "delivery_info": {}, "called_directly": False})()
        return Call(task=storm, args=("r", "k"), kwargs={}, request=request)

    def test_unreachable_and_fail_closed_defers(self, app: Any) -> None:
        with pytest.raises(Stop) as stopped:
            store_failed(self._call(app), StoreUnavailable("down"), guard="g",
                         policy=StoreDown.FAIL_CLOSED, retry_after_seconds=2.0)
        assert stopped.value.outcome is Outcome.DEFERRED
        assert stopped.value.retry_after_seconds == 2.0

    def test_unreachable_and_fail_open_runs_and_counts(self, app: Any, redis_client: Any) -> None:
        from resilience.counters import read_all

        store_failed(self._call(app), StoreUnavailable("down"), guard="g",
                     policy=StoreDown.FAIL_OPEN, retry_after_seconds=2.0, name="n")
        counted = {labels["outcome"]: value for labels, value in read_all(redis_client)
                   if labels["guard"] == "g"}
        assert counted == {"FAIL-OPEN": 1}

    def test_a_rejected_operation_is_dead_lettered_whatever_the_policy(
        self, app: Any, engine: Any
    ) -> None:
        """A deterministic store error is not "down": waiting cannot fix it."""
        call = self._call(app)
        for policy in StoreDown:
            with pytest.raises(DeadLettered, match="the store refused the operation"):
                store_failed(call, StoreRejected("value too long"), guard="g", policy=policy,
                             retry_after_seconds=1.0)
        with engine.connect() as connection:
            rows = connection.execute(text(
                "SELECT count(*) FROM resilience_dead_letters WHERE task_id = :id"),
                {"id": call.task_id})
            assert rows.scalar_one() == 2
