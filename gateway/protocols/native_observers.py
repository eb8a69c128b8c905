"""Observers of a native Anthropic Messages or OpenAI Responses SSE stream, relayed unchanged: first
token time and gaps from the protocol's own content events, the final usage (as chat's
prompt/completion token names), the end event and a leading error. The interface of
gateway/protocols/sse.py's StreamObserver. Cheap: the event name comes from its ``event:`` line (vLLM,
llama.cpp and SGLang all send one); JSON is parsed only for the usage and error events. Events are cut
from the reads by an EventSplitter (events.py): each byte searched once, each event's size bounded."""

from __future__ import annotations

import json
from typing import Any

from gateway.protocols.events import DEFAULT_MAX_EVENT_BYTES, EventSplitter, last_object

_EVENT = b"event:"
_DATA = b"data:"

# event name -> role, per protocol
MESSAGES_EVENTS: dict[bytes, str] = {
    b"content_block_delta": "content",
    b"message_start": "usage",
    b"message_delta": "usage",
    b"message_stop": "done",
    b"error": "error",
}
RESPONSES_EVENTS: dict[bytes, str] = {
    b"response.output_text.delta": "content",
    b"response.reasoning_text.delta": "content",
    b"response.refusal.delta": "content",
    b"response.function_call_arguments.delta": "content",
    b"response.completed": "final",
    b"response.incomplete": "final",
    b"response.failed": "final",
    b"error": "error",
}


_ANTHROPIC_STATUS = {
    "invalid_request_error": 400,
    "authentication_error": 401,
    "permission_error": 403,
    "not_found_error": 404,
    "request_too_large": 413,
    "rate_limit_error": 429,
    "api_error": 500,
    "overloaded_error": 529,
}


class NativeObserver:
    """Feed it chunks; it returns them unchanged. ``usage`` is OpenAI-named (prompt_tokens counts
    Anthropic's cached input too), so accounting treats every protocol alike."""

    __slots__ = (
        "_hold",
        "_roles",
        "_split",
        "content_events",
        "done",
        "error",
        "events",
        "first_token_at",
        "gaps",
        "last_token_at",
        "together",
        "usage",
    )

    def __init__(self, roles: dict[bytes, str], hold: bool = False) -> None:
        self._roles = roles
        self._hold = hold
        self._split = EventSplitter(DEFAULT_MAX_EVENT_BYTES, keep=False)
        self.events = 0
        self.content_events = 0
        self.done = False
        self.usage: dict[str, Any] | None = None
        self.error: dict[str, Any] | None = None
        self.first_token_at: float | None = None
        self.last_token_at: float | None = None
        self.gaps: list[float] = []
        self.together = 0  # always: it sees one event at a time, so same-read events are 0.0 gaps

    @property
    def holding(self) -> bool:
        """Only the stream's preamble so far (message_start, content_block_start), on a Messages
        stream: the relay keeps the client's headers back until a token, an error or the end, so that
        an engine that opens its stream before refusing (SGLang's over-long Messages) still gives the
        client a proper HTTP error. Responses streams are relayed as they come (docs/protocols.md)."""
        return self._hold and self.events > 0 and not self.content_events and self.error is None and not self.done

    @classmethod
    def messages(cls) -> NativeObserver:
        return cls(MESSAGES_EVENTS, hold=True)

    @classmethod
    def responses(cls) -> NativeObserver:
        return cls(RESPONSES_EVENTS)

    def limit_events(self, max_bytes: int) -> None:
        """Refuse (EventTooLarge, from feed) an event longer than this (limits.max_event_bytes)."""
        self._split.limit = max_bytes

    def feed(self, chunk: bytes, now: float) -> bytes:
        complete = self._split.feed(chunk)
        if self._split.ended is not None:
            self._observe(self._split.ended, now, long=True)
        if complete:
            for event in complete[:-2].split(b"\n\n"):
                if event:
                    self._observe(event, now)
        return chunk

    def flush(self) -> bytes:
        """Nothing is held back (the bytes pass as they come); the interface of StreamObserver."""
        self._split.flush()
        return b""

    def _observe(self, event: bytes, now: float, long: bool = False) -> None:
        """One event; a `long` one is only its head and tail (not JSON): its usage is read from its
        end, and it is never an error the client could be shown."""
        if _DATA not in event:
            return
        self.events += 1
        role = self._roles.get(_name(event))
        if role == "content":
            if self.first_token_at is None:
                self.first_token_at = now
            else:
                assert self.last_token_at is not None
                self.gaps.append(now - self.last_token_at)
            self.last_token_at = now
            self.content_events += 1
        elif role == "done":
            self.done = True
        elif role == "usage":
            self._anthropic_usage(_long_usage(event) if long else _decode(event))
        elif role == "final":
            self.done = True
            self._responses_final({"response": _long_usage(event)} if long else _decode(event))
        elif role == "error" and self.error is None and long:
            self.error = {"error": {"message": "unreadable error event"}}
        elif role == "error" and self.error is None:
            self.error = _decode(event) or {"error": {"message": "unreadable error event"}}
            inner = self.error.get("error")
            if isinstance(inner, dict) and "code" not in inner and inner.get("type") in _ANTHROPIC_STATUS:
                # Anthropic's error events carry a type, not a status: the relay reads the status here.
                self.error = {**self.error, "error": {**inner, "code": _ANTHROPIC_STATUS[inner["type"]]}}

    def _anthropic_usage(self, decoded: dict[str, Any] | None) -> None:
        if decoded is None:
            return
        message = decoded.get("message")
        usage = (message.get("usage") if isinstance(message, dict) else None) or decoded.get("usage")
        if not isinstance(usage, dict):
            return
        merged = dict(self.usage or {})
        fields = ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")
        if any(isinstance(usage.get(k), int) for k in fields):
            merged["prompt_tokens"] = sum(_int(usage.get(k)) for k in fields)
        if isinstance(usage.get("output_tokens"), int):
            merged["completion_tokens"] = _int(usage["output_tokens"])
        merged["total_tokens"] = merged.get("prompt_tokens", 0) + merged.get("completion_tokens", 0)
        self.usage = merged

    def _responses_final(self, decoded: dict[str, Any] | None) -> None:
        response = decoded.get("response") if decoded else None
        usage = response.get("usage") if isinstance(response, dict) else None
        if isinstance(usage, dict):
            prompt, completion = _int(usage.get("input_tokens")), _int(usage.get("output_tokens"))
            self.usage = {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
        if isinstance(response, dict) and response.get("status") == "failed" and self.error is None:
            self.error = {"error": response.get("error") or {"message": "response failed"}}


def _name(event: bytes) -> bytes:
    start = event.find(_EVENT)
    if start < 0:
        return b""
    end = event.find(b"\n", start)
    return event[start + len(_EVENT) : end if end >= 0 else len(event)].strip()


def _decode(event: bytes) -> dict[str, Any] | None:
    start = event.find(_DATA)
    payload = event[start + len(_DATA) :].strip()
    try:
        value = json.loads(payload)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _long_usage(sample: bytes) -> dict[str, Any]:
    usage = last_object(sample, b"usage")
    return {"usage": usage} if usage is not None else {}


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0
