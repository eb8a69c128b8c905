"""An incremental observer of an upstream SSE stream: first-token time, gaps between content
chunks, [DONE], the final usage and a leading error event. It never re-encodes an event.

Cost matters: this runs for every chunk of every stream, so it does byte searches, not JSON
parsing, except for the one usage event and an error event."""

from __future__ import annotations

import json
from typing import Any

_DATA = b"data:"
_DONE = b"[DONE]"
_NO_CHOICES = b'"choices":[]'
_CONTENT_MARKERS = (b'"content":"', b'"text":"', b'"reasoning_content":"', b'"tool_calls":[{')


def _has_content(event: bytes) -> bool:
    for marker in _CONTENT_MARKERS:
        i = event.find(marker)
        while i >= 0:
            nxt = event[i + len(marker) : i + len(marker) + 1]
            if marker.endswith(b"{") or (nxt and nxt != b'"'):
                return True
            i = event.find(marker, i + 1)
    return False


class StreamObserver:
    """Feed it upstream chunks; it returns the bytes to relay.

    In pass-through mode (the client asked for usage itself, or none was injected) the bytes
    are the chunk, unchanged. When the gateway injected `stream_options.include_usage` on the
    client's behalf, it relays whole events only and drops the usage-only event it added.
    `whole_events` asks for whole events without dropping any (a protocol that translates the
    stream, event by event, needs them)."""

    __slots__ = (
        "_carry",
        "_strip_usage",
        "_whole",
        "content_events",
        "done",
        "error",
        "events",
        "first_token_at",
        "gaps",
        "last_token_at",
        "usage",
    )

    def __init__(self, strip_usage: bool, whole_events: bool = False) -> None:
        self._carry = b""
        self._strip_usage = strip_usage
        self._whole = strip_usage or whole_events
        self.events = 0
        self.content_events = 0
        self.done = False
        self.usage: dict[str, Any] | None = None
        self.error: dict[str, Any] | None = None
        self.first_token_at: float | None = None
        self.last_token_at: float | None = None
        self.gaps: list[float] = []

    def feed(self, chunk: bytes, now: float) -> bytes:
        data = self._carry + chunk if self._carry else chunk
        if b"\r" in data:
            data = data.replace(b"\r\n", b"\n")
        end = data.rfind(b"\n\n")
        if end < 0:
            self._carry = data
            return b"" if self._whole else chunk
        self._carry = data[end + 2 :]
        complete = data[: end + 2]
        dropped = False
        out: list[bytes] = []
        for event in complete.split(b"\n\n"):
            if not event:
                continue
            if self._observe(event, now) and self._strip_usage:
                dropped = True
                continue
            if self._whole:
                out.append(event)
        if not self._whole:
            return chunk
        if not out:
            return b""
        if not dropped and len(out) == 1:
            return out[0] + b"\n\n"
        return b"\n\n".join(out) + b"\n\n"

    def _observe(self, event: bytes, now: float) -> bool:
        """Account for one event; True when it is a usage-only event."""
        if _DATA not in event:
            return False  # comments (": ping") and other fields
        self.events += 1
        if _DONE in event and event.lstrip().startswith(b"data: [DONE]"):
            self.done = True
            return False
        if self.events == 1 and b'"error"' in event and b'"choices"' not in event:
            self.error = _decode(event)
            return False
        usage_only = _NO_CHOICES in event
        if usage_only or b'"usage":{' in event:
            decoded = _decode(event)
            usage = decoded.get("usage") if decoded else None
            if isinstance(usage, dict):
                self.usage = usage
        if not usage_only and _has_content(event):
            if self.first_token_at is None:
                self.first_token_at = now
            else:
                assert self.last_token_at is not None
                self.gaps.append(now - self.last_token_at)
            self.last_token_at = now
            self.content_events += 1
        return usage_only

    def flush(self) -> bytes:
        """Bytes still held back when the upstream ended (only in strip mode)."""
        rest, self._carry = self._carry, b""
        return rest if self._whole else b""


def _decode(event: bytes) -> dict[str, Any] | None:
    start = event.find(_DATA)
    payload = event[start + len(_DATA) :].strip()
    try:
        value = json.loads(payload)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None
