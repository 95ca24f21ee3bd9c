"""Automatic replay: dead letters of a dependency that was down, requeued once it recovered.

`AutoReplay.run_once` (the beat's `jobs.maintenance.replay_dead_letters`) requeues, through
`requeue_many`, the rows whose recorded dependency's breaker has stayed closed for
`closed_for_seconds` (and that are at least that old), paced by a fleet-wide GCRA limit in
Redis. The rules: docs/failure.md, "Automatic replay".
"""

from __future__ import annotations

import datetime as dt
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass, field
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from resilience.circuit.backends.redis import RedisBreakerBackend
from resilience.config import check
from resilience.connections import wrap_store_errors
from resilience.deadletter.bulk import STOPPED_BY_ADMIT, RequeueReport, Selection, requeue_many
from resilience.deadletter.models import dead_letters
from resilience.deadletter.place import DeadLetter
from resilience.ratelimit.algorithms import GCRA, Params
from resilience.ratelimit.backends.redis import RedisBackend
from resilience.ratelimit.rates import parse
from resilience.stores import stores_for

if TYPE_CHECKING:
    from celery import Celery
    from sqlalchemy.engine import Engine

    from resilience.circuit.backends import BreakerBackend, BreakerState
    from resilience.ratelimit.backends import LimiterBackend

logger = logging.getLogger("resilience.deadletter.replay")

#: The fleet-wide rate limiter every replay run draws from.
LIMITER_KEY = "deadletter:replay"
#: Breaker states in which a dependency counts as recovered.
CLOSED_STATES = ("closed", "forced_closed")


@dataclass(frozen=True, kw_only=True)
class ReplayConfig:
    """Args:
    closed_for_seconds: how long a dependency's breaker must have stayed closed (and a row
        been dead) before its rows are replayed.
    rate: the fleet-wide pace of replays, `"10/second"` (`resilience.ratelimit.parse`);
        its limit is also the burst.
    max_rows_per_run: most rows one run requeues.
    max_run_seconds: longest a run waits for the pace; what is left waits for the next run.
    batch_size: rows per transaction.
    dependencies: replay only the rows of these dependencies (None: of every one).
    """

    closed_for_seconds: float = 300.0
    rate: str = "10/second"
    max_rows_per_run: int = 500
    max_run_seconds: float = 20.0
    batch_size: int = 50
    dependencies: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        for name in ("closed_for_seconds", "max_run_seconds"):
            check(self, name, ">= 0", lambda v: v >= 0)
        parse(self.rate)  # raises ConfigurationError naming the problem
        for name in ("max_rows_per_run", "batch_size"):
            check(self, name, "an integer >= 1",
                  lambda v: not isinstance(v, bool) and isinstance(v, int) and v >= 1)
        if self.dependencies is not None:
            check(self, "dependencies", "a list of names", lambda v: not isinstance(v, str)
                  and all(isinstance(name, str) and name for name in v))
            object.__setattr__(self, "dependencies", tuple(self.dependencies))


@dataclass
class ReplayReport:
    """What one run did: rows requeued per dependency, and why the others wait."""

    requeued: dict[str, RequeueReport] = field(default_factory=dict)
    #: dependency -> why its rows wait ("breaker open", "closed 12s of 300s").
    waiting: dict[str, str] = field(default_factory=dict)

    @property
    def replayed(self) -> int:
        return sum(len(report.requeued) for report in self.requeued.values())

    def summary(self) -> dict[str, Any]:
        """JSON-ready: the beat task's result."""
        return {
            "replayed": self.replayed,
            "by_dependency": {name: report.summary() for name, report in self.requeued.items()},
            "waiting": dict(self.waiting),
        }


@dataclass(eq=False)
class AutoReplay:
    """Requeues dead letters whose dependency recovered (see the module doc).

    Args:
        engine: the dead-letter place's database.
        app: the Celery app whose tasks are requeued (through the outbox).
        breakers: where the dependencies' breakers live.
        limiter: where the replay pace is kept (fleet-wide on Redis).
        sleep, clock: injectable for tests.
    """

    engine: Engine
    app: Celery
    config: ReplayConfig
    _: KW_ONLY
    breakers: BreakerBackend
    limiter: LimiterBackend
    sleep: Callable[[float], None] = time.sleep
    clock: Callable[[], float] = time.monotonic

    def __post_init__(self) -> None:
        rate = parse(self.config.rate)
        self._params = Params.of_rate(rate, burst=rate.limit)

    @classmethod
    def of_app(cls, app: Celery, config: ReplayConfig) -> AutoReplay:
        """Breakers and pace on the app's shared Redis, rows in its PostgreSQL."""
        stores = stores_for(app)
        return cls(stores.engine(), app, config, breakers=RedisBreakerBackend.of_app(app),
                   limiter=RedisBackend(lambda: stores_for(app).redis()))

    def pending_dependencies(self) -> list[str]:
        """Dependencies with dead letters not yet requeued, of those configured (one
        indexed query)."""
        query = (sa.select(dead_letters.c.dependency).distinct()
                 .where(dead_letters.c.requeued_at.is_(None),
                        dead_letters.c.dependency.is_not(None))
                 .order_by(dead_letters.c.dependency))
        if self.config.dependencies is not None:
            query = query.where(dead_letters.c.dependency.in_(self.config.dependencies))
        with wrap_store_errors("dead-letter place: pending dependencies"), \
                self.engine.connect() as connection:
            return [str(name) for name in connection.execute(query).scalars()]

    def waits(self, state: BreakerState) -> str | None:
        """Why the rows of `state`'s dependency must wait, or None when they may run."""
        if state.state not in CLOSED_STATES:
            return f"breaker {state.state}"
        closed = state.seconds_in_state
        # A breaker with no transition on record has never opened (or its state was lost):
        # the row's own age (see `run_once`) is then the only wait.
        if closed is not None and closed < self.config.closed_for_seconds:
            return f"closed {closed:.0f}s of {self.config.closed_for_seconds:g}s"
        return None

    def run_once(self) -> ReplayReport:
        """Requeue what may be replayed now, paced; one beat tick.

        Raises:
            StorageError: Redis or PostgreSQL failed (rows requeued before stay requeued).
        """
        report = ReplayReport()
        names = self.pending_dependencies()
        if not names:
            return report
        states = {state.name: state for state in self.breakers.describe(names)}
        deadline = self.clock() + self.config.max_run_seconds
        budget = self.config.max_rows_per_run
        caller = uuid.uuid4().hex
        old_enough = dt.datetime.now(dt.UTC) - dt.timedelta(
            seconds=self.config.closed_for_seconds)
        for name in names:
            state = states.get(name)
            reason = self.waits(state) if state is not None else None
            if reason is not None:
                report.waiting[name] = reason
                continue
            if budget <= 0:
                report.waiting[name] = "the run's row limit was reached"
                continue
            done = requeue_many(
                self.engine, self.app, Selection(dependency=name, before=old_enough),
                limit=budget, batch_size=self.config.batch_size,
                admit=lambda entry: self._paced(entry, caller, deadline))
            report.requeued[name] = done
            budget -= len(done.requeued)
            if done.stopped == STOPPED_BY_ADMIT:
                report.waiting[name] = "paced: the rest waits for the next run"
                break
        if report.replayed:
            logger.info("dead letters replayed: %s", report.summary())
        return report

    def _paced(self, entry: DeadLetter, caller: str, deadline: float) -> bool:
        """Take one permit of the replay rate, waiting for it until the run's deadline."""
        while True:
            decision = self.limiter.run(GCRA, LIMITER_KEY, self._params, caller)
            if decision.allowed:
                return True
            if self.clock() + decision.retry_after_seconds > deadline:
                return False
            self.sleep(decision.retry_after_seconds)
