"""The enqueue pipeline's own VALIDATE step: arguments that can be sent and will bind.

Every enqueue passes it before the enqueue guards (`validate_publish`): args
and kwargs as Celery takes them, bound to the task's signature (as Celery's `typing` asks),
carried by the serializer, and within the payload limit (`max_payload_bytes`, else
`app.conf.resilience_max_payload_bytes`): a bad call fails in the producer, at `.delay()`,
instead of on every delivery in a worker.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from kombu import serialization
from kombu.exceptions import EncodeError
from kombu.utils.json import dumps as kombu_json

from resilience.errors import InvalidTaskArguments, NonJsonArguments, PayloadTooLarge
from resilience.keys import check_binding

if TYPE_CHECKING:
    from celery import Task

#: Default limit on the serialized size of a task's arguments, in bytes.
DEFAULT_MAX_PAYLOAD_BYTES = 256 * 1024


#: Largest int written without a second look (JSON-safe everywhere, at most 20 characters).
_INT_BOUND = 2**63


def scalar_payload_bound(args: tuple[Any, ...], kwargs: dict[str, Any]) -> int | None:
    """An upper bound on the JSON size of `[args, kwargs]` when every value is a plain
    scalar JSON carries as is (str, bool, None, an int within 64 bits, a finite float);
    None otherwise (the caller serializes to check). The common `.delay(id, "name")` then
    skips a full serialization on the enqueue path: Celery serializes once anyway."""
    size = 16
    for values in (args, kwargs.values()):
        for value in values:
            kind = type(value)
            if kind is str:
                size += 6 * len(value) + 3  # a \uXXXX escape at worst, quotes, comma
            elif kind is int:
                if not -_INT_BOUND < value < _INT_BOUND:
                    return None
                size += 21
            elif kind is float:
                if value != value or value in (float("inf"), float("-inf")):
                    return None  # NaN / infinity: refused by the full check
                size += 25
            elif value is None or kind is bool:
                size += 6
            else:
                return None
    for key in kwargs:
        if type(key) is not str:
            return None
        size += 6 * len(key) + 4
    return size


def celery_arguments(args: Any, kwargs: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """`args`/`kwargs` of `apply_async` as Celery takes them: None is empty, args a list or
    tuple, kwargs a mapping (`celery/app/amqp.py` `as_task_v2`), so `apply_async("s", {})`
    fails here instead of publishing `("s",)`.

    Raises:
        InvalidTaskArguments: a TypeError, with Celery's message.
    """
    args = args or ()
    kwargs = kwargs or {}
    if not isinstance(args, (list, tuple)):
        raise InvalidTaskArguments(f"task args must be a list or tuple, not {type(args).__name__}")
    if not isinstance(kwargs, Mapping):
        raise InvalidTaskArguments(
            f"task keyword arguments must be a mapping, not {type(kwargs).__name__}")
    return tuple(args), dict(kwargs)


def serialized_size(args: tuple[Any, ...], kwargs: dict[str, Any],
                    serializer: str | None) -> int:
    """Bytes of `[args, kwargs]` as `serializer` writes them (None: JSON).

    JSON is kombu's, so whatever Celery's JSON carries is accepted (`UUID`, `datetime`,
    `date`, `time`, `Decimal`, bytes, registered types), except NaN and infinities: kombu
    would write them as bare `NaN` / `Infinity`, which no JSON parser but Python's reads.

    Raises:
        NonJsonArguments: the serializer cannot carry an argument.
    """
    if serializer in (None, "json"):
        try:
            return len(kombu_json([list(args), kwargs], allow_nan=False))
        except (TypeError, ValueError) as exc:
            raise NonJsonArguments(
                "arguments must be what Celery's JSON serializer carries (str, int, float, "
                "bool, None, list, dict, UUID, datetime, date, time, Decimal, bytes): "
                f"{exc}", cause=repr(exc)) from None
    try:
        _, _, payload = serialization.dumps([list(args), kwargs], serializer)
    except EncodeError as exc:
        raise NonJsonArguments(f"arguments cannot be serialized with {serializer}: {exc}",
                               cause=repr(exc)) from None
    return len(payload)


def validate_arguments(task: Task, args: tuple[Any, ...], kwargs: dict[str, Any], *,
                       serializer: str | None = None) -> None:
    """Refuse arguments that would fail in the worker or could not be sent at all.

    The signature check follows Celery's `typing` (the task's `typing=`, else the app's
    `strict_typing`): when it is off the arguments are not bound, as Celery does not
    bind them. The serializer and size checks run whatever `typing` says: they protect
    the broker and the worker's memory, which Celery leaves unbounded. (A guard that
    keys on arguments, `@idempotent` or `@unique` say, still binds them to build its
    key.)

    Args:
        serializer: the publish's `serializer` option; None takes the task's.

    Raises:
        ArgumentsDoNotBind, NonJsonArguments, PayloadTooLarge.
    """
    if task.typing:
        check_binding(task.run, args, kwargs)
    limit = getattr(task, "max_payload_bytes", None) or _app_limit(task)
    bound = scalar_payload_bound(args, kwargs)
    if bound is not None and bound <= limit:
        return  # plain scalars that cannot reach the limit: no need to serialize
    size = serialized_size(args, kwargs, serializer or task.serializer)
    if size > limit:
        raise PayloadTooLarge(
            f"{task.name}: arguments serialize to {size} bytes, over the {limit}-byte "
            "limit; pass a reference (a row id, an object-store key) instead of the data",
            size=size,
            limit=limit)


def _app_limit(task: Task) -> int:
    """`app.conf.resilience_max_payload_bytes`, read once per task (every `.delay()` asks;
    Celery's settings lookup costs more than the check)."""
    limit = task.__dict__.get("_payload_limit")
    if limit is None:
        limit = task._payload_limit = int(task.app.conf.get(  # type: ignore[attr-defined]
            "resilience_max_payload_bytes", DEFAULT_MAX_PAYLOAD_BYTES))
    return limit


def validate_publish(publish: Any) -> None:
    """The VALIDATE stage's first step: the task's `validate_arguments` on `publish` (a
    `resilience.pipeline.Publish`; not imported: the pipeline is above this module)."""
    publish.task.validate_arguments(publish.args, publish.kwargs,
                                    serializer=publish.options.get("serializer"))
