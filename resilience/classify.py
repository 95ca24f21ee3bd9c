"""Error classification: may this error be retried, and did it say when?

Core: the retry guard, the breaker (which counts only retryable errors as failures), the
idempotency guard and the outbox relay all classify errors the same way.

An error is classified, first match wins, by:

1. user hooks (`classify_hooks`): callables `hook(exc) -> bool | None`; `None` abstains;
2. the `Retryable` / `NonRetryable` pair users raise;
3. an HTTP status read from `status`, `status_code` or `response.status_code`
   (408, 429 and 5xx retryable; every other 4xx not);
4. the exception type: connection and timeout errors retryable, programming errors
   (`TypeError`, `ValueError`, `KeyError`, ...) not;
5. otherwise retryable (an unknown failure of a dependency is usually transient; the retry
   budget bounds the cost of being wrong).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

#: A user hook: True = retryable, False = not, None = no opinion (ask the next rule).
ClassifyHook = Callable[[BaseException], "bool | None"]

RETRYABLE_STATUSES = frozenset({408, 425, 429, 500, 502, 503, 504})
NON_RETRYABLE_STATUSES = frozenset({400, 401, 403, 404, 405, 409, 410, 413, 415, 422})

#: Exception types that are transient by nature.
RETRYABLE_TYPES: tuple[type[BaseException], ...] = (ConnectionError, TimeoutError)
#: Exception types that signal a bug or bad input: retrying repeats the same failure.
NON_RETRYABLE_TYPES: tuple[type[BaseException], ...] = (
    TypeError,
    ValueError,
    KeyError,
    AttributeError,
    NotImplementedError,
    AssertionError,
    LookupError,
)


class Retryable(Exception):
    """Raised by a task body for a failure worth retrying (optionally after a given delay).

    Args:
        message: what failed.
        retry_after_seconds: the dependency's own hint (a Retry-After header), honoured as the
            minimum delay before the next attempt.
        status: an HTTP status, kept for the record.
    """

    def __init__(
        self,
        message: str = "retryable failure",
        *,
        retry_after_seconds: float | None = None,
        status: int | None = None,
    ) -> None:
        super().__init__(message)
        self.retry_after_seconds = retry_after_seconds
        self.status = status

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (type(self), str(self), self.retry_after_seconds, self.status))


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

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (type(self), str(self), None, self.status))


def _rebuild(
    cls: type[Exception], message: str, retry_after: float | None, status: int | None
) -> Exception:
    if issubclass(cls, Retryable):
        return cls(message, retry_after_seconds=retry_after, status=status)
    return cls(message, status=status)


def http_status(exc: BaseException) -> int | None:
    """The HTTP status of `exc` (`status`, `status_code`, `response.status_code`), if any."""
    for candidate in (
        getattr(exc, "status", None),
        getattr(exc, "status_code", None),
        getattr(getattr(exc, "response", None), "status_code", None),
        getattr(exc, "code", None) if _looks_like_http_error(exc) else None,
    ):
        if (
            isinstance(candidate, int)
            and not isinstance(candidate, bool)
            and 100 <= candidate <= 599
        ):
            return candidate
    return None


def _looks_like_http_error(exc: BaseException) -> bool:
    # urllib.error.HTTPError keeps the status in `code`; other `code` attributes (errno-like,
    # SystemExit) are not HTTP statuses.
    return type(exc).__name__ == "HTTPError"


def _status_retryable(status: int) -> bool | None:
    if status in RETRYABLE_STATUSES or 500 <= status <= 599:
        return True
    if status in NON_RETRYABLE_STATUSES or 400 <= status <= 499:
        return False
    return None


def is_retryable(exc: BaseException, hooks: Iterable[ClassifyHook] = ()) -> bool:
    """Whether retrying `exc` may succeed (see the module docstring for the rules, in order).

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
    status = http_status(exc)
    if status is not None:
        verdict = _status_retryable(status)
        if verdict is not None:
            return verdict
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
