"""Tracing: OpenTelemetry's Celery instrumentation plus guard decisions as span events.

The worker here is a real Celery worker (`celery.contrib.testing.worker.start_worker`:
the platform app's WorkController and consumer, the solo pool) on the session's real Redis
broker, Redis and PostgreSQL stores, but in the test's own process, in a thread. That is
the honest way to use the SDK's `InMemorySpanExporter`: a worker process could not share
its memory, and exporting to a file would test a file exporter, not the traces. It still
proves propagation: the worker thread starts with an empty context, so its spans join the
caller's trace only through the message headers, as across machines.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support import wait_for

TASK = "tests.tracing.traced"


@pytest.fixture()
def exporter(app: Any) -> Iterator[Any]:
    """Celery instrumented with a private tracer provider exporting into memory."""
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from jobs.observe.tracing import install_tracing, uninstall_tracing

    memory = InMemorySpanExporter()
    provider = install_tracing(span_processor=SimpleSpanProcessor(memory), set_global=False)
    memory.provider = provider
    try:
        yield memory
    finally:
        uninstall_tracing()


@pytest.fixture()
def tracing_queue(app: Any) -> Iterator[str]:
    """The test tasks' own queue, known to this process's app and emptied afterwards."""
    from kombu import Exchange, Queue

    from tests.jobs.observe.tasks_tracing import QUEUE

    if QUEUE not in app.amqp.queues:
        app.amqp.queues.add(Queue(QUEUE, Exchange("jobs", type="direct"), routing_key=QUEUE))
    yield QUEUE
    with app.connection_for_write() as connection:
        connection.default_channel.queue_purge(QUEUE)


def _logging_state() -> list[tuple[logging.Logger, list[Any], int, bool]]:
    loggers = [logging.getLogger(), *(logger for logger in
                                      logging.Logger.manager.loggerDict.values()
                                      if isinstance(logger, logging.Logger))]
    return [(logger, list(logger.handlers), logger.level, logger.propagate)
            for logger in loggers]


@pytest.fixture()
def tracing_worker(app: Any, redis_client: Any, tracing_queue: str) -> Iterator[Any]:
    """A real worker in this process consuming only the tracing test's queue.

    `start_worker` sets up Celery's logging in this process (root handler, a non-propagating
    task logger): it is put back afterwards so later tests' log capture is unchanged.
    """
    from celery.contrib.testing.worker import start_worker

    queues = app.amqp.queues
    consumed = queues._consume_from  # start_worker selects the queue in place: put it back
    logging_before = _logging_state()
    try:
        with start_worker(app, pool="solo", concurrency=1, perform_ping_check=False,
                          queues=[tracing_queue], loglevel="WARNING",
                          shutdown_timeout=30) as worker:
            yield worker
    finally:
        queues._consume_from = consumed
        for logger, handlers, level, propagate in logging_before:
            logger.handlers[:] = handlers
            logger.setLevel(level)
            logger.propagate = propagate


def _force(app: Any, state: str) -> None:
    from resilience.circuit.backends.redis import RedisBreakerBackend
    from resilience.circuit.breaker import CircuitBreaker
    from resilience.circuit.config import BreakerConfig
    from tests.jobs.observe.tasks_tracing import BREAKER

    CircuitBreaker(BreakerConfig(name=BREAKER), RedisBreakerBackend.of_app(app)).force(state)


def _decisions(spans: list[Any]) -> list[tuple[Any, dict[str, Any]]]:
    """(span, attributes) of every guard decision event, in time order."""
    found = [(span, event) for span in spans for event in span.events
             if event.name == "guard.decision"]
    return [(span, dict(event.attributes))
            for span, event in sorted(found, key=lambda pair: pair[1].timestamp)]


class TestTracing:
    def test_deferred_retried_replayed_job_is_one_trace_with_decision_events(
        self, app: Any, exporter: Any, tracing_worker: Any
    ) -> None:
        """enqueue -> DEFERRED by an open breaker -> breaker closed -> RETRY -> success ->
        a duplicate REPLAYED: every span is in the request's trace, each execution a child
        of the publish that sent it, and each decision an event with guard, outcome,
        reason and retry_after."""
        from tests.jobs.observe.tasks_tracing import traced

        key = f"trace-{uuid.uuid4().hex[:8]}"
        _force(app, "forced_open")
        tracer = exporter.provider.get_tracer("tests.tracing")
        try:
            with tracer.start_as_current_span("request") as request:
                first = traced.delay(key=key)

                def deferred() -> bool:
                    return any(attributes["outcome"] == "DEFERRED"
                               for _, attributes in _decisions(exporter.get_finished_spans()))

                wait_for(deferred, timeout_seconds=60, interval=0.05, message="DEFERRED")
                _force(app, "closed")
                assert first.get(timeout=60) == {"key": key, "runs": 2}
                duplicate = traced.delay(key=key)
                replayed = duplicate.get(timeout=60)
        finally:
            _force(app, "closed")
        assert replayed == {"key": key, "runs": 2}  # the first call's value, replayed

        def all_runs_ended() -> list[Any] | None:
            spans = exporter.get_finished_spans()
            outcomes = [attributes["outcome"] for _, attributes in _decisions(spans)]
            return spans if "REPLAYED" in outcomes and outcomes.count("RETRY") == 1 else None

        spans = wait_for(all_runs_ended, timeout_seconds=30, message="the REPLAYED span")
        trace_id = request.get_span_context().trace_id
        runs = [span for span in spans if span.name == f"run/{TASK}"]
        publishes = [span for span in spans if span.name == f"apply_async/{TASK}"]
        assert {span.context.trace_id for span in runs + publishes} == {trace_id}
        # deferred (one or more), failed (RETRY), succeeded, replayed
        assert len(runs) >= 4
        by_id = {span.context.span_id: span for span in spans}
        for run in runs:  # each execution is a child of the publish that sent it
            assert by_id[run.parent.span_id].name == f"apply_async/{TASK}"

        decisions = _decisions(spans)
        outcomes = [attributes["outcome"] for _, attributes in decisions]
        assert outcomes[-3:] == ["DEFERRED", "RETRY", "REPLAYED"], outcomes
        assert set(outcomes[:-3]) <= {"DEFERRED"}, outcomes
        assert all(span in runs for span, _ in decisions)
        (_, deferral), (_, retry), (_, replay) = decisions[-3:]
        assert deferral["guard"] == "breaker"
        assert deferral["reason"] == "breaker tests-tracing-dependency is forced_open"
        assert deferral["retry_after"] == pytest.approx(0.5)
        assert retry["guard"] == "retry"
        assert retry["reason"] == "Retryable: vendor unavailable"
        assert retry["retry_after"] >= 0.25  # from the republished message's ETA
        assert replay["guard"] == "idempotency"
        assert key in replay["reason"]
        # the retried run is a child of the publish made by the run that deferred, and so on
        retry_span = next(span for span, attributes in decisions
                          if attributes["outcome"] == "RETRY")
        deferring_span = decisions[-3][0]
        assert by_id[retry_span.parent.span_id].parent.span_id == (
            deferring_span.context.span_id)

    def test_outbox_relay_publishes_in_the_enqueuing_callers_trace(
        self, app: Any, exporter: Any, engine: Any, tracing_queue: str
    ) -> None:
        """A job written to the outbox inside a traced request is published by the relay,
        later and outside any span, as a child of that request's trace."""
        from sqlalchemy.orm import Session

        from resilience.outbox.relay import Relay
        from tests.jobs.observe.tasks_tracing import traced

        tracer = exporter.provider.get_tracer("tests.tracing")
        with tracer.start_as_current_span("request") as request, Session(engine) as session, \
                session.begin():
            result = traced.apply_async_in(session, kwargs={"key": f"o-{uuid.uuid4().hex}"})
        relay = Relay(app)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            relay.relay_once()
            published = [span for span in exporter.get_finished_spans()
                         if span.name == f"apply_async/{TASK}"
                         and span.attributes.get("messaging.message.id") == result.id]
            if published:
                break
            time.sleep(0.1)
        assert published, "the relay did not publish the row"
        assert published[0].context.trace_id == request.get_span_context().trace_id
        assert published[0].parent.span_id == request.get_span_context().span_id


class TestDecisionEvents:
    def test_a_counted_decision_and_its_stop_are_one_event(self, app: Any) -> None:
        """count_outcome then Stop (how every guard decides) writes one event merging the
        counter's labels with the Stop's reason and retry-after."""
        from opentelemetry.sdk.trace import TracerProvider

        from resilience.counters import count_outcome
        from resilience.outcomes import Outcome, Stop

        tracer = TracerProvider().get_tracer("tests.tracing")
        with tracer.start_as_current_span("job") as span:
            count_outcome(app, "DEFERRED", guard="rate-limit", tier="critical", name="api")
            Stop(Outcome.DEFERRED, guard="rate-limit", reason="no permit",
                 retry_after_seconds=1.5)
            count_outcome(app, "FAIL-OPEN", guard="breaker", name="api")
        events = [dict(event.attributes) for event in span.events]
        assert events == [
            {"guard": "rate-limit", "outcome": "DEFERRED", "reason": "no permit",
             "retry_after": 1.5, "name": "api", "tier": "critical"},
            {"guard": "breaker", "outcome": "FAIL-OPEN", "name": "api"},
        ]


class TestSwitch:
    @pytest.mark.parametrize(("environ", "enabled"), [
        ({}, False),
        ({"OTEL_TRACES_EXPORTER": "none"}, False),
        ({"OTEL_TRACES_EXPORTER": "otlp"}, True),
        ({"OTEL_TRACES_EXPORTER": "console,otlp"}, True),
        ({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_SDK_DISABLED": "true"}, False),
    ])
    def test_off_by_default_on_with_an_exporter(self, environ: dict[str, str],
                                                enabled: bool) -> None:
        """Tracing is on only when OTEL_TRACES_EXPORTER names an exporter and the SDK is not
        disabled."""
        from jobs.observe.tracing import tracing_enabled

        assert tracing_enabled(environ) is enabled
