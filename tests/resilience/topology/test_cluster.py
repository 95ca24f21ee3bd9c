"""Every guard on a real 3-master Redis Cluster (`redis+cluster://`).

Each test drives a guard's own backend (or a whole task, inline) against the cluster and
asserts the decision it makes, then that its keys landed on more than one master, so the
per-master paths (batches, MGET, SCAN, describe) really ran across nodes.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest
from sqlalchemy import text

from resilience.batch import RedisBatch
from resilience.circuit.backends.redis import RedisBreakerBackend, state_key
from resilience.circuit.breaker import CircuitBreaker
from resilience.circuit.config import BreakerConfig, CountWindow
from resilience.errors import StoreUnavailable
from resilience.keys import redis_key, stored_keys
from resilience.ratelimit import RedisBackend
from resilience.ratelimit.algorithms import ALGORITHMS, Params
from resilience.retry.budget import RedisBudgetBackend, RetryBudget, RetryBudgetGate
from tests.redis_topologies import RedisClusterProcesses

SECOND_US = 1_000_000


def masters_of(cluster: RedisClusterProcesses, keys: list[str]) -> set[int]:
    """Ports of the masters serving `keys`."""
    return {cluster.node_of_key(key).port for key in keys}


def breaker(client: Any, name: str) -> CircuitBreaker:
    config = BreakerConfig(name=name, window=CountWindow(calls=4), minimum_calls=2,
                           failure_rate_threshold=0.5, open_seconds=60)
    return CircuitBreaker(config, RedisBreakerBackend(lambda: client))


class TestScripts:
    def test_breakers_open_on_failures_and_are_listed(
            self, cluster_client: Any, redis_cluster: RedisClusterProcesses) -> None:
        """acquire/record/force run on every master: 2 failures open a breaker, the open
        breaker refuses, force closes it, and describe() lists all of them (SCAN of every
        master, hashes read per master)."""
        names = [f"cluster-breaker-{index}" for index in range(6)]
        for name in names:
            each = breaker(cluster_client, name)
            for expected in ("", "open"):
                permission = each.acquire()
                assert permission.allowed
                assert each.record(permission, "failure", duration_seconds=0.0).transition \
                    == expected
            assert not each.acquire().allowed
        assert len(masters_of(redis_cluster, [state_key(name) for name in names])) >= 2

        backend = RedisBreakerBackend(lambda: cluster_client)
        states = backend.describe(include_stored=True)
        assert [state.name for state in states] == names
        assert {state.state for state in states} == {"open"}
        breaker(cluster_client, names[0]).force("closed")
        assert breaker(cluster_client, names[0]).acquire().allowed
        assert backend.describe([names[0]])[0].state == "closed"

    @pytest.mark.parametrize("algorithm", ["gcra", "sliding_window"])
    def test_rate_limits_refuse_the_call_over_the_limit(
            self, cluster_client: Any, redis_cluster: RedisClusterProcesses,
            algorithm: str) -> None:
        """3 permits a minute per key: the 4th call of each key is refused, on every
        master; describe() reads every limiter with its waiting line."""
        backend = RedisBackend(cluster_client)
        chosen = ALGORITHMS[algorithm]
        params = Params(limit=3, period_us=60 * SECOND_US, burst=3) if algorithm == "gcra" \
            else Params(limit=3, period_us=60 * SECOND_US)
        keys = [f"cluster-{algorithm}-{index}" for index in range(6)]
        for key in keys:
            decisions = [backend.run(chosen, key, params, f"caller-{n}").allowed
                         for n in range(4)]
            assert decisions == [True, True, True, False]
        assert len(masters_of(redis_cluster, [backend.key(chosen, key) for key in keys])) >= 2
        described = backend.describe(chosen)
        assert sorted(state.key for state in described) == sorted(keys)

    def test_concurrency_lease_holds_and_releases(
            self, cluster_client: Any, redis_cluster: RedisClusterProcesses) -> None:
        """2 slots per key: the 3rd holder waits until a holder releases."""
        backend = RedisBackend(cluster_client)
        lease = ALGORITHMS["lease"]
        params = Params(limit=2, period_us=30 * SECOND_US)
        keys = [f"cluster-slots-{index}" for index in range(6)]
        for key in keys:
            assert [backend.run(lease, key, params, caller).allowed
                    for caller in ("a", "b", "c")] == [True, True, False]
            assert backend.release(lease, key, "a")
            assert backend.run(lease, key, params, "c").allowed
        assert len(masters_of(redis_cluster, [backend.key(lease, key) for key in keys])) >= 2

    def test_retry_budget_spends_and_is_described(
            self, cluster_client: Any, redis_cluster: RedisClusterProcesses) -> None:
        """No request, a floor of 1 retry in the window: the 2nd retry is refused."""
        backend = RedisBudgetBackend(lambda: cluster_client)
        budget = RetryBudget(ratio=0.1, min_per_second=0.1, window_seconds=10)
        dependencies = [f"cluster-dep-{index}" for index in range(5)]
        for dependency in dependencies:
            gate = RetryBudgetGate(dependency, budget, backend)
            assert gate.try_spend().allowed
            assert not gate.try_spend().allowed
        states = backend.describe({name: budget for name in dependencies})
        assert [state.retries for state in states] == [1] * len(dependencies)

    def test_locks_unique_and_deliveries(self, cluster_client: Any,
                                         redis_cluster: RedisClusterProcesses) -> None:
        """The lock, unique-enqueue and poison-delivery scripts hold their contract."""
        from resilience.deadletter.poison import PoisonGuard, deliveries_key
        from resilience.idempotency.unique import ACQUIRE, NAMESPACE
        from resilience.locks.backends.redis import RedisLock, lock_key

        lock = RedisLock(cluster_client)
        names = [f"cluster-lock-{index}" for index in range(5)]
        for name in names:
            lease = lock.acquire(name, ttl_seconds=10)
            assert lease is not None and lock.acquire(name, ttl_seconds=10) is None
            lock.release(lease)
            assert not lock.locked(name)
        assert len(masters_of(redis_cluster, [lock_key(name) for name in names])) >= 2

        for index in range(5):
            key = redis_key(NAMESPACE, f"tests.topology:{index}")
            assert ACQUIRE(cluster_client, [key], ["task-a", 60_000]) is None
            assert ACQUIRE(cluster_client, [key], ["task-b", 60_000]) == "task-a"
            counter = deliveries_key(f"task-{index}")
            assert [int(PoisonGuard.SCRIPT(cluster_client, [counter], [60_000]))
                    for _ in range(3)] == [1, 2, 3]

    def test_scripts_reload_after_flush_on_each_master(self, cluster_client: Any) -> None:
        """SCRIPT FLUSH on every master: the next calls load the script where they run."""
        backend = RedisBackend(cluster_client)
        gcra = ALGORITHMS["gcra"]
        params = Params(limit=100, period_us=SECOND_US)
        for key in ("a", "b", "c", "d"):
            backend.run(gcra, key, params)
        cluster_client.script_flush()  # every master
        fresh = ("e", "f", "g", "h")
        assert all(backend.run(gcra, key, params).allowed for key in fresh)
        assert not any(backend.run(gcra, key, params).allowed for key in fresh)


class TestBatch:
    def test_batch_spans_masters(self, cluster_client: Any,
                                 redis_cluster: RedisClusterProcesses) -> None:
        """Commands and scripts on keys of every master, one batch: every reply in order,
        and a script the masters lost (SCRIPT FLUSH) is loaded on the right one."""
        from resilience.ratelimit.backends.redis import script

        gcra = script("gcra.lua").for_client(cluster_client)
        keys = [redis_key("tests:batch", f"k{index}") for index in range(9)]
        assert len(masters_of(redis_cluster, keys)) == 3
        cluster_client.script_flush()  # every master
        batch = RedisBatch(cluster_client)
        replies: dict[str, Any] = {}
        for key in keys:
            batch.command("SET", key, key, then=lambda reply, key=key: replies.setdefault(
                f"set {key}", reply))
            batch.command("GET", key, then=lambda reply, key=key: replies.setdefault(
                f"get {key}", reply))
            batch.script(gcra, [f"{key}:gcra", f"{key}:gcra:waiting"],
                         ALGORITHMS["gcra"].arguments(Params(limit=1, period_us=SECOND_US),
                                                      "me"),
                         then=lambda reply, key=key: replies.setdefault(f"gcra {key}", reply))
        batch.execute()
        for key in keys:
            assert replies[f"set {key}"] is True
            assert replies[f"get {key}"] == key
            assert not isinstance(replies[f"gcra {key}"], Exception), replies[f"gcra {key}"]
            assert int(replies[f"gcra {key}"][0]) == 1
            assert cluster_client.exists(f"{key}:gcra") == 1

    def test_full_stack_task_inline(self, cluster_client: Any) -> None:
        """Breaker + budget + idempotency cache + singleton, run inline on the cluster (the
        read and write batches span masters): the body runs once, its duplicate is
        REPLAYED from the cache."""
        from resilience.idempotency.backends.cached import cache_key
        from tests.resilience.batch.tasks import batch_full_stack

        key = f"cluster-{uuid.uuid4().hex[:8]}"
        counter = redis_key("tests:batch-runs", key)
        assert batch_full_stack.apply(args=(key, counter)).get() == f"done {key}"
        replayed = batch_full_stack.apply(args=(key, counter)).get()
        assert replayed == f"done {key}"
        assert int(cluster_client.get(counter)) == 1
        assert cluster_client.get(cache_key(batch_full_stack.name, key)) is not None
        # (the breaker's and the budget's successes are counted locally and sent in
        # aggregate later: TestScripts checks those scripts on the cluster)


class TestSwitches:
    def test_pause_cancel_and_counters(self, cluster_client: Any,
                                       redis_cluster: RedisClusterProcesses) -> None:
        """Pause switches on several masters are read together and listed; cancel marks
        change with their version in one transaction; counters count."""
        from resilience.cancel.backends.redis import MARKS_KEY, RedisCancelBackend
        from resilience.counters import count, read_all
        from resilience.pause import PauseSwitch, RedisPauseBackend

        backend = RedisPauseBackend(cluster_client)
        switch = PauseSwitch(backend)
        names = [f"tests.topology.task{index}" for index in range(6)]
        for name in names:
            switch.pause("task", name, reason="cluster test")
        assert len(masters_of(redis_cluster, [backend.key("task", n) for n in names])) >= 2
        paused = backend.paused([("task", name) for name in (*names, "tests.not-paused")])
        assert sorted(each.name for each in paused) == names
        assert sorted(each.name for each in switch.describe()) == names
        assert switch.resume("task", names[0])
        assert len(backend.paused([("task", name) for name in names])) == len(names) - 1

        cancel = RedisCancelBackend(cluster_client)
        before = cancel.version()
        cancel.cancel("id:abc", reason="stop", expires_at=time.time() + 60)
        assert cancel.version() != before
        assert cancel.reasons(["id:abc"], now=time.time()) == "stop"
        version, marks = cancel.load()
        assert version and "id:abc" in marks
        assert cancel.uncancel("id:abc")
        assert cancel.prune(now=time.time()) == 0
        assert cluster_client.exists(MARKS_KEY) == 0

        count(cluster_client, 2, outcome="SHED", guard="topology")
        assert ({"outcome": "SHED", "tier": "", "guard": "topology", "name": ""}, 2) \
            in read_all(cluster_client)

    def test_stored_keys_scans_every_master(self, cluster_client: Any,
                                            redis_cluster: RedisClusterProcesses) -> None:
        values = [f"value-{index}" for index in range(30)]
        keys = [redis_key("tests:scan", value) for value in values]
        for key in keys:
            cluster_client.set(key, 1)
        assert len(masters_of(redis_cluster, keys)) == 3
        assert sorted(stored_keys(cluster_client, "tests:scan").values()) == sorted(values)


@pytest.fixture()
def doomed_cluster(app: Any, stores: Any, services: Any) -> Any:
    """A cluster of its own (a master of it gets killed), the app's guard store on it."""
    from resilience.stores import Stores, install, stores_for

    cluster = RedisClusterProcesses().start()
    original = stores_for(app)
    install(app, Stores(redis_url=cluster.url, database_url=services.database_url,
                        socket_timeout_seconds=1.0))
    try:
        yield cluster
    finally:
        install(app, original)
        cluster.stop()


@pytest.fixture(scope="module")
def executions_table(stores: Any) -> None:
    from tests.resilience.topology.tasks import CREATE_TABLE

    with stores.engine().begin() as connection:
        connection.execute(text(CREATE_TABLE))


class TestMasterDown:
    def test_guards_fail_open_and_backends_raise_store_unavailable(
            self, app: Any, doomed_cluster: RedisClusterProcesses, executions_table: None,
            engine: Any) -> None:
        """A master without replica SIGKILLed: while the cluster still routes to it
        (connection refused) and after it is marked failed (CLUSTERDOWN), a direct backend
        call raises StoreUnavailable (no RedisClusterException), and a task whose guards
        fail open runs its body."""
        from resilience.stores import stores_for
        from tests.resilience.topology.tasks import guarded

        client = stores_for(app).redis()
        backend = RedisBackend(client)
        gcra = ALGORITHMS["gcra"]
        params = Params(limit=1000, period_us=SECOND_US)
        run = f"down-{uuid.uuid4().hex[:8]}"
        assert guarded.apply(args=(run, 0)).get() == 0  # warm: slots table, scripts
        victim_key = "victim"
        victim = doomed_cluster.node_of_key(backend.key(gcra, victim_key))
        victim.kill()
        started = time.monotonic()
        with pytest.raises(StoreUnavailable):
            backend.run(gcra, victim_key, params)
        assert time.monotonic() - started < 15

        for n in range(1, 4):
            assert guarded.apply(args=(run, n)).get(propagate=True) == n

        # The survivors mark the dead master failed (node timeout 2 s): the whole
        # cluster answers CLUSTERDOWN, a key on a living master included.
        survivor = next(node for node in doomed_cluster.nodes if node is not victim)
        deadline = time.monotonic() + 20
        while survivor.client().execute_command("CLUSTER INFO")["cluster_state"] != "fail":
            assert time.monotonic() < deadline, "the cluster never marked the master failed"
            time.sleep(0.2)
        living_key = next(f"k{index}" for index in range(100) if doomed_cluster.node_of_key(
            backend.key(gcra, f"k{index}")) is survivor)
        with pytest.raises(StoreUnavailable):
            backend.run(gcra, living_key, params)
        for n in range(4, 6):
            assert guarded.apply(args=(run, n)).get(propagate=True) == n
        with engine.connect() as connection:
            ran = connection.execute(text(
                "SELECT n FROM topology_executions WHERE run = :run ORDER BY n"),
                {"run": run}).scalars().all()
        assert ran == [0, 1, 2, 3, 4, 5]
