"""Tasks of the Celery task-API tests: argument types, typing, direct calls, kombu's JSON
types, and a retry whose RETRY lands after the next attempt's FAILURE."""

from __future__ import annotations

import datetime as dt
import time
import uuid
from decimal import Decimal
from typing import Any, ClassVar

from celery import signals
from celery.exceptions import Retry
from pydantic import BaseModel

from jobs import app
from resilience.idempotency import idempotent, unique
from resilience.pipeline import Call, Guard, Stage, attach
from resilience.stores import stores_for

#: The guard Redis key a late-retry job's `task_retry` handler sets once Celery has stored
#: (or tried to store) its RETRY.
RETRIED_MARK = "tests:task-api:retried:{}"
#: How long the retrying attempt stalls between the retry's publish and RETRY's store.
STALL_SECONDS = 1.5


class InlineProbe(Guard):
    """Hands the body `inline=`: whether the pipeline saw an inline call."""

    name: ClassVar[str] = "inline-probe"
    stage: ClassVar[Stage] = Stage.RATE

    def before_run(self, call: Call) -> None:
        call.inject["inline"] = call.inline


def probed(func: Any) -> Any:
    return attach(func, InlineProbe())


@app.task(bind=True, tier="standard", name="tests.task_api.recurse")
@probed
def recurse(self: Any, depth: int, inline: bool = False) -> dict[str, Any]:
    """Calls itself directly (as a function) `depth` times; what each level saw."""
    seen: dict[str, Any] = {
        "args": list(self.request.args or ()),
        "called_directly": bool(self.request.called_directly),
        "inline": inline,
    }
    if depth > 0:
        seen["inner"] = recurse(depth - 1)
    return seen


@app.task(tier="standard", name="tests.task_api.untyped", typing=False)
def untyped(x: int) -> int:
    return x


class Parcel(BaseModel):
    """A pydantic model argument (Celery's `pydantic=True` dumps it before sending)."""

    weight: int


@app.task(tier="standard", name="tests.task_api.weighed", pydantic=True)
def weighed(parcel: Parcel) -> int:
    return parcel.weight


@app.task(tier="standard", name="tests.task_api.typed")
def typed(x: int) -> int:
    return x


def _described(key: uuid.UUID, when: dt.datetime, amount: Decimal) -> list[str]:
    return [type(key).__name__, key.hex, type(when).__name__, when.isoformat(),
            type(amount).__name__, str(amount)]


@app.task(tier="standard", name="tests.task_api.kombu_types_plain")
def kombu_types_plain(key: uuid.UUID, when: dt.datetime, amount: Decimal) -> list[str]:
    return _described(key, when, amount)


@app.task(bind=True, tier="standard", name="tests.task_api.kombu_types_guarded")
@unique(ttl_seconds=60, mode="until_finished", raise_on_duplicate=True)
@idempotent()
def kombu_types_guarded(self: Any, key: uuid.UUID, when: dt.datetime,
                        amount: Decimal) -> list[str]:
    return [*_described(key, when, amount), self.request.id]


@app.task(bind=True, tier="standard", name="tests.task_api.late_retry", max_retries=1)
def late_retry(self: Any, run_id: str) -> str:
    """The first attempt retries, then stalls after the retry's publish, so the second
    attempt's FAILURE is stored before the first attempt's RETRY (Celery's race, widened)."""
    if self.request.retries == 0:
        try:
            raise self.retry(countdown=0)
        except Retry:
            time.sleep(STALL_SECONDS)
            raise
    raise ValueError(f"final attempt of {run_id} fails")


@signals.task_retry.connect
def _mark_retried(sender: Any = None, request: Any = None, **_: Any) -> None:
    """After Celery's `handle_retry` stored (or was refused) the RETRY."""
    if getattr(sender, "name", None) == "tests.task_api.late_retry":
        stores_for(app).redis().set(RETRIED_MARK.format(request.id), 1, ex=300)
