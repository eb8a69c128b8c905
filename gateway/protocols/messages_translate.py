"""Anthropic Messages -> OpenAI chat completions, for backends that do not serve /v1/messages
natively: the request, and count_tokens. Pure: no I/O.

The conversion follows vLLM 0.32's own (vllm/entrypoints/anthropic/serving.py), so that a translated
request counts the same tokens as the native one. The whole answer the other way is
messages_reply.py; the stream is messages_stream.py."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from gateway.errors import InvalidRequest
from gateway.protocols.dropped import MESSAGES_FIELDS, Dropped

# Fields of a Messages request with no chat equivalent: dropped on the translated path and named in
# x-gateway-dropped.
DROPPED_FIELDS = MESSAGES_FIELDS
_SAMPLING = ("temperature", "top_p", "top_k")
# Tool fields that only Anthropic's own tool runner reads.
_TOOL_EXTRAS = ("defer_loading", "eager_input_streaming", "input_examples", "allowed_callers", "strict")
BILLING_PREFIX = "x-anthropic-billing-header:"
"""Claude Code's first system line: a per-request hash (cch=...) that Anthropic's billing reads.
It changes on every request, so it is left out of the chat form: kept, no two turns of one session
would share a prefix (neither in the gateway's fingerprint nor in the engine's prefix cache)."""


def messages_to_chat(body: Mapping[str, Any], dropped: Dropped | None = None) -> dict[str, Any]:
    """A Messages request body as a chat completions request body. What chat cannot express is left
    out and named in `dropped`; only a body with no conversation at all is refused."""
    lost = dropped if dropped is not None else Dropped()
    messages: list[dict[str, Any]] = []
    system = _system_text(body.get("system"), lost)
    if system:
        messages.append({"role": "system", "content": system})
    raw_messages = body.get("messages")
    if not isinstance(raw_messages, list) or not raw_messages:
        raise InvalidRequest("messages: must be a non-empty array.", param="messages")
    for i, message in enumerate(raw_messages):
        _convert_message(message, i, messages, lost)
    messages = fold_system_messages(messages)
    chat: dict[str, Any] = {"model": body.get("model"), "messages": messages}
    if "max_tokens" in body:
        chat["max_tokens"] = body["max_tokens"]
    stop = body.get("stop_sequences")
    if isinstance(stop, list) and stop and all(isinstance(s, str) for s in stop):
        chat["stop"] = stop
    elif stop is not None and stop != []:
        raise InvalidRequest("stop_sequences: must be an array of strings.", param="stop_sequences")
    for key in _SAMPLING:
        if body.get(key) is not None:
            chat[key] = body[key]
    user = metadata_session(body.get("metadata"))
    if user is not None:
        chat["user"] = user
    if body.get("stream") is True:
        chat["stream"] = True
        chat["stream_options"] = {"include_usage": True}
    for name in DROPPED_FIELDS:
        if body.get(name) is not None:
            lost.add(name)
    tools = body.get("tools")
    if tools is not None:
        converted = _convert_tools(tools, lost)
        if converted:
            chat["tools"] = converted
    choice = body.get("tool_choice")
    if chat.get("tools"):
        chat.update(_convert_tool_choice(choice) if choice is not None else {"tool_choice": "auto"})
    return chat


def metadata_session(metadata: Any) -> str | None:
    """A Messages request's session key from `metadata.user_id`: Claude Code sends a JSON string
    ({"device_id", "account_uuid", "session_id"}) and its session_id is the key; any other string is
    the key itself."""
    user = metadata.get("user_id") if isinstance(metadata, dict) else None
    if not isinstance(user, str) or not user:
        return None
    if user.startswith("{"):
        try:
            parsed = json.loads(user)
        except ValueError:
            return user
        session = parsed.get("session_id") if isinstance(parsed, dict) else None
        if isinstance(session, str) and session:
            return session
    return user


def fold_system_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Chat messages with every `system` message after the head folded into a neighbouring turn:
    many chat templates (the Qwen family's among them) refuse a system message anywhere but first,
    and hoisting it to the head would change the prefix of every later turn. It joins the user turn
    before it, or, where that is an assistant turn or a tool result (a tool call and its results
    must stay together), the next user turn; with neither, it stays a user turn of its own."""
    head = 0
    while head < len(messages) and messages[head]["role"] == "system":
        head += 1
    if head > 1:  # several at the head (Codex's developer messages): one, as templates want
        joined = "\n\n".join(_text_of(m.get("content")) for m in messages[:head])
        messages = [{"role": "system", "content": joined}, *messages[head:]]
        head = 1
    if all(m["role"] != "system" for m in messages[head:]):
        return messages
    out = messages[:head]
    pending: list[str] = []
    for message in messages[head:]:
        if message["role"] == "system":
            text = _text_of(message.get("content"))
            if out and out[-1]["role"] == "user" and len(out) > head:
                out[-1] = {**out[-1], "content": _joined(out[-1].get("content"), text)}
            else:
                pending.append(text)
            continue
        if pending and message["role"] == "user":
            message = {**message, "content": _joined("\n\n".join(pending), _text_or_parts(message.get("content")))}
            pending = []
        elif pending and message["role"] == "assistant" and not (out and out[-1]["role"] == "tool"):
            out.append({"role": "user", "content": "\n\n".join(pending)})
            pending = []
        out.append(message)
    if pending:
        out.append({"role": "user", "content": "\n\n".join(pending)})
    return out


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
    return ""


def _text_or_parts(content: Any) -> Any:
    return content if isinstance(content, list) else (content if isinstance(content, str) else "")


def _joined(first: Any, second: Any) -> Any:
    """Two contents as one: a string when both are strings, else a list of parts."""
    if isinstance(first, str) and isinstance(second, str):
        return f"{first}\n\n{second}" if first and second else first or second
    parts: list[Any] = []
    for content in (first, second):
        if isinstance(content, str):
            if content:
                parts.append({"type": "text", "text": content})
        elif isinstance(content, list):
            parts.extend(content)
    return parts


def _system_text(system: Any, lost: Dropped) -> str:
    if system is None:
        return ""
    if isinstance(system, str):
        return _without_billing(system)
    if not isinstance(system, list):
        raise InvalidRequest("system: must be a string or an array of text blocks.", param="system")
    parts = []
    for block in system:
        if isinstance(block, dict) and block.get("type") == "text" and isinstance(block.get("text"), str):
            if "cache_control" in block:
                lost.add("cache_control")
            if not block["text"].startswith(BILLING_PREFIX):
                parts.append(block["text"])
        else:
            lost.add("system." + str(block.get("type") if isinstance(block, dict) else "block"))
    return _without_billing("".join(parts))


def _without_billing(text: str) -> str:
    if not text.startswith(BILLING_PREFIX):
        return text
    _, _, rest = text.partition("\n")
    return rest


def _convert_message(message: Any, i: int, out: list[dict[str, Any]], lost: Dropped) -> None:
    where = f"messages.{i}"
    if not isinstance(message, dict):
        raise InvalidRequest(f"{where}: must be an object with a role and content.", param=where)
    role = message.get("role")
    content = message.get("content")
    if role == "system":  # Claude Code's mid-conversation system messages; folded afterwards
        text = _text_of(content)
        if isinstance(content, list) and any(isinstance(b, dict) and "cache_control" in b for b in content):
            lost.add("cache_control")
        if text:
            out.append({"role": "system", "content": text})
        return
    if role not in ("user", "assistant"):
        raise InvalidRequest(f"{where}: role must be 'user', 'assistant' or 'system'.", param=f"{where}.role")
    if isinstance(content, str):
        out.append({"role": role, "content": content})
        return
    if not isinstance(content, list):
        raise InvalidRequest(f"{where}.content: must be a string or an array of blocks.", param=f"{where}.content")
    parts: list[dict[str, Any]] = []
    tool_calls: list[dict[str, Any]] = []
    reasoning: list[str] = []
    for block in content:
        _convert_block(block, role, parts, tool_calls, reasoning, out, lost)
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
    parts: list[dict[str, Any]],
    tool_calls: list[dict[str, Any]],
    reasoning: list[str],
    out: list[dict[str, Any]],
    lost: Dropped,
) -> None:
    kind = block.get("type") if isinstance(block, dict) else None
    if not isinstance(block, dict) or not isinstance(kind, str):
        lost.add("content_block")
        return
    if "cache_control" in block:
        lost.add("cache_control")
    if kind == "text":
        if isinstance(block.get("text"), str) and block["text"]:
            parts.append({"type": "text", "text": block["text"]})
    elif kind == "image":
        url = _image_url(block.get("source"))
        if url is None:
            lost.add("image")
        else:
            parts.append({"type": "image_url", "image_url": {"url": url}})
    elif kind == "document":
        text = _document_text(block)
        if text is None:
            lost.add("document")
        else:
            parts.append({"type": "text", "text": text})
    elif kind == "tool_use":
        arguments = json.dumps(block.get("input") if isinstance(block.get("input"), dict) else {})
        name = block.get("name") if isinstance(block.get("name"), str) else ""
        call_id = block.get("id") if isinstance(block.get("id"), str) else f"toolu_{len(tool_calls)}"
        tool_calls.append({"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}})
    elif kind == "tool_result":
        _convert_tool_result(block, role, parts, out, lost)
    elif kind == "thinking":
        if isinstance(block.get("thinking"), str):
            reasoning.append(block["thinking"])
    elif kind == "redacted_thinking":
        pass  # opaque to any other model; accepted so that clients can echo whole turns back
    else:  # server tool use and results, search results, container uploads, ...
        lost.add(kind)


def _image_url(source: Any) -> str | None:
    if isinstance(source, dict) and source.get("type") == "url" and isinstance(source.get("url"), str):
        return str(source["url"])
    if isinstance(source, dict) and source.get("type") == "base64" and isinstance(source.get("data"), str):
        return f"data:{source.get('media_type', 'image/jpeg')};base64,{source['data']}"
    return None


def _document_text(block: Mapping[str, Any]) -> str | None:
    """A document block's text where it has one (a plain-text source); None for a PDF or a file id."""
    source = block.get("source")
    if isinstance(source, dict) and source.get("type") == "text" and isinstance(source.get("data"), str):
        return str(source["data"])
    if isinstance(source, dict) and source.get("type") == "content" and isinstance(source.get("content"), list):
        return _text_of(source["content"]) or None
    return None


def _convert_tool_result(
    block: dict[str, Any], role: str, parts: list[dict[str, Any]], out: list[dict[str, Any]], lost: Dropped
) -> None:
    content = block.get("content")
    images: list[str] = []
    if content is None or isinstance(content, str):
        text = content or ""
    elif isinstance(content, list):
        texts = []
        for item in content:
            kind = item.get("type") if isinstance(item, dict) else None
            if kind == "text" and isinstance(item.get("text"), str):
                texts.append(item["text"])
            elif kind == "image" and (url := _image_url(item.get("source"))) is not None:
                images.append(url)
            elif kind == "document" and (doc := _document_text(item)) is not None:
                texts.append(doc)
            else:
                lost.add(f"tool_result.{kind}")
        text = "\n".join(texts)
    else:
        text = ""
        lost.add("tool_result.content")
    if role != "user":
        parts.append({"type": "text", "text": f"Tool result: {text}"})
        return
    out.append({"role": "tool", "tool_call_id": str(block.get("tool_use_id") or ""), "content": text})
    if images:
        out.append({"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}} for url in images]})


def _convert_tools(tools: Any, lost: Dropped) -> list[dict[str, Any]]:
    if not isinstance(tools, list):
        raise InvalidRequest("tools: must be an array.", param="tools")
    out = []
    for tool in tools:
        if not isinstance(tool, dict) or not isinstance(tool.get("name"), str):
            lost.add("tool")
            continue
        kind = tool.get("type")
        if kind not in (None, "custom") or not isinstance(tool.get("input_schema"), dict):
            # A server tool (web_search_20250305, code_execution, ...) runs at Anthropic: no schema
            # to offer a chat model, and an empty one would invite calls nobody answers.
            lost.add("tool_without_schema" if kind in (None, "custom") else str(kind))
            continue
        for extra in _TOOL_EXTRAS:
            if extra in tool:
                lost.add(extra)
        if "cache_control" in tool:
            lost.add("cache_control")
        function: dict[str, Any] = {"name": tool["name"], "parameters": tool["input_schema"]}
        if isinstance(tool.get("description"), str):
            function["description"] = tool["description"]
        out.append({"type": "function", "function": function})
    return out


def _convert_tool_choice(choice: Any) -> dict[str, Any]:
    kind = choice.get("type") if isinstance(choice, dict) else None
    converted: dict[str, Any]
    if kind == "any":
        converted = {"tool_choice": "required"}
    elif kind == "none":
        converted = {"tool_choice": "none"}
    elif kind == "tool" and isinstance(choice.get("name"), str):
        converted = {"tool_choice": {"type": "function", "function": {"name": choice["name"]}}}
    else:
        converted = {"tool_choice": "auto"}
    if isinstance(choice, dict) and choice.get("disable_parallel_tool_use") is True:
        converted["parallel_tool_calls"] = False
    return converted


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
