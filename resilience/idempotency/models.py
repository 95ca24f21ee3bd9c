"""The idempotency record table: one row per (task name, key), the durable truth.

State machine of a row:

    (none) --claim--> in_progress --complete--> succeeded
                          |  \\--fail (non-retryable)--> failed
                          |---release (retryable): lease ends now, row stays in_progress
                          '---reaper (lease expired long ago)--> failed

A claim may take over a row when its lease has expired, when it failed (failures are not
cached), or when the whole record has expired; each takeover increments `attempt`, the
fencing number, and writes a fresh `lease_owner` token. Completion, failure and release
match on both, so a holder whose claim was taken over changes nothing.
"""

from __future__ import annotations

from sqlalchemy import (
    CheckConstraint,
    Column,
    DateTime,
    Index,
    Integer,
    String,
    Table,
    Text,
    func,
)
from sqlalchemy.dialects.postgresql import JSONB

from resilience.idempotency.backends import FAILED, IN_PROGRESS, STATES, SUCCEEDED
from resilience.schema import metadata

TABLE_NAME = "resilience_idempotency_records"

__all__ = [
    "FAILED",
    "FILLFACTOR",
    "IN_PROGRESS",
    "STATES",
    "SUCCEEDED",
    "TABLE_NAME",
    "idempotency_records",
]

#: Percent of each heap page inserts fill; the rest keeps a completed row version on the
#: same page as its claim, which a HOT update needs.
FILLFACTOR = 80

idempotency_records = Table(
    TABLE_NAME,
    metadata,
    # Ids, names and keys are TEXT: a length limit here would turn a long value into an
    # error on every attempt (keys are bounded by resilience.keys.MAX_KEY_LENGTH).
    # The natural key is the primary key: every decision finds its row by it, and a
    # surrogate id would cost one more index entry per claim and nothing reads it.
    Column("task_name", Text, primary_key=True, comment="namespace of the key"),
    Column("key", Text, primary_key=True, comment="the idempotency key"),
    Column("fingerprint", String(64), nullable=False, comment="sha256 of the bound arguments"),
    Column("state", String(16), nullable=False),
    Column("result", JSONB, nullable=True, comment="the stored result (succeeded)"),
    Column("error", Text, nullable=True, comment="the recorded error (failed)"),
    Column("attempt", Integer, nullable=False, comment="fencing number, +1 per takeover"),
    Column("lease_owner", Text, nullable=True, comment="token of the current holder"),
    Column("lease_expires_at", DateTime(timezone=True), nullable=True),
    Column("task_id", Text, nullable=True, comment="task id of the holder / producer"),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column(
        "expires_at",
        DateTime(timezone=True),
        nullable=False,
        comment="set by the claim to cover the lease and the TTL; a completion moves it "
        "only when it comes after the lease",
    ),
    CheckConstraint("state IN ('in_progress', 'succeeded', 'failed')", name="state_known"),
    # Completions are HOT updates (no index entry, no new index tuple): the only index
    # besides the primary key is cleanup's, on a column a completion within the lease
    # leaves as it is, and FILLFACTOR leaves each page room for the completed version.
    # No index reads `state` (even a partial index's predicate would make every completion
    # a non-HOT update): the reaper and the open-claims count scan the table (see
    # docs/idempotency.md, "The table").
    Index("ix_resilience_idempotency_records_expires_at", "expires_at"),
    postgresql_with={"fillfactor": FILLFACTOR},
)
