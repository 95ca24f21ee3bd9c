"""Workflow metrics: fleet-wide counters through `resilience.counters` (exported by the
platform's Prometheus collector with every guard decision) and a step-latency hook.

Counters (guard label "workflow", outcome label the event, name label the workflow's name
as its caller gave it, like a task name: bounded by the code; UNNAMED without one):
STARTED, SUCCEEDED, FAILED, COMPENSATED, CANCELLED. Step latency (start of the step's guard to its
recorded outcome) goes to the observers registered with `observe_steps` (the platform's
worker registers a prometheus-client Histogram); the library itself depends on no
metrics client.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from resilience.counters import count_later, count_outcome

logger = logging.getLogger("resilience.workflows")

GUARD_NAME = "workflow"

#: `(task name, step state, seconds)` callables told of each recorded step.
StepObserver = Callable[[str, str, float], None]
_observers: list[StepObserver] = []


def observe_steps(observer: StepObserver) -> None:
    """Register `observer`, called with each step's task name, final state and latency."""
    if observer not in _observers:
        _observers.append(observer)


#: The name label of a workflow started without a name.
UNNAMED = "unnamed"


def workflow_event(app: Any, event: str, name: str | None, *, later: bool = False) -> None:
    """Count a workflow event (STARTED, SUCCEEDED, FAILED, COMPENSATED, CANCELLED) under
    the workflow's name; `later` (a worker's: one per workflow) with the process's other
    counts, within half a second (`resilience.counters.count_later`)."""
    count = count_later if later else count_outcome
    count(app, event.upper(), guard=GUARD_NAME, name=name or UNNAMED)


def step_finished(task_name: str, state: str, seconds: float) -> None:
    """Tell the observers a step was recorded; an observer's error is logged, never raised."""
    for observer in list(_observers):
        try:
            observer(task_name, state, seconds)
        except Exception:  # metrics never fail a step
            logger.debug("step observer %r failed", observer, exc_info=True)
