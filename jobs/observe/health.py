"""Health: liveness (this worker's main loop runs) kept apart from readiness (its stores
are reachable).

A worker whose Redis or broker is down is alive (restarting it would not help, and would
lose the tasks it runs) but not ready; a worker whose main loop stopped is dead whatever
the stores say. So the two are separate checks, each returning a `Check` list:

    jobs health live --local --tier critical   the worker's heartbeat file is fresh: no
                                               broker round trip (Kubernetes, docker)
    jobs health live --node critical@HOST      the node answers `celery inspect ping`
                                               through the broker (operators)
    jobs health ready                          Redis, the broker and PostgreSQL answer, and
                                               every migration head is applied

The local form is the probe: it costs one `stat`, whatever the size of the fleet, and a
broker outage does not fail it. The broadcast form costs every worker a reply per probe.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from resilience.redact import redact

if TYPE_CHECKING:
    from celery import Celery


@dataclass(frozen=True)
class Check:
    """One health probe: what was checked, whether it passed, and why not."""

    name: str
    ok: bool
    detail: str = ""


def _failed(name: str, exc: BaseException) -> Check:
    return Check(name, False, redact(f"{type(exc).__name__}: {exc}".splitlines()[0])[:300])


def liveness(app: Celery, node: str, *, timeout_seconds: float = 5.0) -> list[Check]:
    """Does worker `node` (e.g. `critical@host`) answer a ping within the timeout?"""
    try:
        replies = app.control.ping(destination=[node], timeout=timeout_seconds) or []
    except Exception as exc:  # noqa: BLE001 - any failure means: no answer
        return [_failed(f"ping {node}", exc)]
    answered = any(node in reply for reply in replies)
    return [Check(f"ping {node}", answered,
                  "pong" if answered else f"no reply within {timeout_seconds:g}s")]


def local_liveness(node: str, *, max_age_seconds: float) -> list[Check]:
    """Did worker `node`, on this host, beat within `max_age_seconds`? (heartbeat.py)"""
    from jobs.observe.heartbeat import heartbeat_age, heartbeat_path

    name = f"heartbeat {node}"
    age = heartbeat_age(node)
    if age is None:
        return [Check(name, False, f"no heartbeat file {heartbeat_path(node)}: no worker "
                                   "of that name runs on this host (or it has not started)")]
    return [Check(name, age <= max_age_seconds,
                  f"last beat {age:.1f}s ago (max {max_age_seconds:g}s)")]


def check_redis(app: Celery) -> Check:
    """The shared guard-state Redis answers PING."""
    from resilience.stores import stores_for

    try:
        return Check("redis", bool(stores_for(app).redis().ping()), "PONG")
    except Exception as exc:  # noqa: BLE001
        return _failed("redis", exc)


def check_broker(app: Celery) -> Check:
    """The broker accepts a connection."""
    try:
        with app.connection_for_write() as connection:
            connection.ensure_connection(max_retries=1, timeout=3)
        return Check("broker", True, "connected")
    except Exception as exc:  # noqa: BLE001
        return _failed("broker", exc)


def check_postgres(app: Celery) -> list[Check]:
    """PostgreSQL answers, and the applied migrations are every head of the code's scripts."""
    from alembic.runtime.migration import MigrationContext
    from alembic.script import ScriptDirectory
    from sqlalchemy import text

    from jobs.db import alembic_config
    from resilience.stores import stores_for

    stores = stores_for(app)
    try:
        with stores.engine().connect() as connection:
            connection.execute(text("SELECT 1"))
            applied = set(MigrationContext.configure(connection).get_current_heads())
    except Exception as exc:  # noqa: BLE001
        return [_failed("postgres", exc), Check("migrations", False, "database unreachable")]
    heads = set(ScriptDirectory.from_config(alembic_config(stores.database_url)).get_heads())
    missing = sorted(heads - applied)
    return [
        Check("postgres", True, "SELECT 1"),
        Check("migrations", not missing,
              "all heads applied" if not missing else f"not applied: {', '.join(missing)}"),
    ]


def readiness(app: Celery) -> list[Check]:
    """Redis, the broker and PostgreSQL reachable; migrations applied."""
    return [check_redis(app), check_broker(app), *check_postgres(app)]
