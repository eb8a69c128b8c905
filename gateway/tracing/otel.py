"""Tracing with the OpenTelemetry SDK: a TracerProvider of its own (never the global one), the OTLP/HTTP
exporter behind a batch processor, and the W3C trace context read from the client and written for the
engine. Imported only when tracing is on, so a gateway without the `otel` extra never loads it."""

from __future__ import annotations

import random
import time
from collections.abc import Mapping

from opentelemetry.context import Context
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.trace.sampling import (
    ALWAYS_OFF,
    ALWAYS_ON,
    ParentBased,
    Sampler,
    TraceIdRatioBased,
)
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, Tracer, set_span_in_context
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from gateway.tracing.base import AttemptSpan, Attributes, RequestSpan
from gateway.tracing.settings import TracingSettings

_SCOPE = "llm-gateway"
_EMPTY = Context()
_SPAN_MASK = (1 << 64) - 1


def sampler_for(settings: TracingSettings) -> tuple[Sampler, float | None]:
    """The SDK's sampler for an OTEL_TRACES_SAMPLER name (settings.py checked it), and the share of
    new traces to record where the gateway decides that itself (parentbased_*: a request without a
    traceparent is a new trace, and the SDK sampler then sees only the ones to record)."""
    name = settings.sampler
    root: Sampler
    if name.endswith("always_off"):
        root, ratio = ALWAYS_OFF, 0.0
    elif name.endswith("traceidratio"):
        root, ratio = TraceIdRatioBased(settings.ratio), settings.ratio
    else:
        root, ratio = ALWAYS_ON, 1.0
    if not name.startswith("parentbased_"):
        return root, None
    return ParentBased(ALWAYS_ON), ratio


class OtelTracing:
    """The tracer the composition root builds when tracing is on."""

    enabled = True

    def __init__(self, settings: TracingSettings) -> None:
        self.settings = settings
        sampler, self._root_ratio = sampler_for(settings)
        self.provider = TracerProvider(sampler=sampler, resource=Resource.create({SERVICE_NAME: settings.service_name}))
        exporter = OTLPSpanExporter(endpoint=settings.endpoint, headers=dict(settings.headers) or None)
        self.provider.add_span_processor(BatchSpanProcessor(exporter))
        self._tracer = self.provider.get_tracer(_SCOPE)
        self._propagator = TraceContextTextMapPropagator()
        self._random = random.Random()
        # perf_counter seconds -> Unix nanoseconds; read once (the two clocks drift by far less than
        # a span's resolution over a process's life).
        self._offset_ns = time.time_ns() - time.perf_counter_ns()

    def request(self, name: str, headers: Mapping[str, str], start: float) -> RequestSpan:
        if "traceparent" in headers:
            parent = self._propagator.extract(headers)
        else:
            ratio = self._root_ratio
            if ratio is not None and (ratio <= 0.0 or (ratio < 1.0 and self._random.random() >= ratio)):
                # A new trace left out: no SDK span at all (~4 us a request less at 1 % sampling).
                return UnsampledRoot(self._random)
            parent = _EMPTY
        span = self._tracer.start_span(name, parent, SpanKind.SERVER, start_time=self.ns(start), record_exception=False)
        return OtelRequest(self, span)

    def ns(self, at: float) -> int:
        return int(at * 1e9) + self._offset_ns

    @property
    def tracer(self) -> Tracer:
        return self._tracer

    def shutdown(self) -> None:
        self.provider.shutdown()


def traceparent(span: Span) -> tuple[str, str]:
    """The W3C traceparent of `span` as the parent, and its tracestate ("" when empty)."""
    ctx = span.get_span_context()
    parent = f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"
    return parent, ctx.trace_state.to_header() if ctx.trace_state else ""


class OtelAttempt:
    __slots__ = ("_span", "_tracing")

    def __init__(self, tracing: OtelTracing, span: Span) -> None:
        self._tracing = tracing
        self._span = span

    def headers(self, base: dict[str, str]) -> dict[str, str]:
        parent, state = traceparent(self._span)
        out = {**base, "traceparent": parent}
        if state:
            out["tracestate"] = state
        else:
            out.pop("tracestate", None)
        return out

    def end(self, attributes: Attributes, error: str | None, at: float | None = None) -> None:
        span = self._span
        span.set_attributes(attributes)
        if error is not None:
            span.set_status(Status(StatusCode.ERROR, error))
        span.end(None if at is None else self._tracing.ns(at))


class UnsampledRoot:
    """A new trace the sampler left out, decided before any span exists: nothing is recorded, but
    the engine still gets a context with the sampled flag off, so that it records nothing either."""

    __slots__ = ("_random",)
    recording = False
    trace_id = ""

    def __init__(self, rng: random.Random) -> None:
        self._random = rng

    def propagate(self, base: dict[str, str]) -> dict[str, str]:
        ids = self._random.getrandbits(192) or 1  # a trace id and a span id, both non-zero (nearly always)
        return {**base, "traceparent": f"00-{ids >> 64:032x}-{(ids & _SPAN_MASK) or 1:016x}-00"}

    def set(self, attributes: Attributes) -> None:
        return None

    def child(self, name: str, start: float, end: float, attributes: Attributes) -> None:
        return None

    def attempt(self, name: str, start: float, attributes: Attributes) -> AttemptSpan:
        raise RuntimeError("an unsampled trace has no attempt spans")

    def event(self, name: str, at: float, attributes: Attributes) -> None:
        return None

    def content(self, name: str, data: bytes) -> None:
        return None

    def end(self, attributes: Attributes, error: str | None, at: float) -> None:
        return None


class OtelRequest:
    __slots__ = ("_context", "_span", "_tracing", "recording", "trace_id")

    def __init__(self, tracing: OtelTracing, span: Span) -> None:
        self._tracing = tracing
        self._span = span
        self.recording = span.is_recording()
        self.trace_id = f"{span.get_span_context().trace_id:032x}" if self.recording else ""
        self._context: Context | None = None

    def _parent(self) -> Context:
        if self._context is None:
            self._context = set_span_in_context(self._span, _EMPTY)
        return self._context

    def propagate(self, base: dict[str, str]) -> dict[str, str]:
        parent, state = traceparent(self._span)
        out = {**base, "traceparent": parent}
        if state:
            out["tracestate"] = state
        return out

    def set(self, attributes: Attributes) -> None:
        if self.recording:
            self._span.set_attributes(attributes)

    def child(self, name: str, start: float, end: float, attributes: Attributes) -> None:
        if not self.recording:
            return
        t = self._tracing
        span = t.tracer.start_span(name, self._parent(), SpanKind.INTERNAL, attributes, start_time=t.ns(start))
        span.end(t.ns(end))

    def attempt(self, name: str, start: float, attributes: Attributes) -> AttemptSpan:
        if not self.recording:
            raise RuntimeError("an unsampled trace has no attempt spans")
        t = self._tracing
        span = t.tracer.start_span(name, self._parent(), SpanKind.CLIENT, attributes, start_time=t.ns(start))
        return OtelAttempt(t, span)

    def event(self, name: str, at: float, attributes: Attributes) -> None:
        if self.recording:
            self._span.add_event(name, attributes, self._tracing.ns(at))

    def content(self, name: str, data: bytes) -> None:
        settings = self._tracing.settings
        if not (self.recording and settings.capture_content):
            return
        limit = settings.max_content_chars
        text = data[: limit * 4].decode("utf-8", "replace")  # a character is at most 4 bytes
        clipped = len(text) > limit or len(data) > limit * 4
        self._span.add_event(name, {"gen_ai.content": text[:limit], "gateway.content.truncated": clipped})

    def end(self, attributes: Attributes, error: str | None, at: float) -> None:
        span = self._span
        if self.recording:
            span.set_attributes(attributes)
            if error is not None:
                span.set_status(Status(StatusCode.ERROR, error))
        span.end(self._tracing.ns(at))
