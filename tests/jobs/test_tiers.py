"""Each tier's tasks run on that tier's worker, and only there."""

from __future__ import annotations

from typing import Any

import pytest

from jobs.tiers import TIERS


class TestTierRouting:
    @pytest.mark.parametrize("tier", TIERS)
    def test_task_runs_on_its_tier_worker(self, app: Any, tier_workers: Any, tier: str) -> None:
        """A task defined with tier=X is executed by the X worker, never another tier's."""
        task = app.tasks[f"tests.tasks.whoami_{tier}"]
        results = [task.delay() for _ in range(6)]
        hosts = {result.get(timeout=30)["hostname"] for result in results}
        assert hosts == {tier_workers[tier].nodename}

    def test_example_jobs_route_to_their_tiers(self, app: Any) -> None:
        """The example jobs sit on the tiers the README names."""
        assert app.tasks["jobs.examples.charge_payment"].queue == "critical"
        assert app.tasks["jobs.examples.build_daily_report"].queue == "standard"
        assert app.tasks["jobs.examples.warm_cache"].queue == "optional"


class TestTierWorkerSettings:
    def test_plain_celery_worker_takes_the_tier_concurrency(
        self, app: Any, worker_factory: Any
    ) -> None:
        """`celery -A jobs worker -Q optional` without -c runs the optional tier's pool size."""
        worker = worker_factory(
            "optional", name="optional-sized", concurrency=None,
            env={"JOBS_OPTIONAL__CONCURRENCY": "3"},
        )
        stats = app.control.inspect(destination=[worker.nodename], timeout=5).stats()
        assert stats[worker.nodename]["pool"]["max-concurrency"] == 3
