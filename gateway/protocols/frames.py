"""Split an upstream SSE byte stream, chunked anyhow, into the payloads of its ``data:`` lines, and
encode outgoing events. Pure: the translators build on it."""

from __future__ import annotations

import json
from typing import Any

from gateway.protocols.events import DEFAULT_MAX_EVENT_BYTES, EventSplitter

_DONE = b"[DONE]"


class DataFrames:
    """Feed it raw chunks; it returns the ``data`` payload of each event completed so far (multi-line
    data joined with newlines, as the SSE spec says). Comments and other fields are dropped."""

    __slots__ = ("_split",)

    def __init__(self) -> None:
        # Fed whole events by the relay's observer, which bounds their size; it holds none itself then.
        self._split = EventSplitter(DEFAULT_MAX_EVENT_BYTES)

    def feed(self, chunk: bytes) -> list[bytes]:
        data = self._split.feed(chunk)
        if not data:
            return []
        return [p for p in (_payload(event) for event in data[:-2].split(b"\n\n")) if p is not None]

    def flush(self) -> list[bytes]:
        """The last event when the stream ended without its blank line."""
        rest = self._split.flush()
        payload = _payload(rest.strip(b"\n")) if rest.strip() else None
        return [payload] if payload is not None else []


def _payload(event: bytes) -> bytes | None:
    lines = [line for line in event.split(b"\n") if line.startswith(b"data:")]
    if not lines:
        return None
    return b"\n".join(line[6:] if line.startswith(b"data: ") else line[5:] for line in lines)


def is_done(payload: bytes) -> bool:
    return payload.strip() == _DONE


def decode_event(payload: bytes) -> dict[str, Any] | None:
    """The JSON object of one payload; None for [DONE], non-JSON or non-object payloads."""
    try:
        value = json.loads(payload)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def encode_event(name: str, data: dict[str, Any]) -> bytes:
    """One named SSE event: ``event: NAME`` then ``data: JSON`` and a blank line."""
    return b"event: " + name.encode() + b"\ndata: " + json.dumps(data, separators=(",", ":")).encode() + b"\n\n"
