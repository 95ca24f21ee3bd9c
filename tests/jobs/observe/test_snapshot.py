"""`jobs.observe.snapshot.collect`: the whole state, each section on its own."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest

from jobs.embedded import free_port
from jobs.observe.snapshot import VIEWS, collect, tiers_section
from resilience.counters import count
from tests.support import ROOT, wait_for


def _breaker(stores: Any, name: str) -> Any:
    from resilience.circuit.backends.redis import RedisBreakerBackend
    from resilience.circuit.breaker import CircuitBreaker
    from resilience.circuit.config import BreakerConfig

    return CircuitBreaker(BreakerConfig(name=name), RedisBreakerBackend(stores.redis))


class TestCollect:
    @pytest.mark.timeout(60)
    def test_every_section_reads_from_real_stores(self, app: Any, redis_client: Any) -> None:
        """With Redis, the broker and PostgreSQL up, every section is read, none is missing."""
        snapshot = collect(app, inspect_timeout_seconds=0.3)
        for section in (view.name for view in VIEWS):
            assert section in snapshot, section
        assert snapshot["errors"] == {}
        assert set(snapshot["tiers"]) == {"critical", "standard", "optional"}
        for row in snapshot["tiers"].values():
            assert row["depth"] >= 0
            assert row["full"] in (True, False)
        assert set(snapshot["idempotency"]["by_state"]) >= {"in_progress", "succeeded", "failed"}
        assert "leader" in snapshot["beat_leader"]
        json.dumps(snapshot)  # JSON-able as promised

    @pytest.mark.timeout(60)
    def test_counters_are_summed_per_tier_and_guard(self, app: Any, redis_client: Any) -> None:
        """Rejected, discarded and shed counts per tier come from the fleet-wide counters."""
        count(redis_client, 3, outcome="SHED", tier="optional", guard="deadline", name="a")
        count(redis_client, 2, outcome="SHED", tier="optional", guard="deadline", name="b")
        count(redis_client, 4, outcome="DISCARDED", tier="optional", guard="bulkhead",
              name="discard")
        count(redis_client, 1, outcome="REJECTED", tier="critical", guard="bulkhead",
              name="abort")
        tiers = collect(app, active=False)["tiers"]
        assert tiers["optional"]["shed"] == 5
        assert tiers["optional"]["discarded"] == 4
        assert tiers["optional"]["by_guard"]["deadline"] == {"SHED": 5}
        assert tiers["critical"]["rejected"] == 1
        assert tiers["standard"]["rejected"] == 0

    @pytest.mark.timeout(60)
    def test_a_forced_open_breaker_shows_open(self, app: Any, stores: Any,
                                              redis_client: Any) -> None:
        """A breaker forced open through the circuit package's API is listed as open."""
        _breaker(stores, "observe-snapshot-dep").force("forced_open")
        rows = {row["name"]: row for row in collect(app, active=False)["breakers"]}
        assert rows["observe-snapshot-dep"]["state"] == "forced_open"
        assert rows["observe-snapshot-dep"]["open"] is True

    @pytest.mark.timeout(60)
    def test_a_configured_breaker_shows_before_it_has_state(
        self, app: Any, redis_client: Any
    ) -> None:
        """A breaker configured on a task is listed, closed with its threshold, unused."""
        from tests.resilience.circuit.tasks import BREAKER

        row = {row["name"]: row for row in collect(app, active=False)["breakers"]}[BREAKER]
        assert (row["state"], row["open"], row["calls"]) == ("closed", False, 0)
        assert row["failure_rate_threshold"] == 0.5
        assert row["seconds_in_state"] is None and row["retry_in_seconds"] is None

    @pytest.mark.timeout(60)
    def test_retry_budget_use_is_read_as_the_budget_script_counts(
        self, app: Any, stores: Any, redis_client: Any
    ) -> None:
        """Requests and retries in the window match what the budget's own script recorded."""
        from resilience.retry.budget import RedisBudgetBackend, RetryBudget

        backend, budget = RedisBudgetBackend(stores.redis), RetryBudget()
        for _ in range(6):
            backend.decide("observe-budget-dep", "request", budget)
        decision = backend.decide("observe-budget-dep", "retry", budget)
        assert decision.allowed
        rows = {row["dependency"]: row for row in collect(app, active=False)["budgets"]}
        row = rows["observe-budget-dep"]
        assert (row["requests"], row["retries"]) == (decision.requests, decision.retries) == (6, 1)
        assert row["used"] == pytest.approx(1 / (0.2 * 6 + budget.floor), abs=1e-3)


    @pytest.mark.timeout(60)
    def test_concurrency_leases_held_now_are_in_use(self, app: Any, stores: Any,
                                                    redis_client: Any) -> None:
        """Live leases of a semaphore count as in use; an expired lease does not."""
        from resilience.ratelimit import RedisBackend
        from resilience.ratelimit.algorithms import LEASE, Params

        backend = RedisBackend(stores.redis)
        assert backend.run(LEASE, "observe-slots", Params.of_slots(3, lease_seconds=60),
                           "a").allowed
        assert backend.run(LEASE, "observe-slots", Params.of_slots(3, lease_seconds=0.001),
                           "b").allowed
        wait_for(lambda: sum(lease.alive for lease in
                             backend.describe(LEASE, "observe-slots")[0].holders) == 1,
                 timeout_seconds=10,
                 message="the short lease to expire")
        rows = {row["name"]: row for row in collect(app, active=False)["limits"]["concurrency"]}
        assert rows["observe-slots"]["in_use"] == 1


class TestPureParts:
    def test_a_tier_at_its_max_depth_is_full(self, app: Any) -> None:
        """FULL means depth >= the tier's max_queue_depth; below it is not full."""
        limit = app.settings.tier("optional").max_queue_depth
        tiers = tiers_section(app, [], {"critical": 0, "standard": limit - 1 if limit > 1 else 0,
                                        "optional": limit}, {"per_tier": {}})
        assert tiers["optional"]["full"] is True
        assert tiers["critical"]["full"] is False


class TestUnavailableSections:
    @pytest.mark.timeout(120)
    def test_redis_down_marks_its_sections_and_keeps_the_others(self) -> None:
        """Guard-state Redis unreachable: Redis sections say why; PostgreSQL ones still show."""
        env = {**os.environ, "PYTHONPATH": str(ROOT),
               "REDIS_URL": f"redis://127.0.0.1:{free_port()}/1"}
        done = subprocess.run([sys.executable, "-m", "jobs", "status", "--json"], cwd=ROOT,
                              env=env, capture_output=True, text=True, timeout=110)
        assert done.returncode == 1, done.stderr[-2000:]
        snapshot = json.loads(done.stdout)
        for section in ("breakers", "budgets", "limits"):
            assert "unavailable" in snapshot[section], section
            assert "Connection" in snapshot[section]["unavailable"], snapshot[section]
        assert "counters" in snapshot["errors"]
        assert "unavailable" not in snapshot["idempotency"]
        assert snapshot["tiers"]["critical"]["depth"] is not None  # the broker is still up
        assert snapshot["tiers"]["critical"]["rejected"] is None   # counters are not
