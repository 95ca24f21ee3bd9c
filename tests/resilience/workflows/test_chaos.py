"""Durable workflows under chaos, their compensations, and resuming a stopped one (issue 27).

Chaos (one run for both): workflows of shape chain → group of 5 → chord callback → chain of 2
(`chain(a, group(b1..b5), c, d1, d2)`, positions 0..8) and workflows whose third step fails
terminally (`chain(a, b, fail, d)`, each step with a compensation), started at once, while
pool processes and whole workers are SIGKILLed at random and the result backend's Redis
database is flushed once mid-run. Invariants, read from ledgers without unique constraints:
every workflow ends (succeeded, or compensated), every step's transactional effect and
every chord callback's effect exactly once, with the task id the workflow fixed for it;
every final value what plain Celery's canvas would give; the compensations of the first two
steps exactly once each, in reverse completion order, and of no other step.

`make test` runs 24 + 6 workflows (a pool kill every 0.5-1.2 s, one whole worker); the soak
(`make stress`) 200 + 40 (a pool kill every 0.2-0.5 s, three whole workers).

Resume: a workflow stopped by a dead-lettered step, fixed (a row the step reads) and retried
from that step completes, and no earlier step runs again (execution counts).
"""

from __future__ import annotations

import collections
import json
import os
import random
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest
import redis
from celery import chain, group
from sqlalchemy import text

from resilience.workflows import (
    StepState,
    WorkflowFailed,
    WorkflowState,
    describe,
    durable,
    retry,
)
from tests.chaos import kill_pool_child, restore_unacked, supervise
from tests.resilience.workflows import tasks_chaos as tasks
from tests.resilience.workflows.tasks_chaos import combine

#: Workers' limits: short, so the soak's whole-worker kills cost seconds, and enough
#: deliveries that the poison check never dead-letters a step the test killed.
WORKER_ENV = {
    **{f"JOBS_{tier}__SOFT_TIME_LIMIT_SECONDS": "8"
       for tier in ("CRITICAL", "STANDARD", "OPTIONAL")},
    **{f"JOBS_{tier}__HARD_TIME_LIMIT_SECONDS": "10"
       for tier in ("CRITICAL", "STANDARD", "OPTIONAL")},
    "JOBS_MAX_COUNTDOWN_SECONDS": "5",
    "JOBS_VISIBILITY_TIMEOUT_SECONDS": "45",
    "JOBS_MAX_DELIVERIES": "1000",
}
#: The test stands in for the transport's visibility sweep (every ~100 s on its own) with a
#: shorter timeout than the workers': a message unacked this long after a whole-worker kill
#: goes back to its queue. It is longer than any step, deferral or countdown here, so a live
#: worker rarely holds one that long; when it does, the copy is a duplicate delivery, which
#: the workflow must REPLAY anyway.
RESTORE_AFTER_SECONDS = 6
MEMBERS = 5
#: A compensation's final states when it took effect (see the compensation assertions).
DONE = {StepState.SUCCEEDED, StepState.REPLAYED}
#: Each step's body lasts this long, so a SIGKILL often lands inside one.
STEP_PAUSE_SECONDS = 0.1


class Size:
    """One chaos run's size: `make test`'s by default, the soak's with `soak=True`."""

    def __init__(self, *, soak: bool) -> None:
        #: Chord workflows, and failing ones with compensations (a quarter, a fifth as many).
        self.workflows = int(os.environ.get("WORKFLOW_CHAOS_WORKFLOWS", 200 if soak else 24))
        self.compensated = max(2, self.workflows // (5 if soak else 4))
        #: The kills last until every workflow ended (compensations included); this only
        #: bounds a run that stopped making progress.
        self.chaos_seconds = 600 if soak else 180
        #: Between two pool-process kills: gentler in make test, so the run ends within a
        #: minute under chaos on a loaded two-core box (a pool process takes ~1 s to come
        #: back, and its step's claim blocks the redelivery for its lease).
        self.kill_pause_seconds = (0.2, 0.5) if soak else (0.5, 1.2)
        self.worker_kills = 3 if soak else 1
        self.drain_seconds = 240 if soak else 30


# -- fixtures (the outbox `relay` thread comes from conftest.py) ----------------------------
@pytest.fixture()
def ledger_run(engine: Any) -> str:
    """A fresh run id; the chaos ledgers exist."""
    with engine.begin() as connection:
        for statement in tasks.CREATE_LEDGERS:
            connection.execute(statement)
    return uuid.uuid4().hex[:10]


# -- the workflows ---------------------------------------------------------------------------
def chord_workflow(run: str, tag: str) -> Any:
    """chain(a, group(b1..b5), c, d1, d2): c is the chord callback (positions 0..8)."""
    def make(name: str, *args: Any) -> Any:
        return tasks.step.s(*args, run=run, tag=tag, name=name,
                            pause_seconds=STEP_PAUSE_SECONDS)

    return chain(make("a", None), group([make(f"b{index}") for index in range(1, MEMBERS + 1)]),
                 make("c"), make("d1"), make("d2"))


def chord_result() -> str:
    """What plain Celery's canvas returns for `chord_workflow`."""
    first = combine(None, "a")
    members = [combine(first, f"b{index}") for index in range(1, MEMBERS + 1)]
    return combine(combine(combine(members, "c"), "d1"), "d2")


def compensated_workflow(run: str, tag: str) -> Any:
    """chain(a, b, fail, d), every step with a compensation; the third fails terminally."""
    def make(name: str, *args: Any, **options: Any) -> Any:
        return tasks.step.s(*args, run=run, tag=tag, name=name,
                            pause_seconds=STEP_PAUSE_SECONDS, **options).set(
            compensate=tasks.undo.s(run=run, tag=tag, name=f"undo-{name}"))

    return chain(make("a", None), make("b"), make("fail", fail=True), make("d"))


# -- ledgers ---------------------------------------------------------------------------------
def effects(engine: Any, run: str) -> dict[tuple[str, str], list[str]]:
    """(tag, step name) → the task ids of its committed effects."""
    found: dict[tuple[str, str], list[str]] = collections.defaultdict(list)
    with engine.connect() as connection:
        for row in connection.execute(text(
                "SELECT tag, name, task_id FROM workflow_chaos_effects WHERE run = :run "
                "ORDER BY id"), {"run": run}):
            found[(row.tag, row.name)].append(row.task_id)
    return found


def compensations(engine: Any, run: str) -> dict[str, list[tuple[str, Any]]]:
    """tag → its compensations' (name, result received) in commit order."""
    found: dict[str, list[tuple[str, Any]]] = collections.defaultdict(list)
    with engine.connect() as connection:
        for row in connection.execute(text(
                "SELECT tag, name, result FROM workflow_chaos_compensations WHERE run = :run "
                "ORDER BY id"), {"run": run}):
            found[row.tag].append((row.name, row.result))
    return found


def executions(engine: Any, run: str, kind: str = "step") -> collections.Counter[tuple[str, str]]:
    """(tag, name) → how many times its body started (a SIGKILLed one starts again)."""
    with engine.connect() as connection:
        return collections.Counter(
            (row.tag, row.name) for row in connection.execute(text(
                "SELECT tag, name FROM workflow_chaos_executions WHERE run = :run "
                "AND kind = :kind"), {"run": run, "kind": kind}))


def progress(engine: Any, run: str) -> int:
    """Workflows whose last effect committed: d2 of a chord workflow, or the second
    (last) compensation of a compensated one."""
    with engine.connect() as connection:
        return int(connection.execute(text(
            "SELECT (SELECT count(*) FROM workflow_chaos_effects WHERE run = :run "
            "        AND name = 'd2') "
            "     + (SELECT count(*) FROM workflow_chaos_compensations WHERE run = :run "
            "        AND name = 'undo-a')"), {"run": run}).scalar_one())


def effect_count(engine: Any, run: str) -> int:
    """Committed step effects so far (each workflow's steps commit one after another)."""
    with engine.connect() as connection:
        return int(connection.execute(text(
            "SELECT count(*) FROM workflow_chaos_effects WHERE run = :run"),
            {"run": run}).scalar_one())


def timeline(engine: Any, run: str, seconds: float = 5.0) -> list[int]:
    """Effects committed per `seconds` since the first (how the run went, for the tally)."""
    with engine.connect() as connection:
        rows = connection.execute(text(
            "SELECT floor(extract(epoch FROM committed_at - min(committed_at) OVER ()) "
            "/ :seconds)::int AS bucket FROM workflow_chaos_effects WHERE run = :run"),
            {"run": run, "seconds": seconds}).scalars().all()
    counts = collections.Counter(rows)
    return [counts.get(bucket, 0) for bucket in range(max(counts, default=-1) + 1)]


def flush_result_backend(app: Any) -> int:
    """FLUSHDB on the result backend's Redis database (here also the guards' shared state),
    refusing when that database is the broker's; returns how many keys it held."""
    def where(url: str) -> tuple[Any, ...]:
        options = redis.Redis.from_url(url).connection_pool.connection_kwargs
        return options.get("host"), options.get("port"), options.get("path"), options.get("db")

    backend_url, broker_url = str(app.conf.result_backend), str(app.conf.broker_url)
    assert backend_url.startswith("redis://") and broker_url.startswith("redis://")
    assert where(backend_url) != where(broker_url), "the result backend is the broker's db"
    client = redis.Redis.from_url(backend_url)
    try:
        held = int(client.dbsize())
        client.flushdb()
    finally:
        client.close()
    return held


# -- chaos -----------------------------------------------------------------------------------
def ready(app: Any, worker: Any) -> bool:
    """Whether a (re)started worker answers a ping, so its pool has started."""
    return bool(app.control.ping(destination=[worker.nodename], timeout=0.3))


def sigkill_loop(app: Any, workers: list[Any], rng: random.Random, size: Size,
                 tick: Callable[[], bool]) -> tuple[dict[str, int], float]:
    """`tests.chaos.chaos_loop` with a `tick` each round (it says when all is done) and
    a restarted worker spared pool kills until it answers a ping: a pool process killed
    before its pool started makes Celery exit the whole worker ("Could not start worker
    processes"), which on a loaded box costs another ~15 s start and no more chaos.
    Returns the kill counts and when the last whole worker was killed."""
    kills = {"child": 0, "worker": 0, "exited": 0}
    starting: set[int] = set()
    started = last_worker_kill = time.monotonic()
    while time.monotonic() - started < size.chaos_seconds and not tick():
        time.sleep(rng.uniform(*size.kill_pause_seconds))
        for index, worker in enumerate(workers):
            if supervise([worker]):
                kills["exited"] += 1
                starting.add(index)
        starting = {index for index in starting if not ready(app, workers[index])}
        index = rng.randrange(len(workers))
        if index in starting:
            continue
        victim = workers[index]
        if (kills["worker"] < size.worker_kills
                and time.monotonic() - started > 3 + 6 * kills["worker"]):
            victim.sigkill()
            last_worker_kill = time.monotonic()
            victim.start(wait=False)
            starting.add(index)
            kills["worker"] += 1
        elif kill_pool_child(victim, rng):
            kills["child"] += 1
    return kills, last_worker_kill


def chaos_run(app: Any, stores: Any, engine: Any, worker_factory: Callable[..., Any],
              run: str, size: Size, seed: int) -> None:
    rng = random.Random(seed)
    started = time.monotonic()
    runs: dict[str, tuple[str, Any]] = {}  # tag -> (kind, durable run)
    kinds = ["chord"] * size.workflows + ["compensated"] * size.compensated
    rng.shuffle(kinds)
    for index, kind in enumerate(kinds):
        tag = f"{kind}-{index}"
        build = chord_workflow if kind == "chord" else compensated_workflow
        runs[tag] = (kind, durable(build(run, tag), name=f"chaos-{kind}").apply_async())
    total = len(runs)
    print(f"{total} workflows written in {time.monotonic() - started:.1f}s")

    workers = [worker_factory("critical", name=f"workflow-chaos{index}", concurrency=2,
                              env=WORKER_ENV, wait=False) for index in range(2)]
    for worker in workers:
        worker.wait_ready()
    chaos_started = time.monotonic()

    # SIGKILLs to the end; once about half the steps took effect, the result backend's
    # Redis is flushed; messages a killed worker held come back RESTORE_AFTER_SECONDS on.
    steps = size.workflows * (MEMBERS + 4) + size.compensated * 2
    flushed: dict[str, int] = {}

    def tick() -> bool:
        if not flushed and effect_count(engine, run) >= steps // 2:
            flushed.update(at=effect_count(engine, run), keys=flush_result_backend(app))
        restore_unacked(app, RESTORE_AFTER_SECONDS)
        return progress(engine, run) == total

    kills, last_worker_kill = sigkill_loop(app, workers, rng, size, tick)
    if not flushed:  # a slow run: flush now, still before the end
        flushed.update(at=effect_count(engine, run), keys=flush_result_backend(app))
    flushed_at, flushed_keys = flushed["at"], flushed["keys"]
    with engine.connect() as connection:
        # Compensations that committed while processes were being killed.
        undone_under_chaos = int(connection.execute(text(
            "SELECT count(*) FROM workflow_chaos_compensations WHERE run = :run "
            "AND committed_at <= clock_timestamp()"), {"run": run}).scalar_one())
    print(f"chaos ended at {time.monotonic() - chaos_started:.1f}s: {progress(engine, run)} of "
          f"{total} done, flushed {flushed_keys} keys at {flushed_at} of {steps} effects, "
          f"kills={kills}")

    # Drain: messages a killed worker held come back once unacked RESTORE_AFTER_SECONDS;
    # past the deadline, wait on only while workflows keep finishing.
    deadline = (max(last_worker_kill + RESTORE_AFTER_SECONDS, time.monotonic())
                + size.drain_seconds)
    done, last_progress = progress(engine, run), time.monotonic()
    while done < total:
        now = time.monotonic()
        if now >= deadline and now - last_progress > RESTORE_AFTER_SECONDS * 2:
            break
        kills["exited"] += supervise(workers)
        restore_unacked(app, RESTORE_AFTER_SECONDS)
        time.sleep(0.5)
        latest = progress(engine, run)
        if latest > done:
            done, last_progress = latest, time.monotonic()
    time.sleep(2)  # a second copy of an effect or compensation, if any, has time to show

    summaries = {tag: describe(stores, durable_run.id) for tag, (_, durable_run) in runs.items()}
    states = collections.Counter(summary.state for summary in summaries.values())
    found, undone = effects(engine, run), compensations(engine, run)
    ran = executions(engine, run)
    print("workflow-chaos-tally " + json.dumps({
        "workflows": size.workflows, "compensated": size.compensated,
        "states": {str(state): n for state, n in states.items()},
        "effects": sum(len(ids) for ids in found.values()),
        "executions": sum(ran.values()), "flushed_keys": flushed_keys,
        "compensations_under_chaos": undone_under_chaos,
        "compensation_states": dict(collections.Counter(
            str(step.compensation_state) for summary in summaries.values()
            for step in summary.steps if step.compensation_state is not None)),
        "seconds": round(time.monotonic() - started, 1), "per_5s": timeline(engine, run),
        **kills}))

    chord_names = ["a", *(f"b{index}" for index in range(1, MEMBERS + 1)), "c", "d1", "d2"]
    for tag, (kind, durable_run) in runs.items():
        summary = summaries[tag]
        if kind == "chord":
            assert summary.state == WorkflowState.SUCCEEDED, (tag, summary.state, summary.error)
            for position, name in enumerate(chord_names):
                recorded = summary.steps[position]
                assert recorded.state == StepState.SUCCEEDED, (tag, name, recorded.state)
                # Once, and by the task id the workflow fixed for that step.
                assert found[(tag, name)] == [recorded.task_id], (tag, name, found[(tag, name)])
            assert durable_run.get(timeout=10) == chord_result(), tag
            assert tag not in undone, (tag, undone[tag])
        else:
            assert summary.state == WorkflowState.COMPENSATED, (tag, summary.state, summary.error)
            assert found[(tag, "a")] == [summary.steps[0].task_id], (tag, found[(tag, "a")])
            assert found[(tag, "b")] == [summary.steps[1].task_id], (tag, found[(tag, "b")])
            assert not found.get((tag, "fail")) and not found.get((tag, "d")), tag
            assert summary.steps[2].state == StepState.DEAD_LETTERED, (tag, summary.steps[2])
            # Reverse completion order, each once, each given its step's result.
            assert undone[tag] == [("undo-b", combine(combine(None, "a"), "b")),
                                   ("undo-a", combine(None, "a"))], (tag, undone[tag])
            # A compensation records its state after its body's commit, in a transaction
            # of its own (unlike a step): a SIGKILL in between leaves it for its redelivery,
            # which the idempotency record REPLAYS (the ledger shows no second effect).
            assert {summary.steps[0].compensation_state,
                    summary.steps[1].compensation_state} <= DONE, tag
            assert summary.steps[2].compensation_state is None, tag
            assert summary.steps[3].compensation_state is None, tag
            with pytest.raises(WorkflowFailed) as failure:
                durable_run.get(timeout=10)
            assert failure.value.state == WorkflowState.COMPENSATED, tag
    assert not [key for key in found if key[0] not in runs], "effects of unknown workflows"
    assert kills["child"] > 5 and kills["worker"] >= 1, f"too little chaos: {kills}"
    assert flushed_keys and flushed_at < steps, "the flush did not happen mid-run"
    assert undone_under_chaos, "no compensation ran under chaos"


@pytest.mark.chaos
@pytest.mark.timeout(300)
def test_workflows_under_sigkill_and_a_result_backend_flush_take_effect_once(
        app: Any, stores: Any, engine: Any, worker_factory: Callable[..., Any], relay: Any,
        ledger_run: str, purge_queues: None) -> None:
    """24 chord workflows and 6 failing ones, a pool process SIGKILLed every second or so
    and a whole worker once until all ended, the result backend flushed mid-run: every
    workflow ends, every effect and chord callback once, compensations once each in
    reverse order."""
    chaos_run(app, stores, engine, worker_factory, ledger_run, Size(soak=False), seed=27)


@pytest.mark.soak
@pytest.mark.chaos
@pytest.mark.timeout(1200)
def test_200_workflows_under_sigkill_and_a_result_backend_flush_take_effect_once(
        app: Any, stores: Any, engine: Any, worker_factory: Callable[..., Any], relay: Any,
        ledger_run: str, purge_queues: None) -> None:
    """The soak size: 200 chord workflows and 40 failing ones, three whole-worker kills."""
    chaos_run(app, stores, engine, worker_factory, ledger_run, Size(soak=True), seed=2027)


# -- resume ----------------------------------------------------------------------------------
@pytest.mark.parametrize("from_step", [3, None], ids=["from-step-3", "the-failed-step"])
def test_a_dead_lettered_step_fixed_and_retried_completes_without_rerunning_earlier_steps(
        app: Any, stores: Any, engine: Any, tier_workers: Any, relay: Any, ledger_run: str,
        from_step: int | None) -> None:
    """chain(a, group(b1, b2), c, d) with c refusing until fixed: c is dead-lettered and the
    workflow fails; after the fix, retry from c completes it with c's recorded input, and
    a, b1, b2 ran once each, c twice (refused, then done), d once."""
    tag = f"resume-{from_step}"

    def make(name: str, *args: Any, **options: Any) -> Any:
        return tasks.step.s(*args, run=ledger_run, tag=tag, name=name, **options)

    durable_run = durable(chain(make("a", None), group(make("b1"), make("b2")),
                                make("c", gated=True), make("d")), name="resume").apply_async()
    with pytest.raises(WorkflowFailed) as failure:
        durable_run.get(timeout=30)
    assert failure.value.state == WorkflowState.FAILED
    stopped = describe(stores, durable_run.id)
    assert stopped.state == WorkflowState.FAILED
    assert [step.state for step in stopped.steps[:4]] == [StepState.SUCCEEDED] * 3 + [
        StepState.DEAD_LETTERED]
    assert stopped.steps[4].state != StepState.SUCCEEDED
    assert executions(engine, ledger_run) == {(tag, "a"): 1, (tag, "b1"): 1, (tag, "b2"): 1,
                                       (tag, "c"): 1}

    with engine.begin() as connection:
        connection.execute(text("INSERT INTO workflow_chaos_fixes (run, tag) VALUES (:r, :t)"),
                           {"r": ledger_run, "t": tag})
    retried = retry(stores, durable_run.id, from_step=from_step)
    assert retried.id == durable_run.id and retried.state == WorkflowState.RUNNING

    first = combine(None, "a")
    expected = combine(combine([combine(first, "b1"), combine(first, "b2")], "c"), "d")
    assert durable_run.get(timeout=30) == expected
    done = describe(stores, durable_run.id)
    assert done.state == WorkflowState.SUCCEEDED
    assert [step.state for step in done.steps] == [StepState.SUCCEEDED] * 5
    assert [step.task_id for step in done.steps[:3]] == [step.task_id
                                                         for step in stopped.steps[:3]]
    assert executions(engine, ledger_run) == {(tag, "a"): 1, (tag, "b1"): 1, (tag, "b2"): 1,
                                       (tag, "c"): 2, (tag, "d"): 1}
    assert {key: len(ids) for key, ids in effects(engine, ledger_run).items()} == {
        (tag, name): 1 for name in ("a", "b1", "b2", "c", "d")}
