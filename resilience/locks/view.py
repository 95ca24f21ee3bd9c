"""The locks' views: singleton and exclusive locks held now, and the beat leader."""

from __future__ import annotations

from typing import Any

from resilience.locks.registry import BEAT_LEADER, describe
from resilience.views import Column, Family, Row, Source, View


def held(source: Source) -> list[Row]:
    """Every lock held now and the beat leader, read once per snapshot: each registry row
    checked against the real lock (`pg_locks`, the Redlock nodes); a row a dead holder left
    behind is `stale`."""
    if "held_locks" not in source.cache:
        try:
            stores = source.stores
            source.cache["held_locks"] = [
                {"key": holder.key, "kind": holder.kind, "holder": holder.owner or "-",
                 "held_seconds": round(holder.held_seconds or 0.0, 1), "token": holder.token,
                 "stale": not holder.alive}
                for holder in describe(stores, stores.redlock_urls)]
        except Exception as exc:  # noqa: BLE001 - both views say why, the lock view re-raises
            source.cache["held_locks"] = exc
    found = source.cache["held_locks"]
    if isinstance(found, Exception):
        raise found
    return found


def read_locks(source: Source) -> dict[str, Any]:
    """Locks held now (singleton and exclusive), oldest first; the beat leader apart."""
    locks = [lock for lock in held(source) if lock["kind"] != BEAT_LEADER]
    return {"count": sum(1 for lock in locks if not lock["stale"]), "held": locks}


def read_leader(source: Source) -> dict[str, Any]:
    """The beat process holding the leader lock (None when no beat leads)."""
    for lock in held(source):
        if lock["kind"] == BEAT_LEADER:
            return {"leader": lock["holder"], "leading_seconds": lock["held_seconds"]}
    return {"leader": None}


LOCKS = View(
    name="locks", title="locks held", store="database", read=read_locks,
    rows=lambda section: section["held"], count=lambda section: section["count"],
    empty="no locks held",
    columns=(
        Column(header="key", key="key"),
        Column(header="kind", key="kind"),
        Column(header="holder", key="holder"),
        Column(header="held", text=lambda r: f"{r['held_seconds']}s"),
        Column(header="token", key="token"),
        Column(header="stale", text=lambda r: "[yellow]stale[/yellow]" if r["stale"] else ""),
    ),
    metrics=(Family(name="jobs_locks_held", help="Singleton/exclusive locks held now",
                    samples=lambda section, _: [([], section["count"])]),),
)

BEAT_LEADER_VIEW = View(
    name="beat_leader", title="beat leader", store="database", read=read_leader,
    rows=lambda section: [section],
    columns=(
        Column(header="leader", text=lambda r: str(r.get("leader") or "no beat leads")),
        Column(header="leading for",
               text=lambda r: f"{r['leading_seconds']}s" if r.get("leader") else ""),
    ),
    metrics=(Family(name="jobs_beat_leader",
                    help="1 when a beat process holds the leader lock, 0 when none does",
                    samples=lambda section, _: [([], float(section.get("leader") is not None))]),),
)

