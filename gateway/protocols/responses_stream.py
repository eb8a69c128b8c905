"""A chat completions SSE stream, translated into the Responses stream vLLM 0.32 sends:
response.created, response.in_progress, then per output item output_item.added / content_part.added /
output_text.delta / output_text.done / content_part.done / output_item.done (function calls:
function_call_arguments.delta / .done), and response.completed with usage; every event numbered. Pure.

A generation cut by max_output_tokens ends with ``response.completed`` whose status is "incomplete",
as vLLM's does: the openai SDK's ``get_final_response()`` needs a response.completed event."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gateway.protocols.chat_stream import ChatStreamTranslation, error_message
from gateway.protocols.frames import encode_event
from gateway.protocols.responses_tools import ToolNames, call_item
from gateway.protocols.responses_translate import (
    finish_status,
    message_item,
    new_id,
    reasoning_item,
    response_object,
    usage_to_responses,
)


class _Item:
    __slots__ = ("call_id", "id", "kind", "name", "names", "output_index", "text")

    def __init__(
        self,
        kind: str,
        item_id: str,
        output_index: int,
        call_id: str = "",
        name: str = "",
        names: ToolNames | None = None,
    ) -> None:
        self.kind = kind
        self.names = names
        self.id = item_id
        self.output_index = output_index
        self.text = ""  # message text, reasoning text or function arguments
        self.call_id = call_id
        self.name = name

    def done(self) -> dict[str, Any]:
        if self.kind == "message":
            return message_item(self.id, self.text)
        if self.kind == "reasoning":
            return reasoning_item(self.id, self.text)
        return call_item(self.names, self.id, self.call_id, self.name, self.text)

    def added(self) -> dict[str, Any]:
        return call_item(self.names, self.id, self.call_id, self.name, "", status="in_progress")

    @property
    def custom(self) -> bool:
        return self.names is not None and self.names.restore(self.name)[2]


class ResponsesStream(ChatStreamTranslation):
    """Feed it the upstream's raw bytes; it returns Responses SSE bytes. ``finish()`` when the
    upstream ends closes a stream that lacked [DONE], or fails it if no finish_reason came."""

    def __init__(
        self,
        request: Mapping[str, Any],
        *,
        created_at: int,
        response_id: str | None = None,
        names: ToolNames | None = None,
    ) -> None:
        super().__init__()
        self._names = names
        self._request = request
        self._created_at = created_at
        self.response_id = response_id or new_id("resp")
        self._seq = 0
        self._model: Any = request.get("model")  # the client's name for it, not the engine's
        self._items: list[_Item] = []
        self._open: _Item | None = None
        self._calls: dict[int, _Item] = {}

    @property
    def usage(self) -> dict[str, Any]:
        return usage_to_responses(self._usage)

    def _emit(self, name: str, fields: dict[str, Any]) -> bytes:
        event = {"type": name, "sequence_number": self._seq, **fields}
        self._seq += 1
        return encode_event(name, event)

    def _response(
        self, status: str, *, reason: str | None = None, usage: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        output = [item.done() for item in self._items] if status != "in_progress" else []
        return response_object(
            self._request,
            response_id=self.response_id,
            created_at=self._created_at,
            status=status,
            output=output,
            usage=usage,
            model=self._model,
            incomplete_reason=reason,
        )

    def _start(self, event: dict[str, Any]) -> bytes:
        self._started = True
        out = self._emit("response.created", {"response": self._response("in_progress")})
        return out + self._emit("response.in_progress", {"response": self._response("in_progress")})

    def _error(self, inner: Any) -> bytes:
        out = b"" if self._started else self._start({})
        return out + self._fail(error_message(inner))

    def _choice(self, choice: dict[str, Any]) -> bytes:
        if choice.get("finish_reason") is not None:
            self._finish = choice["finish_reason"]
        delta = choice.get("delta")
        if not isinstance(delta, dict):
            return b""
        out = b""
        reasoning = delta.get("reasoning_content") or delta.get("reasoning")
        if isinstance(reasoning, str) and reasoning:
            out += self._text("reasoning", reasoning)
        text = delta.get("content")
        if isinstance(text, str) and text:
            out += self._text("message", text)
        calls = delta.get("tool_calls")
        for call in calls if isinstance(calls, list) else ():
            if isinstance(call, dict):
                out += self._tool_call(call)
        return out

    def _start_item(self, item: _Item, added: dict[str, Any]) -> bytes:
        out = self._close_item()
        self._items.append(item)
        self._open = item
        return out + self._emit("response.output_item.added", {"output_index": item.output_index, "item": added})

    def _text(self, kind: str, text: str) -> bytes:
        out = b""
        item = self._open
        if item is None or item.kind != kind:
            item = _Item(kind, new_id("msg" if kind == "message" else "rs"), len(self._items))
            if kind == "message":
                added = {"type": "message", "id": item.id, "role": "assistant", "status": "in_progress", "content": []}
                out += self._start_item(item, added)
                part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
                out += self._emit("response.content_part.added", {**self._where(item), "part": part})
            else:
                out += self._start_item(item, {"type": "reasoning", "id": item.id, "summary": [], "content": []})
        item.text += text
        if kind == "message":
            return out + self._emit("response.output_text.delta", {**self._where(item), "delta": text, "logprobs": []})
        return out + self._emit("response.reasoning_text.delta", {**self._where(item), "delta": text})

    def _tool_call(self, call: dict[str, Any]) -> bytes:
        out = b""
        index = call.get("index")
        position = index if isinstance(index, int) else 0
        function = call.get("function") if isinstance(call.get("function"), dict) else {}
        assert isinstance(function, dict)
        item = self._calls.get(position)
        if item is None:
            call_id = str(call.get("id") or new_id("call"))
            name = str(function.get("name") or "")
            item = _Item("function_call", new_id("fc"), len(self._items), call_id, name, self._names)
            self._calls[position] = item
            out += self._start_item(item, item.added())
        arguments = function.get("arguments")
        if isinstance(arguments, str) and arguments:
            item.text += arguments
            if item.custom:  # its input is a string inside the JSON arguments: whole in output_item.done
                return out
            fields = {"item_id": item.id, "output_index": item.output_index, "delta": arguments}
            out += self._emit("response.function_call_arguments.delta", fields)
        return out

    @staticmethod
    def _where(item: _Item) -> dict[str, Any]:
        return {"item_id": item.id, "output_index": item.output_index, "content_index": 0}

    def _close_item(self) -> bytes:
        item, self._open = self._open, None
        if item is None:
            return b""
        out = b""
        if item.kind == "message":
            out += self._emit("response.output_text.done", {**self._where(item), "text": item.text, "logprobs": []})
            part = item.done()["content"][0]
            out += self._emit("response.content_part.done", {**self._where(item), "part": part})
        elif item.kind == "reasoning":
            out += self._emit("response.reasoning_text.done", {**self._where(item), "text": item.text})
        elif item.custom:
            fields = {"item_id": item.id, "output_index": item.output_index, "input": item.done()["input"]}
            out += self._emit("response.custom_tool_call_input.done", fields)
        else:
            done = item.done()
            fields = {
                "item_id": item.id,
                "output_index": item.output_index,
                "arguments": item.text,
                "name": done["name"],
            }
            out += self._emit("response.function_call_arguments.done", fields)
        return out + self._emit("response.output_item.done", {"output_index": item.output_index, "item": item.done()})

    def _close(self) -> bytes:
        self._ended = True
        out = b"" if self._started else self._start({})
        out += self._close_item()
        status, reason = finish_status(self._finish)
        response = self._response(status, reason=reason, usage=usage_to_responses(self._usage))
        return out + self._emit("response.completed", {"response": response})

    def _fail(self, message: str) -> bytes:
        """End with response.failed (status "failed", ``error`` set), as OpenAI does when generation fails."""
        self._ended = True
        out = self._close_item() if self._open is not None and self._started else b""
        response = self._response("failed")
        response["error"] = {"code": "server_error", "message": message}
        if not self._started:
            self._started = True
            out += self._emit("response.created", {"response": self._response("in_progress")})
        return out + self._emit("response.failed", {"response": response})
