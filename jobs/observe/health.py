"""Health: liveness (this worker answers) kept apart from readiness (its stores are reachable).

A worker whose Redis is down is alive (restarting it would not help, and would lose the
tasks it runs) but not ready; a worker that stopped answering is dead whatever the stores
say. So the two are separate checks, each returning a `Check` list:

    jobs health live --node critical@HOST   the node answers `celery inspect ping`
    jobs health ready                       Redis, the broker and PostgreSQL answer, and
                                            every migration head is applied
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
