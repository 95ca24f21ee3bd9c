"""`jobs idempotency show | list | purge` on a real database."""

from __future__ import annotations

import uuid
from typing import Any

from typer.testing import CliRunner

from jobs.admin.idempotency import cli
from resilience.idempotency.records import find
from resilience.idempotency.store import Holder, PostgresStore, autocommit_engine

TASK = "tests.admin.task"


def make_record(stores: Any, key: str, *, finish: bool) -> None:
    store = PostgresStore(autocommit_engine(stores))
    claim = store.claim(task_name=TASK, key=key, fingerprint="f", owner="o", task_id="t-1",
                        lease_seconds=60, ttl_seconds=600)
    if finish:
        store.complete(Holder(task_name=TASK, key=key, attempt=claim.attempt, owner="o"),
                       '{"paid": true}', 600)


class TestAdmin:
    def test_show_list_purge(self, stores: Any) -> None:
        """show prints the record, list includes it, purge deletes it and a rerun finds none."""
        key = uuid.uuid4().hex
        make_record(stores, key, finish=True)
        runner = CliRunner()
        shown = runner.invoke(cli, ["show", key, "--task", TASK])
        assert shown.exit_code == 0 and "succeeded" in shown.output and "paid" in shown.output
        listed = runner.invoke(cli, ["list", "--task", TASK, "--limit", "50"])
        assert listed.exit_code == 0 and TASK in listed.output
        purged = runner.invoke(cli, ["purge", key, "--task", TASK, "--yes"])
        assert purged.exit_code == 0, purged.output
        assert find(stores.engine(), TASK, key) is None
        assert runner.invoke(cli, ["show", key, "--task", TASK]).exit_code == 1

    def test_purge_keeps_open_claims_without_force(self, stores: Any) -> None:
        """An in-progress claim is purged only with --force."""
        key = uuid.uuid4().hex
        make_record(stores, key, finish=False)
        runner = CliRunner()
        assert runner.invoke(cli, ["purge", key, "--task", TASK, "--yes"]).exit_code == 1
        assert find(stores.engine(), TASK, key) is not None
        assert runner.invoke(cli, ["purge", key, "--task", TASK, "--yes", "--force"]).exit_code == 0
        assert find(stores.engine(), TASK, key) is None
