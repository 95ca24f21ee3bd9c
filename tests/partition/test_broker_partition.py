"""A worker cut from the broker with idempotent jobs in flight, then healed (issue 25).

Two workers of this module's own, `a` and `b`, consume the critical queue from the nodes'
namespaces with a short visibility timeout (33 s, the least the platform allows for 3 s
time limits and 2 s countdowns), so a message that worker `a` holds when it is cut comes
back within the test: `b`'s transport sweeps expired unacknowledged messages every 3 s
(`jobs.platform.restore_sweep`) and puts it back in the queue. `a` keeps its other stores:
its bodies finish and commit during the cut; only its acknowledgements wait.

What is asserted comes from the stores and the workers' task events, never from logs:
one ledger row per job (PostgreSQL, no unique constraint), every job SUCCESS, only jobs
`a` held at the cut delivered twice, and each of those ended REPLAYED (`task-replayed`,
which Flower shows; the result keeps the first run's SUCCESS, a final state).

While cut, `a`'s main process blocks in a broker write (no socket timeout): it reads its
pool's results only after the heal, and its time-limit timers fire first; a job that had
succeeded must not be reported killed by its hard limit (`TestStalledWorkerTimeLimits`).
"""

from __future__ import annotations

import json
import shutil
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from sqlalchemy import text

from jobs.tiers import TIERS
from tests.harness import wait_for
from tests.partition.conftest import STORES, NamespacedWorker, Partition
from tests.partition.netns import Topology, remove_stale
from tests.partition.tasks_broker import CREATE_LEDGER, runs_key

pytestmark = pytest.mark.chaos

#: Least visibility timeout the platform accepts for these limits (hard limit or longest
#: countdown, plus its 30 s margin); a message `a` holds comes back after it.
VISIBILITY_TIMEOUT_SECONDS = 33

#: The module's workers: 2 s soft and 3 s hard limits on every tier, 2 s countdowns, and
#: only tasks_broker.py loaded (other modules' tasks carry longer limits).
FAST_ENV = {
    "JOBS_IMPORTS": "tests.partition.tasks_broker",
    "JOBS_VISIBILITY_TIMEOUT_SECONDS": str(VISIBILITY_TIMEOUT_SECONDS),
    "JOBS_MAX_COUNTDOWN_SECONDS": "2",
    **{f"JOBS_{tier.upper()}__SOFT_TIME_LIMIT_SECONDS": "2" for tier in TIERS},
    **{f"JOBS_{tier.upper()}__HARD_TIME_LIMIT_SECONDS": "3" for tier in TIERS},
}

#: Each job: 1 s of work; even indexes transactional, odd ones not.
BODY_SECONDS = 1.0


def _task_name(index: int) -> str:
    return "tests.partition.broker." + ("ledger" if index % 2 == 0 else "effect")


@pytest.fixture(scope="module")
def cluster(app: Any) -> Iterator[Partition]:
    """The partition topology with this module's workers `a` and `b` (critical queue,
    short visibility timeout) and the ledger table; torn down whatever happens."""
    remove_stale()
    folder = Path(tempfile.mkdtemp(prefix="jobs-broker-partition-"))
    topology = Topology(("a", "b"), STORES)
    built = Partition(topology, folder)
    try:
        topology.build()
        built.start_stores()
        with built.engine().begin() as connection:
            connection.exec_driver_sql(CREATE_LEDGER)
        for node in ("a", "b"):
            built.workers[node] = NamespacedWorker(
                "critical", name=f"broker-{node}", concurrency=2,
                namespace=topology.nodes[node].namespace, broker_url=built.broker_url,
                env={**FAST_ENV, **built.environment(), "PARTITION_NODE": node})
        for worker in built.workers.values():
            worker.start(wait=False)
        for worker in built.workers.values():
            worker.wait_ready()
        yield built
    finally:
        try:
            built.stop()
        finally:
            topology.destroy()
            shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture()
def healed(cluster: Partition) -> Iterator[Partition]:
    """The module's topology with both workers answering (after an earlier test's cut,
    `a` goes on only at its connection's next retransmission), every cut healed after."""
    for worker in cluster.workers.values():
        worker.wait_ready(timeout_seconds=150)
    yield cluster
    cluster.topology.heal_all()


class TaskEvents:
    """The workers' events (task-received, task-replayed, heartbeats, ...) as they arrive,
    captured on the topology's broker from the test process's link (never cut)."""

    def __init__(self, broker_url: str) -> None:
        self.broker_url = broker_url
        self.events: list[dict[str, Any]] = []
        self._receiver: Any = None
        self._thread = threading.Thread(target=self._capture, daemon=True)

    def _capture(self) -> None:
        from jobs import app

        with app.connection_for_read(self.broker_url) as connection:
            self._receiver = app.events.Receiver(
                connection, handlers={"*": self.events.append})
            self._receiver.capture(limit=None, timeout=None, wakeup=False)

    def __enter__(self) -> TaskEvents:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._receiver is not None:
            self._receiver.should_stop = True
        self._thread.join(5)

    def of(self, kind: str, **fields: Any) -> list[dict[str, Any]]:
        """The events of type `kind` whose fields match `fields`."""
        return [event for event in list(self.events) if event.get("type") == kind
                and all(event.get(name) == value for name, value in fields.items())]


def _send(partition: Partition, run_id: str, index: int) -> str:
    from jobs import app

    with app.connection_for_write(partition.broker_url) as connection:
        return str(app.send_task(_task_name(index), queue="critical", connection=connection,
                                 kwargs={"run_id": run_id, "index": index,
                                         "seconds": BODY_SECONDS}).id)


def _starts(partition: Partition, run_id: str) -> list[dict[str, Any]]:
    client = partition.redis()
    try:
        return [json.loads(item) for item in client.lrange(runs_key(run_id), 0, -1)]
    finally:
        client.close()


def _ledger(partition: Partition, run_id: str) -> dict[int, int]:
    """Committed effects per job index."""
    with partition.engine().connect() as connection:
        return {row.index: row.n for row in connection.execute(text(
            "SELECT index, count(*) AS n FROM broker_partition_ledger WHERE run_id = :run_id "
            "GROUP BY index"), {"run_id": run_id})}


def _dead_letters(partition: Partition, task_ids: list[str]) -> list[tuple[str, str, str]]:
    with partition.engine().connect() as connection:
        return [(row.task_id, row.guard, row.reason) for row in connection.execute(text(
            "SELECT task_id, guard, reason FROM resilience_dead_letters "
            "WHERE task_id = ANY(:ids)"), {"ids": task_ids})]


class TestStalledWorkerTimeLimits:
    def test_a_job_that_ended_during_the_cut_is_not_dead_lettered_on_resuming(
        self, healed: Partition
    ) -> None:
        """Jobs with a hard limit (3 s) and no soft one end and commit on worker a while a
        is cut from the broker; a's main process, blocked in a broker write, reads their
        results only once the heal lets it go on, and its hard-limit timers fire first
        (billiard reports TimeLimitExceeded). They are not dead-lettered as killed by
        their limit (they were, before `JobTask._ended_before_limit`): SUCCESS, one
        ledger row each, no dead letter."""
        from jobs import app

        run_id = uuid.uuid4().hex[:12]
        with app.connection_for_write(healed.broker_url) as connection:
            tasks = [str(app.send_task(
                "tests.partition.broker.hard_limited", queue="critical", connection=connection,
                kwargs={"run_id": run_id, "index": index, "seconds": BODY_SECONDS}).id)
                for index in range(4)]
        wait_for(lambda: len([s for s in _starts(healed, run_id) if s["node"] == "a"])
                 >= 2, timeout_seconds=20, message="a runs two jobs")
        a_tasks = [s["task_id"] for s in _starts(healed, run_id) if s["node"] == "a"]
        healed.cut("a", "broker")
        try:
            wait_for(lambda: _ledger(healed, run_id) == dict.fromkeys(range(4), 1),
                     timeout_seconds=20, message="every job commits")
            time.sleep(3)  # past a's hard limits: 3 s from the start of its bodies
        finally:
            healed.heal("a", "broker")
        # a goes on at its next retransmission (~6 s after the cut): its late timers fire,
        # then it acknowledges the two messages.
        wait_for(lambda: not _unacked(healed, a_tasks), timeout_seconds=60,
                 message="a acknowledges its jobs")
        time.sleep(1)
        letters = _dead_letters(healed, tasks)
        assert all(healed.state(task) == "SUCCESS" for task in tasks)
        assert _ledger(healed, run_id) == dict.fromkeys(range(4), 1)
        assert letters == [], f"jobs that succeeded were dead-lettered: {letters}"


def _unacked(partition: Partition, task_ids: list[str]) -> list[str]:
    """Which of `task_ids` the broker still lists as unacknowledged."""
    client = redis.Redis.from_url(partition.broker_url, socket_timeout=5)
    try:
        held = b"".join(client.hvals("unacked"))
    finally:
        client.close()
    return [task for task in task_ids if task.encode() in held]


class TestWorkerPartitionedFromBroker:
    @pytest.mark.parametrize("cut_seconds", [
        None, pytest.param(75, marks=pytest.mark.soak),
    ], ids=["until-replayed", "past-health-check"])
    def test_in_flight_jobs_come_back_replayed_and_every_effect_commits_once(
        self, healed: Partition, cut_seconds: float | None
    ) -> None:
        """Worker a is cut from the broker (not from PostgreSQL or the guard Redis) while
        it runs idempotent jobs; b goes on. a's bodies finish and commit, but their
        acknowledgements cannot reach the broker: after the visibility timeout b's
        transport puts those messages back and b's deliveries of them end REPLAYED. Every
        job: one ledger row, SUCCESS; only jobs a held at the cut were delivered again,
        once, each REPLAYED, its body run once. Short: healed once the replays are seen
        (~35 s into the cut). Soak: a 75 s cut, past kombu's health check of a's
        consuming connections (26-51 s); jobs keep coming after the heal until a takes
        one, and it prints how long that took."""
        a_host, b_host = (healed.workers[node].nodename for node in ("a", "b"))
        run_id = uuid.uuid4().hex[:12]
        with TaskEvents(healed.broker_url) as events:
            wait_for(lambda: {e.get("hostname") for e in events.of("worker-heartbeat")}
                     >= {a_host, b_host}, timeout_seconds=10,
                     message="both workers' heartbeats reach the receiver")
            tasks = {index: _send(healed, run_id, index) for index in range(8)}
            wait_for(lambda: len([s for s in _starts(healed, run_id) if s["node"] == "a"])
                     >= 2, timeout_seconds=20, message="a runs two jobs")
            cut_at = healed.cut("a", "broker")
            running = {s["task_id"] for s in _starts(healed, run_id) if s["node"] == "a"}
            try:
                wait_for(lambda: {e["uuid"] for e in events.of("task-replayed")} >= running,
                         timeout_seconds=VISIBILITY_TIMEOUT_SECONDS + 20,
                         message="a's jobs are delivered to b and replayed")
                replayed_at = time.time()
                if cut_seconds is not None:
                    time.sleep(max(0.0, cut_at + cut_seconds - time.time()))
            finally:
                healed_at = healed.heal("a", "broker")
            resumed_after = None
            if cut_seconds is not None:
                # a consumes again: a job every 0.5 s until a receives one.
                index, deadline = len(tasks), time.time() + 150
                while not (resumed := [e["timestamp"] for e in events.of(
                        "task-received", hostname=a_host) if e["timestamp"] > healed_at]) \
                        and time.time() < deadline:
                    tasks[index] = _send(healed, run_id, index)
                    index += 1
                    time.sleep(0.5)
                assert resumed, "a never consumed again after the heal"
                resumed_after = min(resumed) - healed_at
            wait_for(lambda: all(healed.state(task) == "SUCCESS" for task in tasks.values()),
                     timeout_seconds=30, message="every job succeeds")
            wait_for(lambda: _ledger(healed, run_id) == dict.fromkeys(tasks, 1),
                     timeout_seconds=10, message="one ledger row per job")
        # Task events are buffered in the worker and stamped when made: a's reach the
        # receiver after its connection is back, with the time a received the job.
        held = {e["uuid"] for e in events.of("task-received", hostname=a_host)
                if e["timestamp"] < cut_at}
        deliveries: dict[str, int] = {}
        for event in events.of("task-received"):
            deliveries[event["uuid"]] = deliveries.get(event["uuid"], 0) + 1
        again = {task for task, count in deliveries.items() if count > 1}
        replayed = {e["uuid"]: e for e in events.of("task-replayed")}
        runs: dict[int, int] = {}
        for start in _starts(healed, run_id):
            runs[start["index"]] = runs.get(start["index"], 0) + 1
        print(f"cut {healed_at - cut_at:.1f}s; a held {len(held)} jobs at the cut, "
              f"{len(again)} delivered again and replayed {replayed_at - cut_at:.1f}s after "
              f"the cut; a consumed again "
              f"{'(not measured)' if resumed_after is None else f'{resumed_after:.1f}s'} "
              f"after the heal; {len(tasks)} jobs, one ledger row each")
        assert running <= held and again == running, "a held jobs not delivered again"
        assert all(deliveries[task] == 2 for task in again)
        assert set(replayed) == again
        assert all(replayed[task]["hostname"] == b_host for task in again)
        assert all(replayed[task]["details"]["original_task_id"] == task for task in again)
        assert runs == dict.fromkeys(tasks, 1), "a body ran twice"
