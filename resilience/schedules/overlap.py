"""The overlap decision: per fire, from the previous run's state, send or not.

`decide(entry, previous)` is called by `ScheduleStore.fire` inside the fire's transaction
for each slot about to fire, with the entry's newest run that was sent (None if it never
was; after a fire in the same transaction, that fire, still `sent`; for QUEUE_ONE, a queued
run counts too). It returns an `OverlapDecision`: send the job now (optionally cancelling
the previous job first), or record the slot without sending it (`skipped_overlap`,
`queued`). When the previous run has finished, every policy sends.

    previous run      allow   skip              queue_one                 cancel_previous
    finished / none   send    send              send                      send
    sent              send    skipped_overlap   queued (fired when the    cancel it (its row:
                                                previous ends)            cancelled), send
    queued            -       -                 skipped_overlap           -

History is the cheap filter, not the guarantee: a run whose end was never recorded (its
outcome write failed, a hard time limit killed it) would hold the entry back for ever. So
a `sent` run fired more than `trust_seconds` (an hour by default;
`resilience_schedule_overlap_trust_seconds`) ago no longer holds the next slot back, and the
job side decides: SKIP and QUEUE_ONE jobs carry the header `resilience_schedule_singleton`
("skip:<name>" / "defer:<name>"), and `ScheduleSingletonGuard` (singleton.py) holds the
PostgreSQL advisory lock `schedule:<name>` while the job runs, so two runs of the entry never
run at once even when the history is stale: a second one ends SKIPPED (its run row:
skipped_overlap) or, for QUEUE_ONE, is deferred until the first lets go.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any, Protocol

from resilience.errors import ConfigurationError
from resilience.schedules.policies import Overlap, RunOutcome


class ScheduleRow(Protocol):
    """What the decision reads of a schedule (`store.ScheduleRow`; the store imports
    this module, so the row's class is not imported here)."""

    name: str
    overlap: Overlap


class RunRow(Protocol):
    """What the decision reads of a run row (`store.RunRow`)."""

    id: int
    task_id: str | None
    outcome: RunOutcome
    fired_at: dt.datetime | None

#: The header of a job whose runs must never overlap: "<policy>:<schedule name>", policy
#: "skip" (Overlap.SKIP) or "defer" (Overlap.QUEUE_ONE); see `ScheduleSingletonGuard`.
SCHEDULE_SINGLETON_HEADER = "resilience_schedule_singleton"
#: The name of the job-side guard (`singleton.ScheduleSingletonGuard`) in outcomes.
SINGLETON_GUARD = "schedule-singleton"
#: The namespace of the lock key: `schedule:<name>`.
LOCK_NAMESPACE = "schedule"
#: A `sent` run older than this (s) no longer holds the next slot back (see the module doc).
TRUST_SECONDS = 3600.0

_SINGLETON_POLICIES = {Overlap.SKIP: "skip", Overlap.QUEUE_ONE: "defer"}


@dataclass(frozen=True)
class OverlapDecision:
    """What to do with one due slot.

    Args:
        send: write the job to the outbox now.
        outcome: the run row's outcome when not sent (SKIPPED_OVERLAP, QUEUED).
        cancel: the task id of the previous job, cancelled (and its run row recorded
            cancelled) before this fire commits (CANCEL_PREVIOUS).
        detail: added to the run row's detail.
    """

    send: bool = True
    outcome: RunOutcome = RunOutcome.SENT
    cancel: str | None = None
    detail: dict[str, Any] = field(default_factory=dict)


SEND = OverlapDecision()


def decide(entry: ScheduleRow, previous: RunRow | None, *,
           trust_seconds: float = TRUST_SECONDS,
           now: dt.datetime | None = None) -> OverlapDecision:
    """The decision for one fire of `entry`, given its previous sent (or queued) run.

    Args:
        trust_seconds: a `sent` run fired longer ago than this is taken as finished.
        now: the present (aware); the clock when None.
    """
    if entry.overlap is Overlap.ALLOW or previous is None or previous.outcome.finished:
        return SEND
    if previous.outcome is RunOutcome.QUEUED:
        # Only QUEUE_ONE reads queued runs: the one place is taken.
        return OverlapDecision(send=False, outcome=RunOutcome.SKIPPED_OVERLAP,
                               detail={"queued_run": previous.id})
    if _stale(previous, trust_seconds, now):
        return OverlapDecision(detail={"stale_run": previous.id})
    if entry.overlap is Overlap.SKIP:
        return OverlapDecision(send=False, outcome=RunOutcome.SKIPPED_OVERLAP,
                               detail={"running_run": previous.id})
    if entry.overlap is Overlap.QUEUE_ONE:
        return OverlapDecision(send=False, outcome=RunOutcome.QUEUED,
                               detail={"behind_run": previous.id})
    return OverlapDecision(cancel=previous.task_id or None,
                           detail={"cancelled_run": previous.id})


def trust_seconds_of(conf: Any) -> float:
    """`resilience_schedule_overlap_trust_seconds` of an app's conf (TRUST_SECONDS when
    unset).

    Raises:
        ConfigurationError: not a number > 0.
    """
    value = conf.get("resilience_schedule_overlap_trust_seconds")
    if value is None:
        return TRUST_SECONDS
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        seconds = float("nan")
    if isinstance(value, bool) or not seconds > 0:
        raise ConfigurationError("resilience_schedule_overlap_trust_seconds must be a number "
                                 f"of seconds > 0, got {value!r}")
    return seconds


def releases_queued(behind: RunRow | None, *, trust_seconds: float = TRUST_SECONDS,
                    now: dt.datetime | None = None) -> bool:
    """True when a queued run waiting behind `behind` (the newest sent run) may fire."""
    return (behind is None or behind.outcome.finished
            or _stale(behind, trust_seconds, now))


def _stale(run: RunRow, trust_seconds: float, now: dt.datetime | None) -> bool:
    if run.fired_at is None:  # fired in this very transaction
        return False
    present = now or dt.datetime.now(dt.UTC)
    return (present - run.fired_at).total_seconds() > trust_seconds


def singleton_header(entry: ScheduleRow) -> str | None:
    """The value of `SCHEDULE_SINGLETON_HEADER` for `entry`'s jobs; None for ALLOW and
    CANCEL_PREVIOUS (a new run must start while the cancelled one winds down)."""
    policy = _SINGLETON_POLICIES.get(entry.overlap)
    return None if policy is None else f"{policy}:{entry.name}"


def parse_singleton_header(value: Any) -> tuple[str, str] | None:
    """(policy, schedule name) of a `SCHEDULE_SINGLETON_HEADER` value; None when absent or
    not one (a foreign or damaged header takes no lock)."""
    if not isinstance(value, str):
        return None
    policy, _, name = value.partition(":")
    if policy not in ("skip", "defer") or not name:
        return None
    return policy, name
