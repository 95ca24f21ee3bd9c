"""`jobs limits show`: the admin view reads semaphores, rate limiters and counters."""

from __future__ import annotations

import json
from typing import Any

from typer.testing import CliRunner

from jobs.admin.limits import cli, snapshot
from resilience.counters import count
from resilience.ratelimit import RedisBackend


class TestLimitsView:
    def test_snapshot_shows_state(self, redis_client: Any) -> None:
        """Holders with lease left, rate state and this package's counters all appear."""
        backend = RedisBackend(redis_client)
        backend.acquire_lease("payments-api", holder="task-1", limit=2, lease_seconds=30)
        backend.gcra("vendor:42", interval_seconds=1, burst=1)
        backend.sliding_window("quota:7", limit=3, window_seconds=60)
        count(redis_client, outcome="DEFERRED", tier="standard", guard="concurrency",
              name="payments-api")
        state = snapshot()
        assert {t["tier"] for t in state["tiers"]} == {"critical", "standard", "optional"}
        [semaphore] = state["semaphores"]
        assert semaphore["key"] == "payments-api"
        assert 0 < semaphore["holders"]["task-1"] <= 30
        assert {(r["key"], r["algorithm"]) for r in state["rates"]} == {
            ("vendor:42", "gcra"), ("quota:7", "window")}
        assert [c["count"] for c in state["counters"]] == [1]

    def test_cli_json_and_release(self, redis_client: Any) -> None:
        """`show --json` prints the snapshot; `release` frees a holder by hand."""
        RedisBackend(redis_client).acquire_lease("api", holder="h", limit=1, lease_seconds=30)
        runner = CliRunner()
        shown = runner.invoke(cli, ["show", "--json"])
        assert shown.exit_code == 0, shown.output
        assert json.loads(shown.output)["semaphores"][0]["key"] == "api"
        released = runner.invoke(cli, ["release", "api", "h"])
        assert released.exit_code == 0 and "released" in released.output
        assert runner.invoke(cli, ["show"]).exit_code == 0
