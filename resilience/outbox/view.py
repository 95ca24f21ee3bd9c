"""The outbox's view: rows pending (due, scheduled), the relay's lag, the publish rate."""

from __future__ import annotations

from typing import Any

from resilience.outbox import describe
from resilience.views import Column, Family, Source, View, marked


def read(source: Source) -> dict[str, Any]:
    """The outbox's backlog and lag (`resilience.outbox.describe`: one statement)."""
    return describe(source.stores).as_dict()


VIEW = View(
    name="outbox", title="outbox", store="database", read=read, rows=lambda section: [section],
    columns=(
        Column(header="pending", justify="right"),
        Column(header="due", justify="right"),
        Column(header="scheduled", justify="right"),
        Column(header="lag", justify="right", text=lambda row: marked(
            f"{row['lag_seconds']:.1f}s", "bold red", row["lag_seconds"] >= 60)),
        Column(header="published/min", key="published_last_minute", justify="right"),
        Column(header="dead-lettered", key="dead_lettered", justify="right"),
    ),
    metrics=(
        Family(name="jobs_outbox_pending",
               help="Outbox rows not yet published, by due now / scheduled later",
               labels=("when",),
               samples=lambda section, _: (([when], section[when])
                                           for when in ("due", "scheduled"))),
        Family(name="jobs_outbox_lag_seconds",
               help="Age of the oldest due outbox row past its due time",
               samples=lambda section, _: [([], section["lag_seconds"])]),
    ),
)
