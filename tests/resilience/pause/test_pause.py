"""Pause switches: a paused tier or task defers its jobs, loses none, and drains on resume."""

from __future__ import annotations

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
