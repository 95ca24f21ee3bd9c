"""Tasks of the replay-value tests: each first run answers a value no other run could, so
an equal answer from a duplicate is the first call's, replayed."""

from __future__ import annotations

import uuid
from typing import Any

from jobs import app
from resilience.idempotency import idempotent


@app.task(tier="standard", name="tests.replay.payment")
@idempotent(key="payment:{order_id}")
def payment(order_id: str, amount: int) -> dict[str, Any]:
    """A charge: the answer names the payment the first call made."""
    return {"payment_id": f"pay-{uuid.uuid4().hex}", "order_id": order_id, "amount": amount}


@app.task(tier="standard", name="tests.replay.number")
@idempotent(key="number:{key}")
def number(key: str) -> int:
    """A plain int (no dict to hide an outcome in)."""
    return uuid.uuid4().int % 10**12


@app.task(tier="standard", name="tests.replay.items")
@idempotent(key="items:{key}")
def items(key: str) -> list[Any]:
    """A list."""
    return [key, uuid.uuid4().hex, 3]


@app.task(tier="standard", name="tests.replay.passed_on")
def passed_on(previous: Any) -> dict[str, Any]:
    """The next task of a chain: says what it was handed."""
    return {"handed": previous}
