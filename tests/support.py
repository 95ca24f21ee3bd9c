"""Test-suite helpers: the shared harness in `tests.harness`, plus the suite's task modules."""

from __future__ import annotations

from tests.harness import (
    ARTIFACTS,
    ROOT,
    Services,
    Worker,
    running,
    task_modules,
    wait_for,
)

__all__ = ["ARTIFACTS", "ROOT", "Services", "Worker", "running", "suite_task_modules",
           "wait_for"]


def suite_task_modules() -> list[str]:
    """Every tasks module of the test suite; the test workers load them all."""
    return task_modules("tests")
