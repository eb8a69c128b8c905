"""Copy vLLM's ``reasoning`` to ``reasoning_content`` (the field most clients read) in a chat
response or stream chunk, for routes that enable it. Pure; the stream form works on event bytes."""

from __future__ import annotations

import json
from typing import Any

from gateway.protocols.frames import DataFrames, decode_event, is_done

_MARK = b'"reasoning":'


def copy_reasoning(body: dict[str, Any]) -> bool:
    """In place, for each choice's ``message`` or ``delta``: set ``reasoning_content`` from
    ``reasoning`` where only the latter is there. True when anything changed."""
    changed = False
    choices = body.get("choices")
    for choice in choices if isinstance(choices, list) else ():
        if not isinstance(choice, dict):
            continue
        for key in ("message", "delta"):
            part = choice.get(key)
            if isinstance(part, dict) and part.get("reasoning") is not None and part.get("reasoning_content") is None:
                part["reasoning_content"] = part["reasoning"]
                changed = True
    return changed


def copy_reasoning_bytes(body: bytes) -> bytes:
    """A whole (non-stream) JSON body; unchanged bytes when there is nothing to copy."""
    if _MARK not in body:
        return body
    try:
        value = json.loads(body)
    except ValueError:
        return body
    if not isinstance(value, dict) or not copy_reasoning(value):
        return body
    return json.dumps(value, separators=(",", ":")).encode()


class ReasoningStream:
    """Feed it a chat SSE stream's raw bytes; it returns whole events, re-encoding only those that
    carry ``reasoning`` (the rest pass as they came, byte for byte)."""

    __slots__ = ("_frames",)

    def __init__(self) -> None:
        self._frames = DataFrames()

    def feed(self, chunk: bytes) -> bytes:
        return b"".join(self._event(p) for p in self._frames.feed(chunk))

    def flush(self) -> bytes:
        return b"".join(self._event(p) for p in self._frames.flush())

    @staticmethod
    def _event(payload: bytes) -> bytes:
        if _MARK in payload and not is_done(payload):
            event = decode_event(payload)
            if event is not None and copy_reasoning(event):
                payload = json.dumps(event, separators=(",", ":")).encode()
        return b"data: " + payload + b"\n\n"
