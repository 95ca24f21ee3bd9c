"""The held-lock registry: what `jobs locks list` shows and `jobs locks release` undoes.

Guards record each acquisition in `resilience_held_locks` (key, holder task, token) and
delete the row on release. The registry is informational: the truth is the lock itself,
so every row is checked against it (the advisory lock in `pg_locks`, the owner token on
the Redlock nodes) and a row a dead holder left behind is shown as stale.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sqlalchemy import text

from resilience.locks.advisory import advisory_id, lock_parts
from resilience.locks.beat import LEADER_KEY
from resilience.locks.redlock import Redlock

if TYPE_CHECKING:
    from resilience.stores import Stores


@dataclass(frozen=True)
class HeldLock:
    """One lock as the admin sees it."""

    key: str
    kind: str
    holder: str
    age_seconds: float
    token: int | None
    held: bool


_ADVISORY_HOLDERS = """
    SELECT l.classid::bigint, l.objid::bigint, a.application_name,
           extract(epoch FROM now() - a.backend_start), a.pid
    FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
    WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
"""


def list_locks(stores: Stores, redlock_urls: Sequence[str] = ()) -> list[HeldLock]:
    """Every registered lock, checked against the real lock, plus the beat leader."""
    with stores.engine().connect() as connection:
        rows = list(connection.execute(text(
            "SELECT key, kind, owner, task_id, hostname, pid, token, "
            "extract(epoch FROM now() - acquired_at) AS age FROM resilience_held_locks "
            "ORDER BY acquired_at")))
        advisory = {(int(c), int(o)): (name, float(age or 0), pid)
                    for c, o, name, age, pid in connection.execute(text(_ADVISORY_HOLDERS))}
    redlock = Redlock.from_urls(redlock_urls, check=False) if len(redlock_urls) >= 3 else None
    found = []
    for row in rows:
        if row.kind == "singleton":
            held = lock_parts(advisory_id(row.key)) in advisory
        else:
            held = redlock is not None and row.owner in redlock.holders(row.key)
        holder = f"{row.task_id or '-'} ({row.hostname}:{row.pid})"
        found.append(HeldLock(key=row.key, kind=row.kind, holder=holder,
                              age_seconds=float(row.age or 0), token=row.token, held=held))
    leader = advisory.get(lock_parts(advisory_id(LEADER_KEY)))
    if leader is not None:
        found.append(HeldLock(key=LEADER_KEY, kind="beat-leader", holder=leader[0],
                              age_seconds=leader[1], token=None, held=True))
    return found


def force_release(stores: Stores, key: str, redlock_urls: Sequence[str] = ()) -> str:
    """Release `key` whoever holds it; returns what was done.

    An exclusive lock is deleted on every Redlock node (its holder's next heartbeat or
    checkpoint fails, and its fencing token is older than the next holder's). A singleton
    or the beat leader lock belongs to another session: that session is terminated, which
    frees the lock and makes the holder's checkpoint raise LockNotOwnedError.
    """
    done = []
    if len(redlock_urls) >= 3:
        deleted = Redlock.from_urls(redlock_urls, check=False).force_release(key)
        if deleted:
            done.append(f"deleted on {deleted} Redlock node(s)")
    classid, objid = lock_parts(advisory_id(key))
    with stores.engine().begin() as connection:
        terminated = connection.execute(text(
            "SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory' "
            "AND granted AND classid = :c AND objid = :o AND objsubid = 1"),
            {"c": classid, "o": objid}).scalars().all()
        if terminated:
            done.append(f"terminated {len(terminated)} PostgreSQL session(s) holding it")
        removed = connection.execute(
            text("DELETE FROM resilience_held_locks WHERE key = :key"), {"key": key}).rowcount
        if removed:
            done.append("registry entry removed")
    return "; ".join(done) or "not held"
