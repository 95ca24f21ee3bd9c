"""Tracing with OpenTelemetry (Celery's own instrumentation), installed by
`jobs.platform.create_app` when the environment asks for it. See docs/observe.md (Tracing).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Any

from celery import signals

from resilience.errors import ConfigurationError

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import SpanProcessor, TracerProvider

#: Service name when `OTEL_SERVICE_NAME` (or `service.name` in the resource) is not set.
DEFAULT_SERVICE_NAME = "jobs"

_installed: TracerProvider | None = None
#: The receivers flushing spans at a worker's (and a pool process's) shutdown.
_FLUSH = "jobs.observe.tracing.flush"


def tracing_enabled(environ: Mapping[str, str] | None = None) -> bool:
    """True when the environment asks for traces: an exporter named, the SDK not disabled."""
    environ = os.environ if environ is None else environ
    disabled = environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true"
    return not disabled and bool(_exporter_names(environ))


def _exporter_names(environ: Mapping[str, str]) -> list[str]:
    """The exporters `OTEL_TRACES_EXPORTER` names (`none`: none)."""
    names = [name.strip().lower() for name in environ.get("OTEL_TRACES_EXPORTER", "").split(",")]
    return [name for name in names if name and name != "none"]


def _exporter(name: str) -> Any:
    """The span exporter registered under `name` (OpenTelemetry's entry point group); `otlp`
    is gRPC or HTTP by `OTEL_EXPORTER_OTLP_[TRACES_]PROTOCOL` (default the extra's HTTP)."""
    if name == "otlp":
        protocol = (os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
                    or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL") or "http/protobuf")
        name = "otlp_proto_grpc" if protocol.strip() == "grpc" else "otlp_proto_http"
    found = entry_points(group="opentelemetry_traces_exporter", name=name)
    if not found:
        known = sorted(point.name for point in entry_points(group="opentelemetry_traces_exporter"))
        raise ConfigurationError(
            f"OTEL_TRACES_EXPORTER names {name!r}, which is not installed (installed: "
            f"{', '.join(known) or 'none'}); install its package, e.g. "
            "opentelemetry-exporter-otlp-proto-grpc for grpc"
        )
    return next(iter(found)).load()()


def install_tracing(*, span_processor: SpanProcessor | None = None,
                    set_global: bool = True) -> TracerProvider:
    """Trace this process: a tracer provider exporting as `OTEL_*` says, and Celery
    instrumented with it. Idempotent: a second call returns the first provider.

    Args:
        span_processor: where spans go instead of the `OTEL_TRACES_EXPORTER` exporters (a
            test's in-memory exporter).
        set_global: make it OpenTelemetry's global provider (a provider someone set before,
            e.g. `opentelemetry-instrument`, is reused instead).

    Raises:
        ConfigurationError: an exporter that is not installed, or the `otel` extra missing.
    """
    global _installed
    if _installed is not None:
        return _installed
    try:
        from opentelemetry import trace
        from opentelemetry.instrumentation.celery import CeleryInstrumentor
        from opentelemetry.sdk.resources import SERVICE_NAME, Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError as exc:
        raise ConfigurationError(
            f"tracing asked for (OTEL_TRACES_EXPORTER) but OpenTelemetry is missing ({exc}); "
            "install the extra: pip install 'jobs-platform[otel]'"
        ) from exc

    current = trace.get_tracer_provider()
    if set_global and isinstance(current, TracerProvider):
        provider = current  # already configured in this process (e.g. by the OTel agent)
    else:
        resource = Resource.create()
        if resource.attributes.get(SERVICE_NAME, "").startswith("unknown_service"):
            resource = resource.merge(Resource.create({SERVICE_NAME: DEFAULT_SERVICE_NAME}))
        provider = TracerProvider(resource=resource)
        if span_processor is None:
            for name in _exporter_names(os.environ):
                provider.add_span_processor(BatchSpanProcessor(_exporter(name)))
        if set_global:
            trace.set_tracer_provider(provider)
    if span_processor is not None:
        provider.add_span_processor(span_processor)
    CeleryInstrumentor().instrument(tracer_provider=provider)

    def flush(**_: Any) -> None:  # a prefork pool process ends without running atexit
        provider.force_flush(timeout_millis=5000)

    for signal in (signals.worker_process_shutdown, signals.worker_shutdown):
        signal.connect(flush, weak=False, dispatch_uid=_FLUSH)
    _installed = provider
    return provider


def uninstall_tracing() -> None:
    """Stop tracing Celery in this process (tests); the provider is flushed and shut down
    unless it is OpenTelemetry's global one."""
    global _installed
    if _installed is None:
        return
    from opentelemetry import trace
    from opentelemetry.instrumentation.celery import CeleryInstrumentor

    CeleryInstrumentor().uninstrument()
    for signal in (signals.worker_process_shutdown, signals.worker_shutdown):
        signal.disconnect(dispatch_uid=_FLUSH)
    if trace.get_tracer_provider() is not _installed:
        _installed.shutdown()
    _installed = None

