"""OpenAI chat completions -> Anthropic Messages: the whole (non-stream) answer, and the pieces the
stream (messages_stream.py) shares with it: the stop reason, the usage, the message id, a tool
call's input. Pure: no I/O. The request's way is messages_translate.py."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any


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


def first_choice(chat: Mapping[str, Any]) -> tuple[Mapping[str, Any], Mapping[str, Any]]:
    """A chat completion's first choice and its message ({} for either when it has none)."""
    choices = chat.get("choices")
    choice = choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) else {}
    message = choice.get("message")
    return choice, message if isinstance(message, dict) else {}


def chat_to_message(chat: Mapping[str, Any], model: str | None = None) -> dict[str, Any]:
    """A chat completion (non-stream) as a Messages response."""
    choice, message = first_choice(chat)
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
