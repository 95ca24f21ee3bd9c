"""The overlap decision on its own (pure): each policy against each state of the previous
run, the trust bound on a run whose end was never recorded, and the singleton header."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

import pytest

from resilience.errors import ConfigurationError
from resilience.schedules import Overlap, RunOutcome
from resilience.schedules.overlap import (
    SEND,
    TRUST_SECONDS,
    decide,
    parse_singleton_header,
    releases_queued,
    singleton_header,
    trust_seconds_of,
)

NOW = dt.datetime(2026, 11, 27, 6, 0, tzinfo=dt.UTC)


@dataclass(frozen=True)
class Entry:
    name: str
    overlap: Overlap


@dataclass(frozen=True)
class Run:
    id: int
    task_id: str | None
    outcome: RunOutcome
    fired_at: dt.datetime | None


def run(outcome: RunOutcome, *, age_seconds: float = 2.0) -> Run:
    return Run(id=7, task_id=None if outcome is RunOutcome.QUEUED else "job-7",
               outcome=outcome, fired_at=NOW - dt.timedelta(seconds=age_seconds))


class TestDecide:
    @pytest.mark.parametrize("overlap", list(Overlap))
    @pytest.mark.parametrize("previous", [None, run(RunOutcome.SUCCEEDED),
                                          run(RunOutcome.FAILED), run(RunOutcome.CANCELLED),
                                          run(RunOutcome.SKIPPED_OVERLAP)])
    def test_a_finished_or_absent_previous_run_always_sends(
            self, overlap: Overlap, previous: Run | None) -> None:
        """Whatever the policy, a slot after a finished run (or the first) is sent."""
        assert decide(Entry("e", overlap), previous, now=NOW) == SEND

    def test_allow_sends_beside_a_running_run(self) -> None:
        assert decide(Entry("e", Overlap.ALLOW), run(RunOutcome.SENT), now=NOW) == SEND

    def test_skip_records_the_slot_skipped_overlap(self) -> None:
        decision = decide(Entry("e", Overlap.SKIP), run(RunOutcome.SENT), now=NOW)
        assert (decision.send, decision.outcome) == (False, RunOutcome.SKIPPED_OVERLAP)
        assert decision.detail == {"running_run": 7}

    def test_queue_one_queues_one_then_skips(self) -> None:
        """Behind a running run the slot is queued; behind a queued one, skipped."""
        entry = Entry("e", Overlap.QUEUE_ONE)
        queued = decide(entry, run(RunOutcome.SENT), now=NOW)
        assert (queued.send, queued.outcome, queued.detail) == (
            False, RunOutcome.QUEUED, {"behind_run": 7})
        full = decide(entry, run(RunOutcome.QUEUED), now=NOW)
        assert (full.send, full.outcome, full.detail) == (
            False, RunOutcome.SKIPPED_OVERLAP, {"queued_run": 7})

    def test_cancel_previous_sends_and_names_the_job_to_cancel(self) -> None:
        decision = decide(Entry("e", Overlap.CANCEL_PREVIOUS), run(RunOutcome.SENT), now=NOW)
        assert (decision.send, decision.cancel, decision.detail) == (
            True, "job-7", {"cancelled_run": 7})

    @pytest.mark.parametrize("overlap", [Overlap.SKIP, Overlap.QUEUE_ONE])
    def test_a_run_sent_longer_ago_than_the_trust_bound_holds_nothing_back(
            self, overlap: Overlap) -> None:
        """A run whose end was never recorded (outcome write lost, killed by a hard time
        limit) stops holding the entry back after `trust_seconds`; the job's singleton
        keeps the runs apart from then on."""
        stale = run(RunOutcome.SENT, age_seconds=61)
        decision = decide(Entry("e", overlap), stale, trust_seconds=60, now=NOW)
        assert (decision.send, decision.detail) == (True, {"stale_run": 7})
        assert releases_queued(stale, trust_seconds=60, now=NOW)
        assert not releases_queued(run(RunOutcome.SENT), trust_seconds=60, now=NOW)
        assert releases_queued(None) and releases_queued(run(RunOutcome.SUCCEEDED))

    def test_a_run_fired_in_the_same_transaction_is_never_stale(self) -> None:
        fresh = Run(id=8, task_id="job-8", outcome=RunOutcome.SENT, fired_at=None)
        decision = decide(Entry("e", Overlap.SKIP), fresh, trust_seconds=0, now=NOW)
        assert decision.outcome is RunOutcome.SKIPPED_OVERLAP


class TestSingletonHeader:
    def test_skip_and_queue_one_jobs_carry_it(self) -> None:
        assert singleton_header(Entry("nightly", Overlap.SKIP)) == "skip:nightly"
        assert singleton_header(Entry("a:b", Overlap.QUEUE_ONE)) == "defer:a:b"
        assert singleton_header(Entry("n", Overlap.ALLOW)) is None
        assert singleton_header(Entry("n", Overlap.CANCEL_PREVIOUS)) is None

    @pytest.mark.parametrize(("value", "parsed"), [
        ("skip:nightly", ("skip", "nightly")), ("defer:a:b", ("defer", "a:b")),
        (None, None), ("", None), ("skip:", None), ("hold:x", None), (3, None),
        ({"policy": "skip"}, None)])
    def test_parse_takes_only_its_own_values(self, value: object, parsed: object) -> None:
        """A foreign or damaged header takes no lock (the job runs as if unscheduled)."""
        assert parse_singleton_header(value) == parsed


class TestTrustSeconds:
    def test_read_from_the_apps_conf(self) -> None:
        assert trust_seconds_of({}) == TRUST_SECONDS
        assert trust_seconds_of({"resilience_schedule_overlap_trust_seconds": "90"}) == 90.0

    @pytest.mark.parametrize("value", [0, -1, "soon", True, float("nan")])
    def test_a_bad_value_is_one_clear_error(self, value: object) -> None:
        with pytest.raises(ConfigurationError, match="overlap_trust_seconds must be"):
            trust_seconds_of({"resilience_schedule_overlap_trust_seconds": value})
