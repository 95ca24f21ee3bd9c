"""The vocabularies of a schedule: catch-up and overlap policies, run outcomes."""

from __future__ import annotations

from enum import StrEnum

from resilience.schedules.errors import InvalidSchedule


class CatchUp(StrEnum):
    """What to do with the slots that fell while no leader ran or the entry was paused.

    - SKIP: fire none of them; each is recorded `missed`.
    - ONCE: fire one (the newest) for all of them; the others are recorded `missed`.
    - ALL: fire each one within `catch_up_window_seconds`, oldest first; older ones are
      recorded `missed`.
    """

    SKIP = "skip"
    ONCE = "once"
    ALL = "all"


class Overlap(StrEnum):
    """What to do when a slot is due and the previous run has not finished.

    - ALLOW: fire anyway.
    - SKIP: do not fire; the slot is recorded `skipped_overlap`.
    - QUEUE_ONE: keep one run queued, fired when the previous one ends.
    - CANCEL_PREVIOUS: cancel the previous job (resilience.cancel), then fire.
    """

    ALLOW = "allow"
    SKIP = "skip"
    QUEUE_ONE = "queue_one"
    CANCEL_PREVIOUS = "cancel_previous"


class RunOutcome(StrEnum):
    """What became of one slot of a schedule (a `resilience_schedule_runs` row).

    - SENT: its job was written to the outbox (and published); not finished yet.
    - SUCCEEDED, FAILED, DEAD_LETTERED, CANCELLED: how the job ended (recorded by the
      run-history guard, `resilience.schedules.guard`); a REPLAYED job counts as succeeded.
    - SHED: its deadline passed before it ran; SKIPPED: a guard skipped it (not overlap).
    - SKIPPED_OVERLAP: not sent, or stopped, because the previous run had not finished.
    - MISSED: it fell while no leader ran or the entry was paused, and the catch-up policy
      did not fire it.
    - QUEUED: waiting for the previous run to end (Overlap.QUEUE_ONE).
    """

    SENT = "sent"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    DEAD_LETTERED = "dead_lettered"
    CANCELLED = "cancelled"
    SHED = "shed"
    SKIPPED = "skipped"
    SKIPPED_OVERLAP = "skipped_overlap"
    MISSED = "missed"
    QUEUED = "queued"

    @property
    def finished(self) -> bool:
        """True when nothing of this run is still to come."""
        return self not in (RunOutcome.SENT, RunOutcome.QUEUED)


def catch_up_policy(value: CatchUp | str) -> CatchUp:
    """`value` as a CatchUp; raises InvalidSchedule naming the valid ones."""
    try:
        return CatchUp(value)
    except ValueError:
        raise InvalidSchedule(f"catch_up must be one of {', '.join(CatchUp)}, "
                              f"got {value!r}") from None


def overlap_policy(value: Overlap | str) -> Overlap:
    """`value` as an Overlap; raises InvalidSchedule naming the valid ones."""
    try:
        return Overlap(value)
    except ValueError:
        raise InvalidSchedule(f"overlap must be one of {', '.join(Overlap)}, "
                              f"got {value!r}") from None
