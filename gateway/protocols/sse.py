"""An incremental observer of an upstream SSE stream: first-token time, gaps between reads that
carry content, [DONE], the final usage and a leading error event. It never re-encodes an event.

Cost matters: this runs for every read of every stream, so it works on the whole read with a few
byte searches and counts; it never splits a read into events, and it JSON-decodes only the usage
event (the last one that has usage in a read) and a leading error event."""

from __future__ import annotations

import json
from typing import Any, Final

# Final: a compiled module (mypyc) folds these into the code rather than looking each up by name.
_DATA: Final = b"data:"
_LINE_DATA: Final = b"\ndata:"
_DONE: Final = b"data: [DONE]"
_EVENT_DONE: Final = b"\n\ndata: [DONE]"
_NO_CHOICES: Final = b'"choices":[]'
_USAGE: Final = b'"usage":{'
# A content event has one of these with a non-empty value; JSON escapes quotes inside strings, so a
# marker can't occur inside a value. `content":"` is both `"content":"` and `"reasoning_content":"`.
_CHAT: Final = b'content":"'
_CHAT_EMPTY: Final = b'content":""'
_TEXT: Final = b'"text":"'
_TEXT_EMPTY: Final = b'"text":""'
_TOOL_CALLS: Final = b'"tool_calls":[{'
_TAIL: Final = 2
"""Events at the end of a read searched for [DONE] and the usage: they are a stream's last two."""


def content_count(data: bytes, text: bool = False, tools: bool = True) -> int:
    """How many content events `data` (whole events) holds: non-empty content or reasoning and
    (when the request offered `tools`) tool-call deltas in a chat stream, non-empty text in a
    completions stream (`text`). An event with two of them (rare) counts twice. One count and a
    test or two (`has`)."""
    if text:
        n = data.count(_TEXT)
        return n - data.count(_TEXT_EMPTY) if n and has(data, _TEXT_EMPTY) else n
    n = data.count(_CHAT)
    if n and has(data, _CHAT_EMPTY):
        n -= data.count(_CHAT_EMPTY)
    if tools and has(data, _TOOL_CALLS):
        n += data.count(_TOOL_CALLS)
    return n


def has(data: bytes, marker: bytes) -> bool:
    """`marker in data`, at a third of its cost where the marker is absent (CPython 3.11's bytes
    `in` first tries the marker as an int, and makes and drops a TypeError each time; `find` and
    `count` parse their arguments from a tuple; `partition` takes one argument as it is)."""
    return bool(data.partition(marker)[1])


class StreamObserver:
    """Feed it upstream reads; it returns the bytes to relay.

    In pass-through mode (the client asked for usage itself, or none was injected) the bytes
    are the read, unchanged. When the gateway injected `stream_options.include_usage` on the
    client's behalf, it relays whole events only and drops the usage-only event it added (one per
    stream, just before [DONE]). `whole_events` asks for whole events without dropping any (a
    protocol that translates the stream, event by event, needs them)."""

    __slots__ = (
        "_carry",
        "_crlf",
        "_strip_usage",
        "_text",
        "_tools",
        "_whole",
        "content_events",
        "done",
        "error",
        "first_token_at",
        "gaps",
        "last_token_at",
        "seen",
        "together",
        "usage",
    )

    def __init__(self, strip_usage: bool, whole_events: bool = False, text: bool = False, tools: bool = True) -> None:
        self._carry = b""
        self._crlf: bool | None = None
        self._strip_usage = strip_usage
        self._whole = strip_usage or whole_events
        self._text = text
        self._tools = tools
        self.seen = False
        """A data event has come (comments such as `: ping` are not events)."""
        self.content_events = 0
        self.done = False
        self.usage: dict[str, Any] | None = None
        self.error: dict[str, Any] | None = None
        self.first_token_at: float | None = None
        self.last_token_at: float | None = None
        self.gaps: list[float] = []
        """Time between consecutive reads that carried content."""
        self.together = 0
        """Content events that arrived in the same read as the one before them: 0 s apart, as a
        client that reads per event sees them (and vLLM's per-token histogram counts them). Kept as
        a count, not as zeros in `gaps`: a fast stream can bring dozens of events in one read."""

    def feed(self, chunk: bytes, now: float) -> bytes:
        data = self._carry + chunk if self._carry else chunk
        if self._crlf is None:  # an engine ends lines one way: the first line end tells which
            first = data.find(b"\n")  # memchr; a two-byte search would scan a long first read
            if first >= 0:
                self._crlf = first > 0 and data[first - 1] == 0x0D
        if self._crlf:
            data = data.replace(b"\r\n", b"\n")
        if data.endswith(b"\n\n"):  # the usual read: whole events (a native test, compiled)
            self._carry = b""
            complete = data
        else:
            end = data.rfind(b"\n\n")
            if end < 0:
                self._carry = data
                return b"" if self._whole else chunk
            self._carry = data[end + 2 :]
            complete = data[: end + 2]
        drop = self._observe(complete, now)
        if not self._whole:
            return chunk
        if drop is None or not self._strip_usage:
            return complete
        return complete[: drop[0]] + complete[drop[1] :]

    def _observe(self, data: bytes, now: float) -> tuple[int, int] | None:
        """Account for whole events; the span of a usage-only event in them, if there is one.
        [DONE] and the usage are looked for in the read's last two events, where a stream has them
        (usage on every event, as some engines send it, is read from the last)."""
        if not self.seen:
            if not (data.startswith(_DATA) or _LINE_DATA in data):
                return None  # comments (": ping") and other fields only
            self.seen = True
            first = _first_data_event(data)  # an error comes as the stream's first event
            if b'"error"' in first and b'"choices"' not in first:
                self.error = _decode(first)
        drop = None
        # [DONE] and the usage are searched for in earnest only in a read that has them at all: a
        # content event's read is three forward searches here, not five backward ones.
        if has(data, _DONE) or has(data, _NO_CHOICES) or has(data, _USAGE):
            drop = self._end_events(data)
        found = content_count(data, self._text, self._tools)
        if found:
            if self.first_token_at is None:
                self.first_token_at = now
            else:
                assert self.last_token_at is not None
                self.gaps.append(now - self.last_token_at)
            self.last_token_at = now
            self.content_events += found
            self.together += found - 1
        return drop

    def _end_events(self, data: bytes) -> tuple[int, int] | None:
        """[DONE] and the usage in the read's last two events; the usage-only event's span."""
        drop = None
        tail = len(data) - 2
        for _ in range(_TAIL):
            tail = data.rfind(b"\n\n", 0, tail) if tail > 0 else -1
            if tail < 0:
                break
        start_tail = tail + 2 if tail >= 0 else 0
        if not self.done and (
            data.startswith(_DONE, start_tail) or data.find(_EVENT_DONE, max(start_tail - 2, 0)) >= 0
        ):
            self.done = True
        at = data.rfind(_NO_CHOICES, start_tail)  # the usage-only event, last but [DONE]
        if at < 0:
            at = data.rfind(_USAGE, start_tail)  # usage on a content event (some engines)
        if at < 0 and self.done and self.usage is None and start_tail > 0:
            # The end, and no usage in the last two events: a comment may stand before [DONE].
            at = data.rfind(_NO_CHOICES)
            if at < 0:
                at = data.rfind(_USAGE)
        if at >= 0:
            sep = data.rfind(b"\n\n", 0, at)
            start = sep + 2 if sep >= 0 else 0
            stop = data.find(b"\n\n", at) + 2
            event = data[start:stop]
            decoded = _decode(event)
            usage = decoded.get("usage") if decoded else None
            if isinstance(usage, dict):
                self.usage = usage
            if _NO_CHOICES in event:
                drop = (start, stop)
        return drop

    def flush(self) -> bytes:
        """Bytes still held back when the upstream ended (only in strip mode)."""
        rest, self._carry = self._carry, b""
        return rest if self._whole else b""


def _first_data_event(data: bytes) -> bytes:
    start = 0 if data.startswith(_DATA) else data.find(_LINE_DATA) + 1
    stop = data.find(b"\n\n", start)
    return data[start : stop if stop >= 0 else len(data)]


def _decode(event: bytes) -> dict[str, Any] | None:
    start = event.find(_DATA)
    payload = event[start + len(_DATA) :].strip()
    try:
        value = json.loads(payload)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None
