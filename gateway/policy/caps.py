"""Context-cap arithmetic: the token estimate, the cap decision (reject, clamp, default) and
truncate_oldest. Pure: no I/O, no clock, no logging; the Enforcer does the engine round trips."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from engines.context_error import context_message
from gateway.config import CapsConfig
from gateway.value import value

ROUTE_CAP = " (The limit is this gateway route's context cap.)"
"""Appended to the gateway's own context errors, so that an operator can tell them from an engine's."""
ENGINE_WINDOW = " (The limit is the serving engine's context window.)"

# Tokens a chat template adds around each message (role markers, separators) and once per prompt.
# Learned ratios absorb the rest; these keep short prompts from being underestimated.
PER_MESSAGE_TOKENS = 4
PER_PROMPT_TOKENS = 3
# Conservative prior: fewer characters per token than English BPE (~4) means a higher estimate,
# so an unlearned route errs towards asking the engine for an exact count.
PRIOR_CHARS_PER_TOKEN = 3.0
_MIN_RATIO, _MAX_RATIO = 0.5, 12.0
# A prompt whose non-ASCII bytes exceed 1/8 of its ASCII characters teaches the fit nothing: its
# tokens are mostly the non-ASCII text's, which is counted at its bound, not learned.
_LEARN_WIDE_SHARE = 8


def wide_bytes(text: str) -> int:
    """The UTF-8 bytes of `text`'s non-ASCII characters: a bound on their tokens, since byte-level
    BPE and byte-fallback tokenizers never make more tokens than bytes (docs/reliability.md defect 5:
    2,400 emoji, 4 bytes and up to 4 tokens each, passed a per-character estimate under the cap)."""
    if text.isascii():  # O(1) in CPython: the common case costs nothing
        return 0
    return len(text.encode("utf-8", "surrogatepass")) - len(text.encode("ascii", "ignore"))


def message_chars(message: Mapping[str, Any]) -> int:
    return _message_size(message)[0]


def _message_size(message: Mapping[str, Any]) -> tuple[int, int]:
    """(characters, non-ASCII bytes) of one message's text, tool calls included."""
    content = message.get("content")
    wide = 0
    if isinstance(content, str):
        n = len(content)
        wide = wide_bytes(content)
    elif isinstance(content, list):
        n = 0
        for part in content:
            if isinstance(part, dict):
                text = part.get("text")
                if isinstance(text, str):
                    n += len(text)
                    wide += wide_bytes(text)
                else:
                    n += 64
    else:
        n = 0
    calls = message.get("tool_calls")
    if calls:
        text = str(calls)
        n += len(text)
        wide += wide_bytes(text)
    return n, wide


def prompt_size(body: Mapping[str, Any]) -> tuple[int, int, int, int]:
    """(characters, messages, exact tokens already known, non-ASCII bytes) of a chat or completions
    body. The estimate counts the non-ASCII bytes as tokens on top of the learned per-character
    part, so it never under-counts a script the fit has not learned."""
    messages = body.get("messages")
    if isinstance(messages, list):
        chars = wide = 0
        for m in messages:
            # Fast path for the common shape (string content, no tool calls): this runs per request.
            content = m.get("content") if type(m) is dict else None
            if type(content) is str and "tool_calls" not in m:
                chars += len(content)
                if not content.isascii():
                    wide += wide_bytes(content)
            elif isinstance(m, dict):
                n, w = _message_size(m)
                chars += n
                wide += w
        tools = body.get("tools")
        if tools:
            text = str(tools)
            chars += len(text)
            wide += wide_bytes(text)
        return chars, len(messages), 0, wide
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return len(prompt), 1, 0, wide_bytes(prompt)
    if isinstance(prompt, list):
        if all(isinstance(t, int) for t in prompt):
            return 0, 0, len(prompt), 0
        texts = [p for p in prompt if isinstance(p, str)]
        return sum(len(p) for p in texts), 1, 0, sum(wide_bytes(p) for p in texts)
    return 0, 0, 0, 0


def learnable(chars: int, wide: int) -> bool:
    """Whether a prompt may teach the per-character fit: not when non-ASCII text dominates it."""
    return wide * _LEARN_WIDE_SHARE <= chars


class _Fit:
    """A decayed least-squares fit of tokens = a*chars + b*messages + c for one (route, model).
    b and c are pulled towards the template priors (ridge), so a route whose prompts all have the
    same number of messages still gets a sensible fit."""

    __slots__ = ("a", "b", "c", "cc", "ck", "cs", "kk", "ks", "n", "ss", "yc", "yk", "ys")

    def __init__(self) -> None:
        # The decayed sums of x x^T (symmetric: six of them) and x y, for x = (chars, messages, 1).
        self.cc = self.ck = self.cs = self.kk = self.ks = self.ss = 0.0
        self.yc = self.yk = self.ys = 0.0
        self.n = 0
        self.a = 1 / PRIOR_CHARS_PER_TOKEN
        self.b = float(PER_MESSAGE_TOKENS)
        self.c = float(PER_PROMPT_TOKENS)

    def add(self, chars: int, messages: int, tokens: int, decay: float) -> None:
        c, k, d, y = float(chars), float(messages), decay, float(tokens)
        self.cc = self.cc * d + c * c
        self.ck = self.ck * d + c * k
        self.cs = self.cs * d + c
        self.kk = self.kk * d + k * k
        self.ks = self.ks * d + k
        self.ss = self.ss * d + 1.0
        self.yc = self.yc * d + c * y
        self.yk = self.yk * d + k * y
        self.ys = self.ys * d + y
        self.n += 1
        # Solving is ~7 us; the sums are O(1). Re-solve every time while the fit is young, then
        # every 16th observation, and every 64th past 256: the decayed fit moves slowly by then.
        if self.n > 32 and self.n % (16 if self.n <= 256 else 64):
            return
        if self.n == 1:
            # One observation: keep the template priors, fit the ratio alone.
            text = tokens - self.b * messages - self.c
            if chars >= 32 and text > 0:
                self.a = min(1 / _MIN_RATIO, max(1 / _MAX_RATIO, text / chars))
            return
        # Ridge towards the priors on b and c (weight 1 each), none on a.
        m = [
            [self.cc, self.ck, self.cs, self.yc],
            [self.ck, self.kk + 1.0, self.ks, self.yk + float(PER_MESSAGE_TOKENS)],
            [self.cs, self.ks, self.ss + 1.0, self.ys + float(PER_PROMPT_TOKENS)],
        ]
        solved = _solve3(m)
        if solved is not None and 1 / _MAX_RATIO <= solved[0] <= 1 / _MIN_RATIO:
            self.a, self.b, self.c = solved


def _solve3(m: list[list[float]]) -> tuple[float, float, float] | None:
    """Gaussian elimination with partial pivoting on a 3x4 augmented matrix."""
    for col in range(3):
        pivot = max(range(col, 3), key=lambda r: abs(m[r][col]))
        if abs(m[pivot][col]) < 1e-12:
            return None
        m[col], m[pivot] = m[pivot], m[col]
        for r in range(3):
            if r != col:
                f = m[r][col] / m[col][col]
                m[r] = [a - f * b for a, b in zip(m[r], m[col], strict=True)]
    return m[0][3] / m[0][0], m[1][3] / m[1][1], m[2][3] / m[2][2]


class TokenEstimator:
    """Prompt tokens from characters and message count, learned per (route, model) from the
    usage that responses report. Bounded: at most `max_keys` fits are kept (LRU)."""

    def __init__(self, max_keys: int = 1024, decay: float = 0.98) -> None:
        self._fits: OrderedDict[tuple[str, str], _Fit] = OrderedDict()
        self._max_keys = max_keys
        self._decay = decay

    def __len__(self) -> int:
        return len(self._fits)

    def ratio(self, key: tuple[str, str]) -> float:
        """Characters per token (of message text) for this key."""
        fit = self._fits.get(key)
        return PRIOR_CHARS_PER_TOKEN if fit is None else 1 / fit.a

    def estimate(self, key: tuple[str, str], chars: int, messages: int, known: int = 0) -> int:
        fit = self._fits.get(key)
        if fit is None:
            overhead = PER_PROMPT_TOKENS + PER_MESSAGE_TOKENS * messages if messages else 0
            return known + overhead + int(chars / PRIOR_CHARS_PER_TOKEN + 0.999)
        if not messages:
            return known + int(chars * fit.a + 0.999)
        return known + max(1, int(chars * fit.a + messages * fit.b + fit.c + 0.5))

    def learn(self, key: tuple[str, str], chars: int, messages: int, prompt_tokens: int) -> None:
        if prompt_tokens <= 0 or (chars < 32 and messages == 0):
            return
        fits = self._fits
        fit = fits.get(key)
        if fit is None:
            fit = fits[key] = _Fit()
            while len(fits) > self._max_keys:
                fits.popitem(last=False)
        else:
            fits.move_to_end(key)
        fit.add(chars, messages, prompt_tokens, self._decay)


Action = Literal["pass", "reject", "clamp", "default", "truncate"]


@value
class CapDecision:
    action: Action
    max_tokens: int | None = None
    """The max_tokens to send, when it changes."""
    message: str = ""


def effective_cap(route_cap: int | None, window: int | None) -> int | None:
    """The smaller of the route's cap and the serving backend's context window (either may be unknown)."""
    if route_cap is None or window is None:
        return window if route_cap is None else route_cap
    return min(route_cap, window)


def cap_source(route_cap: int | None, window: int | None) -> str:
    """The sentence a context error ends with: whose limit it was."""
    return ENGINE_WINDOW if window is not None and (route_cap is None or window < route_cap) else ROUTE_CAP


def decide(caps: CapsConfig, prompt_tokens: int, requested: int | None, window: int | None = None) -> CapDecision:
    """What to do with a prompt of `prompt_tokens` asking for `requested` output tokens, under the
    route's cap or the backend's context `window`, whichever is smaller."""
    limit = caps.max_tokens_limit
    cap = effective_cap(caps.max_context_tokens, window)
    if cap is not None and prompt_tokens >= cap:
        return CapDecision(
            "reject",
            message=context_message(cap, prompt_tokens, requested) + cap_source(caps.max_context_tokens, window),
        )
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


def truncate_oldest(
    messages: Sequence[Mapping[str, Any]], token_of: Sequence[int], budget: int
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


def engine_truncated(reported: int | None, exact: int | None, estimate: int) -> bool:
    """True when the engine reports far fewer prompt tokens than were sent: it cut the prompt
    silently (Ollama does). Exact counts are trusted to 10 %; the conservative estimate, to half."""
    if reported is None:
        return False
    if exact:
        return reported < 0.9 * exact
    return estimate > 256 and reported < 0.5 * estimate
