"""What the request path asks of a tracer, as Protocols, and the tracer used when tracing is off.
Times are `time.perf_counter()` seconds, the clock the pipeline already reads; the implementation
turns them into wall-clock stamps. Nothing here imports OpenTelemetry."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

AttributeValue = str | bool | int | float | Sequence[str]
Attributes = Mapping[str, AttributeValue]


class AttemptSpan(Protocol):
    """One upstream attempt (a client span under the request's)."""

    def headers(self, base: dict[str, str]) -> dict[str, str]:
        """`base` with this attempt's `traceparent` (and `tracestate`), for the engine to continue."""
        ...

    def end(self, attributes: Attributes, error: str | None, at: float | None = None) -> None:
        """The attempt is over; `error` names what failed (None: the backend answered)."""
        ...


class RequestSpan(Protocol):
    """One client request (the server span) and what happened under it."""

    trace_id: str
    """The trace's id in hex, for a metric's exemplar; "" when the trace is not recorded."""
    recording: bool
    """False for a trace the sampler left out: the caller builds no attributes for it."""

    def propagate(self, base: dict[str, str]) -> dict[str, str]:
        """`base` (the request's own upstream headers, changed in place: each attempt sets it anew)
        with this request's context for the engine, where the trace is not recorded (its sampled
        flag off); a recorded trace's attempts give theirs (AttemptSpan.headers)."""
        ...

    def set(self, attributes: Attributes) -> None: ...

    def child(self, name: str, start: float, end: float, attributes: Attributes) -> None:
        """A finished internal span under the request's (the queue wait)."""
        ...

    def attempt(self, name: str, start: float, attributes: Attributes) -> AttemptSpan: ...

    def event(self, name: str, at: float, attributes: Attributes) -> None: ...

    def content(self, name: str, data: bytes) -> None:
        """A prompt or answer (UTF-8 bytes) as an event, only where the operator asked for content."""
        ...

    def end(self, attributes: Attributes, error: str | None, at: float) -> None:
        """The request is over: `error` is its status description (None: it completed)."""
        ...


class Tracing(Protocol):
    enabled: bool
    """False: the request path starts no span at all (the one check it makes)."""

    def request(self, method: str, path: str, headers: Mapping[str, str], start: float) -> RequestSpan:
        """The server span of a request (named `METHOD path`), continuing the client's `traceparent`
        when it sent one."""
        ...

    def shutdown(self) -> None:
        """Export what is still buffered, then stop."""
        ...


class NoTracing:
    """Tracing off: `enabled` is False, and nothing else is ever called on the request path."""

    enabled = False

    def request(self, method: str, path: str, headers: Mapping[str, str], start: float) -> RequestSpan:
        raise RuntimeError("tracing is off")

    def shutdown(self) -> None:
        return None
