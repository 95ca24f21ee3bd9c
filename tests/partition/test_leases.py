"""Lease holders under a partition (issue 25): the cluster-wide concurrency limit's slot, a
lease in the guard Redis, held by a worker cut from that Redis.

The tasks (tasks_leases.py) record their starts and ends in PostgreSQL, which the cut worker
still reaches, and ignore their results (the guard Redis also keeps results).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

from tests.harness import ROOT, wait_for
from tests.partition.conftest import WORKER_ENV, Partition
from tests.partition.tasks_leases import CREATE_TABLE, LEASE_SECONDS, PREFIX

pytestmark = pytest.mark.chaos

#: The slot's holder sleeps this long: under its soft limit, so it ends on its own.
HOLD_SECONDS = 6.0


def _events(partition: Partition, run_id: str) -> list[Any]:
    with partition.engine().connect() as connection:
        return list(connection.execute(text(
            "SELECT event, node, task_id, extract(epoch FROM at)::float8 AS at "
            "FROM partition_lease_events WHERE run_id = :run_id ORDER BY id"),
            {"run_id": run_id}))


def _intervals(events: list[Any]) -> dict[str, tuple[str, float, float | None]]:
    """Task id -> (node, start, end or None) of each body that started."""
    found: dict[str, tuple[str, float, float | None]] = {}
    for event in events:
        if event.event == "start":
            found[event.task_id] = (event.node, event.at, None)
        elif event.event == "end" and event.task_id in found:
            node, start, _ = found[event.task_id]
            found[event.task_id] = (node, start, event.at)
    return found


class TestConcurrencySlotHolderCutFromGuardRedis:
    def test_the_slot_returns_when_its_lease_ends_and_holders_never_overlap(
        self, healed: Partition
    ) -> None:
        """Worker a takes the one slot and is cut from the guard Redis 0.5 s into a 6 s body;
        worker b's job is DEFERRED until a's 10 s lease ends (a's release fails on the cut),
        then runs, never beside a's body. Healed as b starts (a's release may still be in
        flight); a job sent to a then is DEFERRED while b holds (a's late release frees only
        its own lease) and runs after b: three bodies, one at a time."""
        with healed.engine().begin() as connection:
            connection.exec_driver_sql(CREATE_TABLE)
        run_id = uuid.uuid4().hex[:12]
        first = healed.send(PREFIX + "slot", node="a", run_id=run_id, seconds=HOLD_SECONDS)
        wait_for(lambda: first in _intervals(_events(healed, run_id)), timeout_seconds=30,
                 message="a takes the slot")
        time.sleep(0.5)
        cut_at = healed.cut("a", "redis")
        try:
            second = healed.send(PREFIX + "slot", node="b", run_id=run_id,
                                 seconds=HOLD_SECONDS)
            wait_for(lambda: second in _intervals(_events(healed, run_id)),
                     timeout_seconds=LEASE_SECONDS + 15, interval=0.1,
                     message="b takes the slot once a's lease ends")
        finally:
            healed_at = healed.heal("a", "redis")
        third = healed.send(PREFIX + "slot", node="a", run_id=run_id, seconds=1.0)

        def all_ended() -> bool:
            found = _intervals(_events(healed, run_id))
            return len(found) == 3 and all(end is not None for _, _, end in found.values())

        wait_for(all_ended, timeout_seconds=LEASE_SECONDS + 20, interval=0.2,
                 message="the three bodies end")
        events = _events(healed, run_id)
        found = _intervals(events)
        spans = sorted((start, end, node, task) for task, (node, start, end) in found.items())
        a_start, b_start = found[first][1], found[second][1]
        deferred = {task: [e.at for e in events if e.event == "deferred" and e.task_id == task]
                    for task in (second, third)}
        print(f"\nconcurrency lease {LEASE_SECONDS:g} s, a cut {cut_at - a_start:.2f} s after "
              f"its start: b ran {b_start - a_start:.2f} s after a's start "
              f"({b_start - cut_at:.2f} s after the cut, {len(deferred[second])} deferrals), "
              f"healed {healed_at - cut_at:.2f} s after the cut; the job sent to a after the "
              f"heal: {len(deferred[third])} deferrals, ran "
              f"{found[third][1] - found[second][2]:.2f} s after b's end")
        for (_, end, node, _), (start, _, other, _) in pairwise(spans):
            assert end <= start, f"{node}'s body still ran when {other}'s began: {spans}"
        # The slot came back when a's lease ended (acquired just before a's start), not
        # when a's body ended (6 s) nor when a's release could reach Redis again.
        assert LEASE_SECONDS - 1.0 <= b_start - a_start <= LEASE_SECONDS + 4.0, spans
        assert deferred[second], "b was DEFERRED while a's lease ran"
        assert found[third][1] >= found[second][2], "the third job waited for b's release"
        assert deferred[third], "the job sent after the heal was DEFERRED while b held"


#: Outbox rows of the relay test, inserted in transactions of ten before the relays start.
OUTBOX_ROWS = 300


def _relay(partition: Partition, node: str, log_path: Path) -> subprocess.Popen[bytes]:
    """`jobs outbox relay` (batches of 10) in `node`'s namespace, on the topology's stores."""
    env = {**os.environ, **WORKER_ENV, **partition.environment(), "PARTITION_NODE": node,
           "PYTHONPATH": str(ROOT)}
    env.pop("PYTEST_CURRENT_TEST", None)
    with log_path.open("ab") as log:
        return subprocess.Popen(
            ["ip", "netns", "exec", partition.topology.nodes[node].namespace, sys.executable,
             "-m", "jobs", "outbox", "relay", "--batch-size", "10", "--poll-seconds", "0.2"],
            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


class TestOutboxRelayCutFromPostgres:
    def test_every_committed_row_is_published_and_runs_once(
        self, healed: Partition, tmp_path: Path
    ) -> None:
        """Relays in namespaces a and b drain 300 committed rows; relay a is cut from
        PostgreSQL once a fifth is published, most likely inside a batch (rows locked,
        perhaps published, marks uncommitted). Relay b publishes every other row at once and
        a's locked rows once PostgreSQL ends a's session; every row ends published, and each
        job's effect (an `@idempotent` ledger row, keyed on the outbox row) exists once."""
        from sqlalchemy.orm import Session

        from tests.partition.tasks_leases import CREATE_EFFECTS, outbox_effect

        engine = healed.engine()
        with engine.begin() as connection:
            connection.exec_driver_sql(CREATE_EFFECTS)
            connection.exec_driver_sql("DELETE FROM resilience_outbox")
        run_id = uuid.uuid4().hex[:12]
        for start in range(0, OUTBOX_ROWS, 10):
            with Session(engine) as session, session.begin():
                for n in range(start, start + 10):
                    outbox_effect.enqueue_in(session, run_id=run_id, n=n)

        def counts() -> Any:
            with engine.connect() as connection:
                return connection.execute(text(
                    "SELECT count(*) FILTER (WHERE state = 'published') AS published, "
                    "count(*) FILTER (WHERE state = 'pending') AS pending, "
                    "(SELECT count(*) FROM partition_outbox_effects WHERE run_id = :run_id) "
                    "AS effects, (SELECT count(DISTINCT n) FROM partition_outbox_effects "
                    "WHERE run_id = :run_id) AS distinct_effects FROM resilience_outbox"),
                    {"run_id": run_id}).one()

        address = healed.topology.nodes["a"].address
        relays = [_relay(healed, node, tmp_path / f"relay-{node}.log") for node in ("a", "b")]
        try:
            wait_for(lambda: counts().published >= OUTBOX_ROWS // 5, timeout_seconds=60,
                     interval=0.01, message="the relays publish a fifth of the rows")
            cut_at = healed.cut("a", "postgres")
            with engine.connect() as connection:
                held = connection.execute(text(
                    "SELECT pid, state FROM pg_stat_activity "
                    "WHERE client_addr = CAST(:address AS inet) "
                    "AND (state LIKE 'idle in transaction%' "
                    "OR (state = 'active' AND query ILIKE '%resilience_outbox%'))"),
                    {"address": address}).all()
            at_cut = counts()
            wait_for(lambda: counts().pending == 0, timeout_seconds=40, interval=0.1,
                     message="every row published")
            drained_at = time.time()

            def a_session_gone() -> bool:
                with engine.connect() as connection:
                    return not connection.execute(
                        text("SELECT 1 FROM pg_stat_activity WHERE pid = ANY(:pids)"),
                        {"pids": [row.pid for row in held]}).all()

            wait_for(lambda: counts().effects >= OUTBOX_ROWS, timeout_seconds=30,
                     interval=0.1, message="every job ran")
            wait_for(a_session_gone, timeout_seconds=30, interval=0.1,
                     message="PostgreSQL ends a's session")
            session_ended_at = time.time()
        finally:
            healed.heal("a", "postgres")
            for process in relays:
                process.terminate()
            for process in relays:
                try:
                    process.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
        time.sleep(1.0)  # a late delivery of a row published twice would land here
        final = counts()
        print(f"\noutbox relay a cut from PostgreSQL with {at_cut.published} of {OUTBOX_ROWS} "
              f"rows published; a's session held a transaction at the cut: "
              f"{[row.state for row in held] or 'no'}; every row published "
              f"{drained_at - cut_at:.2f} s after the cut, a's session gone "
              f"{session_ended_at - cut_at:.2f} s after it; effects {final.effects} "
              f"({final.distinct_effects} distinct)")
        assert final.published == OUTBOX_ROWS and final.pending == 0, final
        assert final.distinct_effects == OUTBOX_ROWS, final
        assert final.effects == OUTBOX_ROWS, f"a job took effect twice: {final}"
        # a's locked rows wait for PostgreSQL to end its session (TCP keepalive, ~11 s),
        # never for the heal.
        assert drained_at - cut_at <= 25, drained_at - cut_at
