"""The worker's intake: every message that cannot become a task call ends as a dead letter.

Celery's consumer hands a message to the task's strategy, which builds a request from it.
Messages that fail before that point never reach a task's guards, so the poison cap and the
dead-letter table never see them, and Celery drops them with one log line:

- a body that cannot be decoded, or a content type the worker does not accept (pickle);
- no `task` header (not a Celery message), or a task no worker registers;
- a body that is not `[args, kwargs, embed]` with a list, a dict and a dict. Celery unpacks
  it while building the request, in the worker's main process: the `ValueError` escapes the
  consumer, the worker dies, the message is restored, and the next worker dies on it too.

`IntakeConsumer` is Celery's own consumer (select it with the `worker_consumer` setting, as
`jobs.platform` does) with those four hooks recording the raw message and its reason in the
dead-letter table before the message is acknowledged, and each strategy checking the body's
shape first. Recording happens in the main process, once per bad message. If the table
cannot be written, the message is left unacknowledged rather than dropped: it goes back to
its queue when the worker's connection closes or the broker's visibility timeout passes.
"""

from __future__ import annotations

import base64
import json
import logging
from typing import Any

from celery.worker.consumer import Consumer

from resilience.counters import count_outcome
from resilience.outcomes import Outcome

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


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, default=repr))


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
        "headers": _jsonable(headers),
        "properties": _jsonable(message.properties or {}),
        "delivery_info": _jsonable({k: delivery.get(k) for k in ("exchange", "routing_key")}),
        "body_bytes": len(body),
        "body_truncated": len(body) > len(kept),
        **encoded,
    }


def _decoded_call(message: Any) -> tuple[list[Any], dict[str, Any]] | None:
    """The message's args and kwargs when its body decodes to a well-formed call."""
    try:
        return check_body(message.decode())
    except Exception:  # noqa: BLE001 - any failure means "not a call"; the reason is known
        return None


def record(app: Any, message: Any, reason: str, exc: BaseException | None = None) -> bool:
    """Put `message` in the dead-letter table with `reason`; False if it could not be written."""
    from resilience.deadletter.place import dead_letter
    from resilience.stores import stores_for

    headers = message.headers if isinstance(message.headers, dict) else {}
    call = _decoded_call(message)
    task_name = str(headers.get("task") or UNKNOWN_TASK)
    queue = (message.delivery_info or {}).get("routing_key")
    try:
        entry_id = dead_letter(
            stores_for(app).engine(),
            task_name=task_name,
            task_id=headers.get("id") if isinstance(headers.get("id"), str) else None,
            args=call[0] if call else [],
            kwargs=call[1] if call else {},
            guard=GUARD_NAME,
            reason=reason,
            attempts=1,
            tier=queue,
            queue=queue,
            exception=exc,
            raw_message=raw_message(message, runnable=call is not None),
        )
    except Exception as error:  # noqa: BLE001 - the message is kept, not dropped
        logger.error(
            "intake: message not dead-lettered (%s); left unacknowledged: %s", reason, error
        )
        return False
    count_outcome(app, Outcome.DEAD_LETTERED.value, guard=GUARD_NAME, tier=queue,
                  name=task_name)
    logger.warning("intake: message dead-lettered as entry %s: %s", entry_id, reason)
    return True


class IntakeConsumer(Consumer):
    """Celery's consumer with every message that cannot become a task dead-lettered."""

    def on_decode_error(self, message: Any, exc: Exception) -> None:
        if record(self.app, message, f"cannot be decoded ({type(exc).__name__}: {exc})", exc):
            super().on_decode_error(message, exc)

    def on_unknown_message(self, body: Any, message: Any) -> None:
        if record(self.app, message, "not a task message (no task header)"):
            super().on_unknown_message(body, message)

    def on_unknown_task(self, body: Any, message: Any, exc: Exception) -> None:
        headers = message.headers if isinstance(message.headers, dict) else {}
        name = headers.get("task")
        if record(self.app, message, f"task {name!r} is not registered on this worker", exc):
            super().on_unknown_task(body, message, exc)

    def on_invalid_task(self, body: Any, message: Any, exc: Exception) -> None:
        if record(self.app, message, f"invalid task message ({type(exc).__name__}: {exc})", exc):
            super().on_invalid_task(body, message, exc)

    def update_strategies(self) -> None:
        super().update_strategies()
        for name, strategy in list(self.strategies.items()):
            if not getattr(strategy, "_intake_checked", False):
                self.strategies[name] = self._checked(strategy)

    def _checked(self, strategy: Any) -> Any:
        """`strategy`, refusing a body that is not a call before Celery unpacks it."""
        app = self.app

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
                if record(app, message, f"malformed message: {exc}", exc):
                    message.ack()
                return None

        checked._intake_checked = True  # type: ignore[attr-defined]
        return checked
