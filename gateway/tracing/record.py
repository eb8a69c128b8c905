"""One recorded span, as plain slotted data: what the exporter encodes (otlp.py). The tracer
(recorder.py) fills it on the request path; nothing here does any work."""

from __future__ import annotations

from gateway.tracing.base import AttributeValue

INTERNAL, SERVER, CLIENT = 1, 2, 3
"""OTLP's Span.SpanKind numbers."""

Event = tuple[str, int, dict[str, AttributeValue]]
"""An event's name, Unix nanoseconds and attributes."""


class SpanRecord:
    __slots__ = (
        "attributes",
        "end_ns",
        "error",
        "events",
        "kind",
        "name",
        "parent_id",
        "remote_parent",
        "span_id",
        "start_ns",
        "trace_id",
        "trace_state",
    )

    def __init__(
        self,
        name: str,
        kind: int,
        trace_id: int,
        span_id: int,
        parent_id: int,
        start_ns: int,
        attributes: dict[str, AttributeValue],
        trace_state: str = "",
        remote_parent: bool = False,
    ) -> None:
        self.name = name
        self.kind = kind
        self.trace_id = trace_id
        self.span_id = span_id
        self.parent_id = parent_id
        """0: a root span."""
        self.remote_parent = remote_parent
        """The parent is the client's (its traceparent), not one of the gateway's spans."""
        self.trace_state = trace_state
        self.start_ns = start_ns
        self.end_ns = 0
        """0 until the span ends."""
        self.attributes = attributes
        self.events: list[Event] = []
        self.error: str | None = None
        """The status description of a span that failed; None: its status is unset."""
