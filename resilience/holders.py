"""Who holds a guard's key: the one holder type every guard reports.

Locks, singletons, idempotency claims and concurrency leases each have someone holding a
key for a while. Their stores record that differently (a `pg_locks` row, a Redis hash, a
row's lease columns), but an operator asks the same questions of all of them: which key,
held by whom, since when, with which fencing token, and is the holder still alive. Each
guard package's `describe()` and admin listing answer with `Holder`.

What a call itself keeps while it holds something is a different role, named by the guard
(`Claim` in idempotency, `Hold` in locks); only the report is shared.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True, kw_only=True)
class Holder:
    """One holder of one key, as its store reports it.

    Args:
        kind: the guard kind ("singleton", "exclusive", "idempotency", "concurrency", ...).
        key: the guard's key as the user wrote it (decoded, never a store's raw key).
        owner: the holder's task id, or the store's own label when no task id is known.
        token: the fencing token (or claim attempt), when the guard has one.
        held_seconds: how long it has been held, when the store knows.
        alive: False when the store still shows the hold but its lease has lapsed.
    """

    kind: str
    key: str
    owner: str | None
    token: int | None = None
    held_seconds: float | None = None
    alive: bool = True

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready fields (admin pages, `jobs ... --json`)."""
        return asdict(self)
