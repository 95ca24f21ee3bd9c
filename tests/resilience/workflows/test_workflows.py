"""Durable canvas on real worker processes: results as plain Celery's, positions and
headers, replay of a duplicated step, compensation order, retry, replay, cancel."""

from __future__ import annotations

from typing import Any

import pytest
from celery import chain, chord, group
from sqlalchemy import text

from resilience.headers import WORKFLOW_STEP_HEADER
from resilience.outbox import OUTBOX_HEADER
from resilience.workflows import (
    InvalidWorkflow,
    StepState,
    WorkflowState,
    describe,
    durable,
    recent,
)
from tests.resilience.workflows import tasks_workflows as t
from tests.support import wait_for

pytestmark = pytest.mark.timeout(120)


def ledger(engine: Any, run: str, kind: str | None = None) -> list[tuple[str, str]]:
    """(kind, label) rows of a run, in the order they were written."""
    with engine.connect() as connection:
        rows = connection.execute(text(
            "SELECT kind, label FROM workflow_test_ledger WHERE run = :run "
            "AND (CAST(:kind AS TEXT) IS NULL OR kind = CAST(:kind AS TEXT)) ORDER BY ordinal"),
            {"run": run, "kind": kind}).all()
    return [(row.kind, row.label) for row in rows]


def settled(stores: Any, workflow_id: str, *states: WorkflowState) -> Any:
    return wait_for(lambda: (lambda s: s if s.state in states else None)(
        describe(stores, workflow_id)), timeout_seconds=30,
        message=f"workflow {workflow_id} in {states}")


SHAPES = {
    "chain": lambda: chain(t.add.s(1, 2), t.mul.s(10), t.add.s(5)),
    "group": lambda: group(t.add.s(1, 1), t.mul.s(3, 3), t.add.s(2, 2)),
    "chord": lambda: chord([t.add.s(1, 2), t.mul.s(2, 5)], t.pack.s("end")),
    "chain-group-task": lambda: chain(t.add.s(1, 2), group(t.mul.s(2), t.mul.s(3)),
                                      t.pack.s()),
    "chain-ending-in-group": lambda: chain(t.add.s(2, 3), group(t.mul.s(2), t.add.s(1))),
    "group-of-chains": lambda: chain(group(chain(t.add.s(1, 1), t.mul.s(5)),
                                           chain(t.add.s(2, 2), t.mul.s(6))), t.pack.s()),
    "immutable": lambda: chain(t.add.s(1, 2), t.add.si(10, 20), t.pack.s("x")),
    "chord-in-chain": lambda: chain(t.add.s(1, 1), chord([t.mul.s(3), t.mul.s(4)],
                                                         t.total.s()), t.mul.s(2)),
}


class TestResults:
    """The durable run's result is what plain Celery's canvas gives, shape by shape."""

    @pytest.mark.parametrize("shape", list(SHAPES))
    def test_durable_result_equals_plain_celery(self, tier_workers: Any, stores: Any,
                                                 shape: str) -> None:
        """The same canvas run by plain Celery (result backend, chord_unlock) and durably
        (PostgreSQL) returns the same value."""
        expected = SHAPES[shape]().apply_async().get(timeout=30)
        run = durable(SHAPES[shape](), name=f"shape-{shape}").apply_async()
        assert run.get(timeout=30) == expected
        summary = describe(stores, run.id)
        assert summary.state is WorkflowState.SUCCEEDED
        assert summary.result == expected
        assert summary.counts == {"succeeded": len(summary.steps)}

    def test_positions_dependencies_and_headers(self, tier_workers: Any, stores: Any,
                                                engine: Any) -> None:
        """Positions are depth-first as written; each step depends on its sources; each
        step message carried `resilience_workflow_step` = "<id>:<position>"."""
        run = durable(chain(t.add.s(1, 2), group(t.mul.s(2), t.mul.s(3)), t.pack.s()),
                      name="positions").apply_async()
        assert run.get(timeout=30) == [[6, 9]]
        steps = describe(stores, run.id).steps
        assert [(s.position, s.task_name, s.depends_on) for s in steps] == [
            (0, "tests.workflows.add", []), (1, "tests.workflows.mul", [0]),
            (2, "tests.workflows.mul", [0]), (3, "tests.workflows.pack", [1, 2])]
        with engine.connect() as connection:
            headers = dict(connection.execute(text(
                "SELECT task_id, options -> 'headers' ->> :header FROM resilience_outbox "
                "WHERE task_id = ANY(:ids)"),
                {"header": WORKFLOW_STEP_HEADER, "ids": [s.task_id for s in steps]}).all())
        assert headers == {s.task_id: f"{run.id}:{s.position}" for s in steps}
        assert run.id in {w.id for w in recent(stores, limit=20)}

    def test_a_task_of_an_app_never_initialised_is_refused(self) -> None:
        """`durable()` names a task that cannot record its step."""
        from celery import Celery

        other = Celery("never-initialised", set_as_current=False)

        @other.task(name="tests.workflows.not_guarded")
        def not_guarded() -> None: ...

        with pytest.raises(InvalidWorkflow, match="tests.workflows.not_guarded"):
            durable(chain(t.add.s(1, 2), not_guarded.si()), app=t.app)


class TestDeliveries:
    """A redelivered or duplicated step never runs or releases twice."""

    def test_a_duplicated_step_is_replayed_and_releases_nothing(
            self, tier_workers: Any, stores: Any, engine: Any, run: str) -> None:
        """A second copy of a finished step's message answers its recorded result; the
        next step's effect happens once."""
        flow = durable(chain(t.step.s(None, run, "a"), t.step.s(run, "b")),
                       name="dup").apply_async()
        assert flow.get(timeout=30) == "b"
        first = describe(stores, flow.id).steps[0]
        with engine.connect() as connection:
            outbox_id = connection.execute(text(
                "SELECT id FROM resilience_outbox WHERE task_id = :id"),
                {"id": first.task_id}).scalar_one()
        again = t.step.apply_async((None, run, "a"), task_id=first.task_id, headers={
            WORKFLOW_STEP_HEADER: f"{flow.id}:0", OUTBOX_HEADER: outbox_id})
        assert again.get(timeout=30) == "a"  # REPLAYED: the recorded result
        assert ledger(engine, run) == [("step", "a"), ("step", "b")]
        summary = describe(stores, flow.id)
        assert [s.state for s in summary.steps] == [StepState.SUCCEEDED] * 2
