"""The message headers guards stamp and read, and one typed reader for them (`call.headers`).

Celery keeps a message's custom headers in `request.headers` and also lifts them onto the
request itself; `Headers` reads either, so every guard reads a header one way.

Timestamps follow one rule (`finite_seconds`): a finite int/float, or a string that parses as
one ("1700000000.5"), is used. Anything else (garbage, "", NaN, ±inf, a number beyond float
range, a bool, bytes, a list) counts as absent and logs one warning naming the task id and
the header. Such a header comes from a broken or hostile producer; treating it as absent
runs the job as if it had no deadline (or no enqueue time) instead of failing it with a
traceback, shedding it always (NaN, -inf) or exempting it for ever (+inf).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from functools import cached_property
from typing import Any, NamedTuple

# The timestamp headers are the deadline guard's; its logger keeps their warnings.
logger = logging.getLogger("resilience.deadline")

#: The job's absolute deadline, epoch seconds (stamped by the deadline guard at enqueue).
DEADLINE_HEADER = "deadline"
#: When the job became runnable, epoch seconds (stamped with the deadline).
ENQUEUED_AT_HEADER = "enqueued_at"
#: The outbox row a relayed job was published from.
OUTBOX_HEADER = "outbox_id"
#: The batch a job belongs to.
BATCH_HEADER = "batch_id"
#: The workflow step a job is: "<workflow id>:<position>" (":compensation" appended for
#: the step's compensation; ":<run>" from an operator's retry of it on), stamped by
#: resilience.workflows.
WORKFLOW_STEP_HEADER = "resilience_workflow_step"
#: The delay before this attempt, seconds (stamped by the retry guard's republish).
PREVIOUS_DELAY_HEADER = "resilience_previous_delay"


class WorkflowStep(NamedTuple):
    """A parsed `resilience_workflow_step` header."""

    workflow_id: str
    position: int
    compensation: bool = False
    #: The step's run: 0 the first, n after its n-th retry (header suffix ":<n>").
    run: int = 0


def finite_seconds(value: Any) -> float | None:
    """`value` as float seconds if it is a finite number or numeric string, else None."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        return None
    try:
        seconds = float(value)
    except (ValueError, OverflowError):
        return None
    return seconds if math.isfinite(seconds) else None


def epoch_seconds(value: Any) -> float | None:
    """A moment as epoch seconds: a finite number, a numeric or ISO-8601 string, or a
    datetime (naive means UTC); None when absent or unusable (NaN and ±inf included).

    Reads Celery's `expires` and `eta` wherever a guard needs them.
    """
    seconds = finite_seconds(value)
    if seconds is not None or value is None or isinstance(value, bool):
        return seconds
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value)
        except ValueError:
            return None
    if isinstance(value, datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=UTC)
        return value.timestamp()
    return None


class Headers:
    """Typed readers of one task request's headers; each header is parsed (and an unusable
    one warned about) once, whichever guard reads it first."""

    def __init__(self, request: Any) -> None:
        self.request = request

    def get(self, name: str) -> Any:
        """The raw value of header `name` (from `request.headers`, else the request), or None."""
        request = self.request
        if request is None:
            return None
        headers = getattr(request, "headers", None)
        value = headers.get(name) if isinstance(headers, Mapping) else None
        return getattr(request, name, None) if value is None else value

    def seconds(self, name: str) -> float | None:
        """Header `name` as finite seconds, or None; an unusable value is logged once."""
        value = self.get(name)
        if value is None:
            return None
        seconds = finite_seconds(value)
        if seconds is None:
            logger.warning("task %s: ignoring unusable %s header %r (not a finite number); "
                           "treated as absent", getattr(self.request, "id", None), name, value)
        return seconds

    @cached_property
    def deadline(self) -> float | None:
        """The job's deadline, epoch seconds, or None."""
        return self.seconds(DEADLINE_HEADER)

    @cached_property
    def enqueued_at(self) -> float | None:
        """When the job became runnable, epoch seconds, or None."""
        return self.seconds(ENQUEUED_AT_HEADER)

    @cached_property
    def expires_at(self) -> float | None:
        """The earlier of the deadline and Celery's `expires`, epoch seconds, or None."""
        known = [value for value in (epoch_seconds(getattr(self.request, "expires", None)),
                                     self.deadline) if value is not None]
        return min(known) if known else None

    @cached_property
    def outbox_id(self) -> int | None:
        """The outbox row id the job was relayed from, or None."""
        value = self.get(OUTBOX_HEADER)
        return None if isinstance(value, bool) else _parsed(int, value)

    @cached_property
    def batch_id(self) -> str | None:
        """The batch the job belongs to, or None."""
        value = self.get(BATCH_HEADER)
        return value if isinstance(value, str) and value else None

    @cached_property
    def workflow_step(self) -> WorkflowStep | None:
        """The workflow step the job is (or whose compensation it is), or None."""
        value = self.get(WORKFLOW_STEP_HEADER)
        if not isinstance(value, str) or not value:
            return None
        workflow_id, _, rest = value.partition(":")
        position, *kinds = rest.split(":")
        try:
            run = int(kinds.pop()) if kinds and kinds[-1].isdigit() else 0
            return WorkflowStep(workflow_id, int(position), kinds == ["compensation"], run)
        except ValueError:
            return None

    @cached_property
    def previous_delay(self) -> float | None:
        """The delay before this attempt (seconds), set by the retry guard, or None."""
        return _parsed(float, self.get(PREVIOUS_DELAY_HEADER))


def _parsed(kind: Callable[[Any], Any], value: Any) -> Any:
    """`kind(value)`, or None when `value` is None or does not parse."""
    try:
        return None if value is None else kind(value)
    except (TypeError, ValueError):
        return None
