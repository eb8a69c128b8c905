"""The OTLP/HTTP body of a batch of spans: an ExportTraceServiceRequest in protobuf's wire format,
written by hand for the few shapes the gateway records (one resource, one scope; attributes of str,
bool, int, float and lists of them; events; status; kind; parent). Far cheaper than a general
encoder, and checked against opentelemetry-proto's own decoder in tests/unit/test_tracing_otlp.py."""

from __future__ import annotations

import functools
import struct
from collections.abc import Iterable, Mapping

from gateway.tracing.base import AttributeValue
from gateway.tracing.record import SpanRecord

_MASK64 = (1 << 64) - 1
_ONE_BYTE = tuple(bytes((n,)) for n in range(128))
_PARENT_REMOTE = 0x300
"""Span.flags: HAS_IS_REMOTE and IS_REMOTE (the parent came from the client)."""
_PARENT_LOCAL = 0x100
_STATUS_ERROR = b"\x18\x02"
_DOUBLE = struct.Struct("<d").pack


def varint(n: int) -> bytes:
    if n < 0x80:
        return _ONE_BYTE[n]
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _field(tag: bytes, payload: bytes) -> bytes:
    """A length-delimited field: its tag, the length, the bytes."""
    return tag + varint(len(payload)) + payload


def _string(tag: bytes, text: str) -> bytes:
    return _field(tag, text.encode("utf-8", "surrogatepass"))


@functools.lru_cache(maxsize=512)
def _key(name: str) -> bytes:
    """KeyValue.key, encoded once per attribute name (the gateway has a few dozen)."""
    return _string(b"\x0a", name)


def any_value(value: AttributeValue) -> bytes | None:
    """An AnyValue's bytes; None for a value OTLP has no field for (None, a dict), which is left out."""
    if isinstance(value, str):
        return _string(b"\x0a", value)
    if isinstance(value, bool):  # before int: a bool is an int
        return b"\x10\x01" if value else b"\x10\x00"
    if isinstance(value, int):
        return b"\x18" + varint(value & _MASK64)  # int64: two's complement
    if isinstance(value, float):
        return b"\x21" + struct.pack("<d", value)
    if isinstance(value, (list, tuple)):
        items = b"".join(_field(b"\x0a", v) for v in map(any_value, value) if v is not None)
        return _field(b"\x2a", items)
    return None


def attributes(tag: bytes, attrs: Mapping[str, AttributeValue]) -> bytes:
    """Repeated KeyValue under `tag`, in the mapping's order. The common types are written inline
    (this is most of an export's work); anything else goes through any_value."""
    out = []
    one = _ONE_BYTE
    for name, value in attrs.items():
        kind = type(value)
        if kind is str:
            data = value.encode("utf-8", "surrogatepass")  # type: ignore[union-attr]
            n = len(data)
            v = b"\x0a" + (one[n] if n < 128 else varint(n)) + data
        elif kind is int:
            v = b"\x18" + varint(value & _MASK64)  # type: ignore[operator]
        elif kind is bool:
            v = b"\x10\x01" if value else b"\x10\x00"
        elif kind is float:
            v = b"\x21" + _DOUBLE(value)
        else:
            found = any_value(value)
            if found is None:
                continue
            v = found
        kv = _key(name) + b"\x12" + one[len(v)] + v if len(v) < 128 else _key(name) + _field(b"\x12", v)
        n = len(kv)
        out.append(tag + (one[n] if n < 128 else varint(n)) + kv)
    return b"".join(out)


def span(record: SpanRecord) -> bytes:
    parts = [
        b"\x0a\x10",
        record.trace_id.to_bytes(16, "big"),
        b"\x12\x08",
        record.span_id.to_bytes(8, "big"),
    ]
    if record.trace_state:
        parts.append(_string(b"\x1a", record.trace_state))
    if record.parent_id:
        parts += (b"\x22\x08", record.parent_id.to_bytes(8, "big"))
    parts += (
        _string(b"\x2a", record.name),
        b"\x30",
        _ONE_BYTE[record.kind],
        b"\x39",
        record.start_ns.to_bytes(8, "little"),
        b"\x41",
        record.end_ns.to_bytes(8, "little"),
        attributes(b"\x4a", record.attributes),
    )
    for name, at, attrs in record.events:
        event = b"\x09" + at.to_bytes(8, "little") + _string(b"\x12", name) + attributes(b"\x1a", attrs)
        parts.append(_field(b"\x5a", event))
    if record.error is not None:
        parts.append(_field(b"\x7a", _string(b"\x12", record.error) + _STATUS_ERROR))
    flags = 0x01 | (_PARENT_REMOTE if record.remote_parent else _PARENT_LOCAL)
    parts += (b"\x85\x01", flags.to_bytes(4, "little"))  # field 16, fixed32
    return b"".join(parts)


def resource(attrs: Mapping[str, AttributeValue]) -> bytes:
    """ResourceSpans.resource, encoded once per process."""
    return _field(b"\x0a", attributes(b"\x0a", attrs))


def scope(name: str, version: str) -> bytes:
    """ScopeSpans.scope, encoded once per process."""
    return _field(b"\x0a", _string(b"\x0a", name) + (_string(b"\x12", version) if version else b""))


def request(resource_field: bytes, scope_field: bytes, records: Iterable[SpanRecord]) -> bytes:
    """The ExportTraceServiceRequest of `records`: one resource, one scope, every span under them."""
    spans = b"".join(_field(b"\x12", span(r)) for r in records)
    return _field(b"\x0a", resource_field + _field(b"\x12", scope_field + spans))
