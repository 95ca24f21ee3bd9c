"""The schedules in PostgreSQL: every statement the scheduler, the API and the guard run.

The one statement that matters most is `fire`: ONE transaction that locks the entry's row,
checks that nobody dealt with its slots meanwhile, inserts each slot's run row
(UNIQUE(schedule, slot), ON CONFLICT DO NOTHING), writes each fired slot's job to the outbox
(`resilience.outbox`, with the header `resilience_schedule_run` = the run id) and advances
`last_slot`. So:

    beat A: lock row -> last_slot = S-1 -> insert run S, outbox row -> last_slot = S -> commit
    beat B:        (waits for the row lock) ... last_slot = S: nothing to do -> commit

and a leader SIGKILLed before its commit leaves nothing (its successor fires the slot, or
records it missed); after its commit, the job is in the outbox and the relay publishes it
even if the fast path (`publish_committed`) never ran. No slot fires twice, and no fired
slot is lost, whatever the number of beats, PostgreSQL or Redis restarts included (a
restart aborts the transaction as a whole).
"""

from __future__ import annotations

import datetime as dt
import functools
import json
import logging
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sqlalchemy import text

from resilience.connections import StoreBackend, wrap_store_errors
from resilience.headers import OUTBOX_HEADER
from resilience.outbox import NewRow
from resilience.outbox.backends.postgres import backend_for as outbox_backend_for
from resilience.outbox.models import TABLE_NAME as OUTBOX_TABLE
from resilience.schedules.catchup import Plan
from resilience.schedules.cron import Cron
from resilience.schedules.errors import InvalidSchedule
from resilience.schedules.models import RUNS_TABLE, SCHEDULES_TABLE
from resilience.schedules.overlap import SCHEDULE_SINGLETON_HEADER, singleton_header
from resilience.schedules.policies import CatchUp, Overlap, RunOutcome
from resilience.schedules.timing import Interval

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection, Engine

    from resilience.outbox import OutboxBackend
    from resilience.stores import Stores

logger = logging.getLogger("resilience.schedules")

#: The header a scheduled job carries: the id of its run row (the guard records its end).
SCHEDULE_RUN_HEADER = "resilience_schedule_run"

_COLUMNS = ("name, task, args, kwargs, options, kind, every_seconds, cron, timezone, catch_up, "
            "catch_up_window_seconds, overlap, paused, source, last_slot, resumed_at, "
            "updated_at, version")


@functools.lru_cache(maxsize=1024)
def _cron(expression: str, timezone: str) -> Cron:
    return Cron(expression, timezone=timezone)


@dataclass(frozen=True)
class ScheduleRow:
    """One `resilience_schedules` row, as the scheduler and the API read it."""

    name: str
    task: str
    args: list[Any]
    kwargs: dict[str, Any]
    options: dict[str, Any]
    kind: str
    every_seconds: float | None
    cron: str | None
    timezone: str
    catch_up: CatchUp
    catch_up_window_seconds: float
    overlap: Overlap
    paused: bool
    source: str
    last_slot: dt.datetime | None
    resumed_at: dt.datetime | None
    updated_at: dt.datetime | None
    version: int

    @property
    def every(self) -> Interval | Cron:
        """Its timing (a Cron is parsed once per expression and zone, then cached)."""
        if self.kind == "interval":
            return Interval(float(self.every_seconds or 0))
        return _cron(self.cron or "", self.timezone)

    @classmethod
    def of(cls, row: Any) -> ScheduleRow:
        values = dict(row._mapping)
        values["catch_up"] = CatchUp(values["catch_up"])
        values["overlap"] = Overlap(values["overlap"])
        return cls(**values)


@dataclass(frozen=True)
class RunRow:
    """One `resilience_schedule_runs` row."""

    id: int
    schedule: str
    slot: dt.datetime
    fired_at: dt.datetime | None
    task_id: str | None
    outcome: RunOutcome
    finished_at: dt.datetime | None
    late_seconds: float | None
    detail: dict[str, Any] | None

    @classmethod
    def of(cls, row: Any) -> RunRow:
        values = dict(row._mapping)
        values["outcome"] = RunOutcome(values["outcome"])
        return cls(**values)


@dataclass
class Fired:
    """What one `fire` transaction did (the scheduler publishes, counts and logs from it).

    Args:
        sent: (run id, slot, late seconds, outbox row id) of each slot written to the outbox.
        missed: slots recorded missed (plus `also_missed` counted, not recorded).
        skipped: slots the overlap policy did not send (recorded skipped_overlap / queued).
        cancel: task ids the overlap policy asks to cancel once this commits.
        stale: the entry changed (or another beat dealt with its slots) since it was read:
            nothing was done; the next tick plans again.
    """

    sent: list[tuple[int, dt.datetime, float, int]] = field(default_factory=list)
    missed: int = 0
    skipped: list[tuple[dt.datetime, RunOutcome]] = field(default_factory=list)
    cancel: list[str] = field(default_factory=list)
    stale: bool = False


# -- reading ---------------------------------------------------------------------------------

_READ_ALL = text(f"SELECT {_COLUMNS} FROM {SCHEDULES_TABLE} ORDER BY name")
_READ_ONE = text(f"SELECT {_COLUMNS} FROM {SCHEDULES_TABLE} WHERE name = :name")
_LOCK_ONE = text(f"SELECT last_slot, version, paused FROM {SCHEDULES_TABLE} "
                 "WHERE name = :name FOR UPDATE")
_RUN_COLUMNS = ("id, schedule, slot, fired_at, task_id, outcome, finished_at, late_seconds, "
                "detail")
_RECENT_RUNS = text(f"SELECT {_RUN_COLUMNS} FROM {RUNS_TABLE} WHERE schedule = :name "
                    "ORDER BY slot DESC, id DESC LIMIT :limit")
_LATEST_RUNS = text(f"""
SELECT DISTINCT ON (schedule) {_RUN_COLUMNS} FROM {RUNS_TABLE}
ORDER BY schedule, slot DESC, id DESC
""")
#: Per schedule, what its metrics count (the view derives them: nothing is counted twice).
#: Each subquery reads the index (schedule, outcome, slot) of one schedule and outcome (the
#: unique (schedule, slot) for the oldest slot), never the other run rows: a 2 s entry's
#: 300,000 succeeded rows cost one index probe. Rows pruned (`prune_runs`) are counted on in
#: the schedule row, so the counters never go down.
_RUN_TOTALS = text(f"""
SELECT s.name AS schedule,
       s.pruned_missed + (SELECT count(*) + coalesce(sum((r.detail ->> 'also_missed')::bigint), 0)
                          FROM {RUNS_TABLE} r
                          WHERE r.schedule = s.name AND r.outcome = 'missed') AS missed,
       s.pruned_skipped + (SELECT count(*) FROM {RUNS_TABLE} r
                           WHERE r.schedule = s.name AND r.outcome = 'skipped_overlap') AS skipped,
       (SELECT r.slot FROM {RUNS_TABLE} r WHERE r.schedule = s.name AND r.outcome = 'succeeded'
        ORDER BY r.slot DESC LIMIT 1) AS last_success,
       (SELECT r.slot FROM {RUNS_TABLE} r WHERE r.schedule = s.name
        ORDER BY r.slot LIMIT 1) AS first_slot
FROM {SCHEDULES_TABLE} s
""")
#: The previous run of an entry that was sent (the overlap policies decide from it).
_PREVIOUS_SENT = text(f"SELECT {_RUN_COLUMNS} FROM {RUNS_TABLE} "
                      "WHERE schedule = :name AND task_id IS NOT NULL "
                      "ORDER BY slot DESC, id DESC LIMIT 1")
#: Overlap.QUEUE_ONE: the newest two runs of its slots sent or queued. A queued run is the
#: newest (its slot follows the run it waits behind, which comes second; later slots are
#: skipped, never sent). `run_now` runs are left out, so they cannot come between the two
#: (the entry's singleton keeps them apart from the others).
_QUEUE_HEAD = text(f"SELECT {_RUN_COLUMNS} FROM {RUNS_TABLE} "
                   "WHERE schedule = :name AND (task_id IS NOT NULL OR outcome = 'queued') "
                   "AND COALESCE(detail ->> 'why', '') <> 'run_now' "
                   "ORDER BY slot DESC, id DESC LIMIT 2")


@dataclass(frozen=True)
class RunTotals:
    """What a schedule's run rows add up to (its metrics)."""

    missed: int
    skipped: int
    last_success: dt.datetime | None
    first_slot: dt.datetime | None


def schedule_store(stores: Stores) -> ScheduleStore:
    """The schedule tables of `stores`' PostgreSQL (built once per process)."""
    return stores.backend("schedules", _build)


def _build(stores: Stores) -> ScheduleStore:
    return ScheduleStore(stores.engine, stores.backend("outbox", outbox_backend_for))


class ScheduleStore(StoreBackend):
    """The schedule tables of one database (PostgreSQL only: a fire's job row must be
    written in the transaction of its run row).

    Args:
        engine: a callable returning the SQLAlchemy engine (the stores' engine).
        outbox: the outbox backend the jobs are written to (its `insert` joins the fire's
            transaction).
    """

    store_operation = "schedules"

    def __init__(self, engine: Callable[[], Engine], outbox: OutboxBackend) -> None:
        self.engine = engine
        self.outbox = outbox

    @contextmanager
    def _begin(self, what: str, **fields: Any) -> Iterator[Connection]:
        with wrap_store_errors(f"schedules: {what}", **fields), self.engine().begin() as connection:
            yield connection

    def read_all(self) -> list[ScheduleRow]:
        """Every schedule (one SELECT: the scheduler's read at each tick)."""
        with self._begin("read") as connection:
            return [ScheduleRow.of(row) for row in connection.execute(_READ_ALL)]

    def read(self, name: str) -> ScheduleRow | None:
        """The schedule named `name`, or None."""
        with self._begin("read", schedule=name) as connection:
            row = connection.execute(_READ_ONE, {"name": name}).first()
        return None if row is None else ScheduleRow.of(row)

    def recent_runs(self, name: str, limit: int) -> list[RunRow]:
        """The newest `limit` run rows of `name`, newest first."""
        with self._begin("runs", schedule=name) as connection:
            return [RunRow.of(row) for row in connection.execute(
                _RECENT_RUNS, {"name": name, "limit": limit})]

    def latest_runs(self) -> dict[str, RunRow]:
        """The newest run row of every schedule that has one."""
        with self._begin("runs") as connection:
            return {row.schedule: RunRow.of(row) for row in connection.execute(_LATEST_RUNS)}

    def run_totals(self) -> dict[str, RunTotals]:
        """Per schedule with runs: slots missed (those recorded and those only counted),
        slots skipped by overlap, its newest succeeded slot and its oldest slot (one
        GROUP BY over the run rows)."""
        with self._begin("run totals") as connection:
            return {row.schedule: RunTotals(missed=int(row.missed), skipped=int(row.skipped),
                                            last_success=row.last_success,
                                            first_slot=row.first_slot)
                    for row in connection.execute(_RUN_TOTALS)
                    if row.first_slot is not None}

    def prune(self, name: str, before: dt.datetime, keep_last: int, batch_size: int) -> int:
        """Delete up to `batch_size` finished run rows of `name` whose slot is before
        `before` and older than its newest `keep_last` runs (one transaction, counting the
        missed and skipped ones on in the schedule row); returns how many went."""
        with self._begin("prune", schedule=name) as connection:
            return int(connection.execute(_PRUNE, {
                "name": name, "before": before, "keep": keep_last, "batch": batch_size,
            }).scalar() or 0)

    def names(self) -> list[str]:
        """Every schedule's name."""
        with self._begin("read") as connection:
            return list(connection.execute(_NAMES).scalars())

    # -- firing ------------------------------------------------------------------------------
    def fire(self, entry: ScheduleRow, plan: Plan, *,
             decide: Callable[[ScheduleRow, RunRow | None], Any],
             detail: Mapping[str, Any] | None = None,
             cancel: Callable[[str], None] | None = None) -> Fired:
        """Deal with `plan`'s slots of `entry` in ONE transaction (see the module doc).

        Args:
            decide: the overlap decision for each fire from the previous sent run
                (`resilience.schedules.overlap.decide`).
            detail: added to each fired run row's detail (e.g. the sender).
            cancel: cancels a job by task id (CANCEL_PREVIOUS), called inside the
                transaction; an error it raises rolls the fire back.

        Raises:
            StoreUnavailable, StorageError: PostgreSQL failed; nothing was done.
        """
        done = Fired()
        with self._begin("fire", schedule=entry.name) as connection:
            current = connection.execute(_LOCK_ONE, {"name": entry.name}).first()
            if (current is None or current.paused or current.version != entry.version
                    or current.last_slot != entry.last_slot):
                done.stale = True
                return done
            if plan.missed:
                done.missed = len(plan.missed) + plan.also_missed
                self._insert_missed(connection, entry.name, plan)
            previous = None
            if entry.overlap is not Overlap.ALLOW:
                found = connection.execute(
                    _QUEUE_HEAD if entry.overlap is Overlap.QUEUE_ONE else _PREVIOUS_SENT,
                    {"name": entry.name}).first()
                previous = None if found is None else RunRow.of(found)
            for slot, why in plan.fire:
                decision = decide(entry, previous)
                if not decision.send:
                    unsent = self._insert_unsent(connection, entry.name, slot,
                                                 decision.outcome, {"why": why, **decision.detail})
                    if unsent is not None:
                        done.skipped.append((slot, decision.outcome))
                        if decision.outcome is RunOutcome.QUEUED:
                            previous = _fired_here(unsent, entry.name, slot, None,
                                                   RunOutcome.QUEUED)
                    continue
                if decision.cancel and previous is not None:
                    # Cancelled before this fire commits: if the cancellation cannot be
                    # recorded, nothing of this fire is (the next tick tries again).
                    self._cancel_previous(connection, previous, slot, cancel)
                    done.cancel.append(decision.cancel)
                task_id = str(uuid.uuid4())
                sent = self._insert_fire(connection, entry, slot,
                                         {"why": why, **(detail or {}), **decision.detail},
                                         task_id=task_id)
                if sent is not None:
                    done.sent.append(sent)
                    previous = _fired_here(sent[0], entry.name, slot, task_id, RunOutcome.SENT)
            if plan.last_slot is not None:
                connection.execute(_ADVANCE, {"name": entry.name, "last_slot": plan.last_slot})
        return done

    def _insert_missed(self, connection: Connection, name: str, plan: Plan) -> None:
        details = [None] * len(plan.missed)
        if plan.also_missed:
            details[0] = json.dumps({"also_missed": plan.also_missed})
        connection.execute(_INSERT_MISSED, {"name": name, "slots": plan.missed,
                                            "details": details})

    @staticmethod
    def _insert_unsent(connection: Connection, name: str, slot: dt.datetime,
                       outcome: RunOutcome, detail: dict[str, Any]) -> int | None:
        """The run row of a slot not sent; its id, None if the slot has a row."""
        row = connection.execute(_INSERT_UNSENT, {
            "name": name, "slot": slot, "outcome": outcome.value,
            "detail": json.dumps(detail)}).first()
        return None if row is None else int(row.id)

    @staticmethod
    def _cancel_previous(connection: Connection, previous: RunRow, slot: dt.datetime,
                         cancel: Callable[[str], None] | None) -> None:
        """Overlap.CANCEL_PREVIOUS: record `previous` cancelled (if still sent), then cancel
        its job through `cancel` (resilience.cancel: it never starts, or stops at its next
        checkpoint); its own end records nothing more."""
        connection.execute(_CANCEL_RUN, {"id": previous.id, "detail": json.dumps(
            {"cancelled_by_slot": slot.isoformat()})})
        if cancel is not None and previous.task_id:
            cancel(previous.task_id)

    def _insert_fire(self, connection: Connection, entry: ScheduleRow, slot: dt.datetime,
                     detail: dict[str, Any], task_id: str | None = None,
                     ) -> tuple[int, dt.datetime, float, int] | None:
        """The run row and the job's outbox row of one slot; None if the slot has a row."""
        task_id = task_id or str(uuid.uuid4())
        inserted = connection.execute(_INSERT_FIRE, {
            "name": entry.name, "slot": slot, "task_id": task_id,
            "detail": json.dumps(detail)}).first()
        if inserted is None:
            return None
        outbox_id = self.outbox.insert(connection, job_row(entry, inserted.id, task_id))
        return inserted.id, slot, float(inserted.late_seconds), outbox_id

    def fire_queued(self, entry: ScheduleRow, *,
                    released: Callable[[RunRow | None], bool],
                    ) -> tuple[tuple[int, dt.datetime, float, int] | None, bool]:
        """Overlap.QUEUE_ONE: fire `entry`'s queued run if the run it waits behind ended
        (`released(behind)`, `overlap.releases_queued`), in one transaction: the run row
        turns `sent` (fired now, late from its slot) and the job goes to the outbox.

        Returns:
            (the fire as in `Fired.sent`, or None; whether a queued run still waits).
        """
        with self._begin("fire queued", schedule=entry.name) as connection:
            current = connection.execute(_LOCK_ONE, {"name": entry.name}).first()
            if current is None or current.paused:
                return None, False
            rows = [RunRow.of(row) for row in connection.execute(
                _QUEUE_HEAD, {"name": entry.name})]
            if not rows or rows[0].outcome is not RunOutcome.QUEUED:
                return None, False
            queued, behind = rows[0], (rows[1] if len(rows) > 1 else None)
            if not released(behind):
                return None, True
            task_id = str(uuid.uuid4())
            fired = connection.execute(_FIRE_QUEUED, {
                "id": queued.id, "task_id": task_id,
                "detail": json.dumps({"released_by_run": behind.id if behind else None}),
            }).first()
            if fired is None:
                return None, False
            outbox_id = self.outbox.insert(connection, job_row(entry, queued.id, task_id))
        return (queued.id, queued.slot, float(fired.late_seconds), outbox_id), False

    def run_now(self, entry: ScheduleRow) -> tuple[int, str, int]:
        """Fire `entry` once now, off its slots (its `last_slot` does not move); returns
        (run id, task id, outbox row id)."""
        task_id = str(uuid.uuid4())
        with self._begin("run now", schedule=entry.name) as connection:
            inserted = connection.execute(_INSERT_FIRE, {
                "name": entry.name, "slot": None, "task_id": task_id,
                "detail": json.dumps({"why": "run_now"})}).first()
            outbox_id = self.outbox.insert(connection, job_row(entry, inserted.id, task_id))
        return inserted.id, task_id, outbox_id

    # -- the run-history guard ---------------------------------------------------------------
    def record(self, run_id: int, outcome: RunOutcome,
               detail: Mapping[str, Any] | None = None) -> bool:
        """Record how run `run_id`'s job ended; only a `sent` run changes (a redelivered
        job's second end changes nothing). True when this call recorded it."""
        with self._begin("record", run_id=run_id) as connection:
            return connection.execute(_RECORD, {
                "id": run_id, "outcome": outcome.value,
                "detail": None if detail is None else json.dumps(dict(detail)),
            }).first() is not None

    # -- seeding and the API -----------------------------------------------------------------
    def seed(self, entries: list[dict[str, Any]]) -> tuple[int, int]:
        """Upsert the code entries (`entries`: column values plus `named`, the policy
        columns the code entry names) and delete the code entries no longer in code.
        Returns (upserted or changed, removed)."""
        changed = 0
        with self._begin("seed") as connection:
            for entry in entries:
                changed += connection.execute(_seed_statement(entry["named"]),
                                              _params(entry)).rowcount
            removed = connection.execute(_REMOVE_CODE, {
                "names": [entry["name"] for entry in entries]}).rowcount
        return changed, removed

    def insert(self, values: dict[str, Any]) -> bool:
        """Insert a runtime schedule; False if the name is taken."""
        with self._begin("add", schedule=values["name"]) as connection:
            return connection.execute(_INSERT, _params(values)).first() is not None

    def update(self, name: str, changes: dict[str, Any]) -> bool:
        """Apply `changes` (column -> value) to `name`, version + 1; False if not found. An
        overlap changed away from QUEUE_ONE settles its queued run (if any) skipped_overlap
        in the same transaction: the slot was held back by the old policy, the new one
        decides from the next slot on (firing it here would publish from the API's process
        beside a previous run that may still be going)."""
        sets = ", ".join(f"{column} = {_placeholder(column)}" for column in changes)
        statement = text(f"UPDATE {SCHEDULES_TABLE} SET {sets}, updated_at = clock_timestamp(), "
                         "version = version + 1 WHERE name = :name RETURNING name")
        with self._begin("edit", schedule=name) as connection:
            if connection.execute(statement, {**_params(changes), "name": name}).first() is None:
                return False
            overlap = changes.get("overlap")
            if overlap is not None and Overlap(overlap) is not Overlap.QUEUE_ONE:
                # Under the row lock the edit took: a queued run's fire (`fire_queued`)
                # either went first or finds none.
                connection.execute(_SETTLE_QUEUED, {"name": name, "detail": json.dumps(
                    {"settled": f"overlap edited to {Overlap(overlap).value}"})})
        return True

    def set_paused(self, name: str, paused: bool) -> bool:
        """Pause or resume `name` (a resume stamps `resumed_at`); False if not found."""
        with self._begin("pause" if paused else "resume", schedule=name) as connection:
            return connection.execute(_SET_PAUSED, {"name": name, "paused": paused}).first() \
                is not None

    def delete(self, name: str) -> bool:
        """Delete `name` and its run history; False if not found."""
        with self._begin("remove", schedule=name) as connection:
            return connection.execute(_DELETE, {"name": name}).first() is not None


def _fired_here(run_id: int, name: str, slot: dt.datetime, task_id: str | None,
                outcome: RunOutcome) -> RunRow:
    """A run row written by the fire in progress (the next slot's previous run)."""
    return RunRow(id=run_id, schedule=name, slot=slot, fired_at=None, task_id=task_id,
                  outcome=outcome, finished_at=None, late_seconds=None, detail=None)


def job_row(entry: ScheduleRow, run_id: int, task_id: str) -> NewRow:
    """The outbox row of one fire of `entry`: its task, arguments and options, the run id
    in the header `resilience_schedule_run`, and for SKIP / QUEUE_ONE entries the
    singleton header (`overlap.singleton_header`)."""
    options = dict(entry.options)
    headers = {**(options.pop("headers", None) or {}), SCHEDULE_RUN_HEADER: run_id}
    singleton = singleton_header(entry)
    if singleton is not None:
        headers[SCHEDULE_SINGLETON_HEADER] = singleton
    return NewRow(task_id=task_id, task_name=entry.task, args=list(entry.args),
                  kwargs=dict(entry.kwargs), options={**options, "headers": headers})


_JSON_COLUMNS = ("args", "kwargs", "options")


def _placeholder(column: str) -> str:
    return f"CAST(:{column} AS JSONB)" if column in _JSON_COLUMNS else f":{column}"


def _params(values: Mapping[str, Any]) -> dict[str, Any]:
    return {column: json.dumps(value) if column in _JSON_COLUMNS else
            (value.value if isinstance(value, CatchUp | Overlap) else value)
            for column, value in values.items() if column != "named"}


_SEEDED_COLUMNS = ("task", "args", "kwargs", "options", "kind", "every_seconds", "cron",
                   "timezone")
_POLICY_COLUMNS = ("catch_up", "catch_up_window_seconds", "overlap", "paused")
_INSERT_COLUMNS = ("name", *_SEEDED_COLUMNS, *_POLICY_COLUMNS, "source")


def _insert_sql() -> str:
    values = ", ".join(_placeholder(column) for column in _INSERT_COLUMNS)
    return f"INSERT INTO {SCHEDULES_TABLE} ({', '.join(_INSERT_COLUMNS)}) VALUES ({values})"


_INSERT = text(_insert_sql() + " ON CONFLICT (name) DO NOTHING RETURNING name")


@functools.lru_cache(maxsize=16)
def _seed_statement(named: frozenset[str]) -> Any:
    """The upsert of a code entry: code's task, timing and options always win; a policy
    column is overwritten only when the code entry names it (else what was set at runtime
    stays). Nothing is written when nothing differs."""
    updated = [*_SEEDED_COLUMNS, *(column for column in _POLICY_COLUMNS if column in named)]
    sets = ", ".join(f"{column} = EXCLUDED.{column}" for column in updated)
    old = ", ".join(f"{SCHEDULES_TABLE}.{column}" for column in (*updated, "source"))
    new = ", ".join(f"EXCLUDED.{column}" for column in (*updated, "source"))
    return text(f"{_insert_sql()} ON CONFLICT (name) DO UPDATE SET {sets}, source = 'code', "
                f"updated_at = clock_timestamp(), version = {SCHEDULES_TABLE}.version + 1 "
                f"WHERE ({old}) IS DISTINCT FROM ({new})")


_REMOVE_CODE = text(f"DELETE FROM {SCHEDULES_TABLE} WHERE source = 'code' "
                    "AND NOT (name = ANY(:names))")
_SET_PAUSED = text(f"""
UPDATE {SCHEDULES_TABLE}
SET paused = :paused, version = version + 1, updated_at = clock_timestamp(),
    resumed_at = CASE WHEN :paused THEN resumed_at ELSE clock_timestamp() END
WHERE name = :name RETURNING name
""")
_DELETE = text(f"DELETE FROM {SCHEDULES_TABLE} WHERE name = :name RETURNING name")
_NAMES = text(f"SELECT name FROM {SCHEDULES_TABLE} ORDER BY name")
#: One batch of `prune`: finished rows (neither sent nor queued) before :before and before
#: the entry's :keep-th newest slot (none when it has fewer rows: COALESCE, as LEAST would
#: ignore a NULL), oldest first through the unique (schedule, slot) index; the deleted missed
#: slots (with their counted-only ones) and skipped rows go on in the schedule row, in the
#: same transaction.
_PRUNE = text(f"""
WITH doomed AS (
    DELETE FROM {RUNS_TABLE} WHERE id IN (
        SELECT id FROM {RUNS_TABLE}
        WHERE schedule = :name AND outcome NOT IN ('sent', 'queued')
          AND slot < LEAST(CAST(:before AS TIMESTAMPTZ), COALESCE(
              (SELECT slot FROM {RUNS_TABLE} WHERE schedule = :name
               ORDER BY slot DESC OFFSET :keep - 1 LIMIT 1), '-infinity'))
        ORDER BY slot LIMIT :batch)
    RETURNING outcome, detail
), counted AS (
    SELECT count(*) AS deleted,
           count(*) FILTER (WHERE outcome = 'missed')
             + coalesce(sum((detail ->> 'also_missed')::bigint)
                        FILTER (WHERE outcome = 'missed'), 0) AS missed,
           count(*) FILTER (WHERE outcome = 'skipped_overlap') AS skipped
    FROM doomed
), counted_on AS (
    UPDATE {SCHEDULES_TABLE} SET pruned_missed = pruned_missed + counted.missed,
        pruned_skipped = pruned_skipped + counted.skipped
    FROM counted WHERE name = :name AND counted.deleted > 0
)
SELECT deleted FROM counted
""")
_ADVANCE = text(f"UPDATE {SCHEDULES_TABLE} SET last_slot = :last_slot WHERE name = :name")
_INSERT_MISSED = text(f"""
INSERT INTO {RUNS_TABLE} (schedule, slot, outcome, detail)
SELECT :name, slot, 'missed', CAST(detail AS JSONB)
FROM unnest(CAST(:slots AS TIMESTAMPTZ[]), CAST(:details AS TEXT[])) AS missed(slot, detail)
ON CONFLICT (schedule, slot) DO NOTHING
""")
_INSERT_UNSENT = text(f"""
INSERT INTO {RUNS_TABLE} (schedule, slot, outcome, detail)
VALUES (:name, :slot, :outcome, CAST(:detail AS JSONB))
ON CONFLICT (schedule, slot) DO NOTHING RETURNING id
""")
# A run_now has no slot of its own: it takes the fire's time.
_INSERT_FIRE = text(f"""
INSERT INTO {RUNS_TABLE} (schedule, slot, fired_at, task_id, outcome, late_seconds, detail)
SELECT :name, s.slot, s.now, :task_id, 'sent', EXTRACT(EPOCH FROM s.now - s.slot),
       CAST(:detail AS JSONB)
FROM (SELECT COALESCE(CAST(:slot AS TIMESTAMPTZ), clock_timestamp()) AS slot,
             clock_timestamp() AS now) s
ON CONFLICT (schedule, slot) DO NOTHING RETURNING id, late_seconds
""")
#: CANCEL_PREVIOUS: the previous run is cancelled by the fire that replaces it.
_CANCEL_RUN = text(f"""
UPDATE {RUNS_TABLE}
SET outcome = 'cancelled', finished_at = clock_timestamp(),
    detail = COALESCE(detail, '{{}}'::jsonb) || CAST(:detail AS JSONB)
WHERE id = :id AND outcome = 'sent'
""")
#: An entry edited away from QUEUE_ONE: its queued run (the slot the old policy held back)
#: is settled skipped_overlap, as no tick fires queued runs of other policies.
_SETTLE_QUEUED = text(f"""
UPDATE {RUNS_TABLE}
SET outcome = 'skipped_overlap',
    detail = COALESCE(detail, '{{}}'::jsonb) || CAST(:detail AS JSONB)
WHERE schedule = :name AND outcome = 'queued'
""")
#: QUEUE_ONE: a queued run is fired (late from its own slot).
_FIRE_QUEUED = text(f"""
UPDATE {RUNS_TABLE}
SET outcome = 'sent', task_id = :task_id, fired_at = clock_timestamp(),
    late_seconds = EXTRACT(EPOCH FROM clock_timestamp() - slot),
    detail = COALESCE(detail, '{{}}'::jsonb) || CAST(:detail AS JSONB)
WHERE id = :id AND outcome = 'queued' RETURNING late_seconds
""")
_RECORD = text(f"""
UPDATE {RUNS_TABLE}
SET outcome = :outcome, finished_at = clock_timestamp(),
    detail = CASE WHEN CAST(:detail AS JSONB) IS NULL THEN detail
                  ELSE COALESCE(detail, '{{}}'::jsonb) || CAST(:detail AS JSONB) END
WHERE id = :id AND outcome = 'sent' RETURNING id
""")

#: The fast path's statements: mark the rows a fire just committed published (skipping any
#: a relay holds: it publishes those), then publish those this call marked.
_CLAIM_ROWS = text(f"""
UPDATE {OUTBOX_TABLE} SET state = 'published', finished_at = clock_timestamp(),
    attempts = attempts + 1
WHERE id IN (SELECT id FROM {OUTBOX_TABLE} WHERE id = ANY(:ids) AND state = 'pending'
             FOR UPDATE SKIP LOCKED)
RETURNING id, task_id, task_name, args, kwargs, options
""")
_UNCLAIM_ROW = text(f"UPDATE {OUTBOX_TABLE} SET state = 'pending', finished_at = NULL, "
                    "last_error = :error WHERE id = :id")


def publish_committed(engine: Callable[[], Engine], app: Any, outbox_ids: list[int]) -> int:
    """Publish the outbox rows a fire just committed, now, instead of waiting for the relay;
    returns how many were published.

    The rows are marked published in a transaction held while they are published; a row a
    relay locked first is skipped (the relay publishes it), so no row is published twice by
    the two and the beat never waits on a relay. A row whose publish fails is left pending
    for the relay; a process killed before the commit leaves them all pending, and the relay
    publishes them (the outbox's at-least-once contract). Errors are logged, never raised:
    the fire committed.
    """
    if not outbox_ids:
        return 0
    published = 0
    try:
        with wrap_store_errors("schedules: publish"), engine().begin() as connection:
            for row in connection.execute(_CLAIM_ROWS, {"ids": outbox_ids}).all():
                try:
                    _publish(app, row)
                    published += 1
                except Exception as exc:  # noqa: BLE001 - the relay publishes it later
                    logger.warning("schedules: publish of %s (%s) failed, left to the "
                                   "outbox relay: %s", row.task_name, row.task_id, exc)
                    connection.execute(_UNCLAIM_ROW, {"id": row.id, "error": str(exc)[:500]})
    except Exception as exc:  # noqa: BLE001 - committed rows stay pending for the relay
        logger.warning("schedules: fast publish failed, rows left to the outbox relay: %s",
                       exc)
        return 0
    return published


def _publish(app: Any, row: Any) -> None:
    options = dict(row.options)
    headers = {**(options.pop("headers", None) or {}), OUTBOX_HEADER: row.id}
    task = app.tasks.get(row.task_name)
    if task is not None:
        task.apply_async(tuple(row.args), dict(row.kwargs), task_id=row.task_id,
                         headers=headers, **options)
    else:
        app.send_task(row.task_name, args=list(row.args), kwargs=dict(row.kwargs),
                      task_id=row.task_id, headers=headers, **options)


def validate_values(values: Mapping[str, Any]) -> None:
    """Refuse values the table's checks would refuse, with one clear line each."""
    window = values.get("catch_up_window_seconds")
    if window is not None and (isinstance(window, bool) or not isinstance(window, int | float)
                               or window < 0):
        raise InvalidSchedule(f"catch_up_window_seconds must be a number >= 0, got {window!r}")
    for column in _JSON_COLUMNS:
        if column in values:
            try:
                json.dumps(values[column])
            except (TypeError, ValueError):
                raise InvalidSchedule(f"{column} must be JSON, got {values[column]!r}") from None
