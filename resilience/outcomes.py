"""Outcomes: what a guard decided about one job, as users see it in results, counters, logs
and traces (each decision a span event: see "trace events" below)."""

from __future__ import annotations

import contextvars
import sys
import time
from dataclasses import dataclass
from enum import Enum
from typing import Any

from celery import current_task, signals
from celery.exceptions import Ignore

from resilience.headers import epoch_seconds


class Outcome(str, Enum):
    """The vocabulary of guard decisions (DESIGN.md)."""

    SUCCEEDED = "SUCCEEDED"
    SHED = "SHED"
    REPLAYED = "REPLAYED"
    SKIPPED = "SKIPPED"
    DEFERRED = "DEFERRED"
    REJECTED = "REJECTED"
    DISCARDED = "DISCARDED"
    RETRY = "RETRY"
    DEAD_LETTERED = "DEAD-LETTERED"
    #: An operator cancelled the job (`jobs cancel`): it never starts, nothing is retried.
    CANCELLED = "CANCELLED"
    #: A store was down and the guard let the job through (`on_store_down="fail_open"`).
    FAIL_OPEN = "FAIL-OPEN"

    def __str__(self) -> str:
        return self.value


class Stop(Exception):
    """Signal raised by a guard to end one execution early with a visible outcome.

    Args:
        outcome: what happened (SKIPPED, REPLAYED, SHED, DEFERRED, ...).
        guard: the name of the guard that decided.
        reason: one human sentence, shown in Flower and logs.
        result: for REPLAYED, the stored result returned to the caller.
        retry_after_seconds: for DEFERRED, when to try again.
        details: structured fields (key, holder task id, breaker name, ...).
    """

    def __init__(self, outcome: Outcome, *, guard: str, reason: str, result: Any = None,
                 retry_after_seconds: float | None = None,
                 details: dict[str, Any] | None = None) -> None:
        super().__init__(f"{outcome}: {reason}")
        self.outcome = Outcome(outcome)
        self.guard = guard
        self.reason = reason
        self.result = result
        self.retry_after_seconds = retry_after_seconds
        self.details = dict(details or {})
        # A guard builds a Stop when it decides: the decision becomes a span event now.
        stopped(self)

    def as_result(self) -> dict[str, Any]:
        """The JSON result a stopped task returns, so Flower and AsyncResult show the why."""
        body = self.as_meta()
        if self.outcome is Outcome.REPLAYED or self.result is not None:
            body["result"] = self.result
        return body

    def as_meta(self) -> dict[str, Any]:
        """The decision as it travels in the job's result metadata and its task event."""
        meta: dict[str, Any] = {"outcome": self.outcome.value, "guard": self.guard,
                                "reason": self.reason}
        if self.details:
            meta["details"] = self.details
        return meta


def is_outcome_result(value: Any) -> bool:
    """True when `value` is the result of a task stopped by a guard."""
    return isinstance(value, dict) and value.get("outcome") in Outcome._value2member_map_


# -- outcomes in results and events (docs/pipeline.md) ----------------------------------------
# The decision travels beside the value: in the result's metadata under `outcome`, and from a
# worker as a task event of its own (`task-replayed`, ...), a custom state in Flower.

#: Key of the decision in a job's stored result metadata.
OUTCOME_META_KEY = "outcome"
#: Attribute of the task request (Celery's Context) the result backend reads it from.
OUTCOME_REQUEST_ATTRIBUTE = "resilience_outcome"


class OutcomeStored(Ignore):
    """Raised in the worker once a stopped job's result is stored: Celery records nothing
    more (`Ignore`, its idiom for a custom state) and `resilience.results.OutcomeRequest`
    sends `event` (`task-replayed`) with `fields` (`outcome`, `guard`, `reason`, `result`)."""

    def __init__(self, event: str, fields: dict[str, Any]) -> None:
        super().__init__(f"{fields.get('outcome')} by {fields.get('guard')}: "
                         f"{fields.get('reason')}")
        self.event = event
        self.fields = dict(fields)

    @property
    def guard(self) -> str:
        return str(self.fields.get("guard"))

    def __reduce__(self) -> tuple[Any, ...]:
        # A prefork child hands the exception to the main process, which sends the event.
        return (type(self), (self.event, self.fields))


def event_type_of(outcome: Outcome | str) -> str:
    """The task event of a stopped outcome: `task-replayed`, `task-shed`, ... Celery's event
    state makes its part after `task-` the task's state, in upper case (`REPLAYED`)."""
    return f"task-{str(outcome).lower()}"


@dataclass(frozen=True)
class GuardOutcome:
    """What a guard decided about a finished job, read back from its result."""

    outcome: Outcome
    guard: str
    reason: str
    details: dict[str, Any]


def outcome_of(result: Any) -> GuardOutcome | None:
    """The guard decision that stopped a finished job (an `AsyncResult`), or None when its
    body ran or it has not finished: from the result's metadata (`resilience.results`'
    backends), else an outcome dict it returned (a REPLAYED value elsewhere has neither)."""
    meta = result._get_task_meta()
    found = meta.get(OUTCOME_META_KEY)
    if not isinstance(found, dict):
        found = meta.get("result")
        if meta.get("status") != "SUCCESS" or not is_outcome_result(found):
            return None
    return GuardOutcome(outcome=Outcome(found["outcome"]), guard=str(found.get("guard")),
                        reason=str(found.get("reason")), details=dict(found.get("details") or {}))


# -- trace events (`guard.decision` on the current span: docs/observe.md) -------------------
# A decision surfaces twice: `counters.count_outcome`, then usually the `Stop` the guard
# raises (which alone knows the reason and the retry-after). So a counted decision waits in
# a context variable for its Stop and is written once, merged; it is written as it is when
# anything else happens first in its span (another decision, a publish: the ETA then gives
# the retry-after, the end of the task). Without a recording span all of this is one check.

#: Name of the span event of a guard decision.
DECISION_EVENT = "guard.decision"
#: Outcomes never followed by a Stop: written at once.
_WRITTEN_AT_ONCE = frozenset({"DEAD-LETTERED", "FAIL-OPEN"})
#: Most decisions waiting at once (spans nested in one context); the oldest is written.
_MAX_WAITING = 8


@dataclass
class _Decision:
    """A counted decision not yet written, and the span it belongs to."""

    span: Any
    attributes: dict[str, Any]
    timestamp_ns: int
    task_id: str | None = None


_waiting: contextvars.ContextVar[tuple[_Decision, ...]] = contextvars.ContextVar(
    "resilience_waiting_decisions", default=())


def _recording_span() -> Any:
    """The current span if a tracer records it, else None. OpenTelemetry is never imported
    here: a span can only record where something imported its API already."""
    trace = sys.modules.get("opentelemetry.trace")
    if trace is None:
        return None
    span = trace.get_current_span()
    return span if span.is_recording() else None


def _attributes(**values: Any) -> dict[str, Any]:
    """Event attributes without the empty ones (OpenTelemetry refuses None)."""
    return {key: value for key, value in values.items() if value is not None and value != ""}


def _write(decision: _Decision) -> None:
    # A span that ended meanwhile no longer records: there is nothing to add to.
    if decision.span.is_recording():
        decision.span.add_event(DECISION_EVENT, decision.attributes,
                                timestamp=decision.timestamp_ns)


def _take(span: Any) -> _Decision | None:
    """Remove and return the decision waiting in `span`, if any."""
    waiting = _waiting.get()
    for decision in waiting:
        if decision.span is span:
            _waiting.set(tuple(d for d in waiting if d is not decision))
            return decision
    return None


def flush_decisions(span: Any = None, *, eta: str | None = None,
                    task_id: str | None = None) -> None:
    """Write the decision waiting in `span` (default: the current span) as it is; `eta`
    (ISO-8601) of a message republishing `task_id`, the deciding task, gives it its
    `retry_after` when it has none."""
    span = span if span is not None else _recording_span()
    decision = _take(span) if span is not None else None
    if decision is None:
        return
    if (eta and task_id is not None and task_id == decision.task_id
            and "retry_after" not in decision.attributes):
        due = epoch_seconds(eta)
        if due is not None:
            decision.attributes["retry_after"] = round(
                max(0.0, due - decision.timestamp_ns / 1e9), 3)
    _write(decision)


def counted(outcome: str, *, guard: str, tier: str | None = None, name: str | None = None,
            reason: str | None = None, retry_after_seconds: float | None = None) -> None:
    """Record a counted guard decision as a span event (see the section comment); without a
    `reason`, the error being handled is the reason. Never raises."""
    span = _recording_span()
    if span is None:
        return
    try:
        flush_decisions(span)
        if reason is None:
            handled = sys.exc_info()[1]
            if handled is not None and not isinstance(handled, Stop):
                reason = f"{type(handled).__name__}: {handled}"
        decision = _Decision(
            span=span,
            attributes=_attributes(guard=guard, outcome=str(outcome), reason=reason,
                                   retry_after=retry_after_seconds, name=name, tier=tier),
            timestamp_ns=time.time_ns(),
            task_id=getattr(getattr(current_task, "request", None), "id", None))
        if str(outcome) in _WRITTEN_AT_ONCE:
            _write(decision)
            return
        waiting = (*_waiting.get(), decision)
        for oldest in waiting[:-_MAX_WAITING]:
            _write(oldest)
        _waiting.set(waiting[-_MAX_WAITING:])
    except Exception:  # noqa: BLE001 - tracing must never fail a job
        return


def stopped(stop: Stop) -> None:
    """Record the decision a `Stop` carries, merged into its counted twin if one waits."""
    span = _recording_span()
    if span is None:
        return
    try:
        waiting = _take(span)
        if (waiting is not None and waiting.attributes.get("guard") == stop.guard
                and waiting.attributes.get("outcome") == stop.outcome.value):
            waiting.attributes.update(_attributes(reason=stop.reason,
                                                  retry_after=stop.retry_after_seconds))
            _write(waiting)
            return
        if waiting is not None:
            _write(waiting)
        span.add_event(DECISION_EVENT, _attributes(
            guard=stop.guard, outcome=stop.outcome.value, reason=stop.reason,
            retry_after=stop.retry_after_seconds))
    except Exception:  # noqa: BLE001 - tracing must never fail a job
        return


def _flush_before_publish(headers: Any = None, **_: Any) -> None:
    if _waiting.get():
        headers = headers if isinstance(headers, dict) else {}
        flush_decisions(eta=headers.get("eta"), task_id=headers.get("id"))


def _flush_after_task(**_: Any) -> None:
    if _waiting.get():
        flush_decisions()


# Connected at import, before any tracing setup instruments Celery, so these run first: the
# deciding span is still the current one (not yet the publish span) and, on task_postrun,
# still open. Each costs one context-variable read when idle.
signals.before_task_publish.connect(_flush_before_publish, weak=False)
signals.task_postrun.connect(_flush_after_task, weak=False)
