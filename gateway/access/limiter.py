"""Per-key rate limits over fixed one-minute windows, as pure arithmetic: given what a key has
used in the current window, may this request go, and if not, when may it. No I/O, no clock: the
caller passes `now` and the counts (from a memory or Redis store)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from gateway.access.keys import ClientKey

WINDOW_S = 60
LimitKind = Literal["requests", "tokens"]


@dataclass(frozen=True, slots=True)
class Decision:
    allowed: bool
    limit: LimitKind | None = None
    """Which limit refused the request."""
    used: int = 0
    cap: int = 0
    retry_after_s: float = 0.0
    """Seconds until the window that refused it ends."""


ALLOW = Decision(True)


class StoreUnavailable(Exception):
    """A counter store could not answer (Redis down, slow or refusing)."""


def window(now: float) -> tuple[int, float]:
    """(the current window's number, seconds until it ends)."""
    index = math.floor(now / WINDOW_S)
    return index, (index + 1) * WINDOW_S - now


def decide(client: ClientKey, requests_seen: int, tokens_used: int, now: float) -> Decision:
    """requests_seen counts this request too (the store increments before it answers);
    tokens_used is what finished requests used in this window so far."""
    _, left = window(now)
    rpm, tpm = client.requests_per_minute, client.tokens_per_minute
    if rpm is not None and requests_seen > rpm:
        return Decision(False, "requests", requests_seen - 1, rpm, left)
    if tpm is not None and tokens_used >= tpm:
        return Decision(False, "tokens", tokens_used, tpm, left)
    return ALLOW


def counter_names(prefix: str, client: ClientKey, now: float) -> tuple[str, str]:
    """The store keys of a client's request and token counters for the current window. The key
    name is in braces, a Redis Cluster hash tag, so both counters live on one shard."""
    index, _ = window(now)
    return f"{prefix}{{{client.name}}}:requests:{index}", f"{prefix}{{{client.name}}}:tokens:{index}"


def tokens_of(usage: object, estimate: int) -> int:
    """Tokens a finished request used: the engine's usage (total, or prompt + completion) when it
    reported one, else the gateway's estimate."""
    if isinstance(usage, dict):
        total = usage.get("total_tokens")
        if isinstance(total, int) and not isinstance(total, bool) and total >= 0:
            return total
        parts = [usage.get("prompt_tokens"), usage.get("completion_tokens")]
        if all(isinstance(p, int) and not isinstance(p, bool) and p >= 0 for p in parts):
            return sum(p for p in parts if isinstance(p, int))
    return max(0, estimate)
