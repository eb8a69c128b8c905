"""The hand-written OTLP encoder (gateway/tracing/otlp.py), decoded by opentelemetry-proto's own
ExportTraceServiceRequest: every attribute type, events, status, kinds, parents and flags."""

from __future__ import annotations

from typing import Any

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

from gateway.tracing import otlp
from gateway.tracing.record import CLIENT, INTERNAL, SERVER, SpanRecord

pytestmark = pytest.mark.unit

TRACE = 0x4BF92F3577B34DA6A3CE929D0E0E4736


def value(v: AnyValue) -> Any:
    which = v.WhichOneof("value")
    if which == "array_value":
        return [value(x) for x in v.array_value.values]
    assert which is not None
    return getattr(v, which)


def decoded(records: list[SpanRecord], resource: dict[str, Any] | None = None) -> ExportTraceServiceRequest:
    body = otlp.request(otlp.resource(resource or {"service.name": "gw"}), otlp.scope("llm-gateway", "1.2"), records)
    message = ExportTraceServiceRequest()
    message.ParseFromString(body)
    assert message.SerializeToString() == body  # the same bytes protobuf itself would write
    return message


def test_every_attribute_type_round_trips() -> None:
    attrs: dict[str, Any] = {
        "s": "héllo ✓",
        "long": "y" * 300,
        "empty": "",
        "yes": True,
        "no": False,
        "zero": 0,
        "small": 5,
        "big": (1 << 63) - 1,
        "negative": -42,
        "float": 0.125,
        "neg_float": -1e300,
        "list": ["a", "b"],
        "ints": [1, -2],
        "mixed": [True, 1.5, "x"],
        "none": None,  # no OTLP field: left out, as the SDK drops it
    }
    start = 1_700_000_000_000_000_000
    span = SpanRecord("POST /v1/chat/completions", SERVER, TRACE, 0x00F067AA0BA902B7, 0, start, attrs)
    span.end_ns = 1_700_000_000_500_000_000
    [got] = decoded([span]).resource_spans[0].scope_spans[0].spans
    assert {kv.key: value(kv.value) for kv in got.attributes} == {k: v for k, v in attrs.items() if v is not None}
    assert [kv.key for kv in got.attributes] == [k for k, v in attrs.items() if v is not None]
    assert got.trace_id.hex() == f"{TRACE:032x}" and got.span_id.hex() == "00f067aa0ba902b7"
    assert got.parent_span_id == b"" and got.trace_state == ""
    assert got.kind == SERVER and got.name == "POST /v1/chat/completions"
    assert (got.start_time_unix_nano, got.end_time_unix_nano) == (span.start_ns, span.end_ns)
    assert got.status.code == 0 and got.status.message == ""
    assert got.flags == 0x101  # sampled, parent known not to be remote


def test_events_status_parents_and_the_envelope() -> None:
    server = SpanRecord("POST /v1/messages", SERVER, TRACE, 2, 0xAB, 100, {"a": 1}, "vendor=abc", True)
    server.events.append(("gen_ai.first_token", 150, {"gen_ai.server.time_to_first_token": 0.05}))
    server.events.append(("gateway.client_left", 190, {"gateway.disconnect_stage": "mid_stream"}))
    server.error = "the client closed the connection (mid_stream)"
    server.end_ns = 200
    attempt = SpanRecord("chat tiny", CLIENT, TRACE, 3, 2, 120, {"gateway.attempt": 1})
    attempt.end_ns = 180
    attempt.error = "client_left"
    queue = SpanRecord("gateway.queue", INTERNAL, TRACE, 4, 2, 101, {})
    queue.end_ns = 110
    message = decoded([server, attempt, queue], {"service.name": "gw", "deployment.environment": "test"})
    [rs] = message.resource_spans
    assert {kv.key: value(kv.value) for kv in rs.resource.attributes} == {
        "service.name": "gw",
        "deployment.environment": "test",
    }
    [ss] = rs.scope_spans
    assert (ss.scope.name, ss.scope.version) == ("llm-gateway", "1.2")
    got_server, got_attempt, got_queue = ss.spans
    assert got_server.parent_span_id.hex() == "00000000000000ab" and got_server.trace_state == "vendor=abc"
    assert got_server.flags == 0x301  # the parent is the client's
    events = [(e.name, e.time_unix_nano, {kv.key: value(kv.value) for kv in e.attributes}) for e in got_server.events]
    assert events == server.events
    assert got_server.status.code == 2 and got_server.status.message == server.error
    assert got_attempt.kind == CLIENT and got_attempt.parent_span_id == (2).to_bytes(8, "big")
    assert got_attempt.status.code == 2 and got_attempt.status.message == "client_left"
    assert got_queue.kind == INTERNAL and got_queue.end_time_unix_nano == 110 and got_queue.status.code == 0


def test_long_values_need_multibyte_lengths() -> None:
    text = "x" * 70_000  # a length of three varint bytes
    span = SpanRecord("n" * 200, SERVER, TRACE, 1, 0, 1, {"gen_ai.content": text})
    span.end_ns = 2
    [got] = decoded([span]).resource_spans[0].scope_spans[0].spans
    assert got.name == "n" * 200 and got.attributes[0].value.string_value == text


def test_an_empty_batch_is_a_valid_request() -> None:
    message = decoded([])
    assert len(message.resource_spans) == 1 and not message.resource_spans[0].scope_spans[0].spans


def test_varint() -> None:
    assert otlp.varint(0) == b"\x00" and otlp.varint(127) == b"\x7f"
    assert otlp.varint(128) == b"\x80\x01" and otlp.varint(300) == b"\xac\x02"
    assert otlp.varint((1 << 64) - 1) == b"\xff" * 9 + b"\x01"
