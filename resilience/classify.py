"""Error classification: may this error be retried, and did it say when?

One rule set (docs/failure.md, "Classification") for the retry guard, the breaker (which
counts only retryable errors as failures), the idempotency guard and the outbox relay.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

#: A user hook: True = retryable, False = not, None = no opinion (ask the next rule).
ClassifyHook = Callable[[BaseException], "bool | None"]

#: Retryable 4xx statuses; every 5xx is retryable, every other 4xx not.
RETRYABLE_STATUSES = frozenset({408, 425, 429})

#: Exception types that are transient by nature.
RETRYABLE_TYPES: tuple[type[BaseException], ...] = (ConnectionError, TimeoutError)
#: Exception types that signal a bug or bad input: retrying repeats the same failure.
NON_RETRYABLE_TYPES: tuple[type[BaseException], ...] = (
    TypeError, ValueError, LookupError, AttributeError, NotImplementedError, AssertionError)


class Retryable(Exception):
    """Raised by a task body for a failure worth retrying (optionally after a given delay).

    Args:
        message: what failed.
        retry_after_seconds: the dependency's own hint (a Retry-After header), honoured as the
            minimum delay before the next attempt.
        status: an HTTP status, kept for the record.
    """

    def __init__(self, message: str = "retryable failure", *,
                 retry_after_seconds: float | None = None, status: int | None = None) -> None:
        super().__init__(message)
        self.retry_after_seconds = retry_after_seconds
        self.status = status


class NonRetryable(Exception):
    """Raised by a task body for a failure that cannot succeed on retry (bad input, 4xx).

    Args:
        message: what failed.
        status: an HTTP status, kept for the record.
    """

    def __init__(
        self, message: str = "non-retryable failure", *, status: int | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.retry_after_seconds = None


def http_status(exc: BaseException) -> int | None:
    """The HTTP status of `exc` (`status`, `status_code`, `response.status_code`), if any."""
    for candidate in (
        getattr(exc, "status", None),
        getattr(exc, "status_code", None),
        getattr(getattr(exc, "response", None), "status_code", None),
        # urllib's HTTPError keeps it in `code`; other `code`s (errno, SystemExit) are not.
        getattr(exc, "code", None) if type(exc).__name__ == "HTTPError" else None,
    ):
        if isinstance(candidate, int) and not isinstance(candidate, bool) and (
                100 <= candidate <= 599):
            return candidate
    return None


def is_retryable(exc: BaseException, hooks: Iterable[ClassifyHook] = ()) -> bool:
    """Whether retrying `exc` may succeed (docs/failure.md has the rules, in order).

    Args:
        exc: the error the task body raised.
        hooks: user classifiers tried first; each returns True, False or None (abstain).
    """
    for hook in hooks:
        verdict = hook(exc)
        if verdict is not None:
            return bool(verdict)
    if isinstance(exc, NonRetryable):
        return False
    if isinstance(exc, Retryable):
        return True
    status = http_status(exc) or 0
    if status >= 500 or status in RETRYABLE_STATUSES:
        return True
    if 400 <= status <= 499:
        return False
    if isinstance(exc, RETRYABLE_TYPES):
        return True
    if isinstance(exc, NON_RETRYABLE_TYPES):
        return False
    # Errors of the process itself, not of a dependency, are never retried.
    return isinstance(exc, Exception)


def retry_after(exc: BaseException) -> float | None:
    """The delay in seconds the error asks for (`retry_after_seconds` or a Retry-After header).

    Reads `exc.retry_after_seconds`, `exc.retry_after`, then `exc.headers` /
    `exc.response.headers` "Retry-After" (delta-seconds or an HTTP date). None if absent.
    """
    for attribute in ("retry_after_seconds", "retry_after"):
        value = getattr(exc, attribute, None)
        seconds = _seconds(value)
        if seconds is not None:
            return seconds
    for headers in (
        getattr(exc, "headers", None),
        getattr(getattr(exc, "response", None), "headers", None),
    ):
        if headers is None:
            continue
        try:
            value = headers.get("Retry-After") or headers.get("retry-after")
        except (AttributeError, TypeError):
            continue
        seconds = _seconds(value)
        if seconds is not None:
            return seconds
    return None


def _seconds(value: Any) -> float | None:
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return max(0.0, float(value))
    if isinstance(value, str):
        text = value.strip()
        try:
            return max(0.0, float(text))
        except ValueError:
            pass
        from datetime import UTC, datetime
        from email.utils import parsedate_to_datetime

        try:
            when = parsedate_to_datetime(text)
        except (TypeError, ValueError):
            return None
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        return max(0.0, (when - datetime.now(UTC)).total_seconds())
    return None
