"""The tracer when tracing is on: the sampler decides first (sampler.py), so a request left out costs
one 64-bit draw and, at its upstream attempt, a `traceparent` cut from a pool (unsampled.py); a recorded one fills
plain span records (record.py) that the exporter's thread encodes and sends (exporter.py). No
OpenTelemetry package is used: the spans, the propagation and the export are the OTLP/W3C formats'
own, and the OTEL_* variables are read as the SDK reads them (settings.py)."""

from __future__ import annotations

import random
import time
from collections.abc import Mapping

from gateway.tracing import otlp
from gateway.tracing.base import AttemptSpan, Attributes, AttributeValue, RequestSpan
from gateway.tracing.exporter import BatchExporter
from gateway.tracing.record import CLIENT, INTERNAL, SERVER, SpanRecord
from gateway.tracing.sampler import Sampler, parse_traceparent
from gateway.tracing.settings import TracingSettings
from gateway.tracing.unsampled import Unsampled, UnsampledRoot

SCOPE = "llm-gateway"


class RecordingTracing:
    """The tracer the composition root builds when tracing is on."""

    enabled = True

    def __init__(self, settings: TracingSettings) -> None:
        self.settings = settings
        self.sampler = Sampler(settings.sampler, settings.ratio)
        self._bound = self.sampler.bound
        resource = {**settings.resource, "telemetry.sdk.language": "python", "telemetry.sdk.name": SCOPE}
        self.exporter = BatchExporter(settings.export, otlp.resource(resource), otlp.scope(SCOPE, ""))
        self.bits = random.getrandbits  # the module's generator: reseeded in a forked child
        self.uniform, self.below = random.random, random.randrange
        self._unsampled = UnsampledRoot(self._bound)
        self._skip = self.sampler.gap(self.uniform())
        # perf_counter seconds -> Unix nanoseconds; read once (the two clocks drift by far less than
        # a span's resolution over a process's life).
        self.offset_ns = time.time_ns() - time.perf_counter_ns()

    def request(self, method: str, path: str, headers: Mapping[str, str], start: float) -> RequestSpan:
        sent = headers.get("traceparent")
        parent = parse_traceparent(sent) if sent is not None else None
        if parent is None:
            # A new trace: the sampler's root decision as a countdown (Sampler.gap), inlined, as this
            # runs for every request; a trace left out gets the one shared UnsampledRoot (an id is
            # cut only if an attempt is made). A recorded one's id has its lower 64 bits below the
            # bound, drawn uniformly there: TraceIdRatioBased's decision on the same id.
            skip = self._skip
            if skip:
                self._skip = skip - 1
                return self._unsampled
            self._skip = self.sampler.gap(self.uniform())
            trace_id = self.bits(64) << 64 | self.below(self._bound) or 1
            record = SpanRecord(f"{method} {path}", SERVER, trace_id, self.bits(64) or 1, 0, self.ns(start), {})
            return RecordingRequest(self, record)
        trace_id, parent_id, sampled = parent
        state = headers.get("tracestate", "")
        if not self.sampler.with_parent(trace_id, sampled):
            return UnsampledChild(self, trace_id, state)
        span_id = self.bits(64) or 1
        record = SpanRecord(f"{method} {path}", SERVER, trace_id, span_id, parent_id, self.ns(start), {}, state, True)
        return RecordingRequest(self, record)

    def ns(self, at: float) -> int:
        return int(at * 1e9) + self.offset_ns

    def shutdown(self) -> None:
        self.exporter.shutdown()


def _with_context(base: dict[str, str], trace_id: int, span_id: int, state: str) -> dict[str, str]:
    """`base` with a sampled traceparent naming `span_id` (a copy: an attempt's own headers)."""
    out = {**base, "traceparent": f"00-{trace_id:032x}-{span_id:016x}-01"}
    if state:
        out["tracestate"] = state
    else:
        out.pop("tracestate", None)
    return out


class UnsampledChild(Unsampled):
    """A client's trace left out (its flag off, or the ratio): the engine gets the client's trace id."""

    __slots__ = ("_state", "_trace_id", "_tracing")

    def __init__(self, tracing: RecordingTracing, trace_id: int, state: str) -> None:
        super().__init__()
        self._tracing = tracing
        self._trace_id = trace_id
        self._state = state

    def propagate(self, base: dict[str, str]) -> dict[str, str]:
        base["traceparent"] = f"00-{self._trace_id:032x}-{self._tracing.bits(64) or 1:016x}-00"
        if self._state:
            base["tracestate"] = self._state
        return base


class RecordingAttempt:
    __slots__ = ("_record", "_tracing")

    def __init__(self, tracing: RecordingTracing, record: SpanRecord) -> None:
        self._tracing = tracing
        self._record = record

    def headers(self, base: dict[str, str]) -> dict[str, str]:
        r = self._record
        return _with_context(base, r.trace_id, r.span_id, r.trace_state)

    def end(self, attributes: Attributes, error: str | None, at: float | None = None) -> None:
        r = self._record
        if r.end_ns:
            return
        r.attributes.update(attributes)
        r.error = error
        r.end_ns = time.time_ns() if at is None else self._tracing.ns(at)
        self._tracing.exporter.add(r)


class RecordingRequest:
    __slots__ = ("_record", "_tracing", "recording", "trace_id")

    def __init__(self, tracing: RecordingTracing, record: SpanRecord) -> None:
        self._tracing = tracing
        self._record = record
        self.recording = True
        self.trace_id = f"{record.trace_id:032x}"

    def propagate(self, base: dict[str, str]) -> dict[str, str]:
        r = self._record
        return _with_context(base, r.trace_id, r.span_id, r.trace_state)

    def set(self, attributes: Attributes) -> None:
        self._record.attributes.update(attributes)

    def _child(self, name: str, kind: int, start: float, attributes: Attributes) -> SpanRecord:
        r, t = self._record, self._tracing
        span_id = t.bits(64) or 1
        return SpanRecord(name, kind, r.trace_id, span_id, r.span_id, t.ns(start), dict(attributes), r.trace_state)

    def child(self, name: str, start: float, end: float, attributes: Attributes) -> None:
        span = self._child(name, INTERNAL, start, attributes)
        span.end_ns = self._tracing.ns(end)
        self._tracing.exporter.add(span)

    def attempt(self, name: str, start: float, attributes: Attributes) -> AttemptSpan:
        return RecordingAttempt(self._tracing, self._child(name, CLIENT, start, attributes))

    def event(self, name: str, at: float, attributes: Attributes) -> None:
        self._record.events.append((name, self._tracing.ns(at), dict(attributes)))

    def content(self, name: str, data: bytes) -> None:
        settings = self._tracing.settings
        if not settings.capture_content:
            return
        limit = settings.max_content_chars
        text = data[: limit * 4].decode("utf-8", "replace")  # a character is at most 4 bytes
        clipped = len(text) > limit or len(data) > limit * 4
        attributes: dict[str, AttributeValue] = {"gen_ai.content": text[:limit], "gateway.content.truncated": clipped}
        self._record.events.append((name, time.time_ns(), attributes))

    def end(self, attributes: Attributes, error: str | None, at: float) -> None:
        r = self._record
        if r.end_ns:
            return
        r.attributes.update(attributes)
        r.error = error
        r.end_ns = self._tracing.ns(at)
        self._tracing.exporter.add(r)
