"""The schedules' views: every schedule with its last run and next fire; one schedule's last
runs and next five fires; and the operator's actions on them.

`jobs schedules add/edit/pause/resume/remove/run-now` and the /resilience page's forms and
row buttons run the same functions below (an `Action` each), which call the library's
(`resilience.schedules.api`): same checks, same one-line answers.
"""

from __future__ import annotations

import json
import math
import re
from datetime import UTC, datetime
from typing import Any
from zoneinfo import ZoneInfo

from resilience.schedules.api import (
    ScheduleSummary,
    add,
    describe,
    edit,
    listing,
    pause,
    remove,
    resume,
    run_now,
)
from resilience.schedules.cron import Cron
from resilience.schedules.errors import ScheduleNotFound
from resilience.schedules.policies import CatchUp, Overlap
from resilience.schedules.store import schedule_store
from resilience.schedules.timing import Interval, slot_count
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
    marked,
)

#: Run outcomes that need an operator's eye (the row's badge on the page).
ATTENTION = ("failed", "dead_lettered")
#: Slots counted since an entry's last success at most (its gauge reads "this many or more").
SLOTS_COUNTED = 100
#: A select's first choice on the edit form: leave the field as it is.
UNCHANGED = "unchanged"
#: How the page answers an action on a name no schedule has.
STATUSES: dict[type[Exception], int] = {ScheduleNotFound: 404}

#: `30`, `30s`, `1.5m`, `2h`: an interval's period.
_PERIOD = re.compile(r"(\d+(?:\.\d*)?|\.\d+)\s*(s|m|h)?")
_UNIT_SECONDS = {None: 1.0, "s": 1.0, "m": 60.0, "h": 3600.0}


def schedule_row(summary: ScheduleSummary) -> Row:
    """A schedule as a JSON-able row: its fields, its newest run and its next fire."""
    row = summary.as_dict()
    row["last_run"] = row["last_runs"][0] if row["last_runs"] else None
    row["next_fire"] = row["next_fires"][0] if row["next_fires"] else None
    return row


def read(source: Source) -> list[Row]:
    """Every schedule by name, each with its newest run, its next fire and what its metrics
    export (`listing` and one GROUP BY over the run rows)."""
    totals = schedule_store(source.stores).run_totals()
    now = datetime.now(UTC)
    rows = []
    for summary in listing(source.stores):
        row = schedule_row(summary)
        total = totals.get(summary.name)
        row["missed_total"] = total.missed if total else 0
        row["skipped_total"] = total.skipped if total else 0
        last = summary.last_runs[0] if summary.last_runs else None
        row["lateness_seconds"] = last.late_seconds if last else None
        since = total and (total.last_success or total.first_slot)
        row["slots_since_success"] = (
            None if summary.paused or not since
            else slot_count(summary.every, since, now, SLOTS_COUNTED))
        rows.append(row)
    return rows


def detail(source: Source, name: str) -> Row:
    """One schedule with its last ten runs and its next five fires (`describe`).

    Raises:
        ScheduleNotFound: no schedule has this name.
    """
    return schedule_row(describe(source.stores, name))


def status(row: Row) -> str:
    """One line: `schedule NAME: TASK every 2s (paused), catch-up once, overlap skip`."""
    state = " (paused)" if row["paused"] else ""
    window = (f" within {row['catch_up_window_seconds']:g}s" if row["catch_up"] == "all"
              else "")
    return (f"schedule {row['name']}: {row['task']} {row['schedule']}{state}, catch-up "
            f"{row['catch_up']}{window}, overlap {row['overlap']}, from {row['source']}")


# -- parsing an operator's input (the CLI's options, the page's fields) ---------------------
def parse_every(text: str, timezone: str = "") -> Interval | Cron:
    """An operator's timing: seconds (`30`, `30s`, `5m`, `1h`) or a five-field cron
    expression, read in `timezone` (UTC when empty).

    Raises:
        ActionRefused: neither (a period with a time zone, a one-word non-period).
        InvalidSchedule: a cron expression or time zone that does not hold.
    """
    text = text.strip()
    period = _PERIOD.fullmatch(text)
    if period is not None:
        if timezone:
            raise ActionRefused("a time zone goes with a cron expression, not with a period "
                                f"({text!r})")
        seconds = float(period.group(1)) * _UNIT_SECONDS[period.group(2)]
        if not math.isfinite(seconds):
            raise ActionRefused(f"a period is a number of seconds, got {text!r}")
        return Interval(seconds)
    if len(text.split()) == 1:
        raise ActionRefused("every is a period (30, 30s, 5m, 1h) or a five-field cron "
                            f"expression ('*/5 * * * *'), got {text!r}")
    return Cron(text, timezone=timezone or "UTC")


def _json(form: Submitted, name: str, kind: type) -> Any:
    """A JSON field of the form (None when empty); refused unless it holds a `kind`."""
    text = form.get(name, "").strip()
    if not text:
        return None
    try:
        value = json.loads(text)
    except ValueError:
        raise ActionRefused(f"{name} is JSON ({'a list' if kind is list else 'an object'}), "
                            f"got {text!r}") from None
    if not isinstance(value, kind):
        raise ActionRefused(f"{name} is {'a JSON list' if kind is list else 'a JSON object'}, "
                            f"got {text!r}")
    return value


def _window(form: Submitted) -> float | None:
    text = form.get("catch_up_window", "").strip()
    if not text:
        return None
    period = _PERIOD.fullmatch(text)
    if period is None:
        raise ActionRefused(f"a catch-up window is seconds (3600, 90m, 1h), got {text!r}")
    return float(period.group(1)) * _UNIT_SECONDS[period.group(2)]


def _policy(form: Submitted, name: str) -> str | None:
    value = form.get(name, "").strip()
    return None if value in ("", UNCHANGED) else value


def _name(form: Submitted) -> str:
    name = form.get("name", "").strip()
    if not name:
        raise ActionRefused("give a schedule name")
    return name


def _next(summary: ScheduleSummary) -> str:
    if summary.paused:
        return "paused"
    return (f"next fire {summary.next_fires[0].isoformat(timespec='seconds')}"
            if summary.next_fires else "no next fire")


def _changes(source: Source, name: str, form: Submitted) -> dict[str, Any]:
    """The edit a form asks for: only its non-empty fields."""
    changes: dict[str, Any] = {}
    every, timezone = form.get("every", "").strip(), form.get("timezone", "").strip()
    if every:
        changes["every"] = parse_every(every, timezone)
    elif timezone:
        current = describe(source.stores, name).every
        if not isinstance(current, Cron):
            raise ActionRefused(f"schedule {name!r} runs {current.describe()}: a time zone "
                                "goes with a cron expression")
        changes["every"] = Cron(current.expression, timezone=timezone)
    if form.get("task", "").strip():
        changes["task"] = form["task"].strip()
    for field, kind in (("args", list), ("kwargs", dict), ("options", dict)):
        value = _json(form, field, kind)
        if value is not None:
            changes[field] = value
    for field in ("catch_up", "overlap"):
        value = _policy(form, field)
        if value is not None:
            changes[field] = value
    window = _window(form)
    if window is not None:
        changes["catch_up_window_seconds"] = window
    return changes


# -- operator actions: what the page's forms and `jobs schedules ...` run -----------------
def add_schedule(source: Source, form: Submitted) -> str:
    """`jobs schedules add NAME --task T --every E ...`."""
    name, task, every = _name(form), form.get("task", "").strip(), form.get("every", "").strip()
    if not task or not every:
        raise ActionRefused("give the schedule's task and every (a period or a cron expression)")
    window = _window(form)
    summary = add(
        source.stores, name, task=task, every=parse_every(every, form.get("timezone", "").strip()),
        args=_json(form, "args", list) or [], kwargs=_json(form, "kwargs", dict) or {},
        options=_json(form, "options", dict) or {},
        catch_up=_policy(form, "catch_up") or CatchUp.SKIP,
        catch_up_window_seconds=3600.0 if window is None else window,
        overlap=_policy(form, "overlap") or Overlap.ALLOW,
        paused=form.get("paused", "") in ("1", "true", "on", "yes"))
    return f"schedule {summary.name!r} added: {summary.task} {summary.schedule}; {_next(summary)}"


def edit_schedule(source: Source, form: Submitted) -> str:
    """`jobs schedules edit NAME [--every E] [--timezone TZ] [--catch-up P] ...`."""
    name = _name(form)
    changes = _changes(source, name, form)
    if not changes:
        raise ActionRefused(f"nothing to change in schedule {name!r}: give a new every, time "
                            "zone, task, arguments, options or policy")
    summary = edit(source.stores, name, **changes)
    return (f"schedule {name!r} edited ({', '.join(sorted(changes))}): {summary.schedule}, "
            f"catch-up {summary.catch_up.value}, overlap {summary.overlap.value}; "
            f"{_next(summary)}")


def pause_schedule(source: Source, form: Submitted) -> str:
    """`jobs schedules pause NAME`."""
    summary = pause(source.stores, _name(form))
    return (f"schedule {summary.name!r} paused: no fire from the beat's next tick; slots "
            f"missed meanwhile go to its catch-up policy ({summary.catch_up.value}) on resume")


def resume_schedule(source: Source, form: Submitted) -> str:
    """`jobs schedules resume NAME`."""
    summary = resume(source.stores, _name(form))
    return f"schedule {summary.name!r} resumed: {_next(summary)}"


def remove_schedule(source: Source, form: Submitted) -> str:
    """`jobs schedules remove NAME`."""
    name = _name(form)
    remove(source.stores, name)
    return f"schedule {name!r} removed, with its run history"


def run_schedule_now(source: Source, form: Submitted) -> str:
    """`jobs schedules run-now NAME`: one fire now, outside its slots."""
    name = _name(form)
    task_id = run_now(source.stores, name, app=source.app)
    return f"schedule {name!r} fired now as task {task_id}"


_NAME = Input(name="name", hint="schedule name", required=True, width=6)
_POLICIES = (
    Input(name="catch_up", hint="catch-up: skip, once, all", choices=(UNCHANGED, *CatchUp),
          width=4),
    Input(name="overlap", hint="overlap: allow, skip, queue_one...",
          choices=(UNCHANGED, *Overlap), width=4),
    Input(name="catch_up_window", hint="catch-up window s", numeric=True, width=4),
)

ADD = Action(
    name="Add", web="schedule-add", run=add_schedule, forms=(Form(
        id="schedule-add-form", title="Schedules", button="Add schedule", inputs=(
            _NAME, Input(name="task", hint="task", suggest="tasks", required=True, width=6),
            Input(name="every", hint="30s, 5m or */5 * * * *", required=True, width=6),
            Input(name="timezone", hint="time zone (cron: UTC)", width=6),
            Input(name="catch_up", choices=tuple(CatchUp), width=4),
            Input(name="overlap", choices=tuple(Overlap), width=4),
            Input(name="catch_up_window", hint="catch-up window s", numeric=True, width=4),
            Input(name="args", hint="args JSON: [1, 2]", width=6),
            Input(name="kwargs", hint='kwargs JSON: {"a": 1}', width=6))),))
EDIT = Action(
    name="Edit", web="schedule-edit", run=edit_schedule, statuses=STATUSES, forms=(Form(
        id="schedule-edit-form", button="Edit schedule", inputs=(
            _NAME, Input(name="every", hint="new every (unchanged)", width=6),
            Input(name="timezone", hint="new time zone", width=6), *_POLICIES)),))
PAUSE = Action(
    name="Pause", web="schedule-pause", run=pause_schedule, statuses=STATUSES,
    fields=lambda r: {"name": r["name"]}, applies=lambda r: not r["paused"],
    style="warning", forms=(Form(id="schedule-name-form", button="Pause",
                                 inputs=(Input(name="name", hint="schedule name",
                                               required=True, width=5),)),))
RESUME = Action(
    name="Resume", web="schedule-resume", run=resume_schedule, statuses=STATUSES,
    fields=lambda r: {"name": r["name"]}, applies=lambda r: r["paused"], style="success",
    joins="schedule-name-form")
RUN_NOW = Action(
    name="Run now", web="schedule-run-now", run=run_schedule_now, statuses=STATUSES,
    fields=lambda r: {"name": r["name"]}, style="secondary", joins="schedule-name-form")
REMOVE = Action(
    name="Remove", web="schedule-remove", run=remove_schedule, statuses=STATUSES,
    style="danger", joins="schedule-name-form")


# -- tables ----------------------------------------------------------------------------------
def _when(text: str | None) -> str:
    """An ISO time as `2026-01-02 03:04:05` ('' for none)."""
    return text[:19].replace("T", " ") if text else ""


def _last_run(row: Row) -> str:
    run = row["last_run"]
    if run is None:
        return ""
    return f"{_when(run['slot'])} {marked(run['outcome'], 'bold red', run['outcome'] in ATTENTION)}"


def _policies(row: Row) -> str:
    window = f" {row['catch_up_window_seconds']:g}s" if row["catch_up"] == "all" else ""
    return f"catch-up {row['catch_up']}{window}, overlap {row['overlap']}"


COLUMNS = (
    Column(header="schedule", key="name", no_wrap=True),
    Column(header="task", key="task"),
    Column(header="every", key="schedule"),
    Column(header="policies", text=_policies),
    Column(header="state", text=lambda r: marked("paused", "yellow", True) if r["paused"]
           else "active"),
    Column(header="source", key="source"),
    Column(header="last run", text=_last_run, no_wrap=True),
    Column(header="next fire", text=lambda r: "" if r["paused"] else _when(r["next_fire"]),
           no_wrap=True),
)


def _run_row(run: Row) -> Row:
    late = run["late_seconds"]
    return {**run, "slot_text": _when(run["slot"]), "fired": _when(run["fired_at"]),
            "finished": _when(run["finished_at"]),
            "late": "" if late is None else f"{late:.3f}s",
            "detail_text": json.dumps(run["detail"], default=str) if run["detail"] else ""}


RUNS = View(
    name="runs", title="last runs", store="database", read=lambda _: [],
    rows=lambda row: [_run_row(run) for run in row["last_runs"]],
    row_id=lambda r: f"schedule-run-{r['id']}", row_data=lambda r: {"outcome": r["outcome"]},
    alert=lambda r: r["outcome"] if r["outcome"] in ATTENTION else None,
    empty="no runs yet",
    columns=(
        Column(header="slot", key="slot_text", no_wrap=True),
        Column(header="outcome", text=lambda r: marked(r["outcome"], "bold red",
                                                       r["outcome"] in ATTENTION)),
        Column(header="sent", key="fired", no_wrap=True),
        Column(header="late", key="late", justify="right"),
        Column(header="finished", key="finished", no_wrap=True),
        Column(header="task id", text=lambda r: r["task_id"] or "", no_wrap=True),
        Column(header="detail", key="detail_text"),
    ),
)


def _fire_rows(row: Row) -> list[Row]:
    """The next fires in UTC and, for a cron entry, in its time zone."""
    zone = row.get("timezone") or "UTC"
    rows = []
    for index, moment in enumerate(row["next_fires"], start=1):
        fire = {"n": index, "utc": _when(moment), "local": ""}
        if row.get("kind") == "cron" and zone != "UTC":
            shown = datetime.fromisoformat(moment).astimezone(ZoneInfo(zone))
            fire["local"] = shown.strftime("%Y-%m-%d %H:%M:%S %Z")
        rows.append(fire)
    return rows


FIRES = View(
    name="next_fires", title="next fires", store="database", read=lambda _: [],
    rows=_fire_rows, row_id=lambda r: f"schedule-fire-{r['n']}",
    empty="none (paused entries keep their slots: they go to the catch-up policy)",
    columns=(Column(header="#", key="n", justify="right"),
             Column(header="UTC", key="utc", no_wrap=True),
             Column(header="local", key="local", no_wrap=True)),
)

VIEW = View(
    name="schedules", title="schedules", store="database", read=read, count=len,
    empty="no schedules", row_id=lambda r: f"schedule-{r['name']}",
    row_data=lambda r: {"paused": "true" if r["paused"] else "false",
                        "every": r["schedule"], "catch-up": r["catch_up"],
                        "overlap": r["overlap"],
                        "last-outcome": r["last_run"]["outcome"] if r["last_run"] else ""},
    alert=lambda r: (r["last_run"]["outcome"].upper()
                     if r["last_run"] and r["last_run"]["outcome"] in ATTENTION else None),
    columns=COLUMNS,
    metrics=(
        Family(name="resilience_schedule_missed", kind="counter", labels=("schedule",),
               help="Slots of the schedule that fell while no beat led or it was paused and "
                    "that its catch-up policy did not fire",
               samples=lambda rows, _: (([r["name"]], r["missed_total"]) for r in rows)),
        Family(name="resilience_schedule_skipped", kind="counter", labels=("schedule",),
               help="Slots of the schedule not sent because its previous run had not "
                    "finished (overlap skip)",
               samples=lambda rows, _: (([r["name"]], r["skipped_total"]) for r in rows)),
        Family(name="resilience_schedule_lateness_seconds", labels=("schedule",),
               help="How late the schedule's newest run was sent after its slot",
               samples=lambda rows, _: (([r["name"]], r["lateness_seconds"]) for r in rows
                                        if r["lateness_seconds"] is not None)),
        Family(name="resilience_schedule_slots_since_success", labels=("schedule",),
               help=f"Slots of the schedule since its newest succeeded run (or its first "
                    f"run), at most {SLOTS_COUNTED}; absent while paused",
               samples=lambda rows, _: (([r["name"]], r["slots_since_success"]) for r in rows
                                        if r["slots_since_success"] is not None)),
        Family(name="resilience_schedule_paused", labels=("schedule",),
               help="1 while the schedule is paused",
               samples=lambda rows, _: (([r["name"]], 1.0 if r["paused"] else 0.0)
                                        for r in rows)),
    ),
    actions=(ADD, EDIT, PAUSE, RESUME, RUN_NOW, REMOVE),
    detail=Detail(
        key=lambda r: r["name"], read=detail, heading=status, tables=(RUNS, FIRES),
        actions=(EDIT, PAUSE, RESUME, RUN_NOW), fields=lambda r: {"name": r["name"]},
        statuses=STATUSES),
)
