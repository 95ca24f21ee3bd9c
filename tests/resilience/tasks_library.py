"""`@shared_task`s on the platform's app, as a library user would write them: the platform's
workers load them (JOBS_IMPORTS) and `init_app` decides what they become."""

from __future__ import annotations

from celery import shared_task

from resilience.idempotency import idempotent


def _effects() -> object:
    from jobs import app
    from resilience.stores import stores_for

    return stores_for(app).redis()


@shared_task
def naive(order_id: int) -> int:
    """No guard decorator: a GuardedTask with the library's defaults only (it can run as a
    durable workflow step)."""
    return order_id


@shared_task
@idempotent(key="{order_id}")
def shared_charge(order_id: int) -> str:
    """`@idempotent` under `@shared_task`: its effect happens once per order id."""
    _effects().incr(f"library:shared_charge:{order_id}")  # type: ignore[attr-defined]
    return f"charged {order_id}"
