"""Real `celery beat` processes running the schedules Scheduler, real workers (issue 28).

Every assertion is on rows: the run history (`resilience_schedule_runs`) and the test task's
own executions table (one row per execution, with the run id its message carried), so a
slot fired twice or a fired slot never run shows, whatever the history says.
"""

from __future__ import annotations

import datetime as dt
import itertools
import signal
import time
from collections import Counter
from typing import Any

import pytest
from sqlalchemy import text

from resilience.locks import AdvisorySession
from resilience.locks.beat import LEADER_KEY
from resilience.schedules import CatchUp, Interval, add, edit, pause, resume
from tests.harness import wait_for

pytestmark = [pytest.mark.usefixtures("tier_workers", "relay"), pytest.mark.timeout(120)]

TASK = "tests.schedules.record"


def leader_pid(stores: Any) -> int | None:
    """The pid of the beat holding the leader lock (its session label), or None."""
    with AdvisorySession(stores.locks_database_url, label="probe") as probe:
        holders = probe.holders(LEADER_KEY)
    if not holders:
        return None
    return int((holders[0].owner or "").rsplit(":", 1)[1])


def runs(engine: Any, prefix: str) -> list[Any]:
    """Every run row of the schedules named `prefix...`, by schedule and slot."""
    with engine.connect() as connection:
        return list(connection.execute(text(
            "SELECT id, schedule, slot, task_id, outcome, fired_at, detail "
            "FROM resilience_schedule_runs WHERE schedule LIKE :prefix "
            "ORDER BY schedule, slot"), {"prefix": f"{prefix}%"}))


def executions(engine: Any, prefix: str) -> list[Any]:
    """Every execution of the test task whose tag starts with `prefix`."""
    with engine.connect() as connection:
        return list(connection.execute(text(
            "SELECT tag, run_id, task_id FROM schedules_test_executions WHERE tag LIKE :prefix"),
            {"prefix": f"{prefix}%"}))


def fired(rows: list[Any]) -> list[Any]:
    return [row for row in rows if row.task_id is not None]


def lock_session_of(engine: Any, pid: int) -> bool:
    """True when beat `pid` has opened its leader-lock session (it is polling for the lead)."""
    with engine.connect() as connection:
        return bool(connection.execute(text(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE :name"),
            {"name": f"lock:beat:%:{pid}"}).scalar())


def every_run_executed_once(engine: Any, prefix: str) -> None:
    """Wait until each fired run has run (the shared worker may be behind: 30 s plus 50 ms
    a run); then no run id ran twice."""
    sent = {row.id for row in fired(runs(engine, prefix))}
    wait_for(lambda: sent <= {row.run_id for row in executions(engine, prefix)},
             timeout_seconds=30 + 0.05 * len(sent), interval=0.2,
             message="every fired run executes")
    counts = Counter(row.run_id for row in executions(engine, prefix))
    assert max(counts.values()) == 1, f"a run executed twice: {counts.most_common(3)}"
    assert set(counts) <= sent, "an execution of a run that was never fired"


class TestCatchUp:
    def test_a_killed_leader_then_3_5_periods_without_one(
            self, app: Any, stores: Any, engine: Any, tag: str, beats: Any) -> None:
        """Leader and standby; the leader is SIGKILLed and the standby takes over at once.
        Then no beat leads for 3.6 periods of a 2 s entry (the standby killed right after a
        fire, the lock held by the test while a third beat, stopped until then, waits), and
        the third beat leads:
        of the 3 slots that fell, `skip` fires 0, `once` 1, `all` 3, and each is recorded
        (fired or missed). No slot fires twice; each fired slot runs once (the task is
        `@idempotent` on its outbox row: a beat killed while publishing leaves the row to
        the relay, which publishes it again)."""
        period = 2.0
        names = {policy: f"{tag}-{policy.value}" for policy in CatchUp}
        for policy, name in names.items():
            add(stores, name, task=f"{TASK}_once", every=Interval(period), args=[name],
                catch_up=policy, options={"queue": "standard"})
        first, second = beats("catch-up-a"), beats("catch-up-b")
        pid = wait_for(lambda: leader_pid(stores), timeout_seconds=60, message="a beat leads")
        # The beat that leads after the outage starts now (a start takes seconds) and is
        # stopped (SIGSTOP) until the outage, so it cannot take over before.
        late = beats("catch-up-late")
        wait_for(lambda: all(lock_session_of(engine, beat.pid) for beat in (first, second, late)),
                 timeout_seconds=60, message="the three beats are up")
        late.signal(signal.SIGSTOP)
        leader = first if first.pid == pid else second
        standby = second if leader is first else first
        wait_for(lambda: len(fired(runs(engine, tag))) >= 3, timeout_seconds=30,
                 message="the leader fires")

        leader.kill()
        killed_at = time.time()
        wait_for(lambda: leader_pid(stores) == standby.pid, timeout_seconds=10,
                 message="the standby takes over")
        takeover = time.time() - killed_at

        def fired_by_standby() -> dt.datetime | None:
            slots = Counter(row.slot for row in fired(runs(engine, tag))
                            if (row.detail or {}).get("sender", "").endswith(f":{standby.pid}"))
            done = [slot for slot, count in slots.items() if count == len(names)]
            return max(done) if done else None

        last = wait_for(fired_by_standby, timeout_seconds=10, message="the standby fires")
        # Outage: the standby dies right after a fire; nobody leads until last + 3.6 periods.
        standby.kill()
        with AdvisorySession(stores.locks_database_url, label="test-outage") as probe:
            wait_for(lambda: probe.try_acquire(LEADER_KEY), timeout_seconds=10,
                     message="the test holds the leader lock")
            late.signal(signal.SIGCONT)
            release_at = last.timestamp() + 3.6 * period
            assert time.time() < release_at - 0.5, "the outage began too late"
            time.sleep(release_at - time.time())
        wait_for(lambda: leader_pid(stores) == late.pid, timeout_seconds=10,
                 message="the fresh beat leads")
        resumed = last + dt.timedelta(seconds=4 * period)
        wait_for(lambda: sum(row.slot == resumed for row in fired(runs(engine, tag)))
                 == len(names), timeout_seconds=10, message="the first on-time slot fires")
        late.kill()

        outage = [last + dt.timedelta(seconds=period * k) for k in (1, 2, 3)]
        rows = runs(engine, tag)
        for policy, name in names.items():
            mine = {row.slot: row for row in rows if row.schedule == name}
            assert set(outage) <= set(mine), f"{policy}: an outage slot was not recorded"
            fired_slots = [slot for slot in outage if mine[slot].task_id is not None]
            missed_slots = [slot for slot in outage if mine[slot].outcome == "missed"]
            expected = {CatchUp.SKIP: [], CatchUp.ONCE: outage[-1:], CatchUp.ALL: outage}[policy]
            assert fired_slots == expected, f"{policy}: fired {fired_slots}"
            assert sorted(fired_slots + missed_slots) == outage
            assert mine[resumed].task_id is not None, f"{policy}: the on-time slot"
        every_run_executed_once(engine, tag)
        print(f"takeover {takeover:.2f}s after SIGKILL of the leader")


class TestExactlyOnce:
    @pytest.mark.parametrize("slots", [
        200, pytest.param(2000, marks=[pytest.mark.soak, pytest.mark.timeout(600)])])
    def test_two_beats_never_fire_a_slot_twice(
            self, app: Any, stores: Any, engine: Any, tag: str, beats: Any,
            slots: int) -> None:
        """Two beats all along (the leader SIGKILLed halfway, a new standby started):
        entries of 0.1-0.5 s fire at least `slots` slots; every slot on each entry's grid
        between its first and last row has exactly one row (fired or missed), and each
        fired slot runs exactly once. (The task is `@idempotent`: the outbox publishes at
        least once, and a beat killed between publishing a job and marking its row makes
        the relay publish it again; the idempotency key on the row makes it run once.)"""
        periods = {"a": 0.1, "b": 0.1, "c": 0.125, "d": 0.2, "e": 0.25, "f": 0.5}
        for suffix, period in periods.items():
            add(stores, f"{tag}-{suffix}", task=f"{TASK}_once", every=Interval(period),
                args=[f"{tag}-{suffix}"], options={"queue": "standard"})
        started = [beats("once-a"), beats("once-b")]
        wait_for(lambda: len(fired(runs(engine, tag))) >= slots // 2, timeout_seconds=90,
                 interval=0.2, message="half the slots fire")
        pid = leader_pid(stores)
        leader = next(beat for beat in started if beat.pid == pid)
        leader.kill()
        started.append(beats("once-c"))
        wait_for(lambda: len(fired(runs(engine, tag))) >= slots, timeout_seconds=90,
                 interval=0.2, message="all the slots fire")
        for beat in started:
            beat.kill()

        rows = runs(engine, tag)
        for suffix, period in periods.items():
            mine = [row for row in rows if row.schedule == f"{tag}-{suffix}"]
            micros = [round(row.slot.timestamp() * 1_000_000) for row in mine]
            step = round(period * 1_000_000)
            assert all(value % step == 0 for value in micros), "a slot off its grid"
            assert micros == list(range(micros[0], micros[-1] + step, step)), (
                f"{suffix}: a slot without a row (lost) or with two")
        every_run_executed_once(engine, tag)
        missed = sum(row.outcome == "missed" for row in rows)
        late = sorted((row.fired_at - row.slot).total_seconds() for row in fired(rows))
        print(f"{len(fired(rows))} slots fired, {missed} missed during the takeover; fired "
              f"late by p50 {late[len(late) // 2] * 1000:.0f} ms, p99 "
              f"{late[int(len(late) * 0.99)] * 1000:.0f} ms")


class TestRuntimeEdits:
    def test_edit_pause_resume_apply_within_a_tick_without_restart(
            self, app: Any, stores: Any, engine: Any, tag: str, beats: Any) -> None:
        """One beat: a 2 s entry edited to 1 s fires every second from the next slot; paused,
        it fires nothing from the next tick on; resumed, it fires again (the slots of the
        pause recorded missed). The same beat process leads throughout."""
        name = f"{tag}-edited"
        add(stores, name, task=TASK, every=Interval(2.0), args=[name],
            options={"queue": "standard"})
        beat = beats("edits")
        wait_for(lambda: leader_pid(stores) == beat.pid, timeout_seconds=60,
                 message="the beat leads")
        wait_for(lambda: len(fired(runs(engine, tag))) >= 2, timeout_seconds=15,
                 message="two fires every 2 s")
        gaps = [b.slot - a.slot for a, b in itertools.pairwise(fired(runs(engine, tag)))]
        assert set(gaps) == {dt.timedelta(seconds=2)}

        edit(stores, name, every=Interval(1.0))
        edited_at = dt.datetime.now(dt.UTC)
        wait_for(lambda: len([row for row in fired(runs(engine, tag))
                              if row.slot > edited_at]) >= 3, timeout_seconds=10,
                 message="three fires after the edit")
        after = [row for row in fired(runs(engine, tag)) if row.slot > edited_at]
        assert (after[0].fired_at - edited_at).total_seconds() < 2.2, "edit applied late"
        assert [b.slot - a.slot for a, b in itertools.pairwise(after)] == [
            dt.timedelta(seconds=1)] * (len(after) - 1)

        pause(stores, name)
        paused_at = dt.datetime.now(dt.UTC)
        time.sleep(2.5)
        resume(stores, name)
        resumed_at = dt.datetime.now(dt.UTC)
        wait_for(lambda: any(row.slot > resumed_at for row in fired(runs(engine, tag))),
                 timeout_seconds=5, message="a fire after the resume")
        rows = runs(engine, tag)
        during = [row for row in rows if paused_at < (row.fired_at or row.slot) < resumed_at]
        late_fires = [row for row in during if row.task_id is not None
                      and (row.fired_at - paused_at).total_seconds() > 1.2]
        assert late_fires == [], "fires more than a tick after the pause"
        missed = [row for row in rows if row.outcome == "missed"]
        assert len(missed) >= 1 and all(paused_at - dt.timedelta(seconds=1.2) < row.slot
                                        < resumed_at for row in missed)
        first_after = min(row.fired_at for row in fired(rows) if row.slot > resumed_at)
        assert (first_after - resumed_at).total_seconds() < 2.2, "resume applied late"
        assert leader_pid(stores) == beat.pid and beat.process.poll() is None
        every_run_executed_once(engine, tag)
