"""`jobs locks list` / `jobs locks release` against locks held by real worker processes."""

from __future__ import annotations

from typing import Any

import pytest
from typer.testing import CliRunner

from resilience.locks import AdvisorySession, Redlock
from tests.harness import wait_for
from tests.resilience.locks.conftest import Nodes

pytestmark = [pytest.mark.usefixtures("locks_tables", "own_critical_queue", "purge_queues")]


@pytest.mark.chaos
@pytest.mark.timeout(120)
def test_list_and_force_release(
    worker_factory: Any, stores: Any, nodes: Nodes, run_id: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Held locks are listed with holder, age and token; release frees them."""
    from jobs.admin.locks import cli
    from tests.resilience.locks.tasks import exclusive_run, singleton_run

    # The CLI checks exclusive locks on the app's Redlock nodes (REDLOCK_URLS in a real run).
    monkeypatch.setattr(stores, "redlock_urls", tuple(nodes.urls))
    worker_factory("critical", name="locks-admin", concurrency=2, env=nodes.env())
    held_single = singleton_run.delay(run_id, "admin-s", seconds=60)
    held_excl = exclusive_run.delay(run_id, "admin-e", seconds=8)
    runner = CliRunner(env={"COLUMNS": "250"})

    def listing() -> str:
        result = runner.invoke(cli, ["list"])
        assert result.exit_code == 0, result.output
        return result.output

    ids = (held_single.id, held_excl.id)

    def both_listed() -> str | None:
        out = listing()
        return out if all(task_id in out for task_id in ids) else None

    output = wait_for(both_listed, timeout_seconds=30, message="listed")
    assert "tests.locks.singleton_run:admin-s" in output
    assert "tests.locks.exclusive_run:admin-e" in output

    released = runner.invoke(cli, ["release", "tests.locks.singleton_run:admin-s", "--yes"])
    assert "terminated 1 PostgreSQL session" in released.output
    with AdvisorySession(stores.database_url, label="probe") as probe:
        assert wait_for(lambda: probe.try_acquire("tests.locks.singleton_run:admin-s"),
                        timeout_seconds=10)

    released = runner.invoke(cli, ["release", "tests.locks.exclusive_run:admin-e", "--yes"])
    assert "Redlock node" in released.output
    assert Redlock.from_urls(nodes.urls).holders("tests.locks.exclusive_run:admin-e") == []
    assert "admin-e" not in listing()
    del held_single, held_excl  # unsubscribe from results while Redis still runs
