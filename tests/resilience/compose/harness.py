"""Running jobs of the composition matrix, injecting faults, and checking the invariants.

A `Run` is one batch of jobs with its own id (every key, lock key, and table row carries
it), so runs of one session never see each other's state. After the faults, `drain` waits
for every job's final state in the result backend, and `check` returns the violated
invariants as sentences (empty: all hold). The invariants:

* **nothing lost** — every job is final, and final as one of: succeeded (the body's
  result), REPLAYED, SKIPPED, SHED, or dead-lettered (state FAILURE, error `DeadLettered`,
  and a row in `resilience_dead_letters` with the job's task id). REPLAYED only where the stack is
  idempotent; SKIPPED only where it has a skip-policy lock (exclusive). The one other
  accepted end is a job *without* a retry policy whose body raised a store error while
  that store was down (Celery fails a task whose error no policy handles); it must
  coincide with an outage the test injected.
* **effects** — transactional idempotency: at most one effect per key; exactly one iff a
  job of the key succeeded or was replayed; at most one job ran the body to success and the
  effect is that job's. Every other stack: at least one effect per succeeded job (with the
  job's task id). Any stack: a key has an effect unless one of its jobs was dead-lettered
  or failed in an outage.
* **locks** — executions of one key under singleton/exclusive never overlap (start and
  end times from PostgreSQL's clock, recorded by the body while the lock is held), and
  their fencing tokens increase with their start order.
* **no commit outside the lock** — the `compose_violations` table (filled inside COMMIT by
  the deferred constraint trigger on `compose_effects`) has no row of the run.
* **concurrency** — at no moment more finished executions of a concurrency-limited stack
  overlap than its limit (executions admitted while guard Redis was down are left out:
  the limit fails open by design).
* **no silent death** — an execution without an end time was SIGKILLed by the test.
* **inline never publishes** — no worker ran (or stored a result under the id of) a job
  that the test ran inline with `apply()`.
"""

from __future__ import annotations

import collections
import datetime
import itertools
import os
import signal
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import psutil
from sqlalchemy import text

from resilience.errors import DeadLettered, JobDeferred
from resilience.outcomes import is_outcome_result
from tests.resilience.compose.proxy import Proxy
from tests.resilience.compose.tasks import CONCURRENCY_LIMIT, QUEUE, TASKS, Stack

#: Final states of the result backend; everything else (PENDING, STARTED, RETRY) is not.
FINAL_STATES = ("SUCCESS", "FAILURE")
#: After a store comes back, how long clients may still fail on connections that died.
RECOVERY = datetime.timedelta(seconds=1)
#: Store errors a body may fail with while its store is down (no retry policy).
STORE_ERRORS = ("OperationalError", "InterfaceError", "LockNotOwnedError", "StorageError",
                "StoreUnavailable", "DBAPIError")


@dataclass
class Outage:
    """A window during which a store's proxy was down, on PostgreSQL's clock."""

    store: str
    started: Any
    ended: Any = None


@dataclass
class Context:
    """What a run needs: the producer app, the direct engine, the proxies, the workers."""

    app: Any
    engine: Any
    redis_proxy: Proxy
    postgres_proxy: Proxy
    workers: list[Any]
    killed: set[int] = field(default_factory=set)
    outages: list[Outage] = field(default_factory=list)

    def now(self) -> Any:
        with self.engine.connect() as connection:
            return connection.execute(text("SELECT clock_timestamp()")).scalar_one()

    def pool_pids(self) -> set[int]:
        pids: set[int] = set()
        for worker in self.workers:
            try:
                pids.update(child.pid for child in worker.children())
            except psutil.Error:
                continue
        return pids

    def outage(self, store: str, seconds: float, during: Callable[[], None]) -> None:
        """Take `store` ("redis" or "postgres") down for `seconds`, calling `during` meanwhile."""
        proxy = self.redis_proxy if store == "redis" else self.postgres_proxy
        window = Outage(store, self.now())
        self.outages.append(window)
        started = time.monotonic()
        proxy.down()
        try:
            during()
            time.sleep(max(0.0, seconds - (time.monotonic() - started)))
        finally:
            proxy.up()
            window.ended = self.now()

    def during_outage(self, store: str, moment: Any) -> bool:
        """Was `moment` within an outage of `store`, or less than a second after one?"""
        return any(
            window.store == store and window.started <= moment
            and (window.ended is None or moment <= window.ended + RECOVERY)
            for window in self.outages
        )

    def restore(self) -> None:
        """Every proxy up (after a failure in the middle of an outage)."""
        for proxy in (self.redis_proxy, self.postgres_proxy):
            proxy.up()

    def purge(self) -> None:
        """Drop what is left in the compose queue (after a failed run)."""
        with self.app.connection_for_write() as connection:
            connection.default_channel.queue_purge(QUEUE)


@dataclass
class Job:
    """One `.delay()` or inline `apply()` of a stack's task for one key."""

    task_id: str
    stack: Stack
    key: str
    inline: bool = False
    #: Inline only: the EagerResult's state and result, or the error `apply()` raised.
    state: str | None = None
    result: Any = None
    raised: BaseException | None = None


@dataclass(frozen=True)
class Final:
    """A job's final state and how the invariants classify it."""

    state: str
    result: Any
    kind: str  # succeeded, replayed, skipped, shed, dead-lettered, failed-in-outage, ...


class Run:
    """One batch of jobs of the matrix under one run id."""

    def __init__(self, context: Context, label: str) -> None:
        self.context = context
        self.id = f"{label}-{uuid.uuid4().hex[:8]}"
        self.jobs: list[Job] = []
        self.arguments: dict[tuple[str, str], dict[str, Any]] = {}
        self.stacks: dict[str, Stack] = {}
        #: After `check`: how many jobs ended each way, and executions/effects seen.
        self.summary: dict[str, int] = {}
        #: Pool processes this run SIGKILLed, and where its outages start in the context's.
        self.killed: list[int] = []
        self.first_outage = len(context.outages)
        self._keys = 0

    # -- producing ---------------------------------------------------------------------------
    def new_key(self, stack: Stack, *, fail_first: int = 0, pause: float = 0.0) -> str:
        self._keys += 1
        key = f"k{self._keys}"
        self.stacks[stack.name] = stack
        self.arguments[(stack.name, key)] = {
            "run": self.id, "key": key, "fail_first": fail_first, "pause": pause,
        }
        return key

    def keys(self) -> list[tuple[Stack, str]]:
        """Every key made so far, with its stack."""
        return [(self.stacks[name], key) for name, key in self.arguments]

    def enqueue(self, stack: Stack, key: str, copies: int = 1) -> list[Job]:
        """`.delay()` the key's job `copies` times: duplicate deliveries of one request."""
        jobs = []
        for _ in range(copies):
            result = TASKS[stack.name].apply_async(kwargs=self.arguments[(stack.name, key)])
            jobs.append(Job(task_id=result.id, stack=stack, key=key))
        self.jobs.extend(jobs)
        return jobs

    def inline(self, stack: Stack, key: str) -> Job:
        """Run the key's job in this process with `apply()`, as caller-runs does."""
        job = Job(task_id=str(uuid.uuid4()), stack=stack, key=key, inline=True)
        try:
            eager = TASKS[stack.name].apply(kwargs=self.arguments[(stack.name, key)],
                                            task_id=job.task_id)
        except Exception as exc:  # noqa: BLE001 - classified by check()
            job.raised = detached(exc)
        else:
            job.state, job.result = eager.state, detached(eager.result)
        self.jobs.append(job)
        return job

    def wait_in_body(self, stack: Stack, key: str, timeout_seconds: float = 5.0) -> int | None:
        """The pid of a worker process running the key's body right now, if one starts."""
        deadline = time.monotonic() + timeout_seconds
        while time.monotonic() < deadline:
            with self.context.engine.connect() as connection:
                pids = connection.execute(text(
                    "SELECT pid FROM compose_executions WHERE run = :run AND stack = :stack "
                    "AND key = :key AND ended_at IS NULL AND NOT inline ORDER BY id DESC"),
                    {"run": self.id, "stack": stack.name, "key": key}).scalars().all()
            live = [pid for pid in pids if pid not in self.context.killed]
            if live and live[0] in self.context.pool_pids():
                return int(live[0])
            time.sleep(0.02)
        return None

    def kill(self, pid: int) -> None:
        """SIGKILL one pool process of a compose worker (never anything else)."""
        assert pid in self.context.pool_pids(), f"{pid} is not a compose pool process"
        self.context.killed.add(pid)
        self.killed.append(pid)
        os.kill(pid, signal.SIGKILL)

    # -- draining ----------------------------------------------------------------------------
    def drain(self, timeout_seconds: float = 45.0) -> dict[str, tuple[str, Any]]:
        """Wait until every enqueued job is final; raise listing the ones that are not."""
        app = self.context.app
        finals: dict[str, tuple[str, Any]] = {}
        pending = [job for job in self.jobs if not job.inline]
        deadline = time.monotonic() + timeout_seconds
        while pending:
            still = []
            for job in pending:
                result = app.AsyncResult(job.task_id)
                state = result.state
                if state in FINAL_STATES:
                    finals[job.task_id] = (state, result.result)
                else:
                    still.append((job, state))
            pending = [job for job, _ in still]
            if not pending:
                break
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"run {self.id}: {len(still)} jobs not final after {timeout_seconds:g}s "
                    "(lost or stuck):\n" + "\n".join(
                        f"  {job.stack.name} {job.key} {job.task_id} state={state} "
                        f"executions={self._executions_of(job.task_id)}"
                        for job, state in still[:20]))
            time.sleep(0.1)
        return finals

    def _executions_of(self, task_id: str) -> list[tuple[Any, ...]]:
        with self.context.engine.connect() as connection:
            return [tuple(row) for row in connection.execute(text(
                "SELECT attempt, pid, ended_at IS NOT NULL, raised FROM compose_executions "
                "WHERE task_id = :id ORDER BY id"), {"id": task_id})]

    # -- checking ----------------------------------------------------------------------------
    def check(self, finals: dict[str, tuple[str, Any]]) -> list[str]:
        """Every violated invariant of this run, as one sentence each (see module doc)."""
        rows = self._rows()
        problems: list[str] = []
        kinds: dict[str, Final] = {}
        for job in self.jobs:
            final = self._classify(job, finals, rows)
            kinds[job.task_id] = final
            if final.kind.startswith("unexpected"):
                problems.append(f"{job.stack.name} {job.key} job {job.task_id}"
                                f"{' (inline)' if job.inline else ''}: {final.kind}")
        problems += self._check_effects(kinds, rows)
        problems += self._check_locks(rows)
        problems += self._check_concurrency(rows)
        problems += [
            f"{row.stack} {row.key}: effect {row.effect_id} of task {row.task_id} committed "
            f"while lock {row.lock_key!r} (token {row.token}) was not held; registry had: "
            f"{row.holder}"
            for row in rows["violations"]
        ]
        for row in rows["executions"]:
            if row.ended_at is None and row.pid not in self.context.killed:
                problems.append(f"{row.stack} {row.key}: execution {row.id} (pid {row.pid}, "
                                f"task {row.task_id}) never ended and was not killed by "
                                "the test")
        problems += self._check_inline(rows)
        self.summary = dict(sorted(collections.Counter(
            final.kind.split(":")[0] + (f" {type(final.result).__name__}"
                                        if final.kind == "failed-in-outage" else "")
            for final in kinds.values()).items()))
        self.summary.update(executions=len(rows["executions"]), effects=len(rows["effects"]),
                            retried=sum(1 for row in rows["executions"] if row.raised))
        return problems

    def _rows(self) -> dict[str, list[Any]]:
        ids = [job.task_id for job in self.jobs]
        with self.context.engine.connect() as connection:
            return {
                "executions": list(connection.execute(text(
                    "SELECT * FROM compose_executions WHERE run = :run ORDER BY started_at"),
                    {"run": self.id})),
                "effects": list(connection.execute(text(
                    "SELECT * FROM compose_effects WHERE run = :run ORDER BY id"),
                    {"run": self.id})),
                "violations": list(connection.execute(text(
                    "SELECT v.*, e.stack FROM compose_violations v "
                    "LEFT JOIN compose_effects e ON e.id = v.effect_id "
                    "WHERE v.run = :run ORDER BY v.id"),
                    {"run": self.id})),
                "dead_letters": list(connection.execute(text(
                    "SELECT task_id, guard, reason FROM resilience_dead_letters "
                    "WHERE task_id = ANY(:ids)"), {"ids": ids})),
            }

    @staticmethod
    def _ran_elsewhere(execution_id: Any, task_id: str, rows: dict[str, list[Any]]) -> bool:
        """Was execution `execution_id` run by a job other than `task_id`?"""
        return any(row.id == execution_id and row.task_id != task_id
                   for row in rows["executions"])

    def _classify(self, job: Job, finals: dict[str, tuple[str, Any]],
                  rows: dict[str, list[Any]]) -> Final:
        stack = job.stack
        if job.inline:
            if isinstance(job.raised, JobDeferred):
                return Final("DEFERRED", job.raised, "deferred-inline")
            if job.raised is not None:
                return Final("RAISED", job.raised, f"unexpected: apply() raised "
                             f"{type(job.raised).__name__}: {str(job.raised)[:300]}")
            state, result = job.state, job.result
            if state == "FAILURE" and isinstance(result, JobDeferred):
                # `apply()` keeps the task's error in its EagerResult: the inline deferral.
                return Final(state, result, "deferred-inline")
        else:
            state, result = finals[job.task_id]
        if state == "SUCCESS":
            if (not is_outcome_result(result) and isinstance(result, dict)
                    and result.get("execution_id") is not None
                    and self._ran_elsewhere(result["execution_id"], job.task_id, rows)):
                # A replay answers the first call's value, whose execution was another job's.
                result = {"outcome": "REPLAYED", "result": result}
            if is_outcome_result(result):
                outcome = result["outcome"]
                if outcome == "REPLAYED" and stack.transactional:
                    return Final(state, result, "replayed")
                if outcome == "SKIPPED" and stack.lock == "exclusive":
                    return Final(state, result, "skipped")
                if outcome == "SHED":
                    return Final(state, result, "shed")
                if outcome == "DEFERRED" and job.inline:
                    return Final(state, result, "deferred-inline")
                return Final(state, result, f"unexpected outcome {result}")
            if isinstance(result, dict) and result.get("key") == job.key \
                    and result.get("run") == self.id:
                return Final(state, result, "succeeded")
            return Final(state, result, f"unexpected result {result!r}")
        if state == "FAILURE":
            if isinstance(result, DeadLettered):
                if any(row.task_id == job.task_id for row in rows["dead_letters"]):
                    return Final(state, result, "dead-lettered")
                return Final(state, result, f"unexpected: DeadLettered without a "
                             f"resilience_dead_letters row: {result}")
            name = type(result).__name__
            failed = self._failed_in_outage(job, rows)
            # Celery rebuilds an error it cannot import (SQLAlchemy's) as a plain Exception;
            # the body recorded the real type name.
            if not stack.retries and failed is not None and (
                    name in STORE_ERRORS or failed.raised.split(":")[0] in STORE_ERRORS):
                return Final(state, result, "failed-in-outage")
            return Final(state, result, f"unexpected failure {name}: {str(result)[:300]}")
        return Final(state, result, f"unexpected state {state}: {result!r}")

    def _failed_in_outage(self, job: Job, rows: dict[str, list[Any]]) -> Any:
        """The job's last failed execution if it overlapped a store outage, else None."""
        failed = [row for row in rows["executions"]
                  if row.task_id == job.task_id and row.raised is not None]
        if not failed:
            return None
        last = failed[-1]
        overlapped = any(
            window.started <= last.ended_at
            and (window.ended is None or last.started_at <= window.ended + RECOVERY)
            for window in self.context.outages
        )
        return last if overlapped else None

    def _check_effects(self, kinds: dict[str, Final], rows: dict[str, list[Any]]) -> list[str]:
        problems = []
        effects: dict[tuple[str, str], list[Any]] = collections.defaultdict(list)
        for row in rows["effects"]:
            effects[(row.stack, row.key)].append(row)
        by_key: dict[tuple[str, str], list[Job]] = collections.defaultdict(list)
        for job in self.jobs:
            by_key[(job.stack.name, job.key)].append(job)
        for (name, key), jobs in by_key.items():
            stack = jobs[0].stack
            found = effects.get((name, key), [])
            kind_of = {job.task_id: kinds[job.task_id].kind for job in jobs}
            succeeded = [job.task_id for job in jobs if kind_of[job.task_id] == "succeeded"]
            replayed = [job.task_id for job in jobs if kind_of[job.task_id] == "replayed"]
            excused = any(kind in ("dead-lettered", "failed-in-outage", "deferred-inline")
                          for kind in kind_of.values())
            where = f"{name} {key}"
            outcomes = sorted(kind_of.values())
            if stack.transactional:
                if len(found) > 1:
                    problems.append(f"{where}: effect committed {len(found)} times (tasks "
                                    f"{[row.task_id for row in found]}); outcomes {outcomes}")
                if (succeeded or replayed) and not found:
                    problems.append(f"{where}: jobs succeeded/replayed but no effect "
                                    f"committed; outcomes {outcomes}")
                if found and not (succeeded or replayed):
                    problems.append(f"{where}: an effect committed that no job reports; "
                                    f"outcomes {outcomes}")
                if len(succeeded) > 1:
                    problems.append(f"{where}: {len(succeeded)} jobs ran the body to success "
                                    f"for one idempotency key: {succeeded}")
                if len(succeeded) == 1 and found and found[0].task_id != succeeded[0]:
                    problems.append(f"{where}: the effect belongs to task {found[0].task_id} "
                                    f"but task {succeeded[0]} reported the success")
            else:
                written = collections.Counter(row.task_id for row in found)
                for task_id in succeeded:
                    if not written[task_id]:
                        problems.append(f"{where}: job {task_id} succeeded without writing "
                                        "its effect")
            if not found and not excused:
                problems.append(f"{where}: no effect, although no job was dead-lettered or "
                                f"failed; outcomes {outcomes}")
        return problems

    def _check_locks(self, rows: dict[str, list[Any]]) -> list[str]:
        problems = []
        by_key: dict[tuple[str, str], list[Any]] = collections.defaultdict(list)
        stacks = {job.stack.name: job.stack for job in self.jobs}
        for row in rows["executions"]:
            if stacks[row.stack].lock is not None:
                by_key[(row.stack, row.key)].append(row)
        for (name, key), executions in by_key.items():
            latest_end = None
            holder = None
            for row in executions:  # ordered by start
                if latest_end is not None and row.started_at < latest_end:
                    problems.append(
                        f"{name} {key}: execution {row.id} (task {row.task_id}) started at "
                        f"{row.started_at:%H:%M:%S.%f} while execution {holder.id} (task "
                        f"{holder.task_id}) ran until {latest_end:%H:%M:%S.%f}: two holders")
                if row.ended_at is not None and (latest_end is None or row.ended_at > latest_end):
                    latest_end, holder = row.ended_at, row
            tokens = [row.token for row in executions if row.token is not None]
            if any(later <= earlier for earlier, later in itertools.pairwise(tokens)):
                problems.append(f"{name} {key}: fencing tokens not increasing with start "
                                f"order: {tokens}")
            if len(tokens) != len(executions):
                problems.append(f"{name} {key}: an execution under a lock got no fencing "
                                "token")
        return problems

    def _check_concurrency(self, rows: dict[str, list[Any]]) -> list[str]:
        """At most the limit of finished executions at once, outside Redis outages.

        The limit fails open by default: while its Redis is down (and for a moment after,
        until the clients' dead connections are replaced) executions run without a slot.
        Those are left out; every other execution held a slot for all of its body.
        """
        problems = []
        stacks = {job.stack.name: job.stack for job in self.jobs}
        events: dict[str, list[tuple[Any, int]]] = collections.defaultdict(list)
        for row in rows["executions"]:
            if ("concurrency" in stacks[row.stack].guards and row.ended_at is not None
                    and not self.context.during_outage("redis", row.started_at)):
                events[row.stack] += [(row.started_at, 1), (row.ended_at, -1)]
        for name, changes in events.items():
            running = highest = 0
            for _, change in sorted(changes, key=lambda event: (event[0], event[1])):
                running += change
                highest = max(highest, running)
            if highest > CONCURRENCY_LIMIT:
                problems.append(f"{name}: {highest} executions at once outside Redis outages, "
                                f"over the concurrency limit {CONCURRENCY_LIMIT}")
        return problems

    def _check_inline(self, rows: dict[str, list[Any]]) -> list[str]:
        problems = []
        for job in self.jobs:
            if not job.inline:
                continue
            ran = [row for row in rows["executions"]
                   if row.task_id == job.task_id and not row.inline]
            stored = self.context.app.AsyncResult(job.task_id).state
            if ran or stored != "PENDING":
                problems.append(f"{job.stack.name} {job.key}: inline job {job.task_id} was "
                                f"published: {len(ran)} worker executions, backend state "
                                f"{stored}")
        return problems


def detached(value: Any) -> Any:
    """`value`; an exception without its traceback and chained errors.

    A kept traceback keeps its frames' locals alive, among them Celery `AsyncResult`s
    (an inline deferral on the committed code publishes hundreds), whose finalizers then
    try to reach the session's Redis after it stopped and retry for many seconds.
    """
    if isinstance(value, BaseException):
        value.__traceback__ = None
        value.__context__ = value.__cause__ = None
    return value


def describe(run: Run, problems: Iterable[str]) -> str:
    """The assertion message of a run's violated invariants."""
    problems = list(problems)
    stacks = sorted({job.stack.name for job in run.jobs})
    outages = [f"{window.store} {window.started:%H:%M:%S.%f}-{window.ended:%H:%M:%S.%f}"
               for window in run.context.outages[run.first_outage:]]
    head = (f"run {run.id}: {len(problems)} invariant violations over {len(run.jobs)} jobs "
            f"of {stacks}; SIGKILLed pids {run.killed}; outages {outages}")
    return "\n".join([head, *(f"  - {problem}" for problem in problems[:40])])
