"""`jobs idempotency status | show | list | purge` and `describe()` on a real database."""

from __future__ import annotations

import json
import uuid
from typing import Any

from typer.testing import CliRunner

from jobs.admin.idempotency import cli
from resilience.idempotency import describe, records_for
from resilience.idempotency.backends import Claim
from resilience.idempotency.backends.postgres import backend_for

TASK = "tests.admin.task"


def make_record(stores: Any, key: str, *, finish: bool) -> None:
    backend = backend_for(stores)
    found = backend.claim(
        task_name=TASK,
        key=key,
        fingerprint="f",
        owner="o",
        task_id="t-1",
        lease_seconds=60,
        ttl_seconds=600,
    )
    if finish:
        backend.complete(
            Claim(task_name=TASK, key=key, attempt=found.attempt, owner="o"), '{"paid": true}', 600
        )


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
        assert records_for(stores).find(TASK, key) is None
        assert runner.invoke(cli, ["show", key, "--task", TASK]).exit_code == 1

    def test_purge_keeps_open_claims_without_force(self, stores: Any) -> None:
        """An in-progress claim is purged only with --force."""
        key = uuid.uuid4().hex
        make_record(stores, key, finish=False)
        runner = CliRunner()
        assert runner.invoke(cli, ["purge", key, "--task", TASK, "--yes"]).exit_code == 1
        assert records_for(stores).find(TASK, key) is not None
        assert runner.invoke(cli, ["purge", key, "--task", TASK, "--yes", "--force"]).exit_code == 0
        assert records_for(stores).find(TASK, key) is None

    def test_purge_drops_the_cached_copy(self, stores: Any, redis_client: Any) -> None:
        """A purged key's cached result is gone too, so the next delivery runs again."""
        from resilience.idempotency.backends.cached import ResultCache, cache_key

        key = uuid.uuid4().hex
        make_record(stores, key, finish=True)
        redis_client.set(cache_key(TASK, key), '{"f": "f", "t": "t-1", "r": 1}')
        assert records_for(stores).purge(TASK, key)
        assert redis_client.get(cache_key(TASK, key)) is None
        assert ResultCache(lambda: redis_client).get(TASK, key) is None

    def test_status_shows_counts_and_open_claims(self, stores: Any) -> None:
        """status prints the records by state and lists an open claim with its holder."""
        key = uuid.uuid4().hex
        make_record(stores, key, finish=False)
        runner = CliRunner()
        shown = runner.invoke(cli, ["status", "--limit", "1000"])
        assert shown.exit_code == 0, shown.output
        assert "in_progress" in shown.output and "open claims" in shown.output
        as_json = runner.invoke(cli, ["status", "--json", "--limit", "1000"])
        data = json.loads(as_json.output)
        assert data["by_state"]["in_progress"] >= 1
        mine = [h for h in data["holders"] if h["key"] == f"{TASK}:{key}"]
        assert mine and mine[0]["owner"] == "t-1" and mine[0]["alive"]
        records_for(stores).purge(TASK, key, force=True)


class TestDescribe:
    def test_describe_reports_state_holders_and_cache(self, stores: Any, redis_client: Any) -> None:
        """describe() counts records by state, lists open claims as Holders, sizes the cache."""
        from resilience.holders import Holder
        from resilience.idempotency.backends.cached import cache_key

        open_key, done_key = uuid.uuid4().hex, uuid.uuid4().hex
        make_record(stores, open_key, finish=False)
        make_record(stores, done_key, finish=True)
        redis_client.set(cache_key(TASK, done_key), '{"f": "f", "t": "t-1", "r": 1}')
        state = describe(stores, holders_limit=10_000)
        assert state.by_state["in_progress"] >= 1 and state.by_state["succeeded"] >= 1
        assert state.total == sum(state.by_state.values())
        assert state.cached_results == 1
        held = [h for h in state.holders if h.key == f"{TASK}:{open_key}"]
        assert held == [
            Holder(
                kind="idempotency",
                key=f"{TASK}:{open_key}",
                owner="t-1",
                token=1,
                held_seconds=held[0].held_seconds,
                alive=True,
            )
        ]
        assert all(h.key != f"{TASK}:{done_key}" for h in state.holders)
        assert describe(stores, cache_size=False).cached_results is None
        json.dumps(state.as_dict())
        records_for(stores).purge(TASK, open_key, force=True)
