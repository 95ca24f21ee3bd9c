"""Bounded waits under a partition (issue 25): a worker cut from the guard Redis reaches
its guard's store-down outcome within the clients' timeouts, not at the time limit.

The guard Redis of the topology also keeps results and the run records of tasks.py, so the
tasks here (tasks_bounds.py) ignore their results and record their events in PostgreSQL,
which worker a still reaches.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest
from sqlalchemy import text

from tests.harness import wait_for
from tests.partition.conftest import Partition
from tests.partition.tasks_bounds import CREATE_TABLE, PREFIX

pytestmark = pytest.mark.chaos

#: The guard Redis client's connect and read timeout (`resilience_socket_timeout_seconds`).
SOCKET_TIMEOUT_SECONDS = 5.0
#: A job cut from the guard Redis reaches its store-down outcome within this many seconds
#: of the cut: one client timeout and slack for a loaded box (5.0 s measured; 20 s when
#: each guard's call waited out its own timeout).
BOUND_SECONDS = SOCKET_TIMEOUT_SECONDS + 5


def _events(partition: Partition, run_id: str) -> list[Any]:
    with partition.engine().connect() as connection:
        return list(connection.execute(text(
            "SELECT event, node, task_id, extract(epoch FROM at)::float8 AS at "
            "FROM partition_bound_events WHERE run_id = :run_id ORDER BY id"),
            {"run_id": run_id}))


def _prepared(partition: Partition) -> str:
    """The events table, and worker a shown to run a guarded job (connections open)."""
    with partition.engine().begin() as connection:
        connection.exec_driver_sql(CREATE_TABLE)
    run_id = uuid.uuid4().hex[:12]
    partition.send(PREFIX + "open", node="a", run_id=run_id)
    wait_for(lambda: _events(partition, run_id), timeout_seconds=30,
             message="a runs a guarded job before the cut")
    return uuid.uuid4().hex[:12]


class TestWorkerCutFromGuardRedis:
    @pytest.mark.parametrize(("pairs", "cut_seconds"), [
        (1, None),
        pytest.param(6, 30, marks=pytest.mark.soak),
    ], ids=["short", "long-cut"])
    def test_each_guard_policy_applies_within_one_timeout_and_each_job_runs_once(
        self, healed: Partition, pairs: int, cut_seconds: float | None
    ) -> None:
        """Worker a, cut from the guard Redis, gets `@rate_limit` jobs, fail-open and
        fail-closed in pairs: the guards' Redis calls of a job give up after one client
        timeout (the first that times out makes the process's next calls fail at once), so
        within the bound of its sending, not at the 70 s time limit, each fail-open job runs
        (FAIL-OPEN) and each fail-closed one is DEFERRED without running. After the heal the
        deferred jobs run; every job ran exactly once. (Before the hold, the platform's
        guards each waited out the timeout: DEFERRED 20 s after sending.) Short: one pair,
        healed once both outcomes show. Soak: a pair every 5 s through a 30 s cut."""
        run_id = _prepared(healed)
        sent: dict[str, tuple[str, float]] = {}
        cut_at = healed.cut("a", "redis")
        try:
            for index in range(pairs):
                for kind in ("closed", "open"):
                    sent[healed.send(PREFIX + kind, node="a", run_id=run_id)] = (
                        kind, time.time())
                if index < pairs - 1:
                    time.sleep((cut_seconds or 0) / pairs)

            def outcomes() -> dict[str, Any]:
                """Each job's first outcome while cut: its run (open), its deferral (closed)."""
                found: dict[str, Any] = {}
                for event in _events(healed, run_id):
                    if event.task_id in sent and event.task_id not in found:
                        found[event.task_id] = event
                return found if len(found) == len(sent) else {}

            first = wait_for(outcomes, timeout_seconds=BOUND_SECONDS + 20, interval=0.2,
                             message="every job's store-down outcome")
            if cut_seconds is not None:
                time.sleep(max(0.0, cut_at + cut_seconds - time.time()))
            while_cut = _events(healed, run_id)
        finally:
            healed_at = healed.heal("a", "redis")
        closed = {task for task, (kind, _) in sent.items() if kind == "closed"}

        def closed_ran() -> list[Any]:
            runs = [e for e in _events(healed, run_id) if e.event == "run"
                    and e.task_id in closed]
            return runs if {e.task_id for e in runs} == closed else []

        after_heal = wait_for(closed_ran, timeout_seconds=30, interval=0.2,
                              message="the deferred jobs run after the heal")
        time.sleep(2)  # a second run, if any, would show by now
        events = _events(healed, run_id)
        waits = {task: first[task].at - at for task, (_, at) in sent.items()}
        print(f"outcome after sending: fail-open {_spread(waits, sent, 'open')}, "
              f"fail-closed (DEFERRED) {_spread(waits, sent, 'closed')}; "
              f"{len([e for e in events if e.event == 'deferred'])} deferrals in "
              f"{healed_at - cut_at:.1f}s of cut; the deferred ran "
              f"{max(e.at for e in after_heal) - healed_at:.1f}s after the heal at most")
        assert {task: first[task].event for task in sent} == {
            task: "run" if kind == "open" else "deferred" for task, (kind, _) in sent.items()}
        assert not [e for e in while_cut if e.event == "run" and e.task_id in closed]
        assert max(waits.values()) <= BOUND_SECONDS
        runs = sorted((e.task_id, e.node) for e in events if e.event == "run")
        assert runs == sorted((task, "a") for task in sent)


def _spread(waits: dict[str, float], sent: dict[str, tuple[str, float]], kind: str) -> str:
    values = [waits[task] for task, (of, _) in sent.items() if of == kind]
    return f"{min(values):.1f}-{max(values):.1f}s" if len(values) > 1 else f"{values[0]:.1f}s"


class TestWorkerCutFromPostgres:
    @pytest.mark.soak
    def test_the_server_ends_a_cut_off_transaction_and_a_waiting_writer_gets_through(
        self, healed: Partition
    ) -> None:
        """Worker a holds a row in an open `engine()` transaction and is cut from
        PostgreSQL: the server ends a's session (server-side keepalives and TCP user
        timeout set when it connected) within ~15 s, so a writer of the same key, waiting
        on a's transaction, gets through instead of waiting for the kernel's two hours."""
        run_id = _prepared(healed)
        healed.send(PREFIX + "hold_row", node="a", run_id=run_id, seconds=40)
        holding = wait_for(
            lambda: [e for e in _events(healed, run_id) if e.event.startswith("holding:")],
            timeout_seconds=30, message="a holds the row")
        pid = int(holding[0].event.split(":", 1)[1])
        cut_at = healed.cut("a", "postgres")
        try:
            with healed.engine().begin() as connection:
                connection.exec_driver_sql(f"SET LOCAL lock_timeout = {SERVER_BOUND_MS}")
                connection.execute(text("INSERT INTO partition_bound_rows (run_id) "
                                        "VALUES (:run_id) ON CONFLICT DO NOTHING"),
                                   {"run_id": run_id})
                through_after = time.time() - cut_at
                with healed.engine().connect() as other:
                    alive = other.execute(text(
                        "SELECT count(*) FROM pg_stat_activity WHERE pid = :pid"),
                        {"pid": pid}).scalar()
        finally:
            healed.heal("a", "postgres")
        print(f"a's transaction ended by the server {through_after:.1f}s after the cut; "
              f"the waiting writer got through then")
        assert alive == 0
        assert through_after <= 15


#: How long the test's own writer waits for the row before failing the test (ms).
SERVER_BOUND_MS = 30_000
