"""A `@singleton` holder cut from PostgreSQL learns it lost its lock, and a resource refuses
it (issue 25, "a holder learns it lost its lock"): the session watcher makes `checkpoint()`
and the transactional commit refuse before PostgreSQL can give the lock to another worker,
and the singleton's fencing token makes the resource refuse the former holder's writes."""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest
from sqlalchemy import text

from resilience.locks import SingletonConfig
from tests.harness import wait_for
from tests.partition.conftest import Partition

pytestmark = pytest.mark.chaos

TASK = "tests.partition.singleton_writer"

#: The default watcher's bound: a cut-off holder refuses at most this long after the last
#: probe it sent that was answered (the probe period plus the probe timeout).
_DEFAULTS = SingletonConfig()
WATCH_BOUND_SECONDS = (_DEFAULTS.probe_seconds or 0.0) + _DEFAULTS.probe_timeout_seconds


def _records(partition: Partition, run_id: str, event: str, role: str | None = None
             ) -> list[dict[str, Any]]:
    return [r for r in partition.runs(run_id) if r["event"] == event
            and (role is None or r.get("role") == role)]


def _b_records(partition: Partition, run_id: str, event: str) -> list[dict[str, Any]]:
    return [r for r in _records(partition, run_id, event) if r.get("role", "").startswith("b")]


def _refusals(partition: Partition) -> dict[str, int]:
    """The idempotency guard's refused-commit counters of the task (informational: which
    refusal fired, the lock's or the dead transaction's)."""
    from resilience.counters import COUNTERS_KEY, parse_field

    client = partition.redis()
    try:
        fields = client.hgetall(COUNTERS_KEY)
    finally:
        client.close()
    found = {}
    for field, value in fields.items():
        labels = parse_field(field.decode() if isinstance(field, bytes) else field)
        if labels.get("name") == TASK and labels.get("guard") in ("idempotency", "singleton"):
            found[f"{labels['guard']}:{labels['outcome']}"] = int(value)
    return found


def _writes(partition: Partition, run_id: str) -> list[Any]:
    with partition.engine().connect() as connection:
        return connection.execute(text(
            "SELECT node, token, outcome, extract(epoch FROM written_at)::float8 AS at "
            "FROM partition_writes WHERE run_id = :run_id ORDER BY id"),
            {"run_id": run_id}).all()


class TestSingletonHolderCutFromPostgres:
    @pytest.mark.parametrize(("body_seconds", "cut_seconds"), [
        (18, None),
        pytest.param(45, 25, marks=pytest.mark.soak),
    ], ids=["short", "issue-timeline"])
    def test_the_former_holder_refuses_before_the_new_one_runs_and_is_fenced_after(
        self, healed: Partition, body_seconds: float, cut_seconds: float | None
    ) -> None:
        """Worker a holds a transactional `@singleton` that writes a fenced resource every
        0.2 s and calls `checkpoint()`; cut from PostgreSQL, a's checkpoint raises within
        the watcher's bound (5 s), before PostgreSQL frees the lock (~11 s) and b's tries
        of the key run; b holds a higher fencing token, every write of a's after b's
        first is refused, and a's transactional commit is refused: no effect row of a's,
        the run DEFERRED (its rerun writes nothing). Short: healed once b has written.
        Soak: the issue's timeline, a 45 s body cut for 25 s."""
        run_id = uuid.uuid4().hex[:12]
        a_task = healed.send(TASK, node="a", run_id=run_id, role="a", seconds=body_seconds)
        (a_start,) = wait_for(lambda: _records(healed, run_id, "start", "a"),
                              timeout_seconds=30, message="a's body starts")
        time.sleep(1)  # a writes with its token before the cut
        cut_at = healed.cut("a", "postgres")
        tries = 0
        try:
            deadline = cut_at + (cut_seconds or 25)
            while time.time() < deadline:
                if cut_seconds is None and [w for w in _writes(healed, run_id)
                                            if w.node.startswith("b")]:
                    break
                if not _b_records(healed, run_id, "start"):
                    healed.send(TASK, node="b", run_id=run_id, role=f"b{tries}", seconds=1)
                    tries += 1
                time.sleep(0.5)
        finally:
            healed_at = healed.heal("a", "postgres")
        rerun = wait_for(lambda: _records(healed, run_id, "rerun", "a"),
                         timeout_seconds=body_seconds + 30,
                         message="a's refused commit is deferred and runs again")
        a_state = healed.state(a_task)

        lost = _records(healed, run_id, "lost", "a")
        b_starts = _b_records(healed, run_id, "start")
        writes = _writes(healed, run_id)
        b_first = min((w for w in writes if w.node.startswith("b") and w.outcome == "written"),
                      key=lambda w: w.at)
        a_later = [w for w in writes if w.node == "a" and w.at > b_first.at
                   and w.outcome != "effect"]
        lost_after = lost[0]["at"] - cut_at if lost else None
        print(f"a's checkpoint refused {lost_after:.1f}s after the cut (bound "
              f"{WATCH_BOUND_SECONDS:g}s); b first ran {b_starts[0]['at'] - cut_at:.1f}s "
              f"after it with token {b_starts[0]['token']} (a: {a_start['token']}), "
              f"{tries} tries; healed at {healed_at - cut_at:.1f}s; a's writes after b's "
              f"first: {len(a_later)} {sorted({w.outcome for w in a_later})}; a: rerun "
              f"{rerun[0]['at'] - cut_at:.1f}s, state {a_state}; counters "
              f"{_refusals(healed)}")
        assert lost, "a's checkpoint never raised"
        assert lost_after is not None and lost_after <= WATCH_BOUND_SECONDS + 2  # slack: load
        assert lost[0]["at"] < b_starts[0]["at"], "b ran before a knew it had lost the lock"
        assert b_starts[0]["token"] > a_start["token"]
        assert a_later, "a stopped writing before b's first write: nothing was fenced"
        assert {w.outcome for w in a_later} == {"refused"}
        assert [w for w in writes if w.node == "a" and w.outcome == "effect"] == []
        assert [w.token for w in writes if w.node.startswith("b") and w.outcome == "effect"] \
            == [b_starts[0]["token"]]

    @pytest.mark.soak
    def test_a_short_cut_still_refuses_the_commit_by_the_lock_check(
        self, healed: Partition
    ) -> None:
        """A cut shorter than PostgreSQL's bound (healed once a's checkpoint raised, ~4 s in):
        no other worker could take the lock and a's transaction survives, yet a, which could
        not know that, refuses its commit at the lock check (idempotency LOCK-LOST, no
        effect row); its deferred rerun then ends without writing."""
        run_id = uuid.uuid4().hex[:12]
        healed.send(TASK, node="a", run_id=run_id, role="a", seconds=9)
        wait_for(lambda: _records(healed, run_id, "start", "a"), timeout_seconds=30,
                 message="a's body starts")
        time.sleep(1)
        before = _refusals(healed).get("idempotency:LOCK-LOST", 0)
        cut_at = healed.cut("a", "postgres")
        try:
            lost = wait_for(lambda: _records(healed, run_id, "lost", "a"),
                            timeout_seconds=WATCH_BOUND_SECONDS + 3, interval=0.1,
                            message="a's checkpoint raises")
        finally:
            healed_at = healed.heal("a", "postgres")
        wait_for(lambda: _records(healed, run_id, "rerun", "a"), timeout_seconds=40,
                 message="a's refused commit is deferred and runs again")
        refused = _refusals(healed).get("idempotency:LOCK-LOST", 0) - before
        print(f"a's checkpoint refused {lost[0]['at'] - cut_at:.1f}s after the cut, healed "
              f"at {healed_at - cut_at:.1f}s; commits refused at the lock check: {refused}")
        assert refused == 1
        assert [w for w in _writes(healed, run_id) if w.outcome == "effect"] == []
