"""The hypothesis state machines of the composition matrix, shared by its test modules.

Examples are real runs (seconds each), so the budget is small and fixed: `derandomize=True`
(the same schedules every session), no shrinking (a shrink step would be another real run;
the failing schedule is reported instead), no example database.
"""

from __future__ import annotations

from typing import Any, ClassVar

from hypothesis import HealthCheck, Phase, note, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    precondition,
    rule,
    run_state_machine_as_test,
)

from tests.resilience.compose.harness import Context, Run, describe
from tests.resilience.compose.tasks import Stack


def budget(examples: int, steps: int) -> settings:
    """A small fixed hypothesis budget: same schedules every session, no shrinking."""
    return settings(max_examples=examples, stateful_step_count=steps, deadline=None,
                    derandomize=True, database=None, phases=(Phase.explicit, Phase.generate),
                    report_multiple_bugs=False, suppress_health_check=list(HealthCheck),
                    print_blob=False)


class ComposeMachine(RuleBasedStateMachine):
    """One example: a few stacks, jobs with duplicate deliveries, and what subclasses add.

    The state lives in a `Run`; `teardown` drains it and checks the invariants, so every
    example ends with a check whatever its steps were.

    Violations are collected in `failures` (with the example's steps) instead of raised:
    hypothesis would run a failing example again to confirm it, which here is another real
    run whose timing differs (reported as "flaky"). Once one example failed, the remaining
    examples are idle: they draw what an active one would (hypothesis checks that the same
    choices lead to the same draws) but publish, kill and take down nothing. The test
    asserts on `failures` after the machine.
    """

    context: ClassVar[Context | None] = None
    group: ClassVar[tuple[Stack, ...]] = ()
    failures: ClassVar[list[str]] = []
    #: One line per example (steps and outcome counts), printed by `run_machine`.
    log: ClassVar[list[str]] = []

    def __init__(self) -> None:
        super().__init__()
        assert self.context is not None, "set ComposeMachine.context before running it"
        self.idle = bool(self.failures)
        self.run = Run(self.context, "matrix")
        self.stacks: list[Stack] = []
        self.steps: list[str] = []

    def step(self, line: str) -> None:
        self.steps.append(line)
        note(line)

    def _draw_jobs(self, data: Any, *, label: str) -> list[tuple[Stack, str, int]]:
        """New keys of one chosen stack, each with a number of deliveries (drawn only)."""
        stack = data.draw(st.sampled_from(self.stacks), label=f"{label} stack")
        keys = data.draw(st.integers(1, 2), label=f"{label} keys")
        drawn = []
        for _ in range(keys):
            fail_first = data.draw(st.integers(0, 2), label="fail first") if stack.retries else 0
            copies = data.draw(st.integers(1, 3), label="deliveries")
            key = self.run.new_key(stack, fail_first=fail_first, pause=0.02)
            drawn.append((stack, key, copies))
        return drawn

    def _enqueue(self, drawn: list[tuple[Stack, str, int]], label: str) -> None:
        for stack, key, copies in drawn:
            self.run.enqueue(stack, key, copies=copies)
            fail_first = self.run.arguments[(stack.name, key)]["fail_first"]
            self.step(f"{label}: {stack.name} {key} x{copies}"
                      + (f", first {fail_first} attempts fail" if fail_first else ""))

    @initialize(data=st.data())
    def choose_stacks(self, data: Any) -> None:
        self.stacks = data.draw(st.lists(st.sampled_from(self.group), min_size=1, max_size=3,
                                         unique_by=lambda stack: stack.name), label="stacks")
        drawn = self._draw_jobs(data, label="enqueue")
        if not self.idle:
            self.step(f"run {self.run.id}: stacks {[stack.name for stack in self.stacks]}")
            self._enqueue(drawn, "enqueue")
        self.first_step(data)

    def first_step(self, data: Any) -> None:
        """What every example of a subclass does first, after its first jobs."""

    @rule(data=st.data())
    def duplicate_deliveries(self, data: Any) -> None:
        """New keys, each delivered 1-3 times at once."""
        drawn = self._draw_jobs(data, label="enqueue")
        if not self.idle:
            self._enqueue(drawn, "enqueue")

    @precondition(lambda self: bool(self.run.arguments))
    @rule(data=st.data())
    def late_duplicate(self, data: Any) -> None:
        """One more delivery of a key already enqueued (maybe already done: a replay)."""
        stack, key = data.draw(st.sampled_from(self.run.keys()), label="late key")
        if self.idle:
            return
        self.run.enqueue(stack, key, copies=1)
        self.step(f"late duplicate: {stack.name} {key}")

    def teardown(self) -> None:
        if self.idle or not self.run.jobs:
            return
        self.context.restore()
        try:
            problems = self.run.check(self.run.drain())
        except AssertionError as error:
            problems = [str(error)]
        self.log.append(f"{' | '.join(self.steps)} => {self.run.summary}")
        if problems:
            self.context.purge()
            self.failures.append("\n".join([describe(self.run, problems), "  steps:",
                                            *(f"    {line}" for line in self.steps)]))


def run_machine(machine_class: type[ComposeMachine], context: Context,
                group: tuple[Stack, ...], examples: int, steps: int) -> None:
    """Run `examples` examples of `machine_class` over `group`; assert none violated anything."""
    failures: list[str] = []
    log: list[str] = []
    machine = type(machine_class.__name__, (machine_class,),
                   {"context": context, "group": group, "failures": failures, "log": log})
    run_state_machine_as_test(machine, settings=budget(examples, steps))
    print("\n".join(log))
    assert not failures, failures[0]


class FaultMachine(ComposeMachine):
    """Adds an ordered schedule of faults: SIGKILL mid-body, guard Redis down, PostgreSQL down.

    Faults are bounded so an example drains in seconds: an outage lasts 1-1.5 s, a kill
    waits at most 5 s for its victim to enter the body. Jobs are enqueued *during* an
    outage, so they meet the store-down policies (idempotency and locks defer, breakers,
    limits and budgets fail open); jobs already running meet it mid-flight.
    """

    @rule(data=st.data())
    def kill_mid_body(self, data: Any) -> None:
        """A slow job for a new key, its pool process SIGKILLed while the body sleeps."""
        stack = data.draw(st.sampled_from(self.stacks), label="kill stack")
        copies = data.draw(st.integers(1, 2), label="kill deliveries")
        key = self.run.new_key(stack, pause=1.0)
        if self.idle:
            return
        self.run.enqueue(stack, key, copies=copies)
        pid = self.run.wait_in_body(stack, key)
        if pid is None:
            self.step(f"kill: {stack.name} {key} x{copies} never entered its body within 5 s")
            return
        self.run.kill(pid)
        self.step(f"kill: {stack.name} {key} x{copies}, pid {pid} SIGKILLed mid-body")

    @rule(data=st.data(), seconds=st.sampled_from((1.0, 1.5)))
    def redis_down(self, data: Any, seconds: float) -> None:
        """Guard Redis unreachable while new jobs arrive, then back."""
        drawn = self._draw_jobs(data, label="during outage")
        if self.idle:
            return
        self.step(f"guard Redis down for {seconds:g} s")
        self.context.outage("redis", seconds, lambda: self._enqueue(drawn, "  enqueue"))

    @rule(data=st.data(), seconds=st.sampled_from((1.0, 1.5)))
    def postgres_down(self, data: Any, seconds: float) -> None:
        """PostgreSQL unreachable for the guards while new jobs arrive, then back."""
        drawn = self._draw_jobs(data, label="during outage")
        if self.idle:
            return
        self.step(f"PostgreSQL down for {seconds:g} s")
        self.context.outage("postgres", seconds, lambda: self._enqueue(drawn, "  enqueue"))
