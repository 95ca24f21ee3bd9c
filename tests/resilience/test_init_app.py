"""`resilience.init_app(app)`: a user's own Celery app, guarded by one call.

The user-style app is tests/resilience/shop_app.py (its own module, `@shared_task`, configured
only through `app.conf.resilience_*`); it runs in real `celery -A tests.resilience.shop_app
worker` processes and real producer processes, on the session's Redis and PostgreSQL.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery, Task

import resilience
from resilience.errors import ConfigurationError
from resilience.idempotency import idempotent, unique
from resilience.stores import Stores, stores_for
from resilience.task import LIBRARY_GUARDS, GuardedTask
from tests.support import ROOT, Services, Worker, wait_for

SHOP = "tests.resilience.shop_app"


class ShopWorker(Worker):
    """A real worker of the user's app (`celery -A tests.resilience.shop_app worker`)."""

    def command(self) -> list[str]:
        return [sys.executable, "-m", "celery", "-A", SHOP, "worker", "-Q", self.queues,
                "-n", self.nodename, "-c", "2", "-P", "prefork", "--without-gossip",
                "--without-mingle", "--without-heartbeat", "--loglevel", "INFO"]

    def wait_ready(self, timeout_seconds: float = 60) -> None:
        wait_for(lambda: self._ready(), timeout_seconds=timeout_seconds,
                 message=f"shop worker {self.nodename}")

    def _ready(self) -> bool:
        if self.process is not None and self.process.poll() is not None:
            raise RuntimeError(f"worker {self.nodename} exited:\n{self.log_tail()}")
        return " ready." in self.log_tail(20000)


def shop_env(services: Services, *, init: str = "before", task_cls: str = "",
             database: bool = True) -> dict[str, str]:
    """The user app's environment: its own broker database, queue and counters."""
    env = {
        "SHOP_BROKER_URL": f"{services.redis_base}/2",
        "SHOP_REDIS_URL": f"{services.redis_base}/3",
        "SHOP_QUEUE": f"shop-{uuid.uuid4().hex[:8]}",
        "SHOP_RUN": uuid.uuid4().hex[:8],
        "SHOP_INIT": init,
        "SHOP_TASK_CLS": task_cls,
        "SHOP_WAIT": "20",
    }
    if database:
        env["SHOP_DATABASE_URL"] = services.database_url
    return env


def order_id() -> str:
    """A fresh order id: idempotency records outlive a test (they are PostgreSQL rows)."""
    return str(uuid.uuid4().int % 10**12)


def produce(env: dict[str, str], *argv: str) -> dict[str, Any]:
    """Run the user app's producer in a process of its own; its JSON report."""
    import os

    completed = subprocess.run(
        [sys.executable, "-c", f"from {SHOP} import main; main({list(argv)!r})"],
        cwd=ROOT, env={**os.environ, **env, "PYTHONPATH": str(ROOT)},
        capture_output=True, text=True, timeout=120,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    return json.loads(completed.stdout.strip().splitlines()[-1])


@pytest.fixture()
def shop_worker(services: Services, request: pytest.FixtureRequest) -> Iterator[Any]:
    """Start a worker of the user app with the given environment; stopped afterwards."""
    started: list[ShopWorker] = []

    def start(env: dict[str, str]) -> ShopWorker:
        # The `celery` command takes BROKER_URL / RESULT_BACKEND from the environment over
        # the app's own: the session's (the platform's) must not redirect the user's worker.
        own = {"BROKER_URL": env["SHOP_BROKER_URL"], "RESULT_BACKEND": env["SHOP_BROKER_URL"]}
        worker = ShopWorker(env["SHOP_QUEUE"], name="shop", env={**env, **own})
        started.append(worker)
        return worker.start()

    yield start
    for worker in started:
        worker.stop()


class TestUserAppOnRealWorkers:
    """A user's app with `@shared_task` guards, initialised by `init_app` alone."""

    @pytest.mark.parametrize(("init", "task_cls"), [("before", ""), ("after", "custom")],
                             ids=["init-before-tasks", "init-after-tasks-custom-task-cls"])
    def test_idempotent_and_unique_run_the_body_once(self, services: Services, shop_worker: Any,
                                                      init: str, task_cls: str) -> None:
        """Three `.delay()` of one order run the body once, whether `init_app` came before
        or after the tasks were defined, on the default or the app's own task class."""
        env = shop_env(services, init=init, task_cls=task_cls)
        shop_worker(env)

        charged = produce(env, "charge", order_id(), "3")
        assert charged["effects"] == 1, charged
        assert [call["state"] for call in charged["calls"]] == ["SUCCESS"] * 3, charged
        # init_app selected the library's result backend: the replays say so.
        assert "REPLAYED" in [call["outcome"] for call in charged["calls"]], charged
        assert "GuardedTask" in charged["class"]
        assert ("ShopTask" in charged["class"]) is (task_cls == "custom")

        shipped = produce(env, "ship", order_id(), "3")
        assert shipped["effects"] == 1, shipped
        assert len({call["id"] for call in shipped["calls"]}) == 1, shipped

    def test_an_app_never_initialised_refuses_guarded_tasks(self, services: Services,
                                                           shop_worker: Any) -> None:
        """Without `init_app`, `.delay()` raises naming `init_app`, and a message sent by
        name fails in the worker before the body runs."""
        env = shop_env(services, init="never")
        refused = produce(env, "charge", order_id(), "2")
        assert [call.get("error") for call in refused["calls"]] == ["ConfigurationError"] * 2
        assert "resilience.init_app(app)" in refused["calls"][0]["message"]

        shop_worker(env)
        sent = produce(env, "send", "charge", order_id())
        assert sent["calls"][0]["state"] == "FAILURE", sent
        assert "init_app" in sent["calls"][0]["result"], sent
        assert sent["effects"] == 0, sent

    def test_redis_only_guards_need_no_database(self, services: Services,
                                                shop_worker: Any) -> None:
        """With no `resilience_database_url`: `@unique` and `@circuit_breaker` work; an
        `@idempotent` task fails with an error naming `resilience_database_url`."""
        env = shop_env(services, database=False)
        shop_worker(env)

        shipped = produce(env, "ship", order_id(), "3")
        assert shipped["effects"] == 1, shipped

        vendor = produce({**env, "SHOP_WAIT": "3", "SHOP_ONE_BY_ONE": "1"},
                         "call_vendor", "1", "3")
        states = [call["state"] for call in vendor["calls"]]
        # Two failures open the breaker; the third call is deferred, its body never runs.
        assert vendor["effects"] == 2, vendor
        assert states[:2] == ["FAILURE", "FAILURE"] and states[2] != "SUCCESS", vendor

        charged = produce(env, "charge", order_id(), "1")
        assert charged["calls"][0]["state"] == "FAILURE", charged
        assert "resilience_database_url" in charged["calls"][0]["result"], charged
        assert charged["effects"] == 0, charged


def _app(name: str, **options: Any) -> Celery:
    # Not current: the platform's app stays the session's current app.
    return Celery(name, broker="memory://", set_as_current=False, **options)


class TestInitAppInProcess:
    """What `init_app` does to task classes and stores, without a worker."""

    def test_guarded_tasks_of_every_kind_become_guarded(self) -> None:
        """Tasks defined before and after `init_app`, lazily or on a finalized app, with
        an explicit base, become `GuardedTask`s; so does a task without guards (the
        library's default guards make it a durable workflow step), but not Celery's own."""

        class OwnBase(Task):
            own = True

        app = _app("kinds")

        @app.task
        @idempotent(key="{order_id}")
        def before(order_id: int) -> None: ...

        @app.task(base=OwnBase)
        @unique()
        def with_base(order_id: int) -> None: ...

        @app.task
        def plain(order_id: int) -> None: ...

        assert resilience.init_app(app) is app
        assert resilience.init_app(app) is app  # twice is harmless
        app.finalize()

        @app.task
        @unique()
        def after(order_id: int) -> None: ...

        for task in (before, with_base, after):
            assert isinstance(task, GuardedTask), task
        assert with_base.own is True
        assert isinstance(plain, GuardedTask)
        # the library's defaults only (resilience.task.LIBRARY_GUARDS)
        assert [guard.name for guard in plain.pipelines()[0].guards] == [
            guard.name for guard in sorted(LIBRARY_GUARDS, key=lambda g: int(g.stage))]
        assert {"workflow", "workflow-record"} <= {g.name for g in LIBRARY_GUARDS}
        assert not isinstance(app.tasks["celery.chord_unlock"], GuardedTask)
        _, enqueue = after.pipelines()
        assert [guard.name for guard in enqueue.guards] == ["unique"]

    def test_uninitialised_app_refuses_at_delay(self) -> None:
        """A guarded task of an app never initialised raises at `.delay()` and when
        called as the worker calls it, naming `init_app`; its function still runs."""
        app = _app("forgotten")

        @app.task
        @idempotent(key="{order_id}")
        def charge(order_id: int) -> int:
            return order_id

        app.finalize()
        with pytest.raises(ConfigurationError, match=r"resilience\.init_app\(app\)"):
            charge.delay(1)
        with pytest.raises(ConfigurationError, match="init_app"):
            charge(1)
        assert charge.run(3) == 3

        resilience.init_app(app)  # late, after finalization: the same task is now guarded
        assert isinstance(charge, GuardedTask)
        assert [guard.name for guard in charge.pipelines()[0].guards
                if guard not in LIBRARY_GUARDS] == ["idempotency"]

    def test_stores_come_from_app_conf_on_first_use(self, services: Services) -> None:
        """`init_app` reads nothing; the stores are built from `app.conf` when first
        needed, Django's namespaced settings included; PostgreSQL is optional."""

        class DjangoSettings:
            CELERY_RESILIENCE_REDIS_URL = f"{services.redis_base}/3"
            CELERY_RESILIENCE_REDLOCK_URLS = "redis://127.0.0.1:1/0, redis://127.0.0.1:2/0"

        app = _app("django")
        resilience.init_app(app)  # before the settings exist, as in a project's celery.py
        app.config_from_object(DjangoSettings, namespace="CELERY")
        stores = stores_for(app)
        assert stores.redis().ping()
        assert stores.redlock_urls == ("redis://127.0.0.1:1/0", "redis://127.0.0.1:2/0")
        assert not stores.has_database
        with pytest.raises(ConfigurationError, match="resilience_database_url"):
            stores.engine()

        bare = _app("bare")
        resilience.init_app(bare)
        with pytest.raises(ConfigurationError, match="resilience_redis_url"):
            stores_for(bare)
        with pytest.raises(ConfigurationError, match="init_app"):
            stores_for(_app("never"))
        assert Stores(redis_url="redis://127.0.0.1:6379/0").has_database is False


    def test_a_task_class_keeps_its_own_request(self) -> None:
        """A `task_cls` with its own worker `Request` keeps it, mixed with the library's
        (before: GuardedTask's `OutcomeRequest` silently replaced it)."""
        from celery.worker.request import Request

        from resilience.results import OutcomeRequest

        class ShopRequest(Request):
            pass

        class ShopTask(Task):
            Request = ShopRequest

        app = _app("request", task_cls=ShopTask)
        resilience.init_app(app)

        @app.task(name="request.charge")
        @idempotent(key="{x}")
        def charge(x: int) -> int:
            return x

        request = app.tasks["request.charge"].Request
        assert issubclass(request, ShopRequest), request
        assert issubclass(request, OutcomeRequest), request

    def test_init_app_keeps_final_states(self, services: Services) -> None:
        """The result backend is the library's (final states stay final, `outcome_of`
        reads the outcome) also when the backend URL comes from settings loaded later;
        calling `init_app` twice changes nothing."""
        from resilience import results

        class DjangoSettings:
            CELERY_RESULT_BACKEND = f"{services.redis_base}/3"

        app = _app("results")
        resilience.init_app(app)
        app.config_from_object(DjangoSettings, namespace="CELERY")
        resilience.init_app(app)
        assert type(app.backend) is results.RedisBackend
        assert app.loader.override_backends == results.FINAL_STATE_BACKENDS


class TestPlatform:
    """The platform itself is built with `init_app`."""

    def test_platform_app_is_initialised_from_its_settings(self, app: Any) -> None:
        from resilience.app import is_initialised

        assert is_initialised(app)
        assert app.conf.resilience_redis_url == stores_for(app).redis_url

    def test_pipeline_view_of_an_unguarded_task_says_so(self, app: Any) -> None:
        """`jobs pipeline`'s view of a task with no guards (Celery's own) is one line, not a
        crash; a `@shared_task` without guard decorators has the library's defaults."""
        from jobs.pipeline_view import describe_pipelines

        plain_app = Celery("plain", set_as_current=False)

        @plain_app.task(name="plain.naive")
        def naive(order_id: int) -> int:
            return order_id

        plain_app.finalize()
        view = describe_pipelines(plain_app.tasks["plain.naive"])
        assert view["enqueue"] == [] and view["execution"] == []
        assert view["unguarded"] == ("plain.naive is not guarded: "
                                     "a plain Task with no guard decorators")
        library = describe_pipelines(app.tasks["tests.resilience.tasks_library.naive"])
        assert {"workflow", "workflow-record"} <= {row["guard"] for row in library["execution"]}
        assert "idempotency" not in {row["guard"] for row in library["execution"]}

    def test_jobs_pipeline_command(self) -> None:
        """`jobs pipeline` on a `@shared_task` without guard decorators lists the library's
        default guards (it crashed with AttributeError); on a guarded one its guards too."""
        import os

        def run(name: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                [sys.executable, "-m", "jobs", "pipeline", name], cwd=ROOT,
                env={**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"},
                capture_output=True, text=True, timeout=60,
            )

        naive = run("tests.resilience.tasks_library.naive")
        assert naive.returncode == 0, naive.stderr
        assert "WORKFLOW" in naive.stdout and "IDEMPOTENCY" not in naive.stdout
        charge = run("tests.resilience.tasks_library.shared_charge")
        assert charge.returncode == 0, charge.stderr
        assert "IDEMPOTENCY" in charge.stdout

    def test_shared_task_guard_runs_once_on_platform_workers(
            self, app: Any, tier_workers: Any, redis_client: Any) -> None:
        """`@idempotent` under `@shared_task` on the platform's own workers: three
        `.delay()` of one key run the body once (it ran three times before)."""
        # By name on the platform's app: `shared_charge` itself resolves on the current app,
        # which another test may have replaced.
        shared_charge = app.tasks["tests.resilience.tasks_library.shared_charge"]
        order = int(order_id())
        results = [shared_charge.delay(order) for _ in range(3)]
        for result in results:
            result.get(timeout=30)
        assert int(redis_client.get(f"library:shared_charge:{order}") or 0) == 1
