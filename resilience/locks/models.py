"""Tables of the locks package: held-lock registry, fencing high-water marks, token sequence."""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Column,
    DateTime,
    Float,
    Integer,
    Sequence,
    String,
    Table,
    Text,
    func,
)

from resilience.schema import metadata

#: Fencing tokens (resilience.locks.fencing): strictly increasing, durable.
fencing_token_sequence = Sequence("resilience_fencing_token_seq", metadata=metadata)

#: The newest token seen per protected key; a write with an older token is stale.
fencing_marks = Table(
    "resilience_fencing_marks",
    metadata,
    Column("key", Text, primary_key=True),
    Column("token", BigInteger, nullable=False),
    Column("updated_at", DateTime(timezone=True), server_default=func.now(), nullable=False),
)

#: Locks held right now, for `jobs locks list` and the holder named by a refusal;
#: informational (resilience.locks.registry checks each row against the real lock).
held_locks = Table(
    "resilience_held_locks",
    metadata,
    Column("key", Text, primary_key=True),
    Column("kind", String(16), nullable=False),
    Column("owner", Text, nullable=False),
    Column("task_id", Text),
    Column("task_name", Text),
    Column("hostname", Text),
    Column("pid", Integer),
    Column("token", BigInteger),
    Column("advisory_id", BigInteger),
    Column("ttl_seconds", Float),
    Column("acquired_at", DateTime(timezone=True), server_default=func.now(), nullable=False),
    prefixes=["UNLOGGED"],
)
