"""Durable workflows on the /resilience page, in headless Chromium: the list, one run drawn
as its graph with each step's state (read from the SVG's DOM), and the retry action from the
run's page; the same run through `jobs workflows` and the actions' refusals."""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

import pytest
from typer.testing import CliRunner

from tests.jobs.observe.browser import Browser
from tests.support import ARTIFACTS, wait_for

#: The graph's nodes as the page draws them: position -> (state, task).
NODES = """Object.fromEntries([...document.querySelectorAll('#detail-figure svg g.step')]
  .map(g => [g.dataset.position, [g.dataset.state, g.dataset.task]]))"""
EDGES = """[...document.querySelectorAll('#detail-figure svg path.edge')]
  .map(e => [Number(e.dataset.from), Number(e.dataset.to)])"""
COMPENSATIONS = """[...document.querySelectorAll('#detail-figure svg g.compensation')]
  .map(g => [g.dataset.position, g.dataset.task, g.dataset.state])"""


@pytest.fixture()
def relay(app: Any) -> Iterator[Any]:
    """`jobs outbox relay`'s loop in a thread of the test process: a retry's steps reach
    the broker through it (the page's process writes them to the outbox)."""
    from resilience.outbox import Relay, RelayConfig

    relay = Relay(app, RelayConfig(poll_seconds=0.2, backoff_initial_seconds=0.05,
                                   backoff_max_seconds=0.5))
    stopping = threading.Event()
    thread = threading.Thread(target=relay.run, args=(stopping.is_set,), daemon=True,
                              name="workflow-page-relay")
    thread.start()
    yield relay
    stopping.set()
    thread.join(10)
    relay.backend.close()


def _runs(redis_client: Any, run_id: str, step: str) -> int:
    return int(redis_client.get(f"tests:observe:workflow:{run_id}:{step}") or 0)


def _settled(stores: Any, workflow_id: str, state: str) -> Any:
    """The run once it is in `state` and none of its steps is still queued."""
    from resilience.workflows import describe

    def ready() -> Any:
        summary = describe(stores, workflow_id)
        busy = any(str(step.state) == "queued" for step in summary.steps)
        return summary if str(summary.state) == state and not busy else None

    return wait_for(ready, timeout_seconds=30, interval=0.05,
                    message=f"workflow {workflow_id} {state}")


class TestWorkflowPage:
    @pytest.mark.timeout(120)
    def test_the_page_draws_a_failed_run_and_retries_it(
        self, app: Any, stores: Any, redis_client: Any, tier_workers: Any, flower: Any,
        relay: Any, tmp_path: Path,
    ) -> None:
        """chain(add, group(add, add), flaky, total) with the flaky step broken: the list
        shows the run failed and links to its page; the graph has one node per step with
        its state (the broken step failed, the step after it not run), the canvas's edges
        and the flaky step's compensation (not run: its step never succeeded). After the
        fix, the page's Retry runs the run again from the failed step: the graph then shows
        every step succeeded, the result is the canvas's, and no earlier step ran again."""
        from celery import chain, group

        from resilience.workflows import durable
        from tests.jobs.observe.tasks_workflows import (
            workflow_add,
            workflow_flaky,
            workflow_total,
            workflow_undo,
        )

        run_id = uuid.uuid4().hex[:8]
        redis_client.set(f"tests:observe:workflow:{run_id}:broken", 1)
        canvas = chain(workflow_add.s(1, 2, run_id),
                       group(workflow_add.s(10, run_id), workflow_add.s(20, run_id)),
                       workflow_flaky.s(run_id).set(compensate=workflow_undo.s(run_id)),
                       workflow_total.s(run_id))
        run = durable(canvas, name=f"observe-{run_id}").apply_async()
        failed = _settled(stores, run.id, "failed")
        after = failed.steps[4].state.value
        assert [step.state.value for step in failed.steps] == [
            "succeeded", "succeeded", "succeeded", "failed", after]
        assert after in ("pending", "skipped")

        with Browser() as browser:
            browser.open(f"{flower.url}/resilience?refresh=0")
            row = f"#workflow-{run.id}"
            assert browser.evaluate(f"document.querySelector('{row}').dataset.state") == "failed"
            with browser.page.expect_navigation(wait_until="load"):
                browser.page.locator(f"{row} a").first.click()
            assert browser.page.url.endswith(f"/resilience/workflows/{run.id}")

            add, flaky, total = workflow_add.name, workflow_flaky.name, workflow_total.name
            assert browser.evaluate(NODES) == {
                "0": ["succeeded", add], "1": ["succeeded", add], "2": ["succeeded", add],
                "3": ["failed", flaky], "4": [after, total]}
            assert sorted(browser.evaluate(EDGES)) == [[0, 1], [0, 2], [1, 3], [2, 3], [3, 4]]
            assert browser.evaluate(COMPENSATIONS) == [["3", workflow_undo.name, ""]]
            assert "observe: the flaky step is broken" in browser.text("#step-row-3")
            ARTIFACTS.mkdir(exist_ok=True)
            browser.screenshot(ARTIFACTS / "workflow-graph-failed.png")

            redis_client.delete(f"tests:observe:workflow:{run_id}:broken")
            browser.submit("#detail-workflow-retry")
            assert "retried from its failed step" in browser.text("#flash"), browser.text("#flash")
            assert browser.page.url.endswith(f"/resilience/workflows/{run.id}")

            done = _settled(stores, run.id, "succeeded")
            browser.open(f"{flower.url}/resilience/workflows/{run.id}")
            assert {position: state for position, (state, _) in
                    browser.evaluate(NODES).items()} == dict.fromkeys("01234", "succeeded")
            assert browser.evaluate("document.querySelector('#detail-workflow-retry')") is None

        assert done.result == run.get(timeout=10) == 36  # total([3 + 10, 3 + 20])
        counted = ("add-1-2", "add-3-10", "add-3-20", "flaky", "undo", "total")
        assert [_runs(redis_client, run_id, step) for step in counted] == [1, 1, 1, 2, 0, 1]

        # Its events in the view's metric family (the counters were emptied with Redis).
        from jobs.observe.snapshot import outcome_counters
        from resilience.workflows.view import EVENTS

        def events() -> dict[str, float]:
            return dict((labels[0], value) for labels, value in EVENTS.samples(
                None, {"counters": outcome_counters(redis_client)}))

        # A worker's counts are written within half a second (`count_later`).
        wait_for(lambda: events() == {"started": 1, "failed": 1, "succeeded": 1},
                 timeout_seconds=5, message="the run's three events counted")

        # The same run through the CLI, which runs the same view.
        from jobs.admin.workflows import cli

        shown = CliRunner().invoke(cli, ["show", run.id, "--json"])
        assert shown.exit_code == 0, shown.output
        document = json.loads(shown.output)
        assert (document["state"], document["result"]) == ("succeeded", 36)
        assert [step["state"] for step in document["steps"]] == ["succeeded"] * 5
        svg = tmp_path / "run.svg"
        shown = CliRunner().invoke(cli, ["show", run.id, "--svg", str(svg)])
        assert shown.exit_code == 0, shown.output
        assert f"workflow {run.id} observe-{run_id}: succeeded, 5 steps" in shown.output
        assert shown.output.count("succeeded") >= 6
        drawn = ElementTree.parse(svg).getroot()
        assert [g.get("data-state") for g in drawn.iter("{http://www.w3.org/2000/svg}g")
                if g.get("class") == "step"] == ["succeeded"] * 5
        listed = CliRunner().invoke(cli, ["list", "--state", "succeeded", "--json"])
        assert listed.exit_code == 0, listed.output
        assert run.id in [row["id"] for row in json.loads(listed.output)]
        refused = CliRunner().invoke(cli, ["list", "--state", "done"])
        assert refused.exit_code == 2 and "unknown state 'done'" in refused.output

    @pytest.mark.timeout(60)
    def test_actions_refuse_unknown_runs_and_bad_steps_in_one_line(
        self, app: Any, flower: Any, stores: Any, engine: Any,
    ) -> None:
        """With the page's XSRF token: an unknown run is 404, a step that is no number 400,
        a replay without a step 400; an unknown run's page is 404; without the token 403.
        A running run's page reloads itself (not with ?refresh=0); Cancel stops it, and
        its page then stays still."""
        import requests
        from celery import chain

        from resilience.workflows import describe, durable
        from tests.jobs.observe.tasks_workflows import workflow_add

        run_id = uuid.uuid4().hex[:8]
        with engine.begin() as connection:  # no relay runs here: it stays running
            running = durable(chain(workflow_add.s(1, 2, run_id), workflow_add.s(5, run_id)),
                              name=f"observe-{run_id}").apply_async_in(connection)
        page = f"{flower.url}/resilience/workflows/{running.id}"

        unknown = uuid.uuid4().hex
        actions = f"{flower.url}/resilience/actions"
        with requests.Session() as session:
            assert session.get(f"{flower.url}/resilience/workflows/{unknown}",
                               timeout=30).status_code == 404
            refused = session.post(f"{actions}/workflow-retry", data={"id": unknown},
                                   timeout=30, allow_redirects=False)
            assert refused.status_code == 403
            session.get(f"{flower.url}/resilience?refresh=0", timeout=30)
            token = {"X-XSRFToken": session.cookies["_xsrf"], "Accept": "application/json"}
            answers = {
                "workflow-retry": ({"id": unknown}, 404, unknown),
                "workflow-cancel": ({"id": unknown}, 404, unknown),
                "workflow-replay": ({"id": unknown}, 400, "give the step to replay from"),
            }
            answers_bad_step = ({"id": unknown, "from_step": "two"}, 400, "got 'two'")
            for action, (form, status, text) in [*answers.items(),
                                                  ("workflow-retry", answers_bad_step)]:
                answer = session.post(f"{actions}/{action}", data=form, headers=token,
                                      timeout=30)
                assert answer.status_code == status, (action, answer.text)
                assert text in answer.json()["message"], (action, answer.text)

            assert 'id="detail-refresh"' in session.get(page, timeout=30).text
            assert 'id="detail-refresh"' not in session.get(f"{page}?refresh=0", timeout=30).text
            answer = session.post(f"{actions}/workflow-cancel", data={"id": running.id},
                                  headers=token, timeout=30)
            assert answer.status_code == 200, answer.text
            assert answer.json()["message"] == (
                f"workflow {running.id} cancelled: no step of it starts any more")
            assert [step.state.value for step in describe(stores, running.id).steps] == [
                "queued", "skipped"]
            assert 'id="detail-refresh"' not in session.get(page, timeout=30).text
