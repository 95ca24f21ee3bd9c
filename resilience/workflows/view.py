"""The workflows' views: the newest runs and their steps per state (`jobs status`, the
`/resilience` page, `jobs workflows list`); one run with its steps and its graph (`jobs
workflows show`, `/resilience/workflows/<id>`); and the operator actions on a run: cancel,
retry (from its failed step or step N), replay from step N."""

from __future__ import annotations

import json
from typing import Any

from resilience.views import (
    Action,
    ActionRefused,
    Column,
    Detail,
    Family,
    Form,
    Input,
    Row,
    Source,
    Submitted,
    View,
    counted,
    marked,
)
from resilience.workflows import (
    StepSummary,
    WorkflowNotFound,
    WorkflowNotRetryable,
    WorkflowSummary,
    cancel,
    describe,
    recent,
    replay,
    retry,
)
from resilience.workflows.metrics import GUARD_NAME
from resilience.workflows.svg import render

#: Newest runs the status views list (`jobs workflows list` shows more).
SHOWN = 10
#: Steps a run's table shows in full (later ones only if they did not succeed).
STEPS_SHOWN = 200
#: Run states an operator should look at (the page marks the row).
ATTENTION = ("failed", "compensating")
#: Run states a replay applies to (over), a retry of the failed step (stopped short), and
#: a cancel (live).
OVER = ("succeeded", "failed", "compensated", "cancelled")
STOPPED = ("failed", "compensated", "cancelled")
LIVE = ("running",)


def _time(value: Any) -> str | None:
    return value.isoformat(timespec="seconds") if value is not None else None


def _state(value: Any) -> str | None:
    return None if value is None else str(getattr(value, "value", value))


def summary_row(summary: WorkflowSummary) -> Row:
    """One run as JSON (a row of the list; `detail` adds its steps)."""
    return {"id": summary.id, "name": summary.name, "state": _state(summary.state),
            "total": summary.total,
            "counts": {state: n for state, n in sorted(summary.counts.items()) if n},
            "failed_step": summary.failed_step, "error": summary.error,
            "replay_of": summary.replay_of, "created_at": _time(summary.created_at),
            "finished_at": _time(summary.finished_at)}


def step_row(step: StepSummary) -> Row:
    """One step as JSON (its result as stored: JSON already)."""
    return {"position": step.position, "task_name": step.task_name,
            "state": _state(step.state), "task_id": step.task_id,
            "depends_on": list(step.depends_on), "result": step.result, "error": step.error,
            "started_at": _time(step.started_at), "finished_at": _time(step.finished_at),
            "compensate": step.compensate,
            "compensation_state": _state(step.compensation_state),
            "compensation_task_id": step.compensation_task_id,
            "compensation_error": step.compensation_error}


def read(source: Source) -> list[Row]:
    """The newest runs, newest first (`resilience.workflows.recent`)."""
    return [summary_row(summary) for summary in recent(source.stores, limit=SHOWN)]


def listed(source: Source, *, limit: int = 50, state: str | None = None) -> list[Row]:
    """The newest runs, at most `limit`, only those in `state` if given."""
    return [summary_row(summary)
            for summary in recent(source.stores, limit=limit, state=state)]


def detail(source: Source, workflow_id: str) -> Row:
    """One run with its steps, its result and its graph's source (`describe`).

    Raises:
        WorkflowNotFound: no run has this id.
    """
    summary = describe(source.stores, workflow_id)
    return {**summary_row(summary), "result": summary.result,
            "steps": [step_row(step) for step in summary.steps]}


def status(run: Row) -> str:
    """One line: `workflow ID name: state, N steps (...)`, the failing step and error."""
    counts = ", ".join(f"{state} {n}" for state, n in run["counts"].items())
    line = (f"workflow {run['id']}{' ' + run['name'] if run['name'] else ''}: {run['state']}, "
            f"{run['total']} steps ({counts})")
    if run["replay_of"]:
        line += f"; replays {run['replay_of']}"
    if run["failed_step"] is not None:
        line += f"; step {run['failed_step']} failed"
    if run["error"]:
        line += f": {run['error']}"
    return line


def graph(run: Row) -> str:
    """The run drawn as its graph: an SVG document (`resilience.workflows.svg`)."""
    title = f"workflow {run['id']}{' ' + run['name'] if run['name'] else ''}: {run['state']}"
    return render(run["steps"], title=title)


# -- operator actions: what the page's forms and `jobs workflows ...` run ----------------
def _id(form: Submitted) -> str:
    workflow_id = form.get("id", "").strip()
    if not workflow_id:
        raise ActionRefused("give a workflow id")
    return workflow_id


def _step(form: Submitted, *, required: bool) -> int | None:
    text = form.get("from_step", "").strip()
    if not text:
        if required:
            raise ActionRefused("give the step to replay from (its position, 0 for the first)")
        return None
    if not text.isdigit():
        raise ActionRefused(f"a step is its position, a number from 0; got {text!r}")
    return int(text)


def cancel_run(source: Source, form: Submitted) -> str:
    """`jobs workflows cancel ID`: running steps cancelled, then the compensations."""
    summary = cancel(source.stores, _id(form), app=source.app)
    return f"workflow {summary.id} {_state(summary.state)}: no step of it starts any more"


def retry_run(source: Source, form: Submitted) -> str:
    """`jobs workflows retry ID [--from-step N]`: the same run, from its failed step or N."""
    step = _step(form, required=False)
    summary = retry(source.stores, _id(form), from_step=step)
    where = f"step {step}" if step is not None else "its failed step"
    return f"workflow {summary.id} retried from {where}: {_state(summary.state)}"


def replay_run(source: Source, form: Submitted) -> str:
    """`jobs workflows replay ID --from-step N`: a new run from step N, the old one kept."""
    old = _id(form)
    step = _step(form, required=True)
    summary = replay(source.stores, old, from_step=step)
    return f"workflow {old} replayed from step {step} as workflow {summary.id}"


#: How the page answers a refused action: an unknown id, a state that does not allow it.
STATUSES: dict[type[Exception], int] = {WorkflowNotFound: 404, WorkflowNotRetryable: 409}
_ID = Input(name="id", hint="workflow id", required=True, width=6)

CANCEL = Action(
    name="Cancel", web="workflow-cancel", run=cancel_run, style="danger", statuses=STATUSES,
    fields=lambda r: {"id": r["id"]}, applies=lambda r: r["state"] in LIVE,
    forms=(Form(id="workflow-cancel-form", button="Cancel workflow",
                inputs=(Input(name="id", hint="workflow id", required=True, width=8),)),))
RETRY = Action(
    name="Retry", web="workflow-retry", run=retry_run, statuses=STATUSES,
    fields=lambda r: {"id": r["id"]}, applies=lambda r: r["state"] in STOPPED,
    forms=(Form(id="workflow-retry-form", title="Workflows", button="Retry", inputs=(
        _ID, Input(name="from_step", hint="from step (default: failed)", numeric=True, width=3))),))
REPLAY = Action(
    name="Replay", web="workflow-replay", run=replay_run, style="secondary",
    statuses=STATUSES, applies=lambda r: r["state"] in OVER,
    forms=(Form(id="workflow-replay-form", button="Replay", inputs=(
        _ID, Input(name="from_step", hint="from step", numeric=True, required=True,
                   width=3))),))


def _state_cell(row: Row) -> str:
    return marked(row["state"], "bold red", row["state"] in ATTENTION)


def _when(text: str | None) -> str:
    return text[:19].replace("T", " ") if text else ""


def _shown_run(run: Row) -> Row:
    """A run with its cells as text: data never goes through a table's markup."""
    done = sum(n for state, n in run["counts"].items() if state in ("succeeded", "replayed"))
    return {**run, "label": run["name"] or "", "done": f"{done}/{run['total']}",
            "others": " ".join(f"{state}={n}" for state, n in run["counts"].items()
                               if state not in ("succeeded", "replayed")),
            "created": _when(run["created_at"]), "finished": _when(run["finished_at"]),
            "reason": run["error"] or ""}


def _outcome(step: Row) -> str:
    if step["error"]:
        return step["error"]
    if step["state"] in ("succeeded", "replayed"):
        text = json.dumps(step["result"], default=str)
        return text if len(text) <= 80 else text[:79] + "…"
    return ""


def _shown_step(step: Row) -> Row:
    compensation = ""
    if step["compensate"]:
        compensation = f"{step['compensate']} ({step['compensation_state'] or 'not run'})"
        if step["compensation_error"]:
            compensation += f": {step['compensation_error']}"
    return {**step, "after": ", ".join(map(str, step["depends_on"])),
            "started": _when(step["started_at"]), "finished": _when(step["finished_at"]),
            "outcome": _outcome(step), "compensation": compensation}


COLUMNS = (
    Column(header="workflow", key="id", no_wrap=True),
    Column(header="name", key="label"),
    Column(header="state", text=_state_cell),
    Column(header="steps done", key="done", justify="right"),
    Column(header="other steps", key="others"),
    Column(header="created", key="created", no_wrap=True),
    Column(header="finished", key="finished", no_wrap=True),
)

def _table_steps(run: Row) -> list[Row]:
    """The steps a table shows: the first `STEPS_SHOWN`, then only those that did not
    succeed (a batch's thousands of members would bury the one that failed)."""
    steps = run["steps"]
    later = [step for step in steps[STEPS_SHOWN:]
             if step["state"] not in ("succeeded", "replayed")][:STEPS_SHOWN]
    return [_shown_step(step) for step in [*steps[:STEPS_SHOWN], *later]]


STEPS = View(
    name="steps", title="steps", store="database", read=lambda _: [],
    rows=_table_steps, count=lambda run: len(run["steps"]),
    row_id=lambda s: f"step-row-{s['position']}", row_data=lambda s: {"state": s["state"]},
    alert=lambda s: s["state"] if s["state"] in ("failed", "dead_lettered") else None,
    columns=(
        Column(header="#", key="position", justify="right"),
        Column(header="task", key="task_name"),
        Column(header="state", key="state"),
        Column(header="after", key="after"),
        Column(header="task id", key="task_id", no_wrap=True),
        Column(header="started", key="started", no_wrap=True),
        Column(header="finished", key="finished", no_wrap=True),
        Column(header="result or error", key="outcome"),
        Column(header="compensation", key="compensation"),
    ),
)

def _events(_: Any, snapshot: dict[str, Any]) -> list[tuple[list[str], float]]:
    """Workflow runs started and ended fleet-wide, by event (every workflow name summed)."""
    totals: dict[str, float] = {}
    for counter in counted(snapshot["counters"], [GUARD_NAME]):
        event = str(counter.get("outcome", "")).lower()
        totals[event] = totals.get(event, 0) + counter["value"]
    return [([event], value) for event, value in sorted(totals.items())]


EVENTS = Family(
    name="jobs_workflows", kind="counter", labels=("event",), needs_section=False,
    help="Workflow runs fleet-wide by event: started, succeeded, failed, compensated, "
         "cancelled",
    samples=_events)

VIEW = View(
    name="workflows", title="workflows", store="database", read=read, count=len,
    empty="no workflows", rows=lambda runs: [_shown_run(run) for run in runs],
    row_id=lambda r: f"workflow-{r['id']}",
    row_data=lambda r: {"state": r["state"]},
    alert=lambda r: r["state"].upper() if r["state"] in ATTENTION else None,
    columns=COLUMNS, metrics=(EVENTS,),
    actions=(RETRY, REPLAY, CANCEL),
    detail=Detail(
        key=lambda r: r["id"], read=detail, heading=status, figure=graph, tables=(STEPS,),
        actions=(RETRY, REPLAY, CANCEL), fields=lambda r: {"id": r["id"]},
        statuses={WorkflowNotFound: 404}, live=lambda r: r["state"] in ("running",
                                                                        "compensating")),
)

#: `jobs workflows list`: the same columns, more rows, the reason of a failure.
LIST = View(
    name="workflows", title="workflows", store="database", read=listed, count=len,
    rows=lambda runs: [_shown_run(run) for run in runs],
    columns=(*COLUMNS, Column(header="error", key="reason")),
)
