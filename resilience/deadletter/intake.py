"""The worker's intake: every message that cannot become a task call ends as a dead letter.

Messages that fail before Celery builds a request never reach a task's guards: Celery drops
them with one log line, and a body that is not `[args, kwargs, embed]` raises in the
worker's main process and kills it, on every worker it is restored to. `IntakeConsumer` is
Celery's consumer (the `worker_consumer` setting) with its four error hooks recording the
raw message and its reason in the dead-letter table before the message is settled, and each
strategy checking the body's shape first. When the row cannot be written the message is
*parked*: held unacknowledged with the prefetch raised by one (as Celery does for a
countdown job), recorded again on the consumer's timer with backoff, and given back to its
queue after the park window. Reasons, the park and its limits: docs/failure.md, "Intake".
"""

from __future__ import annotations

import base64
import json
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from celery.worker.consumer import Consumer

from resilience.counters import count_outcome
from resilience.deadletter.place import dead_letter, jsonable
from resilience.errors import ConfigurationError, StoreUnavailable
from resilience.outcomes import Outcome
from resilience.stores import stores_for

logger = logging.getLogger("resilience.deadletter.intake")

GUARD_NAME = "intake"
#: A body larger than this is kept cut to this size (the row says so).
MAX_RAW_BODY_BYTES = 64 * 1024
#: The task name recorded when the message names none.
UNKNOWN_TASK = "(unknown)"


class MalformedBody(ValueError):
    """Raised when a task message's body is not `[args, kwargs, embed]`."""


def check_body(payload: Any) -> tuple[list[Any], dict[str, Any]]:
    """The args and kwargs of a protocol 2 body, or `MalformedBody` saying what is wrong."""
    if not isinstance(payload, list | tuple) or len(payload) != 3:
        raise MalformedBody("the body is not [args, kwargs, embed]")
    args, kwargs, embed = payload
    if not isinstance(args, list | tuple):
        raise MalformedBody(f"args is a {type(args).__name__}, not a list")
    if not isinstance(kwargs, dict):
        raise MalformedBody(f"kwargs is a {type(kwargs).__name__}, not an object")
    if embed is not None and not isinstance(embed, dict):
        raise MalformedBody(f"embed is a {type(embed).__name__}, not an object")
    return list(args), dict(kwargs)


def check_headers(headers: Any) -> None:
    """Raise `MalformedBody` unless the headers name a task and its id as strings."""
    if not isinstance(headers, dict):
        raise MalformedBody("the headers are not an object")
    for name in ("task", "id"):
        if not isinstance(headers.get(name), str) or not headers[name]:
            raise MalformedBody(f"the {name!r} header is missing or not a string")


#: What Celery raises on a message whose fields have the wrong type or shape (its own
#: InvalidTaskError, ContentDisallowed and DecodeError reach the consumer's handlers).
_DATA_ERRORS = (ValueError, TypeError, KeyError, AttributeError)


def raw_message(message: Any, *, runnable: bool) -> dict[str, Any]:
    """What arrived, as JSON: headers, properties, delivery info and the body.

    The body is kept as text when it is UTF-8, else as base64, cut to `MAX_RAW_BODY_BYTES`.
    """
    body = message.body
    if isinstance(body, str):
        body = body.encode("utf-8", "surrogateescape")
    body = bytes(body or b"")
    kept = body[:MAX_RAW_BODY_BYTES]
    try:
        encoded: dict[str, Any] = {"body": kept.decode("utf-8")}
    except UnicodeDecodeError:
        encoded = {"body_base64": base64.b64encode(kept).decode("ascii")}
    headers = message.headers if isinstance(message.headers, dict) else {"raw": message.headers}
    delivery = message.delivery_info or {}
    return {
        "runnable": runnable,
        "content_type": message.content_type,
        "content_encoding": message.content_encoding,
        "headers": jsonable(headers),
        "properties": jsonable(message.properties or {}),
        "delivery_info": jsonable({k: delivery.get(k) for k in ("exchange", "routing_key")}),
        "body_bytes": len(body),
        "body_truncated": len(body) > len(kept),
        **encoded,
    }


def record(app: Any, message: Any, reason: str, exc: BaseException | None = None) -> bool:
    """Put `message` in the dead-letter table with `reason`; False if it could not be written.

    A row refused for its content (PostgreSQL's or psycopg2's refusal: a NUL in a text) is
    written again cut down (`_bare_row`), so only an unreachable PostgreSQL returns False.
    """
    headers = message.headers if isinstance(message.headers, dict) else {}
    call: tuple[list[Any], dict[str, Any]] | None
    try:
        call = check_body(message.decode())
    except Exception:  # noqa: BLE001 - any failure means "not a call"; the reason is known
        call = None
    task_name = str(headers.get("task") or UNKNOWN_TASK)
    queue = (message.delivery_info or {}).get("routing_key")
    row: dict[str, Any] = dict(
        task_name=task_name, reason=reason, exception=exc,
        task_id=headers.get("id") if isinstance(headers.get("id"), str) else None,
        args=call[0] if call else [], kwargs=call[1] if call else {},
        raw_message=raw_message(message, runnable=call is not None))
    write = partial(dead_letter, guard=GUARD_NAME, attempts=1, tier=queue, queue=queue)
    try:
        engine = stores_for(app).guard_engine()
        try:
            entry_id = write(engine, **row)
        except StoreUnavailable:
            raise
        except Exception as refused:  # noqa: BLE001 - refused (by PostgreSQL or psycopg2)
            logger.warning("intake: the row was refused (%s); recording it cut down", refused)
            entry_id = write(engine, **_bare_row(message, row, refused))
    except Exception as error:  # noqa: BLE001 - the message is parked, not dropped
        logger.error("intake: message not dead-lettered (%s): %s", reason, error)
        return False
    count_outcome(app, Outcome.DEAD_LETTERED.value, guard=GUARD_NAME, tier=queue,
                  name=task_name)
    logger.warning("intake: message dead-lettered as entry %s: %s", entry_id, reason)
    return True


def _printable(text: str, limit: int = 1000) -> str:
    """`text` without what a PostgreSQL text column refuses (NUL), cut to `limit`."""
    return text.replace("\x00", "\\x00")[:limit]


def _bare_row(message: Any, row: dict[str, Any], refused: BaseException) -> dict[str, Any]:
    """`row` cut down to what PostgreSQL always accepts: names and reason made printable,
    no arguments, the whole raw message (as recorded JSON) in base64, not runnable."""
    whole = json.dumps(row["raw_message"]).encode()
    exc = row["exception"]
    detail = "" if exc is None else f" ({type(exc).__name__}: {exc})"
    return {
        "task_name": _printable(row["task_name"], 200),
        "task_id": None if row["task_id"] is None else _printable(row["task_id"], 200),
        "args": [], "kwargs": {},
        "reason": _printable(f"{row['reason']}{detail}; recorded cut down: {refused}"),
        "raw_message": {"runnable": False, "content_type": _printable(
            str(message.content_type), 200), "message_base64": base64.b64encode(whole).decode()},
    }


@dataclass
class Parked:
    """A bad message whose dead-letter row could not be written yet, held unacknowledged."""

    message: Any
    reason: str
    exc: BaseException | None
    #: What settles the message once its row is written (ack, or Celery's own reject).
    settle: Callable[[], None]
    #: When it was parked (monotonic seconds).
    since: float


class IntakeConsumer(Consumer):
    """Celery's consumer with every message that cannot become a task dead-lettered, and
    parked (see the module doc) while the dead-letter table cannot be written."""

    #: First wait before a parked message is recorded again (seconds); doubles each time.
    retry_seconds: float = 1.0
    #: Longest wait between two attempts to record the parked messages (seconds).
    retry_max_seconds: float = 30.0
    #: Longest a message stays parked before it goes back to its queue (seconds); None
    #: takes `app.conf.resilience_intake_park_seconds`, else half the broker's visibility
    #: timeout, at most `MAX_PARK_SECONDS`.
    park_seconds: float | None = None
    MAX_PARK_SECONDS = 300.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        """Celery's arguments.

        Raises:
            ConfigurationError: `resilience_intake_park_seconds` is not a number > 0.
        """
        super().__init__(*args, **kwargs)
        #: Parked messages, oldest first.
        self.parked: deque[Parked] = deque()
        self._retry_entry: Any = None
        self._retry_delay = self.retry_seconds
        self._window = self._park_window()

    # -- Celery's hooks ------------------------------------------------------------------

    def on_decode_error(self, message: Any, exc: Exception) -> None:
        self._dead_letter(message, f"cannot be decoded ({type(exc).__name__}: {exc})", exc,
                          partial(super().on_decode_error, message, exc))

    def on_unknown_message(self, body: Any, message: Any) -> None:
        self._dead_letter(message, "not a task message (no task header)", None,
                          partial(super().on_unknown_message, body, message))

    def on_unknown_task(self, body: Any, message: Any, exc: Exception) -> None:
        headers = message.headers if isinstance(message.headers, dict) else {}
        name = headers.get("task")
        self._dead_letter(message, f"task {name!r} is not registered on this worker", exc,
                          partial(super().on_unknown_task, body, message, exc))

    def on_invalid_task(self, body: Any, message: Any, exc: Exception) -> None:
        self._dead_letter(message, f"invalid task message ({type(exc).__name__}: {exc})", exc,
                          partial(super().on_invalid_task, body, message, exc))

    def update_strategies(self) -> None:
        super().update_strategies()
        for name, strategy in list(self.strategies.items()):
            if not getattr(strategy, "_intake_checked", False):
                self.strategies[name] = self._checked(strategy)

    def _checked(self, strategy: Any) -> Any:
        """`strategy`, refusing a body that is not a call before Celery unpacks it."""
        connection_errors = self.connection_errors

        def checked(message: Any, body: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                if body is None:  # protocol 2: the body is decoded here, Celery reuses it
                    # Decoding errors (bad bytes, pickle) propagate to Celery's own
                    # handlers, which call on_decode_error / on_invalid_task above.
                    check_headers(message.headers)
                    check_body(message.decode())
                return strategy(message, body, *args, **kwargs)
            except (MalformedBody, *_DATA_ERRORS) as exc:
                # Raised while Celery builds the request from the message's data, before
                # anything ran; escaping here would stop the worker's main process.
                self._dead_letter(message, f"malformed message: {exc}", exc,
                                  lambda: message.ack_log_error(logger, connection_errors))
                return None

        checked._intake_checked = True  # type: ignore[attr-defined]
        return checked

    def on_close(self) -> None:
        # The parked messages' delivery tags die with the channel: the broker gives the
        # messages back (unacknowledged), so nothing is settled or lost here.
        if self._retry_entry is not None:
            self._retry_entry.cancel()
            self._retry_entry = None
        if self.parked:
            logger.warning("intake: connection closed with %d message(s) parked; the broker "
                           "delivers them again", len(self.parked))
        self.parked.clear()
        self._retry_delay = self.retry_seconds
        super().on_close()

    # -- the park ------------------------------------------------------------------------

    def _dead_letter(self, message: Any, reason: str, exc: BaseException | None,
                     settle: Callable[[], None]) -> None:
        """Record `message` and settle it, or park it while the table cannot be written."""
        if not self.parked and record(self.app, message, reason, exc):
            settle()
            return
        self.parked.append(Parked(message, reason, exc, settle, time.monotonic()))
        if self.qos is not None:
            self.qos.increment_eventually()  # the held message takes no slot (as an ETA job)
        queue = (message.delivery_info or {}).get("routing_key")
        count_outcome(self.app, Outcome.DEFERRED.value, guard=GUARD_NAME, tier=queue,
                      reason="dead-letter table unavailable: message parked")
        logger.warning("intake: message parked (%d parked) until its dead-letter row can be "
                       "written: %s", len(self.parked), reason)
        if self._retry_entry is None:
            self._schedule_retry()

    def _schedule_retry(self) -> None:
        self._retry_entry = self.timer.call_after(self._retry_delay, self._retry_parked)

    def _park_window(self) -> float:
        seconds = self.park_seconds
        if seconds is None:
            seconds = self.app.conf.get("resilience_intake_park_seconds")
        if seconds is None:
            visibility = (self.app.conf.broker_transport_options or {}).get("visibility_timeout")
            return min(self.MAX_PARK_SECONDS, visibility / 2 if visibility else float("inf"))
        if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not seconds > 0:
            raise ConfigurationError(
                f"resilience_intake_park_seconds must be a number > 0, got {seconds!r}")
        return float(seconds)

    def _retry_parked(self) -> None:
        """Record the parked messages, oldest first, until one fails; give back those
        parked longer than the window; come again later while any is left."""
        self._retry_entry = None
        try:
            while self.parked:
                parked = self.parked[0]
                if not record(self.app, parked.message, parked.reason, parked.exc):
                    break
                self.parked.popleft()
                self._release(parked.settle)
            now = time.monotonic()
            for parked in [p for p in self.parked if now - p.since >= self._window]:
                self.parked.remove(parked)
                logger.warning("intake: message parked for %.0f s goes back to its queue: %s",
                               now - parked.since, parked.reason)
                self._release(partial(parked.message.reject_log_error, logger,
                                      self.connection_errors, requeue=True))
        finally:  # a settle that raised must not leave the rest parked with no retry
            if self.parked:
                self._retry_delay = min(self._retry_delay * 2, self.retry_max_seconds)
                self._schedule_retry()
            else:
                self._retry_delay = self.retry_seconds

    def _release(self, settle: Callable[[], None]) -> None:
        """Settle one parked message and give its prefetch place back."""
        try:
            settle()
        finally:
            if self.qos is not None:
                self.qos.decrement_eventually()
