"""Bad task definitions and bad arguments fail in the producer with named errors."""

from __future__ import annotations

from typing import Any

import pytest

from jobs.tiers import TIERS
from resilience.errors import (
    ArgumentsDoNotBind,
    ConfigurationError,
    NonJsonArguments,
    PayloadTooLarge,
    UnknownTierError,
)


class TestTaskDefinition:
    def test_unknown_tier_fails_at_definition_naming_valid_tiers(self, app: Any) -> None:
        with pytest.raises(UnknownTierError) as caught:

            @app.task(tier="urgent")
            def nightly() -> None:  # pragma: no cover - never defined
                pass

        for tier in TIERS:
            assert tier in str(caught.value)

    def test_time_limit_longer_than_visibility_timeout_is_refused(self, app: Any) -> None:
        with pytest.raises(ConfigurationError, match="visibility"):

            @app.task(tier="standard", time_limit=10_000)
            def slow() -> None:  # pragma: no cover
                pass

    def test_tier_sets_queue_and_limits(self, app: Any) -> None:
        @app.task(tier="optional", name="tests.defined.optional_probe")
        def optional_probe() -> None:  # pragma: no cover
            pass

        assert optional_probe.queue == "optional"
        assert optional_probe.time_limit == app.settings.optional.hard_time_limit_seconds
        assert optional_probe.acks_late and optional_probe.reject_on_worker_lost


class TestEnqueueValidation:
    def test_non_json_argument_is_refused(self, app: Any) -> None:
        charge = app.tasks["jobs.examples.charge_payment"]
        with pytest.raises(NonJsonArguments, match="JSON"):
            charge.delay("order-1", "acct", {1, 2})

    def test_arguments_must_bind_to_the_signature(self, app: Any) -> None:
        charge = app.tasks["jobs.examples.charge_payment"]
        with pytest.raises(ArgumentsDoNotBind, match="account"):
            charge.delay("order-1")
        with pytest.raises(ArgumentsDoNotBind, match="unexpected"):
            charge.delay("order-1", "acct", 100, colour="red")

    def test_oversize_payload_is_refused(self, app: Any) -> None:
        report = app.tasks["jobs.examples.build_daily_report"]
        with pytest.raises(PayloadTooLarge, match="bytes"):
            report.delay("x" * (app.settings.max_payload_bytes + 1))

    def test_pickle_is_not_accepted(self, app: Any) -> None:
        assert app.conf.accept_content == ["json"]
        assert app.conf.task_serializer == "json"
        assert app.conf.result_accept_content == ["json"]
