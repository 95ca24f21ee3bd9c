"""Structured logs: the worker's log lines keep the fields a guard decision carries in
`extra` (task id, task name, tier, guard, outcome, reason), as logfmt (default), JSON, or
Celery's own text (`JOBS_LOG_FORMAT`). See docs/observe.md (Structured logs).
"""

from __future__ import annotations

import datetime as dt
import json
import logging
from typing import Any

from celery._state import get_current_task

from jobs.settings import get_settings

#: Attributes every LogRecord has; anything else on a record came from `extra=`.
_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime"}
#: Fields printed first, in this order, when a record has them.
ORDERED = ("task_id", "task_name", "tier", "guard", "outcome", "reason")


def fields_of(record: logging.LogRecord) -> dict[str, Any]:
    """The structured fields of a record: everything given through `extra=`, plus the
    running task's id and name when the line was logged inside a task."""
    # Celery's task logger says task_id="???" outside a task: no id, as none given.
    extra = {key: value for key, value in vars(record).items()
             if key not in _STANDARD and not key.startswith("_")
             and not (key in ("task_id", "task_name") and value in (None, "???"))}
    task = get_current_task()  # its id and name, as Celery's TaskFormatter adds them
    if task is not None and task.request is not None and task.request.id:
        extra = {"task_id": task.request.id, "task_name": task.name, **extra}
    ordered = {key: extra.pop(key) for key in ORDERED if key in extra}
    return {**ordered, **dict(sorted(extra.items()))}


def _logfmt_value(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    if text == "" or any(c in text for c in ' ="\n\t'):
        return json.dumps(text)
    return text


class LogfmtFormatter(logging.Formatter):
    """Celery's human line followed by the record's fields as `key=value` pairs."""

    def __init__(self) -> None:
        super().__init__("[%(asctime)s: %(levelname)s/%(processName)s] %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        # Celery's trace lines carry `data`, a copy of their message: not repeated here.
        fields = {k: v for k, v in fields_of(record).items() if k != "data"}
        if not fields:
            return line
        head, newline, rest = line.partition("\n")
        pairs = " ".join(f"{key}={_logfmt_value(value)}" for key, value in fields.items())
        return f"{head} {pairs}{newline}{rest}"


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, process, and the fields."""
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": dt.datetime.fromtimestamp(record.created, dt.UTC).isoformat(
                timespec="milliseconds"),
            "level": record.levelname, "logger": record.name, "message": record.getMessage(),
            "process": record.processName, "pid": record.process, **fields_of(record)}
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


def _on_setup(logger: logging.Logger | None = None, **_: Any) -> None:
    """Give every handler of Celery's `logger` the structured formatter of `JOBS_LOG_FORMAT`
    (read and checked with the platform's settings; none for `text`: Celery's)."""
    formatter = {"json": JsonFormatter, "logfmt": LogfmtFormatter}.get(get_settings().log_format)
    if logger is not None and formatter is not None:
        for handler in logger.handlers:
            handler.setFormatter(formatter())


def install_worker_logging() -> None:
    """Connect Celery's logging signals so worker log lines carry the decision fields
    (once: the signals keep one receiver per `dispatch_uid`)."""
    from celery import signals

    for signal in (signals.after_setup_logger, signals.after_setup_task_logger):
        signal.connect(_on_setup, weak=False, dispatch_uid="jobs.observe.logging")
