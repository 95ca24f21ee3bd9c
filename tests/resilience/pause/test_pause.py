"""Pause switches: a paused tier or task defers its jobs, loses none, and drains on resume."""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

import pytest

from resilience.errors import ConfigurationError, JobDeferred
from resilience.pause import MemoryPauseBackend, PauseSwitch, RedisPauseBackend
from tests.support import dead_redis, wait_for


@pytest.fixture(params=["memory", "redis"])
def switch(request: pytest.FixtureRequest, redis_client: Any) -> PauseSwitch:
    """The same switch semantics on each backend."""
    if request.param == "memory":
        return PauseSwitch(MemoryPauseBackend())
    return PauseSwitch(RedisPauseBackend(redis_client))


class TestSwitch:
    def test_pause_resume_and_list(self, switch: PauseSwitch) -> None:
        switch.pause("tier", "standard", reason="migration")
        switch.pause("task", "billing:{weird} name", reason="")
        on = {(p.scope, p.name): p.reason for p in switch.describe()}
        assert on == {("tier", "standard"): "migration", ("task", "billing:{weird} name"): ""}
        assert [p.name for p in switch.backend.paused([("tier", "standard"),
                                                       ("tier", "critical")])] == ["standard"]
        assert switch.resume("tier", "standard") is True
        assert switch.resume("tier", "standard") is False
        assert [p.name for p in switch.describe()] == ["billing:{weird} name"]

    def test_unknown_scope_is_refused(self, switch: PauseSwitch) -> None:
        with pytest.raises(ConfigurationError, match="'tier' or a 'task'"):
            switch.pause("queue", "critical")


class TestGuard:
    def test_a_paused_tier_defers_inline_runs(self, app: Any, redis_client: Any) -> None:
        """Inline, a paused tier's job raises JobDeferred naming the reason; after resume
        (and the 1 s refresh) it runs."""
        from jobs.platform import pause_backend
        from tests.resilience.pause.tasks import inline

        switch = PauseSwitch(pause_backend(app))
        switch.pause("tier", "optional", reason="db migration")
        with pytest.raises(JobDeferred, match="paused: tier 'optional' \\(db migration\\)"):
            inline.apply(args=(1,)).get()
        switch.resume("tier", "optional")
        time.sleep(1.1)
        assert inline.apply(args=(2,)).get() == 2


@pytest.mark.usefixtures("tier_workers")
class TestOnWorkers:
    def test_paused_task_runs_nothing_loses_nothing_and_drains(
        self, app: Any, redis_client: Any
    ) -> None:
        """Pause a task fleet-wide: jobs sent meanwhile are DEFERRED (state RETRY), none runs;
        after resume every one runs exactly once."""
        from jobs.platform import pause_backend
        from tests.resilience.pause.tasks import counted

        switch = PauseSwitch(pause_backend(app))
        run_id = uuid.uuid4().hex[:8]
        switch.pause("task", counted.name, reason="vendor maintenance")
        time.sleep(1.1)  # every worker's copy of the switches has been refreshed
        try:
            results = [counted.delay(run_id, n) for n in range(6)]
            wait_for(lambda: all(r.state == "RETRY" for r in results), timeout_seconds=30,
                     message="every job deferred")
            time.sleep(1.0)
            assert redis_client.get(f"tests:pause:{run_id}") is None
        finally:
            switch.resume("task", counted.name)
        assert sorted(r.get(timeout=30) for r in results) == list(range(6))
        assert int(redis_client.get(f"tests:pause:{run_id}")) == 6


class CountingBackend(RedisPauseBackend):
    """The Redis backend, counting how often the guard reads the switches."""

    reads = 0

    def paused(self, switches: Any) -> Any:
        self.reads += 1
        return super().paused(switches)


def _call(task: Any) -> Any:
    from resilience.pipeline import Call

    return Call(task=task, args=(1,), kwargs={}, request=None)


class TestStoreDown:
    def test_a_dead_store_is_asked_once_per_refresh_not_once_per_job(self, app: Any) -> None:
        """Redis refuses connections: fail_open runs every job, fail_closed defers every
        job, and either way the store is tried once per refresh period."""

        from resilience.outcomes import Outcome, Stop
        from resilience.pause import PauseConfig, PauseGuard
        from tests.resilience.pause.tasks import inline

        for policy in ("fail_open", "fail_closed"):
            backend = CountingBackend(dead_redis())
            guard = PauseGuard(PauseConfig(refresh_seconds=60, on_store_down=policy), backend)
            for _ in range(5):
                if policy == "fail_open":
                    guard.before_run(_call(inline))
                else:
                    with pytest.raises(Stop) as stopped:
                        guard.before_run(_call(inline))
                    assert stopped.value.outcome is Outcome.DEFERRED
            assert backend.reads == 1, policy

    def test_the_last_copy_is_kept_while_the_store_is_down(
        self, app: Any, tmp_path: Any
    ) -> None:
        """A switch read while Redis was up keeps deferring after the server is killed."""
        import redis

        from jobs.embedded import embedded_redis, free_port
        from resilience.outcomes import Stop
        from resilience.pause import PauseConfig, PauseGuard
        from tests.resilience.pause.tasks import inline

        server = embedded_redis(free_port(), tmp_path / "pause-redis").start()
        try:
            client = redis.Redis.from_url(server.url, decode_responses=True,
                                          socket_connect_timeout=0.2)
            backend = CountingBackend(client)
            PauseSwitch(backend).pause("tier", "optional", reason="maintenance")
            guard = PauseGuard(PauseConfig(refresh_seconds=0.2), backend)
            with pytest.raises(Stop, match="maintenance"):
                guard.before_run(_call(inline))
            server.kill()
            time.sleep(0.3)  # the copy is stale: the guard tries the dead store once
            for _ in range(3):
                with pytest.raises(Stop, match="maintenance"):
                    guard.before_run(_call(inline))
            assert backend.reads == 2
        finally:
            server.stop()


def _in_broker(app: Any, queue: str, task_name: str, run_id: str) -> set[str]:
    """Distinct task ids of this run held by the broker: in the tier queue's list, or in the
    unacked hash (taken by a worker and not acknowledged yet, which is where a deferred job's
    countdown copy waits until its ETA)."""
    import json

    with app.connection_for_write() as connection:
        client = connection.default_channel.client
        listed = client.lrange(queue, 0, -1)
        unacked = [json.loads(raw)[0] for raw in client.hvals("unacked")]
    ids = set()
    for message in [json.loads(item) for item in listed] + unacked:
        headers = message.get("headers", {})
        if headers.get("task") == task_name and run_id in str(headers.get("argsrepr", "")):
            ids.add(headers["id"])
    return ids


@pytest.mark.timeout(180)
@pytest.mark.usefixtures("tier_workers")
def test_pause_under_load_defers_everything_and_drains_exactly_once(
    app: Any, redis_client: Any
) -> None:
    """A producer sends 200 jobs over ~3 s to the shared critical worker; once some have run,
    the task is paused. After the pause reaches the worker (refresh 1 s, plus a margin) no
    body runs: the per-job run counters are frozen until resume. Meanwhile what rises is the
    number of DEFERRED jobs (result state RETRY) and the broker's depth for the run, counted
    as distinct task ids in the queue list plus the unacked hash: a deferred job is
    republished with a 5 s countdown and the worker holds that ETA copy unacknowledged, so
    the depth is there rather than in the queue list. Every job not run is held there,
    deferred. After resume the deferred copies come due and every job runs exactly once
    (each job's counter is 1, its result its number) and the broker holds none of them."""
    from jobs.platform import pause_backend
    from tests.resilience.pause.tasks import per_job

    jobs, seconds = 200, 3.0
    switch = PauseSwitch(pause_backend(app))
    run_id = uuid.uuid4().hex[:8]
    runs_key = f"tests:pause:{run_id}:runs"
    results: list[Any] = []

    def produce() -> None:
        for n in range(jobs):
            results.append(per_job.delay(run_id, n))
            time.sleep(seconds / jobs)

    def ran() -> dict[str, str]:
        return redis_client.hgetall(runs_key)

    seen_deferred: set[int] = set()

    def deferred() -> int:
        """Jobs whose result says RETRY (DEFERRED), or STARTED again after one: a deferred
        copy that came due while still paused is being deferred once more."""
        states = [r.state for r in list(results)]
        seen_deferred.update(n for n, state in enumerate(states) if state == "RETRY")
        return sum(state == "RETRY" or (state == "STARTED" and n in seen_deferred)
                   for n, state in enumerate(states))

    producer = threading.Thread(target=produce)
    producer.start()
    try:
        wait_for(lambda: len(ran()) >= 5, timeout_seconds=30, message="jobs running")
        switch.pause("task", per_job.name, reason="load test")
        time.sleep(1.5)  # every worker process's copy of the switches was refreshed
        frozen, sent_then = ran(), len(results)
        deferred_then = deferred()
        depth_then = len(_in_broker(app, "critical", per_job.name, run_id))
        producer.join(timeout=60)
        assert not producer.is_alive()
        waiting = jobs - len(frozen)
        wait_for(lambda: deferred() == waiting, timeout_seconds=60, interval=0.2,
                 message=f"{waiting} jobs deferred")
        held = _in_broker(app, "critical", per_job.name, run_id)
        assert ran() == frozen, "a body ran while the task was paused"
    finally:
        switch.resume("task", per_job.name)
        producer.join(timeout=60)
    print(f"pause under load: {len(frozen)} ran before the pause, {sent_then} sent by then; "
          f"deferred {deferred_then} -> {waiting}, broker depth {depth_then} -> {len(held)}")
    assert sent_then < jobs and len(frozen) < jobs
    assert deferred_then < waiting
    assert len(held) == waiting > depth_then
    assert held == {results[n].id for n in range(jobs) if str(n) not in frozen}
    wait_for(lambda: len(ran()) == jobs, timeout_seconds=60, interval=0.2,
             message="every job ran after resume")
    assert sorted(r.get(timeout=30) for r in results) == list(range(jobs))
    wait_for(lambda: not _in_broker(app, "critical", per_job.name, run_id),
             timeout_seconds=30, interval=0.2, message="every message acknowledged")
    assert ran() == {str(n): "1" for n in range(jobs)}  # none missing, none doubled
