"""Structured logs: guard decisions carry task id, task name, tier, guard and outcome."""

from __future__ import annotations

import json
import logging
import uuid
from typing import Any

import pytest

from jobs.observe.logging import JsonFormatter, LogfmtFormatter, fields_of
from tests.support import wait_for

DECISION = {"task_id": "t-1", "task_name": "app.charge", "tier": "critical",
            "guard": "singleton", "outcome": "SKIPPED", "reason": "lock 'k' is held"}


def _record() -> logging.LogRecord:
    logger = logging.getLogger("observe.test")
    return logger.makeRecord("observe.test", logging.INFO, __file__, 1, "guard decision", (),
                             None, extra=DECISION)


class TestFormatters:
    def test_json_line_carries_every_decision_field(self) -> None:
        """One JSON object per line with the decision's fields at the top level."""
        entry = json.loads(JsonFormatter().format(_record()))
        assert entry["message"] == "guard decision"
        assert {key: entry[key] for key in DECISION} == DECISION

    def test_logfmt_line_carries_every_decision_field(self) -> None:
        """The human line is followed by key=value pairs, values with spaces quoted."""
        line = LogfmtFormatter().format(_record())
        assert "guard decision task_id=t-1 task_name=app.charge tier=critical" in line
        assert "guard=singleton outcome=SKIPPED reason=\"lock 'k' is held\"" in line

    def test_records_without_extra_fields_stay_plain(self) -> None:
        record = logging.getLogger("x").makeRecord("x", logging.INFO, __file__, 1, "hi", (), None)
        assert fields_of(record) == {}
        assert LogfmtFormatter().format(record).endswith("x: hi")


class TestWorkerLogs:
    @pytest.mark.timeout(180)
    def test_a_worker_logs_guard_decisions_as_json(self, app: Any, worker_factory: Any,
                                                   redis_client: Any) -> None:
        """A real worker with JOBS_LOG_FORMAT=json writes the REPLAYED decision as JSON."""
        from tests.jobs.observe.tasks import remember

        worker = worker_factory("standard", name="observe-logs", concurrency=1,
                                env={"JOBS_LOG_FORMAT": "json"})
        key = f"log-{uuid.uuid4().hex[:8]}"
        remember.delay(key=key, value=1).get(timeout=60)
        replayed: list[str] = []

        def decision_logged() -> dict[str, Any] | None:
            # Other workers of the session may consume the standard queue too: replay
            # until one replay lands on this worker.
            result = remember.delay(key=key, value=1)
            assert result.get(timeout=60) == {"key": key, "value": 1}  # the first value
            replayed.append(result.id)
            for line in worker.log_path.read_text(errors="replace").splitlines():
                if not line.startswith("{"):
                    continue
                entry = json.loads(line)
                if (str(entry.get("message")).startswith("guard decision")
                        and entry.get("task_id") in replayed):
                    return entry
            return None

        entry = wait_for(decision_logged, timeout_seconds=120, interval=0.2,
                         message="a guard decision in the worker's JSON log")
        assert entry["task_name"] == "tests.observe.remember"
        assert entry["tier"] == "standard"
        assert entry["guard"] == "idempotency"
        assert entry["outcome"] == "REPLAYED"
