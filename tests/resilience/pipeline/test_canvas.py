"""Guards inside Celery's canvas, on real workers: a stopped job never passes its outcome
on as a result; a replayed one passes its stored result on."""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest
from celery import chain, chord

from tests.resilience.pipeline.tasks import effects


@pytest.mark.usefixtures("tier_workers")
class TestCanvas:
    def test_a_skipped_job_ends_its_chain(self, stores: Any, engine: Any) -> None:
        """skipper (SKIPPED: the lock is held) | after: `after` never runs with the
        outcome dict as its argument (before the fix it did)."""
        from resilience.locks.backends.postgres import AdvisorySession
        from tests.resilience.pipeline.tasks import after, skipper

        run_id = uuid.uuid4().hex[:12]
        key = f"chain-{run_id}"
        with AdvisorySession(stores.database_url, label="holder") as holder:
            assert holder.try_acquire(f"{skipper.name}:{key}")
            result = chain(skipper.si(run_id, key), after.s(run_id)).apply_async()
            first = result.parent.get(timeout=30)
        assert first["outcome"] == "SKIPPED"
        time.sleep(2)  # `after` would have run by now
        assert effects(engine, run_id) == []
        assert result.state == "PENDING"

    def test_a_replayed_chord_member_counts_with_its_stored_result(
        self, engine: Any
    ) -> None:
        """A chord header member that is REPLAYED hands the callback its stored result
        (before: the outcome dict, so the callback summed a dict)."""
        from tests.resilience.pipeline.tasks import total, value

        run_id = uuid.uuid4().hex[:12]
        assert value.delay(run_id, f"v1-{run_id}", 5).get(timeout=30) == 5
        header = [value.s(run_id, f"v1-{run_id}", 5), value.s(run_id, f"v2-{run_id}", 7)]
        assert chord(header)(total.s()).get(timeout=30) == 12
        assert sorted(effects(engine, run_id)) == [f"v1-{run_id}", f"v2-{run_id}"]

    def test_a_replayed_job_passes_its_stored_result_down_a_chain(
        self, engine: Any
    ) -> None:
        from tests.resilience.pipeline.tasks import after, value

        run_id = uuid.uuid4().hex[:12]
        assert value.delay(run_id, f"c1-{run_id}", 3).get(timeout=30) == 3
        result = chain(value.si(run_id, f"c1-{run_id}", 3), after.s(run_id)).apply_async()
        assert result.get(timeout=30) == 3
        assert effects(engine, run_id) == [f"c1-{run_id}", "after"]

    def test_a_stopped_chord_member_fails_the_chord(self, stores: Any, engine: Any) -> None:
        """A SKIPPED header member fails the chord: the callback never sums an outcome."""
        from celery.exceptions import ChordError

        from resilience.locks.backends.postgres import AdvisorySession
        from tests.resilience.pipeline.tasks import skipper, total

        run_id = uuid.uuid4().hex[:12]
        key = f"chord-{run_id}"
        with AdvisorySession(stores.database_url, label="holder") as holder:
            assert holder.try_acquire(f"{skipper.name}:{key}")
            result = chord([skipper.si(run_id, key)])(total.s())
            with pytest.raises((ChordError, Exception), match="SKIPPED"):
                result.get(timeout=30)
        assert effects(engine, run_id) == []
