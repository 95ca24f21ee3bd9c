"""`jobs demo`: a story in five phases that shows every guard acting on the example jobs
(duplicates, breaker, singleton, flood, poison; the README's "See it work"), then a summary
of the jobs sent, the ledger rows per order (exactly one) and the outcomes by guard.
`--steady` keeps the old mixed workload.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import random
import statistics
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Column, Table
from sqlalchemy import func, select, text

from jobs.embedded import port_in_use
from jobs.examples import (
    PAYMENTS_VENDOR,
    WARM_CACHE_DEADLINE_SECONDS,
    build_daily_report,
    charge_payment,
    settle_account,
    warm_cache,
)
from jobs.models import LedgerEntry
from jobs.vendor import VendorControl, VendorError, start_in_thread
from resilience import outcome_of
from resilience.circuit import BreakerConfig, CircuitBreaker, RedisBreakerBackend
from resilience.counters import read_all
from resilience.deadletter.place import list_entries
from resilience.errors import ResilienceError, StaleFencingToken
from resilience.locks import FencingTokens
from resilience.stores import stores_for

ACCOUNTS = [f"acct-{n:03d}" for n in range(20)]


class DemoError(Exception):
    """Raised when the demo cannot go on: the platform is not up, or a phase timed out."""


@dataclass(frozen=True, kw_only=True)
class DemoOptions:
    """How long the story lingers.

    Args:
        phase_seconds: pause after each phase, to look at Flower and `/resilience`.
        breaker_hold_seconds: how long the vendor keeps failing once the breaker is open.
        flood: distinct accounts in the optional flood (each warm-up is sent twice).
        wait_seconds: longest wait for the jobs of one phase to finish.
    """

    phase_seconds: float = 8.0
    breaker_hold_seconds: float = 6.0
    flood: int = 800
    wait_seconds: float = 90.0

    @classmethod
    def fast(cls, *, flood: int = 300) -> DemoOptions:
        """No pauses, a smaller flood; the breaker stays open long enough for a screenshot."""
        return cls(phase_seconds=0.0, breaker_hold_seconds=3.0, flood=flood)


@dataclass
class Sent:
    """One job the demo sent and when (epoch seconds), for latencies and the summary."""

    result: Any
    sent_at: float


@dataclass
class Story:
    """The demo's state across phases; `run()` tells the story."""

    app: Any
    console: Console
    options: DemoOptions
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:6])
    sent: Counter[str] = field(default_factory=Counter)
    orders: set[str] = field(default_factory=set)
    poison_orders: set[str] = field(default_factory=set)
    accounts: dict[str, str] = field(default_factory=dict)
    started: float = field(default_factory=time.monotonic)

    # -- the story -------------------------------------------------------------------------
    def run(self) -> bool:
        """Tell the five phases and the summary; True when every order was charged once."""
        settings = self.app.settings
        self.flower = f"http://{settings.flower_address}:{settings.flower_port}"
        if not self.app.control.ping(timeout=5, limit=1):
            raise DemoError("no worker answers: start the platform first (`jobs up`)")
        self.counters_before = self._counters()
        self.vendor_before = self._vendor().status()
        self._vendor().set_mode("ok")
        # Closed with an empty window (`jobs breakers reset`): a previous run's calls would
        # change how many failures open it.
        self._breaker().backend.force(self._breaker().name, "closed")
        self.console.print(
            f"[bold]jobs demo[/bold] (run {self.run_id}): Flower {self.flower}, "
            f"resilience view {self.flower}/resilience")
        for phase in (self.duplicates, self.breaker, self.singleton, self.flood, self.poison):
            phase()
            if self.options.phase_seconds > 0:
                self.console.print(f"  (next phase in {self.options.phase_seconds:g} s)")
                time.sleep(self.options.phase_seconds)
        return self.summary()

    def duplicates(self) -> None:
        self._title(1, "a duplicated order is charged once")
        sends: list[Sent] = []
        for n in range(4):
            order = self._order(f"dup{n}")
            for _ in range(3):  # the shop's checkout retried after a timeout, twice
                sends.append(self._charge(order, amount_cents=1000 + n))
        done = self._finish(sends)
        firsts = [s for s in done if _outcome(s.result) == "SUCCEEDED"]
        replayed = [s for s in done if _outcome(s.result) == "REPLAYED"]
        self.console.print(
            f"  4 orders x 3 sends = {len(sends)} jobs: {len(firsts)} charged, "
            f"{len(replayed)} REPLAYED with the first result")
        if replayed:
            decision = outcome_of(replayed[0].result)
            details = decision.details if decision is not None else {}
            self.console.print(
                f"  e.g. task {replayed[0].result.id} -> REPLAYED, original task "
                f"{details.get('original_task_id')}")
        self._hint(
            "Flower: Tasks, search charge_payment. The duplicates are REPLAYED, with the "
            "first charge's result (their .get() answers it too); the ledger has one row "
            "per order.")

    def breaker(self) -> None:
        self._title(2, "the vendor fails: breaker open, jobs deferred, recovery")
        vendor = self._vendor()
        vendor.set_mode("fail")
        self.console.print("  vendor: FAILING (HTTP 503) - `jobs vendor fail`")
        sends: list[Sent] = []
        started = time.monotonic()
        while self._breaker().describe().state != "open":
            if len(sends) >= 60 or time.monotonic() - started > self.options.wait_seconds:
                raise DemoError(f"breaker {PAYMENTS_VENDOR} did not open after "
                                f"{len(sends)} failing charges")
            sends.append(self._charge(self._order(f"brk{len(sends)}")))
            time.sleep(0.2)
        self.console.print(
            f"  breaker {PAYMENTS_VENDOR}: [red]OPEN[/red] after {len(sends)} failing charges")
        before = self._counter("breaker", "DEFERRED")
        sends += [self._charge(self._order(f"open{n}")) for n in range(4)]
        self._wait(lambda: self._counter("breaker", "DEFERRED") > before,
                   "the breaker to defer a charge")
        self.console.print(
            "  new charges are DEFERRED by the breaker: republished for when it half-opens, "
            "no retry spent, the vendor not called")
        self._hint(
            f"{self.flower}/resilience: breaker {PAYMENTS_VENDOR} OPEN. Flower: charges in "
            "RETRY with 'DEFERRED by breaker: breaker payments-vendor is open'.")
        time.sleep(self.options.breaker_hold_seconds)
        vendor.set_mode("ok")
        self.console.print("  vendor: RECOVERED - `jobs vendor ok`; the breaker half-opens "
                           "after 10 s and its probes close it")
        self._wait(lambda: self._breaker().describe().state == "closed", "the breaker to close")
        done = self._finish(sends)
        outcomes = Counter(_outcome(s.result) for s in done)
        deferred = self._counter("breaker", "DEFERRED", since_start=True)
        retries = self._counter("retry", "RETRY", since_start=True)
        self.console.print(
            f"  breaker [green]CLOSED[/green]; {len(sends)} charges: {dict(outcomes)}; "
            f"{deferred} deferrals by the breaker, {retries} retries spent (only calls that "
            "reached the failing vendor)")

    def singleton(self) -> None:
        self._title(3, "a report triggered twice builds once; a stale holder is fenced off")
        day = dt.datetime.now(dt.timezone.utc).date().isoformat()
        reports = [self._send(build_daily_report, day=day) for _ in range(2)]
        done = self._finish(reports)
        skipped = [s for s in done if _outcome(s.result) == "SKIPPED"]
        if skipped:
            holder = skipped[0].result.result["details"].get("holder_task_id")
            self.console.print(f"  report {day}: built once; the second trigger SKIPPED "
                               f"(holder task {holder})")
        else:
            self.console.print(f"  report {day}: both ran, one after the other (the standard "
                               "tier has one worker process: JOBS_STANDARD__CONCURRENCY=2 lets "
                               "them meet)")
        account = f"acct-{self.run_id}"
        first = self._finish([self._send(settle_account, account=account)])[0]
        second = self._finish([self._send(settle_account, account=account)])[0]
        old, new = (s.result.result.get("fencing_token") for s in (first, second))
        key = f"settlement:{account}"
        try:
            with self._engine().begin() as connection:
                FencingTokens.guard_write(connection, key, old)
                connection.execute(text("SELECT 1"))
            refused = "[red]accepted[/red] (unexpected)"
        except StaleFencingToken:
            refused = "refused (StaleFencingToken)"
        self.console.print(f"  settle_account({account}) twice: fencing tokens {old} then {new}; "
                           f"a paused first holder writing with {old} now: {refused}")
        self._hint(
            "Flower: build_daily_report, one SUCCESS and one {'outcome': 'SKIPPED', "
            "'holder_task_id': ...}; `jobs locks list` shows a held lock while a report builds.")

    def flood(self) -> None:
        count = self.options.flood
        self._title(4, f"a flood of {count * 2} optional warm-ups is shed; critical holds")
        quiet = [self._finish([self._charge(self._order(f"qt{n}"))])[0]
                 for n in range(3)]  # one at a time: the critical latency of a quiet platform
        ids: dict[str, Sent] = {}
        duplicates = discarded = 0
        charges: list[Sent] = []
        for n in range(count * 2):
            sent = self._send(warm_cache, account=f"flood-{self.run_id}-{n % count:04d}")
            if getattr(sent.result, "id", None) is None:
                discarded += 1
            elif sent.result.id in ids:
                duplicates += 1
            else:
                ids[sent.result.id] = sent
            if n % 200 == 0:  # a customer pays while the flood is queued
                charges.append(self._charge(self._order(f"fld{n}")))
        self._finish(charges)
        flood = self._finish(list(ids.values()), poll_seconds=0.5)
        outcomes = Counter(_outcome(s.result) for s in flood)
        self.console.print(
            f"  {count * 2} sends -> {len(ids)} jobs ({duplicates} returned the queued job: "
            f"@unique per account; {discarded} DISCARDED by the full tier)")
        self.console.print(
            f"  {outcomes['SHED']} SHED (waited past the {WARM_CACHE_DEADLINE_SECONDS:g} s "
            f"deadline, or a quarter of it under pressure), {outcomes['SUCCEEDED']} ran")
        during = _latencies(charges)
        self.console.print(
            f"  critical charges during the flood: median {_ms(during)}, max "
            f"{_ms(during, max)} (quiet: median {_ms(_latencies(quiet))}) - their own "
            "queue and workers")
        self._hint(
            "Flower: warm_cache jobs in state SHED, result {'outcome': 'SHED', 'reason': "
            "'deadline passed ...'}; "
            f"{self.flower}/resilience and `jobs status`: the optional tier's shed count.")

    def poison(self) -> None:
        self._title(5, "a job that can never succeed is dead-lettered, not retried")
        order = self._order("poison")
        self.poison_orders.add(order)
        sent = self._charge(order, amount_cents=-500)
        self._finish([sent])
        self.console.print(f"  charge of -5.00 for {order}: {_outcome(sent.result)} "
                           "(NonRetryable: bad input; no retry, no vendor call)")
        for entry in list_entries(self._engine(), limit=1, task_name=charge_payment.name):
            self.console.print(escape(
                f"  dead letter {entry.id}: {entry.task_name} [{entry.task_id}] by "
                f"{entry.guard} after {entry.attempts} attempt(s): {entry.reason}"))
        self._hint("`jobs dead-letters list` lists it, `jobs dead-letters show ID` has its "
                   "arguments and error, `requeue ID` sends it again once fixed. Flower: the "
                   "charge is FAILURE with DeadLettered('DEAD-LETTERED by retry: ...').")

    def summary(self) -> bool:
        """Print the one-screen summary; True when every order has exactly one ledger row."""
        charged = set(self.orders) - self.poison_orders
        with self._engine().connect() as connection:
            rows = dict(connection.execute(
                select(LedgerEntry.order_id, func.count())
                .where(LedgerEntry.order_id.in_(self.orders))
                .group_by(LedgerEntry.order_id)
            ).all())
        twice = sorted(order for order, count in rows.items() if count > 1)
        missing = sorted(charged - set(rows))
        self._title(None, "summary")
        self.console.print("  jobs sent: " + ", ".join(
            f"{name.rsplit('.', 1)[-1]} {count}" for name, count in sorted(self.sent.items())))
        verdict = "[green]exactly one per order[/green]" if not (twice or missing) else (
            f"[red]{len(twice)} charged twice, {len(missing)} missing[/red]")
        self.console.print(
            f"  ledger: {len(charged)} orders, {sum(rows.values())} charges - {verdict} "
            f"(duplicates sent: {self.sent['jobs.examples.charge_payment'] - len(self.orders)})")
        vendor = self._vendor().status()
        self.console.print(
            f"  vendor: {vendor['calls'] - self.vendor_before['calls']} calls, "
            f"{vendor['charges'] - self.vendor_before['charges']} charges")
        table = Table("guard", "outcome", Column("count", justify="right"),
                      title="outcomes by guard (this run)")
        for (guard, outcome), value in sorted(self._counters().items()):
            delta = value - self.counters_before.get((guard, outcome), 0)
            if delta > 0:
                table.add_row(guard, outcome, str(delta))
        self.console.print(table)
        state = self._breaker().describe()
        self.console.print(f"  breaker payments-vendor: {state.state} (opened "
                           f"{state.times_opened} times in all); the demo took "
                           f"{time.monotonic() - self.started:.0f} s")
        return not (twice or missing)

    # -- sending and waiting ---------------------------------------------------------------
    def _order(self, name: str) -> str:
        order = f"o-{self.run_id}-{name}"
        self.orders.add(order)
        return order

    def _charge(self, order: str, *, amount_cents: int = 2500) -> Sent:
        # A duplicate repeats the order exactly: the same key with other arguments would be
        # refused (IdempotencyKeyReused), not replayed.
        account = self.accounts.setdefault(order, random.choice(ACCOUNTS))
        return self._send(charge_payment, order_id=order, account=account,
                          amount_cents=amount_cents)

    def _send(self, task: Any, **kwargs: Any) -> Sent:
        sent = Sent(sent_at=time.time(), result=task.delay(**kwargs))
        self.sent[task.name] += 1
        return sent

    def _finish(self, sends: list[Sent], *, poll_seconds: float = 0.1) -> list[Sent]:
        """Wait until every job sent is done (a deferred one comes back with its id)."""
        pending = {s.result.id for s in sends if getattr(s.result, "id", None)}

        def done() -> bool:
            pending.difference_update([t for t in pending if self.app.AsyncResult(t).ready()])
            return not pending

        self._wait(done, f"{len(pending)} jobs to finish", poll_seconds=poll_seconds)
        return [s for s in sends if getattr(s.result, "id", None)]

    def _wait(self, check: Callable[[], bool], what: str, *, poll_seconds: float = 0.2) -> None:
        deadline = time.monotonic() + self.options.wait_seconds
        while not check():
            if time.monotonic() > deadline:
                raise DemoError(f"timed out after {self.options.wait_seconds:g} s waiting for "
                                f"{what}; are the tier workers up (`jobs up`)?")
            time.sleep(poll_seconds)

    # -- what the demo reads ---------------------------------------------------------------
    def _engine(self) -> Any:
        return stores_for(self.app).engine()

    def _vendor(self) -> Any:
        return VendorControl(self.app.settings.effective_vendor_url)

    def _breaker(self) -> Any:
        return CircuitBreaker(BreakerConfig(name=PAYMENTS_VENDOR),
                              RedisBreakerBackend.of_app(self.app))

    def _counters(self) -> dict[tuple[str, str], int]:
        """The fleet-wide counters summed by (guard, outcome)."""
        totals: Counter[tuple[str, str]] = Counter()
        for labels, value in read_all(stores_for(self.app).redis()):
            totals[(labels.get("guard", ""), labels.get("outcome", ""))] += value
        return dict(totals)

    def _counter(self, guard: str, outcome: str, *, since_start: bool = False) -> int:
        """A fleet-wide counter now, or what it gained since the demo started."""
        before = self.counters_before.get((guard, outcome), 0) if since_start else 0
        return self._counters().get((guard, outcome), 0) - before

    # -- printing --------------------------------------------------------------------------
    def _title(self, number: int | None, text: str) -> None:
        prefix = f"phase {number}: " if number is not None else ""
        elapsed = time.monotonic() - self.started
        self.console.rule(f"[bold]{prefix}{text}[/bold] [dim]{elapsed:.0f} s[/dim]", align="left")

    def _hint(self, text: str) -> None:
        self.console.print(f"  [cyan]look:[/cyan] {text}")


def run_story(app: Any, *, options: DemoOptions, console: Console) -> bool:
    """Tell the story on the running platform; True when every order was charged once.

    Raises:
        DemoError: the vendor or a worker tier is missing, or a phase timed out.
    """
    try:
        return Story(app, console, options).run()
    except VendorError as exc:
        raise DemoError(str(exc)) from None


def _outcome(result: Any) -> str:
    """A finished job's guard outcome (in the result's metadata), SUCCEEDED or FAILED."""
    if result.state == "FAILURE":
        return "DEAD-LETTERED" if "DEAD-LETTERED" in str(result.result) else "FAILED"
    decision = outcome_of(result)
    return decision.outcome.value if decision is not None else "SUCCEEDED"


def _latencies(sends: Iterable[Sent]) -> list[float]:
    """Seconds from send to done (the result's `date_done`, UTC, written by the worker)."""
    return [max(0.0, done.replace(tzinfo=done.tzinfo or dt.timezone.utc).timestamp() - s.sent_at)
            for s in sends if (done := s.result.date_done) is not None]


def _ms(values: list[float], pick: Callable[[list[float]], float] = statistics.median) -> str:
    return f"{pick(values) * 1000:.0f} ms" if values else "n/a"


def run_steady(*, rate: float, seconds: float, console: Console) -> None:
    """Enqueue about `rate` jobs per second (70% critical, 20% standard, 10% optional)."""
    senders: dict[str, Callable[[], Any]] = {
        "critical": lambda: charge_payment.delay(
            order_id=f"ord-{uuid.uuid4().hex[:12]}", account=random.choice(ACCOUNTS),
            amount_cents=random.randint(100, 50_000)),
        "standard": lambda: build_daily_report.delay(
            day=(dt.date.today() - dt.timedelta(days=random.randint(0, 6))).isoformat()),
        "optional": lambda: warm_cache.delay(account=random.choice(ACCOUNTS)),
    }
    started = time.monotonic()
    counts = dict.fromkeys((*senders, "refused"), 0)
    console.print(f"demo: {rate:g} jobs/s; Ctrl-C to stop")
    try:
        while not seconds or time.monotonic() - started < seconds:
            tier = random.choices(list(senders), weights=(7, 2, 1))[0]
            try:
                senders[tier]()
                counts[tier] += 1
            except ResilienceError as exc:
                counts["refused"] += 1
                console.print(f"[yellow]refused: {type(exc).__name__}: {exc}[/yellow]")
            if sum(counts.values()) % 50 == 0:
                console.print(f"enqueued {counts}")
            time.sleep(1.0 / max(rate, 0.1))
    except KeyboardInterrupt:
        pass
    console.print(f"demo finished: {counts}")


def ensure_vendor(settings: Any, console: Console) -> Any:
    """Make sure a payment vendor answers: if none does (a platform not started by `jobs up`),
    start the simulated one in this process and return it (call `shutdown()`); else None.

    Raises:
        DemoError: no vendor answers at `JOBS_VENDOR_URL`, or the simulated vendor's port
            is taken by something that is not a vendor.
    """
    with contextlib.suppress(VendorError):
        VendorControl(settings.effective_vendor_url, timeout_seconds=2.0).status()
        return None  # a vendor answers
    if not settings.simulated_vendor:
        raise DemoError(f"no payment vendor answers at JOBS_VENDOR_URL="
                        f"{settings.effective_vendor_url}")
    if port_in_use(settings.vendor_port):
        raise DemoError(f"port {settings.vendor_port} (JOBS_VENDOR_PORT) is taken by something "
                        "that is not the simulated vendor; choose a free port")
    server = start_in_thread(settings.vendor_port)
    console.print(f"[yellow]no vendor was running: started the simulated vendor in this "
                  f"process on {settings.effective_vendor_url} (`jobs up` runs it for good)"
                  "[/yellow]")
    return server
