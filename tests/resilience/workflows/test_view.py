"""The workflows view's pure parts: a run's steps table stays short for a batch-sized run
and keeps the steps that did not succeed; the status line says what failed."""

from __future__ import annotations

from typing import Any

from resilience.workflows.view import STEPS, STEPS_SHOWN, graph, status


def step(position: int, state: str, *after: int) -> dict[str, Any]:
    return {"position": position, "task_name": "shop.member", "state": state,
            "task_id": f"task-{position}", "depends_on": list(after), "result": position,
            "error": "ValueError: no" if state == "failed" else None, "started_at": None,
            "finished_at": None, "compensate": None, "compensation_state": None,
            "compensation_task_id": None, "compensation_error": None}


def run(steps: list[dict[str, Any]]) -> dict[str, Any]:
    return {"id": "w1", "name": "invoices", "state": "failed", "total": len(steps),
            "counts": {"failed": 1, "pending": 1, "succeeded": len(steps) - 2},
            "failed_step": 1500, "error": "ValueError: no", "replay_of": None, "steps": steps}


class TestRunPage:
    def test_a_batch_sized_run_shows_its_first_steps_and_every_one_that_did_not_succeed(
        self) -> None:
        """2,000 members and a callback: the table has the first STEPS_SHOWN steps, then the
        failed member and the pending callback; the title counts all 2,002; the graph
        folds the members."""
        members = [step(i, "failed" if i == 1500 else "succeeded", 0) for i in range(1, 2001)]
        document = run([step(0, "succeeded"), *members, step(2001, "pending", *range(1, 2001))])
        rows = STEPS.rows(document)
        assert [row["position"] for row in rows] == [*range(STEPS_SHOWN), 1500, 2001]
        assert rows[-2]["outcome"] == "ValueError: no" and rows[-1]["after"].startswith("1, 2")
        assert STEPS.title_of(document) == "steps (2002)"
        svg = graph(document)
        assert svg.count('class="step"') < 30 and 'data-count="1977"' in svg

    def test_the_status_line_names_the_failed_step_and_its_error(self) -> None:
        """One line: id, name, state, steps per state, the failed step and its error."""
        assert status(run([step(0, "succeeded"), step(1, "failed", 0)])) == (
            "workflow w1 invoices: failed, 2 steps (failed 1, pending 1, succeeded 0); "
            "step 1500 failed: ValueError: no")
