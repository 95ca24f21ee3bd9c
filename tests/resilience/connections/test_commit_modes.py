"""Commit modes on a thread's shared PostgreSQL connection (resilience.connections.postgres)."""

from __future__ import annotations

from typing import Any

from resilience.connections.postgres import (
    StatementRunner,
    asynchronous_commit,
    synchronous_commit,
)
from resilience.prepared import PreparedStatement

SETTING = PreparedStatement("test_commit_mode",
                            "SELECT current_setting('synchronous_commit') AS mode")


class TestCommitModes:
    def test_a_synchronous_statement_waits_even_when_the_session_does_not(
            self, stores: Any) -> None:
        """The idempotency guard sets its session to `synchronous_commit = off`; a workflow
        step's record on the same connection still commits with `on`, and an
        asynchronous one with `off`."""
        runner = StatementRunner(stores.database_url)
        try:
            connection = runner.connection()
            with connection.driver.cursor() as cursor:
                cursor.execute("SET synchronous_commit = off")
            connection.settings["synchronous_commit"] = False
            assert runner.run(SETTING, {}, "test")[0].mode == "off"
            assert runner.run(SETTING, {}, "test", prefix=synchronous_commit)[0].mode == "on"
            assert runner.run(SETTING, {}, "test", prefix=asynchronous_commit)[0].mode == "off"
            with connection.driver.cursor() as cursor:
                cursor.execute("SET synchronous_commit TO DEFAULT")
            connection.settings["synchronous_commit"] = None
            assert runner.run(SETTING, {}, "test", prefix=synchronous_commit)[0].mode == "on"
        finally:
            runner.close()
