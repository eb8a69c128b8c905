"""OpenAI Responses <-> chat completions, for backends that do not serve /v1/responses (or serve it
badly): the request one way, the whole (non-stream) response the other. Pure: no I/O.

Stateless only: ``previous_response_id`` needs the backend's store, so a translated request that
names one is refused (400). The stream is responses_stream.py."""

from __future__ import annotations

import json
import secrets
from collections.abc import Mapping
from typing import Any

from gateway.errors import InvalidRequest
from gateway.protocols.dropped import Dropped
from gateway.protocols.messages_reply import first_choice
from gateway.protocols.messages_translate import fold_system_messages
from gateway.protocols.responses_tools import ToolNames, call_item, chat_tool_choice, chat_tools

_PASSED = ("temperature", "top_p", "parallel_tool_calls")
_TEXT_PARTS = ("input_text", "output_text", "text", "refusal", "summary_text", "reasoning_text")
# Top-level fields with no chat equivalent, named in x-gateway-dropped when set. Not named: `store`
# false, `prompt_cache_key` and `client_metadata` (read for routing, and a translated request keeps
# nothing anyway), `service_tier`, `user` and `safety_identifier` (session keys).
_DROPPED_FIELDS = ("reasoning", "truncation", "background", "conversation", "max_tool_calls", "top_logprobs", "prompt")


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(12)}"


def tool_names(body: Mapping[str, Any]) -> ToolNames:
    """The chat names of a request's tools, as responses_to_chat gave them (for its answer)."""
    names = ToolNames()
    chat_tools(body.get("tools"), names, Dropped())
    return names


def responses_to_chat(
    body: Mapping[str, Any], dropped: Dropped | None = None, names: ToolNames | None = None
) -> dict[str, Any]:
    """A Responses request body as a chat completions request body. What chat cannot express is left
    out and named in `dropped`; only a request that needs the backend's stored state, or has no input
    at all, is refused."""
    lost = dropped if dropped is not None else Dropped()
    tools = names if names is not None else ToolNames()
    if body.get("previous_response_id") is not None:
        raise InvalidRequest(
            "previous_response_id: this backend keeps no response state; send the whole conversation in input.",
            param="previous_response_id",
            code="previous_response_not_supported",
        )
    chat_tool_list = chat_tools(body.get("tools"), tools, lost) if body.get("tools") is not None else None
    messages: list[dict[str, Any]] = []
    instructions = body.get("instructions")
    if isinstance(instructions, str) and instructions:
        messages.append({"role": "system", "content": instructions})
    elif instructions is not None and not isinstance(instructions, str):
        raise InvalidRequest("instructions: must be a string.", param="instructions")
    raw = body.get("input")
    if isinstance(raw, str):
        messages.append({"role": "user", "content": raw})
    elif isinstance(raw, list) and raw:
        history = _History(messages, tools, lost)
        for i, item in enumerate(raw):
            history.add(item, f"input.{i}")
        history.end()
    else:
        raise InvalidRequest("input: must be a string or a non-empty array of items.", param="input")
    chat: dict[str, Any] = {"model": body.get("model"), "messages": fold_system_messages(messages)}
    if body.get("max_output_tokens") is not None:
        chat["max_tokens"] = body["max_output_tokens"]
    for key in _PASSED:
        if body.get(key) is not None:
            chat[key] = body[key]
    if isinstance(body.get("user"), str):
        chat["user"] = body["user"]
    if body.get("stream") is True:
        chat["stream"] = True
        chat["stream_options"] = {"include_usage": True}
    if chat_tool_list:
        chat["tools"] = chat_tool_list
        if body.get("tool_choice") is not None:
            chat["tool_choice"] = chat_tool_choice(body["tool_choice"], tools)
    elif not chat_tool_list:
        chat.pop("parallel_tool_calls", None)
    response_format = _response_format(body.get("text"), lost)
    if response_format is not None:
        chat["response_format"] = response_format
    for name in _DROPPED_FIELDS:
        if body.get(name) is not None:
            lost.add(name)
    include = body.get("include")
    if isinstance(include, list):
        for name in include:
            if isinstance(name, str):
                lost.add(name)
    if body.get("store") is True:
        lost.add("store")
    return chat


class _History:
    """Responses input items as chat messages: calls join the assistant turn before them, a reasoning
    item's text goes with the assistant turn after it."""

    __slots__ = ("lost", "names", "out", "reasoning")

    def __init__(self, out: list[dict[str, Any]], names: ToolNames, lost: Dropped) -> None:
        self.out = out
        self.names = names
        self.lost = lost
        self.reasoning: list[str] = []

    def add(self, item: Any, where: str) -> None:
        if not isinstance(item, dict):
            raise InvalidRequest(f"{where}: must be an object.", param=where)
        kind = item.get("type", "message")
        if kind == "message":
            self._message(item, where)
        elif kind in ("function_call", "custom_tool_call"):
            self._call(item, kind, where)
        elif kind in ("function_call_output", "custom_tool_call_output"):
            output = item.get("output")
            text = output if isinstance(output, str) else self._text(output)
            self.out.append({"role": "tool", "tool_call_id": str(item.get("call_id") or ""), "content": text})
        elif kind == "reasoning":
            texts = self._reasoning_text(item)
            if texts:
                self.reasoning.append(texts)
            if item.get("encrypted_content"):
                self.lost.add("reasoning.encrypted_content")
        else:  # compaction, item_reference, web_search_call, hosted tools' calls, ...
            self.lost.add(str(kind))

    def end(self) -> None:
        self.reasoning = []  # reasoning with no answer after it: nothing to attach it to

    def _message(self, item: Mapping[str, Any], where: str) -> None:
        role = item.get("role")
        if role not in ("user", "assistant", "system", "developer"):
            raise InvalidRequest(f"{where}.role: must be user, assistant, system or developer.", param=f"{where}.role")
        message: dict[str, Any] = {"role": "system" if role == "developer" else role, "content": self._content(item)}
        if role == "assistant" and self.reasoning:
            message["reasoning"] = "".join(self.reasoning)
            self.reasoning = []
        self.out.append(message)

    def _call(self, item: Mapping[str, Any], kind: str, where: str) -> None:
        if not isinstance(item.get("name"), str) or not isinstance(item.get("call_id"), str):
            raise InvalidRequest(f"{where}: a {kind} needs a string call_id and name.", param=where)
        namespace = item.get("namespace")
        flat = self.names.name_for(namespace if isinstance(namespace, str) else "", item["name"])
        if kind == "custom_tool_call":
            given = item.get("input")
            arguments = json.dumps({"input": given if isinstance(given, str) else ""})
        else:
            given = item.get("arguments")
            arguments = given if isinstance(given, str) else "{}"
        call = {"id": item["call_id"], "type": "function", "function": {"name": flat, "arguments": arguments}}
        last = self.out[-1] if self.out else None
        if last is not None and last["role"] == "assistant" and not isinstance(last.get("content"), list):
            last.setdefault("tool_calls", []).append(call)  # parallel calls share one assistant turn
        else:
            message: dict[str, Any] = {"role": "assistant", "content": None, "tool_calls": [call]}
            if self.reasoning:
                message["reasoning"] = "".join(self.reasoning)
                self.reasoning = []
            self.out.append(message)

    def _reasoning_text(self, item: Mapping[str, Any]) -> str:
        parts = item.get("content") or item.get("summary") or []
        return self._text(parts) if isinstance(parts, list) else ""

    def _content(self, item: Mapping[str, Any]) -> Any:
        content = item.get("content")
        if isinstance(content, str):
            return content
        if not isinstance(content, list):
            return ""
        parts: list[dict[str, Any]] = []
        for part in content:
            kind = part.get("type") if isinstance(part, dict) else None
            if kind in _TEXT_PARTS and isinstance(part.get("text", part.get("refusal")), str):
                parts.append({"type": "text", "text": part.get("text", part.get("refusal"))})
            elif kind == "input_image" and isinstance(part.get("image_url"), str):
                parts.append({"type": "image_url", "image_url": {"url": part["image_url"]}})
            else:
                self.lost.add(str(kind) if isinstance(kind, str) else "content_part")
        if all(p["type"] == "text" for p in parts):
            return "".join(p["text"] for p in parts)
        return parts

    def _text(self, parts: Any) -> str:
        """The text of an output given as parts (a function_call_output's array, reasoning's summary)."""
        if not isinstance(parts, list):
            return ""
        texts = []
        for part in parts:
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                texts.append(part["text"])
            elif isinstance(part, dict):
                self.lost.add(str(part.get("type") or "content_part"))
        return "\n".join(texts)


def _response_format(text: Any, lost: Dropped) -> dict[str, Any] | None:
    fmt = text.get("format") if isinstance(text, dict) else None
    if not isinstance(fmt, dict) or fmt.get("type") in (None, "text"):
        return None
    if fmt["type"] == "json_object":
        return {"type": "json_object"}
    if fmt["type"] == "json_schema":
        schema = {k: fmt[k] for k in ("name", "schema", "strict", "description") if k in fmt}
        return {"type": "json_schema", "json_schema": schema}
    lost.add("text.format")
    return None


def usage_to_responses(usage: Any) -> dict[str, Any]:
    if not isinstance(usage, dict):
        usage = {}
    prompt = _int(usage.get("prompt_tokens"))
    completion = _int(usage.get("completion_tokens"))
    details = usage.get("prompt_tokens_details")
    cached = _int(details.get("cached_tokens")) if isinstance(details, dict) else 0
    out_details = usage.get("completion_tokens_details")
    reasoning = _int(out_details.get("reasoning_tokens")) if isinstance(out_details, dict) else 0
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": 0},
        "output_tokens": completion,
        "output_tokens_details": {"reasoning_tokens": reasoning},
        "total_tokens": prompt + completion,
    }


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def message_item(item_id: str, text: str, status: str = "completed") -> dict[str, Any]:
    part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
    return {"type": "message", "id": item_id, "role": "assistant", "status": status, "content": [part]}


def reasoning_item(item_id: str, text: str) -> dict[str, Any]:
    return {"type": "reasoning", "id": item_id, "summary": [], "content": [{"type": "reasoning_text", "text": text}]}


def response_object(
    request: Mapping[str, Any],
    *,
    response_id: str,
    created_at: int,
    status: str,
    output: list[dict[str, Any]],
    usage: dict[str, Any] | None,
    model: Any = None,
    incomplete_reason: str | None = None,
) -> dict[str, Any]:
    """The Responses object, echoing the request's settings as OpenAI's (and vLLM's) does."""
    return {
        "id": response_id,
        "object": "response",
        "created_at": created_at,
        "status": status,
        "error": None,
        "incomplete_details": {"reason": incomplete_reason} if incomplete_reason else None,
        "instructions": request.get("instructions"),
        "max_output_tokens": request.get("max_output_tokens"),
        "metadata": request.get("metadata"),
        "model": model if model is not None else request.get("model"),
        "output": output,
        "parallel_tool_calls": request.get("parallel_tool_calls", True),
        "previous_response_id": None,
        "reasoning": None,
        "store": False,
        "temperature": request.get("temperature", 1.0),
        "text": request.get("text", {"format": {"type": "text"}}),
        "tool_choice": request.get("tool_choice", "auto"),
        "tools": request.get("tools", []),
        "top_p": request.get("top_p", 1.0),
        "truncation": "disabled",
        "usage": usage,
        "user": request.get("user"),
    }


def finish_status(finish_reason: Any) -> tuple[str, str | None]:
    """The Response status and incomplete reason for a chat finish_reason."""
    if finish_reason == "length":
        return "incomplete", "max_output_tokens"
    if finish_reason == "content_filter":
        return "incomplete", "content_filter"
    return "completed", None


def chat_to_response(
    chat: Mapping[str, Any], request: Mapping[str, Any], *, created_at: int, names: ToolNames | None = None
) -> dict[str, Any]:
    """A chat completion (non-stream) as a Responses object, named as the client named things: its
    model, its tools (namespaces and custom tools restored)."""
    choice, message = first_choice(chat)
    output: list[dict[str, Any]] = []
    reasoning = message.get("reasoning") or message.get("reasoning_content")
    if isinstance(reasoning, str) and reasoning:
        output.append(reasoning_item(new_id("rs"), reasoning))
    text = message.get("content")
    if isinstance(text, str) and text:
        output.append(message_item(new_id("msg"), text))
    calls = message.get("tool_calls")
    for call in calls if isinstance(calls, list) else ():
        function = call.get("function") if isinstance(call, dict) else None
        if isinstance(function, dict):
            arguments = function.get("arguments")
            call_id = str(call.get("id") or new_id("call"))
            name = str(function.get("name") or "")
            text = arguments if isinstance(arguments, str) else "{}"
            output.append(call_item(names, new_id("fc"), call_id, name, text))
    status, reason = finish_status(choice.get("finish_reason"))
    return response_object(
        request,
        response_id=new_id("resp"),
        created_at=created_at,
        status=status,
        output=output,
        usage=usage_to_responses(chat.get("usage")),
        incomplete_reason=reason,
    )


def response_text(response: Mapping[str, Any]) -> str:
    """All output_text of a Responses object, joined (what the SDK's ``output_text`` gives)."""
    texts: list[str] = []
    for item in response.get("output") or []:
        if isinstance(item, dict) and item.get("type") == "message":
            texts.extend(p.get("text", "") for p in item.get("content") or [] if p.get("type") == "output_text")
    return "".join(texts)


def encode(value: Mapping[str, Any]) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()
