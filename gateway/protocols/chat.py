"""OpenAI chat completions (/v1/chat/completions): messages in, a conversation to cap and route by.
CHAT_REASONING is the same for routes with `reasoning_content: copy`: it copies vLLM's `reasoning` to
`reasoning_content` in answers and stream chunks (protocols/reasoning.py)."""

from __future__ import annotations

from typing import Any

from gateway.protocols.base import Inbound, StreamTransform, Target
from gateway.protocols.openai import OpenAIProtocol
from gateway.protocols.reasoning import ReasoningStream, copy_reasoning_bytes


class _ReasoningTransform:
    """ReasoningStream as a StreamTransform (feed, finish)."""

    __slots__ = ("_stream",)

    def __init__(self) -> None:
        self._stream = ReasoningStream()

    def feed(self, chunk: bytes) -> bytes:
        return self._stream.feed(chunk)

    def finish(self) -> bytes:
        return self._stream.flush()


class ReasoningCopyChat(OpenAIProtocol):
    """Chat whose answers get `reasoning_content` copied from `reasoning` where only that is set."""

    def stream_transform(self, inbound: Inbound, target: Target) -> StreamTransform | None:
        return _ReasoningTransform()

    def response_body(self, inbound: Inbound, raw: bytes, parsed: Any, target: Target) -> bytes:
        return copy_reasoning_bytes(raw)


CHAT = OpenAIProtocol("chat", "/v1/chat/completions")
CHAT_REASONING = ReasoningCopyChat("chat", "/v1/chat/completions")
