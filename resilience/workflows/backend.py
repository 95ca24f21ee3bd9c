"""`WorkflowBackend`: the workflow steps in PostgreSQL, each a statement or two in one
transaction.

- create: the workflow row, every step row (one `INSERT ... SELECT` from a JSON recordset)
  and the outbox rows of the steps with no dependency, in one transaction (the producer's).
- start: one autocommit statement marks the step started and reads its state (a
  redelivered final step is replayed, a step of a stopped workflow cancelled).
- succeed: one statement records the step (only if it is still live), takes one from each
  dependent's `waiting` (computing the input of a single-source dependent in SQL) and one
  from the workflow's `remaining`; then, in the same transaction, the inputs of released
  fan-in steps (their other sources committed before: the dependent's row lock orders
  them), the outbox rows of the released steps, and the workflow's result when nothing
  remains. The caller publishes the rows after the commit (`publish_held`).
- fail: the step's final state, the workflow failed (or left as an operator set it), its
  pending steps skipped, and the next compensation queued.
- compensations run one at a time: each one's completion queues the next (reverse
  `completed_seq`), under the workflow row's lock, so two never run at once; none starts
  while a step is still in flight (queued), since it may yet succeed and must then be
  undone first.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kombu.utils.json import JSONEncoder
from sqlalchemy import text

from resilience.connections import StoreBackend, wrap_store_errors
from resilience.connections.postgres import (
    HeldConnection,
    Prefix,
    Row,
    StatementRunner,
    asynchronous_commit,
    synchronous_commit,
)
from resilience.headers import WORKFLOW_STEP_HEADER
from resilience.keys import revive
from resilience.outbox.backends import NewRow, OutboxRow
from resilience.outbox.backends.postgres import PostgresOutboxBackend
from resilience.outbox.models import TABLE_NAME as OUTBOX_TABLE
from resilience.outbox.trace import with_trace_context
from resilience.prepared import PreparedStatement
from resilience.workflows.canvas import (
    StepSpec,
    Template,
    input_args,
    link,
    positions,
    resolve,
)
from resilience.workflows.errors import WorkflowNotFound, WorkflowNotRetryable
from resilience.workflows.models import COMPLETED_SEQUENCE, STEPS_TABLE, WORKFLOWS_TABLE
from resilience.workflows.states import (
    SUCCESS_STATES,
    StepState,
    StepSummary,
    WorkflowState,
    WorkflowSummary,
)

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine

    from resilience.stores import Stores

#: Seconds a released step's outbox row waits for the relay: the worker that released it
#: publishes it at once after its commit; the relay only if that worker died first.
DEFAULT_HOLD_SECONDS = 5.0

COMPENSATION = "compensation"

_INSERT_WORKFLOW = text(f"""
INSERT INTO {WORKFLOWS_TABLE} (id, name, state, canvas, total, remaining, replay_of)
VALUES (:id, :name, 'running', CAST(:canvas AS JSONB), :total, :remaining, :replay_of)
""")

_INSERT_STEPS = text(f"""
INSERT INTO {STEPS_TABLE} (workflow_id, position, kind, release, task_id, task_name,
                          signature, depends_on, dependents, waiting, input, state, result,
                          compensate, compensation_task_id, completed_seq, finished_at)
SELECT :workflow_id, s.position, s.kind, s.release, s.task_id, s.task_name, s.signature,
       ARRAY(SELECT jsonb_array_elements_text(s.depends_on)::int),
       ARRAY(SELECT jsonb_array_elements_text(s.dependents)::int), s.waiting, s.input,
       s.state, s.result, s.compensate, s.compensation_task_id,
       CASE WHEN s.state IN ('succeeded', 'replayed') THEN nextval('{COMPLETED_SEQUENCE}') END,
       CASE WHEN s.state IN ('succeeded', 'replayed') THEN clock_timestamp() END
FROM jsonb_to_recordset(CAST(:steps AS JSONB)) AS s(
    position INT, kind TEXT, release TEXT, task_id TEXT, task_name TEXT, signature JSONB,
    depends_on JSONB, dependents JSONB, waiting INT, input JSONB, state TEXT, result JSONB,
    compensate JSONB, compensation_task_id TEXT)
""")

_START = PreparedStatement("resilience_workflow_start", f"""
UPDATE {STEPS_TABLE} s SET started_at = COALESCE(s.started_at, clock_timestamp())
FROM {WORKFLOWS_TABLE} w
WHERE s.workflow_id = %(workflow_id)s AND s.position = %(position)s AND w.id = s.workflow_id
RETURNING s.state, s.result, s.compensation_state, w.state AS workflow_state,
          COALESCE((s.signature ->> 'simple')::boolean, false) AS simple,
          COALESCE((s.signature ->> 'fan_in')::boolean, false) AS fan_in,
          COALESCE((s.signature ->> 'run')::int, 0) AS run
""")

# The whole completion of a *simple* step (it has dependents, or it has none and is the
# workflow's result) as ONE autocommit statement: the step leaves its live state once; the
# workflow counts it (and succeeds with its result when it was the last); each dependent
# counts it, and one it releases gets its input and its outbox row, held for the relay (the
# worker publishes it after this statement). The dependents are locked (after the workflow
# row) before the step is recorded, so `waiting` is the latest. Data-modifying CTEs all
# run, in one snapshot and one transaction. Only while the workflow runs (its row locked
# first, so the latest state is read): a step that ends after its workflow stopped records
# nothing here and goes through `succeed`'s transaction, which queues the next compensation
# with it.
#
# A fan-in dependent (several sources: a chord body) needs the other sources' results when
# this step is its last source, and this statement's snapshot may predate their commits
# (it waited for their row locks). With `fan_in` the caller sends `_LOCK_FIRST` before it in
# the same query string (one round trip, one implicit transaction): the workflow row is
# locked first, so this statement's snapshot, taken after that, sees every source that
# counted before it, and the input of a fan-in whose source is a flat list of steps (a
# chord's header) is built here. Without `fan_in`, or for a nested source, nothing is
# recorded when this step is the last source: `succeed`'s transaction reads the results.
_RUNNING = f"""
WITH running AS (
    SELECT state FROM {WORKFLOWS_TABLE} WHERE id = %(workflow_id)s FOR UPDATE
"""
# Only a step with a fan-in dependent needs these: its dependents locked before it records,
# and nothing recorded when it is the last source of one whose input it cannot build.
_DEPS = f"""), deps AS (
    SELECT d.position, d.waiting, d.signature -> 'source' AS source,
           jsonb_typeof(d.signature -> 'source') = 'array' AND NOT EXISTS (
               SELECT 1 FROM jsonb_array_elements(d.signature -> 'source') AS e(source)
               WHERE jsonb_typeof(e.source) <> 'number') AS flat
    FROM {STEPS_TABLE} d
    WHERE d.workflow_id = %(workflow_id)s AND d.position IN (
        SELECT unnest(dependents) FROM {STEPS_TABLE}
        WHERE workflow_id = %(workflow_id)s AND position = %(position)s)
    FOR UPDATE
"""
_DEPS_CHECK = """
      AND NOT EXISTS (SELECT 1 FROM deps WHERE deps.waiting = 1
                      AND jsonb_typeof(deps.source) IS DISTINCT FROM 'number'
                      AND NOT (%(fan_in)s AND deps.flat))"""
_DONE = f"""), done AS (
    UPDATE {STEPS_TABLE}
    SET state = %(state)s, result = CAST(%(result)s AS JSONB), error = NULL,
        finished_at = clock_timestamp(), completed_seq = nextval('{COMPLETED_SEQUENCE}')
    WHERE workflow_id = %(workflow_id)s AND position = %(position)s
      AND state IN ('pending', 'queued') AND (SELECT state FROM running) = 'running'
      AND COALESCE((signature ->> 'run')::int, 0) = %(run)s"""
_RELEASE = f"""
    RETURNING dependents
), workflow AS (
    UPDATE {WORKFLOWS_TABLE} w
    SET remaining = w.remaining - 1,
        state = CASE WHEN w.state = 'running' AND w.remaining = 1 THEN 'succeeded'
                     ELSE w.state END,
        result = CASE WHEN w.state = 'running' AND w.remaining = 1
                      THEN CAST(%(result)s AS JSONB) ELSE w.result END,
        finished_at = CASE WHEN w.state = 'running' AND w.remaining = 1
                           THEN clock_timestamp() ELSE w.finished_at END
    FROM done WHERE w.id = %(workflow_id)s
    RETURNING w.state, w.remaining, w.name
), released AS (
    UPDATE {STEPS_TABLE} d
    SET waiting = d.waiting - 1,
        state = CASE WHEN d.waiting = 1 THEN 'queued' ELSE d.state END,
        input = CASE
            WHEN d.waiting <> 1 THEN d.input
            WHEN COALESCE((d.signature ->> 'immutable')::boolean, false)
                THEN d.signature -> 'args'
            WHEN jsonb_typeof(d.signature -> 'source') = 'number'
                THEN jsonb_build_array(CAST(%(result)s AS JSONB)) || (d.signature -> 'args')
            ELSE jsonb_build_array((
                SELECT jsonb_agg(CASE WHEN s.position = %(position)s
                                      THEN CAST(%(result)s AS JSONB) ELSE s.result END
                                 ORDER BY e.ordinal)
                FROM jsonb_array_elements_text(d.signature -> 'source')
                     WITH ORDINALITY AS e(position, ordinal)
                JOIN {STEPS_TABLE} s ON s.workflow_id = %(workflow_id)s
                                    AND s.position = e.position::int
            )) || (d.signature -> 'args')
        END
    FROM done, workflow
    WHERE d.workflow_id = %(workflow_id)s AND d.position = ANY(done.dependents)
      AND d.state = 'pending' AND workflow.state = 'running'
    RETURNING d.position, d.waiting, d.task_id, d.task_name, d.signature, d.input
), queued AS (
    INSERT INTO {OUTBOX_TABLE} (task_id, task_name, args, kwargs, options, due_at)
    SELECT r.task_id, r.task_name, r.input, COALESCE(r.signature -> 'kwargs', '{{}}'),
           jsonb_set(COALESCE(r.signature -> 'options', '{{}}'), '{{headers}}',
                     COALESCE(r.signature -> 'options' -> 'headers', '{{}}')
                     || jsonb_build_object(CAST(%(header)s AS TEXT),
                                           CAST(%(workflow_id)s AS TEXT) || ':' || r.position
                                           || COALESCE(':' || (r.signature ->> 'run'), ''))),
           clock_timestamp() + make_interval(secs => %(hold_seconds)s)
    FROM released r WHERE r.waiting = 0
    RETURNING id, task_id, task_name, args, kwargs, options
)
SELECT (SELECT state FROM workflow) AS state, (SELECT remaining FROM workflow) AS remaining,
       (SELECT name FROM workflow) AS name, (SELECT json_agg(queued) FROM queued) AS queued
"""
_SUCCEED_SIMPLE = PreparedStatement("resilience_workflow_succeed",
                                    _RUNNING + _DEPS + _DONE + _DEPS_CHECK + _RELEASE)
# The same for a step whose dependents each wait for it alone (a chain step, a group's
# member feeding one step each; `Started.fan_in` false): no dependent is counted by
# anyone else, so the workflow row's lock is all it needs. A tenth of its server CPU less.
_SUCCEED_CHAIN = PreparedStatement("resilience_workflow_succeed_chain",
                                   _RUNNING + _DONE + _RELEASE)

# Sent before `_SUCCEED_SIMPLE` in its query string for a fan-in member (`fan_in`): the
# workflow row locked by a statement of its own, so that `_SUCCEED_SIMPLE`'s snapshot is
# taken once it is held. Every completion that counts a dependent (`_SUCCEED_SIMPLE`,
# `_SUCCEED`'s transaction, a failure's) does it holding that lock, so each one that
# counted before this one has committed, its result with it. Prepared like the others:
# parsed and planned at every member, it cost a fifth of the member's PostgreSQL CPU.
_LOCK_FIRST = PreparedStatement("resilience_workflow_lock", f"""
SELECT 1 FROM {WORKFLOWS_TABLE} WHERE id = %(workflow_id)s FOR UPDATE
""")

# One round trip for a chain step: the step leaves its live state once; its dependents
# (only while the workflow runs) count it, and one that needs only this step's result gets
# its input here. Data-modifying CTEs all run, each seeing the statement's snapshot, so
# fan-in inputs are read in a later statement.
_SUCCEED = text(f"""
WITH done AS (
    UPDATE {STEPS_TABLE}
    SET state = :state, result = CAST(:result AS JSONB), error = NULL,
        finished_at = clock_timestamp(), completed_seq = nextval('{COMPLETED_SEQUENCE}')
    WHERE workflow_id = :workflow_id AND position = :position
      AND state IN ('pending', 'queued')
      AND (CAST(:run AS INT) IS NULL OR COALESCE((signature ->> 'run')::int, 0) = :run)
    RETURNING position, dependents
), workflow AS (
    UPDATE {WORKFLOWS_TABLE} w SET remaining = w.remaining - 1
    FROM done WHERE w.id = :workflow_id
    RETURNING w.state, w.remaining, w.canvas -> 'result' AS template
), released AS (
    UPDATE {STEPS_TABLE} d
    SET waiting = d.waiting - 1,
        state = CASE WHEN d.waiting = 1 THEN 'queued' ELSE d.state END,
        input = CASE
            WHEN d.waiting <> 1 OR jsonb_typeof(d.signature -> 'source') <> 'number'
                THEN d.input
            WHEN COALESCE((d.signature ->> 'immutable')::boolean, false)
                THEN d.signature -> 'args'
            ELSE jsonb_build_array(CAST(:result AS JSONB)) || (d.signature -> 'args')
        END
    FROM done, workflow
    WHERE d.workflow_id = :workflow_id AND d.state = 'pending'
      AND d.position = ANY(done.dependents) AND workflow.state = 'running'
    RETURNING d.position, d.waiting, d.task_id, d.task_name, d.signature, d.input
)
SELECT (SELECT row_to_json(workflow) FROM workflow) AS workflow,
       (SELECT json_agg(released) FROM released) AS released
""")

_RESULTS = text(f"""
SELECT position, result, state FROM {STEPS_TABLE}
WHERE workflow_id = :workflow_id AND position = ANY(:positions)
""")

_SET_INPUT = text(f"""
UPDATE {STEPS_TABLE} SET input = CAST(:input AS JSONB)
WHERE workflow_id = :workflow_id AND position = :position
""")

# Nothing remains: succeeded, or failed when a batch member did not succeed (a member's
# failure leaves its workflow running, `WorkflowBackend.fail`).
_FINISH = text(f"""
WITH failed AS (
    SELECT position, COALESCE(error, state) AS error FROM {STEPS_TABLE}
    WHERE workflow_id = :workflow_id AND state NOT IN ('succeeded', 'replayed')
    ORDER BY position LIMIT 1
)
UPDATE {WORKFLOWS_TABLE}
SET state = CASE WHEN (SELECT position FROM failed) IS NULL THEN 'succeeded' ELSE 'failed' END,
    result = CAST(:result AS JSONB), finished_at = clock_timestamp(),
    failed_position = (SELECT position FROM failed), error = (SELECT error FROM failed)
WHERE id = :workflow_id AND state = 'running' AND remaining = 0
RETURNING state, name
""")


# A batch member is found by its task id (its messages carry only the batch id); a final
# one is left as it is (nothing to start: its delivery runs as a plain job).
_START_MEMBER = text(f"""
UPDATE {STEPS_TABLE} s SET started_at = COALESCE(s.started_at, clock_timestamp())
FROM {WORKFLOWS_TABLE} w
WHERE s.task_id = :task_id AND s.workflow_id = :workflow_id AND w.id = s.workflow_id
  AND s.state IN ('pending', 'queued')
RETURNING s.position, s.state, s.result, s.compensation_state, w.state AS workflow_state
""")

_FIND_TASK = text(f"""
SELECT workflow_id, position FROM {STEPS_TABLE}
WHERE task_id = :task_id AND (CAST(:workflow_id AS TEXT) IS NULL OR workflow_id = :workflow_id)
""")

# The pending dependents of steps that ended without success while the workflow runs on:
# one released when its dependencies "succeeded" never runs (skipped); one released when
# they are "final" counts them.
_SETTLE_DEPENDENTS = text(f"""
WITH counted AS (
    SELECT dependent AS position, count(*) AS n FROM {STEPS_TABLE} e,
           unnest(e.dependents) AS dependent
    WHERE e.workflow_id = :workflow_id AND e.position = ANY(:positions)
    GROUP BY dependent
)
UPDATE {STEPS_TABLE} d
SET waiting = d.waiting - counted.n,
    state = CASE WHEN d.release = 'succeeded' THEN 'skipped'
                 WHEN d.waiting = counted.n THEN 'queued' ELSE d.state END,
    finished_at = CASE WHEN d.release = 'succeeded' THEN clock_timestamp() END
FROM counted
WHERE d.workflow_id = :workflow_id AND d.position = counted.position AND d.state = 'pending'
RETURNING d.position, d.state, d.task_id, d.task_name, d.signature
""")

_TAKE_REMAINING = text(f"""
UPDATE {WORKFLOWS_TABLE} SET remaining = remaining - :n WHERE id = :workflow_id
RETURNING remaining, canvas -> 'result' AS template
""")

_LOCK_WORKFLOW = text(f"""
SELECT state, error, failed_position FROM {WORKFLOWS_TABLE} WHERE id = :workflow_id
FOR UPDATE
""")

_FAIL_STEP = text(f"""
UPDATE {STEPS_TABLE}
SET state = :state, error = :error, finished_at = clock_timestamp()
WHERE workflow_id = :workflow_id AND position = :position AND state IN ('pending', 'queued')
  AND (CAST(:run AS INT) IS NULL OR COALESCE((signature ->> 'run')::int, 0) = :run)
RETURNING position, COALESCE((signature ->> 'member')::boolean, false) AS member
""")

_STOP_WORKFLOW = text(f"""
UPDATE {WORKFLOWS_TABLE}
SET state = :state, error = :error, failed_position = :position,
    finished_at = clock_timestamp()
WHERE id = :workflow_id AND state = 'running'
RETURNING id, name
""")

_SKIP_PENDING = text(f"""
UPDATE {STEPS_TABLE} SET state = 'skipped', finished_at = clock_timestamp()
WHERE workflow_id = :workflow_id AND state = 'pending'
""")

_QUEUED_TASKS = text(f"""
SELECT task_id FROM {STEPS_TABLE} WHERE workflow_id = :workflow_id AND state = 'queued'
""")

_NEXT_COMPENSATION = text(f"""
UPDATE {STEPS_TABLE} s SET compensation_state = 'queued'
FROM (
    SELECT position FROM {STEPS_TABLE}
    WHERE workflow_id = :workflow_id AND state IN ('succeeded', 'replayed')
      AND compensate IS NOT NULL AND compensation_state IS NULL
      AND NOT EXISTS (SELECT 1 FROM {STEPS_TABLE}
                      WHERE workflow_id = :workflow_id
                        AND (compensation_state = 'queued' OR state = 'queued'))
    ORDER BY completed_seq DESC LIMIT 1
) AS next
WHERE s.workflow_id = :workflow_id AND s.position = next.position
RETURNING s.position, s.result, s.compensate, s.compensation_task_id,
          COALESCE((s.signature ->> 'run')::int, 0) AS run
""")

_COMPENSATION_TALLY = text(f"""
SELECT count(*) FILTER (WHERE compensation_state = 'queued' OR state = 'queued') AS busy,
       count(*) FILTER (WHERE compensation_state IS NOT NULL
                        AND compensation_state NOT IN ('queued', 'succeeded', 'replayed'))
           AS failed,
       count(*) FILTER (WHERE compensation_state IS NOT NULL) AS ran
FROM {STEPS_TABLE} WHERE workflow_id = :workflow_id
""")

_SET_WORKFLOW_STATE = text(f"""
UPDATE {WORKFLOWS_TABLE}
SET state = :state, finished_at = clock_timestamp(), error = COALESCE(:error, error)
WHERE id = :workflow_id
RETURNING name
""")

_COMPENSATED = text(f"""
UPDATE {STEPS_TABLE}
SET compensation_state = :state, compensation_error = :error
WHERE workflow_id = :workflow_id AND position = :position AND compensation_state = 'queued'
RETURNING position
""")

_STEPS = text(f"""
SELECT position, kind, task_id, task_name, signature, depends_on, waiting, input, state,
       result, error, compensate, compensation_task_id, compensation_state,
       compensation_error, started_at, finished_at, completed_seq
FROM {STEPS_TABLE} WHERE workflow_id = :workflow_id ORDER BY position
""")

_WORKFLOW_COLUMNS = f"""
w.id, w.name, w.state, w.total, w.remaining, w.result, w.error, w.failed_position,
w.created_at, w.finished_at, w.replay_of,
COALESCE((SELECT jsonb_object_agg(t.state, t.n) FROM (
    SELECT s.state, count(*) AS n FROM {STEPS_TABLE} s
    WHERE s.workflow_id = w.id GROUP BY s.state
) t), CAST('{{}}' AS JSONB)) AS counts
"""

_WORKFLOW = text(f"""
SELECT {_WORKFLOW_COLUMNS}, w.canvas FROM {WORKFLOWS_TABLE} w WHERE w.id = :id
""")

_STATE = text(f"""
SELECT state, result, error, failed_position FROM {WORKFLOWS_TABLE} WHERE id = :id
""")

# The list never reads a run's canvas (a batch's is as long as its members).
_RECENT = text(f"""
SELECT {_WORKFLOW_COLUMNS} FROM {WORKFLOWS_TABLE} w
WHERE CAST(:state AS TEXT) IS NULL OR w.state = CAST(:state AS TEXT)
ORDER BY w.created_at DESC, w.id LIMIT :limit
""")

_RESET_STEP = text(f"""
UPDATE {STEPS_TABLE}
SET state = :state, waiting = :waiting, input = CAST(:input AS JSONB), task_id = :task_id,
    signature = CAST(:signature AS JSONB),
    result = NULL, error = NULL, started_at = NULL, finished_at = NULL,
    completed_seq = NULL, compensation_state = NULL, compensation_error = NULL,
    compensation_task_id = CASE WHEN compensate IS NULL THEN NULL ELSE :compensation_task_id
                           END
WHERE workflow_id = :workflow_id AND position = :position
""")

_RESUME_WORKFLOW = text(f"""
UPDATE {WORKFLOWS_TABLE}
SET state = 'running', remaining = :remaining, result = NULL, error = NULL,
    failed_position = NULL, finished_at = NULL
WHERE id = :workflow_id
""")


def _locked_first(workflow_id: str, prepared: bool) -> Prefix:
    """A `Prefix`: `_LOCK_FIRST` for the step, after the synchronous-commit one. Prepared
    (unless `prepared` is off) by a round trip of its own on the connection's first use:
    a PREPARE in the shared query string would outlive that string's failure. Its errors
    are the runner's to handle (a closed connection is replaced)."""
    def prefix(connection: HeldConnection) -> tuple[str, None]:
        commit, _ = synchronous_commit(connection)
        if prepared and _LOCK_FIRST.name not in connection.prepared:
            if connection.cursor is None:
                connection.cursor = connection.driver.cursor()
            connection.cursor.execute(_LOCK_FIRST.prepare)
            connection.prepared.add(_LOCK_FIRST.name)
        # Its EXECUTE once prepared on the session, else its SQL (unprepared behind a pooler).
        return commit + connection.render(_LOCK_FIRST, {"workflow_id": workflow_id}), None

    return prefix


def dumps(value: Any) -> str:
    """JSON as Celery's JSON carries it (kombu's encoder: UUID, datetime, Decimal tagged)."""
    return json.dumps(value, cls=JSONEncoder)


def step_header(workflow_id: str, position: int, compensation: bool = False,
                run: int = 0) -> str:
    """The `resilience_workflow_step` header of a step (or of its compensation); `run`:
    the step's run counter (0 the first, n after an operator's n-th retry of it)."""
    return (f"{workflow_id}:{position}" + (f":{COMPENSATION}" if compensation else "")
            + (f":{run}" if run else ""))


@dataclass
class Released:
    """What one transaction released: outbox rows to publish after the commit, and what
    became of the workflow (for metrics and logs)."""

    rows: list[OutboxRow] = field(default_factory=list)
    recorded: bool = False
    workflow_state: str | None = None
    finished: str | None = None  # the workflow's final state, when this transaction set it
    name: str | None = None  # the workflow's name, with `finished` (its counters' label)
    cancel: list[str] = field(default_factory=list)  # task ids to cancel after the commit

    def extend(self, other: Released) -> None:
        self.rows.extend(other.rows)
        self.cancel.extend(other.cancel)
        if other.finished:
            self.finished, self.name = other.finished, other.name


@dataclass(frozen=True)
class Started:
    """A step's state as its execution found it (`WorkflowBackend.start`)."""

    state: str
    result: Any
    compensation_state: str | None
    workflow_state: str
    #: Its completion can be recorded in one statement (`succeed(simple=True)`).
    simple: bool = False
    #: A dependent of it has several sources (`succeed(fan_in=True)`: locks first).
    fan_in: bool = False
    #: Its run counter (`step_header`): a delivery of an earlier run is stale.
    run: int = 0


class WorkflowBackend(StoreBackend):
    """Workflows in PostgreSQL (tables `resilience_workflows`, `resilience_workflow_steps`).

    Args:
        engine: a callable returning the engine (the stores' guard engine).
        hold_seconds: how long a released step's outbox row waits for the relay.
    """

    store_operation = "workflows"

    def __init__(self, engine: Callable[[], Engine], runner: StatementRunner | None = None, *,
                 prepared: bool = True, hold_seconds: float = DEFAULT_HOLD_SECONDS) -> None:
        self.engine = engine
        self.runner = runner
        self.prepared = prepared
        self.hold_seconds = hold_seconds
        self.outbox = PostgresOutboxBackend(engine, runner=runner, prepared=prepared)

    def _run(self, statement: PreparedStatement, parameters: dict[str, Any],
             action: str, *, asynchronous: bool = False) -> Any:
        """One autocommit statement on this thread's held connection (one round trip);
        `asynchronous`: it commits without waiting for its WAL flush."""
        if self.runner is None:
            sql = re.sub(r"%\((\w+)\)s", r":\1", statement.sql)
            with self.engine().begin() as connection:
                result = connection.execute(text(sql), parameters)
                return [Row(row._mapping) for row in result] if result.returns_rows else []
        # Takes leads: a continuation's publish mark rides on the next step's statement.
        return self.runner.run(statement, parameters, f"workflows: {action}",
                               prepared=self.prepared, lead=True,
                               prefix=asynchronous_commit if asynchronous else synchronous_commit)

    @contextmanager
    def transaction(self, connection: Any = None) -> Iterator[Any]:
        """`connection` as it is (the caller commits), or a short transaction of its own."""
        if connection is not None:
            yield connection
            return
        with self.engine().begin() as own:
            yield own

    # -- producer side ---------------------------------------------------------------------
    def create(self, connection: Any, *, workflow_id: str, name: str | None,
               canvas: dict[str, Any], steps: list[StepSpec], done: dict[int, Any] | None = None,
               replay_of: str | None = None, hold: bool = True) -> Released:
        """Write a workflow, its steps and the outbox rows of its first steps in the
        transaction of `connection`. `done`: results of steps copied as succeeded (a replay).

        Raises:
            StoreUnavailable / StoreRejected / StorageError: nothing was written.
        """
        done = done or {}
        rows_of_steps = []
        ready: list[tuple[StepSpec, list[Any]]] = []
        for step in steps:
            deps = step.depends_on
            if step.position in done:
                state, waiting, arguments = StepState.SUCCEEDED, 0, None
            else:
                waiting = sum(1 for dep in deps if dep not in done)
                state = StepState.QUEUED if waiting == 0 else StepState.PENDING
                arguments = (input_args(step.signature(), done) if waiting == 0 else None)
                if waiting == 0 and not step.member:  # a member's row is the caller's
                    ready.append((step, arguments))
            rows_of_steps.append({
                "position": step.position, "kind": step.kind, "release": step.release,
                "task_id": step.task_id,
                "task_name": step.task_name, "signature": step.signature(),
                "depends_on": deps, "dependents": step.dependents, "waiting": waiting,
                "input": arguments,
                "state": state.value, "result": done.get(step.position),
                "compensate": step.compensate,
                "compensation_task_id": step.compensation_task_id,
            })
        with wrap_store_errors("workflows: create", workflow=workflow_id), \
                self.transaction(connection) as session:
            session.execute(_INSERT_WORKFLOW, {
                "id": workflow_id, "name": name, "canvas": dumps(canvas),
                "total": len(steps), "remaining": len(steps) - len(done),
                "replay_of": replay_of,
            })
            session.execute(_INSERT_STEPS, {"workflow_id": workflow_id,
                                            "steps": dumps(rows_of_steps)})
            released = self._queue(session, workflow_id,
                                    [(s.position, s.task_id, s.task_name, s.signature(), a)
                                     for s, a in ready], hold=hold)
            if not steps or len(done) == len(steps):
                released.extend(self._finish(session, workflow_id, canvas.get("result"),
                                             dict(done)))
        return released

    def _queue(self, session: Any, workflow_id: str,
               ready: list[tuple[int, str, str, dict[str, Any], list[Any]]],
               hold: bool = True) -> Released:
        """The outbox rows of steps whose input is known, in `session`'s transaction."""
        rows = [self._new_row(workflow_id, position, task_id, task_name, signature, arguments)
                for position, task_id, task_name, signature, arguments in ready]
        return self._write_rows(session, rows, hold)

    def _write_rows(self, session: Any, rows: list[NewRow], hold: bool) -> Released:
        if not rows:
            return Released()
        if not hold:
            for row in rows:
                self.outbox.insert(session, row)
            return Released()
        ids = self.outbox.insert_held(session, rows, hold_seconds=self.hold_seconds)
        return Released(rows=[
            OutboxRow(id=row_id, task_id=row.task_id, task_name=row.task_name,
                      args=list(row.args), kwargs=dict(row.kwargs), options=dict(row.options),
                      ordering_key=None, attempts=0, due_in_seconds=0.0)
            for row_id, row in zip(ids, rows, strict=True)])

    @staticmethod
    def _new_row(workflow_id: str, position: int, task_id: str, task_name: str,
                 signature: dict[str, Any], arguments: list[Any],
                 compensation: bool = False, run: int | None = None) -> NewRow:
        """`run`: the step's run counter (default: its signature's)."""
        options = dict(signature.get("options") or {})
        headers = dict(options.pop("headers", None) or {})
        headers[WORKFLOW_STEP_HEADER] = step_header(
            workflow_id, position, compensation,
            int(signature.get("run") or 0) if run is None else run)
        options["headers"] = headers
        for name in ("countdown", "eta", "task_id"):
            options.pop(name, None)
        # Within the caller's trace (the producer's, or the step's that released it) when a
        # span records; the fast path publishes inside that span anyway.
        options = with_trace_context(options)
        return NewRow(task_id=task_id, task_name=task_name, args=list(arguments),
                      kwargs=dict(signature.get("kwargs") or {}), options=options)

    # -- worker side -----------------------------------------------------------------------
    def start(self, workflow_id: str, position: int) -> Started | None:
        """Mark the step started; its state, result and its workflow's state (one round
        trip). None when no such step exists (the workflow was deleted).

        Raises:
            StoreUnavailable / StoreRejected / StorageError.
        """
        # Asynchronous commit: a crash may lose this write, which only loses `started_at`
        # (a redelivery starts the step again and sets it). Its success record, the release
        # of its dependents and every failure/compensation record stay synchronous.
        rows = self._run(_START, {"workflow_id": workflow_id, "position": position},
                         "start step", asynchronous=True)
        if not rows:
            return None
        row = rows[0]
        return Started(state=row.state, result=row.result,
                       compensation_state=row.compensation_state,
                       workflow_state=row.workflow_state, simple=bool(row.simple),
                       fan_in=bool(row.fan_in), run=int(row.run))

    def start_member(self, batch_id: str, task_id: str) -> tuple[int, Started] | None:
        """`start` for a batch member, found by its task id: its position and state; None
        when it is final already (or no member)."""
        with wrap_store_errors("workflows: start member", workflow=batch_id), \
                self.engine().begin() as connection:
            row = connection.execute(_START_MEMBER, {"workflow_id": batch_id,
                                                     "task_id": task_id}).first()
        if row is None:
            return None
        return int(row.position), Started(state=row.state, result=row.result,
                                          compensation_state=row.compensation_state,
                                          workflow_state=row.workflow_state)

    def record(self, connection: Any, *, task_id: str, state: StepState,
               workflow_id: str | None = None, error: str | None = None) -> Released:
        """Give the step of `task_id` its final state (`succeed` with no result, or
        `fail`): outcomes no guard saw (`resilience.workflows.signals`).

        Raises:
            StoreUnavailable / StoreRejected / StorageError: nothing was recorded.
        """
        state = StepState(state)
        with wrap_store_errors("workflows: record task", task_id=task_id), \
                self.transaction(connection) as session:
            found = session.execute(_FIND_TASK, {"task_id": task_id,
                                                 "workflow_id": workflow_id}).first()
            if found is None:
                return Released()
            if state in SUCCESS_STATES:
                return self.succeed(session, found.workflow_id, found.position, None,
                                    state=state)
            return self.fail(session, found.workflow_id, found.position, state,
                             error or state.value)

    def succeed(self, connection: Any, workflow_id: str, position: int, result: Any, *,
                state: StepState = StepState.SUCCEEDED, simple: bool = False,
                fan_in: bool = False, run: int | None = None) -> Released:
        """Record the step succeeded (or replayed) with `result` and release what it
        completes, in `connection`'s transaction (None: one of its own; with `simple`, a
        step `Started.simple` said is, and its `run`, one autocommit statement; with `fan_in` as
        `Started.fan_in` says, that statement also releases a chord body). With `run`,
        only that run of the step records: a body of an earlier run that ends after the
        step was retried records nothing.

        Raises:
            NonJsonArguments: `result` cannot be stored (nothing was written).
            StoreUnavailable / StoreRejected / StorageError: nothing was recorded.
        """
        result_json = dumps(result)
        if connection is None and simple and run is not None:
            return self._succeed_simple(workflow_id, position, result_json, state, fan_in,
                                        run)
        with wrap_store_errors("workflows: record step", workflow=workflow_id,
                               position=position), self.transaction(connection) as session:
            row = session.execute(_SUCCEED, {
                "workflow_id": workflow_id, "position": position, "state": state.value,
                "result": result_json, "run": run,
            }).one()
            workflow = row.workflow
            if workflow is None:
                return Released()  # final already: a duplicate or a redelivery
            released = Released(recorded=True, workflow_state=workflow["state"])
            results = {position: json.loads(result_json)}
            if workflow["state"] != WorkflowState.RUNNING:
                # A step that was in flight when the workflow stopped: compensations wait
                # for it, and undo it first if it has a compensation.
                released.extend(self._advance_compensation(session, workflow_id))
                return released
            ready = []
            for step in row.released or ():
                if step["waiting"] != 0:
                    continue
                arguments = step["input"]
                if arguments is None:
                    arguments = self._fan_in(session, workflow_id, step, results)
                ready.append((step["position"], step["task_id"], step["task_name"],
                              step["signature"], arguments))
            released.extend(self._queue(session, workflow_id, ready))
            if workflow["remaining"] == 0:
                released.extend(self._finish(session, workflow_id, workflow["template"],
                                             results))
        return released

    def _succeed_simple(self, workflow_id: str, position: int, result_json: str,
                        state: StepState, fan_in: bool, run: int) -> Released:
        parameters = {
            "workflow_id": workflow_id, "position": position, "state": state.value,
            "result": result_json, "header": WORKFLOW_STEP_HEADER,
            "hold_seconds": float(self.hold_seconds), "fan_in": fan_in, "run": run,
        }
        if not fan_in:
            del parameters["fan_in"]
            row = self._run(_SUCCEED_CHAIN, parameters, "record step")[0]
        elif self.runner is not None:
            row = self.runner.run(_SUCCEED_SIMPLE, parameters, "workflows: record step",
                                  prepared=self.prepared, lead=True,
                                  prefix=_locked_first(workflow_id, self.prepared))[0]
        else:
            parameters["fan_in"] = False  # no locks taken first: the transaction releases it
            row = self._run(_SUCCEED_SIMPLE, parameters, "record step")[0]
        if row.state is None:
            # Not recorded: final already (a duplicate), its workflow stopped (the
            # transaction records it and queues the next compensation at once), or it is
            # the last source of a fan-in (the transaction computes its input).
            return self.succeed(None, workflow_id, position, json.loads(result_json),
                                state=state, run=run)
        released = Released(recorded=True, workflow_state=row.state, rows=[
            OutboxRow(id=int(q["id"]), task_id=q["task_id"], task_name=q["task_name"],
                      args=list(q["args"] or ()), kwargs=dict(q["kwargs"] or {}),
                      options=dict(q["options"] or {}), ordering_key=None, attempts=0,
                      due_in_seconds=0.0)
            for q in row.queued or ()])
        if row.state == WorkflowState.SUCCEEDED and row.remaining == 0:
            released.finished, released.name = WorkflowState.SUCCEEDED, row.name
        return released

    def _fan_in(self, session: Any, workflow_id: str, step: dict[str, Any],
                results: dict[int, Any]) -> list[Any]:
        """The input of a released step with several sources, stored on its row."""
        states: dict[int, str] = {}
        self._read_results(session, workflow_id, positions(step["signature"].get("source")),
                           results, states)
        arguments = input_args(step["signature"], results, states)
        session.execute(_SET_INPUT, {"workflow_id": workflow_id, "position": step["position"],
                                     "input": dumps(arguments)})
        return arguments

    @staticmethod
    def _read_results(session: Any, workflow_id: str, wanted: list[int],
                      results: dict[int, Any], states: dict[int, str] | None = None) -> None:
        """Fill `results` (and, when given, `states`: every wanted position's)."""
        missing = [p for p in wanted if p not in results or states is not None]
        if missing:
            for found in session.execute(_RESULTS, {"workflow_id": workflow_id,
                                                    "positions": missing}):
                results[int(found.position)] = found.result
                if states is not None:
                    states[int(found.position)] = found.state

    def _finish(self, session: Any, workflow_id: str, template: Template,
                results: dict[int, Any]) -> Released:
        self._read_results(session, workflow_id, positions(template), results)
        done = session.execute(_FINISH, {"workflow_id": workflow_id,
                                         "result": dumps(resolve(template, results))}).first()
        return Released(finished=WorkflowState(done.state) if done else None,
                        name=done.name if done else None)

    def fail(self, connection: Any, workflow_id: str, position: int, state: StepState,
             error: str | None, *, run: int | None = None) -> Released:
        """Record the step's final failure (failed, dead_lettered, cancelled, shed,
        skipped): its workflow fails (cancelled for a cancelled step), pending steps are
        skipped and the first compensation is queued. A batch member's failure ends only
        itself: its dependents settle by their release condition (`_settle`). With `run`,
        only that run of the step records (see `succeed`).

        Raises:
            StoreUnavailable / StoreRejected / StorageError: nothing was recorded.
        """
        with wrap_store_errors("workflows: record step", workflow=workflow_id,
                               position=position), self.transaction(connection) as session:
            if session.execute(_LOCK_WORKFLOW, {"workflow_id": workflow_id}).first() is None:
                return Released()
            failed = session.execute(_FAIL_STEP, {
                "workflow_id": workflow_id, "position": position, "state": state.value,
                "error": error, "run": run}).first()
            if failed is None:
                return Released()
            if failed.member:
                released = Released(recorded=True)
                released.extend(self._settle(session, workflow_id, [position]))
                return released
            stopped = (WorkflowState.CANCELLED if state is StepState.CANCELLED
                       else WorkflowState.FAILED)
            released = Released(recorded=True)
            released.extend(self._stop(session, workflow_id, stopped, error, position))
        return released

    def _settle(self, session: Any, workflow_id: str, ended: list[int]) -> Released:
        """Steps `ended` without success and the workflow runs on: their dependents settle
        by their release condition, transitively (`_SETTLE_DEPENDENTS`); the released ones
        are queued, and the workflow finishes when nothing remains. Workflow row locked."""
        released, settled, results = Released(), 0, {}
        while ended:
            settled += len(ended)
            ready, skipped = [], []
            for step in session.execute(_SETTLE_DEPENDENTS, {"workflow_id": workflow_id,
                                                              "positions": ended}):
                if step.state == StepState.SKIPPED:
                    skipped.append(int(step.position))
                elif step.state == StepState.QUEUED:
                    arguments = self._fan_in(session, workflow_id, {
                        "position": step.position, "signature": step.signature}, results)
                    ready.append((step.position, step.task_id, step.task_name,
                                  step.signature, arguments))
            released.extend(self._queue(session, workflow_id, ready))
            ended = skipped
        workflow = session.execute(_TAKE_REMAINING, {"workflow_id": workflow_id,
                                                     "n": settled}).one()
        if workflow.remaining == 0:
            released.extend(self._finish(session, workflow_id, workflow.template, results))
        return released

    def _stop(self, session: Any, workflow_id: str, state: WorkflowState, error: str | None,
              position: int | None, hold: bool = True) -> Released:
        """A running workflow fails or is cancelled (workflow row locked by the caller)."""
        released = Released()
        stopped = session.execute(_STOP_WORKFLOW, {
            "workflow_id": workflow_id, "state": state.value, "error": error,
            "position": position}).first()
        if stopped:
            released.finished, released.name = state, stopped.name
            session.execute(_SKIP_PENDING, {"workflow_id": workflow_id})
            if state is WorkflowState.CANCELLED:
                released.cancel = list(session.execute(
                    _QUEUED_TASKS, {"workflow_id": workflow_id}).scalars())
        released.extend(self._advance_compensation(session, workflow_id, hold))
        return released

    def _advance_compensation(self, session: Any, workflow_id: str,
                              hold: bool = True) -> Released:
        """Queue the next compensation (reverse completion order) unless one is queued or
        a step is still in flight (it may succeed and need undoing first); when none is
        left, settle the workflow's state. Workflow row locked by the caller."""
        found = session.execute(_NEXT_COMPENSATION, {"workflow_id": workflow_id}).first()
        current = session.execute(_STATE, {"id": workflow_id}).one()
        if found is not None:
            signature = found.compensate
            arguments = list(signature.get("args") or ())
            if not signature.get("immutable"):
                arguments = [found.result, *arguments]
            row = self._new_row(workflow_id, found.position, found.compensation_task_id,
                                signature["task"], signature, arguments, compensation=True,
                                run=int(found.run))
            if current.state == WorkflowState.FAILED:
                session.execute(_SET_WORKFLOW_STATE, {
                    "workflow_id": workflow_id, "state": WorkflowState.COMPENSATING.value,
                    "error": None})
            return self._write_rows(session, [row], hold)
        tally = session.execute(_COMPENSATION_TALLY, {"workflow_id": workflow_id}).one()
        if tally.busy == 0 and current.state == WorkflowState.COMPENSATING:
            settled = WorkflowState.FAILED if tally.failed else WorkflowState.COMPENSATED
            name = session.execute(_SET_WORKFLOW_STATE, {
                "workflow_id": workflow_id, "state": settled.value,
                "error": None}).scalar()
            return Released(finished=settled, name=name)
        return Released()

    def compensated(self, connection: Any, workflow_id: str, position: int, state: StepState,
                    error: str | None = None) -> Released:
        """Record a compensation's final state and queue the next one.

        Raises:
            StoreUnavailable / StoreRejected / StorageError: nothing was recorded.
        """
        with wrap_store_errors("workflows: record compensation", workflow=workflow_id,
                               position=position), self.transaction(connection) as session:
            if session.execute(_LOCK_WORKFLOW, {"workflow_id": workflow_id}).first() is None:
                return Released()
            if session.execute(_COMPENSATED, {"workflow_id": workflow_id, "position": position,
                                              "state": state.value, "error": error}).first() \
                    is None:
                return Released()
            released = Released(recorded=True)
            released.extend(self._advance_compensation(session, workflow_id))
        return released

    # -- operator side ---------------------------------------------------------------------
    def cancel(self, workflow_id: str) -> Released:
        """Cancel a running workflow: pending steps skipped, queued ones to be cancelled
        (`Released.cancel`), compensations of succeeded steps queued.

        Raises:
            WorkflowNotFound.
        """
        with wrap_store_errors("workflows: cancel", workflow=workflow_id), \
                self.transaction() as session:
            if session.execute(_LOCK_WORKFLOW, {"workflow_id": workflow_id}).first() is None:
                raise WorkflowNotFound(f"no workflow {workflow_id!r}", workflow_id=workflow_id)
            return self._stop(session, workflow_id, WorkflowState.CANCELLED,
                              "cancelled by an operator", None, hold=False)

    def restart(self, workflow_id: str, from_step: int | None) -> Released:
        """`retry`: step `from_step` (default: the failed one), every step that did not
        succeed, and their transitive dependents go back to pending with new task ids and
        their run counter raised (`step_header`); ready ones are queued with their input.
        A step that depends on none of them keeps its result and does not run again.

        Raises:
            WorkflowNotFound, WorkflowNotRetryable.
        """
        with wrap_store_errors("workflows: retry", workflow=workflow_id), \
                self.transaction() as session:
            locked = session.execute(_LOCK_WORKFLOW, {"workflow_id": workflow_id}).first()
            if locked is None:
                raise WorkflowNotFound(f"no workflow {workflow_id!r}", workflow_id=workflow_id)
            if locked.state in (WorkflowState.RUNNING, WorkflowState.COMPENSATING):
                raise WorkflowNotRetryable(
                    f"workflow {workflow_id} is {locked.state}; retry it once it stopped",
                    workflow_id=workflow_id, state=locked.state)
            steps = list(session.execute(_STEPS, {"workflow_id": workflow_id}))
            self._refuse_batch(workflow_id, steps)
            start = from_step
            if start is None:
                failed = [s.position for s in steps
                          if s.state not in SUCCESS_STATES and s.state != StepState.PENDING]
                start = min(failed) if failed else locked.failed_position
            if start is None:
                raise WorkflowNotRetryable(f"workflow {workflow_id} has no failed step; name "
                                           "one with from_step", workflow_id=workflow_id)
            self._check_position(workflow_id, start, len(steps))
            rerun = downstream(steps, [start, *(s.position for s in steps
                                               if s.state not in SUCCESS_STATES)])
            undone = [s.position for s in steps if s.position not in rerun
                      and s.compensation_state is not None]
            if undone:
                raise WorkflowNotRetryable(
                    f"step {undone[0]} of workflow {workflow_id} was compensated; replay it "
                    "from that step instead", workflow_id=workflow_id, step=undone[0])
            kept = {s.position: s.result for s in steps if s.position not in rerun}
            return self._rewind(session, workflow_id, steps, kept)

    def _rewind(self, session: Any, workflow_id: str, steps: list[Any],
                kept: dict[int, Any]) -> Released:
        """Every step not in `kept` back to pending (queued when its sources are kept)."""
        ready = []
        for step in steps:
            if step.position in kept:
                continue
            sources = list(step.depends_on or ())
            waiting = sum(1 for dep in sources if dep not in kept)
            arguments = None
            if waiting == 0:
                arguments = (step.input if step.input is not None and step.state != "pending"
                             else input_args(step.signature, dict(kept)))
            task_id = str(uuid.uuid4())
            signature = {**step.signature, "run": int(step.signature.get("run") or 0) + 1}
            session.execute(_RESET_STEP, {
                "workflow_id": workflow_id, "position": step.position,
                "signature": dumps(signature),
                "state": (StepState.QUEUED if waiting == 0 else StepState.PENDING).value,
                "waiting": waiting, "input": None if arguments is None else dumps(arguments),
                "task_id": task_id, "compensation_task_id": str(uuid.uuid4()),
            })
            if waiting == 0:
                ready.append((step.position, task_id, step.task_name, signature, arguments))
        session.execute(_RESUME_WORKFLOW, {"workflow_id": workflow_id,
                                           "remaining": len(steps) - len(kept)})
        return self._queue(session, workflow_id, ready, hold=False)

    @staticmethod
    def _refuse_batch(workflow_id: str, steps: list[Any]) -> None:
        """A batch's members are its caller's jobs (written through their tasks' enqueue
        path): the engine does not run them again."""
        if any(s.kind == "callback" or s.signature.get("member") for s in steps):
            raise WorkflowNotRetryable(
                f"workflow {workflow_id} is a batch: its members are not run again; enqueue "
                "a new batch (or requeue dead-lettered members)", workflow_id=workflow_id)

    @staticmethod
    def _check_position(workflow_id: str, position: int, total: int) -> None:
        if isinstance(position, bool) or not isinstance(position, int) or not (
                0 <= position < total):
            raise WorkflowNotRetryable(
                f"workflow {workflow_id} has steps 0..{total - 1}; got step {position!r}",
                workflow_id=workflow_id, step=position)

    def replay(self, workflow_id: str, from_step: int) -> tuple[str, Released]:
        """A new run of the same canvas: `from_step` and its transitive dependents run,
        every other step is copied as succeeded with its result; it starts at `from_step`.

        Raises:
            WorkflowNotFound, WorkflowNotRetryable: a step to copy did not succeed.
        """
        with wrap_store_errors("workflows: replay", workflow=workflow_id), \
                self.transaction() as session:
            old = session.execute(_WORKFLOW, {"id": workflow_id}).first()
            if old is None:
                raise WorkflowNotFound(f"no workflow {workflow_id!r}", workflow_id=workflow_id)
            steps = list(session.execute(_STEPS, {"workflow_id": workflow_id}))
            self._refuse_batch(workflow_id, steps)
            self._check_position(workflow_id, from_step, len(steps))
            rerun = downstream(steps, [from_step])
            lost = [s.position for s in steps
                    if s.position not in rerun and s.state not in SUCCESS_STATES]
            if lost:
                raise WorkflowNotRetryable(
                    f"step {lost[0]} of workflow {workflow_id} did not succeed and does not "
                    f"depend on step {from_step}; replay from step {lost[0]}",
                    workflow_id=workflow_id, step=lost[0])
            specs = [StepSpec(
                position=s.position, task_name=s.task_name,
                args=list(s.signature.get("args") or ()),
                kwargs=dict(s.signature.get("kwargs") or {}),
                options=dict(s.signature.get("options") or {}),
                immutable=bool(s.signature.get("immutable")), source=s.signature.get("source"),
                compensate=s.compensate,
                compensation_task_id=None if s.compensate is None else str(uuid.uuid4()),
            ) for s in steps]
            link(specs, old.canvas.get("result"))
            new_id = uuid.uuid4().hex
            released = self.create(session, workflow_id=new_id, name=old.name,
                                   canvas=old.canvas, steps=specs,
                                   done={s.position: s.result for s in steps
                                         if s.position not in rerun},
                                   replay_of=workflow_id, hold=False)
        return new_id, released

    def state(self, workflow_id: str) -> tuple[str, Any, str | None, int | None]:
        """(state, result, error, failed step) of a workflow, one indexed read.

        Raises:
            WorkflowNotFound.
        """
        with wrap_store_errors("workflows: read", workflow=workflow_id), \
                self.engine().connect() as connection:
            row = connection.execute(_STATE, {"id": workflow_id}).first()
        if row is None:
            raise WorkflowNotFound(f"no workflow {workflow_id!r}", workflow_id=workflow_id)
        return row.state, revive(row.result), row.error, row.failed_position

    def summary(self, workflow_id: str) -> WorkflowSummary:
        """The workflow and every step.

        Raises:
            WorkflowNotFound.
        """
        with wrap_store_errors("workflows: read", workflow=workflow_id), \
                self.engine().connect() as connection:
            row = connection.execute(_WORKFLOW, {"id": workflow_id}).first()
            if row is None:
                raise WorkflowNotFound(f"no workflow {workflow_id!r}", workflow_id=workflow_id)
            steps = list(connection.execute(_STEPS, {"workflow_id": workflow_id}))
        return _summary(row, steps)

    def recent(self, *, limit: int = 50, state: str | None = None) -> list[WorkflowSummary]:
        """The latest workflows, newest first (steps not read)."""
        with wrap_store_errors("workflows: read recent"), \
                self.engine().connect() as connection:
            rows = connection.execute(_RECENT, {
                "limit": int(limit), "state": None if state is None else WorkflowState(state).value,
            }).all()
        return [_summary(row, None) for row in rows]


def downstream(steps: list[Any], roots: list[int]) -> set[int]:
    """`roots` and every step that depends on one of them, transitively."""
    dependents: dict[int, list[int]] = {}
    for step in steps:
        for dep in step.depends_on or ():
            dependents.setdefault(int(dep), []).append(int(step.position))
    found, todo = set(), list(roots)
    while todo:
        position = todo.pop()
        if position not in found:
            found.add(position)
            todo.extend(dependents.get(position, ()))
    return found


def _summary(row: Any, steps: list[Any] | None) -> WorkflowSummary:
    return WorkflowSummary(
        id=row.id, name=row.name, state=WorkflowState(row.state), created_at=row.created_at,
        finished_at=row.finished_at, replay_of=row.replay_of, result=row.result,
        error=row.error, failed_step=row.failed_position, total=int(row.total),
        steps=[_step(step) for step in steps or ()],
        counts={str(k): int(v) for k, v in dict(row.counts or {}).items()},
    )


def _step(row: Any) -> StepSummary:
    return StepSummary(
        position=int(row.position), task_name=row.task_name, state=StepState(row.state),
        task_id=row.task_id, depends_on=list(row.depends_on or ()), result=row.result,
        error=row.error, started_at=row.started_at, finished_at=row.finished_at,
        compensate=None if row.compensate is None else row.compensate.get("task"),
        compensation_state=(None if row.compensation_state is None
                            else StepState(row.compensation_state)),
        compensation_task_id=row.compensation_task_id,
        compensation_error=row.compensation_error,
    )


def backend_for(stores: Stores) -> WorkflowBackend:
    """Workflows in the PostgreSQL of `stores`: a step's start and a simple completion are
    one prepared autocommit statement each on the thread's held connection
    (`Stores.statements`; not prepared behind a transaction pooler); transactions are
    bounded (`Stores.guard_engine`)."""
    return WorkflowBackend(stores.guard_engine, stores.statements(),
                           prepared=not stores.transaction_pooled)
