"""`@singleton` and `@exclusive` on real worker processes, real Redis nodes and PostgreSQL."""

from __future__ import annotations

import itertools
import time
from typing import Any

import pytest
from sqlalchemy import text

from resilience.errors import ConfigurationError, InvalidKey, NonJsonArguments
from resilience.locks import AdvisorySession, Redlock, SingletonConfig, SingletonGuard, singleton
from tests.harness import Worker, wait_for
from tests.resilience.locks.conftest import Nodes

pytestmark = [pytest.mark.usefixtures("locks_tables", "own_critical_queue", "purge_queues")]

QUEUE = "critical"


def runs(engine: Any, run_id: str) -> list[Any]:
    with engine.connect() as connection:
        return list(connection.execute(
            text("SELECT slot, task_id, pid, token, started_at, ended_at FROM locks_test_runs "
                 "WHERE run_id = :run_id ORDER BY started_at"), {"run_id": run_id}
        ))


def writes(engine: Any, run_id: str) -> list[Any]:
    with engine.connect() as connection:
        return list(connection.execute(
            text("SELECT task_id, token, outcome FROM locks_test_writes WHERE run_id = :run_id "
                 "ORDER BY id"), {"run_id": run_id}
        ))


def overlapping(rows: list[Any]) -> int:
    """Pairs of runs of one slot whose [start, end] intervals intersect."""
    overlaps = 0
    by_slot: dict[str, list[Any]] = {}
    for row in rows:
        by_slot.setdefault(row.slot, []).append(row)
    for slot_rows in by_slot.values():
        ordered = sorted(slot_rows, key=lambda r: r.started_at)
        for previous, current in itertools.pairwise(ordered):
            assert previous.ended_at is not None, "a run did not finish"
            overlaps += current.started_at < previous.ended_at
    return overlaps


def start_workers(worker_factory: Any, count: int, env: dict[str, str] | None = None,
                  ) -> list[Worker]:
    workers = [worker_factory(QUEUE, name=f"locks{i}", concurrency=1, env=env, wait=False)
               for i in range(count)]
    for worker in workers:
        worker.wait_ready()
    return workers


def worker_of(workers: list[Worker], pid: int) -> Worker:
    for worker in workers:
        if pid == worker.pid or pid in {child.pid for child in worker.children()}:
            return worker
    raise AssertionError(f"pid {pid} belongs to no test worker")


class TestKeys:
    def test_bad_keys(self) -> None:
        """Non-JSON key parts and bad key options fail with named errors."""

        def body(order: Any, fencing_token: int | None = None) -> None: ...

        with pytest.raises(ConfigurationError, match="not an argument"):
            singleton(key="{missing}")(body)
        with pytest.raises(ConfigurationError, match="template string or a callable"):
            singleton(key=42)(body)  # type: ignore[arg-type]
        guard = SingletonGuard(body, None, SingletonConfig())
        with pytest.raises(NonJsonArguments):
            guard.key_for("t", ({1, 2},), {})
        with pytest.raises(NonJsonArguments):
            guard.key_for("t", (object(),), {})
        by_function = SingletonGuard(body, lambda order, **_: {order}, SingletonConfig())
        with pytest.raises(InvalidKey, match="not JSON"):
            by_function.key_for("t", (1,), {})
        # f(1) and f(order=1) are one key; the injected token is never part of it.
        assert guard.key_for("t", (1,), {}) == guard.key_for("t", (), {"order": 1})
        assert guard.key_for("t", (1,), {}) == guard.key_for("t", (1,), {"fencing_token": 9})

    def test_non_json_argument_refused_at_enqueue(self, app: Any) -> None:
        """A set as a key part is refused before the message is published."""
        from tests.resilience.locks.tasks import singleton_run

        with pytest.raises(NonJsonArguments):
            singleton_run.delay("run", {1, 2})


@pytest.mark.chaos
@pytest.mark.timeout(240)
class TestHammer:
    def test_four_workers_never_overlap(
        self, worker_factory: Any, engine: Any, nodes: Nodes, run_id: str,
        monkeypatch: pytest.MonkeyPatch,
    ) -> None:
        """4 worker processes hammer one singleton and one exclusive key: 0 overlaps.

        Then 2 of the 5 Redlock nodes are killed: exclusive runs are still granted and still
        never overlap.
        """
        from tests.resilience.locks.tasks import exclusive_run, singleton_run

        monkeypatch.setenv("REDLOCK_URLS", ",".join(nodes.urls))
        start_workers(worker_factory, 4, env=nodes.env())

        def hammer(phase: str, count: int) -> list[Any]:
            results = []
            for _ in range(count):
                results.append(singleton_run.delay(run_id, f"single-{phase}", seconds=0.03))
                results.append(exclusive_run.delay(run_id, f"excl-{phase}", seconds=0.03))
            return [result.get(timeout=120) for result in results]

        outcomes = hammer("all-nodes", 40)
        nodes.kill(0, 1)
        outcomes_degraded = hammer("two-down", 30)

        rows = runs(engine, run_id)
        assert overlapping(rows) == 0
        ran = [o for o in outcomes + outcomes_degraded if o.get("ran")]
        skipped = [o for o in outcomes + outcomes_degraded if o.get("outcome") == "SKIPPED"]
        assert len(ran) + len(skipped) == 140
        assert len(ran) == len(rows)
        slots = {row.slot for row in rows}
        assert {"single-all-nodes", "excl-all-nodes", "excl-two-down"} <= slots
        # Fencing tokens of one key strictly increase in the order the holders ran.
        for slot in ("excl-all-nodes", "excl-two-down"):
            tokens = [row.token for row in rows if row.slot == slot]
            assert tokens == sorted(tokens) and len(set(tokens)) == len(tokens)
        assert all(s["details"]["holder_task_id"] for s in skipped if "holder_task_id"
                   in s.get("details", {}))


@pytest.mark.chaos
@pytest.mark.timeout(180)
class TestSingletonFaults:
    def test_sigkill_holder_frees_lock_at_once(
        self, worker_factory: Any, engine: Any, stores: Any, run_id: str
    ) -> None:
        """SIGKILL of the holder's worker: the next run of the key acquires (measured)."""
        from tests.resilience.locks.tasks import singleton_run

        workers = start_workers(worker_factory, 2)
        long_run = singleton_run.delay(run_id, "held", seconds=60)
        first = wait_for(lambda: runs(engine, run_id), timeout_seconds=30,
                         message="holder started")[0]
        assert first.task_id == long_run.id
        refused = singleton_run.delay(run_id, "held", seconds=0.01).get(timeout=30)
        assert refused["outcome"] == "SKIPPED"
        assert refused["details"]["holder_task_id"] == long_run.id

        holder = worker_of(workers, first.pid)
        killed_at = time.monotonic()
        holder.sigkill()
        probe = AdvisorySession(stores.database_url, label="probe")
        try:
            wait_for(lambda: probe.try_acquire("tests.locks.singleton_run:held"),
                     timeout_seconds=10, interval=0.01, message="lock freed")
            freed_after = time.monotonic() - killed_at
        finally:
            probe.close()
        print(f"singleton lock acquirable {freed_after * 1000:.0f} ms after SIGKILL")
        assert freed_after < 10  # functional bound 2 s; generous margin on a shared machine

        after = singleton_run.delay(run_id, "held", seconds=0.01).get(timeout=30)
        assert after["ran"] is True
        del long_run  # unsubscribe from its result while Redis still runs

    def test_lost_session_stops_before_commit(
        self, worker_factory: Any, engine: Any, redis_client: Any, run_id: str
    ) -> None:
        """The holder's PostgreSQL session is killed: its checkpoint raises, nothing commits."""
        from tests.resilience.locks.tasks import checkpointed

        start_workers(worker_factory, 1)
        result = checkpointed.delay(run_id, "session", seconds=60)
        wait_for(lambda: runs(engine, run_id), timeout_seconds=30, message="holder started")
        with engine.begin() as connection:
            killed = connection.execute(
                text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                     "WHERE application_name = :name"), {"name": f"lock:{result.id}"}
            ).scalars().all()
        assert killed == [True]
        redis_client.set(f"locks-test:stop:{run_id}", 1)
        assert result.get(timeout=30) == {"committed": False}
        (lost,) = writes(engine, run_id)
        assert "session is gone" in lost.outcome

    def test_a_watched_holder_whose_session_ends_is_refused_everywhere(
        self, worker_factory: Any, engine: Any, redis_client: Any, run_id: str
    ) -> None:
        """The holder's lock session is terminated mid-body: its `checkpoint()` raises
        at once (the watcher sends a probe for it), within one probe period. The next run of
        the key takes the lock with a higher fencing token and commits; the first holder's
        fenced write is then rejected and its transactional commit refused (no effect row
        with its token; DEFERRED), and its deferred rerun ends without writing."""
        from tests.resilience.locks.tasks import WATCHED_PROBE_SECONDS, watched_ledger

        start_workers(worker_factory, 2)
        first = watched_ledger.delay(run_id, "watched", "first")
        (holder,) = wait_for(lambda: runs(engine, run_id), timeout_seconds=30,
                             message="holder started")
        with engine.begin() as connection:
            killed = connection.execute(
                text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                     "WHERE application_name = :name"), {"name": f"lock:{first.id}"}
            ).scalars().all()
        killed_at = time.time()
        assert killed == [True]
        lost_at = float(wait_for(lambda: redis_client.get(f"locks-test:lost:{run_id}:first"),
                                 timeout_seconds=10, interval=0.02,
                                 message="the holder's checkpoint raises"))
        print(f"checkpoint raised {(lost_at - killed_at) * 1000:.0f} ms after the session "
              f"was terminated (probe every {WATCHED_PROBE_SECONDS * 1000:.0f} ms)")
        assert lost_at - killed_at < WATCHED_PROBE_SECONDS + 0.5  # slack: a loaded machine

        second = watched_ledger.delay(run_id, "watched", "second", seconds=0).get(timeout=30)
        assert second["written"] is True and second["token"] > holder.token
        redis_client.set(f"locks-test:go:{run_id}", 1, ex=600)
        assert first.get(timeout=30)["rerun"] is True

        rows = writes(engine, run_id)
        assert [(r.token, r.outcome) for r in rows if r.task_id == first.id] == [
            (holder.token, "rejected")]
        assert {r.outcome for r in rows if r.token == second["token"]} == {"written", "effect"}
        assert [r for r in rows if r.outcome == "effect"] == [
            r for r in rows if r.outcome == "effect" and r.token == second["token"]]


@pytest.mark.chaos
@pytest.mark.timeout(180)
class TestExclusiveFaults:
    def test_paused_holder_write_is_fenced(
        self, worker_factory: Any, engine: Any, nodes: Nodes, run_id: str,
        monkeypatch: pytest.MonkeyPatch,
    ) -> None:
        """SIGSTOP the holder past its TTL; another worker acquires and writes; on SIGCONT
        the first holder's write is rejected by the fencing check."""
        from tests.resilience.locks.tasks import fenced_write

        monkeypatch.setenv("REDLOCK_URLS", ",".join(nodes.urls))
        workers = start_workers(worker_factory, 2, env=nodes.env())
        first = fenced_write.delay(run_id, "fenced", pause_seconds=3)
        started = wait_for(lambda: runs(engine, run_id), timeout_seconds=30,
                           message="first holder started")[0]
        paused = worker_of(workers, started.pid)
        paused.sigstop()
        try:
            redlock = Redlock.from_urls(nodes.urls)
            wait_for(lambda: not redlock.holders("tests.locks.fenced_write:fenced"),
                     timeout_seconds=15, message="paused holder's lease expired")
            second = fenced_write.delay(run_id, "fenced", pause_seconds=0)
            assert second.get(timeout=30)["written"] is True
        finally:
            paused.sigcont()
        assert first.get(timeout=30)["written"] is False

        recorded = writes(engine, run_id)
        assert [(w.task_id, w.outcome) for w in recorded] == [
            (second.id, "written"), (first.id, "rejected")
        ]
        assert recorded[1].token < recorded[0].token


@pytest.mark.chaos
@pytest.mark.timeout(120)
class TestRetriesAndStoreFailure:
    def test_own_retry_is_not_blocked(
        self, worker_factory: Any, engine: Any, nodes: Nodes, run_id: str,
        monkeypatch: pytest.MonkeyPatch,
    ) -> None:
        """Celery's retry of the holder runs (it is not SKIPPED by the holder's own lock)."""
        from tests.resilience.locks.tasks import retrying_exclusive, retrying_singleton

        monkeypatch.setenv("REDLOCK_URLS", ",".join(nodes.urls))
        worker_factory(QUEUE, name="locks-retry", concurrency=2, env=nodes.env())
        for task in (retrying_singleton, retrying_exclusive):
            result = task.delay(run_id, f"retry-{task.name}")
            assert result.get(timeout=60) == {"ran": True, "retries": 1}
            attempts = [row for row in runs(engine, run_id) if row.task_id == result.id]
            assert len(attempts) == 2
        assert overlapping(runs(engine, run_id)) == 0

    def test_store_down_fails_closed(
        self, engine: Any, nodes: Nodes, run_id: str, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """With every Redlock node down, an exclusive task is DEFERRED, never run unguarded
        (called inline, the deferral is `JobDeferred` for the caller: nothing published)."""
        from jobs import app
        from resilience.errors import JobDeferred
        from resilience.stores import stores_for
        from tests.resilience.locks.tasks import exclusive_run

        # Called inline: this process's stores name the nodes (app.conf, not the env).
        monkeypatch.setattr(stores_for(app), "redlock_urls", tuple(nodes.urls))
        nodes.kill(0, 1, 2, 3, 4)
        with pytest.raises(JobDeferred, match="DEFERRED by exclusive: store unavailable"):
            exclusive_run(run_id, "store-down")
        assert runs(engine, run_id) == []


class TestPolicies:
    def test_skip_and_defer_name_the_holder(
        self, stores: Any, engine: Any, run_id: str
    ) -> None:
        """While another session holds the key: skip → SKIPPED, defer → DEFERRED (a Celery
        Retry that spends no retry; inline, `JobDeferred`); both carry the holder; nothing
        runs."""
        from resilience.errors import JobDeferred
        from tests.resilience.locks.tasks import deferring_singleton, singleton_run

        with AdvisorySession(stores.database_url, label="other-task") as holder:
            assert holder.try_acquire("tests.locks.singleton_run:busy")
            assert holder.try_acquire("tests.locks.deferring_singleton:busy")
            skipped = singleton_run(run_id, "busy")
            assert skipped["outcome"] == "SKIPPED"
            assert skipped["details"]["holder_task_id"] == "other-task"
            assert skipped["details"]["key"] == "tests.locks.singleton_run:busy"
            with pytest.raises(JobDeferred, match="DEFERRED by singleton"):
                deferring_singleton(run_id, "busy")
        assert runs(engine, run_id) == []
        assert singleton_run(run_id, "busy", seconds=0)["ran"] is True


class TestIdleSession:
    def test_dead_idle_session_is_replaced_not_deferred(
        self, engine: Any, run_id: str
    ) -> None:
        """The idle session the last run held its lock on dies before the next run
        (backend terminated, as by a PostgreSQL restart): the next run opens a fresh
        session and runs, once. The app's lock URL is its database URL, so that session is
        the thread's own connection (`SharedSessionLock`)."""
        from resilience.stores import stores_for
        from tests.resilience.locks.tasks import app, singleton_run

        assert singleton_run(run_id, "idle")["ran"] is True
        runner = stores_for(app).statements()
        held = runner.connection()
        with engine.connect() as connection:
            assert connection.execute(text("SELECT pg_terminate_backend(:pid)"),
                                      {"pid": held.driver.get_backend_pid()}).scalar_one()
        time.sleep(0.2)
        assert singleton_run(run_id, "idle")["ran"] is True
        assert runner.connection() is not held
        assert len([row for row in runs(engine, run_id) if row.slot == "idle"]) == 2

    def test_dead_idle_lock_session_is_replaced(self, stores: Any, engine: Any) -> None:
        """A lock session (locks on their own URL) released to the pool dies while idle:
        the next acquisition opens a fresh one and takes the lock."""
        from resilience.locks import AdvisoryLockBackend, Claimant
        from resilience.locks.backends.postgres import discard_thread_session

        backend = AdvisoryLockBackend(stores.database_url, engine=stores.engine)
        claimant = Claimant(task_id="t", task_name="n")
        first = backend.acquire("tests.locks.idle", claimant)
        assert first is not None
        backend.release(first)
        with engine.connect() as connection:
            assert connection.execute(text("SELECT pg_terminate_backend(:pid)"),
                                      {"pid": first.handle.backend_pid}).scalar_one()
        time.sleep(0.2)
        again = backend.acquire("tests.locks.idle", claimant)
        assert again is not None and again.handle is not first.handle
        backend.release(again)
        discard_thread_session()
