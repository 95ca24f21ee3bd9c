"""A user's own tests of a durable canvas and a batch, written as the README proposes
(/tmp/changelog/W7.md's snippet): the pytest plugin's `resilience_memory` fixture and
`task_always_eager`, an app whose Redis and PostgreSQL nothing listens on. The first half is
the user's `orders.py`, the second their `test_orders.py`.
"""

from __future__ import annotations

from typing import Any

import pytest
from celery import Celery, chain

import resilience
from jobs.embedded import free_port
from resilience.batches import batch
from resilience.workflows import WorkflowFailed, durable

# -- orders.py (the user's app; the URLs lead nowhere: the plugin keeps state in memory) ----
app = Celery("orders", broker=f"redis://127.0.0.1:{free_port()}/0")
app.conf.resilience_redis_url = f"redis://127.0.0.1:{free_port()}/1"
app.conf.resilience_database_url = f"postgresql://shop@127.0.0.1:{free_port()}/shop"
resilience.init_app(app)

effects: list[Any] = []


@app.task(name="orders.charge")
def charge(order_id: int) -> int:
    effects.append(("charge", order_id))
    return order_id * 100


@app.task(name="orders.refund")
def refund(amount: int, order_id: int) -> None:
    effects.append(("refund", order_id, amount))


@app.task(name="orders.ship")
def ship(amount: int, order_id: int) -> str:
    if order_id < 0:
        raise RuntimeError("no courier")
    effects.append(("ship", order_id))
    return f"parcel-{order_id}"


@app.task(name="orders.report")
def report(summary: dict[str, Any]) -> None:
    effects.append(("report", summary["callback"], summary["tallies"]["succeeded"]))


# -- test_orders.py ------------------------------------------------------------------------
@pytest.fixture(autouse=True)
def eager(resilience_memory: Any) -> Any:
    app.conf.task_always_eager = True
    effects.clear()
    yield resilience_memory
    app.conf.task_always_eager = False


def test_an_order_is_charged_then_shipped() -> None:
    run = durable(chain(charge.s(7).set(compensate=refund.s(7)), ship.s(7))).apply_async()
    assert run.get() == "parcel-7"
    assert effects == [("charge", 7), ("ship", 7)]


def test_a_failed_shipment_refunds_the_charge() -> None:
    run = durable(chain(charge.s(-1).set(compensate=refund.s(-1)), ship.s(-1))).apply_async()
    with pytest.raises(WorkflowFailed) as failed:
        run.get()
    assert failed.value.state == "compensated"
    assert effects == [("charge", -1), ("refund", -1, -100)]


def test_a_batch_reports_once_when_every_order_is_done() -> None:
    done = batch([charge.s(1), charge.s(2)], on_complete=report.s()).apply_async()
    assert done.summary().succeeded
    assert effects == [("charge", 1), ("charge", 2), ("report", "complete", 2)]
