"""The composition matrix on real workers: every guard pair and the payment stack, under faults.

Two kinds of test:

* a sweep runs every stack once, side by side, with duplicate deliveries, a retried key,
  and the deferrals the limits cause: every stack is exercised in every session;
* a hypothesis state machine (`machines.FaultMachine`) picks, per example, a few stacks,
  how many duplicate `.delay()`s per key, and an ordered schedule of faults — a pool process
  SIGKILLed in the middle of a body, the guard Redis or PostgreSQL down (the proxy
  SIGKILLed) while jobs arrive, more duplicates later — then drains and checks the
  invariants of `harness` (nothing lost, effects once or at least once, no overlap under a
  lock, no commit outside the lock, concurrency within its limit).

The stacks are split in two groups so each failure points at one cause: the stacks whose
transactional commit must happen inside a lock (idempotent + singleton, idempotent +
exclusive, payment) and all the others. Before 8851007 ("Pipeline v2") the first group
failed: the exclusivity guard gave its lock back (`after_run`, innermost first) before the
idempotency guard committed the body's transaction, so the trigger saw every such commit
outside the lock. Before 69a673c the second group failed too: with PostgreSQL refusing
connections, the idempotency store's connect error escaped unwrapped, so jobs FAILED
instead of being DEFERRED (fail closed).

Budget (see `machines.budget`): 5 examples of up to 6 steps for the first group, 4 of up
to 6 for the second, derandomized, not shrunk (`make stress`: 40 and 20 of up to 8); the
folder runs in under a minute on 2 cores, most of it the first machine. (Was 8 and 6: cut
to keep `make test` within its 20 minutes.)
"""

from __future__ import annotations

import pytest

from tests.resilience.compose.harness import Context, Run, describe
from tests.resilience.compose.machines import FaultMachine, run_machine
from tests.resilience.compose.tasks import STACKS, Stack

OUTSIDE_LOCK_COMMIT = tuple(stack for stack in STACKS if not stack.commit_inside_lock)
INSIDE_LOCK_COMMIT = tuple(stack for stack in STACKS if stack.commit_inside_lock)


def sweep(context: Context, stacks: tuple[Stack, ...]) -> None:
    """Every stack once, side by side: two keys, two deliveries each, one key retried."""
    run = Run(context, "sweep")
    for stack in stacks:
        for fail_first in (0, 1 if stack.retries else 0):
            key = run.new_key(stack, fail_first=fail_first, pause=0.02)
            run.enqueue(stack, key, copies=2)
    finals = run.drain()
    problems = run.check(finals)
    print(f"sweep {run.id}: {run.summary}")
    assert not problems, describe(run, problems)


@pytest.mark.timeout(120)
def test_every_stack_once(compose: Context) -> None:
    """Each stack that does not commit under a lock: duplicates, a retry, limit deferrals."""
    sweep(compose, OUTSIDE_LOCK_COMMIT)


@pytest.mark.timeout(120)
def test_every_stack_once_commit_inside_lock(compose: Context) -> None:
    """idempotent+singleton, idempotent+exclusive, payment: the transactional effect commits
    while the lock is still held (the deferred trigger finds the holder's registry row)."""
    sweep(compose, INSIDE_LOCK_COMMIT)


@pytest.mark.chaos
@pytest.mark.timeout(240)
def test_fault_matrix(compose: Context) -> None:
    """Stacks without a commit under a lock, under duplicates, retries, SIGKILL mid-body,
    Redis down and PostgreSQL down: nothing lost, effects as promised, locks exclusive."""
    run_machine(FaultMachine, compose, OUTSIDE_LOCK_COMMIT, examples=5, steps=6)


@pytest.mark.soak
@pytest.mark.chaos
@pytest.mark.timeout(1800)
def test_fault_matrix_soak(compose: Context) -> None:
    """`make stress`: both groups with a larger budget (40 and 20 examples of up to 8
    steps) than `make test` runs."""
    run_machine(FaultMachine, compose, OUTSIDE_LOCK_COMMIT, examples=40, steps=8)
    run_machine(FaultMachine, compose, INSIDE_LOCK_COMMIT, examples=20, steps=8)


@pytest.mark.chaos
@pytest.mark.timeout(180)
def test_fault_matrix_commit_inside_lock(compose: Context) -> None:
    """idempotent+singleton, idempotent+exclusive, payment under the same faults: the
    effect commits exactly once per key and always inside the lock."""
    run_machine(FaultMachine, compose, INSIDE_LOCK_COMMIT, examples=4, steps=6)
