"""Rewrites of a native Messages body for engines whose own handling of a field is known to break a
coding agent (the engine table's `native_fixes`; docs/agents.md has what was checked on each engine).
Everything else in the body passes through as the client sent it. Pure: no I/O."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# Claude Code's output_config.effort as a thinking budget, for engines that read only an explicit
# {"type": "enabled", "budget_tokens": N}.
_EFFORT_BUDGET = {"low": 1024, "medium": 4096, "high": 16384, "max": 32768}
_DEFAULT_BUDGET = 4096


def fix_native(body: Mapping[str, Any], fixes: frozenset[str]) -> dict[str, Any] | None:
    """The body with `fixes` applied, or None when none of them changes anything (the client's bytes
    can then go upstream as they are)."""
    out: dict[str, Any] | None = None
    if "fold_system" in fixes:
        messages = body.get("messages")
        if isinstance(messages, list) and any(_is_system(m) for m in messages):
            out = dict(body)
            out["messages"] = fold_system_blocks(messages)
    if "thinking_enabled" in fixes:
        thinking = body.get("thinking")
        if isinstance(thinking, dict) and thinking.get("type") == "adaptive":
            out = dict(body) if out is None else out
            out["thinking"] = enabled_thinking(body)
    return out


def _is_system(message: Any) -> bool:
    return isinstance(message, dict) and message.get("role") == "system"


def enabled_thinking(body: Mapping[str, Any]) -> dict[str, Any]:
    """Adaptive thinking as an explicit budget: the effort's, kept below max_tokens as Anthropic requires."""
    config = body.get("output_config")
    effort = config.get("effort") if isinstance(config, dict) else None
    budget = _EFFORT_BUDGET.get(effort, _DEFAULT_BUDGET) if isinstance(effort, str) else _DEFAULT_BUDGET
    max_tokens = body.get("max_tokens")
    if isinstance(max_tokens, int) and not isinstance(max_tokens, bool) and max_tokens > 1:
        budget = min(budget, max_tokens - 1)
    return {"type": "enabled", "budget_tokens": max(1, budget)}


def _blocks(content: Any) -> list[Any]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    return list(content) if isinstance(content, list) else []


def fold_system_blocks(messages: list[Any]) -> list[Any]:
    """Messages with each `system` message folded into a user turn as text blocks: appended to the
    user turn before it, else (after an assistant turn, whose tool_use must be answered by the next
    turn's tool_result blocks first) appended to the next user turn, after its tool results; with no
    user turn after it, a user turn of its own. Never moved to the head: that would change the
    prefix of every later turn, and with it the engine's prefix cache."""
    out: list[Any] = []
    pending: list[Any] = []
    for message in messages:
        if _is_system(message):
            blocks = _blocks(message.get("content"))
            previous = out[-1] if out else None
            if isinstance(previous, dict) and previous.get("role") == "user":
                out[-1] = {**previous, "content": _blocks(previous.get("content")) + blocks}
            else:
                pending.extend(blocks)
            continue
        if pending and isinstance(message, dict) and message.get("role") == "user":
            message = {**message, "content": _blocks(message.get("content")) + pending}
            pending = []
        out.append(message)
    if pending:
        out.append({"role": "user", "content": pending})
    return out
