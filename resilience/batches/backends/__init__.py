"""The batch store's atomic steps (`BatchBackend`) and the values they exchange.

PostgreSQL is the production backend (`backends.postgres`): a batch and its members are
written in the producer's transaction with the members' outbox rows, and a member's final
state in the transaction of its job's own effects when the job has one; both need the
database the outbox and the effects live in. `backends.memory` runs the same state machine
in memory for unit tests (`resilience.testing`), beside the in-memory outbox.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Protocol


class MemberState(str, Enum):
    """The state of one member job; every state but PENDING is final and never left."""

    PENDING = "pending"
    #: The body ran to success here.
    SUCCEEDED = "succeeded"
    #: `@idempotent` replayed it: the same key had already succeeded (counts as success).
    REPLAYED = "replayed"
    FAILED = "failed"
    SHED = "shed"
    SKIPPED = "skipped"
    CANCELLED = "cancelled"
    DEAD_LETTERED = "dead_lettered"

    def __str__(self) -> str:
        return self.value


#: Final states that count as success for `on_success`.
SUCCESS_STATES = frozenset({MemberState.SUCCEEDED, MemberState.REPLAYED})
#: Every final state, in the order tallies are shown.
FINAL_STATES = tuple(state for state in MemberState if state is not MemberState.PENDING)


@dataclass(frozen=True)
class NewMember:
    """A member job written with its batch (its outbox row is written beside it)."""

    task_id: str
    task_name: str


@dataclass(frozen=True)
class NewBatch:
    """A batch to write: callbacks are signatures as JSON dicts (`task`, `args`, `kwargs`,
    `options`), or None."""

    id: str
    description: str | None
    members: list[NewMember]
    on_success: dict[str, Any] | None = None
    on_complete: dict[str, Any] | None = None


@dataclass(frozen=True)
class Recorded:
    """What one `record` did.

    Args:
        recorded: the member left `pending` now (False: it was final already, or no member).
        completed: the batches this record completed (their callbacks are in the outbox).
    """

    recorded: bool
    completed: tuple[str, ...] = ()


@dataclass(frozen=True)
class BatchSummary:
    """A batch as operators and callbacks see it.

    Args:
        tallies: members per state, every state present (zeros included).
        success_task_id / complete_task_id: the callback jobs, once written (None before,
            and for a callback the batch does not have or, for on_success, did not earn).
    """

    id: str
    description: str | None
    total: int
    pending: int
    tallies: dict[str, int]
    created_at: dt.datetime
    completed_at: dt.datetime | None
    on_success: dict[str, Any] | None = None
    on_complete: dict[str, Any] | None = None
    success_task_id: str | None = None
    complete_task_id: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def complete(self) -> bool:
        """Every member has a final state."""
        return self.completed_at is not None

    @property
    def succeeded(self) -> bool:
        """Complete, and every member succeeded (or was replayed)."""
        ok = sum(self.tallies.get(state.value, 0) for state in SUCCESS_STATES)
        return self.complete and ok == self.total

    def as_dict(self) -> dict[str, Any]:
        """JSON-friendly form (`jobs batches show --json`)."""
        return {
            "id": self.id,
            "description": self.description,
            "total": self.total,
            "pending": self.pending,
            "tallies": dict(self.tallies),
            "created_at": self.created_at.isoformat(),
            "completed_at": self.completed_at.isoformat() if self.completed_at else None,
            "succeeded": self.succeeded,
            "callbacks": {
                "success": _callback(self.on_success, self.success_task_id),
                "complete": _callback(self.on_complete, self.complete_task_id),
            },
            **self.extra,
        }


def _callback(signature: dict[str, Any] | None, task_id: str | None) -> dict[str, Any] | None:
    if signature is None:
        return None
    return {"task": signature.get("task"), "fired": task_id is not None, "task_id": task_id}


class BatchBackend(Protocol):
    """The few atomic steps batches need."""

    def create(self, connection: Any, batch: NewBatch) -> None:
        """Write the batch and its members in the caller's transaction (`connection`: a
        SQLAlchemy Session or Connection); an empty batch completes at once."""

    def record(self, connection: Any, *, task_id: str, state: MemberState,
               batch_id: str | None = None) -> Recorded:
        """Give a pending member its final state (once: `recorded` is False when it had one
        already or is no member); the transaction that records a batch's last member also completes
        it and writes its callbacks to the outbox. `connection`: the job's own transaction,
        or None for a short one of its own."""

    def joins(self, session: Any) -> bool:
        """Can `record` write through `session` (a transaction on this store's database)?"""

    def summary(self, batch_id: str) -> BatchSummary:
        """One batch with its tallies. Raises `BatchNotFound`."""

    def recent(self, *, limit: int, incomplete_only: bool = False) -> list[BatchSummary]:
        """The newest batches, newest first."""
