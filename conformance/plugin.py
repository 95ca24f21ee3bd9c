"""pytest plugin loaded into every conformance run: records outcomes, and in platform mode
puts the platform's pieces where kombu's and Celery's own suites build the stock ones.

Selected with `-p conformance.plugin`; `CONFORMANCE_MODE` is `stock` (record only) or
`platform`. The substitution is made below the suites, so their test files run unedited:

- **transport**: an import hook makes `kombu.transport.redis` export the platform's
  `Transport`, `Channel` and `QoS` (`jobs.broker`) as soon as kombu's module is executed.
  Everything that names them through that module (kombu's tests, their subclasses, the
  `redis://` alias Celery resolves) gets the platform's classes; kombu's own module code is
  untouched, so the hook costs nothing else.
- **task class**: `Celery.task_cls` is `resilience.task.GuardedTask`, so every app's `Task`
  (and every `@shared_task` / `@app.task` without `base=`) is a `GuardedTask`.
- **consumer**: the `worker_consumer` default is the platform's
  `resilience.deadletter.intake.IntakeConsumer`, with the platform's stores installed on
  every app (`CONFORMANCE_REDIS_URL`, `CONFORMANCE_DATABASE_URL`) so a message it
  dead-letters is really written.

Outcomes go to `CONFORMANCE_RESULTS` as one JSON line per test as it finishes, so a run
cut short by the harness's deadline still reports what it ran.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import json
import os
import sys
from types import ModuleType
from typing import Any

import pytest

#: The kombu module whose classes the platform's transport replaces.
KOMBU_REDIS = "kombu.transport.redis"
#: The platform's task base class and worker consumer, as Celery names them in settings.
TASK_CLASS = "resilience.task:GuardedTask"
CONSUMER_CLASS = "resilience.deadletter.intake:IntakeConsumer"

_exercised: dict[str, int] = {"channels": 0, "consumers": 0, "task_calls": 0}


def _bind_platform_transport(module: ModuleType) -> None:
    """Make `module` (kombu's Redis transport) export the platform's classes."""
    from jobs import broker

    module.Transport = broker.Transport  # type: ignore[attr-defined]
    module.Channel = broker.Channel  # type: ignore[attr-defined]
    module.QoS = broker.QoS  # type: ignore[attr-defined]
    _counted(broker.Channel, "__init__", "channels")


class _BindingLoader(importlib.abc.Loader):
    """kombu's own loader, then the platform's classes bound into the fresh module."""

    def __init__(self, loader: Any) -> None:
        self.loader = loader

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self.loader.exec_module(module)
        _bind_platform_transport(module)


class PlatformTransportFinder(importlib.abc.MetaPathFinder):
    """Finds `kombu.transport.redis` as usual and wraps its loader (`_BindingLoader`)."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != KOMBU_REDIS:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                spec.loader = _BindingLoader(spec.loader)
                return spec
        return None


def _install_stores(app: Any) -> None:
    """The platform's stores on `app`, so the intake consumer's dead letters are written."""
    from resilience.stores import Stores, install

    install(app, Stores(redis_url=os.environ["CONFORMANCE_REDIS_URL"],
                        database_url=os.environ["CONFORMANCE_DATABASE_URL"]))


def _counted(cls: type, method: str, key: str) -> None:
    """Count calls of `cls.method` in this process: proof the platform's code is what runs."""
    original = cls.__dict__[method]
    if getattr(original, "_conformance_counted", False):
        return

    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        _exercised[key] += 1
        return original(*args, **kwargs)

    wrapper._conformance_counted = True  # type: ignore[attr-defined]
    setattr(cls, method, wrapper)


def install_platform() -> None:
    """Put the platform's transport, task class and consumer in place (see module doc).

    kombu's Redis module is not imported here (jobs.broker would import it): kombu's unit
    tests patch the poller it binds at import, so they must import it first, as stock.
    """
    from celery._state import connect_on_app_finalize
    from celery.app import base, defaults

    if KOMBU_REDIS in sys.modules:
        _bind_platform_transport(sys.modules[KOMBU_REDIS])
    else:
        sys.meta_path.insert(0, PlatformTransportFinder())
    base.Celery.task_cls = TASK_CLASS
    defaults.DEFAULTS["worker_consumer"] = CONSUMER_CLASS
    if os.environ.get("CONFORMANCE_DATABASE_URL"):
        connect_on_app_finalize(_install_stores)
    from resilience.deadletter.intake import IntakeConsumer
    from resilience.task import GuardedTask

    _counted(IntakeConsumer, "update_strategies", "consumers")
    _counted(GuardedTask, "apply_async", "task_calls")


if os.environ.get("CONFORMANCE_MODE") == "platform":
    install_platform()


def _write(record: dict[str, Any]) -> None:
    path = os.environ.get("CONFORMANCE_RESULTS")
    if path:
        with open(path, "a", encoding="utf-8") as file:
            file.write(json.dumps(record) + "\n")


def _reason(report: pytest.TestReport) -> str:
    """The last line of the failure, enough to route it."""
    crash = getattr(report.longrepr, "reprcrash", None)
    if crash is not None:
        return str(crash.message).splitlines()[0][:300] if crash.message else ""
    text = str(report.longrepr or "").strip().splitlines()
    return text[-1][:300] if text else ""


_failed: set[str] = set()


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """One record per test: passed, failed, skipped, error (setup/teardown), xfailed."""
    if report.when == "call":
        if hasattr(report, "wasxfail"):
            outcome = "xfailed" if report.skipped else "xpassed"
        else:
            outcome = report.outcome
        if report.failed:
            _failed.add(report.nodeid)
    elif report.when == "setup" and report.skipped:
        outcome = "xfailed" if hasattr(report, "wasxfail") else "skipped"
    elif report.failed and report.nodeid not in _failed:
        outcome = "error"  # setup or teardown failed
        _failed.add(report.nodeid)
    else:
        return
    record = {"test": report.nodeid, "outcome": outcome, "when": report.when,
              "seconds": round(report.duration, 2)}
    if report.failed:
        record["reason"] = _reason(report)
    _write(record)


def pytest_sessionfinish(session: pytest.Session) -> None:
    """What ran of the platform's code in this process (proof the substitution took)."""
    if os.environ.get("CONFORMANCE_MODE") == "platform":
        from kombu.transport import redis

        from jobs import broker

        _write({"exercised": {**_exercised,
                              "transport_bound": redis.Transport is broker.Transport}})
