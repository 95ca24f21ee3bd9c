"""`jobs limits show`: the admin view reads semaphores, rate limiters and counters."""

from __future__ import annotations

import json
from typing import Any

import pytest
from typer.testing import CliRunner

from jobs.admin.limits import cli, snapshot
from resilience.counters import count
from resilience.ratelimit import GCRA, LEASE, SLIDING_WINDOW, Params, RedisBackend
from tests.support import wait_for


def _lapsed(backend: RedisBackend, key: str, holder: str) -> bool:
    """`holder`'s lease on semaphore `key` has ended on the store's (Redis server) clock."""
    [state] = backend.describe(LEASE, key)
    return any(lease.owner == holder and not lease.alive for lease in state.holders)


class TestLimitsView:
    def test_snapshot_shows_state(self, redis_client: Any) -> None:
        """Holders with lease left, rate state and this package's counters all appear."""
        backend = RedisBackend(redis_client)
        backend.run(LEASE, "payments-api", Params.of_slots(2, lease_seconds=30), "task-1")
        backend.run(LEASE, "payments-api", Params.of_slots(2, lease_seconds=0.001), "gone")
        # The snapshot can read the clock less than the lease's 1 ms later (about 0.4 ms
        # here): wait until the lease has lapsed on Redis's clock, so it is certainly dead.
        wait_for(
            lambda: _lapsed(backend, "payments-api", "gone"),
            timeout_seconds=5,
            interval=0.001,
            message="the 1 ms lease to lapse on Redis server time",
        )
        backend.run(GCRA, "vendor:42", Params(limit=1, period_us=1_000_000))
        backend.run(SLIDING_WINDOW, "quota:7", Params(limit=3, period_us=60_000_000))
        count(
            redis_client,
            outcome="DEFERRED",
            tier="standard",
            guard="concurrency",
            name="payments-api",
        )
        state = snapshot()
        assert {t["tier"] for t in state["tiers"]} == {"critical", "standard", "optional"}
        [semaphore] = state["semaphores"]
        assert semaphore["key"] == "payments-api"
        assert list(semaphore["holders"]) == ["task-1"]  # the lapsed lease is not shown
        assert 0 < semaphore["holders"]["task-1"] <= 30
        assert [(r["key"], r["algorithm"]) for r in state["rates"]] == [
            ("vendor:42", "gcra"),
            ("quota:7", "window"),
        ]
        assert state["rates"][0]["ahead_seconds"] == pytest.approx(1, abs=0.5)
        assert state["rates"][1]["in_window"] == 1
        assert [c["count"] for c in state["counters"]] == [1]

    def test_cli_json_and_release(self, redis_client: Any) -> None:
        """`show --json` prints the snapshot; `release` frees a holder by hand."""
        RedisBackend(redis_client).run(LEASE, "api", Params.of_slots(1, lease_seconds=30), "h")
        runner = CliRunner()
        shown = runner.invoke(cli, ["show", "--json"])
        assert shown.exit_code == 0, shown.output
        assert json.loads(shown.output)["semaphores"][0]["key"] == "api"
        released = runner.invoke(cli, ["release", "api", "h"])
        assert released.exit_code == 0 and "released" in released.output
        assert runner.invoke(cli, ["show"]).exit_code == 0
        assert not RedisBackend(redis_client).describe(LEASE, "api")[0].holders
