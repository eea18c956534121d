"""OpenTelemetry (the otel extra): enqueue puts the trace context in meta, the worker runs
each attempt in a span linked to the producer's. A real SDK with its in-memory exporter."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest

import treadle
from tests.worker.worker_support import until_state
from treadle import JobContext, Worker

pytest.importorskip("opentelemetry.sdk")

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

MakeWorker = Callable[..., Worker]
_EXPORTER = InMemorySpanExporter()


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """The process's tracer provider (set once: OpenTelemetry allows one), exporting to memory."""
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(_EXPORTER))
        trace.set_tracer_provider(provider)
    _EXPORTER.clear()
    yield _EXPORTER
    _EXPORTER.clear()


def stored_meta(conn: psycopg.Connection[Any], job_id: int) -> Any:
    found = conn.execute("SELECT meta FROM treadle.jobs WHERE id = %s", [job_id]).fetchone()
    assert found is not None
    return found[0]


def test_enqueue_adds_the_current_trace_context_to_meta(
    conn: psycopg.Connection[Any], spans: InMemorySpanExporter
) -> None:
    assert stored_meta(conn, treadle.enqueue(conn, "deliver")) is None, "no span: nothing added"
    with trace.get_tracer("app").start_as_current_span("request") as request:
        trace_id = format(request.get_span_context().trace_id, "032x")
        span_id = format(request.get_span_context().span_id, "016x")
        flags = format(request.get_span_context().trace_flags, "02x")
        one = treadle.enqueue(conn, "deliver", meta={"tenant": "acme"})
        bare = treadle.enqueue(conn, "deliver")
        own = treadle.enqueue(conn, "deliver", meta={"traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01"})
        many = treadle.enqueue_many(conn, [{"name": "a"}, {"name": "b", "meta": {"tenant": "zeta"}}])
    expected = f"00-{trace_id}-{span_id}-{flags}"
    assert stored_meta(conn, one) == {"tenant": "acme", "traceparent": expected}
    assert stored_meta(conn, bare) == {"traceparent": expected}
    assert stored_meta(conn, own)["traceparent"] == "00-" + "1" * 32 + "-" + "2" * 16 + "-01", "the caller's key wins"
    assert [stored_meta(conn, job_id) for job_id in many] == [
        {"traceparent": expected},
        {"tenant": "zeta", "traceparent": expected},
    ]


def test_each_attempt_runs_in_a_span_linked_to_the_producers(
    conn: psycopg.Connection[Any], make_worker: MakeWorker, spans: InMemorySpanExporter
) -> None:
    worker = make_worker()
    seen: list[tuple[int, Any, str]] = []

    @worker.register
    def deliver(args: Any, ctx: JobContext) -> None:
        current = trace.get_current_span().get_span_context()
        seen.append((ctx.attempt, ctx.meta, format(current.trace_id, "032x")))
        if ctx.attempt == 1:
            raise ConnectionError("endpoint down")

    with trace.get_tracer("app").start_as_current_span("request") as request:
        producer = request.get_span_context()
        job_id = treadle.enqueue(
            conn, "deliver", {"url": "https://example.com"}, max_attempts=2, backoff=[timedelta(milliseconds=10)]
        )
    worker.start()
    until_state(conn, job_id, "completed")
    worker.stop()

    attempts = [span for span in spans.get_finished_spans() if span.name == "deliver"]
    assert len(attempts) == 2, [span.name for span in spans.get_finished_spans()]
    first, second = sorted(attempts, key=lambda span: int(str((span.attributes or {})["treadle.job.attempt"])))
    for span in (first, second):
        assert span.kind == trace.SpanKind.CONSUMER
        assert [link.context.span_id for link in span.links] == [producer.span_id]
        assert [link.context.trace_id for link in span.links] == [producer.trace_id]
        assert span.attributes is not None
        assert span.attributes["messaging.message.id"] == str(job_id)
        assert span.attributes["messaging.destination.name"] == "default"
        assert span.attributes["messaging.system"] == "treadle"
    assert first.status.status_code == trace.StatusCode.ERROR
    assert "ConnectionError: endpoint down" in (first.status.description or "")
    assert [event.name for event in first.events] == ["exception"]
    assert second.status.status_code == trace.StatusCode.UNSET
    # the handler ran inside its attempt's span: its current span is that span
    assert [trace_id for _, _, trace_id in seen] == [
        format(first.context.trace_id, "032x"),
        format(second.context.trace_id, "032x"),
    ]
    assert all(meta["traceparent"].split("-")[1] == format(producer.trace_id, "032x") for _, meta, _ in seen)


def test_an_async_handler_runs_in_its_span_and_a_job_without_context_has_no_link(
    conn: psycopg.Connection[Any], make_worker: MakeWorker, spans: InMemorySpanExporter
) -> None:
    worker = make_worker()

    @worker.register
    async def crawl(args: Any, ctx: JobContext) -> str:
        return format(trace.get_current_span().get_span_context().span_id, "016x")

    job_id = treadle.enqueue(conn, "crawl", meta={"traceparent": "not a trace context"})
    worker.start()
    row = until_state(conn, job_id, "completed")
    worker.stop()
    (span,) = [span for span in spans.get_finished_spans() if span.name == "crawl"]
    assert span.links == () or list(span.links) == []
    assert row["result"] == format(span.context.span_id, "016x")


def test_start_workflow_adds_the_current_trace_context_to_the_runs_meta(
    conn: psycopg.Connection[Any], spans: InMemorySpanExporter
) -> None:
    with trace.get_tracer("app").start_as_current_span("request") as request:
        context = request.get_span_context()
        expected = f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}"
        run_id = treadle.start_workflow(conn, "onboard", {}, steps=["create"], meta={"tenant": "acme"})
    found = conn.execute(
        "SELECT r.meta, j.meta FROM treadle.workflow_runs AS r JOIN treadle.jobs AS j ON j.workflow_run_id = r.id"
        " WHERE r.id = %s",
        [run_id],
    ).fetchone()
    assert found == ({"tenant": "acme", "traceparent": expected},) * 2, "the run and its step job carry it"
