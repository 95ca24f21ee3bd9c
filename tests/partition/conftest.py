"""The partition fixture: stores in one network namespace, workers in others, cuts between.

One topology per test module (built in well under a second; the stores and two workers
start in a few seconds): PostgreSQL, the broker's Redis, the guard Redis (also the result
backend) and three Redlock nodes each listen on an address of their own in the stores
namespace; worker `a` consumes the critical queue, worker `b` the standard queue, each in
its own namespace. Every cut is healed after each test; at the end every process is
stopped and every namespace deleted, whatever the tests did. A run that crashed leaves
namespaces named after its pid, which the next run removes (`netns.remove_stale`).
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from kombu.pidbox import Mailbox

from tests.harness import Worker
from tests.partition.netns import Topology, enter, remove_stale

#: The stores of the topology; each gets its own address on the bridge.
STORES = ("postgres", "broker", "redis", "redlock0", "redlock1", "redlock2")

#: Worker settings for the partition tests: bodies up to 45 s (the soak variant), with the
#: broker's visibility timeout above the hard limit as the platform requires.
WORKER_ENV = {
    "JOBS_CRITICAL__SOFT_TIME_LIMIT_SECONDS": "60",
    "JOBS_CRITICAL__HARD_TIME_LIMIT_SECONDS": "70",
    "JOBS_STANDARD__SOFT_TIME_LIMIT_SECONDS": "60",
    "JOBS_STANDARD__HARD_TIME_LIMIT_SECONDS": "70",
    "JOBS_VISIBILITY_TIMEOUT_SECONDS": "120",
}


class NamespacedWorker(Worker):
    """A real `celery worker` inside a node's namespace, reached through that topology's
    broker (the session's app is configured for the session's own broker)."""

    def __init__(self, queues: str, *, namespace: str, broker_url: str, **options: Any) -> None:
        super().__init__(queues, **options)
        self.namespace = namespace
        self.broker_url = broker_url

    def command(self) -> list[str]:
        return ["ip", "netns", "exec", self.namespace, *super().command()]

    def wait_ready(self, timeout_seconds: float = 60) -> None:
        from jobs import app

        deadline = time.monotonic() + timeout_seconds
        with app.connection_for_write(self.broker_url) as connection:
            # Celery's mailbox publishes through the app's producer pool, on the session's
            # broker, whatever the connection: this one publishes on the connection.
            mailbox = Mailbox("celery", type="fanout", accept=["json"], serializer="json")
            while time.monotonic() < deadline:
                if self.process is not None and self.process.poll() is not None:
                    raise RuntimeError(f"worker {self.nodename} exited:\n{self.log_tail()}")
                if mailbox(connection)._broadcast("ping", {}, [self.nodename], reply=True,
                                                  timeout=0.5):
                    return
        raise TimeoutError(f"worker {self.nodename} not ready:\n{self.log_tail()}")


class Partition:
    """The running topology: its stores' URLs, its workers, and `cut`/`heal`."""

    def __init__(self, topology: Topology, folder: Path) -> None:
        self.topology = topology
        self.folder = folder
        self.servers: list[Any] = []
        self.workers: dict[str, NamespacedWorker] = {}
        address = topology.stores
        self.database_url = f"postgresql://postgres@{address['postgres']}:5432/jobs_partition"
        self.broker_url = f"redis://{address['broker']}:6379/0"
        self.redis_url = f"redis://{address['redis']}:6379/0"
        self.redlock_urls = [f"redis://{address[f'redlock{index}']}:6379/0"
                             for index in range(3)]
        self._engine: Any = None

    # -- building ----------------------------------------------------------------------------
    def start_stores(self) -> None:
        """PostgreSQL and the five Redis servers, in the stores namespace, all at once."""
        from jobs.embedded import (
            EmbeddedProcess,
            postgres_command,
            postgres_ready,
            prepare_postgres,
            redis_command,
            redis_ready,
        )

        namespace = self.topology.stores_namespace
        for name in ("broker", "redis", "redlock0", "redlock1", "redlock2"):
            command = _bound(redis_command(6379, self.folder / name, persist=False),
                             "--bind", self.topology.stores[name])
            self.servers.append(EmbeddedProcess(
                command, url=f"redis://{self.topology.stores[name]}:6379/0", ready=redis_ready,
                log_path=self.folder / name / "redis.log", preexec=enter(namespace)))
        data = self.folder / "pg"
        user = prepare_postgres(data)
        with (data / "pg_hba.conf").open("a") as hba:  # initdb trusts loopback only
            hba.write(f"host all all {self.topology.subnet}.0/24 trust\n")
        command = _bound(postgres_command(data, 5432), "-h", self.topology.stores["postgres"])
        self.servers.append(EmbeddedProcess(
            command, url=self.database_url.rsplit("/", 1)[0] + "/postgres",
            ready=postgres_ready, log_path=self.folder / "pg.log",
            preexec=_in_namespace_as(namespace, user)))
        with ThreadPoolExecutor(len(self.servers)) as pool:  # side by side: PostgreSQL ~1 s
            list(pool.map(lambda server: server.start(), self.servers))
        from jobs.db import migrate
        from tests.partition.tasks import CREATE_TABLES

        migrate(self.database_url)
        with self.engine().begin() as connection:
            connection.exec_driver_sql(CREATE_TABLES)

    def start_workers(self) -> None:
        """Worker `a` on the critical queue, worker `b` on the standard queue."""
        for node, queue in (("a", "critical"), ("b", "standard")):
            self.workers[node] = NamespacedWorker(
                queue, name=f"partition-{node}", concurrency=2,
                namespace=self.topology.nodes[node].namespace, broker_url=self.broker_url,
                env={**WORKER_ENV, **self.environment(), "PARTITION_NODE": node})
        for worker in self.workers.values():
            worker.start(wait=False)
        for worker in self.workers.values():
            worker.wait_ready()

    def environment(self) -> dict[str, str]:
        """What a worker in the topology needs to reach its stores."""
        return {"DATABASE_URL": self.database_url, "BROKER_URL": self.broker_url,
                "REDIS_URL": self.redis_url, "REDLOCK_URLS": ",".join(self.redlock_urls)}

    def stop(self) -> None:
        """Stop workers and stores (what survives dies with its namespace)."""
        self.topology.heal_all()
        for worker in self.workers.values():
            worker.stop(timeout_seconds=5)
        if self._engine is not None:
            self._engine.dispose()
        for server in reversed(self.servers):
            server.kill()

    # -- using -------------------------------------------------------------------------------
    def cut(self, a: str, b: str) -> float:
        """Cut `a` from `b` (a node; a node, a store or "stores"); the time of the cut."""
        self.topology.cut(a, b)
        return time.time()

    def heal(self, a: str, b: str) -> float:
        """Heal the cut between `a` and `b`; the time it healed."""
        self.topology.heal(a, b)
        return time.time()

    def send(self, name: str, *, node: str, **kwargs: Any) -> str:
        """Publish task `name` to the queue `node`'s worker consumes; the task id."""
        from jobs import app

        with app.connection_for_write(self.broker_url) as connection:
            result = app.send_task(name, kwargs=kwargs, queue=self.workers[node].queues,
                                   connection=connection)
        return str(result.id)

    def redis(self) -> Any:
        """A client of the topology's guard Redis (run records, results)."""
        import redis

        return redis.Redis.from_url(self.redis_url, socket_timeout=5)

    def engine(self) -> Any:
        """An engine on the topology's PostgreSQL (never cut: the test process's link)."""
        if self._engine is None:
            from sqlalchemy import create_engine

            self._engine = create_engine(
                self.database_url.replace("postgresql://", "postgresql+psycopg2://"),
                pool_pre_ping=True)
        return self._engine

    def runs(self, run_id: str) -> list[dict[str, Any]]:
        """The start/end records of `run_id` (tasks.hold, tasks.fenced_writes), in order."""
        from tests.partition.tasks import runs_key

        client = self.redis()
        try:
            return [json.loads(item) for item in client.lrange(runs_key(run_id), 0, -1)]
        finally:
            client.close()

    def state(self, task_id: str) -> str | None:
        """A task's state in the result backend (the guard Redis), None before any."""
        client = self.redis()
        try:
            raw = client.get(f"celery-task-meta-{task_id}")
        finally:
            client.close()
        return json.loads(raw)["status"] if raw else None


def _bound(command: list[str], flag: str, address: str) -> list[str]:
    """`command` with the value after `flag` (its listen address) replaced by `address`."""
    command = list(command)
    command[command.index(flag) + 1] = address
    return command


def _in_namespace_as(namespace: str, user: pwd.struct_passwd | None) -> Callable[[], None]:
    move = enter(namespace)

    def start() -> None:
        move()  # needs root: before dropping to the server's user
        if user is not None:
            os.setgid(user.pw_gid)
            os.setuid(user.pw_uid)

    return start


@pytest.fixture(scope="module")
def partition(app: Any) -> Iterator[Partition]:
    """A built topology with its stores and workers `a` and `b` running (module-wide)."""
    remove_stale()
    folder = Path(tempfile.mkdtemp(prefix="jobs-partition-"))
    topology = Topology(("a", "b"), STORES)
    built = Partition(topology, folder)
    try:
        topology.build()
        built.start_stores()
        built.start_workers()
        yield built
    finally:
        try:
            built.stop()
        finally:
            topology.destroy()
            shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture()
def healed(partition: Partition) -> Iterator[Partition]:
    """The module's topology, every cut healed after the test."""
    yield partition
    partition.topology.heal_all()
