"""`jobs dead-letters` and `jobs breakers` against the session's real stores."""

from __future__ import annotations

from typing import Any

from typer.testing import CliRunner

from resilience.circuit.backends.redis import state_key
from resilience.deadletter.place import dead_letter, get


class TestDeadLettersCommand:
    def test_list_show_requeue(self, app: Any, engine: Any, purge_queues: None) -> None:
        """list shows the reason, show the arguments, requeue marks the entry."""
        from jobs.admin.dead_letters import cli
        from tests.resilience.deadletter.tasks import failure_echo

        entry_id = dead_letter(
            engine, task_name=failure_echo.name, task_id="cli", args=[7], kwargs={},
            guard="retry", reason="cli test reason", attempts=2, queue="standard",
        )
        runner = CliRunner()
        listed = runner.invoke(cli, ["list", "--task", failure_echo.name])
        assert listed.exit_code == 0, listed.output
        assert "dead letters (1)" in listed.output
        shown = runner.invoke(cli, ["show", str(entry_id)])
        assert shown.exit_code == 0 and "cli test reason" in shown.output
        requeued = runner.invoke(cli, ["requeue", str(entry_id)])
        assert requeued.exit_code == 0, requeued.output
        assert get(engine, entry_id).requeued_task_id is not None


class TestBreakersCommand:
    def test_force_and_reset(self, app: Any, redis_client: Any) -> None:
        """force-open / force-close / reset set the shared state; list shows it."""
        from jobs.admin.breakers import cli

        runner = CliRunner()
        assert runner.invoke(cli, ["force-open", "cli-breaker"]).exit_code == 0
        assert redis_client.hget(state_key("cli-breaker"), "state") == "forced_open"
        listed = runner.invoke(cli, ["list"])
        assert "cli-breaker" in listed.output and "forced_open" in listed.output
        assert runner.invoke(cli, ["force-close", "cli-breaker"]).exit_code == 0
        assert redis_client.hget(state_key("cli-breaker"), "state") == "forced_closed"
        assert runner.invoke(cli, ["reset", "cli-breaker"]).exit_code == 0
        assert redis_client.hget(state_key("cli-breaker"), "state") == "closed"
