"""Token ids of prompts the engines have tokenized, remembered by a chained hash of their messages, so
that a conversation's next turn is matched against the KV index from its remembered prefix without a
round trip. Bounded by the ids it holds; least recently used first out."""

from __future__ import annotations

import json
from array import array
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any, Final

from gateway.value import value

DEFAULT_MAX_IDS: Final = 4_000_000
"""Token ids held in all: 16 MB (4 bytes an id), about 400 conversations of 10k tokens."""


@value
class Cut:
    """Where a longer prompt whose text starts as this one's may resume encoding: this prompt's first
    `chars` characters (up to the end of its last special token, such as a turn's start marker)
    gave its first `tokens` ids; `digest` names those characters (text_digest)."""

    chars: int
    tokens: int
    digest: int


def text_digest(text: str) -> int:
    return hash(("gw-memo-cut", text))


def message_keys(seed: str, messages: Sequence[Any]) -> list[int]:
    """One key per leading run of messages: keys[k] names messages[: k + 1] under `seed` (the model
    name the engine tokenizes for). Chained, so each message is hashed once.

    Keys are Python's own 64-bit hash (SipHash, seeded per process; five times faster than blake2b
    over a message's text): the memo never leaves the process. A collision (about 2^-64 a pair)
    would match a prompt with another's ids: a routing choice, never a wrong answer."""
    key = hash(("gw-memo", seed))
    out = []
    for message in messages:
        key = hash((key, *_canonical(message)))
        out.append(key)
    return out


def _canonical(message: Any) -> tuple[str, ...]:
    """A message as strings that tell it apart from every other message. A plain text message (a role
    and a string content, most of a conversation) skips the JSON encoder, which took most of a short
    conversation's keying: its form is two strings, a JSON text's one."""
    if type(message) is dict and len(message) == 2:
        role, content = message.get("role"), message.get("content")
        if type(role) is str and type(content) is str:
            return role, content
    return (json.dumps(message, sort_keys=True, separators=(",", ":"), ensure_ascii=False),)


def prompt_key(seed: str, prompt: str) -> int:
    return hash(("gw-memo-p", seed, prompt))


class TokenMemo:
    __slots__ = ("_cuts", "_entries", "_held", "max_ids")

    def __init__(self, max_ids: int = DEFAULT_MAX_IDS) -> None:
        self._entries: OrderedDict[int, array[int]] = OrderedDict()
        self._cuts: dict[int, Cut] = {}
        """The cuts of the entries encoded by a pool's tokenizer (resumable())."""
        self._held = 0
        self.max_ids = max_ids

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def held(self) -> int:
        """Token ids held in all."""
        return self._held

    def get(self, key: int) -> array[int] | None:
        ids = self._entries.get(key)
        if ids is not None:
            self._entries.move_to_end(key)
        return ids

    def longest(self, keys: Sequence[int]) -> array[int] | None:
        """The ids of the longest leading run whose key is held (keys in order, as message_keys
        gives them), looked for from the longest down."""
        for key in reversed(keys):
            ids = self.get(key)
            if ids is not None:
                return ids
        return None

    def resumable(self, keys: Sequence[int]) -> tuple[array[int], Cut] | None:
        """The ids and cut of the longest leading run held with a cut (keys as for longest())."""
        for key in reversed(keys):
            cut = self._cuts.get(key)
            if cut is not None:
                ids = self.get(key)
                if ids is not None:
                    return ids, cut
        return None

    def put(self, key: int, tokens: Sequence[int], cut: Cut | None = None) -> None:
        if len(tokens) > self.max_ids:
            return
        try:
            ids = array("I", tokens)
        except OverflowError:  # an id outside 0..2^32-1: no vocabulary has one, so not kept
            return
        old = self._entries.pop(key, None)
        if old is not None:
            self._held -= len(old)
        self._entries[key] = ids
        self._held += len(ids)
        if cut is not None:
            self._cuts[key] = cut
        else:
            self._cuts.pop(key, None)
        while self._held > self.max_ids:
            gone, dropped = self._entries.popitem(last=False)
            self._cuts.pop(gone, None)
            self._held -= len(dropped)

    def clear(self) -> None:
        self._entries.clear()
        self._cuts.clear()
        self._held = 0
