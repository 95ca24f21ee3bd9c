"""The pause switches' view: the declared switches that are on, why, and since when."""

from __future__ import annotations

import datetime as dt
import time
from typing import TYPE_CHECKING

from resilience.pause.backends.redis import RedisPauseBackend
from resilience.pause.guard import PauseSwitch
from resilience.views import PAGE_REASON, Action, ActionRefused, Column, Form, Input, View

if TYPE_CHECKING:
    from resilience.views import Row, Source, Submitted


def declared_switches(source: Source) -> list[tuple[str, str]]:
    """The switches a job of the app can hit: one per tier, one per registered task."""
    tasks = [name for name, task in source.app.tasks.items()
             if not name.startswith("celery.") and hasattr(task, "pipelines")]
    return [("tier", tier) for tier in source.tiers] + [("task", name) for name in sorted(tasks)]


def read(source: Source, *, include_stored: bool = False) -> list[Row]:
    """Declared switches that are on (one MGET); with `include_stored` every switch that is
    on, declared or not (one SCAN: `jobs paused`)."""
    now = time.time()
    backend = RedisPauseBackend(source.stores.redis)
    switches = sorted(backend.all_paused() if include_stored
                      else backend.paused(declared_switches(source)),
                      key=lambda switch: (switch.scope, switch.name))
    return [
        {"scope": switch.scope, "name": switch.name, "reason": switch.reason,
         "since": dt.datetime.fromtimestamp(switch.since_epoch_seconds, dt.UTC)
         .isoformat(timespec="seconds"),
         "paused_seconds": round(max(0.0, now - switch.since_epoch_seconds), 1)}
        for switch in switches
    ]


def target(source: Source, form: Submitted, *, pausing: bool) -> tuple[str, str]:
    """(scope, name) of a pause form, checked as `jobs pause` checks it; an unknown task is
    refused too when pausing (a typo would pause nothing), never when resuming."""
    scope, name = form.get("scope") or "tier", form.get("name", "")
    if scope not in ("tier", "task") or not name:
        raise ActionRefused("name a tier (critical) or a task (scope task, its registered name)")
    if scope == "tier" and name not in source.tiers:
        raise ActionRefused(f"unknown tier {name!r}; tiers are {', '.join(source.tiers)}")
    if scope == "task" and pausing and name not in source.app.tasks:
        raise ActionRefused(f"unknown task {name!r}: no task of that name is registered")
    return scope, name


def switch(source: Source) -> PauseSwitch:
    """The fleet's pause switches, in the app's shared Redis."""
    return PauseSwitch(RedisPauseBackend(source.stores.redis))


def pause(source: Source, form: Submitted) -> str:
    """`jobs pause TIER` / `jobs pause --task NAME`."""
    scope, name = target(source, form, pausing=True)
    switch(source).pause(scope, name, reason=form.get("reason") or PAGE_REASON)
    return f"paused {scope} {name!r}: its jobs wait (within 1 s on every worker)"


def resume(source: Source, form: Submitted) -> str:
    """`jobs resume TIER` / `jobs resume --task NAME`."""
    scope, name = target(source, form, pausing=False)
    was = switch(source).resume(scope, name)
    return f"resumed {scope} {name!r}" if was else f"{scope} {name!r} was not paused"


VIEW = View(
    name="paused", title="paused", store="redis", read=read, count=len,
    empty="nothing paused", row_id=lambda r: f"paused-{r['scope']}-{r['name']}",
    alert=lambda _: "PAUSED",
    actions=(
        Action(name="Pause", web="pause", run=pause, style="warning", forms=(Form(
            id="pause-form", title="Pause / resume", button="Pause", inputs=(
                Input(name="scope", choices=("tier", "task"), width=3),
                Input(name="name", hint="critical, or a task name", suggest="names",
                      required=True, width=5),
                Input(name="reason", hint="reason"))),)),
        Action(name="Resume", web="resume", run=resume, style="success", joins="pause-form",
               fields=lambda r: {"scope": r["scope"], "name": r["name"]}),
    ),
    columns=(
        Column(header="scope", key="scope"),
        Column(header="name", text=lambda r: f"[bold yellow]{r['name']}[/bold yellow]"),
        Column(header="reason", key="reason"),
        Column(header="since", key="since"),
        Column(header="for", text=lambda r: f"{r['paused_seconds']}s"),
    ),
)
