"""A user's own Celery app (not the platform's `jobs`), guarded with `resilience.init_app`.

Configured only through `app.conf.resilience_*`, the way a library user writes it; the test
(tests/resilience/test_init_app.py) varies it through the environment:

    SHOP_BROKER_URL     broker and result backend
    SHOP_REDIS_URL      app.conf.resilience_redis_url (guard state; effects are counted here)
    SHOP_DATABASE_URL   app.conf.resilience_database_url, unset for a Redis-only setup
    SHOP_QUEUE          the app's default queue (its routing is its own: no tiers)
    SHOP_RUN            prefix of the effect counters, one per test
    SHOP_INIT           before | after (init_app before or after the tasks) | never
    SHOP_TASK_CLS       custom: the app's task_cls is `ShopTask`, a Task subclass of its own

Not named tasks*.py: the platform's test workers must not load it.

`main(["charge", "42", "3"])` sends three `.delay()`s from this app and prints one JSON line:
each call's result or error, and the effect count; `main(["send", "charge", "42"])` sends one
message by name (`app.send_task`), bypassing the task class, as another service would.
"""

from __future__ import annotations

import json
import os
from typing import Any

import redis
from celery import Celery, Task, shared_task

import resilience
from resilience.circuit import circuit_breaker
from resilience.idempotency import idempotent, unique

INIT = os.environ.get("SHOP_INIT", "before")
RUN = os.environ.get("SHOP_RUN", "shop")


class ShopTask(Task):
    """The app's own base task class (`task_cls`), as Django's `DjangoTask` would be."""

    #: Marks tasks made from this class, so the test can see the app's base survived.
    shop_base = True


app = Celery(
    "shop",
    broker=os.environ.get("SHOP_BROKER_URL", "redis://127.0.0.1:6379/0"),
    backend=os.environ.get("SHOP_BROKER_URL", "redis://127.0.0.1:6379/0"),
    task_cls=ShopTask if os.environ.get("SHOP_TASK_CLS") == "custom" else None,
)
app.conf.update(
    task_default_queue=os.environ.get("SHOP_QUEUE", "shop"),
    task_serializer="json",
    accept_content=["json"],
    resilience_redis_url=os.environ.get("SHOP_REDIS_URL", "redis://127.0.0.1:6379/1"),
)
if os.environ.get("SHOP_DATABASE_URL"):
    app.conf.resilience_database_url = os.environ["SHOP_DATABASE_URL"]

if INIT == "before":
    resilience.init_app(app)


def _effects() -> Any:
    return redis.Redis.from_url(app.conf.resilience_redis_url)


def count(name: str, argument: Any) -> int:
    """How many times the body of `name` ran for `argument` (its real effect)."""
    return int(_effects().get(f"{RUN}:{name}:{argument}") or 0)


def _effect(name: str, argument: Any) -> None:
    _effects().incr(f"{RUN}:{name}:{argument}")


@shared_task
@idempotent(key="{order_id}")
def charge(order_id: int) -> str:
    """Charge an order: its effect must happen once per order id."""
    _effect("charge", order_id)
    return f"charged {order_id}"


@shared_task
@unique(key="{order_id}", mode="until_finished", ttl_seconds=60)
def ship(order_id: int) -> str:
    """Ship an order: one queued or running shipment per order id (Redis only)."""
    import time

    time.sleep(1.0)
    _effect("ship", order_id)
    return f"shipped {order_id}"


@shared_task
@circuit_breaker(f"shop-vendor-{RUN}", minimum_calls=2, window=4, open_seconds=60,
                 local_state_seconds=0)
def call_vendor(attempt: int) -> str:
    """Call a vendor that always fails: the breaker opens after two calls (Redis only)."""
    _effect("call_vendor", "all")
    raise RuntimeError(f"vendor down (attempt {attempt})")


if INIT == "after":
    resilience.init_app(app)


def _wait(call: dict[str, Any]) -> None:
    if "id" not in call or "state" in call:
        return
    result = app.AsyncResult(call["id"])
    try:
        call["result"] = result.get(timeout=float(os.environ.get("SHOP_WAIT", "30")),
                                    propagate=False)
    except Exception as exc:  # noqa: BLE001 - a timeout: the state tells why
        call["wait_error"] = type(exc).__name__
    call["state"] = result.state
    decided = resilience.outcome_of(result)
    call["outcome"] = None if decided is None else str(decided.outcome.value)
    if isinstance(call.get("result"), BaseException):
        call["result"] = f"{type(call['result']).__name__}: {call['result']}"


def main(argv: list[str]) -> None:
    """Send calls as the command line says, wait for them, print one JSON line."""
    by_name = argv[0] == "send"
    if by_name:
        argv = [*argv[1:], "1"]
    name, argument, times = argv[0], int(argv[1]), int(argv[2])
    task = {"charge": charge, "ship": ship, "call_vendor": call_vendor}[name]
    one_by_one = bool(os.environ.get("SHOP_ONE_BY_ONE"))  # each call waits for the last
    calls: list[dict[str, Any]] = []
    for _ in range(times):
        try:
            if by_name:
                sent = app.send_task(f"{__name__}.{name}", args=[argument])
            else:
                sent = task.delay(argument)
            calls.append({"id": sent.id})
        except Exception as exc:  # noqa: BLE001 - reported to the test
            calls.append({"error": type(exc).__name__, "message": str(exc)})
        if one_by_one:
            _wait(calls[-1])
    for call in calls:
        _wait(call)
    print(json.dumps({
        "calls": calls,
        "effects": count(name, argument if name != "call_vendor" else "all"),
        "class": [cls.__name__ for cls in type(task._get_current_object()).__mro__],
    }, default=str))
