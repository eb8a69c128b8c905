"""Anthropic Messages <-> OpenAI chat completions, for backends that do not serve /v1/messages
natively: the request one way, the whole (non-stream) response the other. Pure: no I/O.

The conversion follows vLLM 0.32's own (vllm/entrypoints/anthropic/serving.py), so that a translated
request counts the same tokens as the native one. The stream is messages_stream.py."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from gateway.errors import InvalidRequest

# Fields of a Messages request with no chat equivalent that are dropped on purpose (metadata's
# user_id becomes chat's `user`; the rest only steer Anthropic's own service).
DROPPED_FIELDS = ("metadata", "thinking", "service_tier", "container", "mcp_servers", "context_management")
_SAMPLING = ("temperature", "top_p", "top_k")


def messages_to_chat(body: Mapping[str, Any]) -> dict[str, Any]:
    """A Messages request body as a chat completions request body."""
    messages: list[dict[str, Any]] = []
    system = _system_text(body.get("system"))
    if system:
        messages.append({"role": "system", "content": system})
    raw_messages = body.get("messages")
    if not isinstance(raw_messages, list) or not raw_messages:
        raise InvalidRequest("messages: must be a non-empty array.", param="messages")
    for i, message in enumerate(raw_messages):
        _convert_message(message, i, messages)
    chat: dict[str, Any] = {"model": body.get("model"), "messages": messages}
    if "max_tokens" in body:
        chat["max_tokens"] = body["max_tokens"]
    stop = body.get("stop_sequences")
    if stop is not None:
        if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
            raise InvalidRequest("stop_sequences: must be an array of strings.", param="stop_sequences")
        if stop:
            chat["stop"] = stop
    for key in _SAMPLING:
        if body.get(key) is not None:
            chat[key] = body[key]
    metadata = body.get("metadata")
    if isinstance(metadata, dict) and isinstance(metadata.get("user_id"), str):
        chat["user"] = metadata["user_id"]
    if body.get("stream") is True:
        chat["stream"] = True
        chat["stream_options"] = {"include_usage": True}
    tools = body.get("tools")
    if tools is not None:
        chat["tools"] = _convert_tools(tools)
    choice = body.get("tool_choice")
    if choice is not None:
        chat.update(_convert_tool_choice(choice))
    elif tools:
        chat["tool_choice"] = "auto"
    return chat


def _system_text(system: Any) -> str:
    if system is None:
        return ""
    if isinstance(system, str):
        return system
    if not isinstance(system, list):
        raise InvalidRequest("system: must be a string or an array of text blocks.", param="system")
    parts = []
    for block in system:
        if not isinstance(block, dict) or block.get("type") != "text" or not isinstance(block.get("text"), str):
            raise InvalidRequest("system: every block must be a text block.", param="system")
        parts.append(block["text"])
    return "".join(parts)


def _convert_message(message: Any, i: int, out: list[dict[str, Any]]) -> None:
    where = f"messages.{i}"
    if not isinstance(message, dict) or message.get("role") not in ("user", "assistant"):
        raise InvalidRequest(f"{where}: must be an object with role 'user' or 'assistant'.", param=where)
    role = message["role"]
    content = message.get("content")
    if isinstance(content, str):
        out.append({"role": role, "content": content})
        return
    if not isinstance(content, list):
        raise InvalidRequest(f"{where}.content: must be a string or an array of blocks.", param=f"{where}.content")
    parts: list[dict[str, Any]] = []
    tool_calls: list[dict[str, Any]] = []
    reasoning: list[str] = []
    for j, block in enumerate(content):
        _convert_block(block, role, f"{where}.content.{j}", parts, tool_calls, reasoning, out)
    chat: dict[str, Any] = {"role": role}
    if reasoning:
        chat["reasoning"] = "".join(reasoning)
    if tool_calls:
        chat["tool_calls"] = tool_calls
    if parts:
        chat["content"] = parts[0]["text"] if len(parts) == 1 and parts[0]["type"] == "text" else parts
    if role == "assistant" or "content" in chat:
        out.append(chat)


def _convert_block(
    block: Any,
    role: str,
    where: str,
    parts: list[dict[str, Any]],
    tool_calls: list[dict[str, Any]],
    reasoning: list[str],
    out: list[dict[str, Any]],
) -> None:
    kind = block.get("type") if isinstance(block, dict) else None
    if kind == "text":
        if not isinstance(block.get("text"), str):
            raise InvalidRequest(f"{where}.text: must be a string.", param=f"{where}.text")
        if block["text"]:
            parts.append({"type": "text", "text": block["text"]})
    elif kind == "image":
        parts.append({"type": "image_url", "image_url": {"url": _image_url(block.get("source"), where)}})
    elif kind == "tool_use":
        if not isinstance(block.get("name"), str) or not isinstance(block.get("id"), str):
            raise InvalidRequest(f"{where}: a tool_use block needs a string id and name.", param=where)
        arguments = json.dumps(block.get("input") or {})
        tool_calls.append(
            {"id": block["id"], "type": "function", "function": {"name": block["name"], "arguments": arguments}}
        )
    elif kind == "tool_result":
        _convert_tool_result(block, role, where, parts, out)
    elif kind == "thinking":
        if isinstance(block.get("thinking"), str):
            reasoning.append(block["thinking"])
    elif kind == "redacted_thinking":
        pass  # opaque to any other model; accepted so that clients can echo whole turns back
    else:
        raise InvalidRequest(f"{where}: unsupported content block type {kind!r}.", param=f"{where}.type")


def _image_url(source: Any, where: str) -> str:
    if isinstance(source, dict) and source.get("type") == "url" and isinstance(source.get("url"), str):
        return str(source["url"])
    if isinstance(source, dict) and source.get("type") == "base64" and isinstance(source.get("data"), str):
        return f"data:{source.get('media_type', 'image/jpeg')};base64,{source['data']}"
    raise InvalidRequest(f"{where}.source: an image needs a base64 or url source.", param=f"{where}.source")


def _convert_tool_result(
    block: dict[str, Any], role: str, where: str, parts: list[dict[str, Any]], out: list[dict[str, Any]]
) -> None:
    content = block.get("content")
    images: list[str] = []
    if content is None or isinstance(content, str):
        text = content or ""
    elif isinstance(content, list):
        texts = []
        for k, item in enumerate(content):
            kind = item.get("type") if isinstance(item, dict) else None
            if kind == "text" and isinstance(item.get("text"), str):
                texts.append(item["text"])
            elif kind == "image":
                images.append(_image_url(item.get("source"), f"{where}.content.{k}"))
            else:
                raise InvalidRequest(f"{where}.content.{k}: must be a text or image block.", param=f"{where}.content")
        text = "\n".join(texts)
    else:
        raise InvalidRequest(f"{where}.content: must be a string or an array of blocks.", param=f"{where}.content")
    if role != "user":
        parts.append({"type": "text", "text": f"Tool result: {text}"})
        return
    out.append({"role": "tool", "tool_call_id": str(block.get("tool_use_id") or ""), "content": text})
    if images:
        out.append({"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}} for url in images]})


def _convert_tools(tools: Any) -> list[dict[str, Any]]:
    if not isinstance(tools, list):
        raise InvalidRequest("tools: must be an array.", param="tools")
    out = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict) or not isinstance(tool.get("name"), str):
            raise InvalidRequest(f"tools.{i}: must be an object with a name.", param=f"tools.{i}")
        if tool.get("type") not in (None, "custom"):
            raise InvalidRequest(
                f"tools.{i}: server tool {tool['type']!r} is not available on this backend.", param=f"tools.{i}.type"
            )
        function: dict[str, Any] = {"name": tool["name"], "parameters": tool.get("input_schema") or {"type": "object"}}
        if isinstance(tool.get("description"), str):
            function["description"] = tool["description"]
        out.append({"type": "function", "function": function})
    return out


def _convert_tool_choice(choice: Any) -> dict[str, Any]:
    kind = choice.get("type") if isinstance(choice, dict) else None
    converted: dict[str, Any]
    if kind == "auto":
        converted = {"tool_choice": "auto"}
    elif kind == "any":
        converted = {"tool_choice": "required"}
    elif kind == "none":
        converted = {"tool_choice": "none"}
    elif kind == "tool" and isinstance(choice.get("name"), str):
        converted = {"tool_choice": {"type": "function", "function": {"name": choice["name"]}}}
    else:
        raise InvalidRequest("tool_choice: type must be auto, any, tool (with a name) or none.", param="tool_choice")
    if choice.get("disable_parallel_tool_use") is True:
        converted["parallel_tool_calls"] = False
    return converted


def stop_reason(finish_reason: Any, matched_stop: Any, tool_used: bool) -> tuple[str | None, str | None]:
    """Anthropic's (stop_reason, stop_sequence) for a chat finish_reason. ``matched_stop`` is the stop
    string that ended the generation when the engine says so (vLLM ``stop_reason``, SGLang
    ``matched_stop``); a stop token id is not a stop sequence."""
    if finish_reason == "length":
        return "max_tokens", None
    if finish_reason == "content_filter":
        return "refusal", None
    if finish_reason == "tool_calls" or tool_used:
        return "tool_use", None
    if isinstance(matched_stop, str):
        return "stop_sequence", matched_stop
    return "end_turn", None


def matched_stop(choice: Mapping[str, Any]) -> Any:
    value = choice.get("stop_reason")
    return value if isinstance(value, str) else choice.get("matched_stop")


def usage_to_anthropic(usage: Any) -> dict[str, int]:
    """Anthropic counts cached prompt tokens apart: input_tokens excludes cache_read_input_tokens."""
    if not isinstance(usage, dict):
        return {"input_tokens": 0, "output_tokens": 0}
    prompt = _int(usage.get("prompt_tokens"))
    out = {"input_tokens": prompt, "output_tokens": _int(usage.get("completion_tokens"))}
    details = usage.get("prompt_tokens_details")
    if isinstance(details, dict) and isinstance(details.get("cached_tokens"), int):
        # vLLM's created_cache_tokens is Anthropic's cache_creation_input_tokens; others say nothing
        created = _int(details.get("created_cache_tokens"))
        cached = min(prompt, _int(details["cached_tokens"]))
        created = min(prompt - cached, created)
        out["input_tokens"] = prompt - cached - created
        out["cache_creation_input_tokens"] = created
        out["cache_read_input_tokens"] = cached
    return out


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def message_id(chat_id: Any) -> str:
    text = chat_id if isinstance(chat_id, str) and chat_id else "0"
    return "msg_" + text.removeprefix("chatcmpl-")


def tool_input(arguments: Any) -> dict[str, Any]:
    """A tool call's arguments as the object Anthropic's ``input`` must be; {} when they are not a
    JSON object (a call cut short by max_tokens, whose stop_reason then says so)."""
    try:
        value = json.loads(arguments) if isinstance(arguments, str) and arguments else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def chat_to_message(chat: Mapping[str, Any], model: str | None = None) -> dict[str, Any]:
    """A chat completion (non-stream) as a Messages response."""
    choices = chat.get("choices")
    choice: Mapping[str, Any] = (
        choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) else {}
    )
    message = choice.get("message") if isinstance(choice.get("message"), dict) else {}
    assert isinstance(message, dict)
    content: list[dict[str, Any]] = []
    reasoning = message.get("reasoning") or message.get("reasoning_content")
    if isinstance(reasoning, str) and reasoning:
        content.append({"type": "thinking", "thinking": reasoning, "signature": ""})
    text = message.get("content")
    if isinstance(text, str) and text:
        content.append({"type": "text", "text": text})
    calls = message.get("tool_calls")
    for call in calls if isinstance(calls, list) else ():
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict):
            continue
        content.append(
            {
                "type": "tool_use",
                "id": str(call.get("id") or f"toolu_{len(content)}"),
                "name": str(function.get("name") or ""),
                "input": tool_input(function.get("arguments")),
            }
        )
    if not content:
        content.append({"type": "text", "text": ""})  # as vLLM: strict clients read content[0]
    reason, sequence = stop_reason(
        choice.get("finish_reason"), matched_stop(choice), any(b["type"] == "tool_use" for b in content)
    )
    return {
        "id": message_id(chat.get("id")),
        "type": "message",
        "role": "assistant",
        "content": content,
        "model": model if model is not None else chat.get("model"),
        "stop_reason": reason,
        "stop_sequence": sequence,
        "usage": usage_to_anthropic(chat.get("usage")),
    }


def count_tokens_to_tokenize(body: Mapping[str, Any]) -> dict[str, Any]:
    """A /v1/messages/count_tokens body as vLLM's (and SGLang's) ``POST /tokenize`` chat form, whose
    ``count`` is the native count_tokens answer (equal on vLLM 0.32, with system and tools)."""
    chat = messages_to_chat({**body, "stream": False})
    tokenize = {"model": chat["model"], "messages": chat["messages"]}
    if "tools" in chat:
        tokenize["tools"] = chat["tools"]
    return tokenize


def count_tokens_body(prompt_tokens: int) -> dict[str, int]:
    """/v1/messages/count_tokens' answer for a prompt the backend counted (e.g. with /tokenize)."""
    return {"input_tokens": prompt_tokens}
