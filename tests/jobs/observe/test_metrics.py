"""`jobs metrics`: every family, with sane values, scraped during a run on real workers."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support import wait_for

FAMILIES = (
    "jobs_queue_depth", "jobs_queue_max_depth", "jobs_guard_outcomes", "jobs_breaker_state",
    "jobs_breaker_failure_rate", "jobs_retry_budget_used_ratio", "jobs_limit_decisions",
    "jobs_concurrency_in_use", "jobs_lock_hold_seconds", "jobs_idempotency_hits",
    "jobs_idempotency_records", "jobs_locks_held", "jobs_observe_section_up",
)


def _samples(text: str) -> dict[str, list[Any]]:
    return {family.name: family.samples for family in text_string_to_metric_families(text)}


def _value(samples: list[Any], name: str, **labels: str) -> float:
    return sum(s.value for s in samples
               if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()))


class TestMetrics:
    @pytest.mark.timeout(300)
    def test_a_scrape_during_a_run_has_every_family_with_sane_values(
        self, app: Any, stores: Any, redis_client: Any, worker_factory: Any,
        start_server: Any, multiproc_dir: Path,
    ) -> None:
        """Idempotent replays, singleton runs, rate-limit deferrals and an open breaker show."""
        from resilience.circuit.backends.redis import RedisBreakerBackend
        from resilience.circuit.breaker import CircuitBreaker
        from resilience.circuit.config import BreakerConfig
        from tests.jobs.observe.tasks import hold, paced, remember

        env = {"PROMETHEUS_MULTIPROC_DIR": str(multiproc_dir)}
        worker_factory("critical,standard", name="observe-metrics", concurrency=2, env=env)
        exporter = start_server("metrics", env=env)
        CircuitBreaker(BreakerConfig(name="observe-metrics-dep"),
                       RedisBreakerBackend(stores.redis)).force("forced_open")

        key = f"metrics-{uuid.uuid4().hex[:8]}"
        assert remember.delay(key=key, value=7).get(timeout=60) == {"key": key, "value": 7}
        assert remember.delay(key=key, value=7).get(timeout=60) == {"key": key, "value": 7}
        paced_results = [paced.delay(n) for n in range(3)]
        held_here: list[str] = []

        def singleton_runs_here() -> bool:
            # Other session workers may take some runs; only this worker writes the
            # multiprocess files, so count the runs it made.
            result = hold.delay(slot=uuid.uuid4().hex, seconds=0.05).get(timeout=60)
            if result.get("multiproc_dir") == str(multiproc_dir):
                held_here.append(result["slot"])
            return len(held_here) >= 2

        wait_for(singleton_runs_here, timeout_seconds=120, interval=0,
                 message="two singleton runs on the metrics worker")
        assert sorted(r.get(timeout=60) for r in paced_results) == [0, 1, 2]

        status, body = exporter.get("/metrics")
        assert status == 200
        samples = _samples(body.decode())
        for family in FAMILIES:
            assert family in samples, f"{family} missing from the scrape"

        depth = samples["jobs_queue_depth"]
        assert {s.labels["tier"] for s in depth} == {"critical", "standard", "optional"}
        assert all(s.value >= 0 for s in depth)
        assert _value(samples["jobs_queue_max_depth"], "jobs_queue_max_depth",
                      tier="optional") == app.settings.tier("optional").max_queue_depth

        outcomes = samples["jobs_guard_outcomes"]
        assert _value(outcomes, "jobs_guard_outcomes_total", outcome="REPLAYED",
                      tier="standard", guard="idempotency") >= 1
        assert _value(outcomes, "jobs_guard_outcomes_total", outcome="DEFERRED",
                      guard="rate-limit") >= 1

        state = samples["jobs_breaker_state"]
        assert _value(state, "jobs_breaker_state", breaker="observe-metrics-dep",
                      state="forced_open") == 1
        assert _value(state, "jobs_breaker_state", breaker="observe-metrics-dep",
                      state="closed") == 0
        assert all(0 <= s.value <= 1 for s in samples["jobs_breaker_failure_rate"])

        assert all(s.value >= 0 for s in samples["jobs_retry_budget_used_ratio"])
        assert _value(samples["jobs_limit_decisions"], "jobs_limit_decisions_total",
                      kind="rate-limit", limit="observe-paced", outcome="DEFERRED") >= 1
        assert _value(samples["jobs_idempotency_hits"], "jobs_idempotency_hits_total",
                      task="tests.observe.remember") >= 1
        assert _value(samples["jobs_idempotency_records"], "jobs_idempotency_records",
                      state="succeeded") >= 1

        hold_count = _value(samples["jobs_lock_hold_seconds"], "jobs_lock_hold_seconds_count",
                            kind="singleton", task="tests.observe.hold")
        assert hold_count == len(held_here)
        hold_sum = _value(samples["jobs_lock_hold_seconds"], "jobs_lock_hold_seconds_sum",
                          kind="singleton", task="tests.observe.hold")
        assert hold_sum >= 0.05 * len(held_here)  # each run slept 0.05 s holding the lock
        assert all(s.value == 1 for s in samples["jobs_observe_section_up"])
