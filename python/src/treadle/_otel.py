"""OpenTelemetry, when it is installed (the `otel` extra): trace context in a job's meta, a span per attempt.

A producer's `enqueue` (and `enqueue_many`) adds the current trace context to the
job's meta (`traceparent`, and `tracestate` or `baggage` when there are any), as the
globally configured propagator writes it; keys the caller gave itself win. A worker
runs each attempt in a span of kind CONSUMER named after the job, linked to the
producer's span, with the job's id, queue and attempt as attributes; a handler that
raises marks it failed (a snooze does not). Without opentelemetry, or without a
tracer provider set, nothing is added and no span is started.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

try:
    from opentelemetry import context, propagate, trace
except ImportError:  # pragma: no cover - the tests run with and without it
    ENABLED = False
else:
    ENABLED = True

from .errors import Snooze
from .models import Job

_NOTHING: AbstractContextManager[None] = nullcontext()


def with_trace_context(meta: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    """`meta` with the current trace context added (the caller's keys win); `meta` itself without one."""
    if not ENABLED or not context.get_current():
        return meta  # an empty context holds no span and no baggage: nothing to inject
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    if not carrier:
        return meta
    return {**carrier, **(meta or {})}


def trace_context() -> dict[str, str]:
    """The current trace context as a propagator writes it; empty without a span."""
    if not ENABLED or not context.get_current():
        return {}
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return carrier


def tracing() -> bool:
    """Whether a span would be recorded now: opentelemetry is installed and a tracer provider set.

    The worker asks once per claimed batch, not once per job: without a provider set in
    code, OpenTelemetry looks for one in the environment at every call.
    """
    return ENABLED and not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)


def attempt(job: Job) -> AbstractContextManager[None]:
    """The span one attempt of `job` runs in; a context that does nothing without opentelemetry."""
    if not tracing():
        return _NOTHING  # no SDK configured: no span would be recorded
    return _span(job)


@contextmanager
def _span(job: Job) -> Iterator[None]:
    links = []
    meta = job.meta
    if isinstance(meta, dict):
        carrier = {key: value for key, value in meta.items() if isinstance(value, str)}
        if carrier:
            producer = trace.get_current_span(propagate.extract(carrier)).get_span_context()
            if producer.is_valid:
                links.append(trace.Link(producer))
    attributes: dict[str, str | int] = {
        "messaging.system": "treadle",
        "messaging.operation.type": "process",
        "messaging.destination.name": job.queue,
        "messaging.message.id": str(job.id),
        "treadle.job.name": job.name,
        "treadle.job.attempt": job.attempt,
    }
    if job.workflow_run_id is not None and job.step is not None:
        attributes["treadle.workflow_run.id"] = job.workflow_run_id
        attributes["treadle.workflow_run.step"] = job.step
    tracer = trace.get_tracer("treadle")
    with tracer.start_as_current_span(
        job.name,
        kind=trace.SpanKind.CONSUMER,
        links=links,
        attributes=attributes,
        record_exception=False,
        set_status_on_exception=False,
    ) as span:
        try:
            yield
        except Snooze:
            raise  # run again later: not a failure
        except BaseException as error:
            span.record_exception(error)
            span.set_status(trace.Status(trace.StatusCode.ERROR, f"{type(error).__name__}: {error}"))
            raise
