"""An incremental observer of an upstream SSE stream: first-token time, gaps between reads that
carry content, [DONE], the final usage and a leading error event. It never re-encodes an event.

Cost matters: this runs for every read of every stream, so it works on the whole read with a few
byte searches and counts; it never splits a read into events, and it JSON-decodes only the usage
event (the last one that has usage in a read) and a leading error event. An unfinished event is
held by an EventSplitter (events.py), which searches each byte once and bounds the event's size."""

from __future__ import annotations

import json
from typing import Any, Final

from gateway.protocols.events import DEFAULT_MAX_EVENT_BYTES, LONG, EventSplitter, has, last_object

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


class StreamObserver:
    """Feed it upstream reads; it returns the bytes to relay.

    In pass-through mode (the client asked for usage itself, or none was injected) the bytes
    are the read, unchanged. When the gateway injected `stream_options.include_usage` on the
    client's behalf, it relays whole events only and drops the usage-only event it added (one per
    stream, just before [DONE]). `whole_events` asks for whole events without dropping any (a
    protocol that translates the stream, event by event, needs them)."""

    __slots__ = (
        "_split",
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
        # Only a translator needs a long event whole; relayed, its bytes go out as they come.
        self._split = EventSplitter(DEFAULT_MAX_EVENT_BYTES, keep=whole_events and not strip_usage)
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

    def limit_events(self, max_bytes: int) -> None:
        """Refuse (EventTooLarge, from feed) an event longer than this (limits.max_event_bytes)."""
        self._split.limit = max_bytes

    def feed(self, chunk: bytes, now: float) -> bytes:
        split = self._split
        complete = split.feed(chunk)
        if split.ended is not None:
            self._observe_long(split.ended, now)
        if not complete:
            return split.passed if self._whole else chunk
        at = split.long  # a long event held whole (for a translator): its head and tail are read
        if at:
            self._observe_long(complete[:LONG] + complete[max(LONG, at - LONG) : at], now)
        drop = self._observe(complete[at:], now) if at < len(complete) else None
        if drop is not None and at:
            drop = (drop[0] + at, drop[1] + at)
        if not self._whole:
            return chunk
        if drop is not None and self._strip_usage:
            complete = complete[: drop[0]] + complete[drop[1] :]
        return split.passed + complete if split.passed else complete

    def _observe_long(self, sample: bytes, now: float) -> None:
        """A long event (its head and tail): a content event, or at most the usage at its end; never
        an error, [DONE] or the usage-only event, which are short."""
        if not self.seen and (sample.startswith(_DATA) or has(sample, _LINE_DATA)):
            self.seen = True
        if content_count(sample, self._text, self._tools):
            self._content(1, now)
        if has(sample, _USAGE):
            usage = last_object(sample, b"usage")
            if usage is not None:
                self.usage = usage

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
            self._content(found, now)
        return drop

    def _content(self, found: int, now: float) -> None:
        if found:
            if self.first_token_at is None:
                self.first_token_at = now
            else:
                assert self.last_token_at is not None
                self.gaps.append(now - self.last_token_at)
            self.last_token_at = now
            self.content_events += found
            self.together += found - 1

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
        rest = self._split.flush()
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
