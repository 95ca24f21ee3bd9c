"""The pause switches' view: the declared switches that are on, why, and since when."""

from __future__ import annotations

import datetime as dt
import time

from resilience.pause.backends.redis import RedisPauseBackend
from resilience.views import Column, Row, Source, View


def declared_switches(source: Source) -> list[tuple[str, str]]:
    """The switches a job of the app can hit: one per tier, one per registered task."""
    tasks = [name for name, task in source.app.tasks.items()
             if not name.startswith("celery.") and hasattr(task, "pipelines")]
    return [("tier", tier) for tier in source.tiers] + [("task", name) for name in sorted(tasks)]


def read(source: Source) -> list[Row]:
    """Declared switches that are on (one MGET), as `jobs paused` lists them."""
    now = time.time()
    switches = sorted(RedisPauseBackend(source.stores.redis).paused(declared_switches(source)),
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
    columns=(
        Column(header="scope", key="scope"),
        Column(header="name", text=lambda r: f"[bold yellow]{r['name']}[/bold yellow]"),
        Column(header="reason", key="reason"),
        Column(header="since", key="since"),
        Column(header="for", text=lambda r: f"{r['paused_seconds']}s"),
    ),
)
