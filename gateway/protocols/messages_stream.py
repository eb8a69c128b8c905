"""A chat completions SSE stream, translated event by event into Anthropic's Messages stream:
message_start, content_block_start / content_block_delta (text_delta, thinking_delta,
input_json_delta) / content_block_stop, message_delta (stop_reason, usage), message_stop. Pure."""

from __future__ import annotations

from typing import Any

from gateway.protocols.anthropic_errors import error_body
from gateway.protocols.chat_stream import ChatStreamTranslation, error_message
from gateway.protocols.frames import encode_event
from gateway.protocols.messages_reply import matched_stop, message_id, stop_reason, usage_to_anthropic


class MessagesStream(ChatStreamTranslation):
    """Feed it the upstream's raw bytes as they come; it returns Anthropic SSE bytes to send (often
    none). Call ``finish()`` when the upstream ends: it closes a stream that lacked [DONE], or, if no
    finish_reason came, ends it with an ``error`` event. Assumes tool calls arrive one after another,
    as every OpenAI-compatible engine sends them."""

    def __init__(self, model: str | None = None, input_tokens: int | None = None) -> None:
        super().__init__()
        self._model = model
        self._input_tokens = input_tokens
        self._index = -1
        self._open: str | None = None  # "text" | "thinking" | "tool_use"
        self._tool_blocks: dict[int, int] = {}  # chat tool_call index -> Anthropic block index
        self._matched: Any = None
        self._tool_used = False

    @property
    def usage(self) -> dict[str, int]:
        """Anthropic usage so far (final once message_delta was sent)."""
        return self._anthropic_usage()

    def _fail(self, message: str) -> bytes:
        self._ended = True
        return encode_event("error", error_body(502, message))

    def _error(self, inner: Any) -> bytes:
        self._ended = True
        return encode_event("error", error_body(_status(inner), error_message(inner)))

    def _start(self, event: dict[str, Any]) -> bytes:
        self._started = True
        usage = usage_to_anthropic(event.get("usage"))
        if self._input_tokens is not None and not isinstance(event.get("usage"), dict):
            usage["input_tokens"] = self._input_tokens
        message: dict[str, Any] = {
            "id": message_id(event.get("id")),
            "type": "message",
            "role": "assistant",
            "content": [],
            "model": self._model if self._model is not None else event.get("model"),
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": usage["input_tokens"], "output_tokens": 0},
        }
        return encode_event("message_start", {"type": "message_start", "message": message})

    def _choice(self, choice: dict[str, Any]) -> bytes:
        out = b""
        if choice.get("finish_reason") is not None:
            self._finish = choice["finish_reason"]
            self._matched = matched_stop(choice)
        delta = choice.get("delta")
        if not isinstance(delta, dict):
            return out
        reasoning = delta.get("reasoning_content") or delta.get("reasoning")
        if isinstance(reasoning, str) and reasoning:
            out += self._delta("thinking", {"type": "thinking_delta", "thinking": reasoning})
        text = delta.get("content")
        if isinstance(text, str) and text:
            out += self._delta("text", {"type": "text_delta", "text": text})
        calls = delta.get("tool_calls")
        for call in calls if isinstance(calls, list) else ():
            if isinstance(call, dict):
                out += self._tool_call(call)
        return out

    def _delta(self, kind: str, delta: dict[str, Any]) -> bytes:
        out = b""
        if self._open != kind:
            block = {"type": "text", "text": ""} if kind == "text" else {"type": "thinking", "thinking": ""}
            out = self._open_block(kind, block)
        return out + encode_event(
            "content_block_delta", {"type": "content_block_delta", "index": self._index, "delta": delta}
        )

    def _tool_call(self, call: dict[str, Any]) -> bytes:
        out = b""
        index = call.get("index")
        position = index if isinstance(index, int) else 0
        function = call.get("function") if isinstance(call.get("function"), dict) else {}
        assert isinstance(function, dict)
        if position not in self._tool_blocks:
            self._tool_used = True
            block = {
                "type": "tool_use",
                "id": str(call.get("id") or f"toolu_{position}"),
                "name": str(function.get("name") or ""),
                "input": {},
            }
            out = self._open_block("tool_use", block)
            self._tool_blocks[position] = self._index
        arguments = function.get("arguments")
        if isinstance(arguments, str) and arguments:
            delta = {"type": "input_json_delta", "partial_json": arguments}
            index = self._tool_blocks[position]
            out += encode_event("content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta})
        return out

    def _open_block(self, kind: str, block: dict[str, Any]) -> bytes:
        out = self._close_block()
        self._index += 1
        self._open = kind
        start = {"type": "content_block_start", "index": self._index, "content_block": block}
        return out + encode_event("content_block_start", start)

    def _close_block(self) -> bytes:
        if self._open is None:
            return b""
        self._open = None
        return encode_event("content_block_stop", {"type": "content_block_stop", "index": self._index})

    def _close(self) -> bytes:
        self._ended = True
        out = b"" if self._started else self._start({})
        if self._index < 0:  # as vLLM and Anthropic: a message has at least one (maybe empty) block
            out += self._open_block("text", {"type": "text", "text": ""})
        out += self._close_block()
        reason, sequence = stop_reason(self._finish or "stop", self._matched, self._tool_used)
        delta = {"type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": sequence}}
        delta["usage"] = self._anthropic_usage()
        out += encode_event("message_delta", delta)
        return out + encode_event("message_stop", {"type": "message_stop"})

    def _anthropic_usage(self) -> dict[str, int]:
        usage = usage_to_anthropic(self._usage)
        if self._usage is None and self._input_tokens is not None:
            usage["input_tokens"] = self._input_tokens
        return usage


def _status(inner: Any) -> int:
    code = inner.get("code") if isinstance(inner, dict) else None
    return code if isinstance(code, int) and 400 <= code < 600 else 500
