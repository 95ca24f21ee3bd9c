"""Tasks of the workflow page test (loaded by every test worker): steps that count their
runs in Redis, one that fails while its run's switch is on."""

from __future__ import annotations

from typing import Any

from jobs import app
from resilience.stores import stores_for


def _count(run_id: str, step: str) -> None:
    stores_for(app).redis().incr(f"tests:observe:workflow:{run_id}:{step}")


@app.task(tier="standard", name="tests.observe.workflow_add")
def workflow_add(x: int, y: int, run_id: str) -> int:
    """x + y, counted per (run, x, y): the test asserts a step did not run again."""
    _count(run_id, f"add-{x}-{y}")
    return x + y


@app.task(tier="standard", name="tests.observe.workflow_flaky")
def workflow_flaky(value: Any, run_id: str) -> Any:
    """`value`, or a non-retryable error while `tests:observe:workflow:<run>:broken` is set."""
    _count(run_id, "flaky")
    if stores_for(app).redis().exists(f"tests:observe:workflow:{run_id}:broken"):
        raise ValueError("observe: the flaky step is broken")
    return value


@app.task(tier="standard", name="tests.observe.workflow_undo")
def workflow_undo(value: Any, run_id: str) -> None:
    """A compensation (runs only if a step it compensates succeeded and the run failed)."""
    _count(run_id, "undo")


@app.task(tier="standard", name="tests.observe.workflow_total")
def workflow_total(values: list[int], run_id: str) -> int:
    """The sum of a group's results."""
    _count(run_id, "total")
    return sum(values)
