"""`RedisBudgetBackend.describe`: a retry budget's live use, read as budget.lua counts it."""

from __future__ import annotations

from typing import Any

import pytest

from resilience.retry.budget import (
    RedisBudgetBackend,
    RetryBudget,
    RetryBudgetGate,
    window_figures,
)

pytestmark = pytest.mark.timeout(60)


class TestWindowFigures:
    def test_slots_older_than_the_window_are_not_counted(self) -> None:
        """A slot whose epoch left the window is skipped, as budget.lua skips it."""
        now_ms, window_ms, slots = 1_000_000, 10_000, 10
        epoch = now_ms // 1000
        fields = {
            "e0": str(epoch),
            "q0": "5",
            "r0": "1",
            "e1": str(epoch - 10),
            "q1": "50",
            "r1": "9",
        }
        assert window_figures(fields, now_ms=now_ms, window_ms=window_ms, slots=slots) == (5, 1)


class TestDescribe:
    def test_matches_the_decisions(self, redis_client: Any) -> None:
        """Requests and retries are what the budget's own script reported; `used` is the
        share of ratio * requests + floor."""
        budget = RetryBudget(ratio=0.5, min_per_second=0.1, window_seconds=10)
        backend = RedisBudgetBackend(lambda: redis_client)
        gate = RetryBudgetGate("describe-dep", budget, backend)
        for _ in range(4):
            gate.record_request()
        decision = gate.try_spend()
        assert decision.allowed
        state = gate.describe()
        assert (state.dependency, state.requests, state.retries) == ("describe-dep", 4, 1)
        assert state.retries_allowed == pytest.approx(0.5 * 4 + 1.0)
        assert state.used == pytest.approx(1 / 3)
        assert (state.ratio, state.window_seconds) == (0.5, 10)

    def test_configured_and_stored_budgets(self, redis_client: Any) -> None:
        """Configured budgets show before any use; stored ones no task names are read with
        the default window; each once, sorted."""
        backend = RedisBudgetBackend(lambda: redis_client)
        backend.decide("stored-only", "request", RetryBudget())
        backend.decide("both", "request", RetryBudget(window_seconds=5))
        states = backend.describe(
            {"both": RetryBudget(window_seconds=5), "configured-only": RetryBudget()},
            include_stored=True,
        )
        assert [state.dependency for state in states] == ["both", "configured-only", "stored-only"]
        assert [state.requests for state in states] == [1, 0, 1]
        assert [state.window_seconds for state in states] == [5, 10, 10]
        assert states[1].used == 0.0
        assert backend.describe({"configured-only": RetryBudget()}) == [states[1]]
