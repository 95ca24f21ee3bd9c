"""The enqueuing caller's trace context, carried by an outbox row to the job it becomes.

When tracing records, `write` stores the caller's context (W3C `traceparent`) in the row's
headers and the relay publishes inside it, so the job's spans join the caller's trace however
much later the relay sends it. OpenTelemetry is optional and never imported here first: a span
exists only where something imported it already.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator, Mapping
from typing import Any


def with_trace_context(options: Mapping[str, Any]) -> dict[str, Any]:
    """`options` with the current trace context added to its headers (a copy), or as they
    are when no span records (or OpenTelemetry is not installed)."""
    if "opentelemetry.trace" not in sys.modules:
        return dict(options)
    from opentelemetry import propagate, trace

    if not trace.get_current_span().get_span_context().is_valid:
        return dict(options)
    headers = dict(options.get("headers") or {})
    propagate.inject(headers)
    return {**options, "headers": headers}


@contextlib.contextmanager
def trace_context_of(headers: Mapping[str, Any]) -> Iterator[None]:
    """Make the trace context stored in a row's headers current while publishing it, so the
    publish continues the enqueuing caller's trace (the job's execution joins it through the
    stored `traceparent` either way)."""
    if "opentelemetry.trace" not in sys.modules:
        yield
        return
    from opentelemetry import context, propagate, trace

    carrier = {key: value for key, value in headers.items() if isinstance(value, str)}
    stored = propagate.extract(carrier)
    if not trace.get_current_span(stored).get_span_context().is_valid:
        yield
        return
    token = context.attach(stored)
    try:
        yield
    finally:
        context.detach(token)
