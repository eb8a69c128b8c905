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

_PASSED = ("temperature", "top_p", "parallel_tool_calls", "user")
_TEXT_PARTS = ("input_text", "output_text", "text", "refusal")


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(12)}"


def responses_to_chat(body: Mapping[str, Any]) -> dict[str, Any]:
    """A Responses request body as a chat completions request body."""
    if body.get("previous_response_id") is not None:
        raise InvalidRequest(
            "previous_response_id: this backend keeps no response state; send the whole conversation in input.",
            param="previous_response_id",
            code="previous_response_not_supported",
        )
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
        for i, item in enumerate(raw):
            _convert_item(item, f"input.{i}", messages)
    else:
        raise InvalidRequest("input: must be a string or a non-empty array of items.", param="input")
    chat: dict[str, Any] = {"model": body.get("model"), "messages": messages}
    if body.get("max_output_tokens") is not None:
        chat["max_tokens"] = body["max_output_tokens"]
    for key in _PASSED:
        if body.get(key) is not None:
            chat[key] = body[key]
    if body.get("stream") is True:
        chat["stream"] = True
        chat["stream_options"] = {"include_usage": True}
    if body.get("tools") is not None:
        chat["tools"] = _convert_tools(body["tools"])
    if body.get("tool_choice") is not None:
        chat["tool_choice"] = _convert_tool_choice(body["tool_choice"])
    response_format = _response_format(body.get("text"))
    if response_format is not None:
        chat["response_format"] = response_format
    return chat


def _convert_item(item: Any, where: str, out: list[dict[str, Any]]) -> None:
    if not isinstance(item, dict):
        raise InvalidRequest(f"{where}: must be an object.", param=where)
    kind = item.get("type", "message")
    if kind == "message":
        role = item.get("role")
        if role not in ("user", "assistant", "system", "developer"):
            raise InvalidRequest(f"{where}.role: must be user, assistant, system or developer.", param=f"{where}.role")
        out.append({"role": "system" if role == "developer" else role, "content": _content(item.get("content"), where)})
    elif kind == "function_call":
        if not isinstance(item.get("name"), str) or not isinstance(item.get("call_id"), str):
            raise InvalidRequest(f"{where}: a function_call needs a string call_id and name.", param=where)
        arguments = item.get("arguments")
        call = {
            "id": item["call_id"],
            "type": "function",
            "function": {"name": item["name"], "arguments": arguments if isinstance(arguments, str) else "{}"},
        }
        last = out[-1] if out else None
        if last is not None and last["role"] == "assistant" and not isinstance(last.get("content"), list):
            last.setdefault("tool_calls", []).append(call)  # parallel calls share one assistant turn
        else:
            out.append({"role": "assistant", "content": None, "tool_calls": [call]})
    elif kind == "function_call_output":
        output = item.get("output")
        text = output if isinstance(output, str) else _content(output, where)
        out.append({"role": "tool", "tool_call_id": str(item.get("call_id") or ""), "content": text})
    elif kind == "reasoning":
        pass  # another model's reasoning means nothing to this one
    else:
        raise InvalidRequest(f"{where}.type: unsupported input item type {kind!r}.", param=f"{where}.type")


def _content(content: Any, where: str) -> Any:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise InvalidRequest(f"{where}.content: must be a string or an array of parts.", param=f"{where}.content")
    parts: list[dict[str, Any]] = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in _TEXT_PARTS and isinstance(part.get("text", part.get("refusal")), str):
            parts.append({"type": "text", "text": part.get("text", part.get("refusal"))})
        elif kind == "input_image" and isinstance(part.get("image_url"), str):
            parts.append({"type": "image_url", "image_url": {"url": part["image_url"]}})
        else:
            raise InvalidRequest(f"{where}.content.{j}: unsupported content part {kind!r}.", param=f"{where}.content")
    if all(p["type"] == "text" for p in parts):
        return "".join(p["text"] for p in parts)
    return parts


def _convert_tools(tools: Any) -> list[dict[str, Any]]:
    if not isinstance(tools, list):
        raise InvalidRequest("tools: must be an array.", param="tools")
    out = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(tool.get("name"), str):
            kind = tool.get("type") if isinstance(tool, dict) else None
            raise InvalidRequest(
                f"tools.{i}: only function tools are available here, not {kind!r}.", param=f"tools.{i}"
            )
        function: dict[str, Any] = {"name": tool["name"], "parameters": tool.get("parameters") or {"type": "object"}}
        for key in ("description", "strict"):
            if tool.get(key) is not None:
                function[key] = tool[key]
        out.append({"type": "function", "function": function})
    return out


def _convert_tool_choice(choice: Any) -> Any:
    if choice in ("auto", "none", "required"):
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    raise InvalidRequest("tool_choice: must be auto, none, required or a function by name.", param="tool_choice")


def _response_format(text: Any) -> dict[str, Any] | None:
    fmt = text.get("format") if isinstance(text, dict) else None
    if not isinstance(fmt, dict) or fmt.get("type") in (None, "text"):
        return None
    if fmt["type"] == "json_object":
        return {"type": "json_object"}
    if fmt["type"] == "json_schema":
        schema = {k: fmt[k] for k in ("name", "schema", "strict", "description") if k in fmt}
        return {"type": "json_schema", "json_schema": schema}
    raise InvalidRequest("text.format: must be text, json_object or json_schema.", param="text.format")


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
        "input_tokens_details": {"cached_tokens": cached},
        "output_tokens": completion,
        "output_tokens_details": {"reasoning_tokens": reasoning},
        "total_tokens": prompt + completion,
    }


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def message_item(item_id: str, text: str, status: str = "completed") -> dict[str, Any]:
    part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
    return {"type": "message", "id": item_id, "role": "assistant", "status": status, "content": [part]}


def function_call_item(
    item_id: str, call_id: str, name: str, arguments: str, status: str = "completed"
) -> dict[str, Any]:
    return {
        "type": "function_call",
        "id": item_id,
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
        "status": status,
    }


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


def chat_to_response(chat: Mapping[str, Any], request: Mapping[str, Any], *, created_at: int) -> dict[str, Any]:
    """A chat completion (non-stream) as a Responses object."""
    choices = chat.get("choices")
    choice: Mapping[str, Any] = (
        choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) else {}
    )
    message = choice.get("message") if isinstance(choice.get("message"), dict) else {}
    assert isinstance(message, dict)
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
            output.append(
                function_call_item(new_id("fc"), call_id, name, arguments if isinstance(arguments, str) else "{}")
            )
    status, reason = finish_status(choice.get("finish_reason"))
    return response_object(
        request,
        response_id=new_id("resp"),
        created_at=created_at,
        status=status,
        output=output,
        usage=usage_to_responses(chat.get("usage")),
        model=chat.get("model"),
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
