"""The prefix fingerprint: a request's canonical prompt text, chained block hashes over it, and a
bounded, time-windowed tracker that says whether a request is shared-prefix traffic. Pure."""

from __future__ import annotations

import json
import struct
from collections import OrderedDict
from collections.abc import Mapping
from hashlib import blake2b
from typing import Any, Literal

from gateway.config import SharedPrefixConfig
from gateway.value import value

# Control characters frame the segments so that no message text can fake a role boundary and two
# different conversations can't canonicalise to the same text by shifting words between messages.
_SEGMENT = "\x1e"
_FIELD = "\x1f"
_SYSTEM_ROLES = frozenset({"system", "developer"})
# Media become fixed placeholders: hashing a multi-megabyte data URL on every request would cost more
# than the whole routing decision, and what follows the image still tells conversations apart.
_PLACEHOLDERS = {
    "image_url": "\x1a[image]",
    "input_image": "\x1a[image]",
    "image": "\x1a[image]",
    "input_audio": "\x1a[audio]",
    "audio": "\x1a[audio]",
    "file": "\x1a[file]",
}


def canonical_prompt(body: Mapping[str, Any]) -> str:
    """The prompt as one string: system (and developer) messages, then the tool definitions, then the
    other messages in order; or a completions body's `prompt`. Unknown shapes contribute nothing."""
    messages = body.get("messages")
    if isinstance(messages, list | tuple):
        return _chat_text(messages, body.get("tools"), body.get("functions"))
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list | tuple):
        return _SEGMENT.join(p for p in prompt if isinstance(p, str))
    return ""


@value
class Anchor:
    """Where a chat's own text starts: `block` is the fingerprint block holding the first byte
    after the shared head (system messages and tools), and `key` hashes the first non-system
    message, which stays the same on every turn of a conversation and differs between them."""

    key: int | None
    block: int


def conversation_anchor(body: Mapping[str, Any], block_chars: int) -> Anchor:
    """The anchor of a chat body; for a completions body, no key and block 0."""
    messages = body.get("messages")
    if not isinstance(messages, list | tuple):
        return Anchor(None, 0)
    head = _chat_text(
        [m for m in messages if isinstance(m, Mapping) and m.get("role") in _SYSTEM_ROLES],
        body.get("tools"),
        body.get("functions"),
    )
    first = next((m for m in messages if isinstance(m, Mapping) and m.get("role") not in _SYSTEM_ROLES), None)
    if first is None:
        return Anchor(None, 0)
    text = _content_text(first.get("content")).encode("utf-8", "surrogatepass")
    key = struct.unpack(">Q", blake2b(text, digest_size=8).digest())[0]
    return Anchor(key, len(head.encode("utf-8", "surrogatepass")) // block_chars)


def _chat_text(messages: list[Any] | tuple[Any, ...], tools: Any, functions: Any) -> str:
    head: list[str] = []
    tail: list[str] = []
    for message in messages:
        if not isinstance(message, Mapping):
            continue
        role = message.get("role")
        role = role if isinstance(role, str) else ""
        segment = _SEGMENT + role + _FIELD + _content_text(message.get("content"))
        tool_calls = message.get("tool_calls")
        if tool_calls:
            segment += _FIELD + _dumps(tool_calls)
        (head if role in _SYSTEM_ROLES else tail).append(segment)
    if tools:
        head.append(_SEGMENT + "tools" + _FIELD + _dumps(tools))
    if functions:
        head.append(_SEGMENT + "functions" + _FIELD + _dumps(functions))
    return "".join(head) + "".join(tail)


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list | tuple):
        return ""
    pieces: list[str] = []
    for part in content:
        if isinstance(part, str):
            pieces.append(part)
            continue
        if not isinstance(part, Mapping):
            continue
        kind = part.get("type")
        if kind == "text" or kind == "refusal":
            value = part.get(kind)
            if isinstance(value, str):
                pieces.append(value)
        elif isinstance(kind, str) and kind in _PLACEHOLDERS:
            pieces.append(_PLACEHOLDERS[kind])
    return "".join(pieces)


def _dumps(value: Any) -> str:
    try:
        return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    except (TypeError, ValueError):  # not JSON data after all (e.g. a non-str key): contributes nothing
        return ""


def fingerprint(text: str, block_chars: int) -> tuple[int, ...]:
    """Chained 64-bit hashes over the full blocks of `text`: h_i = blake2b(h_{i-1} + block_i), as ints.

    Blocks are `block_chars` *bytes* of the UTF-8 encoding: one encode and plain slicing, with no
    per-block encoding (for ASCII a byte is a char). A trailing partial block is not hashed, so equal
    tuple prefixes mean equal text prefixes to block granularity. blake2b, never hash(), keeps the
    values equal across processes and replicas. The cost is per block (~0.5 us), not per byte.
    """
    data = text.encode("utf-8", "surrogatepass")  # lone surrogates are valid JSON strings
    digests: list[bytes] = []
    append = digests.append
    digest = b""
    for start in range(0, len(data) - block_chars + 1, block_chars):
        digest = blake2b(digest + data[start : start + block_chars], digest_size=8).digest()
        append(digest)
    return struct.unpack(f">{len(digests)}Q", b"".join(digests))


@value
class PrefixVerdict:
    """Whether one request counts as shared-prefix traffic, and why."""

    shared: bool
    reason: Literal["seen", "continuation"] | None
    seen: int
    """Requests in the window whose leading `min_prefix_chars` match this one's, this one included,
    counted up to `min_seen` (0 when the prompt is shorter than that)."""
    continued_blocks: int
    """Length in blocks of the earlier request this one extends (0 when none)."""


_NO_BLOCKS = PrefixVerdict(False, None, 0, 0)


class _Entry:
    __slots__ = ("end_at", "end_pos", "seen", "touched")

    def __init__(self, now: float) -> None:
        self.touched = now
        self.seen: list[float] = []
        """Times this hash was a request's leading-prefix key; only the last `min_seen` are kept."""
        self.end_pos = -1
        """Block index at which this hash ended a request's fingerprint; -1 when it never did."""
        self.end_at = 0.0


class PrefixTracker:
    """A bounded, time-windowed memory of fingerprints. Each `observe` adds at most two entries (the
    leading-prefix key and the request's last block), and the oldest are evicted past `max_entries`,
    so memory is bounded whatever the traffic. `now` is any monotonic clock, in seconds."""

    def __init__(self, config: SharedPrefixConfig) -> None:
        self._window_s = config.window_s
        self._min_seen = config.min_seen
        self._max_entries = config.max_entries
        # The leading prefix is the first blocks covering at least min_prefix_chars.
        self._lead_blocks = max(1, -(-config.min_prefix_chars // config.block_chars))
        self._table: OrderedDict[int, _Entry] = OrderedDict()

    def __len__(self) -> int:
        return len(self._table)

    def observe(self, fp: tuple[int, ...], now: float) -> PrefixVerdict:
        """Record one request and judge it. Shared when its leading blocks were seen at least
        `min_seen` times in the window counting this request (so `min_seen: 1` marks every long enough
        prompt), or when it starts with the whole fingerprint of an earlier request in the window that
        was itself at least the leading blocks long (the next turn of a conversation, or a retry)."""
        if not fp:  # shorter than a block: nothing to record or match (expiry waits for the next one)
            return _NO_BLOCKS
        self._expire(now)
        table = self._table
        lead = self._lead_blocks
        continued = 0
        # One C-level pass finds the blocks already known; a hit that ended an earlier request at the
        # same index means (the hashes being chained) that this prompt starts with all of it.
        for h in table.keys() & fp:
            entry = table[h]
            end = entry.end_pos
            if (
                end >= lead - 1
                and end < len(fp)
                and fp[end] == h
                and now - entry.end_at <= self._window_s
                and end >= continued
            ):
                continued = end + 1
        seen = 0
        if len(fp) >= lead:
            entry = self._touch(fp[lead - 1], now)
            times = entry.seen
            times.append(now)
            cutoff = now - self._window_s
            while times and (times[0] < cutoff or len(times) > self._min_seen):
                del times[0]
            seen = len(times)
        if fp:
            entry = self._touch(fp[-1], now)
            entry.end_pos = len(fp) - 1
            entry.end_at = now
        while len(table) > self._max_entries:
            table.popitem(last=False)
        if continued:  # the more specific reason: a next turn also repeats its own leading blocks
            return PrefixVerdict(True, "continuation", seen, continued)
        if seen >= self._min_seen:
            return PrefixVerdict(True, "seen", seen, continued)
        return PrefixVerdict(False, None, seen, continued)

    def _touch(self, key: int, now: float) -> _Entry:
        entry = self._table.get(key)
        if entry is None:
            entry = self._table[key] = _Entry(now)
        else:
            self._table.move_to_end(key)
            entry.touched = now
        return entry

    def _expire(self, now: float) -> None:
        # Entries are kept in touch order, so the expired ones are all at the front.
        cutoff = now - self._window_s
        table = self._table
        while table:
            key, entry = next(iter(table.items()))
            if entry.touched >= cutoff:
                break
            del table[key]


AGENT_SESSION_HEADERS = ("x-claude-code-session-id", "session-id", "thread-id", "session_id", "conversation_id")
"""The headers coding agents put their session in, in the order they are read: Claude Code's, then
Codex CLI's (current releases send session-id and thread-id; older ones session_id and conversation_id)."""


def session_key(headers: Mapping[str, str], configured: str, body_key: str | None) -> str | None:
    """A request's session: the pool's configured header, then an agent's session header, then the
    body's key (prompt_cache_key, metadata.user_id's session, user, safety_identifier)."""
    value = headers.get(configured)
    if value:
        return value
    for name in AGENT_SESSION_HEADERS:
        value = headers.get(name)
        if value:
            return value
    return body_key


def session_anchor(session: str) -> int:
    """An anchor key from a session: one agent's turns, and its subagents that share the session,
    stay together whatever their first message says."""
    digest = blake2b(session.encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int(struct.unpack(">Q", digest)[0])
