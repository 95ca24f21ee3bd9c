"""The pause switches' view: the declared switches that are on, why, and since when."""

from __future__ import annotations

import datetime as dt
import time

from resilience.pause.backends.redis import RedisPauseBackend
from resilience.pause.guard import PauseSwitch
from resilience.views import Action, Column, Row, Source, View


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


VIEW = View(
    name="paused", title="paused", store="redis", read=read, count=len,
    empty="nothing paused", row_id=lambda r: f"paused-{r['scope']}-{r['name']}",
    alert=lambda _: "PAUSED",
    actions=(
        Action(name="Pause", verb="pause", web="pause", call=PauseSwitch.pause),
        Action(name="Resume", verb="resume", web="resume", call=PauseSwitch.resume,
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
