"""Context-cap arithmetic: the token estimate, the cap decision (reject, clamp, default) and
truncate_oldest. Pure: no I/O, no clock, no logging; the Enforcer does the engine round trips."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from gateway.config import CapsConfig

# Tokens a chat template adds around each message (role markers, separators) and once per prompt.
# Learned ratios absorb the rest; these keep short prompts from being underestimated.
PER_MESSAGE_TOKENS = 4
PER_PROMPT_TOKENS = 3
# Conservative prior: fewer characters per token than English BPE (~4) means a higher estimate,
# so an unlearned route errs towards asking the engine for an exact count.
PRIOR_CHARS_PER_TOKEN = 3.0
_MIN_RATIO, _MAX_RATIO = 0.5, 12.0


def message_chars(message: Mapping[str, Any]) -> int:
    content = message.get("content")
    if isinstance(content, str):
        n = len(content)
    elif isinstance(content, list):
        n = 0
        for part in content:
            if isinstance(part, dict):
                text = part.get("text")
                n += len(text) if isinstance(text, str) else 64
    else:
        n = 0
    calls = message.get("tool_calls")
    if calls:
        n += len(str(calls))
    return n


def prompt_size(body: Mapping[str, Any]) -> tuple[int, int, int]:
    """(characters, messages, exact tokens already known) of a chat or completions body."""
    messages = body.get("messages")
    if isinstance(messages, list):
        chars = 0
        for m in messages:
            # Fast path for the common shape (string content, no tool calls): this runs per request.
            content = m.get("content") if type(m) is dict else None
            if type(content) is str and "tool_calls" not in m:
                chars += len(content)
            elif isinstance(m, dict):
                chars += message_chars(m)
        tools = body.get("tools")
        if tools:
            chars += len(str(tools))
        return chars, len(messages), 0
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return len(prompt), 1, 0
    if isinstance(prompt, list):
        if all(isinstance(t, int) for t in prompt):
            return 0, 0, len(prompt)
        return sum(len(p) for p in prompt if isinstance(p, str)), 1, 0
    return 0, 0, 0


class TokenEstimator:
    """Characters-per-token, learned per (route, model) from the usage responses report.
    Bounded: at most `max_keys` ratios are kept (LRU)."""

    def __init__(self, max_keys: int = 1024, prior: float = PRIOR_CHARS_PER_TOKEN, weight: float = 0.2) -> None:
        self._ratios: OrderedDict[tuple[str, str], float] = OrderedDict()
        self._max_keys = max_keys
        self._prior = prior
        self._weight = weight

    def __len__(self) -> int:
        return len(self._ratios)

    def ratio(self, key: tuple[str, str]) -> float:
        return self._ratios.get(key, self._prior)

    def estimate(self, key: tuple[str, str], chars: int, messages: int, known: int = 0) -> int:
        overhead = PER_PROMPT_TOKENS + PER_MESSAGE_TOKENS * messages if messages else 0
        return known + overhead + int(chars / self.ratio(key) + 0.999)

    def learn(self, key: tuple[str, str], chars: int, messages: int, prompt_tokens: int) -> None:
        overhead = PER_PROMPT_TOKENS + PER_MESSAGE_TOKENS * messages if messages else 0
        text_tokens = prompt_tokens - overhead
        if chars < 32 or text_tokens <= 0:
            return
        observed = min(_MAX_RATIO, max(_MIN_RATIO, chars / text_tokens))
        old = self._ratios.pop(key, None)
        # The first observation replaces the prior outright; later ones are averaged in.
        self._ratios[key] = observed if old is None else old + self._weight * (observed - old)
        while len(self._ratios) > self._max_keys:
            self._ratios.popitem(last=False)


Action = Literal["pass", "reject", "clamp", "default", "truncate"]


@dataclass(frozen=True, slots=True)
class CapDecision:
    action: Action
    max_tokens: int | None = None
    """The max_tokens to send, when it changes."""
    message: str = ""


def decide(caps: CapsConfig, prompt_tokens: int, requested: int | None) -> CapDecision:
    """What to do with a prompt of `prompt_tokens` asking for `requested` output tokens."""
    limit = caps.max_tokens_limit
    cap = caps.max_context_tokens
    if cap is not None and prompt_tokens >= cap:
        return CapDecision("reject", message=(
            f"This request's prompt is {prompt_tokens} tokens, which leaves no room for output "
            f"within the route's context cap of {cap} tokens (requested output: "
            f"{requested if requested is not None else 'not set'})."))
    room = cap - prompt_tokens if cap is not None else None
    if requested is None:
        value = caps.default_max_tokens
        for bound in (room, limit):
            if bound is not None:
                value = bound if value is None else min(value, bound)
        return CapDecision("default", max_tokens=value) if value is not None else CapDecision("pass")
    value = requested
    if limit is not None and value > limit:
        value = limit
    if room is not None and value > room:
        value = room
    if value != requested:
        return CapDecision("clamp", max_tokens=value)
    return CapDecision("pass")


def truncate_oldest(messages: Sequence[Mapping[str, Any]], token_of: Sequence[int], budget: int
                    ) -> tuple[list[Mapping[str, Any]], int] | None:
    """Drop whole messages, oldest first, never a system message nor the last user message,
    until the prompt's tokens (`token_of[i]` per message) fit `budget`. None if it can't fit."""
    total = sum(token_of)
    if total <= budget:
        return list(messages), 0
    last_user = max((i for i, m in enumerate(messages) if m.get("role") == "user"), default=-1)
    keep = [True] * len(messages)
    dropped = 0
    for i, message in enumerate(messages):
        if total <= budget:
            break
        if i == last_user or message.get("role") in ("system", "developer"):
            continue
        keep[i] = False
        total -= token_of[i]
        dropped += 1
    if total > budget:
        return None
    kept: list[Mapping[str, Any]] = []
    for message, k in zip(messages, keep, strict=True):
        if not k:
            continue
        # A tool result must follow the assistant turn that called it; never leave one orphaned.
        if message.get("role") == "tool" and (not kept or kept[-1].get("role") not in ("assistant", "tool")):
            dropped += 1
            continue
        kept.append(message)
    return kept, dropped
